"""The operator end to end against kmock: test -> (program ConfigMap) + Job -> pod status -> test
status + record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import k8s_harness
import kmock
import torch
from hubserver import HubServer
from k8s_harness import CMS_URL, JOBS_URL, PODS_URL, TESTS_URL, Harness
from prometheus_client import REGISTRY
from safetensors.torch import save_file

from model_support.config import RunConfig
from model_support.operator.manifests import BACKOFF_LIMIT, PROGRAM_DIR
from model_support.operator.resource import child_name, run_id_for
from model_support.records import RESULT_MARKER, ResultDocument, Timings
from model_support.script import read_config, render_script
from model_support.store import ResultsStore
from model_support.vocabulary import Backend, ErrorClass, ExclusionReason, Parallelism, Result

SPEC = {"model": "Qwen/Qwen3-0.6B", "profile": "trn2", "cores": 1, "hubTokenSecret": {"name": "hf"}}


def runner_log(result: Result, **fields: Any) -> str:
    """What run.py prints: progress, then its result document as the marked last line."""
    document = document_for(result, **fields)
    return "loading\ncompiling\n" + RESULT_MARKER + document.model_dump_json() + "\n"


def document_for(result: Result, **fields: Any) -> ResultDocument:
    """A document as run.py writes it for SPEC (what the test asked for, at the commit the
    operator pinned its revision to, and the outcome)."""
    asked = {
        "model": "Qwen/Qwen3-0.6B",
        "revision": k8s_harness.model_commit(),
        "task": "text-generation",
        "dtype": "bfloat16",
    }
    return ResultDocument.model_validate({**asked, "result": result, **fields})


def records(h: Harness) -> list[Any]:
    return list(ResultsStore(str(h.results)).records())


def creates(h: Harness, plural: str) -> int:
    return sum(
        1
        for r in h.k[kmock.action.CREATE]
        if r.resource is not None and r.resource.plural == plural
    )


async def start(
    h: Harness, name: str = "qwen", spec: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    await h.start_operator()
    test = await h.create_test(name, dict(spec or SPEC))
    [job] = await h.wait_job()
    return test, job


def passes_counted() -> float:
    return (
        REGISTRY.get_sample_value("model_support_tests_total", {"result": "PASS", "detail": ""})
        or 0.0
    )


async def test_pass_lifecycle(harness: Harness, operator_hub: HubServer) -> None:
    h = harness
    passes_before = passes_counted()
    test, job = await start(h)
    uid = test["metadata"]["uid"]
    assert job["metadata"]["name"] == child_name("qwen", uid, 1, 1)

    # The namespace's program ConfigMap exists once the Job does (made first: its pod mounts
    # it), the only ConfigMap: the test has none of its own.
    [program], others = await h.configmaps()
    assert others == []
    # It belongs to no test or Job (shared by the namespace's tests, it outlives each).
    assert "ownerReferences" not in program["metadata"]
    # The run.py the runner writes from it and the config block in the Job's env is exactly
    # what render_script makes of the spec, its revision (none: main) pinned to the commit
    # main names on the Hub.
    run_py = await h.run_py_of(job)
    commit = operator_hub.repos["Qwen/Qwen3-0.6B"].sha("main")
    expected = RunConfig(model="Qwen/Qwen3-0.6B", revision=commit, backend=Backend.NEURON, cores=1)
    assert run_py == render_script(expected)

    # The Job: one NeuronCore on a trn2 node, the token from the Secret; only failures before
    # the runner started are retried within it (backoffLimit), never the runner's own exit.
    pod_spec = job["spec"]["template"]["spec"]
    runner = pod_spec["containers"][0]
    # run.py runs through the runner entry point, which makes its result durable (no shell),
    # and writes it first from the program ConfigMap, mounted read-only.
    assert runner["command"][:3] == ["python3", "-m", "model_support.runner_pod"]
    assert runner["command"][runner["command"].index("--program") + 1] == PROGRAM_DIR
    assert {"name": "run-script", "mountPath": PROGRAM_DIR, "readOnly": True} in runner[
        "volumeMounts"
    ]
    [volume] = [v for v in pod_spec["volumes"] if v["name"] == "run-script"]
    assert volume["configMap"]["name"] == program["metadata"]["name"]
    assert runner["command"][runner["command"].index("--run-id") + 1] == run_id_for(uid, 1, 1)
    assert "ttlSecondsAfterFinished" not in job["spec"]  # never collected before it is recorded
    assert runner["resources"]["limits"]["aws.amazon.com/neuroncore"] == "1"
    # Any trn2 instance type holds one core: trn2.3xlarge and the UltraServers' types too.
    assert "nodeSelector" not in pod_spec
    [term] = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            "values": [
                "trn2.3xlarge",
                "trn2.48xlarge",
                "trn2u.48xlarge",
                "trn2p.48xlarge",
                "trn2eu.48xlarge",
            ],
        }
    ]
    assert {
        "key": "aws.amazon.com/neuron",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod_spec["tolerations"]
    env = {e["name"]: e for e in runner["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    # The runner enforces the test's timeout from run.py's start; the Job's deadline is a
    # backstop with room for waiting and pulling (deadlineBudgetSeconds) and the delivery.
    assert runner["command"][runner["command"].index("--timeout") + 1] == "7200"
    assert job["spec"]["backoffLimit"] == BACKOFF_LIMIT
    assert job["spec"]["activeDeadlineSeconds"] == 7200 + 3600 + 300
    assert job["metadata"]["ownerReferences"][0]["uid"] == uid

    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    assert status["runId"] == run_id_for(uid, 1, 1) and status["cores"] == 1
    assert status["revision"] == commit
    assert status["configMapName"] == program["metadata"]["name"]
    assert status["runScriptSha256"] == hashlib.sha256(run_py.encode()).hexdigest()
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Sized": "True",
        "JobCreated": "True",
        "Recorded": "False",
        "Ready": "False",  # kstatus: in progress
        "Reconciling": "True",
        "Stalled": "False",
    }

    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Running", "Running")

    log = runner_log(Result.PASS, timings=Timings(wall_time_s=41.5, compile_s=30.0))
    await h.end_pod(job, pod, exit_code=0, log=log)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (
        status["result"] == "PASS"
        and status["wallTimeSeconds"] == 41.5
        and status["compileSeconds"] == 30.0
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (
        conditions["Recorded"]["status"] == "True" and conditions["Completed"]["reason"] == "PASS"
    )

    # One record, with the same run.py and the run id in the status.
    [record] = records(h)
    assert record.run_id == status["runId"] and record.source == "operator"
    assert record.run_py == run_py and record.document.result == Result.PASS
    assert record.labels["test"] == "qwen" and record.labels["attempt"] == "1"
    assert record.labels["document_source"] == "log"  # nothing was delivered in this test

    # Recorded: the Job is labelled so and handed to the TTL controller only now.
    async def released() -> dict[str, Any] | None:
        found = await h.get(f"{JOBS_URL}/{job['metadata']['name']}")
        recorded = found and found["metadata"]["labels"].get("modelsupport.dev/recorded")
        return found if recorded == "true" else None

    finished = await h.wait_for(released, what="the recorded Job released to its TTL")
    # Kept the setting from its recording (the TTL counts from the Job's finish, moments ago).
    setting = h.settings.ttl_seconds_after_finished
    assert setting <= finished["spec"]["ttlSecondsAfterFinished"] <= setting + 120

    reasons = [e["reason"] for e in await h.events()]
    # A PASS is said by the status (Ready, result): Events cost an API request per test, so
    # they are kept for results that need attention (the Job's creation is a condition too).
    assert reasons == []
    assert passes_counted() == passes_before + 1


async def test_restart_mid_run_records_once(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    await h.stop_operator()

    # The run ends while no operator is watching.
    await h.end_pod(job, pod, exit_code=1, log=runner_log(Result.FAIL))
    await h.start_operator()
    status = await h.wait_status(
        "qwen", lambda s: s.get("phase") == "Completed", "Completed after restart"
    )
    assert status["result"] == "FAIL"
    assert len(records(h)) == 1

    # Another restart replays every Job as listed: still one record, status untouched.
    await h.stop_operator()
    await h.start_operator()
    await h.wait_for(
        lambda: len(list(h.k[kmock.action.LIST, kmock.resource("batch", "v1", "jobs")])) >= 3,
        what="relist",
    )
    assert len(records(h)) == 1
    assert (await h.test_status("qwen"))["finishedAt"] == status["finishedAt"]
    assert creates(h, "jobs") == 1 and creates(h, "configmaps") == 1


async def test_a_completion_lost_to_an_api_error_is_recorded_by_the_watchdog(
    harness: Harness,
) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    # The API server fails the log read the moment the Job ends; kopf does not retry event
    # handlers, so only the watchdog's resync can still finish this test.
    h.failing_log_reads = 1
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert h.failing_log_reads == 0  # the failure really happened
    assert status["result"] == "PASS"
    assert len(records(h)) == 1


async def test_lost_status_adopts_existing_children(harness: Harness) -> None:
    """A create handler replayed after its status was lost meets 409 and adopts the children."""
    h = harness
    await start(h)
    first = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    await h.stop_operator()
    # Forget everything the operator wrote (its annotations and the status): a replayed ADDED.
    await h.patch(
        f"{TESTS_URL}/qwen",
        {
            "metadata": {"annotations": None},
            "status": {"phase": None, "observedGeneration": None, "runId": None},
        },
    )
    # As if an operator of another release had made the Job: its runner runs another run.py.
    [job] = await h.items(JOBS_URL)
    containers = job["spec"]["template"]["spec"]["containers"]
    for env in containers[0]["env"]:
        if env["name"] == "MODEL_SUPPORT_RUN_SHA256":
            env["value"] = "e" * 64
    await h.patch(
        f"{JOBS_URL}/{job['metadata']['name']}",
        {"spec": {"template": {"spec": {"containers": containers}}}},
    )
    await h.start_operator()
    again = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending again")
    assert again["runId"] == first["runId"] and again["jobName"] == first["jobName"]
    assert len(await h.items(JOBS_URL)) == 1
    assert creates(h, "jobs") >= 2  # the replayed creates met 409 Conflict and adopted the Job
    assert again["runScriptSha256"] == "e" * 64  # what the adopted Job runs, not a new rendering


async def test_delete_while_running_records_nothing(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.delete(f"{TESTS_URL}/qwen")
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    # The operator fetches the test for the finished Job, finds it gone, and stops there.
    await h.wait_for(
        lambda: any(
            r.name == "qwen" and r.action == kmock.action.FETCH
            for r in h.k[kmock.resource("modelsupport.dev", "v1alpha1", "modelsupporttests")]
        ),
        what="lookup",
    )
    assert records(h) == []


async def test_oom_killed(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.end_pod(job, pod, exit_code=137, log="loading\n", container_reason="OOMKilled")
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["errorClass"]) == ("ERROR", "out-of-memory")
    [record] = records(h)
    assert record.document.error_class == ErrorClass.OUT_OF_MEMORY
    assert await h.wait_events("Errored")


async def test_the_backstop_deadline_after_run_py_ran_its_timeout_is_timeout(
    harness: Harness,
) -> None:
    """The runner enforces the timeout; should it fail to, a run.py that demonstrably ran for
    the whole timeout (7,200 s here) before the Job's backstop deadline is still TIMEOUT."""
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.end_pod(
        job, pod, exit_code=137, log="compiling\n", job_condition=("Failed", "DeadlineExceeded"),
        started_at="2020-01-01T00:00:00Z",
    )  # fmt: skip
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert status["result"] == "TIMEOUT" and status.get("errorClass") is None
    assert records(h)[0].document.result == Result.TIMEOUT


