"""The watchdog: what no event reports, looked for every ``watchdog_interval_s``.

kopf does not retry event handlers, a watch that relists brings no event for what went
meanwhile, and some states are only seen by looking (a pod no node fits, a queue that never
admits). Each check here looks, turns what it finds into an event of the test's lifecycle
(:mod:`.lifecycle`) or offers the test or Job to the reconciler again, and returns how many it
acted on. A new check is a method here, listed in :meth:`Watchdog.checks`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from model_support.operator.jobs import RESYNC, job_owner, pods_not_created
from model_support.operator.lifecycle import (
    NotAdmitted,
    PodCreated,
    PodRefused,
    Scheduled,
    Unschedulable,
    retrying,
)
from model_support.operator.manifests import TestRef
from model_support.operator.outcome import (
    JobState,
    PullFailures,
    Reading,
    WaitKind,
    pod_waiting,
    stuck_reason,
)
from model_support.operator.recording import sweep_deliveries
from model_support.operator.resource import (
    LABEL_MANAGED_BY,
    LABEL_RECORDED,
    LABEL_UID,
    MANAGED_BY,
    child_name,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.operator.status import ACTIVE_PHASES, Phase, TestStatus

if TYPE_CHECKING:
    from model_support.operator.reconciler import Reconciler

log = logging.getLogger(__name__)


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
        self.pulls = PullFailures()
        """When this process first saw each pending pod's image pull failing (the image pull
        limit counts from there; a new process counts anew, never less than the limit)."""

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
            generation = int(test["metadata"].get("generation") or 1)
            raw = test.get("status") or {}
            if raw.get("observedGeneration") == generation and isinstance(raw.get("attempt"), int):
                # Handled, and an attempt made: retrying() holds only with no attempt. Known
                # without parsing the status (a round reads 1,000s).
                continue
            status = TestStatus.read(raw)
            if status.observedGeneration != generation or retrying(status):
                self.reconciler.reconcile(test, from_cache=True)
                offered += 1
        return offered

    def check_waiting(self, now: datetime | None = None) -> int:
        """Look at pending runner pods: a pod no node fits makes its test Queued (or ends it,
        past ``unschedulable_limit_s`` when set); an image that cannot be pulled past its limit
        (counted from its first failure this watchdog saw, :attr:`pulls`) ends the test.
        Returns the number of tests ended."""
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
                    pulls=self.pulls,
                )
                if why is not None:
                    ended += self._end_stuck(ref, attempt, pod["metadata"]["name"], why)
                    continue
                waiting = pod_waiting(pod, now, self.pulls)
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
            if (test.get("status") or {}).get("phase") != Phase.QUEUED.value:
                continue  # not waiting, read without parsing its status (a round reads 1,000s)
            status = TestStatus.read(test.get("status"))
            queued = status.condition("Queued")
            if queued is None or queued.reason != "KueueAdmission":
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
        """Offer again every runner Job whose result is not recorded yet, each on its own, and
        say on its test why an admitted Job has no pod.

        kopf does not retry event handlers: if the API failed while a Job's end was being read,
        or a recording was deferred, only this brings the test to its end. A Job whose handling
        fails (a refused create of its next attempt, an API error) is logged and offered again
        after a backoff (:meth:`.retries.Retries.job_failed`); the Jobs after it are handled in
        the same round. Lists only Jobs without the recorded label (filtered on the server), so
        its steady load after a sweep is one small list per namespace and interval. Idempotent:
        a Job's end is recorded once, and a listing moves no phase (it may be older than the
        events).
        """
        offered = 0
        retries = self.reconciler.retries
        self.reconciler.releases.forget_old()
        listed: set[str] = set()
        for namespace in watched_namespaces(self.settings):
            jobs = self.kube.list_jobs(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, without=(LABEL_RECORDED,)
            )
            for job in jobs:
                meta = job.get("metadata") or {}
                uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
                listed.add(uid)
                if not retries.job_due(uid):
                    continue
                try:
                    self.reconciler.on_job(job, RESYNC)
                except Exception:  # any failure of this Job's handling: this Job waits, not all
                    delay = retries.job_failed(uid)
                    log.exception(
                        "runner Job %s/%s could not be handled; offering it again in %g s",
                        meta.get("namespace"), meta.get("name"), delay,
                    )  # fmt: skip
                    continue
                retries.job_handled(uid)
                offered += 1
            try:
                self.report_pod_creation(namespace, jobs)
            except Exception:  # the API failed: said in the next round
                log.exception("reading why runner pods were not created failed; retrying")
        retries.keep_jobs(listed)
        return offered

    def report_pod_creation(self, namespace: str | None, jobs: list[dict[str, Any]]) -> int:
        """Say on its test why an admitted, unfinished runner Job has no pod: the Job
        controller could not create it, and says why only in a ``FailedCreate`` Event on the
        Job (kubernetes pkg/controller/controller_utils.go, ``RealPodControl``: "Error
        creating: ..."; the Job gets no condition for it): a ResourceQuota on
        ``aws.amazon.com/neuroncore``, a LimitRange, Pod Security admission, a webhook. A
        refusal older than the Job's newest pod is history, not said. A Job that has its pod
        again clears what was said. Returns how many tests were told of a refusal.

        No request unless a listed Job has no pod; then one list of the Jobs' ``FailedCreate``
        Events per namespace, and one list of pods for each such Job with a refusal."""
        without_pod = pods_not_created(jobs)
        for job in jobs:
            owner = job_owner(job) if int((job.get("status") or {}).get("active") or 0) else None
            if owner is not None and self._refusal_said(owner[0]):
                self.reconciler.move(owner[0], PodCreated(owner[1]))
        if not without_pod:
            return 0
        refusals = self.kube.list_events(namespace, kind="Job", reason="FailedCreate")
        newest: dict[str, dict[str, Any]] = {}
        for refusal in refusals:
            uid = str((refusal.get("involvedObject") or {}).get("uid") or "")
            if uid and _event_time(refusal) >= _event_time(newest.get(uid)):
                newest[uid] = refusal
        told = 0
        for job in without_pod:
            meta = job["metadata"]
            event = newest.get(str(meta.get("uid")))
            owner = job_owner(job)
            if event is None or owner is None:
                continue
            ref, attempt = owner
            pods = self.kube.list_pods(
                meta["namespace"], {LABEL_UID: ref.uid, "job-name": meta["name"]}
            )
            made = max(
                (_stamp((p.get("metadata") or {}).get("creationTimestamp")) for p in pods),
                default="",
            )
            if made > _event_time(event):
                continue  # refused before a pod that was made since: history
            message = (
                f"the Job controller cannot create the runner pod of Job {meta['name']}: "
                f"{event.get('message') or 'no message'} (Event FailedCreate on the Job, seen "
                f"{event.get('count') or 1} time(s))"
            )
            self.reconciler.move(ref, PodRefused(attempt, message))
            told += 1
        return told

    def _refusal_said(self, ref: TestRef) -> bool:
        test = self.reconciler.tests.get(ref.uid)
        status = TestStatus.read((test or {}).get("status"))
        refused = status.condition("PodCreated")
        return refused is not None and refused.status == "False"

    def note_listing(self) -> None:
        """A watch listed the tests or the Jobs (at startup, or after a relist: a 410 Gone, a
        restarted stream), or this replica began to lead. A listing brings no event for what
        was deleted meanwhile, so the next :meth:`audit` compares what this process knows with
        what the API holds."""
        self._audit.listed = True

    def audit(self) -> int:
        """After a listing (and every ``cache_audit_s`` anyway): drop the tests that no longer
        exist from what this process keeps, and handle the active tests whose Job is gone
        (deleted while no watch event could say so) as a deleted Job is
        (:meth:`.reconciler.Reconciler.job_gone`). Returns how many tests went or ended. One
        list of tests and one of unrecorded Jobs per namespace, and a read of each Job the
        listing lacks."""
        if not self._audit.due(self.settings.cache_audit_s):
            return 0
        # What the tests said before the listing: a Job they name was created before it.
        active = [
            test
            for test in self.reconciler.writer.snapshot()
            if _has_job(TestStatus.read(test.get("status")), test)
        ]
        known = self.reconciler.writer.uids()
        listed: set[str] = set()
        jobs: set[tuple[str, str]] = set()
        for namespace in watched_namespaces(self.settings):
            listed.update(
                str(t["metadata"].get("uid")) for t in self.kube.list_tests(namespace, {})
            )
            if active:
                jobs.update(
                    (str(j["metadata"].get("namespace")), str(j["metadata"].get("name")))
                    for j in self.kube.list_jobs(
                        namespace, {LABEL_MANAGED_BY: MANAGED_BY}, without=(LABEL_RECORDED,)
                    )
                )
        gone = known - listed
        for uid in gone:
            self.reconciler.forget_test(uid)
        ended = 0
        for test in active:
            meta = test["metadata"]
            job_name = TestStatus.read(test.get("status")).jobName
            if meta["uid"] in gone or (meta["namespace"], job_name) in jobs:
                continue
            ended += self.reconciler.job_gone(test)
        self._audit.done()
        return len(gone) + ended

    def sweep_deliveries(self) -> int:
        """Remove delivery slots of recorded runs (:func:`.recording.sweep_deliveries`)."""
        return sweep_deliveries(self.reconciler.recorder.stores())


def _has_job(status: TestStatus, test: dict[str, Any]) -> bool:
    """Whether the test's current generation is active with a Job it names."""
    generation = int(test["metadata"].get("generation") or 1)
    return (
        status.phase in ACTIVE_PHASES
        and status.observedGeneration == generation
        and status.jobName is not None
    )


def _stamp(value: object) -> str:
    """A Kubernetes timestamp as comparable text (RFC 3339 in UTC, seconds; "" for none)."""
    return str(value or "")[:19]


def _event_time(event: dict[str, Any] | None) -> str:
    """When an Event last happened: its series' last observation, its lastTimestamp, its
    eventTime (events.k8s.io), else its creation ("" for none)."""
    if event is None:
        return ""
    return _stamp(
        (event.get("series") or {}).get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )


__all__ = ["Watchdog", "watched_namespaces"]
