"""Every test reaches a final state, and its status is what the CRD says it is.

Sizing goes to the stand-in Hub (tests/hubserver.py) through the real client; statuses the
operator writes are validated against the CRD's status schema.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hubserver import HubServer, Repo
from k8s_harness import JOBS_URL, TESTS_URL, Harness
from test_operator_lifecycle import SPEC, records, runner_log, start

from model_support.operator.resource import child_name
from model_support.operator.status import Phase, TestStatus
from model_support.vocabulary import ErrorClass, Result

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "modelsupporttests.yaml").read_text())
STATUS_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def valid_status(status: dict[str, Any]) -> dict[str, Any]:
    """The status as the API server would accept it (schema), and as our model reads it."""
    jsonschema.Draft4Validator(STATUS_SCHEMA).validate(status)
    TestStatus.read(status)
    return status


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


# ------------------------------------------------------------------------- the status model


def test_the_status_model_is_the_crd_status_schema() -> None:
    properties = STATUS_SCHEMA["properties"]
    assert set(TestStatus.model_fields) == set(properties)
    assert properties["phase"]["enum"] == [p.value for p in Phase]
    condition = properties["conditions"]["items"]
    assert set(condition["required"]) <= {
        "type",
        "status",
        "lastTransitionTime",
        "reason",
        "message",
    }
    from model_support.operator.status import CONDITION_REASON_PATTERN

    assert condition["properties"]["reason"]["pattern"] == CONDITION_REASON_PATTERN


# ------------------------------------------------------------------------- long names


async def test_a_253_character_name_runs_to_its_result(harness: Harness) -> None:
    h = harness
    name = ("a" * 62 + ".") * 4  # 252 characters, dots included (a DNS subdomain)
    name = name + "b"
    assert len(name) == 253
    await h.start_operator()
    test = await h.create_test(name, dict(SPEC))
    [job] = await h.wait_job()
    assert len(job["metadata"]["name"]) <= 63
    assert job["metadata"]["labels"]["modelsupport.dev/test"] == "a" * 62  # cut, for people
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.wait_status(name, lambda s: s.get("phase") == "Running", "Running")
    await h.end_pod(job, pod, exit_code=1, log=runner_log(Result.FAIL))
    status = await h.wait_status(name, lambda s: s.get("phase") == "Completed", "Completed")
    assert status["result"] == "FAIL"
    [record] = records(h)
    assert record.labels["test"] == name and record.labels["test_uid"] == test["metadata"]["uid"]

    await h.wait_events("Failed", about=name)  # the Event on the long name


# ------------------------------------------------------------------------- generations, kstatus


async def test_a_new_generation_clears_the_previous_run(harness: Harness) -> None:
    h = harness
    test, job = await start(h)
    uid = test["metadata"]["uid"]
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.end_pod(
        job, pod, exit_code=0, log=runner_log(Result.PASS, timings={"wall_time_s": 9.5})
    )
    done = valid_status(
        await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    )
    assert done["wallTimeSeconds"] == 9.5 and done["finishedAt"] and done["startedAt"]
    ready = conditions(done)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "PASS")  # kubectl wait ... Ready

    await h.patch(f"{TESTS_URL}/qwen", {"metadata": {"generation": 2}, "spec": {"maxNewTokens": 8}})
    await h.wait_job(child_name("qwen", uid, 2, 1))
    fresh = valid_status(
        await h.wait_status("qwen", lambda s: s.get("observedGeneration") == 2, "generation 2")
    )
    for stale in ("result", "wallTimeSeconds", "finishedAt", "startedAt", "errorClass", "message"):
        assert stale not in fresh, f"{stale} of generation 1 survived: {fresh.get(stale)}"
    assert "Completed" not in conditions(fresh) and "Running" not in conditions(fresh)
    assert conditions(fresh)["Ready"]["status"] == "False"
    assert conditions(fresh)["Reconciling"]["status"] == "True"


async def test_every_status_written_on_the_way_is_valid(harness: Harness) -> None:
    h = harness
    seen: list[dict[str, Any]] = []

    async def phase(want: str) -> dict[str, Any]:
        status = await h.wait_status("qwen", lambda s: s.get("phase") == want, want)
        seen.append(status)
        return status

    _, job = await start(h, spec={**SPEC, "queueName": "trainium"})
    await phase("Queued")
    await h.patch(f"{JOBS_URL}/{job['metadata']['name']}", {"spec": {"suspend": False}})
    await phase("Pending")
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await phase("Running")
    await h.end_pod(job, pod, exit_code=1, log=runner_log(Result.FAIL))
    await phase("Completed")
    for status in seen:
        valid_status(status)


async def test_an_invalid_test_is_stalled_for_kstatus(harness: Harness) -> None:
    h = harness
    await h.start_operator()
    await h.create_test("bad", {"model": "org/m", "cores": 4})  # 4 cores without parallelism
    status = valid_status(
        await h.wait_status("bad", lambda s: s.get("phase") == "Invalid", "Invalid")
    )
    assert conditions(status)["Stalled"]["status"] == "True"
    assert conditions(status)["Ready"]["status"] == "False"


# ------------------------------------------------------------------------- sizing failures


@pytest.fixture
def hub(harness: Harness, tiny_llama_path: Path) -> Iterator[HubServer]:
    broken = Repo.from_dir("org/broken", tiny_llama_path)
    broken.files["config.json"] = b"{this is not json"
    repos = [
        Repo.from_dir("org/tiny-llama", tiny_llama_path),
        Repo.from_dir("org/gated-llama", tiny_llama_path, gated="manual", access={"hf_secret"}),
        broken,
    ]
    with HubServer(repos) as server:
        harness.settings.hub_endpoint = server.url
        harness.settings.sizing_retry_base_s = 0.2
        harness.settings.retry_cap_s = 1.0
        yield server


async def test_an_unknown_model_is_invalid_at_once(harness: Harness, hub: HubServer) -> None:
    h = harness
    await h.start_operator()
    await h.create_test("typo", {"model": "org/no-such-model"})
    status = valid_status(
        await h.wait_status("typo", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=60)
    )
    assert "org/no-such-model" in status["message"]
    await h.create_test("rev", {"model": "org/tiny-llama", "revision": "v9"})
    status = await h.wait_status(
        "rev", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=60
    )
    assert "no revision 'v9'" in status["message"]
    assert records(h) == [] and await h.items(JOBS_URL) == []


async def test_a_malformed_config_is_error_load(harness: Harness, hub: HubServer) -> None:
    h = harness
    await h.start_operator()
    await h.create_test("broken", {"model": "org/broken"})
    status = valid_status(
        await h.wait_status(
            "broken", lambda s: s.get("phase") == "Completed", "Completed", timeout=60
        )
    )
    assert (status["result"], status["errorClass"]) == ("ERROR", "load")
    [record] = records(h)
    assert record.document.error_class == ErrorClass.LOAD


async def test_a_hub_outage_is_retried_with_backoff_then_sized(
    harness: Harness, hub: HubServer
) -> None:
    h = harness
    hub.fail_next(4, status=503)
    await h.start_operator()
    await h.create_test("sized", {"model": "org/tiny-llama"})
    retrying = await h.wait_status(
        "sized",
        lambda s: conditions(s).get("Sized", {}).get("reason") == "SizingRetrying",
        "SizingRetrying",
        timeout=60,
    )
    assert retrying["phase"] == "Pending"
    status = await h.wait_status("sized", lambda s: s.get("cores") == 1, "sized", timeout=60)
    assert len(await h.items(JOBS_URL)) == 1
    assert conditions(status)["Sized"]["reason"] == "Sized"
    assert len(await h.wait_events("SizingRetrying")) == 1


async def test_a_hub_that_stays_down_ends_the_test(harness: Harness, hub: HubServer) -> None:
    h = harness
    h.settings.sizing_max_retries = 2
    hub.fail_next(10_000, status=503)
    await h.start_operator()
    await h.create_test("down", {"model": "org/tiny-llama"})
    status = valid_status(
        await h.wait_status(
            "down", lambda s: s.get("phase") == "Completed", "Completed", timeout=60
        )
    )
    assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
    assert "gave up after 3 tries" in status["message"]


# ------------------------------------------------------------------------- what a test may use


async def test_a_store_outside_the_allowed_prefixes_is_refused(harness: Harness) -> None:
    h = harness
    await h.start_operator()
    await h.create_test("elsewhere", {**SPEC, "results": "s3://someone-elses-bucket/x"})
    status = await h.wait_status("elsewhere", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "outside the stores this operator may write to" in status["message"]
    assert await h.items(JOBS_URL) == []


async def test_a_bad_compile_cache_location_is_refused_with_what_would_do(
    harness: Harness,
) -> None:
    """The operator refuses what the API server's schema would (a server without it too), and
    a cache path it cannot mount: the status says what was wrong and what to use; no Job."""
    h = harness
    await h.start_operator()
    await h.create_test("dataset", {**SPEC, "compileCache": {"source": "hf://datasets/org/neff"}})
    await h.create_test("nowhere", {**SPEC, "compileCache": {"target": "/mnt/team/neff"}})
    status = await h.wait_status("dataset", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "spec.compileCache.source" in status["message"]
    assert "is not a Hugging Face storage bucket" in status["message"]
    assert "hf://buckets/<namespace>/<name>" in status["message"]
    status = await h.wait_status("nowhere", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "no compile cache volume (setting compileCacheVolumeClaim)" in status["message"]
    assert await h.items(JOBS_URL) == []


async def test_token_secrets_are_read_only_when_allowed_and_labelled(
    harness: Harness, hub: HubServer
) -> None:
    h = harness
    # Reading Secrets is off by default: a gated model cannot be sized, and the test says so.
    spec = {"model": "org/gated-llama", "hubTokenSecret": {"name": "hf"}}
    await h.start_operator()
    await h.create_test("off", spec)
    status = await h.wait_status(
        "off", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=60
    )
    assert "readHubTokenSecrets" in status["message"]

    # Allowed, but the Secret lacks the documented label: refused.
    await h.stop_operator()
    h.settings.read_token_secrets = True
    await h.create(
        "/api/v1/namespaces/default/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"},
         "data": {"token": base64.b64encode(b"hf_secret").decode()}},
    )  # fmt: skip
    await h.start_operator()
    await h.create_test("unlabelled", spec)
    status = await h.wait_status("unlabelled", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "modelsupport.dev/hub-token=true" in status["message"]
    assert json.dumps(status).find("hf_secret") == -1  # never the token itself

    # Labelled: read, and the gated model is sized with its token.
    await h.patch(
        "/api/v1/namespaces/default/secrets/hf",
        {"metadata": {"labels": {"modelsupport.dev/hub-token": "true"}}},
    )
    await h.create_test("labelled", spec)
    status = await h.wait_status(
        "labelled", lambda s: s.get("cores") == 1, "sized with the token", timeout=60
    )
    assert status["phase"] in ("Pending", "Running")
    assert any(r["token_sent"] for r in hub.requests if "gated-llama" in r["path"])


def test_a_status_field_that_does_not_parse_is_read_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hand-edited (or older) status field never stops the operator on a test: it is read as
    absent, said in the log, and the rest of the status is kept."""
    stored = {
        "phase": "Running",
        "attempt": "many",
        "cores": 4,
        "podCores": 0,
        "addedByAnotherWriter": True,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "Running", "message": "",
             "lastTransitionTime": "2026-12-02T10:00:00Z"},
        ],
    }  # fmt: skip
    with caplog.at_level("WARNING"):
        status = TestStatus.read(stored)
    assert status.phase is Phase.RUNNING and status.cores == 4
    assert status.attempt is None and status.podCores is None
    assert status.reason("Ready") == "Running" and status.reason("Queued") is None
    assert "attempt" in caplog.text and "podCores" in caplog.text
