"""A runner pod reports only its own attempt, and Kubernetes has the last word on how it ended.

A runner pod runs code the project does not control. What it can write is its own attempt's
delivery slot (a folder of the results volume mounted alone, or an upload URL signed for one
S3 key), whose name a run id does not reveal; what it writes is a claim about that attempt,
checked against the Job's own end and the test's spec.
"""

from __future__ import annotations

import base64
import os
import pickle
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from chart_values import REQUIRED_CHART_VALUES
from k8s_harness import Harness, now
from test_operator_lifecycle import SPEC, document_for, start

from model_support.dataset import matrix_key
from model_support.delivery import DeliveryArea
from model_support.operator.manifests import Placement, RunScript, TestRef, build_job
from model_support.operator.planning import InvalidTest, check_compile_cache, check_model_path
from model_support.operator.settings import (
    OperatorSettings,
    RunnerStack,
    settings_from_json,
    settings_from_values,
)
from model_support.operator.spec import parse_spec
from model_support.records import CompileCacheFigures, Stack
from model_support.store import ResultsStore
from model_support.vocabulary import ErrorClass, Parallelism, Result

NO_SCRIPT = RunScript("cm", "", "0" * 64)  # run.py plays no part here


@pytest.fixture
def h(harness: Harness) -> Harness:
    """The harness with the results store on a shared volume (runners deliver into slots)."""
    harness.settings.results_volume_claim = "model-support-results"
    harness.settings.retry_cap_s = 1.0
    return harness


def records(h: Harness) -> list[Any]:
    return list(ResultsStore(h.settings.results_uri).records())


def runner(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


async def completed(h: Harness) -> dict[str, Any]:
    return await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")


def forge_everywhere_a_run_id_leads(results: Path, run_id: str, payload: bytes) -> list[Path]:
    """What a pod holding the store (or a guess) could write for another test's run id:
    every name derivable from the run id alone."""
    deliveries = results / "deliveries"
    paths = [deliveries / f"{run_id}.json", deliveries / run_id / "result.json"]
    paths += [deliveries / f"{run_id}.{'0' * 32}" / "result.json"]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
    return paths


async def test_a_delivery_forged_for_a_known_run_id_is_never_read(h: Harness) -> None:
    _, job = await start(h)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    # The run id is public (status, records); a forger writes a PASS wherever it leads.
    forged = document_for(Result.PASS).model_dump_json().encode()
    forge_everywhere_a_run_id_leads(h.results, status["runId"], forged)
    pod = await h.start_pod(job)
    await h.end_pod(job, pod, exit_code=1, log="Traceback: boom\n")
    done = await completed(h)
    assert (done["result"], done["errorClass"]) == ("ERROR", "infrastructure")
    [record] = records(h)
    assert record.labels["document_source"] == "operator"


async def test_the_runner_pod_holds_its_own_slot_and_nothing_else_of_the_store(
    h: Harness,
) -> None:
    _, job = await start(h)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod_spec = job["spec"]["template"]["spec"]
    mounts = [
        (c["name"], m)
        for c in pod_spec["containers"] + pod_spec.get("initContainers", [])
        for m in c.get("volumeMounts") or []
        if m["name"] == "results"
    ]
    # One mount of the results volume, by the runner, of one folder: the slot, whose name is
    # the run id plus a token only the operator's key gives.
    [(container, mount)] = mounts
    assert container == runner(job)["name"]
    assert re.fullmatch(rf"deliveries/{status['runId']}\.[0-9a-f]{{32}}", mount["subPath"])
    assert mount["subPath"] not in str(status) + str(job["metadata"])
    # The operator prepared that folder (a kubelet would create it root-owned).
    assert (h.results / mount["subPath"]).is_dir()


async def test_each_attempt_gets_its_own_slot(h: Harness) -> None:
    from model_support.delivery import slot_for

    key = b"k" * 32
    slots = {slot_for(f"op-{uuid.uuid4().hex[:24]}", key) for _ in range(50)}
    assert len(slots) == 50
    assert slot_for("op-1", key) != slot_for("op-1", b"x" * 32)  # another key, another slot
    assert slot_for("op-1", key) == slot_for("op-1", key)  # the same on every replay


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("oom", ("ERROR", "out-of-memory")),
        ("deadline", ("TIMEOUT", None)),
        ("never-started", ("ERROR", "infrastructure")),
    ],
)
async def test_the_jobs_own_end_stands_over_what_the_pod_delivered(
    h: Harness, how: str, expected: tuple[str, str | None]
) -> None:
    extra = {"extraPackages": ["nosuchpkg==1.0"]} if how == "never-started" else {}
    _, job = await start(h, spec={**SPEC, **extra})
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    # Code in the pod writes a PASS into the pod's own slot, then the run ends otherwise.
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    if how == "oom":
        await h.end_pod(job, pod, exit_code=137, log=None, container_reason="OOMKilled")
    elif how == "deadline":
        # The Job's backstop deadline after run.py ran its whole timeout (the runner failed to
        # stop it): TIMEOUT, whatever the pod delivered.
        await h.end_pod(
            job, pod, exit_code=143, log=None, job_condition=("Failed", "DeadlineExceeded"),
            started_at="2020-01-01T00:00:00Z",
        )  # fmt: skip
    else:  # an init step (the extra packages' install) kept failing: run.py never started
        while not await h.job_ended(job):
            await h.fail_init_step(job, pod, "extra-packages", exit_code=1)
            if not await h.job_ended(job):
                pod = await h.start_pod(job)  # the Job controller's replacement
    done = await completed(h)
    assert (done["result"], done.get("errorClass")) == expected
    [record] = records(h)
    assert record.document.result.value == expected[0]
    assert "the runner's delivery said PASS" in (record.document.error or "")


