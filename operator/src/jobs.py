"""Observing runner Jobs: whose attempt a Job (or pod) is, what an active Job says of its test,
the Running writes held back a moment, and handing recorded Jobs to the TTL controller.

A Job's end is read by :mod:`.outcome` (pure functions over the Job and its pods); what it left
by :mod:`.results`. What this module keeps in memory only saves API requests.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from model_support.operator.kube import Kube
from model_support.operator.lifecycle import Admitted, KueueWaiting, PodReady
from model_support.operator.manifests import TestRef
from model_support.operator.outcome import job_ended_at
from model_support.operator.resource import (
    ANNOTATION_TEST_NAME,
    LABEL_ATTEMPT,
    LABEL_GENERATION,
    LABEL_KUEUE_QUEUE,
    LABEL_UID,
    child_name,
)
from model_support.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def ttl_from_now(setting_s: int, ended_at: datetime | None) -> int:
    """The ``ttlSecondsAfterFinished`` that keeps a Job ``setting_s`` from now: the TTL
    controller counts from the Job's finish (its completionTime, else its terminal condition's
    lastTransitionTime: kubernetes pkg/controller/ttlafterfinished, ``timeLeft``), so a Job
    recorded late gets the time since it finished on top (else it, its pods and their logs
    would go at once). A Job not finished yet (``ended_at`` None) is counted from its finish
    anyway."""
    if ended_at is None:
        return setting_s
    since = (datetime.now(UTC) - ended_at).total_seconds()
    return setting_s + max(0, math.ceil(since))


RESYNC = "RESYNC"
"""The event type the watchdog offers a listed Job with (kopf's are ADDED/MODIFIED/DELETED/None)."""
RELEASE_MEMORY_S = 600.0
"""How long a released Job is remembered (a stale listing of it is not released again)."""


def job_owner(obj: dict[str, Any]) -> tuple[TestRef, int] | None:
    """The test (by uid) and attempt a runner Job or pod serves; None if it is not ours.

    The test's full name comes from an annotation: labels hold at most 63 characters and
    test names up to 253.
    """
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    try:
        ref = TestRef(
            meta["namespace"],
            annotations[ANNOTATION_TEST_NAME],
            labels[LABEL_UID],
            int(labels[LABEL_GENERATION]),
        )
        return ref, int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        log.warning(
            "%s/%s carries our label but not the test's uid, name and attempt; ignoring it",
            meta.get("namespace"),
            meta.get("name"),
        )
        return None


def progress(job: dict[str, Any], attempt: int) -> PodReady | KueueWaiting | Admitted:
    """What an active Job says of its test: a runner pod is ready; it is suspended (Kueue has
    not admitted it yet, or preempted it: the Job controller deleted its pods and it runs
    again once Kueue resumes it); or it is admitted and no pod is ready yet."""
    job_status, job_spec = job.get("status") or {}, job.get("spec") or {}
    if int(job_status.get("ready") or 0) > 0:
        return PodReady(attempt, job_status.get("startTime"))
    if job_spec.get("suspend"):
        queue = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_QUEUE)
        return KueueWaiting(attempt, queue)
    return Admitted(attempt)


_FINISHED = ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")


