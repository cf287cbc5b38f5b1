"""Manifests, CRD schema, Helm chart and outcome rules, each checked against the real schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from model_support.operator.manifests import Placement, TestRef, build_configmap, build_job
from model_support.operator.outcome import JobState, read_job, stuck_reason
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.script import read_config, render_script
from model_support.vocabulary import Backend, Parallelism

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "modelsupporttests.yaml"
CHART = ROOT / "charts" / "model-support"
K8S = "1.33"
GiB = 2**30
REF = TestRef("ml", "llama-8b", "6b1c2f4e-0000-4000-8000-000000000001", 3)
SETTINGS = OperatorSettings(results_uri="/tmp/r", runner_image="registry.example/runner:1")


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_PATH.read_text()))


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> jsonschema.Validator:
    openapi = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum included).
    return jsonschema.Draft4Validator(openapi)


def full_spec() -> dict[str, Any]:
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "revision": "main",
        "profile": "trn2",
        "cores": 4,
        "parallelism": "tensor",
        "dtype": "bfloat16",
        "maxNewTokens": 16,
        "timeoutSeconds": 5400,
        "hubTokenSecret": {"name": "hf-token", "key": "token"},
        "compileCache": {
            "source": "hf://buckets/aws-neuron/neff-cache/x",
            "target": "hf://buckets/me/neff/x",
        },
        "extraPackages": ["sentencepiece>=0.2"],
        "scheduling": {
            "schedulerName": "my-scheduler",
            "nodeSelector": {"pool": "trn2"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
            ],
        },
        "queueName": "trainium",
        "lnc": 2,
    }


# ------------------------------------------------------------------------- the CRD


def test_crd_is_a_valid_structural_crd(crd: dict[str, Any]) -> None:
    validate(crd)
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["group"] == "modelsupport.dev" and version["name"] == "v1alpha1"
    assert crd["spec"]["names"]["shortNames"] == ["mst"] and version["subresources"] == {
        "status": {}
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Model", "Cores", "Result", "Wall", "Age"} <= set(columns)


def test_crd_enums_are_the_one_vocabulary(crd: dict[str, Any]) -> None:
    from model_support.vocabulary import ErrorClass, ExclusionReason, Result, Task

    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert props["status"]["properties"]["result"]["enum"] == [r.value for r in Result]
    assert props["status"]["properties"]["errorClass"]["enum"] == [e.value for e in ErrorClass]
    assert props["status"]["properties"]["exclusionReason"]["enum"] == [
        e.value for e in ExclusionReason
    ]
    assert props["spec"]["properties"]["task"]["enum"] == [t.value for t in Task]


def test_operator_patterns_are_the_crd_patterns(crd: dict[str, Any]) -> None:
    from model_support.operator import spec as spec_module

    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    assert props["model"]["pattern"] == spec_module.MODEL_PATTERN
    assert props["revision"]["pattern"] == spec_module.REVISION_PATTERN
    assert props["image"]["pattern"] == spec_module.IMAGE_PATTERN
    assert props["extraPackages"]["items"]["pattern"] == spec_module.PACKAGE_PATTERN
    assert props["compileCache"]["properties"]["source"]["pattern"] == spec_module.BUCKET_PATTERN
    assert props["queueName"]["pattern"] == spec_module.DNS_LABEL_PATTERN
    assert props["compileBackend"]["pattern"] == spec_module.COMPILE_BACKEND_PATTERN


def test_valid_specs_pass_the_schema_and_the_operator(schema: jsonschema.Validator) -> None:
    for spec in (
        full_spec(),
        {"model": "Qwen/Qwen3-0.6B"},
        {"model": "/models/tiny-llama", "profile": "cpu"},
    ):
        schema.validate(
            {
                "apiVersion": "modelsupport.dev/v1alpha1",
                "kind": "ModelSupportTest",
                "metadata": {"name": "x"},
                "spec": spec,
            }
        )
        parse_spec(spec)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "not a model id"}, "model"),
        ({"model": "org/name; rm -rf /"}, "model"),
        ({"dtype": "int8"}, "dtype"),
        ({"cores": 0}, "cores"),
        ({"cores": 200}, "cores"),
        ({"maxNewTokens": 0}, "maxNewTokens"),
        ({"timeoutSeconds": 5}, "timeoutSeconds"),
        ({"profile": "trn9"}, "profile"),
        ({"compileCache": {"source": "s3://bucket/x"}}, "source"),
        ({"extraPackages": ["--index-url=http://evil"]}, "extraPackages"),
        ({"queueName": "Not_A_Label"}, "queueName"),
        ({"unknownField": 1}, None),
    ],
)
def test_invalid_specs_are_refused(
    schema: jsonschema.Validator, change: dict[str, Any], field: str | None
) -> None:
    spec = {**full_spec(), **change}
    body = {
        "apiVersion": "modelsupport.dev/v1alpha1",
        "kind": "ModelSupportTest",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    if field is not None:
        errors = list(schema.iter_errors(body))
        assert errors, f"the schema accepted {change}"
        assert any(field in "/".join(str(p) for p in e.absolute_path) for e in errors)
    with pytest.raises(SpecError, match=r"spec\."):
        parse_spec(spec)


def test_cel_rules_have_the_operator_twin() -> None:
    """The x-kubernetes-validations rules cannot run here; the operator enforces each of them."""
    for bad, message in [
        ({"model": "a/b", "profile": "trn1", "lnc": 1}, "lnc"),
        ({"model": "a/b", "profile": "inf2", "cores": 30, "parallelism": "tensor"}, "24 cores"),
        ({"model": "a/b", "profile": "trn2", "cores": 100, "parallelism": "tensor"}, "64 cores"),
        ({"model": "a/b", "parallelism": "tensor"}, "together with cores"),
        ({"model": "a/b", "cores": 4}, "needs parallelism"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_spec(bad)
    parse_spec({"model": "a/b", "profile": "trn2", "lnc": 1, "cores": 100, "parallelism": "tensor"})


def test_examples_are_valid(schema: jsonschema.Validator) -> None:
    examples = sorted((ROOT / "crds" / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        body = yaml.safe_load(path.read_text())
        schema.validate(body)
        parse_spec(body["spec"])


# ------------------------------------------------------------------------- manifests


def job_for(
    spec_dict: dict[str, Any], cores: int = 4, parallelism: Parallelism = Parallelism.TENSOR
) -> dict[str, Any]:
    spec = parse_spec(spec_dict)
    return build_job(
        REF,
        spec,
        Placement(cores, parallelism, 40 * GiB),
        job_name=child_name(REF.name, REF.uid, REF.generation, 1),
        configmap_name=child_name(REF.name, REF.uid, REF.generation),
        attempt=1,
        run_id=run_id_for(REF.uid, REF.generation, 1),
        settings=SETTINGS,
    )


def test_full_job_manifest(tmp_path: Path) -> None:
    job = job_for(full_spec())
    validate(job)
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["suspend"]) == (0, 5400, True)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "trainium"
    pod = spec["template"]["spec"]
    assert pod["schedulerName"] == "my-scheduler" and pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "trn2.48xlarge",
        "pool": "trn2",
    }
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and pod["automountServiceAccountToken"] is False
    )
    runner = pod["containers"][0]
    assert runner["resources"]["requests"]["aws.amazon.com/neuroncore"] == "4"
    assert runner["resources"]["limits"] == {"memory": "40Gi", "aws.amazon.com/neuroncore": "4"}
    assert runner["resources"]["requests"]["cpu"] == "8000m"
    assert runner["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert runner["securityContext"]["allowPrivilegeEscalation"] is False
    assert runner["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e for e in runner["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    }
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"]["value"] == SETTINGS.neff_cache_dir
    assert env["NEURON_LOGICAL_NC_CONFIG"]["value"] == "2"
    # With a cache target the command syncs back after run.py; user values only come from env.
    assert runner["command"][:2] == ["/bin/sh", "-c"] and "hf://" not in runner["command"][2]
    assert env["MODEL_SUPPORT_CACHE_TARGET"]["value"] == "hf://buckets/me/neff/x"
    init = {c["name"]: c for c in pod["initContainers"]}
    assert init["neff-cache-fetch"]["command"] == [
        "hf",
        "buckets",
        "sync",
        "hf://buckets/aws-neuron/neff-cache/x",
        SETTINGS.neff_cache_dir,
    ]
    assert init["extra-packages"]["command"][-1] == "sentencepiece>=0.2"
    mounts = {m["mountPath"]: m for m in runner["volumeMounts"]}
    assert mounts["/work/run.py"]["subPath"] == "run.py"


def test_minimal_job_and_cpu_profile() -> None:
    job = job_for({"model": "Qwen/Qwen3-0.6B", "cores": 1}, cores=1, parallelism=Parallelism.NONE)
    validate(job)
    runner = job["spec"]["template"]["spec"]["containers"][0]
    assert runner["command"] == ["python3", "run.py"]
    assert "suspend" not in job["spec"] and "initContainers" not in job["spec"]["template"]["spec"]
    cpu = job_for(
        {"model": "/models/tiny", "profile": "cpu", "cores": 1},
        cores=1,
        parallelism=Parallelism.NONE,
    )
    validate(cpu)
    pod = cpu["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert "aws.amazon.com/neuroncore" not in pod["containers"][0]["resources"]["limits"]


def test_a_small_host_memory_floor_is_requested_in_mebibytes() -> None:
    spec = parse_spec({"model": "/models/tiny", "profile": "cpu", "cores": 1})
    small = build_job(
        REF,
        spec,
        Placement(1, Parallelism.NONE, int(0.375 * GiB)),
        job_name="j",
        configmap_name="c",
        attempt=1,
        run_id="r",
        settings=SETTINGS,
    )
    validate(small)
    resources = small["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "384Mi"
    rendered = helm_python.Chart.load(str(CHART)).render(
        {"minHostMemoryGiB": 0.375}, name="ms", namespace="model-support"
    )
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert (
        "--min-host-memory=0.375" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_configmap_holds_the_rendered_script() -> None:
    spec = parse_spec(full_spec())
    config = spec.run_config(4, Parallelism.TENSOR)
    assert config.backend == Backend.NEURON and config.max_new_tokens == 16
    cm = build_configmap(REF, child_name(REF.name, REF.uid, REF.generation), render_script(config))
    validate(cm)
    assert read_config(cm["data"]["run.py"]) == config
    assert cm["metadata"]["ownerReferences"][0] == {
        "apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportTest", "name": REF.name,
        "uid": REF.uid, "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def test_child_names_are_deterministic_and_valid() -> None:
    long = "a" * 120
    names = {
        child_name(long, REF.uid, 1, 1),
        child_name(long, REF.uid, 1, 2),
        child_name(long, REF.uid, 2, 1),
    }
    assert len(names) == 3 and all(len(n) <= 63 for n in names)
    assert child_name("x", REF.uid, 1, 1) == child_name("x", REF.uid, 1, 1)
    assert child_name("x", REF.uid, 1, 1) != child_name("x", "ffffffff-0000", 1, 1)
    assert run_id_for(REF.uid, 1, 1) == run_id_for(REF.uid, 1, 1) != run_id_for(REF.uid, 1, 2)


# ------------------------------------------------------------------------- outcome rules


def _job(kind: str, reason: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": kind, "status": "True", "reason": reason}]}}


def _pod(terminated: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    statuses = [{"name": "runner", "state": {"terminated": terminated}}] if terminated else []
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {**status, "containerStatuses": statuses},
    }


def test_job_readings() -> None:
    assert read_job({"status": {"active": 1}}, []).state == JobState.ACTIVE
    assert (
        read_job(_job("Complete", "Completed"), [_pod({"exitCode": 0})]).state == JobState.SUCCEEDED
    )
    assert read_job(_job("Failed", "DeadlineExceeded"), [_pod()]).state == JobState.TIMEOUT
    assert (
        read_job(
            _job("Failed", "BackoffLimitExceeded"), [_pod({"exitCode": 137, "reason": "OOMKilled"})]
        ).state
        == JobState.OUT_OF_MEMORY
    )
    assert (
        read_job(_job("Failed", "BackoffLimitExceeded"), [_pod({"exitCode": 1})]).state
        == JobState.FAILED
    )
    assert read_job(_job("Failed", "BackoffLimitExceeded"), []).state == JobState.NODE_LOST
    lost = _pod(
        {"exitCode": 137},
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
        ],
    )
    assert read_job(_job("Failed", "BackoffLimitExceeded"), [lost]).state == JobState.NODE_LOST
    evicted = _pod({"exitCode": 137}, reason="Evicted", message="low on memory")
    assert (
        read_job(_job("Failed", "BackoffLimitExceeded"), [evicted]).state == JobState.INFRASTRUCTURE
    )


def test_stuck_pods() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
    pull = _pod(phase="Pending")
    pull["status"]["containerStatuses"] = [
        {"name": "runner", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}
    ]
    assert "ErrImagePull" in (
        stuck_reason(pull, now=now, unschedulable_limit_s=60, image_pull_limit_s=300) or ""
    )
    assert stuck_reason(pull, now=now, unschedulable_limit_s=60, image_pull_limit_s=3600) is None
    pending = _pod(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:09:00Z",
                "message": "no nodes",
            }
        ],
    )
    assert (
        stuck_reason(pending, now=now, unschedulable_limit_s=30, image_pull_limit_s=300) is not None
    )
    assert stuck_reason(pending, now=now, unschedulable_limit_s=120, image_pull_limit_s=300) is None


# ------------------------------------------------------------------------- the Helm chart


def test_chart_crd_is_the_crd() -> None:
    assert (CHART / "crds" / "modelsupporttests.yaml").read_text() == CRD_PATH.read_text()


@pytest.mark.parametrize(
    "values", [{}, {"watchNamespaces": ["ml", "research"], "rbac": {"readHubTokenSecrets": False}}]
)
def test_chart_renders_valid_least_privilege_manifests(values: dict[str, Any]) -> None:
    report = helm_python.lint(str(CHART), copy.deepcopy(values), strict=True)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    rendered = helm_python.Chart.load(str(CHART)).render(
        copy.deepcopy(values), name="ms", namespace="model-support"
    )
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        validate(doc)
    kinds = sorted(d["kind"] for d in docs)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    verbs = {
        (g, res): set(r["verbs"]) for r in rules for g in r["apiGroups"] for res in r["resources"]
    }
    assert "*" not in {v for vs in verbs.values() for v in vs}
    assert verbs[("batch", "jobs")] == {"get", "list", "watch", "create", "delete"}
    assert verbs[("", "pods/log")] == {"get"}
    if values:
        assert kinds.count("Role") == 2 and ("", "secrets") not in verbs
        assert "--namespace=ml" in container["args"]
    else:
        assert "ClusterRole" in kinds and verbs[("", "secrets")] == {"get"}
        assert "--all-namespaces" in container["args"]
