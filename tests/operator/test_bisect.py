"""ModelSupportBisect end to end on kmock: the command line writes the resource, the operator
plans it from the rows in the results store and the versions a real package index (served over
HTTP here) lists, runs each step as a ModelSupportTest owned by the bisect, and the kubelet
stand-in's runners report what the version their extra-packages step pins would give (from
1.0.5 on, the compile backend miscompiles: FAIL)."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
import yaml
from api_faults import Family, Fault
from hubserver import HubServer
from k8s_harness import NS, Harness
from kmock_kubelet import Kubelet, runner_document
from package_index import BACKEND, build_index, served
from packaging.version import Version
from tcp_gate import TcpGate
from test_sweeps import model_id, objects, sh, start, sweep_hub
from typer.testing import CliRunner

from model_support.bisect import pins_of, steps_location
from model_support.cli import app
from model_support.config import RunConfig, VerificationConfig
from model_support.operator.bisect_spec import parse_bisect, step_spec
from model_support.operator.resource import (
    ANNOTATION_BISECT_STEP,
    BISECT_KIND,
    BISECT_PLURAL,
    GROUP,
    LABEL_BISECT,
    VERSION,
)
from model_support.operator.spec import SpecError, parse_spec
from model_support.records import RunRecord, record_from_document
from model_support.script import render_script
from model_support.store import ResultsStore
from model_support.vocabulary import LocalizeMode, Parallelism, Result

__all__ = ["sh", "sweep_hub"]  # fixtures used by name

BISECTS_URL = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{BISECT_PLURAL}"
MODEL = model_id(0)
FIRST_BAD = Version("1.0.5")
"""The backend's release that starts miscompiling (package_index.BACKEND)."""
ROOT_CRD = "crds/modelsupportbisects.yaml"


@pytest.fixture(scope="module")
def index_url() -> Iterator[str]:
    """The compile backend's eight versions in a simple index, served over HTTP."""
    with served(build_index([BACKEND])) as url:
        yield url


@pytest.fixture
def isolated_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's pip reads only the index the bisect names."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INPUT", "1")


def packages(backend: str) -> list[str]:
    """What a runner of this stack reports installed, with the backend at ``backend``."""
    return ["torch==2.13.0", "transformers==5.24.0", f"tiny-compile-backend=={backend}"]


def config_of(sweep_hub: HubServer) -> RunConfig:
    """The run.py configuration of the rows: the model at its commit on the cpu profile,
    compiled by the backend, as an operator's test renders it."""
    spec = parse_spec(
        {
            "model": MODEL,
            "revision": sweep_hub.repos[MODEL].sha("main"),
            "profile": "cpu",
            "cores": 1,
            "maxNewTokens": 4,
            "compileBackend": "tiny_compile_backend:compile",
        }
    )
    return spec.run_config(1, Parallelism.NONE)


def row(config: RunConfig, backend: str, labels: dict[str, str]) -> RunRecord:
    """A run of ``config`` with the backend at ``backend``: PASS before 1.0.5, FAIL from it."""
    result = Result.FAIL if Version(backend) >= FIRST_BAD else Result.PASS
    document = runner_document(config, result).model_copy(update={"packages": packages(backend)})
    return record_from_document(document, render_script(config), source="operator", labels=labels)


def step_document(job: dict[str, Any], config: RunConfig) -> Any:
    """The runner of a step's Job: its result follows the backend version its extra-packages
    step installs (the image's, 1.0.0, when it pins none)."""
    steps = job["spec"]["template"]["spec"].get("initContainers") or []
    pinned = pins_of(
        arg for step in steps if step["name"] == "extra-packages" for arg in step["command"]
    )
    backend = pinned.get("tiny-compile-backend", "1.0.0")
    result = Result.FAIL if Version(backend) >= FIRST_BAD else Result.PASS
    return runner_document(config, result).model_copy(update={"packages": packages(backend)})


