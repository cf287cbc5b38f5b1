"""Where a Neuron test may run, and at which LNC its runtime runs (pure planning, no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from model_support.operator.manifests import Placement, RunScript, TestRef, build_job
from model_support.operator.planning import InvalidTest, children, place
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import NeuronDraSettings, OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.sizing import Exclusion
from model_support.vocabulary import ExclusionReason, Parallelism

K8S = "1.34.0"
REF = TestRef("ml", "t", "6b1c2f4e-0000-4000-8000-000000000002", 1)
GiB = 2**30

NO_SCRIPT = RunScript("cm", "", "0" * 64)  # run.py plays no part here


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
        job_name=child_name("t", REF.uid, 1, 1), run_script=NO_SCRIPT, attempt=1,
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
        # no label: the LNC the chart declares the node groups run at (AWS's default, 2) ...
        ({"profile": "trn2"}, {}, "2"),
        # ... or the LNC 1 a launch template sets, declared in runner.defaultLnc
        ({"profile": "trn2"}, {"runner_default_lnc": 1}, "1"),
        ({"profile": "trn2", "lnc": 1}, {"runner_default_lnc": 1}, "1"),
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
    # The compile target its NEFF cache is kept by, whichever trn2 type the pod lands on.
    if spec["profile"] != "cpu":
        assert seen["env"]["MODEL_SUPPORT_NEURON_TARGET"] == spec["profile"]


def test_without_an_lnc_label_the_nodes_lnc_is_never_assumed_silently(
    tiny_llama_path: Path,
) -> None:
    """AWS's EKS guide sets a trn2 node group's LNC in its launch template, which adds no node
    label: the operator runs tests at the LNC the chart declares for the node groups
    (runner.defaultLnc), refuses one asking for another LNC, and refuses every test without
    spec.lnc when the chart declares none."""
    model = str(tiny_llama_path)
    declared = OperatorSettings(results_uri="s3://b/r", runner_default_lnc=1)
    assert isinstance(place(parse_spec({"model": model}), declared, token=None), Placement)
    with pytest.raises(InvalidTest, match=r"spec.lnc=2 needs nodes labelled.*runner.defaultLnc"):
        place(parse_spec({"model": model, "lnc": 2}), declared, token=None)
    unknown = OperatorSettings(results_uri="s3://b/r", runner_default_lnc=None)
    with pytest.raises(InvalidTest, match=r"not known to the operator: set spec.lnc, or the chart"):
        place(parse_spec({"model": model}), unknown, token=None)
    with pytest.raises(InvalidTest, match="not known to the operator"):  # nor can a pod pick
        place(parse_spec({"model": model, "lnc": 1}), unknown, token=None)


def test_a_pod_may_land_on_any_trn2_instance_type_whose_devices_hold_it() -> None:
    """Not only trn2.48xlarge: trn2.3xlarge holds one device, and the Neuron driver's trn2u,
    trn2p and trn2eu servers sixteen; a test naming its instanceType gets only that type."""

    def types(spec: dict[str, Any], cores: int) -> list[str]:
        job = build_job(
            REF, parse_spec({"model": "a/b", **spec}), Placement(cores, Parallelism.TENSOR, GiB),
            job_name="j", run_script=NO_SCRIPT, attempt=1, run_id=run_id_for(REF.uid, 1, 1),
            settings=OperatorSettings(results_uri="s3://b/r", scheduler_name="neuron-scheduler"),
        )  # fmt: skip
        kubernetes_validate.validate(job, K8S, strict=True)
        pod = job["spec"]["template"]["spec"]
        if "affinity" not in pod:
            return [pod["nodeSelector"]["node.kubernetes.io/instance-type"]]
        required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        return required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]

    one_device = types({"cores": 4, "parallelism": "tensor"}, 4)
    assert one_device == [
        "trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge", "trn2p.48xlarge", "trn2eu.48xlarge"
    ]  # fmt: skip
    assert "trn2.3xlarge" not in types({"cores": 16, "parallelism": "tensor"}, 16)
    assert types({"instanceType": "trn2u.48xlarge"}, 1) == ["trn2u.48xlarge"]


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
        children(REF, spec, Placement(4, Parallelism.TENSOR, 16 * GiB), settings, 2)


@pytest.mark.parametrize(
    ("values", "default_lnc", "driver"),
    [
        ({}, 2, None),  # the chart's default: AWS's trn2 default LNC, any driver
        (
            {"runner": {"defaultLnc": 1}, "neuron": {"dra": {"driverVersion": "2.31.7.0"}}},
            1,
            "2.31.7.0",
        ),
        ({"runner": {"defaultLnc": None}}, None, None),  # null: tests must name spec.lnc
    ],
)
def test_the_nodes_lnc_and_the_claims_driver_version_are_chart_values(
    values: dict[str, Any], default_lnc: int | None, driver: str | None
) -> None:
    from test_operator_manifests import REQUIRED, chart_settings, render_chart

    from model_support.operator.settings import settings_from_values

    chart = {"results": "s3://bucket/results", **REQUIRED, **values}
    if "neuron" in chart:
        chart["neuron"] = {"dra": {"enabled": True, **chart["neuron"]["dra"]}}
    settings = chart_settings(render_chart(chart))
    assert settings == settings_from_values(chart)  # the template and the operator agree
    assert settings.runner_default_lnc == default_lnc
    assert (settings.neuron_dra.driver_version if settings.neuron_dra else None) == driver
