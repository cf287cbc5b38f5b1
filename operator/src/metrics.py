"""Prometheus metrics of the operator (served on /metrics by the `model-support operator` command).

Besides the counters of what the operator did, gauges answer the questions a dashboard or an
alert asks: the pass rate of each stack in the results store and the newest stacks' confirmed
regressions against the stack before each (refreshed after every materialize), how many tests
are in each phase, and each sweep's regressions against its previous run and its cost so far
(the chart's PrometheusRule example alerts on both regression counts).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter as Tally
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from model_support.history import ReleaseReport
    from model_support.operator.sweep_status import SweepStatus
    from model_support.store import ResultsStore


TESTS = Counter(
    "model_support_tests_total",
    "Tests recorded by the operator, by result and error class (or exclusion reason).",
    ["result", "detail"],
)
WALL_SECONDS = Histogram(
    "model_support_test_wall_seconds",
    "Load + compile + generate time of recorded tests (seconds).",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
MATERIALIZE_SECONDS = Histogram(
    "model_support_materialize_seconds",
    "Materializations of a results store's matrix (after records arrive), by how long each took "
    "(seconds): in a burst the next starts no sooner than twice that later.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
JOBS_CREATED = Counter(
    "model_support_jobs_created_total", "Runner Jobs created (retries included)."
)
RETRIES = Counter(
    "model_support_node_loss_retries_total",
    "Runner Jobs re-created after an attempt ended without a verdict (its node lost, its backstop "
    "deadline spent waiting).",
)
STATUS_CONFLICTS = Counter(
    "model_support_status_conflicts_total",
    "Status writes (tests, sweeps) refused with 409 (the object changed since it was read); "
    "each is read again.",
)

STACK_LABELS = ["compiler", "compiler_version", "library", "library_version"]
PASS_RATE = Gauge(
    "model_support_pass_rate",
    "Share of the models that ran on a stack (EXCLUDED left out) whose latest result is PASS.",
    STACK_LABELS,
)
STACK_RESULTS = Gauge(
    "model_support_stack_results",
    "Models per latest result on a stack (the matrix file of the stack).",
    [*STACK_LABELS, "result"],
)
RELEASE_REGRESSIONS = Gauge(
    "model_support_release_regressions",
    "Confirmed regressions of a stack (a release) against the stack before it: models whose "
    "worse result re-runs confirmed (model-support regressions' policy). A new release opens "
    "a new series, so alert on its level, not on a change of it.",
    STACK_LABELS,
)
RELEASE_FLAKY = Gauge(
    "model_support_release_flaky",
    "Models whose runs on a stack disagree (never counted as regressions or fixes).",
    STACK_LABELS,
)
RELEASES_JUDGED = 2
"""After each materialize, the newest this many stacks are compared with the stack before each
(the older ones keep the figures they were given when they were new)."""
TESTS_BY_PHASE = Gauge(
    "model_support_tests_by_phase",
    "ModelSupportTests the operator watches, by phase (None: not reconciled yet).",
    ["phase"],
)
SWEEP_REGRESSIONS = Gauge(
    "model_support_sweep_regressions",
    "Models of a sweep whose result got worse than under its previous run key, confirmed by "
    "every re-run.",
    ["namespace", "sweep"],
)
SWEEP_FLAKY = Gauge(
    "model_support_sweep_flaky",
    "Models of a sweep whose worse result a re-run did not repeat (neither regression nor fix).",
    ["namespace", "sweep"],
)
SWEEP_FIXES = Gauge(
    "model_support_sweep_fixes",
    "Models of a sweep that did not pass under its previous run key and now pass.",
    ["namespace", "sweep"],
)
SWEEP_COST_USD = Gauge(
    "model_support_sweep_cost_usd",
    "What a sweep's finished tests of its current run cost so far (priced tests only).",
    ["namespace", "sweep"],
)
SWEEP_CORE_HOURS = Gauge(
    "model_support_sweep_core_hours",
    "Core-hours a sweep's finished tests of its current run held so far.",
    ["namespace", "sweep"],
)

_lock = threading.Lock()
_phases: dict[str, str] = {}
_stacks: set[tuple[str, ...]] = set()


def observe_test(uid: str, phase: str | None, deleted: bool) -> None:
    """A test was seen (or deleted): keep ``model_support_tests_by_phase`` current."""
    with _lock:
        before = Tally(_phases.values())
        if deleted:
            _phases.pop(uid, None)
        else:
            _phases[uid] = phase or "None"
        after = Tally(_phases.values())
        for name in set(before) | set(after):
            TESTS_BY_PHASE.labels(name).set(after.get(name, 0))


def observe_sweep(namespace: str, name: str, status: SweepStatus) -> None:
    """A sweep's status was written: its regressions, fixes and cost as gauges."""
    SWEEP_REGRESSIONS.labels(namespace, name).set(status.counts.regressions)
    SWEEP_FLAKY.labels(namespace, name).set(status.counts.flaky)
    SWEEP_FIXES.labels(namespace, name).set(status.counts.fixes)
    SWEEP_CORE_HOURS.labels(namespace, name).set(status.cost.coreHours)
    SWEEP_COST_USD.labels(namespace, name).set(status.cost.usd or 0.0)


