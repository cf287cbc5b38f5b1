"""Manifests, CRD schema, Helm chart and outcome rules, each checked against the real schemas."""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_values import REQUIRED_CHART_VALUES
from job_controller import match_pod_failure_policy

from model_support.operator.manifests import (
    BACKOFF_LIMIT,
    PROGRAM_DIR,
    Placement,
    RunScript,
    TestRef,
    build_job,
    build_program_configmap,
    program_configmap_name,
)
from model_support.operator.outcome import JobState, PullFailures, read_job, stuck_reason
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import PROFILES, SpecError, TestSpec, parse_spec
from model_support.script import config_block, program, read_config, render_script
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
        ({"compileCache": {"source": "hf://datasets/org/neff"}}, "source"),
        ({"compileCache": {"target": "gs://bucket/x"}}, "target"),
        ({"compileCache": {"target": "caches/neff"}}, "target"),
        ({"compileCache": {"source": "/mnt/caches/../etc"}}, "source"),
        ({"extraPackages": ["--index-url=http://evil"]}, "extraPackages"),
        ({"queueName": "Not_A_Label"}, "queueName"),
        ({"verification": {"localize": "sometimes"}}, "localize"),
        ({"verification": {"localizeBudgetSeconds": 0}}, "localizeBudgetSeconds"),
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


def _defaulted(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with the schema's defaults filled in, as the API server does before CEL runs."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    result = dict(value)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in result and "default" in prop:
            result[name] = copy.deepcopy(prop["default"])
        if name in result:
            result[name] = _defaulted(prop, result[name])
    return result


def _cel_rules(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], str, str]]:
    """Every x-kubernetes-validations rule of a schema, with the path of the object it guards."""
    rules = [(path, r["rule"], r["message"]) for r in schema.get("x-kubernetes-validations") or []]
    for name, prop in (schema.get("properties") or {}).items():
        rules += _cel_rules(prop, (*path, name))
    return rules