def bisect_manifest(*args: str) -> dict[str, Any]:
    """`model-support bisect ... --cluster`: the resource the command writes."""
    done = CliRunner().invoke(app, ["bisect", *args, "--cluster"])
    assert done.exit_code == 0, done.output
    manifest: dict[str, Any] = yaml.safe_load(done.stdout)
    return manifest


@dataclass
class StoredRows:
    """The stores a bisect starts from: the good (1.0.0) and bad (1.0.7) rows in the results
    store, and an earlier bisect's run of 1.0.3 (the same run.py) in the steps' store, which
    is reused, never run again."""

    config: RunConfig
    results: ResultsStore
    steps: ResultsStore
    good: RunRecord
    bad: RunRecord
    earlier: RunRecord

    def manifest(self, index_url: str) -> dict[str, Any]:
        """`model-support bisect` of the two rows over the index, named ``backend``."""
        return bisect_manifest(
            MODEL, "--good", self.good.run_id, "--bad", self.bad.run_id,
            "--index-url", index_url, "--timeout", "600", "--name", "backend",
        )  # fmt: skip


def stored_rows(h: Harness, sweep_hub: HubServer) -> StoredRows:
    config = config_of(sweep_hub)
    image = {"image": h.settings.runner_image}
    results = ResultsStore(str(h.results))
    good, bad = row(config, "1.0.0", image), row(config, "1.0.7", image)
    for record in (good, bad):
        results.add(record)
    results.materialize()
    steps = ResultsStore(steps_location(str(h.results)))
    earlier = row(config, "1.0.3", {"bisect": "an earlier one"})
    steps.add(earlier)
    return StoredRows(config, results, steps, good, bad, earlier)


