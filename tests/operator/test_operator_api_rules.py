"""The API server's own rules: optimistic concurrency, refused creates, relists, leadership.

Some tests drive the reconciler directly against kmock (no kopf): they play what a watch
would (or would not) have delivered, which is exactly what these rules are about.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import kmock
import pytest
from k8s_harness import JOBS_URL, NS, TESTS_URL, Harness, OperatorThread, now
from kmock_kubelet import Kubelet
from prometheus_client import REGISTRY
from test_operator_lifecycle import SPEC, records, runner_log, start
from test_sweeps import create_sweep, model_id, ready, sh, sweep_hub, wait_sweep  # noqa: F401
from test_sweeps import start as start_sweeps

from model_support.dataset import held_seconds, matrix_key, records_to_table
from model_support.operator.kube import Kube, api_client
from model_support.operator.reconciler import Reconciler, ref_of
from model_support.operator.resource import (
    GROUP,
    PLURAL,
    SWEEP_KIND,
    SWEEP_PLURAL,
    VERSION,
    child_name,
)
from model_support.operator.status import StatusPatch, TestStatus
from model_support.operator.sweep_reconciler import SweepReconciler
from model_support.operator.watchdog import Watchdog
from model_support.script import read_config
from model_support.vocabulary import Result

SWEEPS_URL = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{SWEEP_PLURAL}"


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def reconciler(h: Harness) -> Reconciler:
    """The operator's logic without kopf (what its watches deliver is played by the test);
    phases are written at once (no task flushes deferred Running writes here)."""
    h.settings.running_write_delay_s = 0
    return Reconciler(h.settings, Kube(api_client(h.settings.api_server)))


def posts(h: Harness, plural: str) -> int:
    return sum(
        1 for r in h.k[kmock.method.POST] if r.resource is not None and r.resource.plural == plural
    )


# ------------------------------------------------------------------ optimistic concurrency


async def test_a_stale_status_write_never_moves_a_completed_test_back(harness: Harness) -> None:
    h = harness
    rec = reconciler(h)
    test = await h.create_test("qwen", dict(SPEC))
    await asyncio.to_thread(rec.on_test, test, "ADDED")
    [job] = await h.items(JOBS_URL)
    assert (await h.test_status("qwen"))["phase"] == "Pending"
    # Another writer (the replica that held the Lease before) completed the test; this
    # reconciler has not seen that yet, and a late event of the Job says its pod is ready.
    await h.patch(
        f"{TESTS_URL}/qwen/status",
        {"status": {"phase": "Completed", "result": "PASS", "finishedAt": now()}},
    )
    job["status"] = {"active": 1, "ready": 1, "startTime": now()}
    await asyncio.to_thread(rec.on_job, job, "MODIFIED")
    status = await h.test_status("qwen")
    assert (status["phase"], status["result"]) == ("Completed", "PASS")


async def test_a_conflicting_status_write_is_made_again_from_a_fresh_read(
    harness: Harness,
) -> None:
    h = harness
    rec = reconciler(h)
    test = await h.create_test("qwen", dict(SPEC))
    await asyncio.to_thread(rec.on_test, test, "ADDED")
    [job] = await h.items(JOBS_URL)
    status = await h.test_status("qwen")
    audited = {
        "type": "Audited", "status": "True", "reason": "Checked", "message": "by an auditor",
        "lastTransitionTime": now(),
    }  # fmt: skip
    await h.patch(
        f"{TESTS_URL}/qwen/status", {"status": {"conditions": [*status["conditions"], audited]}}
    )
    job["status"] = {"active": 1, "ready": 1, "startTime": now()}
    await asyncio.to_thread(rec.on_job, job, "MODIFIED")
    status = await h.test_status("qwen")
    assert status["phase"] == "Running"
    assert conditions(status)["Audited"]["message"] == "by an auditor"  # not written over


async def test_two_threads_writing_one_test_write_one_after_the_other(harness: Harness) -> None:
    """A held Running and the run's end, written from two threads at once: the second write is
    computed from what the first returned, so neither meets a 409 (and the read it costs)."""
    h = harness
    rec = reconciler(h)
    test = await h.create_test("qwen", dict(SPEC))
    await asyncio.to_thread(rec.on_test, test, "ADDED")
    stored = await h.get(f"{TESTS_URL}/qwen")
    assert stored is not None
    ref = ref_of(stored)
    first_building = threading.Event()
    second_built = threading.Event()
    seen_by_second: list[str | None] = []

    def first(status: TestStatus) -> StatusPatch:
        first_building.set()
        # Without one write at a time, the second write is made and sent meanwhile from the
        # same view, and this one, sent after it, is refused with 409.
        second_built.wait(timeout=2)
        return StatusPatch(TestStatus(message="first"))

    def second(status: TestStatus) -> StatusPatch:
        seen_by_second.append(status.message)
        second_built.set()
        return StatusPatch(TestStatus(message="second"))

    conflicts = REGISTRY.get_sample_value("model_support_status_conflicts_total") or 0.0
    writing_first = asyncio.create_task(asyncio.to_thread(rec.writer.write, ref, first))
    await asyncio.to_thread(first_building.wait, 10)
    await asyncio.to_thread(rec.writer.write, ref, second)
    await writing_first
    assert seen_by_second == ["first"]
    assert (await h.test_status("qwen"))["message"] == "second"
    assert REGISTRY.get_sample_value("model_support_status_conflicts_total") == conflicts


async def test_a_sweep_status_write_carries_the_version_it_was_made_from(
    harness: Harness,
) -> None:
    """As for tests: a sweep's status written from a stale read is refused (409), not applied
    over what another writer wrote meanwhile."""
    from model_support.operator.kube import Conflict

    h = harness
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelSupportSweep",
            "metadata": {"name": "s"}, "spec": {"source": {"models": [{"model": "a/b"}]}}}  # fmt: skip
    read = await h.create(SWEEPS_URL, body)
    await h.patch(f"{SWEEPS_URL}/s/status", {"status": {"message": "another writer"}})
    kube = Kube(api_client(h.settings.api_server))
    stale = read["metadata"]["resourceVersion"]
    with pytest.raises(Conflict):
        await asyncio.to_thread(kube.patch_sweep_status, NS, "s", {"message": "mine"}, stale)
    assert ((await h.get(f"{SWEEPS_URL}/s")) or {})["status"]["message"] == "another writer"
    fresh = ((await h.get(f"{SWEEPS_URL}/s")) or {})["metadata"]["resourceVersion"]
    written = await asyncio.to_thread(kube.patch_sweep_status, NS, "s", {"message": "mine"}, fresh)
    assert written is not None and written["status"]["message"] == "mine"


async def test_a_sweep_status_computed_from_a_stale_view_is_made_again_from_a_fresh_read(
    harness: Harness,
) -> None:
    """The sweep reconciler's own writes carry the version they were computed from: what
    another writer added meanwhile (a condition) is read again and kept, not written over."""
    h = harness
    sweeps = SweepReconciler(h.settings, Kube(api_client(h.settings.api_server)))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": SWEEP_KIND,
        "metadata": {"name": "s"},
        "spec": {"source": {"models": [{"model": "Qwen/Qwen3-0.6B"}]},
                 "stack": {"profile": "trn2"}},
    }  # fmt: skip
    sweep = await h.create(SWEEPS_URL, body)
    sweeps.on_sweep(sweep, None, act=False)  # what this process saw
    audited = {
        "type": "Audited", "status": "True", "reason": "Checked", "message": "by an auditor",
        "lastTransitionTime": now(),
    }  # fmt: skip
    await h.patch(f"{SWEEPS_URL}/s/status", {"status": {"conditions": [audited]}})
    await asyncio.to_thread(sweeps.reconcile, sweep["metadata"]["uid"])
    status = ((await h.get(f"{SWEEPS_URL}/s")) or {})["status"]
    kinds = {c["type"]: c for c in status["conditions"]}
    assert kinds["Audited"]["message"] == "by an auditor"  # not written over
    assert "Ready" in kinds and status["observedGeneration"] == 1  # and the operator's own


# ------------------------------------------------------------------ refused creates


def refuse_creates(plural: str, times: int, status: int, message: str) -> Any:
    """An API server that refuses the first ``times`` creates of ``plural`` with ``status``."""
    left = {"n": times}

    def refuse(request: kmock.Request) -> kmock.KubernetesError | None:
        creating = (
            request.action == kmock.action.CREATE
            and request.resource is not None
            and request.resource.plural == plural
        )
        if not creating or left["n"] <= 0:
            return None
        left["n"] -= 1
        reason = "Forbidden" if status == 403 else "Invalid"
        return kmock.KubernetesError(status=status, reason=reason, message=message)

    return refuse


async def test_a_job_refused_by_a_quota_is_said_once_and_created_when_allowed(
    harness: Harness,
) -> None:
    h = harness
    h.settings.sizing_retry_base_s = 0.2
    quota = (
        'jobs.batch "qwen" is forbidden: exceeded quota: trainium, requested: '
        "count/jobs.batch=1, used: count/jobs.batch=10, limited: count/jobs.batch=10"
    )
    h.k.refusals = (refuse_creates("jobs", 3, 403, quota),)
    await start(h)  # the Job is created once the quota lets it
    events = await h.wait_events("CreateRefused")
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert "exceeded quota: trainium" in events[0]["message"]
    # The Job exists before the status that says so: wait for that status, not any Pending
    # (the retries' own Pending status says JobCreated=False).
    status = await h.wait_status(
        "qwen", lambda s: conditions(s).get("JobCreated", {}).get("status") == "True", "JobCreated"
    )
    assert status["phase"] == "Pending"


async def test_a_job_refused_by_admission_makes_the_test_invalid(harness: Harness) -> None:
    h = harness
    denied = (
        'admission webhook "policy.example.com" denied the request: runner pods must set '
        "resources.limits.cpu"
    )
    h.k.refusals = (refuse_creates("jobs", 100, 422, denied),)
    await h.start_operator()
    await h.create_test("qwen", dict(SPEC))
    status = await h.wait_status(
        "qwen", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=20
    )
    assert "runner pods must set resources.limits.cpu" in status["message"]
    assert records(h) == []
    assert len(await h.wait_events("InvalidSpec")) == 1


async def test_a_program_configmap_refused_by_a_quota_is_said_once_and_no_job_comes_before_it(
    harness: Harness,
) -> None:
    """The namespace's program ConfigMap comes before the Job (its pod mounts it): a quota on
    ConfigMaps is retried and said once, no Job is created while it is refused, and once it is
    allowed both are created (the Job's run.py made from it)."""
    h = harness
    h.settings.sizing_retry_base_s = 0.2
    quota = (
        'configmaps "model-support-run-py" is forbidden: exceeded quota: objects, '
        "limited: configmaps=50"
    )
    created: list[str] = []  # every create of a ConfigMap or a Job, refused or not, in order

    def note(request: kmock.Request) -> None:
        plural = request.resource.plural if request.resource is not None else None
        if request.action == kmock.action.CREATE and plural in ("configmaps", "jobs"):
            created.append(plural)

    h.k.refusals = (note, refuse_creates("configmaps", 3, 403, quota))
    await h.start_operator()
    await h.create_test("qwen", dict(SPEC))
    status = await h.wait_status(
        "qwen", lambda s: conditions(s).get("JobCreated", {}).get("status") == "True", "JobCreated"
    )
    events = await h.wait_events("CreateRefused")
    assert len(events) == 1 and "exceeded quota: objects" in events[0]["message"]
    assert status["phase"] == "Pending"
    # Three refused, the fourth created; the Job only after that, and once.
    assert created == ["configmaps"] * 4 + ["jobs"], created
    [job] = await h.items(JOBS_URL)
    [program], others = await h.configmaps()
    assert others == []
    assert status["configMapName"] == program["metadata"]["name"]
    assert "ownerReferences" not in program["metadata"]  # the namespace's, not the test's
    assert read_config(await h.run_py_of(job)).model == SPEC["model"]


async def test_a_configmap_refused_by_admission_ends_the_test_and_leaves_no_job(
    harness: Harness,
) -> None:
    """A Job whose run.py can never exist would hold its cores waiting for the mount: the
    program ConfigMap comes first, and its refusal ends the test before any Job is made."""
    h = harness
    denied = 'admission webhook "size.example.com" denied the request: ConfigMaps over 64 KiB'
    h.k.refusals = (refuse_creates("configmaps", 100, 422, denied),)
    await h.start_operator()
    await h.create_test("qwen", dict(SPEC))
    status = await h.wait_status(
        "qwen", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=20
    )
    assert "ConfigMaps over 64 KiB" in status["message"]

    async def no_job() -> bool:
        return await h.items(JOBS_URL) == []

    await h.wait_for(no_job, timeout=20, what="the refused test to have no Job")
    assert posts(h, "jobs") == 0  # none was created (and deleted) either
    assert records(h) == []


# ------------------------------------------------------------------ relists


async def test_tests_deleted_while_unseen_leave_the_cache_and_get_no_job(
    harness: Harness,
) -> None:
    h = harness
    rec = reconciler(h)
    kept = await h.create_test("kept", dict(SPEC))
    gone = await h.create_test("gone", dict(SPEC))
    for test in (kept, gone):
        rec.observe_test(test, None)  # listed by the watch, not reconciled yet
    # Deleted while the watch was away (a 410 Gone relist brings no event for it).
    await h.delete(f"{TESTS_URL}/gone")
    watchdog = Watchdog(rec)
    watchdog.note_listing()
    assert await asyncio.to_thread(watchdog.audit) == 1
    assert set(rec.tests) == {kept["metadata"]["uid"]}

    # A test known only from the cache is read before anything is created for it.
    stale = await h.create_test("stale", dict(SPEC))
    rec.observe_test(stale, None)
    await h.delete(f"{TESTS_URL}/stale")
    await asyncio.to_thread(watchdog.retry_tests)  # the watchdog offers what is not handled
    names = {
        j["metadata"]["annotations"]["modelsupport.dev/test-name"] for j in await h.items(JOBS_URL)
    }
    assert names == {"kept"}
    assert stale["metadata"]["uid"] not in rec.tests


async def test_a_stale_view_of_a_test_launched_meanwhile_creates_nothing_again(
    harness: Harness,
) -> None:
    """The watchdog offers what its snapshot shows unhandled; a test launched by an event since
    (or by another replica) must not get a second Job create (a 409 to adopt), nor a second
    create of the program ConfigMap."""
    h = harness
    rec = reconciler(h)
    before = await h.create_test("qwen", dict(SPEC))
    rec.observe_test(before, None)
    await asyncio.to_thread(rec.on_test, before, "ADDED")  # the event launches it
    assert (posts(h, "jobs"), posts(h, "configmaps")) == (1, 1)
    # The watchdog's snapshot, taken before the launch, and the same test as the API listed it
    # to another replica: neither creates anything again.
    await asyncio.to_thread(rec.reconcile, before, from_cache=True)
    other = reconciler(h)
    other.observe_test(before, None)
    await asyncio.to_thread(Watchdog(other).retry_tests)
    assert (posts(h, "jobs"), posts(h, "configmaps")) == (1, 1)
    assert len(await h.items(JOBS_URL)) == 1


async def test_a_sweep_deleted_while_unseen_creates_no_tests(harness: Harness) -> None:
    h = harness
    h.settings.sweep_status_interval_s = 0.1
    sweeps = SweepReconciler(h.settings, Kube(api_client(h.settings.api_server)))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": SWEEP_KIND,
        "metadata": {"name": "gone"},
        "spec": {"source": {"models": [{"model": "Qwen/Qwen3-0.6B"}]},
                 "stack": {"profile": "trn2"}},
    }  # fmt: skip
    sweep = await h.create(SWEEPS_URL, body)
    sweeps.on_sweep(sweep, None, act=False)  # listed while waiting for leadership
    await h.delete(f"{SWEEPS_URL}/gone")  # and deleted while the watch was away
    await asyncio.sleep(0.5)
    await asyncio.to_thread(sweeps.tick)
    assert await h.items(TESTS_URL) == []
    sweeps.note_listing()
    await asyncio.to_thread(sweeps.audit)
    assert sweeps.sweeps == {}


