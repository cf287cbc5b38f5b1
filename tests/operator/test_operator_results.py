"""A result never depends on a pod log surviving, and nothing a pod says names what was tested.

The runner delivers its document to the results store under the run id (here the test writes
it there, exactly as model_support.runner_pod does); the operator reads delivery -> log ->
termination message, retries what it cannot read yet, and records each run once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import JOBS_URL, Harness
from test_operator_lifecycle import SPEC, document_for, records, runner_log, start

from model_support.delivery import DeliveryArea
from model_support.records import ResultDocument
from model_support.vocabulary import ErrorClass, Result


@pytest.fixture
def h(harness: Harness) -> Harness:
    """The harness with the results store on a shared volume, so runners deliver into it."""
    harness.settings.results_volume_claim = "model-support-results"
    harness.settings.retry_cap_s = 1.0
    return harness


async def deliver(h: Harness, job: dict[str, Any], document: ResultDocument) -> None:
    """What the runner does at the end of run.py: the document into its attempt's slot."""
    await h.deliver(job, document.model_dump_json().encode())


async def pending(h: Harness, name: str = "qwen") -> dict[str, Any]:
    return await h.wait_status(name, lambda s: s.get("phase") == "Pending", "Pending")


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def test_the_delivered_document_is_the_result_when_log_and_message_are_gone(
    h: Harness,
) -> None:
    _, job = await start(h)
    status = await pending(h)
    runner = job["spec"]["template"]["spec"]["containers"][0]
    # The runner is told where to deliver: its attempt's slot, the one folder of the shared
    # volume its pod mounts (never the store itself).
    [mount] = [m for m in runner["volumeMounts"] if m["name"] == "results"]
    assert runner["command"][runner["command"].index("--deliver-to") + 1] == mount["mountPath"]
    assert mount["subPath"].startswith(f"deliveries/{status['runId']}.")

    pod = await h.start_pod(job)
    await deliver(h, job, document_for(Result.PASS, tokens=[[5, 6, 7]]))
    # The node went away with the log; no termination message either.
    await h.end_pod(job, pod, exit_code=0, log=None)
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "PASS"
    [record] = records(h)
    assert record.labels["document_source"] == "delivery"
    assert record.document.tokens == [[5, 6, 7]]  # the whole document, not a compact copy
    assert DeliveryArea(str(h.results)).slots() == []  # delivered once, recorded once


async def test_a_job_deleted_while_the_operator_was_away_still_yields_the_result(
    h: Harness,
) -> None:
    _, job = await start(h)
    await pending(h)
    pod = await h.start_pod(job)
    await h.stop_operator()
    # The run ends, and the Job and its pod are removed before any operator sees the end.
    await deliver(h, job, document_for(Result.FAIL))
    await h.end_pod(job, pod, exit_code=0, log=None)
    await h.delete(f"{JOBS_URL}/{job['metadata']['name']}")
    await h.start_operator()
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "FAIL"
    assert [r.document.result for r in records(h)] == [Result.FAIL]


