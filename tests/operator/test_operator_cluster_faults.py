"""What a real cluster does that its kinder stand-ins did not: API calls that fail for one Job
among many, creates refused for a retry, pods the Job controller cannot create, Jobs deleted
while no watch event could say so, Jobs recorded long after they finished, and spec changes in
the middle of a retry.

The reconciler and its watchdog are driven directly against kmock (no kopf): each test plays
what the watches delivered (or missed), the Job controller's part through the strict stand-in
(``Harness.end_pod`` applies the Job's own podFailurePolicy), and runs the watchdog's rounds.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from api_faults import Family, Fault
from k8s_harness import EVENTS_URL, JOBS_URL, NS, TESTS_URL, Harness, now
from test_operator_api_rules import conditions, reconciler, refuse_creates
from test_operator_lifecycle import SPEC, document_for, records

from model_support.operator.reconciler import Reconciler
from model_support.operator.resource import child_name
from model_support.operator.watchdog import Watchdog
from model_support.script import read_config
from model_support.vocabulary import Result

NODE_LOST = {"reason": "NodeLost", "message": "node ip-10-0-0-1 is not ready"}
QUOTA = (
    'jobs.batch "a" is forbidden: exceeded quota: trainium, requested: count/jobs.batch=1, '
    "used: count/jobs.batch=10, limited: count/jobs.batch=10"
)


@pytest.fixture
def h(harness: Harness) -> Harness:
    """Runners deliver into the store (a shared volume); retries come quickly."""
    harness.settings.results_volume_claim = "model-support-results"
    harness.settings.sizing_retry_base_s = 0.2
    harness.settings.retry_cap_s = 1.0
    return harness


async def launch(h: Harness, rec: Reconciler, name: str, spec: dict[str, Any] | None = None) -> Any:
    """A test the reconciler launched (as kopf's event would have it): the test and its Job."""
    test = await h.create_test(name, dict(spec or SPEC))
    await asyncio.to_thread(rec.on_test, test, "ADDED")
    job = await h.get(f"{JOBS_URL}/{child_name(name, test['metadata']['uid'], 1, 1)}")
    assert job is not None, f"no Job for {name}"
    return test, job


async def passes(h: Harness, job: dict[str, Any]) -> None:
    """The runner ran, delivered a PASS and exited 0: the Job completed."""
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)


async def loses_its_node(h: Harness, job: dict[str, Any]) -> None:
    """The node went away under the runner (exit 137, pod reason NodeLost): the Job failed."""
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    assert await h.end_pod(job, pod, exit_code=137, log=None, pod_extra=NODE_LOST) == "FailJob"


async def warnings(h: Harness, reason: str, about: str) -> list[dict[str, Any]]:
    return [
        e
        for e in await h.events()
        if e.get("reason") == reason and e["involvedObject"]["name"] == about
    ]


# ------------------------------------------------------------------ one Job at a time


@pytest.mark.parametrize("fault", ["retry-job-refused", "pod-list-refused"])
async def test_a_job_that_cannot_be_handled_holds_up_no_other(h: Harness, fault: str) -> None:
    """a's Job lost its node; handling it fails (the API server refuses a's next Job with a
    quota's 403, or the connection is refused while a's pods are listed). b's Job, listed
    after it, completed with a delivered PASS: the same round records b, and no exception
    leaves the watchdog's check."""
    rec = reconciler(h)
    watchdog = Watchdog(rec)
    _, job_a = await launch(h, rec, "a")
    _, job_b = await launch(h, rec, "b")
    await loses_its_node(h, job_a)
    await passes(h, job_b)
    if fault == "retry-job-refused":
        h.k.refusals = (refuse_creates("jobs", 100, 403, QUOTA),)
    else:
        # Refused four times: urllib3 retries an idempotent request three times on its own.
        h.k.inject(Fault.REFUSED, Family.LIST, resource="pods", times=4)

    await asyncio.to_thread(watchdog.resync_jobs)  # raises nothing

    b = await h.test_status("b")
    assert (b["phase"], b["result"]) == ("Completed", "PASS")
    assert [r.document.result for r in records(h)] == [Result.PASS]
    a = await h.test_status("a")
    assert a["phase"] == "Pending" and a["attempt"] == 1 and "result" not in a
    if fault == "retry-job-refused":
        # Said on a as a refused first Job is: JobCreated=False, CreateRefused, one Warning.
        created = conditions(a)["JobCreated"]
        assert (created["status"], created["reason"]) == ("False", "CreateRefused")
        assert "exceeded quota: trainium" in created["message"]
        assert "the runner pod was disrupted (NodeLost)" in created["message"]
        [warning] = await warnings(h, "CreateRefused", "a")
        assert warning["type"] == "Warning"
        await asyncio.to_thread(watchdog.resync_jobs)  # still refused: no second Event
        assert len(await warnings(h, "CreateRefused", "a")) == 1
        h.k.refusals = ()
    # Once the API answers again (after a's backoff), a's next attempt runs.
    await asyncio.sleep(1.1)
    await asyncio.to_thread(watchdog.resync_jobs)
    a = await h.test_status("a")
    assert a["attempt"] == 2 and a["phase"] == "Pending"
    created = conditions(a)["JobCreated"]
    assert (created["status"], created["reason"]) == ("True", "NodeLost")
    uid = (await h.get(f"{TESTS_URL}/a") or {})["metadata"]["uid"]
    assert await h.get(f"{JOBS_URL}/{child_name('a', uid, 1, 2)}") is not None
    assert [r.document.result for r in records(h)] == [Result.PASS]  # nothing recorded for a