async def test_termination_message_fallback_and_unreadable_output(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    pod = await h.start_pod(job)
    # The log is gone (node rotated it); the termination message holds the result line.
    await h.end_pod(
        job,
        pod,
        exit_code=1,
        log=None,
        termination_message=runner_log(
            Result.ERROR, error_class=ErrorClass.COMPILE, error="neuronx-cc failed"
        ),
    )
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["errorClass"], status["message"]) == (
        "ERROR",
        "compile",
        "neuronx-cc failed",
    )

    await h.create_test("second", dict(SPEC))
    [job2] = await h.wait_job(
        child_name("second", (await h.get(f"{TESTS_URL}/second"))["metadata"]["uid"], 1, 1)
    )
    pod2 = await h.start_pod(job2)
    await h.end_pod(
        job2, pod2, exit_code=3, log="Traceback: boom\n", termination_message="Traceback: boom"
    )
    status = await h.wait_status("second", lambda s: s.get("phase") == "Completed", "Completed")
    # Neither a document nor the runner's own message: the runner itself did not run (an
    # image without model_support, say), which is no verdict on the model.
    assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
    assert "no result document and no message of its own" in status["message"]


async def test_node_loss_retries_then_records(harness: Harness) -> None:
    h = harness
    h.settings.max_attempts = 2
    test, job = await start(h)
    uid = test["metadata"]["uid"]
    pod = await h.start_pod(job)
    # A node lost without a DisruptionTarget condition (so the Job's podFailurePolicy could
    # not ignore it): the Job fails, and the operator tries again in a new Job.
    lost = {"reason": "NodeLost", "message": "node ip-10-0-0-1 is not ready"}
    await h.end_pod(job, pod, exit_code=137, log=None, pod_extra=lost)
    [retry] = await h.wait_job(child_name("qwen", uid, 1, 2))
    assert retry["metadata"]["labels"]["modelsupport.dev/attempt"] == "2"
    status = await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    assert status["runId"] == run_id_for(uid, 1, 2) and status["phase"] == "Pending"
    assert records(h) == []

    # The second attempt loses its node too: max_attempts reached, ERROR/infrastructure.
    pod2 = await h.start_pod(retry)
    await h.end_pod(retry, pod2, exit_code=137, log=None, pod_extra=lost)
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
    assert "disrupted (NodeLost)" in status["message"]
    assert [r.run_id for r in records(h)] == [run_id_for(uid, 1, 2)]