async def bisect_status(h: Harness, name: str, phase: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await h.get(f"{BISECTS_URL}/{name}")
        status = (found or {}).get("status") or {}
        return status if status.get("phase") == phase else None

    found: dict[str, Any] = await h.wait_for(probe, timeout=120, what=f"the bisect {phase}")
    return found


async def test_the_bisect_names_the_first_bad_version_in_three_steps_reusing_a_stored_one(
    sh: Harness, sweep_hub: HubServer, index_url: str, isolated_pip: None
) -> None:
    stored = stored_rows(sh, sweep_hub)
    config, results, steps_store = stored.config, stored.results, stored.steps
    good, bad, earlier = stored.good, stored.bad, stored.earlier
    manifest = stored.manifest(index_url)
    assert manifest["kind"] == BISECT_KIND and "results" not in manifest["spec"]
    crd = yaml.safe_load(open(ROOT_CRD).read())  # noqa: SIM115 (read once)
    jsonschema.Draft4Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).validate(
        manifest
    )
    parse_bisect(manifest["spec"])

    released: list[bool] = []
    await start(sh)
    async with Kubelet(
        sh, sh.results, document_for=step_document, hold=lambda _: not released
    ) as kubelet:
        await sh.create(BISECTS_URL, manifest)
        # The operator restarts while the first step runs: it takes the bisect up from the API
        # and the stores, and makes no step twice.
        await sh.wait_for(lambda: bool(kubelet.running), what="the first step's runner")
        await sh.stop_operator()
        await start(sh)
        released.append(True)
        status = await bisect_status(sh, "backend", "Done")
        # Rows that cannot be bisected: the bisect stalls, saying why.
        await sh.create(
            BISECTS_URL,
            {**manifest, "metadata": {"name": "same"},
             "spec": {**manifest["spec"], "bad": good.run_id}},
        )  # fmt: skip
        same = await bisect_status(sh, "same", "Failed")
        assert kubelet.error is None, kubelet.error
    assert f"spec.good and spec.bad name the same run ({good.run_id})" in same["message"]
    assert {c["type"]: c["status"] for c in same["conditions"]} == {
        "Ready": "False", "Reconciling": "False", "Stalled": "True",
    }  # fmt: skip

    # The plan: one package changed, the eight versions its index lists.
    (suspect,) = status["plan"]["suspects"]
    assert suspect["name"] == "tiny-compile-backend"
    assert suspect["versions"] == list(BACKEND.versions)
    # Alone at its bad version it is the bad row itself; then three bisection steps, of which
    # 1.0.3 is the stored run and only 1.0.5 and 1.0.4 ran, each as a test of the bisect.
    steps = status["steps"]
    assert [(s["version"], s["result"], s["verdict"], s["reused"]) for s in steps] == [
        ("1.0.7", "FAIL", "bad", True),
        ("1.0.3", "PASS", "good", True),
        ("1.0.5", "FAIL", "bad", False),
        ("1.0.4", "PASS", "good", False),
    ]
    assert [s["runId"] for s in steps[:2]] == [bad.run_id, earlier.run_id]
    assert "test" not in steps[0] and "test" not in steps[1]
    tests = {
        t["metadata"]["name"]: t
        for t in objects(sh, "modelsupporttests")
        if (t["metadata"].get("labels") or {}).get(LABEL_BISECT) == "backend"
    }
    assert sorted(tests) == sorted(s["test"] for s in steps[2:])
    assert len(kubelet.played) == 2 and len(objects(sh, "jobs")) == 2
    for step in steps[2:]:
        test = tests[step["test"]]
        [owner] = test["metadata"]["ownerReferences"]
        assert owner["kind"] == BISECT_KIND and owner["name"] == "backend" and owner["controller"]
        assert test["metadata"]["annotations"][ANNOTATION_BISECT_STEP] == (
            f"{status['plan']['runScriptSha256']} tiny-compile-backend=={step['version']}"
        )
        assert test["status"]["runScriptSha256"] == status["plan"]["runScriptSha256"]
        # The step's version pinned alone, from the bisect's index, nothing else moved; the rest
        # is the row's test, recorded in the steps' store.
        spec = test["spec"]
        assert spec["extraPackages"] == [f"tiny-compile-backend=={step['version']}"]
        assert spec["pip"] == {"indexUrl": index_url, "noDeps": True}
        assert (spec["model"], spec["revision"], spec["profile"], spec["cores"]) == (
            MODEL, config.revision, "cpu", 1,
        )  # fmt: skip
        assert spec["compileBackend"] == "tiny_compile_backend:compile"
        assert spec["results"] == steps_location(str(sh.results)) and spec["timeoutSeconds"] == 600
        assert test["status"]["runId"] == step["runId"]
    # The conclusion: the first bad version, its result, the last good one, and the command
    # that reproduces its run from the store that holds it.
    (culprit,) = status["culprits"]
    assert culprit == {
        "package": "tiny-compile-backend", "lastGood": "1.0.4", "firstBad": "1.0.5",
        "result": "FAIL", "runId": steps[2]["runId"],
        "reproduce": f"model-support reproduce {steps[2]['runId']} --results "
        f"{steps_location(str(sh.results))}",
    }  # fmt: skip
    assert status["firstBad"] == "tiny-compile-backend 1.0.5"
    assert (
        "first bad version: tiny-compile-backend 1.0.5 (FAIL; 1.0.4 is good)" in (status["message"])
    )
    # The report is the command line's (model_support.bisect.render_bisect).
    report = status["report"]
    assert report.startswith(f"# Bisect: {MODEL} (text-generation)")
    assert (
        f"| 2 | tiny-compile-backend==1.0.3 | PASS | good | {earlier.run_id} (reused) |" in report
    )
    assert f"- reproduce: {culprit['reproduce']}" in report
    # Each step that ran is a record of the steps' store, never a row of the results' matrix.
    stored = {r.run_id: r for r in steps_store.records()}
    assert set(stored) == {earlier.run_id, steps[2]["runId"], steps[3]["runId"]}
    assert "tiny-compile-backend==1.0.5" in stored[steps[2]["runId"]].document.packages
    assert {r.run_id for r in results.records()} == {good.run_id, bad.run_id}
    events = collections.Counter(
        e["reason"] for e in await sh.events() if e["involvedObject"]["name"] == "backend"
    )
    assert events == {"FirstBadVersion": 1}
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