async def test_a_delivery_cannot_turn_a_backstop_spent_waiting_into_a_result(
    h: Harness,
) -> None:
    """The backstop passed when run.py had only just started (the time went to waiting): no
    verdict, and what the pod delivered is no verdict either: the next attempt runs."""
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.end_pod(
        job, pod, exit_code=143, log=None, job_condition=("Failed", "DeadlineExceeded"),
        started_at=now(),
    )  # fmt: skip
    status = await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    assert status["phase"] == "Pending" and "result" not in status
    assert records(h) == []


async def test_a_delivery_cannot_date_itself_into_the_future(h: Harness) -> None:
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    future = datetime(9999, 1, 1, tzinfo=UTC)
    await h.deliver(
        job,
        document_for(Result.PASS, finished_at=future, started_at=future).model_dump_json().encode(),
    )
    await h.end_pod(job, pod, exit_code=0, log=None)
    done = await completed(h)
    assert done["result"] == "PASS"
    [record] = records(h)
    finished = record.document.finished_at
    assert finished is not None and finished <= datetime.now(UTC)
    assert record.document.started_at is not None and record.document.started_at <= finished
    # What ran is the operator's word: the runner image, and that the test ran only our code.
    assert record.labels["image"] == h.settings.runner_image
    assert "untrusted_code" not in record.labels


async def test_a_record_says_what_in_the_test_ran_code_the_project_does_not_control(
    h: Harness,
) -> None:
    spec = dict(SPEC, trustRemoteCode=True, compileBackend="mypkg.backends:fast")
    _, job = await start(h, spec=spec)
    pod = await h.start_pod(job)
    await h.deliver(
        job,
        document_for(Result.PASS, compile_backend="mypkg.backends:fast").model_dump_json().encode(),
    )
    await h.end_pod(job, pod, exit_code=0, log=None)
    await completed(h)
    [record] = records(h)
    assert record.labels["untrusted_code"] == "trustRemoteCode,compileBackend"