# ------------------------------------------------------------------ pods never created


def failed_create(job: dict[str, Any], message: str, at: str) -> dict[str, Any]:
    """The Job controller's Event when the API server refuses its pod (kubernetes
    pkg/controller/controller_utils.go: Warning FailedCreate, "Error creating: ...")."""
    meta = job["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.failed-create", "namespace": NS},
        "involvedObject": {"kind": "Job", "name": meta["name"], "uid": meta["uid"]},
        "type": "Warning",
        "reason": "FailedCreate",
        "message": f"Error creating: {message}",
        "source": {"component": "job-controller"},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 3,
    }


POD_QUOTA = (
    'pods "qwen-job-x7k2p" is forbidden: exceeded quota: neuron, requested: '
    "aws.amazon.com/neuroncore=1, used: aws.amazon.com/neuroncore=64, limited: "
    "aws.amazon.com/neuroncore=64"
)


async def test_a_runner_pod_the_api_server_refuses_is_said_on_the_test_within_a_round(
    h: Harness,
) -> None:
    rec = reconciler(h)
    watchdog = Watchdog(rec)
    _, job = await launch(h, rec, "qwen")
    # The Job controller started the Job (startTime) and cannot create its pod: a quota on
    # NeuronCores; it says so only in an Event on the Job (the Job gets no condition).
    await h.patch(f"{JOBS_URL}/{job['metadata']['name']}/status", {"status": {"startTime": now()}})
    await h.create(EVENTS_URL, failed_create(job, POD_QUOTA, now()))

    await asyncio.to_thread(watchdog.resync_jobs)

    status = await h.test_status("qwen")
    refused = conditions(status)["PodCreated"]
    assert (refused["status"], refused["reason"]) == ("False", "FailedCreate")
    assert "exceeded quota: neuron" in refused["message"]
    assert job["metadata"]["name"] in refused["message"]
    assert status["phase"] == "Pending" and records(h) == []  # waiting, not a verdict
    [warning] = await warnings(h, "FailedCreate", "qwen")
    assert "aws.amazon.com/neuroncore=64" in warning["message"]
    await asyncio.to_thread(watchdog.resync_jobs)
    assert len(await warnings(h, "FailedCreate", "qwen")) == 1  # said once

    # The quota frees up: the pod is made, and what was said is cleared in the next round.
    pod = await h.start_pod(job)
    await asyncio.to_thread(watchdog.resync_jobs)
    assert conditions(await h.test_status("qwen"))["PodCreated"]["status"] == "True"
    await h.run_pod(pod)
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    await asyncio.to_thread(watchdog.resync_jobs)
    assert (await h.test_status("qwen"))["result"] == "PASS"


async def test_a_refusal_older_than_the_jobs_last_pod_is_not_said(h: Harness) -> None:
    """An early refusal (the quota was full for a moment), then a pod that ran and was
    evicted: while the Job waits to start its replacement it has no pod, and the old Event is
    history."""
    rec = reconciler(h)
    watchdog = Watchdog(rec)
    _, job = await launch(h, rec, "qwen")
    long_ago = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await h.create(EVENTS_URL, failed_create(job, POD_QUOTA, long_ago))
    pod = await h.start_pod(job)
    assert await h.disrupt_pod(pod) == "Ignore"  # the Job waits to replace it: no pod now
    await asyncio.to_thread(watchdog.resync_jobs)
    assert "PodCreated" not in conditions(await h.test_status("qwen"))
    assert await warnings(h, "FailedCreate", "qwen") == []


# ------------------------------------------------------------------ Jobs gone unseen


@pytest.mark.parametrize("delivered", [False, True], ids=["nothing-delivered", "pass-delivered"])
async def test_a_job_deleted_while_the_jobs_watch_relisted_ends_its_test(
    h: Harness, delivered: bool
) -> None:
    """The Jobs watch relisted (410 Gone) and the Job was deleted meanwhile: no DELETED event
    came. The watchdog's audit after the listing finds the test's Job gone and ends the test
    as the Job-deleted path does: from the delivered document, else ERROR/infrastructure."""
    rec = reconciler(h)
    watchdog = Watchdog(rec)
    _, job = await launch(h, rec, "qwen")
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    if delivered:
        await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.delete(f"{JOBS_URL}/{job['metadata']['name']}")  # unseen: no event reaches rec

    watchdog.note_listing()  # the Jobs watch listed again (kopf: events of type None)
    for check in watchdog.checks():  # one watchdog round
        await asyncio.to_thread(check)

    status = await h.test_status("qwen")
    assert status["phase"] == "Completed"
    if delivered:
        assert status["result"] == "PASS"
    else:
        assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
        assert "disappeared before its result was read" in status["message"]
    assert len(records(h)) == 1


