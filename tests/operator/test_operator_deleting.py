"""Deleting is not failing: a test or sweep being deleted is never recorded, re-created or
re-launched.

The harness plays the garbage collector's foreground deletion (Argo CD's prune default) as the
API server does it: the owner gets ``metadata.deletionTimestamp`` and the ``foregroundDeletion``
finalizer and stays, its dependents are deleted first (their DELETED events arrive while the
owner still exists), then the finalizer goes and so does the owner.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
from k8s_harness import JOBS_URL, NS, PODS_URL, TESTS_URL, Harness, now
from test_operator_lifecycle import records, start
from test_sweeps import SWEEPS_URL, children_of, create_sweep, model_id, sh, sweep_hub  # noqa: F401
from test_sweeps import start as start_sweeps

from model_support.operator.resource import GROUP, PLURAL, VERSION


async def begin_foreground_deletion(h: Harness, url: str) -> None:
    """What the API server does on a foreground DELETE of an object with dependents: the
    foregroundDeletion finalizer, then deletionTimestamp (the object stays)."""
    await h.patch(url, {"metadata": {"finalizers": ["foregroundDeletion"]}})
    await h.delete(url)


async def finish_foreground_deletion(h: Harness, url: str) -> None:
    """The garbage collector removes the finalizer once the dependents are gone; the object
    goes with it."""
    await h.patch(url, {"metadata": {"finalizers": []}})
    assert await h.get(url) is None


def creates(h: Harness, plural: str) -> int:
    return sum(
        1
        for r in h.k[kmock.action.CREATE]
        if r.resource is not None and r.resource.plural == plural
    )


async def quiet(h: Harness, rounds: int = 8) -> None:
    """Let the operator act on what it saw (events, then several watchdog rounds)."""
    await asyncio.sleep(rounds * h.settings.watchdog_interval_s)


async def test_a_test_in_foreground_deletion_is_not_recorded_when_its_job_goes(
    harness: Harness,
) -> None:
    h = harness
    h.k.history = None  # keep every request: the test counts creates
    _, job = await start(h)
    pod = await h.start_pod(job)
    await h.run_pod(pod)
    await h.wait_status("qwen", lambda s: s.get("phase") == "Running", "Running")

    test_url = f"{TESTS_URL}/qwen"
    await begin_foreground_deletion(h, test_url)
    # The garbage collector deletes the dependents first: the Job (its pod stopped) ...
    await h.delete(f"{JOBS_URL}/{job['metadata']['name']}")
    await h.delete(f"{PODS_URL}/{pod['metadata']['name']}")
    await quiet(h)
    # ... while the test still exists, being deleted: nothing recorded, nothing re-launched.
    test = await h.get(test_url)
    assert test is not None and test["metadata"]["deletionTimestamp"]
    assert records(h) == []
    assert test["status"]["phase"] == "Running" and "result" not in test["status"]
    assert creates(h, "jobs") == 1
    assert [e["reason"] for e in await h.events() if e["type"] == "Warning"] == []
    await finish_foreground_deletion(h, test_url)
    await quiet(h)
    assert records(h) == [] and creates(h, "jobs") == 1


async def test_a_test_created_already_being_deleted_is_never_sized_or_launched(
    harness: Harness,
) -> None:
    h = harness
    await h.start_operator()
    # E.g. listed after an operator restart while its foreground deletion was waiting.
    await h.create_test(
        "doomed",
        {"model": "Qwen/Qwen3-0.6B", "profile": "trn2", "cores": 1},
        deletionTimestamp=now(),
        finalizers=["foregroundDeletion"],
    )
    await quiet(h)
    assert await h.items(JOBS_URL) == []
    test = await h.get(f"{TESTS_URL}/doomed")
    assert test is not None and not test.get("status")


async def test_a_sweep_in_foreground_deletion_does_not_recreate_its_tests(
    sh: Harness,  # noqa: F811
) -> None:
    h = sh
    await start_sweeps(h)
    models = [{"model": model_id(i)} for i in range(3)]
    await create_sweep(
        h,
        "prune",
        {"source": {"models": models}, "stack": {"profile": "trn2"},
         "concurrency": {"maxRunning": 3}},
    )  # fmt: skip
    await h.wait_for(lambda: len(children_of(h, "prune")) == 3, what="3 tests")
    tests_made = creates_of(h)

    sweep_url = f"{SWEEPS_URL}/prune"
    await begin_foreground_deletion(h, sweep_url)
    for test in children_of(h, "prune"):  # the garbage collector deletes the tests first
        await h.delete(
            f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/{test['metadata']['name']}"
        )
    await quiet(h)
    assert children_of(h, "prune") == []  # none made again while the sweep waits to go
    assert creates_of(h) == tests_made
    await finish_foreground_deletion(h, sweep_url)
    await quiet(h)
    assert children_of(h, "prune") == [] and creates_of(h) == tests_made


def creates_of(h: Harness) -> int:
    """Tests the operator created (counted by kmock's operator request counter)."""
    counted: dict[str, Any] = dict(h.k.operator_requests)
    return int(counted.get("POST modelsupporttests", 0))