@functools.cache
def _cel_program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_violations(crd: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """The messages of the CRD's CEL rules a spec breaks, evaluated by cel-python."""
    import celpy

    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec = _defaulted(schema, spec)
    broken = []
    for path, rule, message in _cel_rules(schema):
        target: Any = spec
        for part in path:
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            continue  # a rule on an absent object does not run
        if not bool(_cel_program(rule).evaluate({"self": celpy.json_to_cel(target)})):
            broken.append(message)
    return broken


def test_cel_rules_and_the_operator_agree(
    crd: dict[str, Any], schema: jsonschema.Validator
) -> None:
    """The CRD's CEL rules (run by cel-python, as the API server runs them) refuse exactly the
    specs the operator refuses: neither can drift from the other."""
    import itertools

    cases = 0
    profiles = list(PROFILES)  # every profile the operator knows, so a new one is covered
    for profile, lnc, cores, parallelism in itertools.product(
        profiles,
        [None, 1, 2],
        [None, 1, 4, 30, 64, 65, 100],
        [None, "none", "tensor"],
    ):
        spec: dict[str, Any] = {"model": "a/b", "profile": profile}
        for key, value in (("lnc", lnc), ("cores", cores), ("parallelism", parallelism)):
            if value is not None:
                spec[key] = value
        body = {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportTest",
                "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
        api_accepts = schema.is_valid(body) and not cel_violations(crd, spec)
        try:
            parse_spec(spec)
            operator_accepts = True
        except SpecError:
            operator_accepts = False
        assert api_accepts == operator_accepts, (spec, cel_violations(crd, spec))
        cases += 1
    assert cases == len(profiles) * 3 * 7 * 3 and {"trn2", "trn3"} <= set(profiles)
    # Each rule is exercised by at least one refused spec, with its own message.
    only = "lnc (logical NeuronCore config) applies only to the trn2 profile or the trn3 profile."
    assert only in cel_violations(crd, {"model": "a/b", "profile": "trn1", "lnc": 1})
    assert cel_violations(crd, {"model": "a/b", "compileCache": {}}) == [
        "compileCache needs a source, a target, or both."
    ]


def _api_verdict(
    crd: dict[str, Any], schema: jsonschema.Validator, spec: dict[str, Any]
) -> list[str]:
    """What the API server says of a spec: schema errors, then CEL messages ([] = admitted)."""
    body = {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportTest",
            "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    return [e.message for e in schema.iter_errors(body)] + cel_violations(crd, spec)


@pytest.mark.parametrize(
    "location",
    [
        "hf://buckets/aws-neuron/torch-neuronx-neff-cache",
        "hf://buckets/me/neff/team-a/neuronxcc-2.28.7631.0/",
        "s3://my-bucket",
        "s3://my-bucket/neff-cache/team_a",
        "/var/cache/model-support/compile-caches/team-a",
    ],
)
def test_compile_cache_takes_the_forms_the_cli_takes(
    crd: dict[str, Any], schema: jsonschema.Validator, location: str
) -> None:
    """Each form `model-support cache pull|push` accepts is admitted by the API server (schema
    and CEL) and the operator, as source and as target."""
    for end in ("source", "target"):
        spec = {"model": "a/b", "compileCache": {end: location}}
        assert _api_verdict(crd, schema, spec) == []
        parsed = parse_spec(spec).compileCache
        assert parsed is not None and getattr(parsed, end) == location


@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("hf://datasets/org/neff-cache", "is not a Hugging Face storage bucket"),
        ("hf://org/neff-cache", "is not a Hugging Face storage bucket"),
        ("gs://bucket/neff", "gs:// is not a compile cache store here"),
        ("caches/neff", "is a relative path"),
        ("/mnt/caches/../../etc", "no '..'"),
        ("s3://Bad_Bucket/x", "S3 bucket names are 3 to 63"),
        ("s3://bucket/a b", "is not a valid compile cache location"),
    ],
)
def test_a_bad_compile_cache_location_is_refused_clearly(
    crd: dict[str, Any], schema: jsonschema.Validator, location: str, says: str
) -> None:
    spec = {"model": "a/b", "compileCache": {"target": location}}
    assert _api_verdict(crd, schema, spec), f"the API server would admit {location!r}"
    with pytest.raises(SpecError) as refused:
        parse_spec(spec)
    message = str(refused.value)
    assert "spec.compileCache.target" in message and says in message
    # Every refusal names the forms that would do.
    assert "s3://" in message or "hf://buckets/" in message
    if not location.startswith(("hf://", "s3://", "/")):
        # The CEL rule says it in words, beside the schema's pattern.
        assert any("compileCache.target must be" in m for m in cel_violations(crd, spec))


def test_compile_cache_paths_must_be_on_the_operators_cache_volume() -> None:
    from model_support.operator.planning import InvalidTest, check_compile_cache

    on_volume = {"model": "a/b", "compileCache": {"target": "/caches/team-a"}}
    with pytest.raises(InvalidTest, match="no compile cache volume"):
        check_compile_cache(parse_spec(on_volume), SETTINGS)
    settings = SETTINGS.model_copy(
        update={"compile_cache_volume_claim": "caches", "compile_cache_volume_path": "/caches"}
    )
    check_compile_cache(parse_spec(on_volume), settings)
    elsewhere = {"model": "a/b", "compileCache": {"source": "/etc/neff"}}
    with pytest.raises(InvalidTest, match=r"not on the compile cache volume.*under /caches/"):
        check_compile_cache(parse_spec(elsewhere), settings)
    remote = {"model": "a/b", "compileCache": {"source": "s3://team/x"}}
    check_compile_cache(parse_spec(remote), SETTINGS)

    # The pull step mounts only the namespace's folder of the claim (read-only: it only
    # reads), the runner nothing of it (it pushes to S3).
    job = job_for(
        {"model": "a/b", "profile": "cpu", "cores": 1, "compileCache": {"source": "/caches/ml",
         "target": "s3://team/neff"}},
        cores=1, parallelism=Parallelism.NONE, settings=settings,
    )  # fmt: skip
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "compile-caches", "persistentVolumeClaim": {"claimName": "caches"}} in pod[
        "volumes"
    ]
    [pull] = pod["initContainers"]
    [runner] = pod["containers"]
    assert {
        "name": "compile-caches", "mountPath": "/caches/ml", "subPath": "ml", "readOnly": True
    } in pull["volumeMounts"]  # fmt: skip
    assert not any(m["name"] == "compile-caches" for m in runner["volumeMounts"])
    # The cpu profile's compile cache is inductor's, in a folder both containers share.
    # Through the wrapper that stops it on the pod's SIGTERM (exit 143, which the Job ignores).
    assert pull["command"][:5] == ["python3", "-m", "model_support.pod_step", "--", "model-support"]
    assert pull["command"][7:10] == ["/caches/ml", "--backend", "cpu"]
    inductor = {e["name"]: e["value"] for e in runner["env"] if "value" in e}
    assert inductor["TORCHINDUCTOR_CACHE_DIR"].startswith("/tmp/")
    assert {m["mountPath"] for m in pull["volumeMounts"]} >= {"/tmp", "/work"}
    assert runner["command"][-8:] == [
        "--pull-source", "/caches/ml", "--compile-cache", "s3://team/neff",
        "--cache-backend", "cpu", "--cache-deadline", "1800",
    ]  # fmt: skip
    # A push-only cache has no pull step and no report to read.
    push_only = job_for(
        {"model": "a/b", "compileCache": {"target": "s3://team/neff"}}, settings=settings
    )
    assert "initContainers" not in push_only["spec"]["template"]["spec"]
    assert "--pull-report" not in push_only["spec"]["template"]["spec"]["containers"][0]["command"]


