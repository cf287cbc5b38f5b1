"""Disruption and waiting are not model results.

The harness plays the Job controller as our Job spec asks it to (podFailurePolicy: a pod with a
DisruptionTarget condition is ignored and replaced; any non-zero exit fails the Job), and the
scheduler / Kueue as they report waiting.
"""

from __future__ import annotations

from typing import Any

import pytest
from k8s_harness import JOBS_URL, PODS_URL, Harness, now
from test_operator_lifecycle import SPEC, records, runner_log, start

from model_support.vocabulary import Result


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def phase(h: Harness, want: str, name: str = "qwen") -> dict[str, Any]:
    return await h.wait_status(name, lambda s: s.get("phase") == want, want)


async def test_an_evicted_pod_is_replaced_and_the_test_passes_once(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    first = await h.start_pod(job)
    await h.run_pod(first)
    await phase(h, "Running")
    # Evicted mid-run (exit 143 with DisruptionTarget): the Job ignores it and starts another.
    await h.disrupt_pod(first, "EvictionByEvictionAPI")
    second = await h.start_pod(job)
    await h.run_pod(second)
    await h.end_pod(job, second, exit_code=0, log=runner_log(Result.PASS))
    status = await phase(h, "Completed")
    assert status["result"] == "PASS" and status["attempt"] == 1, status.get("message")
    [record] = records(h)  # the disrupted pod left no record of its own
    assert record.document.result == Result.PASS
    assert len(await h.items(JOBS_URL)) == 1  # the Job retried it; the operator made no new Job


async def test_exit_137_without_oomkilled_is_not_out_of_memory(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.end_pod(job, pod, exit_code=137, log="loading\n", container_reason="Error")
    status = await phase(h, "Completed")
    assert status["result"] == "ERROR" and status["errorClass"] != "out-of-memory"


async def test_a_runner_stopped_from_outside_is_replaced_by_its_job(harness: Harness) -> None:
    """SIGTERM without a DisruptionTarget condition (a pod deleted by hand, a node shut down):
    the runner exits 143, which the Job's pod failure policy ignores, so the Job replaces the
    pod; the operator records nothing for the stopped pod and starts no Job of its own."""
    from model_support.runner_pod import STOPPED_MESSAGE
    from model_support.stop_signals import STOPPED_EXIT

    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await phase(h, "Running")
    action = await h.fail_pod(job, pod, exit_code=STOPPED_EXIT, termination_message=STOPPED_MESSAGE)
    assert action == "Ignore"
    second = await h.start_pod(job)
    await h.run_pod(second)
    await h.end_pod(job, second, exit_code=0, log=runner_log(Result.PASS))
    status = await phase(h, "Completed")
    assert status["result"] == "PASS" and status["attempt"] == 1
    assert len(records(h)) == 1 and len(await h.items(JOBS_URL)) == 1


async def test_waiting_for_capacity_is_queued_not_a_result(harness: Harness) -> None:
    h = harness
    assert h.settings.unschedulable_limit_s is None  # the default: wait as long as it takes
    _, job = await start(h)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes: Insufficient aws.amazon.com/neuroncore",
        "lastTransitionTime": "2020-01-01T00:00:00Z",  # years ago: still only waiting
    }
    pod = await h.start_pod(job, conditions=[unschedulable])
    status = await phase(h, "Queued")
    queued = conditions(status)["Queued"]
    assert (queued["status"], queued["reason"]) == ("True", "Unschedulable")
    assert "Insufficient aws.amazon.com/neuroncore" in queued["message"]
    events = await h.wait_events("WaitingForCapacity")
    assert len(events) == 1 and records(h) == []

    # Capacity arrives: scheduled (Pending, no pod ready yet), then ready (Running).
    await h.patch(
        f"{PODS_URL}/{pod['metadata']['name']}/status",
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
                ]
            }
        },
    )
    status = await phase(h, "Pending")
    assert conditions(status)["Queued"]["status"] == "False"
    await h.run_pod(pod)
    status = await phase(h, "Running")
    assert status["startedAt"]
    assert len(await h.wait_events("WaitingForCapacity")) == 1