async def test_a_step_whose_record_is_stored_before_its_test_says_so_was_run_not_reused(
    sh: Harness, sweep_hub: HubServer, index_url: str, isolated_pip: None
) -> None:
    """The operator stores a step's record, then writes its test's status: a bisect that
    reconciles between the two (its status write failing a while, any event of the bisect)
    finds the record in the steps' store and its test not Completed. The step is still one
    this bisect ran (its record names its test), never an earlier run reused."""
    stored = stored_rows(sh, sweep_hub)
    steps_store, manifest = stored.steps, stored.manifest(index_url)

    released: list[bool] = []
    await start(sh)
    async with Kubelet(
        sh, sh.results, document_for=step_document,
        hold=lambda _: len(kubelet.played) >= 2 and not released,
    ) as kubelet:  # fmt: skip
        await sh.create(BISECTS_URL, manifest)
        # The last step (1.0.4) runs; its test's status writes fail from now on.
        await sh.wait_for(
            lambda: len(kubelet.played) >= 2 and bool(kubelet.running), what="the last step"
        )
        failing = sh.k.inject(Fault.SERVER_ERROR, Family.STATUS, resource="modelsupporttests")
        released.append(True)

        def last_step_stored() -> bool:
            if not steps_store.fs.exists(steps_store.history_path()):
                return False
            return len(steps_store.history(columns=["run_id"])) == 3

        await sh.wait_for(last_step_stored, timeout=120, what="the last step's record")
        assert failing.hits > 0, "the step's test status was written: no window to test"
        await sh.patch(f"{BISECTS_URL}/backend", {"metadata": {"annotations": {"poke": "1"}}})
        status = await bisect_status(sh, "backend", "Done")
        sh.k.clear_faults()
        assert kubelet.error is None, kubelet.error
    steps = status["steps"]
    assert [(s["version"], s["reused"]) for s in steps] == [
        ("1.0.7", True), ("1.0.3", True), ("1.0.5", False), ("1.0.4", False),
    ]  # fmt: skip
    assert steps[3]["test"], "the step this bisect ran names its test"
    assert "(reused)" not in next(
        line for line in status["report"].splitlines() if "==1.0.4 " in line
    )


def test_a_step_runs_the_bad_rows_run_py_and_refuses_what_the_bisect_does_not_allow() -> None:
    """The step test's spec renders the bad row's run.py byte for byte (what the step is a
    step of), in the profile the row ran on; the model's own Hub code runs only when the
    bisect allows it."""
    config = RunConfig(
        model="org/model",
        revision="0123456789abcdef0123456789abcdef01234567",
        backend="neuron",
        cores=2,
        parallelism=Parallelism.TENSOR,
        dtype="float32",
        max_new_tokens=8,
        prompts=["Une phrase.", "Another one"],
        compile_backend="neuron",
        verification=VerificationConfig(max_error_ratio=5.0, localize=LocalizeMode.NEVER),
    )
    document = runner_document(config, Result.FAIL)
    document = document.model_copy(
        update={"stack": document.stack.model_copy(update={"instance_type": "trn2.48xlarge"})}
    )
    bad = record_from_document(document, render_script(config))
    bisect = parse_bisect({"model": "org/model", "good": "a", "bad": "b"})
    spec = step_spec(bisect, bad, "registry.example/runner:good", "s3://bucket/r/bisect")
    test = parse_spec({**spec, "extraPackages": ["neuronx-cc==2.28.1"]})
    assert render_script(test.run_config(2, Parallelism.TENSOR)) == bad.run_py
    assert (test.profile, test.image, test.results) == (
        "trn2", "registry.example/runner:good", "s3://bucket/r/bisect",
    )  # fmt: skip
    assert spec["pip"] == {"noDeps": True} and spec["timeoutSeconds"] == 3600

    remote = record_from_document(
        document, render_script(config.model_copy(update={"trust_remote_code": True}))
    )
    with pytest.raises(SpecError, match=r"spec\.template\.trustRemoteCode"):
        step_spec(bisect, remote, None, "/r/bisect")
    allowed = parse_bisect(
        {"model": "org/model", "good": "a", "bad": "b", "template": {"trustRemoteCode": True}}
    )
    assert step_spec(allowed, remote, None, "/r/bisect")["trustRemoteCode"] is True
    with pytest.raises(SpecError, match=r"spec\.template sets extraPackages"):
        parse_bisect({"model": "a/b", "good": "a", "bad": "b", "template": {"extraPackages": []}})