# ------------------------------------------------------------------ leadership


async def test_two_replicas_act_as_one_and_the_other_takes_over(harness: Harness) -> None:
    h = harness
    h.k.history = None  # every request is kept: the test counts them
    await h.start_operator()
    leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases/model-support-operator"

    async def held() -> Any:
        lease = await h.get(leases)
        return lease and lease["spec"].get("holderIdentity")

    first = await h.wait_for(held, what="the Lease held")
    second = OperatorThread(h.settings)
    watches = h._watches()
    second.start()
    await asyncio.to_thread(second.ready.wait, 15)
    await h.wait_for(lambda: h._watches()[0] > watches[0], what="the second replica's watches")
    try:
        await h.create_test("qwen", dict(SPEC))
        [job] = await h.wait_job()
        pod = await h.start_pod(job)
        await h.run_pod(pod)
        await h.end_pod(job, pod, exit_code=1, log=runner_log(Result.FAIL))
        await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
        # One replica acted: one (program) ConfigMap and one Job created, one result Event.
        assert (posts(h, "configmaps"), posts(h, "jobs")) == (1, 1)
        assert len(await h.wait_events("Failed")) == 1
        assert len(records(h)) == 1

        # The leader stops (a rolling update): it gives the Lease up, the other takes over.
        await h.stop_operator()
        await h.wait_for(lambda: held_by_other(h, leases, first), what="the other replica leading")
        await h.create_test("second", dict(SPEC))
        await h.wait_job(count=2)
    finally:
        await asyncio.to_thread(second.stop)