IMAGE_STACK = RunnerStack(neuronx_cc="2.28.7631.0", torch="2.14.0", transformers="5.24.0")
"""What the configured runner image carries, as the settings declare it."""


@pytest.mark.parametrize(
    ("image", "reported", "result"),
    [
        # The configured image, the pod reporting what it carries (with neuronx-cc's build hash).
        (None, Stack(neuronx_cc="2.28.7631.0+8bfecb25", transformers="5.24.0"), Result.PASS),
        # The configured image, the pod claiming another compiler and library: a row there
        # would say the model passed on versions nothing ran it on.
        (None, Stack(neuronx_cc="2.99.0.0", torch="2.14.0", transformers="9.9.9"), Result.ERROR),
        # A test's own image: what its pod reported is all there is, labelled as its claim.
        (
            "registry.example/mine:1",
            Stack(neuronx_cc="2.99.0.0", transformers="9.9.9"),
            Result.PASS,
        ),
    ],
)
async def test_the_stack_a_row_belongs_to_is_the_configured_images_never_the_pods(
    h: Harness, image: str | None, reported: Stack, result: Result
) -> None:
    h.settings.runner_stack = IMAGE_STACK
    _, job = await start(h, spec=dict(SPEC, image=image) if image else SPEC)
    pod = await h.start_pod(job)
    document = document_for(Result.PASS, backend="neuron", compile_backend="neuron", stack=reported)
    await h.deliver(job, document.model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await completed(h)
    [record] = records(h)
    assert record.document.result == result
    stack = record.document.stack
    key = matrix_key(record)
    if image is None:
        assert "untrusted_code" not in record.labels
        assert record.labels["stack"] == "declared"
        assert (stack.neuronx_cc, stack.torch, stack.transformers) == (
            "2.28.7631.0",
            "2.14.0",
            "5.24.0",
        )
        assert (key.compiler_version, key.library_version) == ("2.28.7631.0", "5.24.0")
    else:
        assert record.labels["untrusted_code"] == "image"  # the versions are its pod's claim
        assert record.labels["stack"] == "reported"
        assert (key.compiler_version, key.library_version) == ("2.99.0.0", "9.9.9")
    if result == Result.ERROR:
        assert record.document.error_class == ErrorClass.INFRASTRUCTURE
        error = record.document.error or ""
        assert "the runner image reports a different stack" in error
        assert "transformers 9.9.9, the image declares 5.24.0" in error


async def test_a_runner_image_set_without_its_stack_labels_the_rows_stack_as_reported(
    h: Harness,
) -> None:
    """A runnerImage other than the default with no runnerStack: the operator cannot know the
    image's versions, so the row keeps its pod's report and says so (label ``stack``)."""
    assert h.settings.runner_stack is None and h.settings.declared_runner_stack() == RunnerStack()
    _, job = await start(h)
    pod = await h.start_pod(job)
    reported = Stack(neuronx_cc="2.99.0.0", transformers="9.9.9")
    document = document_for(Result.PASS, backend="neuron", compile_backend="neuron", stack=reported)
    await h.deliver(job, document.model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await completed(h)
    [record] = records(h)
    assert record.document.result == Result.PASS
    assert record.labels["stack"] == "reported" and "untrusted_code" not in record.labels
    key = matrix_key(record)
    assert (key.compiler_version, key.library_version) == ("2.99.0.0", "9.9.9")


def test_the_default_runner_image_declares_what_its_dockerfile_pins() -> None:
    dockerfile = (Path(__file__).parents[2] / "images/runner/Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=.*torchneuron-base:sdk([\d.]+)$", dockerfile, re.M)
    transformers = re.search(r"^ARG TRANSFORMERS_VERSION=(\S+)$", dockerfile, re.M)
    assert base is not None and transformers is not None
    declared = OperatorSettings(results_uri="s3://b/r").declared_runner_stack()
    # The base recipe pins SDK 2.33.0's compiler and torch exactly (docs/neuron-releases.md).
    assert (declared.torch, declared.transformers) == ("2.14.0", transformers[1])
    assert base[1] == "2.33.0" and declared.neuronx_cc == "2.28.7631.0"  # SDK 2.33.0's compiler
    # Another image's versions are not known unless the chart declares them.
    values = {
        "results": "s3://b/r",
        **REQUIRED_CHART_VALUES,
        "runnerImage": "registry.example/runner:2",
    }
    assert settings_from_values(values).declared_runner_stack() == RunnerStack()
    values["runnerStack"] = {"neuronxCc": "2.29.1.0", "transformers": "5.30.0"}
    assert settings_from_values(values).declared_runner_stack() == RunnerStack(
        neuronx_cc="2.29.1.0", transformers="5.30.0"
    )
    # ... and the chart hands the operator the same settings.
    import helm_python
    import yaml

    chart = Path(__file__).parents[2] / "charts/model-support"
    rendered = helm_python.Chart.load(str(chart)).render(values, name="ms", namespace="ms")
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    [deployment] = [
        d for d in docs if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    ]
    [env] = [
        e
        for c in deployment["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if e["name"] == "MODEL_SUPPORT_SETTINGS"
    ]
    assert settings_from_json(env["value"]).declared_runner_stack() == RunnerStack(
        neuronx_cc="2.29.1.0", transformers="5.30.0"
    )


@pytest.mark.parametrize("cache", [None, "s3://team-cache/default"])
async def test_the_compile_cache_named_is_the_tests_never_the_pods(
    h: Harness, cache: str | None
) -> None:
    h.settings.compile_cache_push_targets = ["s3://team-cache/{namespace}"]
    h.settings.compile_cache_namespaces_isolated = True  # an IAM role per namespace's prefix
    spec = dict(SPEC, compileCache={"source": cache, "target": cache}) if cache else SPEC
    _, job = await start(h, spec=spec)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    claim = CompileCacheFigures(target="s3://attacker/poison", prefix="neuronxcc-2.28\n")
    await h.deliver(job, document_for(Result.PASS, compile_cache=claim).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await completed(h)
    [record] = records(h)
    figures = record.document.compile_cache
    if cache is None:
        assert figures is None  # the test named no cache: the pod's figures are not kept
    else:
        assert figures is not None and (figures.target, figures.prefix) == (cache, "")


async def test_an_s3_store_hands_the_pod_one_signed_key_and_no_credentials(
    harness: Harness, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)  # the operator's own credentials
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"results-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    h.settings.results_uri = f"s3://{bucket}/model-support"
    _, job = await start(h)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    container = runner(job)
    names = {e["name"] for e in container["env"]} | {
        e["name"]
        for c in job["spec"]["template"]["spec"].get("initContainers", [])
        for e in c["env"]
    }
    assert not {n for n in names if n.startswith("AWS_")}
    [url_env] = [e for e in container["env"] if e["name"] == "MODEL_SUPPORT_DELIVERY_URL"]
    secret_ref = url_env["valueFrom"]["secretKeyRef"]
    secret = await h.get(f"/api/v1/namespaces/default/secrets/{secret_ref['name']}")
    assert secret is not None
    url = base64.b64decode(secret["data"]["url"]).decode()
    # The URL writes one key: this attempt's slot, named with a token the run id lacks.
    key_path = url.split("?", 1)[0]
    assert re.search(rf"/deliveries/{status['runId']}\.[0-9a-f]{{32}}/result\.json$", key_path)
    assert "X-Amz-Signature" in url and "X-Amz-Expires" in url

    pod = await h.start_pod(job)
    where = await h.deliver(job, document_for(Result.PASS, tokens=[[9]]).model_dump_json().encode())
    assert "X-Amz" not in where  # the signature is a credential: never printed
    await h.end_pod(job, pod, exit_code=0, log=None)
    done = await completed(h)
    assert done["result"] == "PASS"
    [record] = ResultsStore(h.settings.results_uri).records()
    assert record.document.tokens == [[9]] and record.labels["document_source"] == "delivery"
    assert DeliveryArea(h.settings.results_uri).slots() == []


# ---- a shared compile cache is not a way in ------------------------------------------------

CACHE_SETTINGS = OperatorSettings(
    results_uri="/tmp/r",
    runner_image="registry.example/runner:1",
    compile_cache_volume_claim="caches",
    compile_cache_volume_path="/caches",
)


def cache_job(spec: dict[str, Any], settings: OperatorSettings, namespace: str) -> dict[str, Any]:
    """The Job the operator would create for ``spec`` in ``namespace`` (after its checks)."""
    parsed = parse_spec({"model": "a/b", "profile": "cpu", "cores": 1, **spec})
    ref = TestRef(namespace, "t", "6b1c2f4e-0000-4000-8000-000000000009", 1)
    check_compile_cache(parsed, settings, namespace)
    return build_job(
        ref,
        parsed,
        Placement(1, Parallelism.NONE, 2**30, 0),
        job_name="t-job",
        run_script=NO_SCRIPT,
        attempt=1,
        run_id="op-1",
        settings=settings,
    )


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"trustRemoteCode": True}, "trustRemoteCode"),
        ({"extraPackages": ["mypkg==1.0"]}, "extraPackages"),
        ({"compileBackend": "mypkg.backends:fast"}, "compileBackend"),
        ({"image": "registry.example/theirs:1"}, "image"),
    ],
)
def test_a_test_running_code_the_project_does_not_control_never_pushes(
    extra: dict[str, Any], why: str
) -> None:
    spec = {"compileCache": {"source": "/caches/ml", "target": "/caches/ml"}, **extra}
    with pytest.raises(InvalidTest, match=rf"does not control \({why}\).*remove the target"):
        cache_job(spec, CACHE_SETTINGS, "ml")
    isolated = CACHE_SETTINGS.model_copy(update={"compile_cache_namespaces_isolated": True})
    cache_job({"compileCache": {"source": "/caches/ml"}, **extra}, isolated, "ml")  # pulls