def test_examples_are_valid(schema: jsonschema.Validator) -> None:
    examples = sorted((ROOT / "crds" / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        body = yaml.safe_load(path.read_text())
        schema.validate(body)
        parse_spec(body["spec"])


# ------------------------------------------------------------------------- manifests


def run_script_for(spec: TestSpec, cores: int, parallelism: Parallelism) -> RunScript:
    """What the operator puts in a Job for its run.py (as planning.children does)."""
    config = spec.run_config(cores, Parallelism.NONE if cores == 1 else parallelism)
    rendered = render_script(config).encode()
    return RunScript(
        program_configmap_name(program()),
        config_block(config),
        hashlib.sha256(rendered).hexdigest(),
    )


def job_for(
    spec_dict: dict[str, Any],
    cores: int = 4,
    parallelism: Parallelism = Parallelism.TENSOR,
    settings: OperatorSettings = SETTINGS,
    checkpoint_bytes: int = 0,
) -> dict[str, Any]:
    spec = parse_spec(spec_dict)
    return build_job(
        REF,
        spec,
        Placement(cores, parallelism, 40 * GiB, checkpoint_bytes),
        job_name=child_name(REF.name, REF.uid, REF.generation, 1),
        run_script=run_script_for(spec, cores, parallelism),
        attempt=1,
        run_id=run_id_for(REF.uid, REF.generation, 1),
        settings=settings,
    )


def test_scheduler_and_lnc_come_from_the_operators_settings() -> None:
    settings = SETTINGS.model_copy(
        update={"scheduler_name": "neuron-scheduler", "lnc_node_label": "example.com/lnc"}
    )
    multi = job_for(
        {"model": "a/b", "cores": 4, "parallelism": "tensor", "lnc": 1}, settings=settings
    )
    validate(multi)
    pod = multi["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "neuron-scheduler"  # more than one core: connected cores
    assert pod["nodeSelector"]["example.com/lnc"] == "1"  # nodes configured with LNC=1
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"  # and the runtime runs at it
    single = job_for(
        {"model": "a/b", "cores": 1}, cores=1, parallelism=Parallelism.NONE, settings=settings
    )
    single_pod = single["spec"]["template"]["spec"]
    assert "schedulerName" not in single_pod  # one core: the default scheduler places it
    assert single_pod["nodeSelector"]["example.com/lnc"] == "2"  # sized for trn2's default LNC
    own = job_for(
        {
            "model": "a/b",
            "cores": 4,
            "parallelism": "tensor",
            "scheduling": {"schedulerName": "mine"},
        },
        settings=settings,
    )
    assert own["spec"]["template"]["spec"]["schedulerName"] == "mine"  # a test's choice wins
    # The checkpoint download is part of /work's size and of the storage request.
    big = job_for({"model": "a/b", "cores": 4, "parallelism": "tensor"}, checkpoint_bytes=100 * GiB)
    big_pod = big["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in big_pod["volumes"]}
    assert volumes["work"]["emptyDir"]["sizeLimit"] == "104Gi"
    assert big_pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "134Gi"


def _ended(name: str, code: int) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code}}}


_NOT_STARTED = {"name": "runner", "state": {"waiting": {"reason": "PodInitializing"}}}
POLICY_CASES: list[tuple[dict[str, Any], str | None]] = [
    ({"containerStatuses": [_ended("runner", 1)]}, "FailJob"),  # run.py's own failure
    ({"containerStatuses": [_ended("runner", 137)]}, "FailJob"),  # OOM-killed runner
    ({"containerStatuses": [_ended("runner", 124)]}, "FailJob"),  # the runner's timeout
    ({"containerStatuses": [_ended("runner", 143)]}, "Ignore"),  # the runner asked to stop
    (  # evicted, preempted by the scheduler, a node drained
        {
            "conditions": [{"type": "DisruptionTarget", "status": "True"}],
            "containerStatuses": [_ended("runner", 137)],
        },
        "Ignore",
    ),
    (  # an init step asked to stop (the pod_step wrapper's 143)
        {
            "initContainerStatuses": [_ended("extra-packages", 143)],
            "containerStatuses": [_NOT_STARTED],
        },
        "Ignore",
    ),
    (  # an init step that failed or was killed: counted, the pod is started again
        {
            "initContainerStatuses": [_ended("compile-cache-pull", 0), _ended("extra-packages", 1)],
            "containerStatuses": [_NOT_STARTED],
        },
        None,
    ),
    ({"initContainerStatuses": [_ended("extra-packages", 137)]}, None),
    ({"reason": "UnexpectedAdmissionError", "containerStatuses": []}, None),  # kubelet admission
    ({"containerStatuses": [{"name": "runner", "state": {"waiting": {}}}]}, None),  # deleted
]


def test_full_job_manifest(tmp_path: Path) -> None:
    job = job_for(full_spec())
    validate(job)
    spec = job["spec"]
    # The test's timeout (5,400 s) is the runner's, from run.py's start; the Job's deadline is a
    # backstop: + the queue/pull budget, the cache pull and push deadlines, the delivery.
    # Pod failures before the runner started (no rule matches them) are retried in the Job.
    assert (spec["backoffLimit"], spec["suspend"]) == (BACKOFF_LIMIT, True)
    assert spec["activeDeadlineSeconds"] == 5400 + 3600 + 2 * 1800 + 300
    runner_argv = spec["template"]["spec"]["containers"][0]["command"]
    assert runner_argv[runner_argv.index("--timeout") + 1] == "5400"
    assert job["metadata"]["annotations"]["modelsupport.dev/timeout-seconds"] == "5400"
    # What the Job controller makes of each way a pod can fail (its upstream rules, played
    # by job_controller): only the runner's own exit decides; a pod removed from outside, at
    # any stage, is ignored; a failure before the runner started is counted and retried.
    for pod_status, action in POLICY_CASES:
        failed = {"metadata": {"name": "p"}, "status": {"phase": "Failed", **pod_status}}
        assert match_pod_failure_policy(spec["podFailurePolicy"], failed).action == action, (
            pod_status
        )
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["template"]["metadata"]["annotations"] == {
        "karpenter.sh/do-not-disrupt": "true",
        "modelsupport.dev/test-name": REF.name,  # the full name: labels stop at 63 characters
    }
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "trainium"
    pod = spec["template"]["spec"]
    assert pod["schedulerName"] == "my-scheduler" and pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"pool": "trn2"}
    # 4 cores at LNC 2 are one Trainium2 device: any trn2 type, a trn2.3xlarge included.
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"][:2] == ["trn2.3xlarge", "trn2.48xlarge"]
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and pod["automountServiceAccountToken"] is False
    )
    runner = pod["containers"][0]
    assert runner["resources"]["requests"]["aws.amazon.com/neuroncore"] == "4"
    # 40 GiB for the reference + /dev/shm of 1 GiB per worker (memory-backed, so counted).
    assert runner["resources"]["limits"] == {"memory": "44Gi", "aws.amazon.com/neuroncore": "4"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert all("sizeLimit" in v["emptyDir"] for v in volumes.values() if "emptyDir" in v)
    assert runner["resources"]["requests"]["ephemeral-storage"] == "34Gi"  # 4 + 10 + 20, no ckpt
    assert runner["securityContext"]["readOnlyRootFilesystem"] is True
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
    # The runtime runs at the LNC sizing counted (trn2's default; TorchNeuron reads only this).
    assert env["NEURON_LOGICAL_NC_CONFIG"]["value"] == "2"
    # No shell: the runner reads the init step's pull report and pushes the cache to its
    # target (one argument each) after run.py, whatever its outcome.
    assert runner["command"] == [
        "python3", "-m", "model_support.runner_pod", "--run-id", run_id_for(REF.uid, REF.generation, 1),
        "--program", PROGRAM_DIR, "--timeout", "5400", "--neuron-devices", "/dev/neuron*",
        "--result-file", "result.json", "--termination-log", "/dev/termination-log",
        "--pull-report", "/work/.model-support/compile-cache-pull.json",
        "--pull-source", "hf://buckets/aws-neuron/neff-cache/x",
        "--compile-cache", "hf://buckets/me/neff/x",
        "--cache-backend", "neuron", "--cache-deadline", "1800",
    ]  # fmt: skip
    assert "/bin/sh" not in str(job)
    # The pull is the first init step, through the runner image's own CLI (argv, no shell),
    # run like every init step by the wrapper that stops it on the pod's SIGTERM.
    assert [c["name"] for c in pod["initContainers"]] == ["compile-cache-pull", "extra-packages"]
    pull, packages = pod["initContainers"]
    assert packages["command"][:4] == ["python3", "-m", "model_support.pod_step", "--"]
    assert pull["command"] == [
        "python3", "-m", "model_support.pod_step", "--", "model-support", "cache", "pull", "hf://buckets/aws-neuron/neff-cache/x",
        "--backend", "neuron", "--keep-going",
        "--report", "/work/.model-support/compile-cache-pull.json", "--deadline", "1800",
        "--shared-user",
    ]  # fmt: skip
    assert pull["image"] == runner["image"]
    # It sees the same cache folder and credentials as run.py, and the report's volume.
    assert {e["name"]: e for e in pull["env"]}["TORCH_NEURONX_NEFF_CACHE_DIR"] == env[
        "TORCH_NEURONX_NEFF_CACHE_DIR"
    ]
    assert {e["name"]: e for e in pull["env"]}["HF_TOKEN"] == env["HF_TOKEN"]
    pull_mounts = {m["mountPath"]: m["name"] for m in pull["volumeMounts"]}
    assert pull_mounts[SETTINGS.neff_cache_dir] == "neff-cache" and pull_mounts["/work"] == "work"
    assert pull["securityContext"] == runner["securityContext"]
    assert packages["command"][-1] == "sentencepiece>=0.2"
    mounts = {m["mountPath"]: m for m in runner["volumeMounts"]}
    assert mounts[PROGRAM_DIR] == {"name": "run-script", "mountPath": PROGRAM_DIR, "readOnly": True}
    assert "run-script" not in {m["name"] for m in pull["volumeMounts"]}  # run.py's alone


def test_minimal_job_and_cpu_profile() -> None:
    job = job_for({"model": "Qwen/Qwen3-0.6B", "cores": 1}, cores=1, parallelism=Parallelism.NONE)
    validate(job)
    runner = job["spec"]["template"]["spec"]["containers"][0]
    assert runner["command"][:3] == ["python3", "-m", "model_support.runner_pod"]
    assert "--compile-cache" not in runner["command"] and "--deliver-to" not in runner["command"]
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
    settings = SETTINGS.model_copy(update={"min_host_memory_gib": 0.375, "shm_per_core_gib": 0.125})
    small = build_job(
        REF,
        spec,
        Placement(1, Parallelism.NONE, int(0.375 * GiB)),
        job_name="j",
        run_script=run_script_for(spec, 1, Parallelism.NONE),
        attempt=1,
        run_id="r",
        settings=settings,
    )
    validate(small)
    resources = small["spec"]["template"]["spec"]["containers"][0]["resources"]
    # 384 MiB of host memory plus 128 MiB of /dev/shm, not rounded up to a whole GiB.
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "512Mi"
    docs = render_chart(
        {**REQUIRED, "results": "s3://b/r", "settings": {"minHostMemoryGiB": 0.375}}
    )
    assert chart_settings(docs).min_host_memory_gib == 0.375


def test_when_to_localize_a_fail_reaches_run_py(schema: jsonschema.Validator) -> None:
    spec = {**full_spec(), "verification": {"localize": "always", "localizeBudgetSeconds": 120}}
    body = {"apiVersion": "modelsupport.dev/v1alpha1", "kind": "ModelSupportTest"}
    schema.validate({**body, "metadata": {"name": "x"}, "spec": spec})
    verification = parse_spec(spec).run_config(4, Parallelism.TENSOR).verification
    assert (verification.localize, verification.localize_budget_s) == ("always", 120.0)
    default = parse_spec(full_spec()).run_config(4, Parallelism.TENSOR).verification
    assert (default.localize, default.localize_budget_s) == ("on_fail", 600.0)


def test_the_program_configmap_and_the_jobs_config_block_make_the_rendered_script() -> None:
    spec = parse_spec(full_spec())
    config = spec.run_config(4, Parallelism.TENSOR)
    assert config.backend == Backend.NEURON and config.max_new_tokens == 16
    cm = build_program_configmap(REF.namespace, program())
    validate(cm)
    job = job_for(full_spec())
    runner = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in runner["env"] if "value" in e}
    run_py = cm["data"]["head"] + env["MODEL_SUPPORT_RUN_CONFIG"] + cm["data"]["tail"]
    # Byte for byte the run.py the operator renders (and records), and the hash the runner checks.
    assert run_py == render_script(config) and read_config(run_py) == config
    assert env["MODEL_SUPPORT_RUN_SHA256"] == hashlib.sha256(run_py.encode()).hexdigest()
    assert runner["command"][runner["command"].index("--program") + 1] == PROGRAM_DIR
    volume = next(
        v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "run-script"
    )
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    # Shared by the namespace's tests: immutable, named by its content, owned by no test.
    assert cm["immutable"] is True and "ownerReferences" not in cm["metadata"]
    assert cm["metadata"]["name"] == program_configmap_name(program())
    other = program(render_script(config).replace("import", "import ", 1))
    assert program_configmap_name(other) != cm["metadata"]["name"]


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