async def held_by_other(h: Harness, url: str, first: str) -> bool:
    lease = await h.get(url)
    holder = (lease or {}).get("spec", {}).get("holderIdentity")
    return bool(holder) and holder != first


# ------------------------------------------------------------------ sweep status writes


async def test_a_sweep_status_patch_leaves_out_an_unchanged_ranking(
    sh: Harness,  # noqa: F811
) -> None:
    rankings: list[bool] = []

    def observe(request: kmock.Request) -> None:
        if (
            request.method.value == "PATCH"
            and request.resource is not None
            and request.resource.plural == SWEEP_PLURAL
            and request.subresource == "status"
        ):
            rankings.append("ranking" in ((request.data or {}).get("status") or {}))

    sh.k.observers = (observe,)
    await start_sweeps(sh)
    models = [{"model": model_id(i)} for i in range(6)]
    async with Kubelet(sh, sh.results) as kubelet:
        await create_sweep(
            sh,
            "lean",
            {"source": {"models": models}, "template": {"cores": 1},
             "concurrency": {"maxRunning": 2}},
        )  # fmt: skip
        await wait_sweep(sh, "lean", lambda s: ready(s) and s["counts"]["done"] == 6, "6 done")
        assert kubelet.error is None, kubelet.error
    # The ranking goes with the patch that sets it, and with no other.
    assert len(rankings) >= 3 and rankings.count(True) == 1, rankings