def test_a_namespace_pushes_to_its_own_cache_unless_allowed_a_shared_one() -> None:
    own = cache_job({"compileCache": {"target": "/caches/ml/neff"}}, CACHE_SETTINGS, "ml")
    assert own["spec"]["template"]["spec"]["containers"][0]["command"][-5] == "/caches/ml/neff"
    for elsewhere in ("/caches/research/neff", "/caches", "/caches/mlx", "s3://org-cache/shared"):
        with pytest.raises(InvalidTest, match="not a compile cache this namespace may push to"):
            cache_job({"compileCache": {"target": elsewhere}}, CACHE_SETTINGS, "ml")
    shared = CACHE_SETTINGS.model_copy(
        update={
            "compile_cache_push_targets": ["s3://org-cache/shared", "s3://org-cache/{namespace}"],
            "compile_cache_shared_pushers": ["nightly"],
            "compile_cache_signing_secret": "cache-signing-key",
        }
    )
    with pytest.raises(InvalidTest, match="may push to"):
        cache_job({"compileCache": {"target": "s3://org-cache/shared"}}, shared, "ml")
    job = cache_job({"compileCache": {"target": "s3://org-cache/ml"}}, shared, "ml")
    assert "cache-signing-key" not in str(job)  # its own target: nothing to sign for others
    job = cache_job({"compileCache": {"target": "s3://org-cache/shared"}}, shared, "nightly")
    pod = job["spec"]["template"]["spec"]
    runner_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert runner_env["MODEL_SUPPORT_CACHE_SIGNING_KEY"].startswith("/var/run/")
    [volume] = [v for v in pod["volumes"] if v["name"] == "cache-signing-key"]
    assert volume["secret"]["secretName"] == "cache-signing-key"