def test_the_pod_that_decided_a_job_is_the_one_that_ran_not_a_replaced_one() -> None:
    """A Job now holds the pods it started again (a refused admission, a failed init step): the
    one read is the one that ran, even when both were made within the same second."""
    refused = _pod(reason="OutOfaws.amazon.com/neuroncore", phase="Failed")
    refused["metadata"]["name"] = "refused"
    ran = _pod({"exitCode": 0}, phase="Succeeded")
    ran["metadata"]["name"] = "ran"
    complete = _job("Complete", "Completed")
    assert read_job(complete, [ran, refused]).pod_name == "ran"
    assert read_job(complete, [refused, ran]).pod_name == "ran"
    failed = _pod({"exitCode": 1}, phase="Failed")
    failed["metadata"]["name"] = "failed"
    assert read_job(_job("Failed", "PodFailurePolicy"), [failed, refused]).pod_name == "failed"


def test_a_job_whose_pods_the_kubelet_kept_refusing_is_tried_again_not_recorded() -> None:
    refused = _pod(reason="UnexpectedAdmissionError", message="Allocate failed", phase="Failed")
    reading = read_job(_job("Failed", "BackoffLimitExceeded"), [refused])
    assert reading.state == JobState.NODE_LOST  # the node's doing: a new attempt, no verdict
    assert "refused the runner pod at admission (UnexpectedAdmissionError" in reading.message