def pods_not_created(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Jobs of ``jobs`` that are admitted (not suspended) and unfinished and have no pod
    running or ending (``status.active``, ``ready`` and ``terminating`` all 0): the Job
    controller has not made their pod (yet), which its ``FailedCreate`` Events explain."""
    found = []
    for job in jobs:
        status, spec = job.get("status") or {}, job.get("spec") or {}
        finished = any(
            c.get("type") in _FINISHED and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        busy = any(int(status.get(k) or 0) for k in ("active", "ready", "terminating"))
        if not (finished or busy or spec.get("suspend")):
            found.append(job)
    return found


AttemptKey = tuple[str, int, int]
"""An attempt of a test generation: (test uid, generation, attempt)."""


@dataclass(frozen=True)
class _HeldRunning:
    due: float
    ref: TestRef
    event: PodReady


class RunningWrites:
    """Running phases held back ``running_write_delay_s`` after a runner pod became ready: a
    run that ends meanwhile says Completed in one write, carrying the start Running had."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._held: dict[AttemptKey, _HeldRunning] = {}

    def hold(self, ref: TestRef, event: PodReady) -> None:
        """Hold ``event``'s Running write until it is due (the first ready event counts)."""
        due = time.monotonic() + self.settings.running_write_delay_s
        key = (ref.uid, ref.generation, event.attempt)
        with self._lock:
            self._held.setdefault(key, _HeldRunning(due, ref, event))

    def due(self) -> list[tuple[TestRef, PodReady]]:
        """The held writes that are due now (no longer held)."""
        now = time.monotonic()
        with self._lock:
            keys = [k for k, w in self._held.items() if w.due <= now]
            writes = [self._held.pop(k) for k in keys]
        return [(w.ref, w.event) for w in writes]

    def ended(self, ref: TestRef) -> str | None:
        """The run of ``ref`` ended: drop its held writes; the start a held write of this
        generation had, for the Completed write to carry."""
        started: str | None = None
        with self._lock:
            for key in [k for k in self._held if k[0] == ref.uid]:
                write = self._held.pop(key)
                if key[1] == ref.generation:
                    started = write.event.started or started
        return started

    def forget(self, uid: str) -> None:
        """Drop what is held for a test that no longer exists."""
        with self._lock:
            for key in [k for k in self._held if k[0] == uid]:
                del self._held[key]


class Releases:
    """Handing recorded Jobs to the TTL controller: once per Job, remembered a while so that a
    listing older than the Job's label does not release it again."""

    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self._lock = threading.Lock()
        self._released: dict[tuple[str, str], float] = {}

    def release(self, namespace: str, job_name: str, ended_at: datetime | None) -> None:
        """Label a recorded Job and hand it to the TTL controller, to be kept
        ``ttl_seconds_after_finished`` from now (see :func:`ttl_from_now`; ``ended_at``: when
        the Job finished, None if it has not)."""
        ttl = ttl_from_now(self.settings.ttl_seconds_after_finished, ended_at)
        self.kube.mark_job_recorded(namespace, job_name, ttl)
        self.about_to_release(namespace, job_name)

    def about_to_release(self, namespace: str, job_name: str) -> None:
        """Remember a Job as released before it is (so a concurrent resync does not release it
        twice)."""
        with self._lock:
            self._released[(namespace, job_name)] = time.monotonic()

    def release_attempts(self, ref: TestRef, attempt: int, ended_at: datetime | None) -> None:
        """Release the recorded attempt's Job (which ended at ``ended_at``) and those of the
        attempts before it (kept until now: the first one owns the generation's run.py, which a
        retry runs too; each is read for when it ended)."""
        self.release(
            ref.namespace, child_name(ref.name, ref.uid, ref.generation, attempt), ended_at
        )
        for earlier in range(attempt - 1, 0, -1):
            name = child_name(ref.name, ref.uid, ref.generation, earlier)
            job = self.kube.read_job(ref.namespace, name)
            if job is not None:
                self.release(ref.namespace, name, job_ended_at(job))

    def released_lately(self, namespace: str, job_name: str) -> bool:
        """Whether this operator released the Job lately (a listing may predate its label)."""
        with self._lock:
            released = self._released.get((namespace, job_name))
        return released is not None and time.monotonic() - released < RELEASE_MEMORY_S

    def forget_old(self) -> None:
        """Forget releases older than :data:`RELEASE_MEMORY_S`."""
        cutoff = time.monotonic() - RELEASE_MEMORY_S
        with self._lock:
            for key in [k for k, t in self._released.items() if t < cutoff]:
                del self._released[key]


__all__ = [
    "RESYNC",
    "Releases",
    "RunningWrites",
    "job_owner",
    "pods_not_created",
    "progress",
    "ttl_from_now",
]