def test_only_the_operators_own_store_publishes_stack_and_release_metrics(tmp_path: Any) -> None:
    """The stacks' and releases' series carry no store: a bisect's steps (runs of environments
    that are no release) or a test's own store would overwrite the operator's own figures."""
    from model_support.operator.kube import Kube, api_client
    from model_support.operator.recording import Recorder
    from model_support.operator.settings import OperatorSettings

    own = str(tmp_path / "results")
    settings = OperatorSettings(results_uri=own, allowed_results_prefixes=[own])
    recorder = Recorder(settings, Kube(api_client("http://127.0.0.1:9")))
    recorder.store_for(None)
    recorder.store_for(parse_spec({"model": "a/b", "results": steps_location(own)}))
    recorder.store_for(parse_spec({"model": "a/b", "results": own}))
    published = {uri: m.publish for uri, m in recorder.materializers.items()}
    assert published == {own: True, steps_location(own): False}


async def test_a_store_outage_while_planning_is_waited_out_never_a_verdict(
    sh: Harness,
    sweep_hub: HubServer,
    index_url: str,
    isolated_pip: None,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The results store (S3) stops answering as the bisect starts: the bisect says so and
    tries again after a backoff, never Failed; once the store answers, it plans from its rows."""
    import s3fs

    host, port = s3_endpoint.removeprefix("http://").split(":")
    with TcpGate(host, int(port)) as gate:
        for key, value in {
            "AWS_ENDPOINT_URL": gate.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",  # each read fails at once while the store is down
        }.items():
            monkeypatch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()
        bucket = f"results-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem().mkdir(bucket)
        sh.settings.results_uri = f"s3://{bucket}/model-support"
        config = config_of(sweep_hub)
        image = {"image": sh.settings.runner_image}
        results = ResultsStore(sh.settings.results_uri)
        good, bad = row(config, "1.0.0", image), row(config, "1.0.7", image)
        for record in (good, bad):
            results.add(record)
        results.materialize()
        manifest = bisect_manifest(
            MODEL, "--good", good.run_id, "--bad", bad.run_id, "--index-url", index_url,
            "--name", "outage",
        )  # fmt: skip

        gate.shut()
        s3fs.S3FileSystem.clear_instance_cache()
        await start(sh)
        await sh.create(BISECTS_URL, manifest)
        waiting = await bisect_status(sh, "outage", "Planning")
        assert "a results store could not be read" in waiting["message"], waiting
        assert "its endpoint did not answer" in waiting["message"]
        # Its own status write (the watch shows it at once) does not retry before the backoff
        # ends: over 4 s, at most the first try and the one 5 s after it.
        said = {waiting["message"].rsplit("trying again in ", 1)[1]}
        for _ in range(8):
            await asyncio.sleep(0.5)
            found = await sh.get(f"{BISECTS_URL}/outage")
            said.add(found["status"]["message"].rsplit("trying again in ", 1)[1])
        assert len(said) <= 2 and said <= {"5 s", "10 s", "20 s"}, said
        assert {c["type"]: c["status"] for c in waiting["conditions"]}["Stalled"] == "False"

        gate.open()
        planned = await bisect_status(sh, "outage", "Bisecting")
    (suspect,) = planned["plan"]["suspects"]
    assert suspect["name"] == "tiny-compile-backend"
    # The outage was said, never concluded: no Failed in between, and no verdict Event.
    reasons = {e["reason"] for e in await sh.events() if e["involvedObject"]["name"] == "outage"}
    assert "BisectFailed" not in reasons
