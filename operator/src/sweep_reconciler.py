"""The operator's logic for ModelSupportSweeps: a ranking becomes owned ModelSupportTests, at
most ``maxRunning`` unfinished at once; their results become the sweep's counts.

State lives in the API: the ranking the sweep works from is in its status, its tests are
found by label and owner, each test's name is derived from the sweep and the model, and a
create that meets 409 adopts what is there. What this process keeps in memory is a ledger of
the sweep's tests, filled by listing them from the API (once per sweep after a start, and every
``sweep_resync_s`` while work is left) and kept current by the watch and by its own writes. The
ledger can only lag behind the API by showing a test as unfinished longer than it is, so a
decision taken from it never exceeds the cap; a restarted operator lists before it creates
anything, so it neither exceeds the cap nor makes a second test for a model.

Methods are synchronous: kopf runs them in its thread pool (the sweep's tick from the watchdog
task, through ``asyncio.to_thread``). One sweep is reconciled by one thread at a time; an event
that arrives meanwhile makes that thread go round once more.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from model_support.operator import metrics, notifications
from model_support.operator.kube import AlreadyExists, Conflict, Kube, being_deleted
from model_support.operator.one_at_a_time import OneAtATime
from model_support.operator.planning import InvalidTest, check_store_allowed, store_uri
from model_support.operator.resource import (
    ANNOTATION_CONFIRMS,
    ANNOTATION_MODEL,
    ANNOTATION_SWEEP_RUN,
    LABEL_SWEEP,
    SWEEP_KIND,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.operator.status import MESSAGE_LIMIT, Phase, TestStatus, set_condition
from model_support.operator.status_writer import CONFLICT_TRIES
from model_support.operator.sweep_confirmation import INVALID, Judged, Run, judge
from model_support.operator.sweep_manifests import build_child, child_name, rerun_name, rerun_patch
from model_support.operator.sweep_spec import (
    HUB_SORTS,
    PLACEHOLDER_MODEL,
    SkippedModel,
    SweepModel,
    SweepSpec,
    admitted,
    child_spec,
    describe_source,
    image_of,
    parse_sweep,
    run_key,
    source_key,
    stack_of,
)
from model_support.operator.sweep_status import (
    MAX_LISTED_REGRESSIONS,
    MAX_LISTED_SKIPPED,
    RankingState,
    SweepBaseline,
    SweepCost,
    SweepCounts,
    SweepState,
    SweepStatus,
    sweep_conditions,
)
from model_support.ranking_snapshots import RankingSnapshot
from model_support.vocabulary import Result, is_fix, is_regression

log = logging.getLogger(__name__)

_RESULT_COUNTS = {
    Result.PASS.value: "passed",
    Result.FAIL.value: "failed",
    Result.ERROR.value: "errored",
    Result.TIMEOUT.value: "timedOut",
    Result.EXCLUDED.value: "excluded",
    Result.UNVERIFIED.value: "unverified",
}
_DONE_PHASES = (Phase.COMPLETED.value, Phase.INVALID.value)


class RankingFailure(Exception):
    """The source could not be read now (Hub unreachable, no selected list yet): retried."""


@dataclass(frozen=True)
class ChildView:
    """What the sweep needs to know of one of its tests."""

    name: str
    uid: str
    model: str
    run_key: str | None
    generation: int
    observed_generation: int | None
    phase: str | None
    result: str | None
    spec_fields: frozenset[str]
    resource_version: str
    core_seconds: float | None = None
    cost_usd: float | None = None
    confirms: str | None = None
    """A re-run's: the name of the test whose worse result it re-runs (None: a model's test)."""
    run_id: str | None = None

    @classmethod
    def of(cls, test: dict[str, Any]) -> ChildView:
        meta = test.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = TestStatus.read(test.get("status"))
        spec = test.get("spec") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid") or "",
            model=annotations.get(ANNOTATION_MODEL) or str(spec.get("model") or ""),
            run_key=annotations.get(ANNOTATION_SWEEP_RUN),
            generation=int(meta.get("generation") or 1),
            observed_generation=status.observedGeneration,
            phase=status.phase.value if status.phase is not None else None,
            result=status.result.value if status.result is not None else None,
            spec_fields=frozenset(spec),
            resource_version=str(meta.get("resourceVersion") or ""),
            core_seconds=status.coreSeconds,
            cost_usd=status.costUSD,
            confirms=annotations.get(ANNOTATION_CONFIRMS),
            run_id=status.runId,
        )

    @functools.cached_property
    def done(self) -> bool:
        """Finished: its current generation is Completed (a result) or Invalid."""
        return self.observed_generation == self.generation and self.phase in _DONE_PHASES

    @functools.cached_property
    def active(self) -> bool:
        """Counts against the cap: created and not finished, whatever its phase."""
        return not self.done

    @functools.cached_property
    def counted(self) -> tuple[Any, ...]:
        """What a sweep's pass reads of it: whether (and how) it finished, under which run
        key. A move between unfinished phases (Pending, Running) changes no count and no
        slot, so it makes no pass (each pass goes over every ranked model)."""
        if not self.done:
            return (False, self.run_key)
        return (
            True, self.run_key, self.phase, self.result, self.run_id, self.core_seconds,
            self.cost_usd,
        )  # fmt: skip


def _newer(candidate: str, known: str) -> bool:
    if candidate.isdigit() and known.isdigit():
        return int(candidate) >= int(known)
    return True  # opaque resourceVersions: the latest seen wins


def sweep_owner(test: dict[str, Any]) -> str | None:
    """The uid of the sweep that controls ``test``, or None."""
    for ref in (test.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == SWEEP_KIND and ref.get("controller"):
            return str(ref.get("uid"))
    return None


@dataclass(frozen=True)
class _Ranked:
    """A sweep's ranking with its models and their tests' names, in ranking order: each pass
    reads them all, so they are made once per ranking."""

    sweep: str
    ranking: RankingState
    models: frozenset[str]
    tests: tuple[str, ...]
    test_set: frozenset[str]


@dataclass
class _Ledger:
    """The tests of one sweep as this process knows them."""

    children: dict[str, ChildView] = field(default_factory=dict)
    listed_at: float | None = None


CREATES_AT_ONCE = 8
"""Test creates (or re-run patches) of one sweep pass in flight at once."""


@dataclass
class SweepReconciler:
    """Reconciles ModelSupportSweeps; see the module docstring."""

    settings: OperatorSettings
    kube: Kube

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.sweeps: dict[str, dict[str, Any]] = {}
        """Every watched sweep by uid, as last seen (watch events and our own writes)."""
        self._ledgers: dict[str, _Ledger] = {}
        self._runs = OneAtATime()
        self._creates = ThreadPoolExecutor(CREATES_AT_ONCE, thread_name_prefix="sweep-create")
        """Where a pass's test creates go out together (a sweep's pace is not one round trip
        per test)."""
        self._dirty: set[str] = set()
        self._conflicts: dict[str, int] = {}
        """Status writes refused in a row with 409, per sweep (each makes a fresh read)."""
        self._written_at: dict[str, float] = {}
        self._ranking_retry: dict[str, tuple[float, float]] = {}  # uid -> (next at, delay)
        self._stores: dict[str, Any] = {}
        self._seen_at: dict[str, float] = {}
        """When the API last showed each sweep to exist (an event, a write's answer, a read)."""
        self._listed = False
        self._audited_at = 0.0
        self._rankings: dict[str, tuple[dict[str, Any], RankingState | None]] = {}
        """Per sweep, the ranking its status holds (as read) and that ranking parsed: up to
        thousands of models, parsed once rather than on every pass (see :meth:`_read_status`)."""
        self._names: dict[str, _Ranked] = {}
        """Per sweep, the ranking it works from with its tests' names (see :meth:`_ranked`)."""

    # ---------------------------------------------------------------- events

    def on_sweep(self, body: dict[str, Any], event_type: str | None, *, act: bool = True) -> None:
        """A sweep changed (or was listed at startup: ``event_type`` None); ``act`` False:
        only keep what this process knows of it (a replica waiting for leadership)."""
        uid = (body.get("metadata") or {}).get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self.forget(uid, body)
            return  # its tests go with it (owner references); their records stay
        self._observe(body)
        if not act or being_deleted(body):
            return  # being deleted: its tests go as the garbage collector deletes them
        self.reconcile(uid)

    def forget(self, uid: str, body: dict[str, Any] | None = None) -> None:
        """Drop a sweep that no longer exists from what this process keeps, and its metrics
        (``body``: the sweep as last seen, when the caller has it)."""
        with self._lock:
            known = self.sweeps.get(uid)
            for table in (
                self.sweeps, self._ledgers, self._written_at, self._ranking_retry, self._seen_at,
                self._conflicts, self._rankings, self._names,
            ):  # fmt: skip
                table.pop(uid, None)
            self._dirty.discard(uid)
        meta = (body or known or {}).get("metadata") or {}
        if meta.get("name"):
            metrics.forget_sweep(str(meta.get("namespace")), str(meta["name"]))

    def note_listing(self) -> None:
        """The watch listed the sweeps (startup or relist): the next :meth:`audit` checks
        which of those this process knows no longer exist (a listing says nothing of them)."""
        self._listed = True

    def audit(self) -> int:
        """After a listing (and every ``cache_audit_s``): drop sweeps that no longer exist."""
        if not self._listed and time.monotonic() - self._audited_at < self.settings.cache_audit_s:
            return 0
        self._listed = False
        with self._lock:
            known = set(self.sweeps)
        namespaces: list[str | None] = (
            list(self.settings.namespaces) if self.settings.namespaces else [None]
        )
        listed = {
            str(s["metadata"].get("uid")) for ns in namespaces for s in self.kube.list_sweeps(ns)
        }
        gone = known - listed
        for uid in gone:
            self.forget(uid)
        self._audited_at = time.monotonic()
        return len(gone)

    def _exists(self, body: dict[str, Any]) -> bool:
        """Whether the sweep still exists and is not being deleted: what the API showed in the
        last few seconds, else asked now (nothing is created for an owner that is gone)."""
        uid = body["metadata"]["uid"]
        with self._lock:
            seen = self._seen_at.get(uid)
        fresh_s = _SEEN_FRESH_INTERVALS * self.settings.sweep_status_interval_s
        if seen is not None and time.monotonic() - seen < fresh_s:
            return not being_deleted(body)
        fresh = self.kube.get_sweep(body["metadata"]["namespace"], body["metadata"]["name"])
        if fresh is None or fresh["metadata"].get("uid") != uid:
            self.forget(uid)
            return False
        self._observe(fresh)
        return not being_deleted(fresh)

    def on_test(self, body: dict[str, Any], event_type: str | None, *, act: bool = True) -> None:
        """A test changed: if a sweep owns it, keep its ledger current and let the sweep go on
        when the test finished (or vanished); ``act`` False: the ledger only."""
        uid = sweep_owner(body)
        if uid is None:
            return
        view = ChildView.of(body)
        with self._lock:
            ledger = self._ledgers.setdefault(uid, _Ledger())
            known = ledger.children.get(view.name)
            if event_type == "DELETED":
                if known is not None and known.uid == view.uid:
                    del ledger.children[view.name]
                changed = known is not None
            elif known is None or _newer(view.resource_version, known.resource_version):
                ledger.children[view.name] = view
                changed = known is None or known.counted != view.counted
            else:
                changed = False
            wanted = act and changed and uid in self.sweeps
        if wanted and event_type == "DELETED" and not self._sweep_stays(uid, body):
            return  # its sweep is gone or being deleted: nothing is created again
        if wanted:
            self.reconcile(uid)

    def _sweep_stays(self, uid: str, test: dict[str, Any]) -> bool:
        """Whether the sweep that owned ``test`` still exists and is not being deleted, as the
        API says now (a test of a sweep in foreground deletion goes while the sweep exists, and
        the sweep's own event may come later)."""
        owner = next(
            ref.get("name")
            for ref in test["metadata"].get("ownerReferences") or []
            if ref.get("uid") == uid
        )
        fresh = self.kube.get_sweep(test["metadata"]["namespace"], owner)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            self.forget(uid)
            return False
        self._observe(fresh)
        return not being_deleted(fresh)

    def tick(self) -> int:
        """Reconcile sweeps with something due: a status write held back, a ranking to
        refresh or retry, a resync. Returns how many were reconciled."""
        due = []
        clock = time.monotonic()
        with self._lock:
            for uid, body in self.sweeps.items():
                if uid in self._dirty or self._due(uid, body, clock):
                    due.append(uid)
        for uid in due:
            try:
                self.reconcile(uid)
            except Exception:
                log.exception("reconciling sweep %s failed; the next tick tries again", uid)
        return len(due)

    def _due(self, uid: str, body: dict[str, Any], clock: float) -> bool:
        status = self._read_status(uid, body)
        retry = self._ranking_retry.get(uid)
        if retry is not None:
            return clock >= retry[0]
        if status.is_true("Ready"):
            return self._refresh_due(body, status)
        ledger = self._ledgers.get(uid)
        return ledger is None or ledger.listed_at is None or (
            clock - ledger.listed_at >= self.settings.sweep_resync_s
        ) or self._refresh_due(body, status)  # fmt: skip

    def _refresh_due(self, body: dict[str, Any], status: SweepStatus) -> bool:
        try:
            spec = parse_sweep(dict(body.get("spec") or {}))
        except SpecError:
            return False
        refresh = spec.source.refresh_seconds
        if refresh is None or status.ranking is None:
            return False
        interval = max(float(refresh), self.settings.sweep_min_refresh_s)
        return _age_s(status.ranking.fetchedAt) >= interval

    # ---------------------------------------------------------------- one sweep

    def reconcile(self, uid: str) -> None:
        """Bring one sweep forward; a concurrent call makes the running one go round again."""
        self._runs.run(uid, lambda: self._reconcile(uid))

    def _reconcile(self, uid: str) -> None:
        body = self.sweeps.get(uid)
        if body is None or being_deleted(body):
            return
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        status = self._read_status(uid, body)
        try:
            spec = parse_sweep(dict(body.get("spec") or {}))
            check_store_allowed(
                parse_spec(child_spec(spec, _PLACEHOLDER, image=None)), self.settings
            )
        except (SpecError, InvalidTest) as exc:
            self._publish(body, self._invalid(status, generation, str(exc)), urgent=True)
            return
        key = run_key(spec, self.settings)
        wanted_source = source_key(spec, key)
        ranking = status.ranking
        stale = ranking is None or ranking.sourceKey != wanted_source
        waiting = False
        if stale or self._refresh_due(body, status):
            fresh = self._rank(body, spec, key, wanted_source, status)
            if fresh is not None:
                ranking = fresh
            elif stale:
                waiting = True  # show where the old ranking stands; start nothing until ranked
        if ranking is None:
            status.observedGeneration, status.runKey, status.epoch = generation, key, spec.epoch
            status.source = describe_source(spec)
            said = status.condition("Ranked")
            message = (said.message if said else None) or "ranking the source"
            status.message = message[:MESSAGE_LIMIT]
            status.conditions = _typed(
                sweep_conditions(status.condition_dicts(), "ranking", generation, message)
            )
            self._publish(body, status, urgent=True)
            return
        children = self._children(uid, meta["namespace"], meta["name"])
        ranked = self._ranked(uid, meta["name"], ranking)
        # Before any test is re-run under a new key: what the previous key's tests gave.
        status.baseline = baseline_for(status, key, children, ranked.models)
        # Judged before the pass's creates: what they add (unfinished tests) changes no verdict.
        judged = confirmations(spec, key, ranked, children, status.baseline)
        if not waiting:
            self._fill_slots(body, spec, key, ranked, children, judged)
        status = self._status(
            body, spec, key, ranked, self._ledger_view(uid), status, generation, judged,
            waiting=waiting,
        )  # fmt: skip
        self._publish(body, status)

    # ---------------------------------------------------------------- ranking

    def _rank(
        self,
        body: dict[str, Any],
        spec: SweepSpec,
        key: str,
        wanted_source: str,
        status: SweepStatus,
    ) -> RankingState | None:
        """Rank the source now; store the snapshot; None (and a retry later) on failure."""
        uid = body["metadata"]["uid"]
        clock = time.monotonic()
        with self._lock:
            retry = self._ranking_retry.get(uid)
        if retry is not None and clock < retry[0]:
            return None
        meta = body["metadata"]
        try:
            entries, skipped, snapshot = self.rank(spec, key)
        except RankingFailure as exc:
            delay = min(self.settings.retry_cap_s, retry[1] * 2 if retry else 5.0)
            with self._lock:
                self._ranking_retry[uid] = (clock + delay, delay)
            message = f"{exc}; trying again in {delay:g} s"
            log.warning("sweep %s/%s: %s", meta["namespace"], meta["name"], message)
            first = status.reason("Ranked") != "RankingFailed"
            status.conditions = _typed(
                set_condition(
                    status.condition_dicts(),
                    "Ranked",
                    False,
                    "RankingFailed",
                    message,
                    int(meta.get("generation") or 1),
                )
            )
            if first:
                self.kube.post_event(body, "Warning", "RankingFailed", message[:MESSAGE_LIMIT])
            return None
        with self._lock:
            self._ranking_retry.pop(uid, None)
        snapshot = snapshot.model_copy(
            update={"sweep": f"{meta['namespace']}/{meta['name']}", "epoch": spec.epoch}
        )
        where: str | None
        try:
            where = self.store(spec).add_ranking_snapshot(snapshot)
        except Exception as exc:  # the store's failure must not stop the tests: say so, go on
            where = None
            log.warning("sweep %s: the ranking snapshot could not be stored: %s", uid, exc)
            self.kube.post_event(
                body, "Warning", "SnapshotNotStored",
                f"the ranking snapshot could not be stored in the results store: {exc}"[
                    :MESSAGE_LIMIT
                ],
            )  # fmt: skip
        fetched = snapshot.taken_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        ranking = RankingState(
            source=snapshot.source,
            sourceKey=wanted_source,
            fetchedAt=fetched,
            models=entries,
            skipped=skipped[:MAX_LISTED_SKIPPED],
            skippedCount=len(skipped),
            snapshot=where,
        )
        message = f"ranked {len(entries)} models from {snapshot.source}"
        if skipped:
            message += f"; {skipped_message(skipped)}"
            log.warning("sweep %s/%s: %s", meta["namespace"], meta["name"], message)
            self.kube.post_event(body, "Warning", "ModelsSkipped", message[:MESSAGE_LIMIT])
        status.conditions = _typed(
            set_condition(
                status.condition_dicts(),
                "Ranked",
                True,
                "Ranked",
                message,
                int(meta.get("generation") or 1),
            )
        )
        self.kube.post_event(body, "Normal", "Ranked", message)
        return ranking

    def rank(
        self, spec: SweepSpec, key: str
    ) -> tuple[list[SweepModel], list[SkippedModel], RankingSnapshot]:
        """The sweep's models in order, those skipped because the API server would refuse
        their tests, and the snapshot that records the models tested; raises RankingFailure
        when the source cannot be read now."""
        from model_support.ranking_snapshots import now as snapshot_now

        source = spec.source
        taken_at = snapshot_now()
        common: dict[str, Any] = {
            "source": describe_source(spec),
            "run_key": key,
            "stack": stack_of(spec, self.settings),
        }
        if source.models is not None:
            entries = [
                SweepModel(model=m.model, revision=m.revision, task=m.task) for m in source.models
            ]
            extra: dict[str, Any] = {"kind": "models"}
        elif source.hub is not None:
            from model_support.rankings import RankingError, fetch_ranking

            hub = source.hub
            try:
                ranking = fetch_ranking(
                    hub.task.value,
                    HUB_SORTS[hub.sort],  # type: ignore[arg-type]
                    limit=hub.limit,
                    endpoint=self.settings.hub_endpoint or os.environ.get("HF_ENDPOINT"),
                    library=hub.library,
                )
            except RankingError as exc:
                raise RankingFailure(str(exc)) from exc
            entries = [SweepModel(model=m.model_id, task=hub.task) for m in ranking.models]
            taken_at = ranking.fetched_at
            extra = {
                "kind": "hub", "task": hub.task.value, "sort": ranking.sort, "limit": hub.limit,
                "library": hub.library, "endpoint": ranking.endpoint,
            }  # fmt: skip
        else:
            from model_support.selection import SelectionError, load_selected

            uri = (
                source.selected.results if source.selected else None
            ) or self.settings.results_uri
            try:
                selected, where = load_selected(uri)
            except (SelectionError, OSError) as exc:
                raise RankingFailure(f"the selected list could not be read: {exc}") from exc
            if selected is None:
                raise RankingFailure(f"there is no selected list ({where})")
            entries = [
                SweepModel(model=e.model, task=e.task) for e in selected.models if e.reason is None
            ]
            extra = {"kind": "selected"}
        unique: dict[str, SweepModel] = {}
        for entry in entries:
            unique.setdefault(entry.model, entry)  # a model listed twice is tested once
        models, skipped = admitted(
            spec, list(unique.values()), image_of(spec, self.settings), self.settings
        )
        snapshot = RankingSnapshot(
            taken_at=taken_at, models=[m.model for m in models], **common, **extra
        )
        return models, skipped, snapshot

    def store(self, spec: SweepSpec) -> Any:
        """The results store of the sweep's tests (where its snapshots go too)."""
        from model_support.store import ResultsStore

        uri = store_uri(parse_spec(child_spec(spec, _PLACEHOLDER, image=None)), self.settings)
        with self._lock:
            if uri not in self._stores:
                self._stores[uri] = ResultsStore(uri)
            return self._stores[uri]

    # ---------------------------------------------------------------- the sweep's tests

    def _children(self, uid: str, namespace: str, name: str) -> dict[str, ChildView]:
        """The ledger, listed from the API first when it is not known or due a resync."""
        with self._lock:
            ledger = self._ledgers.setdefault(uid, _Ledger())
            fresh = ledger.listed_at is not None and (
                time.monotonic() - ledger.listed_at < self.settings.sweep_resync_s
            )
        if not fresh:
            listed = {
                view.name: view
                for view in (
                    ChildView.of(t)
                    for t in self.kube.list_tests(namespace, {LABEL_SWEEP: name})
                    if sweep_owner(t) == uid
                )
            }
            with self._lock:
                # Only this thread creates this sweep's tests; what the watch brought while the
                # list was read may be newer than the list.
                for child_name_, known in ledger.children.items():
                    view = listed.get(child_name_)
                    if view is not None and not _newer(
                        view.resource_version, known.resource_version
                    ):
                        listed[child_name_] = known
                ledger.children = listed
                ledger.listed_at = time.monotonic()
        return self._ledger_view(uid)

    def _ledger_view(self, uid: str) -> dict[str, ChildView]:
        with self._lock:
            return dict(self._ledgers.setdefault(uid, _Ledger()).children)

    def _remember(self, uid: str, test: dict[str, Any]) -> None:
        view = ChildView.of(test)
        with self._lock:
            ledger = self._ledgers.setdefault(uid, _Ledger())
            known = ledger.children.get(view.name)
            if known is None or _newer(view.resource_version, known.resource_version):
                ledger.children[view.name] = view

    def _fill_slots(
        self,
        body: dict[str, Any],
        spec: SweepSpec,
        key: str,
        ranked: _Ranked,
        children: dict[str, ChildView],
        judged: Judged,
    ) -> None:
        """Create (or re-run) tests while slots are free: first the re-runs a worse result
        still needs (``judged.missing``: what the run's report waits for), then the ranked
        models' tests, best ranked first.

        Never touches an unfinished test: a model that left the ranking keeps running, and a
        test of an earlier run key is re-run only once it finished.
        """
        sweep = body["metadata"]["name"]
        free = spec.concurrency.maxRunning - sum(1 for c in children.values() if c.active)
        if free <= 0:
            return  # no slot

        models = ranked.ranking.models

        def startable() -> Iterator[tuple[str, SweepModel, int | None, ChildView | None]]:
            wanted = itertools.chain(
                (
                    (rerun_name(sweep, entry.model, number), entry, number)
                    for entry in models
                    for number in judged.missing.get(entry.model, ())
                ),
                ((test, entry, None) for test, entry in zip(ranked.tests, models, strict=True)),
            )
            for name, entry, rerun in wanted:
                child = children.get(name)
                if child is None or not (child.active or child.run_key == key):
                    yield name, entry, rerun, child

        def start(item: tuple[str, SweepModel, int | None, ChildView | None]) -> int:
            return self._start_child(body, spec, key, *item)

        # Best ranked first, a slot's worth at a time (read no further down the ranking than
        # the slots reach); each batch's creates go out together (one at a time, the API
        # server's round trip would set a sweep's pace).
        starts = startable()
        batch = list(itertools.islice(starts, free))
        if not batch or not self._exists(body):
            return  # nothing to start, or the sweep is gone or being deleted
        while batch:
            # One create (a pass after one test finished) goes out from this thread: through
            # the pool it would cost a future and two thread switches for nothing.
            free -= start(batch[0]) if len(batch) == 1 else sum(self._creates.map(start, batch))
            batch = list(itertools.islice(starts, free)) if free > 0 else []

    def _start_child(
        self,
        body: dict[str, Any],
        spec: SweepSpec,
        key: str,
        name: str,
        entry: SweepModel,
        rerun: int | None,
        child: ChildView | None,
    ) -> int:
        """Create the test of ``entry`` (or re-run ``child``); the slots it takes (0 or 1)."""
        meta = body["metadata"]
        uid = meta["uid"]
        if child is None:
            try:
                created = self.kube.create_test(
                    build_child(body, spec, entry, key, self.settings, rerun)
                )
            except AlreadyExists:
                existing = self._adopt(uid, meta["namespace"], name)
                if existing is None:
                    return 0  # another sweep's (a deleted predecessor's) test: not ours
                return 1 if ChildView.of(existing).active else 0
            self._remember(uid, created)
            return 1
        patch = rerun_patch(spec, entry, key, self.settings, set(child.spec_fields))
        patched = self.kube.patch_test(meta["namespace"], name, patch)
        if patched is None:
            return 0  # deleted meanwhile: the watch says so, the next pass creates it
        self._remember(uid, patched)
        return 1

    def _adopt(self, uid: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A 409 on create: the test exists (made before a restart); ours if we own it."""
        existing = self.kube.get_test(namespace, name)
        if existing is None or sweep_owner(existing) != uid:
            log.warning(
                "test %s/%s exists and is not this sweep's; leaving it alone", namespace, name
            )
            return None
        self._remember(uid, existing)
        return existing

    # ---------------------------------------------------------------- status

    def _status(
        self,
        body: dict[str, Any],
        spec: SweepSpec,
        key: str,
        ranked: _Ranked,
        children: dict[str, ChildView],
        previous: SweepStatus,
        generation: int,
        judged: Judged,
        *,
        waiting: bool = False,
    ) -> SweepStatus:
        ranking = ranked.ranking
        # One walk of the ranking (every pass makes one): counted in a Counter, not field by
        # field of the validated model.
        tally: collections.Counter[str] = collections.Counter()
        current: list[ChildView] = []  # the ranked models' tests finished under this key
        for test_name in ranked.tests:
            child = children.get(test_name)
            if child is None or (child.done and child.run_key != key):
                tally["queued"] += 1
            elif child.done:
                tally["done"] += 1
                current.append(child)
                if child.phase == Phase.INVALID.value:
                    tally["invalid"] += 1
                elif child.result in _RESULT_COUNTS:
                    tally[_RESULT_COUNTS[child.result]] += 1
        counts = SweepCounts(models=len(ranking.models), skipped=ranking.skippedCount, **tally)
        counts.running = sum(1 for c in children.values() if c.active)
        counts.retained = sum(
            1 for n, c in children.items() if n not in ranked.test_set and not c.confirms
        )
        regressed = judged.regressions
        counts.regressions = len(regressed)
        counts.confirming = len(judged.confirming)
        counts.flaky = len(judged.flaky)
        counts.fixes = sum(
            1
            for c in current
            if previous.baseline is not None
            and is_fix(previous.baseline.results.get(c.model), c.result)
        )
        reruns = [c for c in children.values() if c.confirms and c.done and c.run_key == key]
        finished = (
            counts.done == counts.models
            and counts.running == 0
            and not counts.confirming
            and not waiting
        )
        state: SweepState = "ranking" if waiting else "done" if finished else "testing"
        message = (
            f"{counts.done} of {counts.models} models tested ({counts.passed} PASS, "
            f"{counts.failed} FAIL, {counts.errored} ERROR, {counts.timedOut} TIMEOUT, "
            f"{counts.excluded} EXCLUDED, {counts.invalid} invalid); {counts.running} running, "
            f"{counts.queued} queued"
            + (f", {counts.retained} retained from earlier rankings" if counts.retained else "")
            + (f"; {skipped_message(ranking.skipped, counts.skipped)}" if counts.skipped else "")
            + (
                f"; {counts.regressions} regression(s) and {counts.fixes} fix(es) against the "
                "previous run"
                + (
                    f" ({counts.confirming} worse result(s) being re-run before they count)"
                    if counts.confirming
                    else ""
                )
                + (f", {counts.flaky} flaky (runs that disagree)" if counts.flaky else "")
                if previous.baseline is not None
                else ""
            )
        )
        reported = previous.regressionsReported
        if state == "done" and regressed and reported != key:
            reported = key  # _publish posts the one Event of this run when it writes this
        if waiting:
            said = previous.condition("Ranked")
            message = f"waiting for a new ranking ({said.message if said else None}); " + message
        conditions = sweep_conditions(previous.condition_dicts(), state, generation, message)
        return SweepStatus(
            observedGeneration=generation,
            runKey=key,
            epoch=spec.epoch,
            source=describe_source(spec),
            lastRankedAt=ranking.fetchedAt,
            ranking=ranking,
            counts=counts,
            baseline=previous.baseline,
            regressions=regressed[:MAX_LISTED_REGRESSIONS],
            flaky=judged.flaky[:MAX_LISTED_REGRESSIONS],
            regressionsReported=reported,
            cost=cost_of(current + reruns),
            message=message[:MESSAGE_LIMIT],
            conditions=_typed(conditions),
        )

    def _invalid(self, status: SweepStatus, generation: int, message: str) -> SweepStatus:
        status.observedGeneration = generation
        status.message = message[:MESSAGE_LIMIT]
        status.conditions = _typed(
            sweep_conditions(status.condition_dicts(), "invalid", generation, message)
        )
        return status

    def _publish(self, body: dict[str, Any], status: SweepStatus, *, urgent: bool = False) -> None:
        """Write the status when it changed: at once when its conditions, generation or
        ranking changed, else at most every ``sweep_status_interval_s`` (the tick writes what
        was held back)."""
        meta = body["metadata"]
        uid = meta["uid"]
        old = body.get("status") or {}
        if self._stored_ranking(uid, old, status):
            # Up to thousands of models: a merge patch that leaves it out leaves it as it is.
            new = status.patch(ranking=False)
            old = {k: v for k, v in old.items() if k != "ranking"}
        else:
            new = status.patch()
        # What the API server stores of the patch: its nulls remove fields.
        if _stored(old) == _stored(new):
            with self._lock:
                self._dirty.discard(uid)
            return
        urgent = urgent or any(
            old.get(k) != new.get(k) for k in ("observedGeneration", "runKey", "lastRankedAt")
        ) or _condition_states(old) != _condition_states(new)  # fmt: skip
        clock = time.monotonic()
        with self._lock:
            last = self._written_at.get(uid)
            if (
                not urgent
                and last is not None
                and clock - last < self.settings.sweep_status_interval_s
            ):
                self._dirty.add(uid)
                return
            self._written_at[uid] = clock
            self._dirty.discard(uid)
        body_patch = dict(new)
        if "ranking" in new and _stored(old.get("ranking")) == _stored(new.get("ranking")):
            body_patch.pop("ranking")  # a ranking made again, the same as the stored one
        try:
            # Computed from this version of the sweep: applied to no other (409 otherwise).
            patched = self.kube.patch_sweep_status(
                meta["namespace"], meta["name"], body_patch, meta.get("resourceVersion")
            )
        except Conflict:
            self._conflicted(uid, meta["namespace"], meta["name"])
            return
        with self._lock:
            self._conflicts.pop(uid, None)
        if patched is not None:
            self._observe(patched)
        metrics.observe_sweep(meta["namespace"], meta["name"], status)
        if new.get("regressionsReported") and new.get("regressionsReported") != old.get(
            "regressionsReported"
        ):
            self.kube.post_event(
                body, "Warning", "Regressions", regressions_message(status)[:MESSAGE_LIMIT]
            )
            notifications.notifier().tell(notifications.sweep_regressions(body, status))
        if status.is_true("Ready") and _condition_states(old).get("Ready") != "True":
            self.kube.post_event(
                body, "Normal", "Done", str(new.get("message") or "")[:MESSAGE_LIMIT]
            )
            notifications.notifier().tell(notifications.sweep_finished(body, status))

    def _conflicted(self, uid: str, namespace: str, name: str) -> None:
        """A status write met a newer sweep (another writer, a spec or label change): read it
        again and reconcile again from what it says (:meth:`reconcile` goes round once more),
        up to ``CONFLICT_TRIES`` times in a row; then the tick tries again."""
        metrics.STATUS_CONFLICTS.inc()
        fresh = self.kube.get_sweep(namespace, name)
        with self._lock:
            self._written_at.pop(uid, None)  # nothing was written
            tries = self._conflicts.get(uid, 0) + 1
            self._conflicts[uid] = tries
            if tries < CONFLICT_TRIES:
                self._runs.again(uid)
            else:
                self._conflicts.pop(uid, None)
                self._dirty.add(uid)
        if fresh is None or fresh["metadata"].get("uid") != uid:
            self.forget(uid)
            return
        self._observe(fresh)
        if tries >= CONFLICT_TRIES:
            log.warning(
                "sweep %s/%s: the status write kept conflicting (%d tries); the next tick "
                "retries it", namespace, name, tries,
            )  # fmt: skip

    def _ranked(self, uid: str, sweep: str, ranking: RankingState) -> _Ranked:
        """``ranking``'s models and their tests' names, made once per ranking object."""
        known = self._names.get(uid)
        if known is not None and known.ranking is ranking and known.sweep == sweep:
            return known
        tests = tuple(child_name(sweep, entry.model) for entry in ranking.models)
        made = _Ranked(
            sweep, ranking, frozenset(e.model for e in ranking.models), tests, frozenset(tests)
        )
        self._names[uid] = made
        return made

    def _read_status(self, uid: str, body: dict[str, Any]) -> SweepStatus:
        """The sweep's status, parsed; its ranking is parsed again only when it changed (a
        pass follows every test that finishes, and a ranking holds up to thousands of models).
        The parsed ranking is never changed in place: a new ranking is a new object."""
        raw = dict(body.get("status") or {})
        stored = raw.pop("ranking", None)
        status = SweepStatus.read(raw)
        if stored:
            known = self._rankings.get(uid)
            if known is not None and (known[0] is stored or known[0] == stored):
                status.ranking = known[1]
            else:
                status.ranking = SweepStatus.read({"ranking": stored}).ranking
                self._rankings[uid] = (stored, status.ranking)
        return status

    def _stored_ranking(self, uid: str, old: dict[str, Any], status: SweepStatus) -> bool:
        """Whether ``status``'s ranking is the one ``old`` (the status as stored) holds, known
        without comparing them model by model: the very object parsed from it."""
        known = self._rankings.get(uid)
        stored = old.get("ranking")
        return (
            known is not None
            and status.ranking is not None
            and status.ranking is known[1]
            and stored is not None
            and (known[0] is stored or known[0] == stored)
        )

    def _observe(self, body: dict[str, Any]) -> None:
        uid = body["metadata"]["uid"]
        with self._lock:
            self._seen_at[uid] = time.monotonic()
            known = self.sweeps.get(uid)
            rv = str(body["metadata"].get("resourceVersion") or "")
            if known is None or _newer(rv, str(known["metadata"].get("resourceVersion") or "")):
                self.sweeps[uid] = body


_PLACEHOLDER = SweepModel(model=PLACEHOLDER_MODEL)
_SEEN_FRESH_INTERVALS = 3
"""How recently (in sweep status intervals: a busy sweep writes its status that often) the API
must have shown a sweep for it to be trusted to exist without a read."""


def baseline_for(
    status: SweepStatus, key: str, children: dict[str, ChildView], ranked: AbstractSet[str]
) -> SweepBaseline | None:
    """What this run key's results are compared with: when the key changes, each ranked
    model's result under an earlier key (its test finished and not yet re-run; else the old
    baseline's entry)."""
    if status.runKey is None or status.runKey == key:
        return status.baseline
    old = status.baseline.results if status.baseline is not None else {}
    results = {model: result for model, result in old.items() if model in ranked}
    for child in children.values():
        if (
            child.model in ranked
            and child.confirms is None  # a re-run's result is judged with its test's
            and child.done
            and child.run_key not in (None, key)
            and child.result is not None
        ):
            results[child.model] = child.result
    return SweepBaseline(runKey=status.runKey, results=results) if results else status.baseline


def confirmations(
    spec: SweepSpec,
    key: str,
    ranked: _Ranked,
    children: dict[str, ChildView],
    baseline: SweepBaseline | None,
) -> Judged:
    """The current run's worse results against ``baseline``, judged by their re-runs
    (``sweep_confirmation.judge``): confirmed, flaky, or waiting for re-runs."""
    if baseline is None:
        return Judged()  # nothing to be worse than
    first: dict[str, Run] = {}
    reruns: dict[str, list[Run | None]] = {}

    def run(child: ChildView | None) -> Run | None:
        if child is None or child.run_key != key:
            return None  # not made yet, or made under an earlier run key
        result = INVALID if child.done and child.phase == Phase.INVALID.value else child.result
        return Run(done=child.done, result=result if child.done else None, run_id=child.run_id)

    for test_name, entry in zip(ranked.tests, ranked.ranking.models, strict=True):
        child = children.get(test_name)
        if child is None or not child.done or entry.model not in baseline.results:
            continue  # only a finished run can be worse, and only than a result it had
        found = run(child)
        if found is None or not is_regression(baseline.results[entry.model], found.result):
            continue
        # Every pass goes over every model: only a worse result has re-runs to judge by.
        first[entry.model] = found
        reruns[entry.model] = [
            run(children.get(rerun_name(ranked.sweep, entry.model, number)))
            for number in range(1, spec.confirm.reruns + 1)
        ]
    return judge(baseline, first, reruns, spec.confirm.reruns)


def cost_of(current: list[ChildView]) -> SweepCost:
    """What the current run key's finished tests cost so far."""
    priced = [c.cost_usd for c in current if c.cost_usd is not None]
    return SweepCost(
        coreHours=round(sum(c.core_seconds or 0.0 for c in current) / 3600, 6),
        usd=round(sum(priced), 6) if priced else None,
        unpriced=sum(1 for c in current if c.cost_usd is None and c.result is not None),
    )


def skipped_message(skipped: list[SkippedModel], total: int | None = None) -> str:
    """The skipped models in words: how many, and the first few by name with why."""
    total = len(skipped) if total is None else total
    named = "; ".join(f"{s.model} ({s.reason})" for s in skipped[:3])
    more = f"; and {total - 3} more" if total > 3 else ""
    return (
        f"skipped {total} model(s) the API server would refuse a test of "
        f"(status.ranking.skipped): {named}{more}"
    )


def regressions_message(status: SweepStatus) -> str:
    """The Event of a run with regressions: how many, against which run key, and which, each
    with the runs that agree on it."""
    listed = "; ".join(
        f"{r.model} {r.before} -> {r.after} ({len(r.runs)} run(s) agree)"
        for r in status.regressions
    )
    more = status.counts.regressions - len(status.regressions)
    against = status.baseline.runKey if status.baseline is not None else "the previous run"
    return (
        f"{status.counts.regressions} regression(s) against run {against}: {listed}"
        + (f" (and {more} more)" if more > 0 else "")
        + (f"; {status.counts.flaky} flaky, not counted" if status.counts.flaky else "")
    )


def _typed(conditions: list[dict[str, Any]]) -> list[Any]:
    from model_support.operator.status import Condition

    return [Condition.model_validate(c) for c in conditions]


def _stored(value: Any) -> Any:
    """A merge patch as the API server stores it: null fields are absent."""
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored(v) for v in value]
    return value


def _condition_states(status: dict[str, Any]) -> dict[str, str]:
    return {c.get("type"): c.get("status") for c in status.get("conditions") or []}


def _age_s(stamp: str) -> float:
    from datetime import UTC, datetime

    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (datetime.now(UTC) - when).total_seconds()


async def run_ticker(sweeps: SweepReconciler, tick: Callable[[], object] | None = None) -> None:
    """Call :meth:`SweepReconciler.tick` (or ``tick``: the operator's, gated by leadership)
    every ``sweep_status_interval_s``, off the loop."""
    interval = min(sweeps.settings.sweep_status_interval_s, sweeps.settings.watchdog_interval_s)
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(tick or sweeps.tick)
        except Exception:
            log.exception("the sweeps' tick failed; trying again in %s s", interval)


__all__ = ["ChildView", "RankingFailure", "SweepReconciler", "run_ticker", "sweep_owner"]
