"""Where a Neuron test may run, and at which LNC its runtime runs (pure planning, no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from model_support.operator.manifests import Placement, TestRef, build_job
from model_support.operator.planning import InvalidTest, children, place
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import NeuronDraSettings, OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.sizing import Exclusion
from model_support.vocabulary import ExclusionReason, Parallelism

K8S = "1.34.0"
REF = TestRef("ml", "t", "6b1c2f4e-0000-4000-8000-000000000002", 1)
GiB = 2**30


@pytest.mark.parametrize(
    "spec",
    [
        {"profile": "trn1"},
        {"profile": "inf2"},
        {"profile": "trn2", "instanceType": "trn1.32xlarge"},
        {"profile": "trn2", "instanceType": "inf2.48xlarge"},
    ],
)
def test_a_test_on_an_instance_torchneuron_does_not_support_is_excluded(
    tiny_llama_path: Path, spec: dict[str, Any]
) -> None:
    """TorchNeuron supports Trn2 and Trn3 only: the operator records EXCLUDED with the reason
    instead of sizing the test and starting a pod that could only fail."""
    settings = OperatorSettings(results_uri="s3://b/r")
    result = place(parse_spec({"model": str(tiny_llama_path), **spec}), settings, token=None)
    assert isinstance(result, Exclusion), result
    assert result.reason is ExclusionReason.UNSUPPORTED_INSTANCE
    assert "Trn2 and Trn3 only" in result.message


def test_a_trn2_instance_type_is_placed(tiny_llama_path: Path) -> None:
    settings = OperatorSettings(results_uri="s3://b/r")
    spec = parse_spec({"model": str(tiny_llama_path), "instanceType": "trn2.3xlarge"})
    assert isinstance(place(spec, settings, token=None), Placement)


def test_a_trn3_test_is_sized_for_trainium3_and_placed_on_a_trn3_node(
    tiny_llama_path: Path,
) -> None:
    """trn3 is a profile of its own: Trainium3's 144 GiB devices, a trn3.48xlarge node."""
    settings = OperatorSettings(results_uri="s3://b/r")
    spec = parse_spec({"model": str(tiny_llama_path), "profile": "trn3"})
    placement = place(spec, settings, token=None)
    assert isinstance(placement, Placement)
    assert placement.host_memory_bytes > 0
    seen = runner_env({"profile": "trn3", "cores": 4, "parallelism": "tensor"}, settings)
    assert seen["selector"]["node.kubernetes.io/instance-type"] == "trn3.48xlarge"
    with pytest.raises(SpecError, match="exceeds the 64 cores of profile trn3"):
        parse_spec({"model": "a/b", "profile": "trn3", "cores": 65, "parallelism": "tensor"})


def runner_env(spec: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    job = build_job(
        REF, parse_spec({"model": "a/b", **spec}), Placement(4, Parallelism.TENSOR, 16 * GiB),
        job_name=child_name("t", REF.uid, 1, 1), configmap_name="cm", attempt=1,
        run_id=run_id_for(REF.uid, 1, 1), settings=settings,
    )  # fmt: skip
    kubernetes_validate.validate(job, K8S, strict=True)
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return {"env": env, "selector": pod.get("nodeSelector") or {}}


LABEL = "example.com/neuron-lnc"


@pytest.mark.parametrize(
    ("spec", "settings", "lnc"),
    [
        # device plugin, nodes labelled with their LNC: the label selected and the runtime agree
        ({"profile": "trn2", "lnc": 1}, {"lnc_node_label": LABEL}, "1"),
        ({"profile": "trn2"}, {"lnc_node_label": LABEL}, "2"),
        # no label: sizing assumed trn2's default, so the runtime runs at it
        ({"profile": "trn2"}, {}, "2"),
        # DRA: the claim's LNC (the test's, else the chart default)
        ({"profile": "trn2", "lnc": 1}, {"neuron_dra": NeuronDraSettings()}, "1"),
        ({"profile": "trn2"}, {"neuron_dra": NeuronDraSettings(default_lnc=1)}, "1"),
        # trn3 has the same LNC settings (default 2)
        ({"profile": "trn3", "lnc": 1}, {"lnc_node_label": LABEL}, "1"),
        ({"profile": "trn3"}, {}, "2"),
        # no logical cores on cpu
        ({"profile": "cpu"}, {}, None),
    ],
)
def test_the_runner_runs_at_the_lnc_it_was_sized_and_placed_for(
    spec: dict[str, Any], settings: dict[str, Any], lnc: str | None
) -> None:
    """TorchNeuron reads only NEURON_LOGICAL_NC_CONFIG (else trn2's default 2), never the node's
    LNC file: the operator gives the runner the LNC the cores were counted at."""
    cores = {"cores": 4, "parallelism": "tensor"} if spec["profile"] != "cpu" else {}
    seen = runner_env({**spec, **cores}, OperatorSettings(results_uri="s3://b/r", **settings))
    assert seen["env"].get("NEURON_LOGICAL_NC_CONFIG") == lnc
    if LABEL in seen["selector"]:
        assert seen["selector"][LABEL] == lnc


def test_the_lnc_is_the_operators_to_set_not_the_charts() -> None:
    with pytest.raises(ValidationError, match=r"runner\.env.*NEURON_LOGICAL_NC_CONFIG.*spec\.lnc"):
        OperatorSettings(
            results_uri="s3://b/r", runner_env=[{"name": "NEURON_LOGICAL_NC_CONFIG", "value": "1"}]
        )


def test_a_retry_without_an_lnc_to_claim_is_invalid_not_a_crash() -> None:
    """The chart's DRA default removed between attempts: the Job cannot say its LNC."""
    settings = OperatorSettings(
        results_uri="s3://b/r", neuron_dra=NeuronDraSettings(default_lnc=None)
    )
    spec = parse_spec({"model": "a/b", "profile": "trn2", "cores": 4, "parallelism": "tensor"})
    with pytest.raises(InvalidTest, match=r"neuron\.dra\.defaultLnc"):
        children(REF, spec, Placement(4, Parallelism.TENSOR, 16 * GiB), settings, 2, "")