async def test_image_pull_failure_past_the_limit(harness: Harness) -> None:
    h = harness
    _, job = await start(h)
    waiting = {
        "name": "runner",
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "manifest unknown"}},
    }
    await h.start_pod(job, containerStatuses=[waiting])
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
    assert "ImagePullBackOff" in status["message"]

    async def job_deleted() -> bool:
        return await h.get(f"{JOBS_URL}/{job['metadata']['name']}") is None

    await h.wait_for(job_deleted, what="the stuck Job's deletion")
    assert len(records(h)) == 1


async def test_unschedulable_past_the_configured_limit(harness: Harness) -> None:
    h = harness
    h.settings.unschedulable_limit_s = 0.5  # configured: waiting longer is recorded
    _, job = await start(h)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes: Insufficient aws.amazon.com/neuroncore",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
    }
    await h.start_pod(job, conditions=[unschedulable])
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["errorClass"]) == ("ERROR", "infrastructure")
    assert "Insufficient aws.amazon.com/neuroncore" in status["message"]


async def test_spec_change_supersedes_the_running_job(harness: Harness) -> None:
    h = harness
    test, job = await start(h)
    uid = test["metadata"]["uid"]
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    await h.patch(
        f"{TESTS_URL}/qwen", {"metadata": {"generation": 2}, "spec": {"dtype": "float32"}}
    )
    await h.wait_job(child_name("qwen", uid, 2, 1))
    status = await h.wait_status("qwen", lambda s: s.get("observedGeneration") == 2, "generation 2")
    assert status["runId"] == run_id_for(uid, 2, 1)
    assert await h.get(f"{JOBS_URL}/{job['metadata']['name']}") is None  # the old Job is deleted
    [new] = await h.wait_job(child_name("qwen", uid, 2, 1))
    assert read_config(await h.run_py_of(new)).dtype == "float32"
    # The new generation's run.py comes from the same program ConfigMap: none per generation.
    [program], others = await h.configmaps()
    assert others == [] and status["configMapName"] == program["metadata"]["name"]