def test_a_namespaces_own_cache_is_trusted_unsigned_only_where_its_storage_isolates_it() -> None:
    def pull_args(source: str, settings: OperatorSettings, namespace: str = "ml") -> list[str]:
        job = cache_job({"compileCache": {"source": source}}, settings, namespace)
        [init] = job["spec"]["template"]["spec"]["initContainers"]
        return list(init["command"])

    key = "ed25519:" + base64.b64encode(b"k" * 32).decode()
    keyed = CACHE_SETTINGS.model_copy(update={"compile_cache_trusted_keys": [key]})
    isolated = CACHE_SETTINGS.model_copy(update={"compile_cache_namespaces_isolated": True})
    # One volume every namespace's pods may reach: its own folder is no more its own than
    # any other target, so only signed entries are taken, and without keys it cannot pull.
    with pytest.raises(InvalidTest, match="does not keep other namespaces out"):
        pull_args("/caches/ml", CACHE_SETTINGS)
    args = pull_args("/caches/ml", keyed)
    assert args[args.index("--trusted-key") + 1] == key and "--trust-unsigned" not in args
    # Storage that gives each namespace its own folder: its entries are its own, signed or not.
    assert "--trust-unsigned" in pull_args("/caches/ml", isolated)
    both = isolated.model_copy(update={"compile_cache_trusted_keys": [key]})
    assert "--trusted-key" not in pull_args("/caches/ml/neff", both)
    # Another namespace's folder is not this pod's to mount; other stores need the keys.
    with pytest.raises(InvalidTest, match="neither this namespace's compile cache folder"):
        pull_args("/caches/research", keyed)
    assert "--trust-unsigned" not in pull_args("s3://someone/else", isolated)
    args = pull_args("s3://someone/else", keyed)
    assert args[args.index("--trusted-key") + 1] == key