def test_job_readings() -> None:
    assert read_job({"status": {"active": 1}}, []).state == JobState.ACTIVE
    assert (
        read_job(_job("Complete", "Completed"), [_pod({"exitCode": 0})]).state == JobState.SUCCEEDED
    )
    # The Job's deadline is a backstop counted from the Job's start: without run.py having run
    # its timeout it is the cluster's waiting (another attempt), never a verdict on the model.
    never_ran = read_job(_job("Failed", "DeadlineExceeded"), [_pod()])
    assert never_ran.state == JobState.WAITED and "before run.py started" in never_ran.message
    assert read_job(_job("Failed", "DeadlineExceeded"), []).state == JobState.WAITED
    ran_long = _job("Failed", "DeadlineExceeded")
    ran_long["metadata"] = {"annotations": {"modelsupport.dev/timeout-seconds": "60"}}
    started = {
        "exitCode": 143,
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:01:30Z",
    }
    assert read_job(ran_long, [_pod(started)]).state == JobState.TIMEOUT
    started_late = {**started, "startedAt": "2026-01-01T00:01:00Z"}
    assert read_job(ran_long, [_pod(started_late)]).state == JobState.WAITED
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
    assert read_job(_job("Failed", "PodFailurePolicy"), [evicted]).state == JobState.NODE_LOST
    # Exit 137 is not out-of-memory by itself: only the container's OOMKilled reason is.
    killed = _pod({"exitCode": 137, "reason": "Error"})
    assert read_job(_job("Failed", "PodFailurePolicy"), [killed]).state == JobState.FAILED
    from model_support.runner_pod import STOPPED_MESSAGE

    stopped = _pod({"exitCode": 143, "message": STOPPED_MESSAGE})
    assert read_job(_job("Failed", "PodFailurePolicy"), [stopped]).state == JobState.NODE_LOST
    init_failed = _pod({"exitCode": 0})
    init_failed["status"]["initContainerStatuses"] = [
        {"name": "extra-packages", "state": {"terminated": {"exitCode": 1, "message": "no such"}}}
    ]
    reading = read_job(_job("Failed", "PodFailurePolicy"), [init_failed])
    assert reading.state == JobState.INFRASTRUCTURE and "extra-packages" in reading.message
    # The pod that decided a finished Job is the one that was not disrupted.
    replaced = _pod({"exitCode": 143}, conditions=[{"type": "DisruptionTarget", "status": "True"}])
    replaced["metadata"]["name"] = "first"
    final = _pod({"exitCode": 0})
    final["metadata"]["name"] = "second"
    assert read_job(_job("Complete", "Completed"), [final, replaced]).pod_name == "second"
    assert read_job(_job("Complete", "Completed"), [replaced, final]).pod_name == "second"