async def test_invalid_spec_is_reported_not_run(harness: Harness) -> None:
    h = harness
    await h.start_operator()
    # The API server's schema would refuse this; the operator must not trust that it did.
    await h.create_test(
        "bad", {"model": "org/m", "profile": "inf2", "cores": 30, "parallelism": "tensor"}
    )
    status = await h.wait_status("bad", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "spec.cores" in status["message"] or "exceeds the 24 cores" in status["message"]
    assert await h.items(JOBS_URL) == []
    warnings = await h.wait_events("InvalidSpec")
    assert warnings and warnings[0]["type"] == "Warning"


async def test_kueue_queue_creates_a_suspended_job(harness: Harness) -> None:
    h = harness
    _, job = await start(h, spec={**SPEC, "queueName": "trainium"})
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "trainium"
    assert await h.items(PODS_URL) == []


async def test_sizing_excludes_remote_code_models(harness: Harness, tmp_path: Path) -> None:
    """No cores in the spec: the real sizing reads the checkpoint and excludes it, with its reason."""
    h = harness
    checkpoint = tmp_path / "custom-model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps(
            {
                "model_type": "my-custom",
                "architectures": ["MyCustomForCausalLM"],
                "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"},
            }
        )
    )
    save_file({"w": torch.zeros(4, 4)}, str(checkpoint / "model.safetensors"))
    await h.start_operator()
    test = await h.create_test("custom", {"model": str(checkpoint), "profile": "trn2"})
    status = await h.wait_status("custom", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["exclusionReason"]) == ("EXCLUDED", "remote-code-required")
    assert await h.items(JOBS_URL) == []
    [record] = records(h)
    assert record.exclusion_reason == ExclusionReason.REMOTE_CODE_REQUIRED
    assert record.run_id == run_id_for(test["metadata"]["uid"], 1, 0) == status["runId"]
    assert read_config(record.run_py).model == str(checkpoint)
    assert await h.wait_events("Excluded")