def _cache_mounts(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in container["volumeMounts"] if m["name"] == "compile-caches"]


def test_a_pod_mounts_only_its_namespaces_cache_folder_and_writes_it_only_to_push() -> None:
    """Runner pods of every namespace share uid 1000 and fsGroup 1000: a pod given the whole
    compile cache volume could write every namespace's folder. Each container gets only what it
    uses: the pull step the source's folder read-only, the runner the target's folder, and the
    package install (which runs package code) nothing."""
    isolated = CACHE_SETTINGS.model_copy(update={"compile_cache_namespaces_isolated": True})
    pulls_only = cache_job(
        {"compileCache": {"source": "/caches/ml/neff"}, "extraPackages": ["mypkg==1.0"]},
        isolated,
        "ml",
    )
    pod = pulls_only["spec"]["template"]["spec"]
    pull, install = pod["initContainers"]
    assert install["name"] == "extra-packages" and _cache_mounts(install) == []
    assert _cache_mounts(pull) == [
        {"name": "compile-caches", "mountPath": "/caches/ml", "subPath": "ml", "readOnly": True}
    ]
    assert _cache_mounts(pod["containers"][0]) == []  # run.py: nothing of the volume

    pushes = cache_job(
        {"compileCache": {"source": "/caches/ml", "target": "/caches/ml/neff"}}, isolated, "ml"
    )
    pod = pushes["spec"]["template"]["spec"]
    [pull] = pod["initContainers"]
    assert [m.get("readOnly", False) for m in _cache_mounts(pull)] == [True]
    assert _cache_mounts(pod["containers"][0]) == [
        {"name": "compile-caches", "mountPath": "/caches/ml", "subPath": "ml"}
    ]


