"""Time spent waiting, preemption and queueing are never the model's result.

The harness plays the Job controller with the Job's own podFailurePolicy (``Harness.fail_pod``
applies the rules the operator wrote), Kueue by suspending and resuming the Job, and the
kubelet by the pod status it writes for a deadline or an eviction.
"""

from __future__ import annotations

import asyncio
from typing import Any

from k8s_harness import JOBS_URL, Harness, now
from test_operator_api_rules import reconciler
from test_operator_lifecycle import SPEC, records, runner_log, start

from model_support.operator.resource import child_name
from model_support.runner_pod import STOPPED_MESSAGE
from model_support.stop_signals import STOPPED_EXIT
from model_support.vocabulary import Result


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def phase(h: Harness, want: str, name: str = "qwen") -> dict[str, Any]:
    return await h.wait_status(name, lambda s: s.get("phase") == want, want)


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient aws.amazon.com/neuroncore",
    "lastTransitionTime": "2020-01-01T00:00:00Z",
}


async def test_the_timeout_counts_from_run_py_and_waiting_past_the_backstop_is_no_verdict(
    harness: Harness,
) -> None:
    """A test waits for capacity as long as it takes: a pod no node fits until the Job's
    backstop deadline passes (no Kueue, no unschedulableLimitSeconds) ends that Job, not the
    test. The next attempt's Job starts the deadline anew; nothing is recorded."""
    h = harness
    test, job = await start(h, spec={**SPEC, "timeoutSeconds": 600})
    # The runner enforces the test's timeout from run.py's start; the Job's deadline is only a
    # backstop that leaves room for waiting, pulling and the init steps.
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--timeout") + 1] == "600"
    assert job["spec"]["activeDeadlineSeconds"] >= 600 + 3600
    # No node fits the pod until the backstop passes: the Job controller ends it DeadlineExceeded.
    await h.start_pod(job, conditions=[UNSCHEDULABLE])
    await phase(h, "Queued")
    await h.finish_job(job, exit_code=1, job_condition=("Failed", "DeadlineExceeded"))
    status = await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    assert status["phase"] == "Pending" and "result" not in status
    retried = conditions(status)["JobCreated"]
    assert (retried["status"], retried["reason"]) == ("True", "WaitedPastDeadline")
    assert "before run.py started" in retried["message"]
    assert "Insufficient aws.amazon.com/neuroncore" in retried["message"]
    [event] = await h.wait_events("WaitedPastDeadline")
    assert event["type"] == "Warning"
    [second] = await h.wait_job(child_name("qwen", test["metadata"]["uid"], 1, 2))
    assert second["spec"]["activeDeadlineSeconds"] == job["spec"]["activeDeadlineSeconds"]
    assert records(h) == []
    # Capacity comes: the second attempt runs the test to its result.
    pod = await h.start_pod(second)
    await h.run_pod(pod)
    await h.end_pod(second, pod, exit_code=0, log=runner_log(Result.PASS))
    status = await phase(h, "Completed")
    assert (status["result"], status["attempt"]) == ("PASS", 2)
    assert [r.document.result for r in records(h)] == [Result.PASS]


async def test_a_late_eviction_is_no_verdict_when_the_backstop_then_passes(
    harness: Harness,
) -> None:
    """A pod evicted late in a long run is replaced inside the same Job, whose startTime a
    replacement does not reset (the Job controller's activeDeadlineSeconds counts from it):
    the backstop then passes while the replacement's run.py has run only a little of its
    timeout. That is replacement and waiting, not the model: the test is retried."""
    h = harness
    test, job = await start(h, spec={**SPEC, "timeoutSeconds": 7200})
    first = await h.start_pod(job)
    await h.run_pod(first)
    await phase(h, "Running")
    assert await h.disrupt_pod(first, "EvictionByEvictionAPI") == "Ignore"
    second = await h.start_pod(job)  # the Job's replacement: the Job's startTime stays
    await h.run_pod(second)
    # The backstop passes soon after the replacement's run.py started (the harness plays
    # the clock: the Job started long ago).
    action = await h.end_pod(
        job, second, exit_code=143, log=None, job_condition=("Failed", "DeadlineExceeded"),
        started_at=now(),
    )  # fmt: skip
    assert action == "Failed"
    status = await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    assert status["phase"] == "Pending" and "result" not in status
    said = conditions(status)["JobCreated"]["message"]
    assert "run.py had run only" in said and "a pod replaced in the same Job" in said
    assert records(h) == []
    await h.wait_job(child_name("qwen", test["metadata"]["uid"], 1, 2))