async def test_the_audit_ends_nothing_whose_job_exists(h: Harness) -> None:
    rec = reconciler(h)
    watchdog = Watchdog(rec)
    await launch(h, rec, "qwen")
    watchdog.note_listing()
    assert await asyncio.to_thread(watchdog.audit) == 0
    assert (await h.test_status("qwen"))["phase"] == "Pending"


# ------------------------------------------------------------------ what etcd keeps


async def test_a_job_recorded_late_is_kept_the_ttl_from_its_recording(h: Harness) -> None:
    """The TTL controller counts ttlSecondsAfterFinished from the Job's finish: a Job recorded
    two hours after it finished (the operator was down) gets those two hours on top, or it,
    its pods and their logs would go at once."""
    rec = reconciler(h)
    _, job = await launch(h, rec, "qwen")
    pod = await h.start_pod(job)
    await h.deliver(job, document_for(Result.PASS).model_dump_json().encode())
    await h.end_pod(job, pod, exit_code=0, log=None)
    finished = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    url = f"{JOBS_URL}/{job['metadata']['name']}"
    current = await h.get(url)
    assert current is not None
    [complete] = current["status"]["conditions"]
    await h.patch(
        f"{url}/status",
        {"status": {"completionTime": finished,
                    "conditions": [{**complete, "lastTransitionTime": finished}]}},
    )  # fmt: skip
    ended = await h.get(url)
    assert ended is not None

    await asyncio.to_thread(rec.on_job, ended, "MODIFIED")  # the operator is back

    assert (await h.test_status("qwen"))["result"] == "PASS"
    released = await h.get(url)
    assert released is not None
    ttl = released["spec"]["ttlSecondsAfterFinished"]
    setting = h.settings.ttl_seconds_after_finished
    assert setting + 2 * 3600 <= ttl <= setting + 2 * 3600 + 120


async def test_a_spec_change_during_a_retry_deletes_every_attempts_job_and_keeps_the_program(
    h: Harness,
) -> None:
    rec = reconciler(h)
    test, first = await launch(h, rec, "qwen")
    uid = test["metadata"]["uid"]
    await loses_its_node(h, first)
    ended = await h.get(f"{JOBS_URL}/{first['metadata']['name']}")
    await asyncio.to_thread(rec.on_job, ended, "MODIFIED")
    assert (await h.test_status("qwen"))["attempt"] == 2
    old = {child_name("qwen", uid, 1, 1), child_name("qwen", uid, 1, 2)}
    assert old <= {j["metadata"]["name"] for j in await h.items(JOBS_URL)}
    [program], others = await h.configmaps()
    assert others == []

    # The spec changes while attempt 2 waits: generation 2 supersedes both attempts.
    changed = await h.patch(f"{TESTS_URL}/qwen", {"spec": {"timeoutSeconds": 1200}})
    assert changed["metadata"]["generation"] == 2
    await asyncio.to_thread(rec.on_test, changed, "MODIFIED")

    [job] = await h.items(JOBS_URL)
    assert job["metadata"]["name"] == child_name("qwen", uid, 2, 1)
    # The program ConfigMap is the namespace's, not the generation's: it stays, the same
    # object, and the new generation's Job makes its run.py from it; no ConfigMap of the test's.
    kept, others = await h.configmaps()
    assert [c["metadata"]["uid"] for c in kept] == [program["metadata"]["uid"]]
    assert others == []
    assert read_config(await h.run_py_of(job)).model == SPEC["model"]
    status = await h.test_status("qwen")
    assert (status["observedGeneration"], status["attempt"]) == (2, 1)
    assert status["configMapName"] == program["metadata"]["name"]


# ------------------------------------------------------------------ the image pull clock


async def test_each_operator_counts_the_image_pull_limit_from_what_it_saw(h: Harness) -> None:
    """The pull limit counts from the first failure this operator saw: a second operator in
    the same process (a replica that took over, a restart in tests) counts anew rather than
    inheriting a clock it never kept."""
    h.settings.image_pull_limit_s = 600
    first = reconciler(h)
    _, job = await launch(h, first, "qwen")
    failing = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off"}}}
    await h.start_pod(job, containerStatuses=[{"name": "runner", **failing}])
    seen = datetime.now(UTC)
    assert await asyncio.to_thread(Watchdog(first).check_waiting, seen) == 0

    later = seen + timedelta(seconds=700)  # past the limit, on the first operator's clock
    second = Reconciler(h.settings, first.kube)
    second.observe_test(await h.get(f"{TESTS_URL}/qwen") or {}, "ADDED")
    assert await asyncio.to_thread(Watchdog(second).check_waiting, later) == 0
    assert (await h.test_status("qwen"))["phase"] != "Completed" and records(h) == []