class _Plant:
    """What a crafted pickle does when a victim loads it: create a file of its choosing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return (os.makedirs, (self.path, 0o755))


POISON = "fxgraph/aa/faaaaaaaaaaaaaaaaaaaaa/poisoned"


def _writable_by(job: dict[str, Any], volume: Path) -> set[Path]:
    """The folders of the compile cache volume any container of ``job``'s pod can write."""
    pod = job["spec"]["template"]["spec"]
    return {
        volume / mount.get("subPath", "")
        for container in [*pod.get("initContainers", []), *pod["containers"]]
        for mount in container["volumeMounts"]
        if mount["name"] == "compile-caches" and not mount.get("readOnly")
    }


@pytest.mark.parametrize("isolated", [False, True], ids=["shared storage", "isolation claimed"])
def test_a_pickle_planted_in_another_namespaces_cache_never_reaches_a_signed_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: bool
) -> None:
    """The chain end to end: a tenant plants a pickle in the cache folder of a namespace that
    pushes signed entries to a shared cache; that namespace's test pulls its own cache (the
    operator's pull step, the real CLI), compiles, and pushes signed (the runner's push); a
    reader holding the trusted key pulls the shared cache. Every link refuses: the tenant's
    pod cannot write there, the pull takes only signed entries (unless the admin says the
    storage isolates namespaces), and the signing push vouches for nothing it pulled unsigned."""
    from typer.testing import CliRunner

    from model_support.cli import app
    from model_support.compile_cache import SigningKey, TransferReport, installed_compiler_cache
    from model_support.compile_cache import pull as cache_pull
    from model_support.compile_cache import push as cache_push
    from model_support.compile_cache.trust import SIGNING_KEY_ENV, TrustPolicy
    from model_support.operator.manifests import PULL_REPORT
    from model_support.runner_pod import push_cache

    volume = tmp_path / "caches"  # the compile cache claim, as every namespace's pods see it
    key = SigningKey.generate()
    settings = OperatorSettings(
        results_uri=str(tmp_path / "results"),
        runner_image="registry.example/runner:1",
        compile_cache_volume_claim="caches",
        compile_cache_volume_path=str(volume),
        compile_cache_push_targets=[f"{volume}/{{namespace}}", f"{volume}/shared"],
        compile_cache_shared_pushers=["nightly"],
        compile_cache_signing_secret="cache-signing-key",
        compile_cache_trusted_keys=[key.public_key()],
        compile_cache_namespaces_isolated=isolated,
    )
    nightly, shared = volume / "nightly", volume / "shared"

    # 1. The tenant's test (it pulls, and installs packages: it runs its own code) gets no
    # writable folder of the volume; with its own pod on shared storage it plants anyway.
    tenant = cache_job(
        {"compileCache": {"source": f"{volume}/team-a"}, "extraPackages": ["evil==1.0"]},
        settings.model_copy(update={"compile_cache_namespaces_isolated": True}),
        "team-a",
    )
    assert _writable_by(tenant, volume) == set()
    attacker = tmp_path / "attacker"
    crafted = attacker / POISON
    crafted.parent.mkdir(parents=True)
    crafted.write_bytes(pickle.dumps(_Plant(str(tmp_path / "pwned"))))
    planted = cache_push(
        str(nightly),
        compiler=installed_compiler_cache("cpu", {"TORCHINDUCTOR_CACHE_DIR": str(attacker)}),
    )
    assert planted.entries == 1

    # 2. The pusher namespace's test: its pull step, as the operator wrote it, run for real.
    job = cache_job(
        {"compileCache": {"source": str(nightly), "target": str(shared)}}, settings, "nightly"
    )
    assert _writable_by(job, volume) == {shared}
    [pull_step] = job["spec"]["template"]["spec"]["initContainers"]
    report_file = tmp_path / "pull-report.json"
    # The step's own argv: what follows the CLI's name (it runs through model_support.pod_step).
    command = pull_step["command"]
    cli_args = command[command.index("model-support") + 1 :]
    argv = [str(report_file) if a == PULL_REPORT else a for a in cli_args]
    local = tmp_path / "pod-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(local))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    pulled = TransferReport.load(report_file)
    if not isolated:
        assert pulled.entries == 0 and not (local / POISON).exists()
    # run.py compiles (here: one graph of its own) ...
    (local / "fxgraph/kn/fkn2btr2vnbnjr5wfq").mkdir(parents=True)
    (local / "fxgraph/kn/fkn2btr2vnbnjr5wfq/compiledhere").write_bytes(b"this run's graph")
    # 3. ... and the runner pushes, signing with the namespace's key.
    key_file = tmp_path / "signing.pem"
    key_file.write_bytes(key.pem)
    monkeypatch.setenv(SIGNING_KEY_ENV, str(key_file))
    pushed = push_cache(str(shared), "cpu", 60.0, pulled)
    assert pushed.error is None

    # 4. A reader holding the trusted key pulls the shared cache: never the pickle.
    reader = tmp_path / "reader"
    taken = cache_pull(
        str(shared),
        compiler=installed_compiler_cache("cpu", {"TORCHINDUCTOR_CACHE_DIR": str(reader)}),
        policy=TrustPolicy((key.public_key(),)),
    )
    assert not (reader / POISON).exists()
    if (reader / POISON).exists():
        pickle.loads((reader / POISON).read_bytes())  # what inductor would do with it
    assert not (tmp_path / "pwned").exists()
    # What the run compiled itself is signed and taken, unless the run loaded an unsigned
    # pickle (isolation claimed: its own cache was pulled unsigned), which taints it all.
    assert taken.entries == (0 if isolated else 1)


