"""kopf handlers: the thin layer between kopf's events and the :class:`Reconciler`.

Both kinds are watched with event handlers only: the reconciler is level-based (state in the
test's status, children named deterministically), so kopf persists nothing of its own on the
tests (no progress or diff-base annotations: one API request less per test), and the watchdog
offers again what an event could not finish.

Handlers are synchronous on purpose: the reconciler uses the blocking Kubernetes client and the
results store, and kopf runs synchronous handlers in its thread pool, off its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

from model_support.operator import metrics, notifications
from model_support.operator.bisect_reconciler import BisectReconciler
from model_support.operator.kube import Kube, api_client
from model_support.operator.leader import Leadership, default_identity, lease_namespace
from model_support.operator.reconciler import Reconciler
from model_support.operator.resource import (
    BISECT_PLURAL,
    GROUP,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    PLURAL,
    SWEEP_PLURAL,
    VERSION,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.sweep_reconciler import SweepReconciler, run_ticker
from model_support.operator.watchdog import Watchdog

log = logging.getLogger(__name__)


HANDLER_WORKERS = 12
"""kopf's handler threads (its executor for the sync handlers)."""


class EventsOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """The diff-base of an operator whose resource handlers are all ``on.event`` (see
    :func:`build_registry`): kopf builds one for every event it processes (a deep copy of the
    object, a Job's whole pod template included), but only change handlers (``on.create``,
    ``on.update``, ...) and daemons read it. An empty essence leaves each event's diff empty
    and saves the copy (a tenth of the operator's time at a thousand tests)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def build_registry(settings: OperatorSettings, kube: Kube | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers (a fresh one per operator, tests included).

    With leader election (the default) every replica watches, and only the one holding the
    Lease acts: the others keep what they see current and take over from it (see leader.py).
    """
    registry = kopf.OperatorRegistry()
    settings_ = settings
    kube = kube or Kube(
        api_client(settings.api_server),
        request_timeout_s=settings.request_timeout_s,
        page_size=settings.list_page_size,
    )
    reconciler = Reconciler(settings, kube)
    checks = Watchdog(reconciler)
    sweeps = SweepReconciler(settings, kube)
    bisects = BisectReconciler(settings, kube)
    notifications.configure(settings)
    watchdog: dict[str, asyncio.Task[None]] = {}
    leadership = Leadership(
        # A client of its own, without urllib3's retries: each Lease call ends within its
        # timeout (a quarter of the renew deadline), so a round cannot outlast the deadline.
        api_client(settings.api_server, pool_size=2, retries=False),
        namespace=lease_namespace(settings.lease_namespace),
        name=settings.lease_name,
        identity=default_identity(),
        lease_s=settings.lease_duration_s,
        renew_deadline_s=settings.lease_renew_deadline_s,
        retry_s=settings.lease_retry_s,
        request_timeout_s=settings.request_timeout_s,
    )
    if not settings.leader_election:
        leadership.lead_alone()

    def resume_as_leader() -> None:
        with leadership.acting() as leading:
            if leading:
                resume(reconciler, checks, sweeps)
                for uid in list(bisects.bisects):
                    bisects.reconcile(uid)

    def take_over() -> None:
        # Level-based: the new leader brings every test and sweep it watched while waiting
        # to where it should be (what happened meanwhile is in the API, not in events). In a
        # thread of its own: the Lease's renewals must not wait for it.
        threading.Thread(
            target=resume_as_leader, name="model-support take-over", daemon=True
        ).start()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Progress and diff-base go to annotations, so the status schema stays strict.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = EventsOnlyDiffBase(prefix=GROUP)
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.loggers = False  # our own Events only, not one per handler log line
        # Enough handlers in flight to cover the API's and the Hub's round trips; more only
        # contend for the interpreter (32 took 16 s to launch 1,000 tests where 12 take 13 s).
        settings.execution.max_workers = HANDLER_WORKERS
        settings.peering.standalone = True
        # Watching named namespaces needs no list of the cluster's namespaces or CRDs (kopf's
        # scanning), which the chart's per-namespace rights do not grant: the namespaces are
        # served as named, the resources as discovered at startup (kopf's ScanningSettings).
        settings.scanning.disabled = bool(reconciler.settings.namespaces)
        # Every call has a deadline; lists are fetched in pages.
        settings.networking.request_timeout = reconciler.settings.request_timeout_s
        settings.networking.connect_timeout = min(10.0, reconciler.settings.request_timeout_s)
        settings.watching.server_timeout = reconciler.settings.watch_timeout_s
        settings.watching.client_timeout = reconciler.settings.watch_timeout_s + 30
        settings.watching.chunk_size = reconciler.settings.list_page_size
        # Only our Jobs travel from the API server: the selector is applied there, not here.
        settings.watching.label_selectors["batch", "jobs"] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        watchdog["task"] = asyncio.create_task(
            _watchdog(checks, (sweeps.audit, bisects.tick), leadership),
            name="model-support watchdog",
        )
        watchdog["sweeps"] = asyncio.create_task(
            run_ticker(sweeps, lambda: _as_leader(leadership, sweeps.tick)),
            name="model-support sweeps",
        )
        watchdog["running"] = asyncio.create_task(
            _flush_running(reconciler, leadership), name="model-support running phases"
        )
        if settings_.leader_election:
            watchdog["leader"] = asyncio.create_task(
                _elect(leadership, take_over), name=ELECTION_TASK
            )
            watchdog["leader"].add_done_callback(_election_ended)

    @kopf.on.probe(id="loops", registry=registry)
    def loops_alive(**_: Any) -> str:
        # kopf's liveness endpoint fails (HTTP 500) when a probe raises: the kubelet then
        # restarts the operator. A loop that ended (or an election whose rounds stopped
        # coming) would otherwise leave a replica that watches and never acts, or acts alone.
        return _check_loops(watchdog, leadership if settings_.leader_election else None)

    @kopf.on.cleanup(registry=registry)
    async def stop_watchdog(**_: Any) -> None:
        for name in ("leader", "running", "task", "sweeps"):
            task = watchdog.pop(name, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if settings_.leader_election:
            await asyncio.to_thread(leadership.release)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if settings.api_server is not None:
            return kopf.ConnectionInfo(server=settings.api_server, insecure=True)
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def test_event(event: kopf.RawEvent, type: str | None, **_: Any) -> None:
        # Level-based: every event (type None: listed at startup) brings the test's current
        # generation to its Job; nothing but the status is written (no kopf annotations).
        test = _plain(event)
        metrics.observe_test(
            str(test["metadata"].get("uid")),
            (test.get("status") or {}).get("phase"),
            deleted=type == "DELETED",
        )
        if type is None:  # listed: at startup or after a relist
            checks.note_listing()
        with leadership.acting() as leading:
            if not leading:  # waiting for the Lease: only keep the view current
                reconciler.observe_test(test, type)
                sweeps.on_test(test, type, act=False)
                return
            reconciler.on_test(test, type)
            sweeps.on_test(test, type)  # a sweep's test: its sweep may go on
            bisects.on_test(test, type)  # a bisect's step: its search may go on

    @kopf.on.event(GROUP, VERSION, SWEEP_PLURAL, registry=registry)
    def sweep_event(event: kopf.RawEvent, type: str | None, **_: Any) -> None:
        # Level-based like tests: the ranking and the tests it made are in the API.
        if type is None:
            sweeps.note_listing()
        with leadership.acting() as leading:
            sweeps.on_sweep(_plain(event), type, act=leading)

    @kopf.on.event(GROUP, VERSION, BISECT_PLURAL, registry=registry)
    def bisect_event(event: kopf.RawEvent, type: str | None, **_: Any) -> None:
        # Level-based: the plan, the steps' tests and their records are in the API and stores.
        with leadership.acting() as leading:
            bisects.on_bisect(_plain(event), type, act=leading)

    @kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
    def job_event(event: kopf.RawEvent, type: str | None, **_: Any) -> None:
        # type None: the Job was listed when the watch (re)started, e.g. after an operator restart.
        if type is None:  # a listing says nothing of Jobs deleted meanwhile: the audit looks
            checks.note_listing()
        with leadership.acting() as leading:
            if leading:  # a replica that takes over resyncs every Job it did not act on
                reconciler.on_job(_plain(event), type or "LISTED")

    return registry


def _plain(event: kopf.RawEvent) -> dict[str, Any]:
    """The event's object as plain nested dicts, which the manifest builders and readers expect.

    It is the object kopf's watch parsed from the API's JSON for this event alone, and kopf
    reads it only through its own view: it is the handler's to keep, with no copy (a copy
    of every Job's pod template, twice through JSON, was a fortieth of the operator's time).
    """
    return dict(event["object"])


def resume(reconciler: Reconciler, checks: Watchdog, sweeps: SweepReconciler) -> None:
    """Bring everything watched so far to where it should be (on becoming the leader); Jobs
    deleted while another replica led are found by the watchdog's next audit."""
    checks.note_listing()
    for test in reconciler.writer.snapshot():
        reconciler.on_test(test, None)
    checks.resync_jobs()
    for uid in list(sweeps.sweeps):
        sweeps.reconcile(uid)


ELECTION_TASK = "model-support leader election"
LOOP_TASKS = {"task": "watchdog", "sweeps": "sweeps", "running": "running phases"}


async def _elect(leadership: Leadership, on_gained: Callable[[], None]) -> None:
    """The election's rounds, for ever: a round's error is a failed round (Leadership.step
    logs it), and whatever else goes wrong between rounds is logged and retried, so the loop
    ends only when it is cancelled (the operator stopping)."""
    while True:
        wait = leadership.retry_s
        try:
            wait = await asyncio.to_thread(leadership.step, on_gained)
        except Exception:
            log.exception("leader election: a round could not run; retrying in %s s", wait)
        await asyncio.sleep(wait)


def _election_ended(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return  # the operator is stopping
    log.critical(
        "leader election ended (%r): this replica no longer renews or acquires the Lease; the "
        "liveness probe fails so that it is restarted", task.exception(),
    )  # fmt: skip


def _check_loops(tasks: dict[str, asyncio.Task[None]], leadership: Leadership | None) -> str:
    """The liveness probe: every loop of the operator runs, and the election's rounds keep
    coming (within the lease duration plus the renew deadline: a round is bounded by the
    renew deadline). Raises kopf.PermanentError (the endpoint answers 500) otherwise."""
    if not tasks:
        return "starting"  # the startup handler has not made the loops yet
    for key, what in [("leader", "leader election"), *LOOP_TASKS.items()]:
        task = tasks.get(key)
        if key == "leader" and leadership is None:
            continue
        if task is None or task.done():
            raise kopf.PermanentError(f"the {what} loop is not running")
    if leadership is not None and leadership.last_round_at is not None:
        silent = time.monotonic() - leadership.last_round_at
        if silent > leadership.lease_s + leadership.renew_deadline_s:
            raise kopf.PermanentError(
                f"the leader election's last round ended {silent:.0f} s ago (rounds come every "
                f"{leadership.retry_s:g} s)"
            )
    return "ok"


async def _flush_running(reconciler: Reconciler, leadership: Leadership) -> None:
    interval = max(0.1, min(1.0, reconciler.settings.running_write_delay_s / 2))
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(_as_leader, leadership, reconciler.flush_running)
        except Exception:
            log.exception("writing Running phases failed; retrying in %s s", interval)


async def _watchdog(
    checks: Watchdog, more: tuple[Callable[[], object], ...], leadership: Leadership
) -> None:
    interval = checks.settings.watchdog_interval_s
    while True:
        await asyncio.sleep(interval)
        if not leadership.is_leading():
            continue
        for check in (*checks.checks(), *more):
            try:
                await asyncio.to_thread(_as_leader, leadership, check)
            except Exception:
                # The next round tries again; an API hiccup must not stop the watchdog for good.
                log.exception("the watchdog's check failed; retrying in %s s", interval)


def _as_leader(leadership: Leadership, check: Callable[[], object]) -> None:
    with leadership.acting() as leading:
        if leading:
            check()


__all__ = ["build_registry"]