def forget_sweep(namespace: str, name: str) -> None:
    """A sweep was deleted: its series go."""
    for gauge in (SWEEP_REGRESSIONS, SWEEP_FLAKY, SWEEP_FIXES, SWEEP_CORE_HOURS, SWEEP_COST_USD):
        with contextlib.suppress(KeyError):  # never observed: nothing to remove
            gauge.remove(namespace, name)


def observe_stacks(store: ResultsStore) -> None:
    """After a materialize: each stack's pass rate and result counts from its matrix file."""
    seen: set[tuple[str, ...]] = set()
    for matrix_file in store.matrix_files():
        labels = tuple(str(getattr(matrix_file, name) or "unknown") for name in STACK_LABELS)
        with store.fs.open(store.fs._strip_protocol(matrix_file.path), "rb") as handle:
            results = pq.read_table(handle, columns=["result"]).column("result").to_pylist()
        counts: dict[str, Any] = dict(Tally(str(r) for r in results))
        ran = sum(n for result, n in counts.items() if result != "EXCLUDED")
        if ran:
            PASS_RATE.labels(*labels).set(counts.get("PASS", 0) / ran)
        for result, n in counts.items():
            STACK_RESULTS.labels(*labels, str(result)).set(n)
        seen.add(labels)
    with _lock:
        for labels in _stacks - seen:  # a stack whose file is gone
            for gauge in (PASS_RATE, RELEASE_REGRESSIONS, RELEASE_FLAKY):
                with contextlib.suppress(KeyError):  # it had no model that ran
                    gauge.remove(*labels)
        _stacks.clear()
        _stacks.update(seen)


def observe_releases(store: ResultsStore) -> list[ReleaseReport]:
    """The newest stacks' confirmed regressions and flaky models against the stack before
    each (``model_support_release_regressions``, ``model_support_release_flaky``); their
    reports."""
    from model_support.evidence import shareable_uri
    from model_support.history import (
        Confirmation,
        Thresholds,
        previous_stack,
        read_stack_runs,
        read_stacks,
        release_report,
    )
    from model_support.pricing import DEFAULT_PRICES

    if not store.fs.exists(store.history_path()):
        return []
    known = read_stacks(store)
    releases = []
    for info in known[-RELEASES_JUDGED:]:
        before = previous_stack(info.stack, known)
        chosen = [info.stack] if before is None else [before, info.stack]
        release = release_report(
            read_stack_runs(store, chosen), info.stack, before, Thresholds(), DEFAULT_PRICES,
            confirmation=Confirmation(), results=shareable_uri(store),
        )  # fmt: skip
        labels = [str(getattr(info.stack, name) or "unknown") for name in STACK_LABELS]
        RELEASE_REGRESSIONS.labels(*labels).set(len(release.regressions))
        RELEASE_FLAKY.labels(*labels).set(len(release.flaky))
        releases.append(release)
    return releases