# ---- paths stay where they were allowed -----------------------------------------------------


def test_an_absolute_model_is_sized_only_from_a_model_volume(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    volume = tmp_path / "models"
    volume.mkdir()
    (volume / "sneaky").symlink_to("/etc")
    settings = CACHE_SETTINGS.model_copy(update={"model_volume_paths": [str(volume)]})
    for model in ("/etc", "/proc/self", f"{volume}/sneaky", f"{tmp_path}/models-other/x"):
        with pytest.raises(InvalidTest, match="not on a model volume"):
            check_model_path(parse_spec({"model": model}), settings)
    with pytest.raises(InvalidTest, match="none is configured"):
        check_model_path(parse_spec({"model": str(tiny_llama_path)}), CACHE_SETTINGS)
    check_model_path(parse_spec({"model": f"{volume}/tiny"}), settings)
    check_model_path(parse_spec({"model": "Qwen/Qwen3-0.6B"}), CACHE_SETTINGS)  # the Hub's


async def test_an_operator_never_sizes_its_own_files(h: Harness) -> None:
    await h.start_operator()
    await h.create_test("peek", {"model": "/proc/self", "profile": "cpu"})
    status = await h.wait_status("peek", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "not on a model volume" in status["message"]
    assert records(h) == []


def test_a_delivery_larger_than_any_document_is_refused_unread(tmp_path: Path) -> None:
    """A pod that fills its slot (1.5 GB, sparse here) costs the operator no memory: the size
    is checked before anything is read, on every retry. Measured in a process of its own:
    tracemalloc counts every thread's allocations, and other tests leave threads behind."""
    script = """
import sys, tracemalloc
from pathlib import Path
from model_support.delivery import DeliveryArea
area = DeliveryArea(sys.argv[1])
slot = "run-1." + "a" * 32
with (Path(area.prepare(slot)) / "result.json").open("wb") as huge:
    huge.truncate(1536 * 2**20)
tracemalloc.start()
for _ in range(3):
    try:
        area.get(slot)
    except ValueError as exc:
        assert "holds 1610612736 bytes, more than any result" in str(exc), exc
    else:
        raise AssertionError("a 1.5 GB delivery was accepted")
print(tracemalloc.get_traced_memory()[1])
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1])
    assert peak < 2**20, f"{peak} bytes allocated to refuse it"