async def test_a_too_large_model_is_recorded_with_the_cores_it_would_need(
    harness: Harness, tmp_path: Path
) -> None:
    """Llama-3.1-405B (headers only) on trn2 with 16 cores allowed: EXCLUDED too-large, and the
    record and its run.py say the 64 cores (tensor parallel) that would hold it."""
    from model_support.checkpoints import (
        LLAMA_3_1_405B_CONFIG,
        build_header_only_checkpoint,
        llama_tensors,
    )

    h = harness
    checkpoint = build_header_only_checkpoint(
        tmp_path, "llama-405b", LLAMA_3_1_405B_CONFIG, llama_tensors(LLAMA_3_1_405B_CONFIG)
    )
    await h.start_operator()
    await h.create_test("huge", {"model": str(checkpoint), "profile": "trn2", "maxCores": 16})
    status = await h.wait_status("huge", lambda s: s.get("phase") == "Completed", "Completed")
    assert (status["result"], status["exclusionReason"]) == ("EXCLUDED", "too-large")
    assert "It would fit 64 cores (tensor parallel)." in status["message"]
    [record] = records(h)
    assert (record.document.cores, record.document.parallelism) == (64, Parallelism.TENSOR)
    rerun = read_config(record.run_py)
    assert (rerun.cores, rerun.parallelism) == (64, Parallelism.TENSOR)
    assert await h.items(JOBS_URL) == []


async def test_sizing_places_a_model_that_fits(harness: Harness, tiny_llama_path: Path) -> None:
    h = harness
    await h.start_operator()
    await h.create_test("sized", {"model": str(tiny_llama_path), "profile": "trn2"})
    [job] = await h.wait_job()
    status = await h.wait_status("sized", lambda s: s.get("phase") == "Pending", "Pending")
    assert status["cores"] == 1 and status["parallelism"] == "none"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Sized"] == "Sized"
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    # The floor of host memory (16 GiB) plus /dev/shm for its one worker (1 GiB).
    assert resources["limits"]["aws.amazon.com/neuroncore"] == "1"
    assert resources["limits"]["memory"] == "17Gi"
    assert resources["requests"]["ephemeral-storage"] == "35Gi"  # checkpoint + 4 + 10 + 20 GiB


async def test_a_branch_is_recorded_at_its_commit_even_without_the_configmap(
    harness: Harness, operator_hub: HubServer
) -> None:
    """A test applied with a branch (kubectl apply, a sweep) runs and records a run.py that
    names the branch's commit; when the program ConfigMap is gone by the time the run is
    recorded, the run.py rendered again names the same commit (the status keeps it)."""
    h = harness
    _, job = await start(h, spec={**SPEC, "revision": "main"})
    commit = operator_hub.repos["Qwen/Qwen3-0.6B"].sha("main")
    ran = await h.run_py_of(job)  # what the runner wrote
    assert read_config(ran).revision == commit
    [program], _ = await h.configmaps()
    await h.delete(f"{CMS_URL}/{program['metadata']['name']}")
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    assert await h.configmaps() == ([], [])  # still gone when it was recorded
    [record] = records(h)
    assert record.run_py == ran  # byte for byte what ran
    assert read_config(record.run_py).revision == commit