def test_stuck_pods() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
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

    def stuck(unschedulable_limit_s: float | None) -> str | None:
        return stuck_reason(
            pending, now=now, unschedulable_limit_s=unschedulable_limit_s,
            image_pull_limit_s=300, pulls=PullFailures(),
        )  # fmt: skip

    assert stuck(30) is not None
    assert stuck(120) is None
    # Unschedulable for any time is only waiting unless a limit is configured.
    assert stuck(None) is None


def test_the_image_pull_limit_counts_from_the_first_pull_failure_not_from_scheduling() -> None:
    """An 11-minute healthy pull of a large image, then one ErrImagePull: the pod has failed
    to pull for seconds, not for 11 minutes; past the limit since that failure it is stuck."""
    from datetime import UTC, datetime, timedelta

    pulls = PullFailures()
    scheduled = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    pod = _pod(
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "True",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    )  # fmt: skip
    pod["metadata"]["uid"] = "pod-uid"

    def runner_state(state: dict[str, Any]) -> None:
        pod["status"]["containerStatuses"] = [{"name": "runner", "state": state}]

    def stuck(at: datetime) -> str | None:
        return stuck_reason(
            pod, now=at, unschedulable_limit_s=None, image_pull_limit_s=600, pulls=pulls
        )

    runner_state({"waiting": {"reason": "ContainerCreating"}})  # pulling, healthy
    assert stuck(scheduled + timedelta(minutes=5)) is None
    first_failure = scheduled + timedelta(minutes=11)
    runner_state({"waiting": {"reason": "ErrImagePull", "message": "i/o timeout"}})
    assert stuck(first_failure) is None
    runner_state({"waiting": {"reason": "ImagePullBackOff"}})
    assert stuck(first_failure + timedelta(minutes=9)) is None
    assert "ImagePullBackOff" in (stuck(first_failure + timedelta(minutes=10, seconds=1)) or "")
    # A pull that recovers starts over: a later failure counts from then.
    runner_state({"waiting": {"reason": "ContainerCreating"}})
    assert stuck(first_failure + timedelta(minutes=12)) is None
    runner_state({"waiting": {"reason": "ErrImagePull"}})
    assert stuck(first_failure + timedelta(minutes=13)) is None


# ------------------------------------------------------------------------- the Helm chart


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(
        copy.deepcopy(values), name="ms", namespace="model-support"
    )
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def chart_settings(docs: list[dict[str, Any]]) -> OperatorSettings:
    """The settings the rendered Deployment hands the operator (env MODEL_SUPPORT_SETTINGS)."""
    from model_support.operator.settings import SETTINGS_ENV, settings_from_json

    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and "viewer" not in d["metadata"]["name"]
    )
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    return settings_from_json(env[SETTINGS_ENV]["value"])


REQUIRED = REQUIRED_CHART_VALUES


def test_the_chart_needs_a_results_store() -> None:
    with pytest.raises(Exception, match="`results` is required"):
        render_chart(REQUIRED)
    from model_support.operator.settings import settings_from_values

    with pytest.raises(ValueError, match="`results` is required"):
        settings_from_values({})