# ------------------------------------------------------------------ what etcd keeps


async def test_every_attempt_is_released_and_the_namespace_keeps_one_program_configmap(
    harness: Harness,
) -> None:
    h = harness
    test, first = await start(h)
    # The node went away with the pod: the operator retries in a new Job.
    await h.finish_job(first, exit_code=1, job_condition=("Failed", "PodFailurePolicy"))
    await h.wait_status("qwen", lambda s: s.get("attempt") == 2, "attempt 2")
    [second] = [j for j in await h.wait_job(count=2) if j["metadata"]["name"].endswith("-a2")]
    pod = await h.start_pod(second)
    await h.run_pod(pod)
    await h.end_pod(second, pod, exit_code=0, log=runner_log(Result.PASS))
    await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")

    async def released() -> list[dict[str, Any]] | None:
        jobs = await h.items(JOBS_URL)
        done = all("modelsupport.dev/recorded" in j["metadata"]["labels"] for j in jobs)
        return jobs if done else None

    jobs = await h.wait_for(released, what="both attempts' Jobs released")
    assert len(jobs) == 2
    # Kept the setting from now on: the TTL controller counts from each Job's finish, so each
    # gets the (here short) time since it finished on top.
    setting = h.settings.ttl_seconds_after_finished
    assert all(setting <= j["spec"]["ttlSecondsAfterFinished"] <= setting + 120 for j in jobs)

    # etcd keeps no run.py per test or attempt: another test launched after these two attempts
    # mounts the same program ConfigMap, the only ConfigMap in the namespace, owned by nothing
    # (no test's deletion, no Job's collection takes it from the others).
    other_test = await h.create_test("other", dict(SPEC))
    [third] = await h.wait_job(name=child_name("other", other_test["metadata"]["uid"], 1, 1))
    [program], others = await h.configmaps()
    assert others == []
    assert "ownerReferences" not in program["metadata"]
    name = program["metadata"]["name"]
    mounted = {
        v["configMap"]["name"]
        for j in [*jobs, third]
        for v in j["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }
    assert mounted == {name}
    other = await h.wait_status("other", lambda s: s.get("phase") == "Pending", "Pending")
    assert (await h.test_status("qwen"))["configMapName"] == other["configMapName"] == name
    assert test["metadata"]["uid"] not in str(program)


# ------------------------------------------------------------------ placeable cores


async def test_a_pod_holds_placeable_cores_and_both_counts_are_recorded(
    harness: Harness,
) -> None:
    h = harness
    h.settings.scheduler_name = "neuron-scheduler"
    spec = {**SPEC, "cores": 8, "parallelism": "tensor"}  # 2 trn2 devices: not placeable
    await h.start_operator()
    await h.create_test("qwen", spec)
    # Sizing a tensor-parallel plan reads the model's config with transformers (its first
    # import in this process is slow on a loaded machine).
    [job] = await h.wait_for(lambda: h.items(JOBS_URL), what="the Job", timeout=240)
    runner = job["spec"]["template"]["spec"]["containers"][0]
    assert runner["resources"]["limits"]["aws.amazon.com/neuroncore"] == "16"  # 4 devices
    assert job["spec"]["template"]["spec"]["schedulerName"] == "neuron-scheduler"
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    assert (status["cores"], status["podCores"]) == (8, 16)
    pod = await h.start_pod(job)
    await h.end_pod(
        job,
        pod,
        exit_code=0,
        log=runner_log(Result.PASS, cores=8, parallelism="tensor", timings={"total_s": 60.0}),
    )
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    [record] = records(h)
    assert record.document.cores == 8 and record.labels["pod_cores"] == "16"
    # The run is priced by the cores its pod held, idle ones included, in the status and the
    # dataset alike.
    held = held_seconds(record.document)
    assert held is not None and held > 0
    assert status["coreSeconds"] == pytest.approx(16 * held, rel=1e-3)
    [row] = records_to_table([record], [matrix_key(record)]).to_pylist()
    assert row["core_seconds"] == pytest.approx(16 * held, rel=1e-3)


async def test_multi_core_pods_without_the_scheduler_extension_are_refused(
    harness: Harness,
) -> None:
    h = harness
    assert h.settings.scheduler_name is None and h.settings.neuron_dra is None
    await h.start_operator()
    await h.create_test("qwen", {**SPEC, "cores": 2, "parallelism": "tensor"})
    status = await h.wait_status(
        "qwen", lambda s: s.get("phase") == "Invalid", "Invalid", timeout=240
    )  # sizing a tensor-parallel plan imports transformers (slow on a loaded machine)
    assert "runner.schedulerName" in status["message"] and "neuron.dra" in status["message"]
    assert await h.items(JOBS_URL) == [] and records(h) == []


async def test_a_run_that_ends_at_once_is_written_completed_without_running(
    harness: Harness,
) -> None:
    h = harness
    h.k.history = None
    # Far longer than the pod's few steps below take, even on a loaded machine.
    h.settings.running_write_delay_s = 20.0
    _, job = await start(h)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    running_since = time.monotonic()
    await h.end_pod(job, pod, exit_code=0, log=runner_log(Result.PASS))
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Completed", "Completed")
    # The one write says when the run started too (the Job's start, as Running would have).
    assert status["result"] == "PASS" and status.get("startedAt")
    # Past the delay (counted from when the operator saw the pod run): nothing is written
    # after Completed.
    await asyncio.sleep(max(0.0, running_since + 22.0 - time.monotonic()))
    writes = [
        r.data["status"].get("phase")
        for r in h.k[kmock.method.PATCH]
        if r.resource is not None and r.resource.plural == PLURAL and r.subresource == "status"
    ]
    assert writes == ["Pending", "Completed"]