async def test_an_unreadable_result_is_retried_never_recorded_as_the_models(h: Harness) -> None:
    _, job = await start(h)
    await pending(h)
    pod = await h.start_pod(job)
    # The pod is gone (node removed) and nothing has arrived in the store yet.
    await h.delete(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
    await h.finish_job(job, exit_code=0)
    waiting = await h.wait_status(
        "qwen",
        lambda s: conditions(s).get("Recorded", {}).get("reason") == "ResultUnavailable",
        "ResultUnavailable",
    )
    assert waiting["phase"] != "Completed" and records(h) == []
    assert "no result document was delivered" in conditions(waiting)["Recorded"]["message"]
    assert await h.wait_events("ResultUnavailable")

    # The delivery lands late (a store that was slow): the retry records the real result.
    await deliver(h, job, document_for(Result.PASS))
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "PASS" and len(records(h)) == 1
    assert conditions(done)["Recorded"]["status"] == "True"


async def test_unreadable_for_too_long_is_infrastructure_not_a_verdict(h: Harness) -> None:
    h.settings.result_unavailable_limit_s = 0.5
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.delete(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
    await h.finish_job(job, exit_code=0)
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (done["result"], done["errorClass"]) == ("ERROR", "infrastructure")
    assert "no result document could be read" in done["message"]
    [record] = records(h)
    assert record.labels["document_source"] == "operator"


async def test_a_document_that_disagrees_with_the_test_is_an_error_saying_so(h: Harness) -> None:
    _, job = await start(h)
    await pending(h)
    pod = await h.start_pod(job)
    # A pod claims to have tested another model on 8 cores: what it says is not trusted.
    liar = document_for(Result.PASS, model="org/other", cores=8, parallelism="tensor")
    await deliver(h, job, liar)
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (done["result"], done["errorClass"]) == ("ERROR", "infrastructure")
    assert "disagrees with the test" in done["message"]
    [record] = records(h)
    assert record.document.model == SPEC["model"] and record.document.cores == 1
    assert "model is 'org/other'" in (record.document.error or "")


async def test_packages_must_be_name_equals_version(h: Harness) -> None:
    _, job = await start(h)
    await pending(h)
    pod = await h.start_pod(job)
    bad = document_for(Result.PASS).model_dump(mode="json")
    bad["packages"] = ["torch==2.13.0", "--index-url http://evil"]
    await h.deliver(job, json.dumps(bad).encode())
    await h.end_pod(job, pod, exit_code=0, log=None, termination_message="x")
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "ERROR"
    [record] = records(h)
    assert "delivered document is malformed" in (record.document.error or "")
    assert record.document.packages == []


async def test_a_store_that_refuses_writes_is_retried_and_surfaced(h: Harness) -> None:
    _, job = await start(h)
    await pending(h)
    pod = await h.start_pod(job)
    # The store refuses every write (here: its records/ folder cannot be created).
    h.results.mkdir(parents=True, exist_ok=True)
    blocker = h.results / "records"
    blocker.write_text("not a folder")
    await deliver(h, job, document_for(Result.PASS))
    await h.end_pod(job, pod, exit_code=0, log=None)
    waiting = await h.wait_status(
        "qwen",
        lambda s: conditions(s).get("Recorded", {}).get("reason") == "StoreUnavailable",
        "StoreUnavailable",
    )
    assert waiting["phase"] != "Completed"
    assert str(h.results) in conditions(waiting)["Recorded"]["message"]
    assert await h.wait_events("StoreUnavailable")

    blocker.unlink()  # the store is back
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert done["result"] == "PASS"
    assert [r.document.result for r in records(h)] == [Result.PASS]
    assert len(await h.wait_events("StoreUnavailable")) == 1  # said once, not once per retry


async def test_the_runner_message_for_sigkill_without_oomkilled_is_runtime(
    h: Harness, tmp_path: Path
) -> None:
    _, job = await start(h)
    pod = await h.start_pod(job)
    message = (
        "model-support runner: run.py was killed by SIGKILL (the container's OOMKilled reason "
        "says whether memory ran out); it wrote no result document."
    )
    await h.end_pod(job, pod, exit_code=137, log="loading\n", termination_message=message)
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    # Not OOMKilled by the container's own reason: no out-of-memory verdict is invented.
    assert (done["result"], done["errorClass"]) == ("ERROR", ErrorClass.RUNTIME.value)
    assert "SIGKILL" in done["message"]


async def test_a_run_recorded_before_a_crash_completes_with_what_was_recorded(
    h: Harness,
) -> None:
    """The operator stopped between storing the record and writing the status: the status it
    writes later shows the stored record, not whatever can (or cannot) be read now."""
    from model_support.records import RunRecord
    from model_support.store import ResultsStore

    _, job = await start(h)
    status = await pending(h)
    pod = await h.start_pod(job)
    await h.stop_operator()
    [program], _ = await h.configmaps()
    assert status["configMapName"] == program["metadata"]["name"]
    ResultsStore(str(h.results)).add(
        RunRecord(
            run_id=status["runId"],
            document=document_for(Result.FAIL, error="wrong token at 3"),
            run_py=await h.run_py_of(job),  # what its runner wrote, from the program ConfigMap
            source="operator",
        )
    )
    # The delivery was already removed, the pod and its log are gone.
    await h.delete(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
    await h.finish_job(job, exit_code=0)
    await h.start_operator()
    done = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (done["result"], done["message"]) == ("FAIL", "wrong token at 3")
    assert [r.document.result for r in records(h)] == [Result.FAIL]