async def test_kueue_admission_is_queued_then_running(harness: Harness) -> None:
    h = harness
    _, job = await start(h, spec={**SPEC, "queueName": "trainium"})
    status = await phase(h, "Queued")
    assert conditions(status)["Queued"]["reason"] == "KueueAdmission"
    # Kueue admits the Job by unsuspending it.
    await h.patch(f"{JOBS_URL}/{job['metadata']['name']}", {"spec": {"suspend": False}})
    await phase(h, "Pending")
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await phase(h, "Running")


# ------------------------------------------------------- outside run.py's window (strict Job
# controller: tests/job_controller.py). A pod removed for a suspension, a disruption or an
# admission failure never decides a test, at whatever stage it was; failures before the runner
# started are retried within the Job.

QUEUED = {**SPEC, "queueName": "trainium", "extraPackages": ["sentencepiece>=0.2"]}
INIT_STEP = "extra-packages"


async def admitted(h: Harness, spec: dict[str, Any]) -> dict[str, Any]:
    """A test whose Job Kueue has admitted (unsuspended)."""
    _, job = await start(h, spec=spec)
    if spec.get("queueName"):
        await phase(h, "Queued")
        await h.resume(job)
    return job


async def passes_on_a_new_pod(h: Harness, job: dict[str, Any]) -> None:
    """The Job's next pod runs the test to its result: PASS, once, in the same Job."""
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    status = await phase(h, "Completed")
    assert (status["result"], status["attempt"]) == ("PASS", 1), status.get("message")
    assert [r.document.result for r in records(h)] == [Result.PASS]
    assert len(await h.items(JOBS_URL)) == 1


@pytest.mark.parametrize(
    "exit_code",
    [143, 137],
    ids=["the-step-stops-on-sigterm", "the-step-is-killed-after-the-grace-period"],
)
async def test_a_preemption_during_an_init_step_never_decides_the_test(
    harness: Harness, exit_code: int
) -> None:
    h = harness
    job = await admitted(h, QUEUED)
    pod = await h.start_pod(job)
    action = await h.suspend(job, pod, step=INIT_STEP, exit_code=exit_code)
    assert action != "FailJob" and not await h.job_ended(job)
    status = await phase(h, "Queued")
    assert "preempted" in conditions(status)["Queued"]["message"] and records(h) == []
    await h.resume(job)
    await passes_on_a_new_pod(h, job)


@pytest.mark.parametrize("step", [None, INIT_STEP], ids=["pulling-its-image", "in-an-init-step"])
async def test_a_pod_deleted_before_the_runner_started_is_replaced(
    harness: Harness, step: str | None
) -> None:
    """kubectl delete pod (no DisruptionTarget): while the image pulls there is no exit code
    at all; in an init step, the step exits 143 on the pod's SIGTERM."""
    h = harness
    job = await admitted(h, {**SPEC, "extraPackages": ["sentencepiece>=0.2"]})
    pod = await h.start_pod(job)
    await h.delete_pod(job, pod, step=step, exit_code=None if step is None else 143)
    assert not await h.job_ended(job)
    await passes_on_a_new_pod(h, job)


@pytest.mark.parametrize("reason", ["OutOfaws.amazon.com/neuroncore", "UnexpectedAdmissionError"])
async def test_a_pod_the_kubelet_refused_at_admission_is_replaced(
    harness: Harness, reason: str
) -> None:
    h = harness
    job = await admitted(h, SPEC)
    pod = await h.start_pod(job)
    assert await h.reject_pod(job, pod, reason=reason) == "Count"
    assert not await h.job_ended(job)
    await passes_on_a_new_pod(h, job)


async def test_a_failed_init_step_is_retried_within_the_job(harness: Harness) -> None:
    """An extra package's install failing once (the index unreachable, say) is no verdict:
    the Job starts the pod again; only the runner's own exit decides."""
    h = harness
    job = await admitted(h, {**SPEC, "extraPackages": ["sentencepiece>=0.2"]})
    pod = await h.start_pod(job)
    assert await h.fail_init_step(job, pod, INIT_STEP, exit_code=1) == "Count"
    assert not await h.job_ended(job)
    await passes_on_a_new_pod(h, job)


async def test_the_runners_own_verdict_still_fails_the_job_at_once(harness: Harness) -> None:
    h = harness
    job = await admitted(h, SPEC)
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    assert await h.fail_pod(job, pod, exit_code=1) == "FailJob"
    assert await h.job_ended(job)