VALUES = [
    {  # every namespace, chosen explicitly; the key given as a value
        "results": "s3://bucket/model-support",
        "watchAllNamespaces": True,
        "networkPolicy": {"namespaces": ["ml"]},
        "deliveryKey": {"value": "k" * 48},
    },
    {
        "results": "s3://bucket/model-support",
        "watchNamespaces": ["ml", "research"],
        "deliveryKey": {"existingSecret": "my-delivery-key", "secretKey": "slots"},
        "readHubTokenSecrets": True,
        "hubTokenSecretNames": ["hf-token"],
        "allowedResultsPrefixes": ["s3://bucket/"],
        "runner": {
            "schedulerName": "my-scheduler",
            "lncNodeLabel": "example.com/lnc",
            "serviceAccountName": "runner",
            "env": [{"name": "AWS_REGION", "value": "us-west-2"}],
            "envFrom": [{"secretRef": {"name": "compile-cache-credentials"}}],
        },
        "settings": {"unschedulableLimitSeconds": 3600, "minHostMemoryGiB": 32, "maxAttempts": 5},
        "metrics": {"enabled": False},
    },
    {
        "results": "/var/lib/model-support/results",
        **REQUIRED,
        "resultsVolume": {"enabled": True, "claimName": "results-rwx"},
        "viewer": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/custom"}],
    },
]


@pytest.mark.parametrize("values", VALUES)
def test_chart_renders_valid_least_privilege_manifests(values: dict[str, Any]) -> None:
    report = helm_python.lint(str(CHART), copy.deepcopy(values), strict=True)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    docs = render_chart(values)
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a Prometheus Operator CRD: no built-in schema
            assert doc["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
            continue
        validate(doc)
    kinds = sorted(d["kind"] for d in docs)
    deployment = next(d for d in docs if d["metadata"]["name"] == "ms-operator")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Read-only root: every cache the operator writes is on the /tmp volume.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HOME"].startswith("/tmp/") and env["HOME"].startswith("/tmp/")
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp"}
    rules = [
        r
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and not d["metadata"]["name"].endswith(("-edit", "-view"))
        for r in d["rules"]
    ]
    verbs: dict[tuple[str, str], set[str]] = {}
    for r in rules:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                verbs.setdefault((g, res), set()).update(r["verbs"])
    assert "*" not in {v for vs in verbs.values() for v in vs}
    assert verbs[("batch", "jobs")] == {"get", "list", "watch", "create", "delete", "patch"}
    # run.py of a superseded generation is deleted; the Job controller's FailedCreate Events
    # on runner Jobs are read (why a runner pod was refused).
    assert verbs[("", "configmaps")] == {"get", "create", "delete"}
    assert verbs[("", "events")] == {"create", "list"}
    assert verbs[("", "pods/log")] == {"get"}
    assert verbs[("modelsupport.dev", "modelsupporttests/finalizers")] == {"update"}
    # Sweeps: read, status written, tests created and re-run, owner references set.
    assert verbs[("modelsupport.dev", "modelsupportsweeps")] == {"get", "list", "watch"}
    assert verbs[("modelsupport.dev", "modelsupportsweeps/status")] == {"get", "patch"}
    assert verbs[("modelsupport.dev", "modelsupportsweeps/finalizers")] == {"update"}
    assert verbs[("modelsupport.dev", "modelsupporttests")] >= {"create", "patch"}
    # Bisects: read, status written, step tests created (owner references set).
    assert verbs[("modelsupport.dev", "modelsupportbisects")] == {"get", "list", "watch"}
    assert verbs[("modelsupport.dev", "modelsupportbisects/status")] == {"get", "patch"}
    assert verbs[("modelsupport.dev", "modelsupportbisects/finalizers")] == {"update"}
    settings = chart_settings(docs)
    from model_support.operator.settings import settings_from_values

    # The chart's template and settings_from_values (used by `model-support render`) agree.
    assert settings == settings_from_values(values)
    # Secrets: create (one per runner attempt: its delivery slot's upload URL), never get;
    # a test's Hub token only when that is on, by a list selected by name and label, limited
    # to the names given.
    secret_rules = {
        (frozenset(r["verbs"]), tuple(r.get("resourceNames") or ()))
        for r in rules
        if "secrets" in r["resources"]
    }
    if values.get("readHubTokenSecrets"):
        assert secret_rules == {(frozenset({"create"}), ()), (frozenset({"list"}), ("hf-token",))}
        assert settings.read_token_secrets
    else:
        assert secret_rules == {(frozenset({"create"}), ())} and not settings.read_token_secrets
    # The delivery slot key comes from a Secret the user names, or the chart's own holding the
    # value given, never from the settings; the pod does not start without it.
    key = values["deliveryKey"]
    key_secrets = [d for d in docs if d["kind"] == "Secret"]
    key_env = next(e for e in container["env"] if e["name"] == "MODEL_SUPPORT_DELIVERY_KEY")
    if key.get("value"):
        [secret] = key_secrets
        assert base64.b64decode(secret["data"]["key"]).decode() == key["value"]
        assert key_env["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": "key",
        }
    else:
        assert key_secrets == []
        assert key_env["valueFrom"]["secretKeyRef"] == {
            "name": key["existingSecret"],
            "key": key.get("secretKey", "key"),
        }
    if values.get("watchNamespaces"):
        watched = [
            d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] != "model-support"
        ]
        assert [r["metadata"]["namespace"] for r in watched] == values["watchNamespaces"]
        assert settings.namespaces == values["watchNamespaces"] and not settings.all_namespaces
        # Cluster-wide: only reading namespaces (kopf) and the aggregated user roles.
        cluster_roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
        assert cluster_roles <= {"ms-operator-namespaces", "ms-operator-edit", "ms-operator-view"}
    if values.get("runner"):
        assert settings.scheduler_name == "my-scheduler" and settings.unschedulable_limit_s == 3600
        assert settings.runner_env_from == [{"secretRef": {"name": "compile-cache-credentials"}}]
        assert settings.metrics_port is None and "Service" not in kinds
    elif values.get("watchAllNamespaces"):
        assert "ClusterRole" in kinds and settings.all_namespaces
    if values.get("resultsVolume"):
        assert settings.results_volume_claim == "results-rwx"
        assert {"name": "ca", "mountPath": "/etc/ssl/custom"} in container["volumeMounts"]
        viewer = next(
            d for d in docs if d["metadata"]["name"] == "ms-viewer" and d["kind"] == "Deployment"
        )
        assert viewer["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
            "viewer", "--results=/var/lib/model-support/results",
        ]  # fmt: skip
        assert "ServiceMonitor" in kinds


