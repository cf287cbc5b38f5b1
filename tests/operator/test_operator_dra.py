"""NeuronCores through the Neuron DRA driver (chart value neuron.dra.enabled).

Every ResourceClaimTemplate, Job and rendered chart document is validated against the real
Kubernetes 1.34 schemas (resource.k8s.io/v1 is GA there; the driver needs 1.34).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from k8s_harness import CLAIM_TEMPLATES_URL, JOBS_URL, MODEL, TESTS_URL, Harness
from test_operator_lifecycle import records, runner_log
from test_render import TEST_UID, chart_values, manifest, render, strip_server_fields

from model_support.operator.dra import DraError, build_claim_template, device_claim
from model_support.operator.manifests import Placement, RunScript, TestRef, build_job
from model_support.operator.planning import InvalidTest, claim_template, place
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import (
    SETTINGS_ENV,
    NeuronDraSettings,
    OperatorSettings,
    settings_from_json,
    settings_from_values,
)
from model_support.operator.spec import parse_spec
from model_support.vocabulary import Parallelism, Result

K8S_DRA = "1.34"
CHART = Path(__file__).resolve().parents[2] / "charts" / "model-support"
GiB = 2**30
NEURONCORE = "aws.amazon.com/neuroncore"

# (cores, LNC) -> (whole trn2 devices, connected group): 4 logical cores per device at LNC=2,
# 8 at LNC=1; beyond one device only whole connected groups of 4, 8 or 16 are placed (16 cores
# at LNC=1 need 2 devices: the claim holds 4).
CASES = {
    (1, 1): (1, None),
    (1, 2): (1, None),
    (4, 1): (1, None),
    (4, 2): (1, None),
    (16, 1): (4, 4),
    (16, 2): (4, 4),
}

NO_SCRIPT = RunScript("cm", "", "0" * 64)  # run.py plays no part here


NODE_LOST = {"reason": "NodeLost", "message": "node ip-10-0-0-1 is not ready"}
"""A node lost without a DisruptionTarget condition: the Job fails (the runner's exit 137 matches
its FailJob rule) and the operator retries in a new Job. (A runner stopped by SIGTERM exits 143,
which the Job ignores and replaces itself: no new attempt.)"""


def selects(selector: dict[str, Any], instance_type: str, driver: str = "2.31.7.0") -> bool:
    """Whether the claim's CEL selector takes a device of ``instance_type`` whose driver is
    ``driver`` (the attributes the Neuron DRA driver publishes, deploy/eks/dra.rst),
    evaluated by cel-python."""
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(selector["cel"]["expression"]))
    device = {
        "attributes": {
            "neuron.aws.com": {"instanceType": instance_type, "neuronDriverVersion": driver}
        }
    }
    return bool(program.evaluate({"device": celpy.json_to_cel(device)}))


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_DRA, strict=True)


def spec_for(cores: int, lnc: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": MODEL, "profile": "trn2", "cores": cores}
    if cores > 1:
        spec["parallelism"] = "tensor"
    if lnc is not None:
        spec["lnc"] = lnc
    return spec


def assert_claims_devices(
    template: dict[str, Any], devices: int, group: int | None, lnc: int
) -> None:
    claim = template["spec"]["spec"]["devices"]
    [request] = claim["requests"]
    selectors = request["exactly"].pop("selectors")
    assert request["exactly"] == {
        "deviceClassName": "neuron.aws.com",
        "allocationMode": "ExactCount",
        "count": devices,
    }
    # The devices of trn2 instances that hold the claim, as AWS's example claims select them.
    [selector] = selectors
    assert selects(selector, "trn2.48xlarge") and selects(selector, "trn2u.48xlarge")
    assert selects(selector, "trn2.3xlarge") == (devices == 1)  # one device only
    assert not selects(selector, "trn1.32xlarge") and not selects(selector, "inf2.48xlarge")
    [config] = claim["config"]
    assert config["requests"] == [request["name"]]
    assert config["opaque"] == {
        "driver": "neuron.aws.com",
        "parameters": {
            "apiVersion": "neuron.aws.com/v1",
            "kind": "NeuronConfig",
            "logicalNeuronCore": lnc,
        },
    }
    if group is None:
        assert "constraints" not in claim  # one device is always "connected"
    else:
        assert claim["constraints"] == [
            {
                "requests": [request["name"]],
                "matchAttribute": f"resource.aws.com/devicegroup{group}_id",
            }
        ]


def assert_pod_uses_the_claim(job: dict[str, Any], template_name: str, lnc: int) -> None:
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [
        {"name": "neurons", "resourceClaimTemplateName": template_name}
    ]
    runner = pod["containers"][0]
    assert runner["resources"]["claims"] == [{"name": "neurons"}]
    # No device plugin resource, no LNC node label, no scheduler extension; the runtime runs at
    # the claim's LNC (TorchNeuron reads only the variable) and the driver picks the cores.
    assert NEURONCORE not in runner["resources"]["requests"]
    assert NEURONCORE not in runner["resources"]["limits"]
    assert "node.kubernetes.io/instance-type" not in pod.get("nodeSelector", {})
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert "trn2.48xlarge" in term["matchExpressions"][0]["values"]
    assert "schedulerName" not in pod
    env = {e["name"]: e.get("value") for e in runner["env"]}
    assert env["NEURON_LOGICAL_NC_CONFIG"] == str(lnc)
    assert not set(env) & {"NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES"}
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


# ------------------------------------------------------------------------- the claim


@pytest.mark.parametrize(
    ("cores", "lnc", "devices", "group"),
    [
        *((c, lnc, d, g) for (c, lnc), (d, g) in CASES.items()),
        (8, 2, 4, 4),  # two devices' worth: the driver places whole groups (1, 4, 8, 16)
        (12, 2, 4, 4),
        (24, 2, 8, 8),
        (40, 1, 8, 8),
        (64, 2, 16, 16),
        (128, 1, 16, 16),
    ],
)
def test_fewest_whole_devices_in_one_connected_group(
    cores: int, lnc: int, devices: int, group: int | None
) -> None:
    claim = device_claim(cores, lnc)
    assert (claim.devices, claim.connected_group, claim.lnc) == (devices, group, lnc)


def test_more_devices_than_a_node_has_is_refused() -> None:
    with pytest.raises(DraError, match=r"need 17 Trainium2 devices.*one trn2 node has 16"):
        device_claim(65, 2)


def test_the_lnc_must_be_known_to_claim_devices() -> None:
    settings = OperatorSettings(
        results_uri="s3://b/r", neuron_dra=NeuronDraSettings(default_lnc=None)
    )
    # Refused before sizing reads anything: the claim could not say which LNC to set.
    with pytest.raises(InvalidTest, match=r"no default LNC.*neuron\.dra\.defaultLnc.*spec\.lnc"):
        place(parse_spec(spec_for(4, None)), settings, token=None)
    # Without DRA, an LNC still needs an LNC node label: the message names both ways.
    with pytest.raises(InvalidTest, match=r"lncNodeLabel.*neuron\.dra\.enabled"):
        place(parse_spec(spec_for(4, 1)), OperatorSettings(results_uri="s3://b/r"), token=None)


def test_only_trn2_tests_are_claimed_through_dra() -> None:
    settings = OperatorSettings(results_uri="s3://b/r", neuron_dra=NeuronDraSettings())
    ref = TestRef("ml", "t", "6b1c2f4e-0000-4000-8000-000000000001", 1)
    placement = Placement(2, Parallelism.TENSOR, 16 * GiB)
    trn1 = parse_spec({"model": "a/b", "profile": "trn1", "cores": 2, "parallelism": "tensor"})
    assert claim_template(ref, trn1, placement, settings) is None
    job = build_job(
        ref, trn1, placement, job_name=child_name("t", ref.uid, 1, 1), run_script=NO_SCRIPT,
        attempt=1, run_id=run_id_for(ref.uid, 1, 1), settings=settings,
    )  # fmt: skip
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"][NEURONCORE] == "2"  # the device plugin
    assert "resourceClaims" not in pod and "claims" not in pod["containers"][0]["resources"]


# ------------------------------------------------------------------------- on kmock


def dra_settings(h: Harness, default_lnc: int | None = 2) -> OperatorSettings:
    """The harness's settings with DRA on, plus the device plugin's settings that DRA must
    ignore (an LNC node label, the scheduler extension)."""
    return h.settings.model_copy(
        update={
            "neuron_dra": NeuronDraSettings(default_lnc=default_lnc),
            "lnc_node_label": "example.com/lnc",
            "scheduler_name": "neuron-scheduler",
        }
    )


async def test_each_test_claims_whole_devices_at_its_lnc(harness: Harness) -> None:
    h = harness
    h.settings = dra_settings(h, default_lnc=None)
    await h.start_operator()
    tests = {}
    for cores, lnc in CASES:
        name = f"c{cores}-lnc{lnc}"
        tests[name] = await h.create_test(name, spec_for(cores, lnc))
    await h.create_test("no-lnc", spec_for(4, None))
    jobs = {j["metadata"]["labels"]["modelsupport.dev/test"]: j for j in await h.wait_job(count=6)}

    for (cores, lnc), (devices, group) in CASES.items():
        name = f"c{cores}-lnc{lnc}"
        uid = tests[name]["metadata"]["uid"]
        template = await h.get(f"{CLAIM_TEMPLATES_URL}/{child_name(name, uid, 1)}")
        assert template is not None, f"no ResourceClaimTemplate for {name}"
        validate(template)
        assert_claims_devices(template, devices, group, lnc)
        # Owned by the test like its Job: deleting the test collects it.
        assert template["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "modelsupport.dev/v1alpha1",
                "kind": "ModelSupportTest",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert template["metadata"]["labels"]["modelsupport.dev/test-uid"] == uid
        job = jobs[name]
        validate(job)
        assert_pod_uses_the_claim(job, template["metadata"]["name"], lnc)
        status = await h.wait_status(name, lambda s: "cores" in s, "the sized cores")
        assert status["cores"] == cores  # sized cores; the devices may hold more
        assert status["podCores"] == CASES[cores, lnc][0] * (4 if lnc == 2 else 8)

    status = await h.wait_status("no-lnc", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "neuron.dra.defaultLnc" in status["message"] and "spec.lnc" in status["message"]
    assert len(await h.items(JOBS_URL)) == len(await h.items(CLAIM_TEMPLATES_URL)) == len(CASES)


async def test_a_retried_run_claims_from_the_same_template_and_passes(harness: Harness) -> None:
    h = harness
    h.settings = dra_settings(h)  # default LNC 2 for a test that names none
    await h.start_operator()
    test = await h.create_test("qwen", spec_for(1, None))
    uid = test["metadata"]["uid"]
    [first_job] = await h.wait_job()
    [template] = await h.items(CLAIM_TEMPLATES_URL)
    assert_claims_devices(template, 1, None, 2)
    first = await h.start_pod(first_job)
    await h.end_pod(first_job, first, exit_code=137, log=None, pod_extra=NODE_LOST)
    await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    [second_job] = [
        j
        for j in await h.wait_job(count=2)
        if j["metadata"]["name"] == child_name("qwen", uid, 1, 2)
    ]
    # The generation's attempts share one template; each pod gets its own claim from it.
    assert_pod_uses_the_claim(second_job, template["metadata"]["name"], 2)
    assert len(await h.items(CLAIM_TEMPLATES_URL)) == 1
    second = await h.start_pod(second_job)
    await h.run_pod(second)
    await h.end_pod(second_job, second, exit_code=0, log=runner_log(Result.PASS))
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert status["result"] == "PASS" and status["attempt"] == 2
    assert [r.document.result for r in records(h)] == [Result.PASS]
    assert (await h.get(f"{TESTS_URL}/qwen")) is not None and len(await h.items(JOBS_URL)) == 2


async def test_a_spec_change_deletes_the_superseded_generations_template(
    harness: Harness,
) -> None:
    """One template per generation: a new generation's replaces its predecessor's (whose
    pods' claims, made from it, belong to those pods), so templates do not pile up."""
    h = harness
    h.settings = dra_settings(h)
    await h.start_operator()
    test = await h.create_test("qwen", spec_for(1, 1))
    uid = test["metadata"]["uid"]
    [first] = await h.wait_job()
    await h.patch(f"{TESTS_URL}/qwen", {"spec": {"lnc": 2}})
    await h.wait_job(child_name("qwen", uid, 2, 1))

    async def one_template() -> list[dict[str, Any]] | None:
        templates = await h.items(CLAIM_TEMPLATES_URL)
        return templates if len(templates) == 1 else None

    [template] = await h.wait_for(one_template, what="the superseded template deleted")
    assert template["metadata"]["name"] == child_name("qwen", uid, 2)
    assert_claims_devices(template, 1, None, 2)
    assert await h.get(f"{JOBS_URL}/{first['metadata']['name']}") is None  # superseded too


async def test_a_retry_after_the_dra_default_was_removed_is_invalid_not_a_result(
    harness: Harness,
) -> None:
    """Settings changed between attempts: the test says what to fix; no record, no new Job."""
    h = harness
    h.settings = dra_settings(h)
    await h.start_operator()
    await h.create_test("qwen", spec_for(1, None))
    [first_job] = await h.wait_job()
    await h.stop_operator()
    h.settings = dra_settings(h, default_lnc=None)
    await h.start_operator()
    first = await h.start_pod(first_job)
    await h.end_pod(first_job, first, exit_code=137, log=None, pod_extra=NODE_LOST)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "cannot retry" in status["message"] and "spec.lnc" in status["message"]
    assert records(h) == []
    assert len(await h.items(JOBS_URL)) == 1


async def test_render_prints_the_claim_template_the_operator_creates(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    values = chart_values(h, neuron={"dra": {"enabled": True}})
    h.settings = settings_from_values(values).model_copy(
        update={
            "api_server": h.settings.api_server,
            "namespaces": ["default"],
            "all_namespaces": False,
            "metrics_port": None,
            "watchdog_interval_s": 0.2,
        }
    )
    spec = spec_for(16, 1)
    await h.start_operator()
    await h.create_test("qwen", dict(spec), uid=TEST_UID)
    [job] = await h.wait_job()
    [template] = await h.items(CLAIM_TEMPLATES_URL)
    result, documents = render(tmp_path, [manifest("qwen", spec, uid=TEST_UID)], values)
    assert result.exit_code == 0, result.output
    _, rendered_template, rendered_job = documents
    assert rendered_template == strip_server_fields(template)
    assert rendered_job == strip_server_fields(job)
    assert_claims_devices(rendered_template, 4, 4, 1)


# ------------------------------------------------------------------------- the chart


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(
        copy.deepcopy(values), name="ms", namespace="model-support"
    )
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def operator_rules(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    return {
        (group, resource): set(rule["verbs"])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and not d["metadata"]["name"].endswith(("-edit", "-view"))
        for rule in d["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def chart_settings(docs: list[dict[str, Any]]) -> OperatorSettings:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    return settings_from_json(env[SETTINGS_ENV]["value"])


CLAIMS_RULE = ("resource.k8s.io", "resourceclaimtemplates")


@pytest.mark.parametrize("namespaces", [[], ["ml", "research"]])
def test_the_chart_grants_claim_templates_only_with_dra(namespaces: list[str]) -> None:
    base = {
        "results": "s3://bucket/model-support",
        "watchNamespaces": namespaces,
        "watchAllNamespaces": not namespaces,  # [] : every namespace, explicitly
        "networkPolicy": {"namespaces": namespaces or ["ml"]},
        "deliveryKey": {"existingSecret": "ms-delivery-key"},
    }
    off = render_chart(base)
    assert CLAIMS_RULE not in operator_rules(off)
    assert chart_settings(off).neuron_dra is None

    values = {**base, "neuron": {"dra": {"enabled": True, "configApiVersion": "neuron.aws.com/v2"}}}
    report = helm_python.lint(str(CHART), copy.deepcopy(values), strict=True)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    docs = render_chart(values)
    for doc in docs:
        validate(doc)
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    roles_with_claims = [r for r in rules if "resourceclaimtemplates" in r["resources"]]
    assert len(roles_with_claims) == max(1, len(namespaces))  # in every Role the operator has
    # delete: the template of a generation superseded by a spec change.
    assert operator_rules(docs)[CLAIMS_RULE] == {"get", "create", "delete"}
    settings = chart_settings(docs)
    assert settings.neuron_dra == NeuronDraSettings(config_api_version="neuron.aws.com/v2")
    assert settings.neuron_dra.default_lnc == 2 and settings.neuron_dra.device_class_name == (
        "neuron.aws.com"
    )
    # The chart's template and settings_from_values (`model-support render`) agree.
    assert settings == settings_from_values(values)
    assert settings_from_values(base).neuron_dra is None


def test_a_claim_selects_the_instance_type_a_test_names_and_the_chart_s_driver_version() -> None:
    """AWS's example claims select devices by instanceType, and by neuronDriverVersion to run
    on the driver an image was built for: a test naming trn2.3xlarge gets only those devices,
    and with neuron.dra.driverVersion set only devices of that driver."""
    dra = NeuronDraSettings(driver_version="2.31.7.0")
    claim = device_claim(4, 2, "trn2.3xlarge")
    template = build_claim_template({"name": "t"}, claim, dra)
    [request] = template["spec"]["spec"]["devices"]["requests"]
    [selector] = request["exactly"]["selectors"]
    assert selects(selector, "trn2.3xlarge") and not selects(selector, "trn2.48xlarge")
    assert not selects(selector, "trn2.3xlarge", driver="2.30.2.0")
    validate(template)