async def test_kueue_preemption_requeues_the_test_and_it_runs_when_resumed(
    harness: Harness,
) -> None:
    h = harness
    _, job = await start(h, spec={**SPEC, "queueName": "trainium"})
    url = f"{JOBS_URL}/{job['metadata']['name']}"
    await phase(h, "Queued")
    await h.patch(url, {"spec": {"suspend": False}})  # Kueue admits it
    first = await h.start_pod(job)
    await h.run_pod(first)
    await phase(h, "Running")

    # Kueue preempts: it suspends the Job; the Job controller deletes the pod without a
    # DisruptionTarget condition, and the runner, stopped by SIGTERM, exits 143.
    await h.patch(url, {"spec": {"suspend": True}})
    action = await h.fail_pod(
        job, first, exit_code=STOPPED_EXIT, termination_message=STOPPED_MESSAGE
    )
    assert action == "Ignore"  # the Job's own policy: not the run's outcome, nothing counted
    status = await phase(h, "Queued")
    assert conditions(status)["Queued"]["reason"] == "KueueAdmission"
    assert "preempted" in conditions(status)["Queued"]["message"]
    assert records(h) == [] and status["attempt"] == 1

    # Kueue resumes the Job (startTime reset): a new pod runs the test to its result.
    await h.patch(url, {"spec": {"suspend": False}, "status": {"startTime": now()}})
    await phase(h, "Pending")
    second = await h.start_pod(job)
    await h.run_pod(second)
    await h.end_pod(job, second, exit_code=0, log=runner_log(Result.PASS))
    status = await phase(h, "Completed")
    assert status["result"] == "PASS" and status["attempt"] == 1
    assert [r.document.result for r in records(h)] == [Result.PASS]
    assert len(await h.items(JOBS_URL)) == 1


async def test_a_storage_eviction_is_recorded_with_its_sizing_and_not_retried(
    harness: Harness,
) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    # The kubelet evicts a pod whose emptyDir outgrew its sizeLimit at once (SIGKILL) and
    # adds no DisruptionTarget condition; exit 137 fails the Job under its policy.
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    limit = volumes["work"]["emptyDir"]["sizeLimit"]
    action = await h.fail_pod(
        job, pod, exit_code=137, pod_reason="Evicted",
        pod_message=f'Usage of EmptyDir volume "work" exceeds the limit "{limit}". ',
    )  # fmt: skip
    assert action == "FailJob"
    status = await phase(h, "Completed")
    assert (status["result"], status.get("errorClass")) == ("ERROR", "infrastructure")
    assert "evicted for local storage" in status["message"] and f"work {limit}" in status["message"]
    assert status["attempt"] == 1 and len(await h.items(JOBS_URL)) == 1  # not retried unchanged


async def test_a_queue_that_never_admits_is_said_on_the_test(harness: Harness) -> None:
    h = harness
    h.settings.kueue_admission_limit_s = 0.5
    await start(h, spec={**SPEC, "queueName": "no-such-queue"})
    status = await h.wait_status(
        "qwen",
        lambda s: conditions(s).get("Queued", {}).get("reason") == "NotAdmitted",
        "condition Queued=NotAdmitted",
    )
    assert status["phase"] == "Queued"  # it keeps waiting
    assert "LocalQueue no-such-queue" in conditions(status)["Queued"]["message"]
    events = await h.wait_events("NotAdmitted")
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert records(h) == []


async def test_a_resync_listing_older_than_a_preemption_never_makes_the_test_running_again(
    harness: Harness,
) -> None:
    """The watchdog's resync offers every unrecorded Job as a listing shows it, and that listing
    can predate events already handled (it is read on another thread while they arrive): a
    listing from before Kueue's preemption must not write Running over the preempted Queued,
    or the resumed test would wait for its pod in a phase it never leaves (Pending)."""
    h = harness
    rec = reconciler(h)
    test = await h.create_test("qwen", {**SPEC, "queueName": "trainium"})
    await asyncio.to_thread(rec.on_test, test, "ADDED")
    [job] = await h.items(JOBS_URL)

    def job_as(suspend: bool, ready: int) -> dict[str, Any]:
        spec = {**job["spec"], "suspend": suspend}
        return {
            **job,
            "spec": spec,
            "status": {"active": ready, "ready": ready, "startTime": now()},
        }

    running = job_as(suspend=False, ready=1)
    await asyncio.to_thread(rec.on_job, running, "MODIFIED")
    assert (await h.test_status("qwen"))["phase"] == "Running"
    await asyncio.to_thread(rec.on_job, job_as(suspend=True, ready=0), "MODIFIED")  # preempted
    assert (await h.test_status("qwen"))["phase"] == "Queued"

    await asyncio.to_thread(rec.on_job, running, "RESYNC")  # listed before the preemption
    status = await h.test_status("qwen")
    assert status["phase"] == "Queued" and "preempted" in conditions(status)["Queued"]["message"]

    await asyncio.to_thread(rec.on_job, job_as(suspend=False, ready=0), "MODIFIED")  # resumed
    assert (await h.test_status("qwen"))["phase"] == "Pending"