def test_namespace_users_get_aggregated_roles() -> None:
    docs = render_chart(VALUES[0])
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    edit, view = roles["ms-operator-edit"], roles["ms-operator-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "create" in edit["rules"][0]["verbs"]
    assert set(view["rules"][0]["verbs"]) == {"get", "list", "watch"}


def test_runner_pods_may_reach_only_dns_and_https() -> None:
    docs = render_chart({"results": "s3://b/r", **REQUIRED, "watchNamespaces": ["ml", "research"]})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["ml", "research"]
    policy = policies[0]["spec"]
    # The selector is what the operator puts on every runner pod.
    from model_support.operator.resource import LABEL_MANAGED_BY, MANAGED_BY

    assert policy["podSelector"]["matchLabels"] == {LABEL_MANAGED_BY: MANAGED_BY}
    assert policy["ingress"] == [] and set(policy["policyTypes"]) == {"Ingress", "Egress"}
    # DNS, the EKS Pod Identity agent (tests/operator/test_chart_cluster.py), HTTPS.
    dns, _, https = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert [p["port"] for p in https["ports"]] == [443]
    assert [peer["ipBlock"] for peer in https["to"]] == [
        {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]},
        {"cidr": "::/0", "except": ["fd00:ec2::254/128"]},  # IPv6: its own metadata address
    ]


def test_a_misspelt_setting_is_refused_by_name() -> None:
    from pydantic import ValidationError

    from model_support.operator.settings import settings_from_values

    with pytest.raises(ValidationError, match="unschedulableLimitSecs"):
        settings_from_values(
            {"results": "s3://b/x", **REQUIRED, "settings": {"unschedulableLimitSecs": 5}}
        )


def test_the_pod_that_decided_is_not_one_the_job_replaced_within_the_same_second() -> None:
    """A runner stopped from outside (exit 143, ignored by the Job) and its replacement made
    in the same second (creation times have a one-second grain): the replacement decided."""
    from model_support.operator.outcome import latest_pod

    stopped = _pod({"exitCode": 143})
    stopped["metadata"]["name"] = "stopped"
    replacement = _pod({"exitCode": 0})
    replacement["metadata"]["name"] = "replacement"
    for pods in ([stopped, replacement], [replacement, stopped]):
        decided = latest_pod(pods)
        assert decided is not None and decided["metadata"]["name"] == "replacement"


def test_without_a_deadline_budget_the_job_waits_and_the_runner_keeps_the_timeout() -> None:
    """deadlineBudgetSeconds null: no Job deadline at all (a Job may wait for capacity as long
    as it takes); the test's own timeout is still the runner's, from run.py's start."""
    waiting = SETTINGS.model_copy(update={"deadline_budget_s": None})
    job = job_for({"model": "a/b", "timeoutSeconds": 900}, cores=1, settings=waiting)
    validate(job)
    assert "activeDeadlineSeconds" not in job["spec"]
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--timeout") + 1] == "900"


@pytest.mark.parametrize(
    "results",
    [
        "/results/../elsewhere",
        "s3://bucket/allowed/../other-team",
        "/results/./x",
        "/results//x",
        "/results/.hidden",
        "results/relative",
    ],
)
def test_a_results_store_cannot_climb_out_of_where_it_points(
    crd: dict[str, Any], schema: jsonschema.Validator, results: str
) -> None:
    from model_support.operator.planning import InvalidTest, check_store_allowed

    spec = {"model": "a/b", "results": results}
    assert _api_verdict(crd, schema, spec), f"the API server would admit {results!r}"
    with pytest.raises(SpecError, match=r"spec\.results"):
        parse_spec(spec)
    # The operator's own check refuses it too, whatever admitted it (segments, not prefixes).
    settings = SETTINGS.model_copy(
        update={"allowed_results_prefixes": ["/results", "s3://bucket/allowed"]}
    )
    if ".hidden" not in results:  # a hidden name is odd, but still under the prefix
        sneaked = parse_spec({"model": "a/b"}).model_copy(update={"results": results})
        with pytest.raises(InvalidTest, match="outside the stores this operator may write to"):
            check_store_allowed(sneaked, settings)
    for fine in ("/results", "/results/team-a/", "s3://bucket/allowed/x"):
        assert not _api_verdict(crd, schema, {"model": "a/b", "results": fine})
        check_store_allowed(parse_spec({"model": "a/b", "results": fine}), settings)
