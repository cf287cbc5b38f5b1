"""The watchdog: what no event reports, looked for every ``watchdog_interval_s``.

kopf does not retry event handlers, a watch that relists brings no event for what went
meanwhile, and some states are only seen by looking (a pod no node fits, a queue that never
admits). Each check here looks, turns what it finds into an event of the test's lifecycle
(:mod:`.lifecycle`) or offers the test or Job to the reconciler again, and returns how many it
acted on. A new check is a method here, listed in :meth:`Watchdog.checks`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from model_support.operator.jobs import RESYNC, job_owner
from model_support.operator.lifecycle import NotAdmitted, Scheduled, Unschedulable, retrying
from model_support.operator.manifests import TestRef
from model_support.operator.outcome import JobState, Reading, WaitKind, pod_waiting, stuck_reason
from model_support.operator.recording import sweep_deliveries
from model_support.operator.resource import LABEL_MANAGED_BY, LABEL_RECORDED, MANAGED_BY, child_name
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.operator.status import Phase, TestStatus

if TYPE_CHECKING:
    from model_support.operator.reconciler import Reconciler


def watched_namespaces(settings: OperatorSettings) -> list[str | None]:
    """The namespaces to list in; [None] means every namespace."""
    return list(settings.namespaces) if settings.namespaces else [None]


@dataclass
class _Audit:
    """When what this process knows of the tests was last compared with the API."""

    listed: bool = False
    at: float = 0.0

    def due(self, interval_s: float) -> bool:
        return self.listed or time.monotonic() - self.at >= interval_s

    def done(self) -> None:
        self.listed, self.at = False, time.monotonic()


class Watchdog:
    """The periodic checks of the tests one :class:`~.reconciler.Reconciler` looks after."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.settings = reconciler.settings
        self.kube = reconciler.kube
        self._audit = _Audit()

    def checks(self) -> tuple[Callable[[], int], ...]:
        """Every check, in the order a round runs them."""
        return (
            self.retry_tests,
            self.check_waiting,
            self.check_admission,
            self.resync_jobs,
            self.audit,
            self.sweep_deliveries,
        )

    def retry_tests(self) -> int:
        """Reconcile again every known test whose generation is not handled (a sizing retry
        that is due, or an event whose handling failed). No API requests for the others."""
        offered = 0
        for test in self.reconciler.writer.snapshot():
            status = TestStatus.read(test.get("status"))
            generation = int(test["metadata"].get("generation") or 1)
            if status.observedGeneration != generation or retrying(status):
                self.reconciler.reconcile(test, from_cache=True)
                offered += 1
        return offered

    def check_waiting(self, now: datetime | None = None) -> int:
        """Look at pending runner pods: a pod no node fits makes its test Queued (or ends it,
        past ``unschedulable_limit_s`` when set); an image that cannot be pulled past its limit
        (counted from its first failure seen, outcome.PullFailures) ends the test. Returns the
        number of tests ended."""
        ended = 0
        for namespace in watched_namespaces(self.settings):
            for pod in self.kube.list_pods(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, phase="Pending"
            ):
                owner = job_owner(pod)
                if owner is None:
                    continue
                ref, attempt = owner
                why = stuck_reason(
                    pod,
                    now=now,
                    unschedulable_limit_s=self.settings.unschedulable_limit_s,
                    image_pull_limit_s=self.settings.image_pull_limit_s,
                )
                if why is not None:
                    ended += self._end_stuck(ref, attempt, pod["metadata"]["name"], why)
                    continue
                waiting = pod_waiting(pod, now)
                if waiting is not None and waiting.kind is WaitKind.UNSCHEDULABLE:
                    self.reconciler.move(ref, Unschedulable(attempt, waiting.message))
                else:
                    self.reconciler.move(ref, Scheduled(attempt))
        return ended

    def _end_stuck(self, ref: TestRef, attempt: int, pod_name: str, why: str) -> int:
        """End a test whose runner pod will never start (1 when it ended, else 0)."""
        test = self.reconciler.current_test(ref, attempt)
        if test is None:
            return 0
        job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
        reading = Reading(
            JobState.INFRASTRUCTURE,
            f"runner pod {pod_name} {why}",
            runner_ran=False,  # it is still pending
        )
        if not self.reconciler.finish(test, ref, attempt, job_name, reading, final=True):
            return 0
        self.kube.delete_job(ref.namespace, job_name)
        return 1

    def check_admission(self, now: datetime | None = None) -> int:
        """Say so on tests whose Job Kueue has not admitted within ``kueue_admission_limit_s``
        (no Kueue installed, or no such LocalQueue, leaves a Job suspended forever): condition
        ``Queued`` with reason ``NotAdmitted`` and one Warning Event; the test keeps waiting.
        Works from the tests as watched: no API request unless one is overdue."""
        now = now or datetime.now(UTC)
        flagged = 0
        for test in self.reconciler.writer.snapshot():
            status = TestStatus.read(test.get("status"))
            queued = status.condition("Queued")
            if status.phase is not Phase.QUEUED or queued is None:
                continue
            if queued.reason != "KueueAdmission":
                continue
            since = queued.lastTransitionTime
            waited = (now - datetime.fromisoformat(since.replace("Z", "+00:00"))).total_seconds()
            if waited < self.settings.kueue_admission_limit_s:
                continue
            meta = test["metadata"]
            ref = TestRef(
                meta["namespace"], meta["name"], meta["uid"], int(meta.get("generation") or 1)
            )
            try:
                queue = parse_spec(dict(test.get("spec") or {})).queueName
            except SpecError:
                queue = None
            message = (
                f"Kueue has not admitted the Job for {waited:.0f} s (more than "
                f"kueueAdmissionLimitSeconds, {self.settings.kueue_admission_limit_s:g} s): check "
                f"that Kueue is installed and that LocalQueue {queue} exists in namespace "
                f"{ref.namespace} (kubectl get localqueue -n {ref.namespace} {queue}); the test "
                "keeps waiting"
            )
            self.reconciler.move(ref, NotAdmitted(status.attempt or 1, message))
            flagged += 1
        return flagged

    def resync_jobs(self) -> int:
        """Offer again every runner Job whose result is not recorded yet.

        kopf does not retry event handlers: if the API failed while a Job's end was being read,
        or a recording was deferred, only this brings the test to its end. Lists only Jobs
        without the recorded label (filtered on the server), so its steady load after a sweep
        is one small list per namespace and interval. Idempotent: a Job's end is recorded once,
        and a listing moves no phase (it may be older than the events).
        """
        offered = 0
        self.reconciler.releases.forget_old()
        for namespace in watched_namespaces(self.settings):
            for job in self.kube.list_jobs(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, without=(LABEL_RECORDED,)
            ):
                self.reconciler.on_job(job, RESYNC)
                offered += 1
        return offered

    def note_listing(self) -> None:
        """The watch listed the tests (at startup, or after a relist: a 410 Gone, a restarted
        stream). A listing brings no event for what was deleted meanwhile, so the next
        :meth:`audit` compares what this process knows with what the API holds."""
        self._audit.listed = True

    def audit(self) -> int:
        """After a listing (and every ``cache_audit_s`` anyway): drop the tests that no longer
        exist from what this process keeps; returns how many went. One list per namespace."""
        if not self._audit.due(self.settings.cache_audit_s):
            return 0
        known = self.reconciler.writer.uids()
        listed: set[str] = set()
        for namespace in watched_namespaces(self.settings):
            listed.update(
                str(t["metadata"].get("uid")) for t in self.kube.list_tests(namespace, {})
            )
        gone = known - listed
        for uid in gone:
            self.reconciler.forget_test(uid)
        self._audit.done()
        return len(gone)

    def sweep_deliveries(self) -> int:
        """Remove delivery slots of recorded runs (:func:`.recording.sweep_deliveries`)."""
        return sweep_deliveries(self.reconciler.recorder.stores())


__all__ = ["Watchdog", "watched_namespaces"]
