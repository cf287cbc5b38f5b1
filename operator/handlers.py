"""kopf handlers: a ModelSupportTest becomes a ConfigMap (run.py) and a runner Job; the Job's end
becomes the test's status and one run record.

State lives in the resource's status, never in the operator: every child has a deterministic
name per generation and attempt, a create that meets 409 adopts what is there, a completed test
is never touched again, and the run id is derived from uid + generation + attempt, so an
operator that restarts (or sees an event twice) records each run exactly once.

Handlers are synchronous on purpose: they use the blocking Kubernetes client and the results
store, and kopf runs synchronous handlers in its thread pool, off its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from model_support.config import RunConfig
from model_support.delivery import DeliveryArea, DeliveryError
from model_support.execution import excluded_record, failure_document, record_from_document
from model_support.operator import metrics
from model_support.operator.kube import AlreadyExists, Kube, api_client
from model_support.operator.manifests import (
    Placement,
    TestRef,
    build_configmap,
    build_job,
    delivery_target,
    labels_for,
)
from model_support.operator.outcome import (
    INFRA_RESULTS,
    DocumentSource,
    JobState,
    Reading,
    Unavailable,
    WaitKind,
    pod_waiting,
    read_job,
    stuck_reason,
    trusted_document,
)
from model_support.operator.resource import (
    FIELD_MANAGER,
    GROUP,
    LABEL_ATTEMPT,
    LABEL_GENERATION,
    LABEL_KUEUE_QUEUE,
    LABEL_MANAGED_BY,
    LABEL_RECORDED,
    LABEL_TEST,
    LABEL_UID,
    MANAGED_BY,
    PLURAL,
    RUNNER_CONTAINER,
    VERSION,
    child_name,
    run_id_for,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, TestSpec, parse_spec
from model_support.records import ResultDocument, RunRecord, parse_result_line
from model_support.runner_pod import RUNNER_MESSAGE_PREFIX
from model_support.script import read_config, render_script
from model_support.sizing import Exclusion, size_model
from model_support.store import RecordExists, ResultsStore
from model_support.vocabulary import ErrorClass, Parallelism, Result

log = logging.getLogger(__name__)

PENDING, QUEUED, RUNNING = "Pending", "Queued", "Running"
COMPLETED, INVALID = "Completed", "Invalid"
ACTIVE_PHASES = (PENDING, QUEUED, RUNNING)
_PHASE_ORDER = {QUEUED: 0, PENDING: 1, RUNNING: 2}
GiB = 2**30
_MESSAGE_LIMIT = 2000
_EVENT_REASON = {
    Result.PASS: "Passed",
    Result.FAIL: "Failed",
    Result.ERROR: "Errored",
    Result.TIMEOUT: "TimedOut",
    Result.EXCLUDED: "Excluded",
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` set; lastTransitionTime moves only when the status changes."""
    value = "True" if status else "False"
    result = [dict(c) for c in conditions or [] if c.get("type") != kind]
    previous = next((c for c in conditions or [] if c.get("type") == kind), None)
    since = (
        previous["lastTransitionTime"] if previous and previous.get("status") == value else _now()
    )
    result.append(
        {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message[:_MESSAGE_LIMIT],
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }
    )
    return result


def _short(text: str | None) -> str:
    if not text:
        return ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:_MESSAGE_LIMIT]


class Materializer:
    """Keeps one store's matrix current: at most one materialize running and one pending.

    Records are the truth and the matrix is derived, so a burst of completions (a sweep) costs
    a few materializations, not one each; a failed one is logged and redone on the next request.
    """

    def __init__(self, store: ResultsStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._running = False
        self._pending = False
        self.idle = threading.Event()
        self.idle.set()

    def request(self) -> None:
        """Materialize soon (in a background thread)."""
        with self._lock:
            if self._running:
                self._pending = True
                return
            self._running = True
            self.idle.clear()
        threading.Thread(target=self._loop, name="materialize", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                self.store.materialize()
            except Exception:
                log.exception(
                    "materializing %s failed; records are intact, the next run redoes it",
                    self.store.uri,
                )
            with self._lock:
                if not self._pending:
                    self._running = False
                    self.idle.set()
                    return
                self._pending = False


@dataclass(frozen=True)
class _Retry:
    """When a deferred recording is tried again, and the delay that led there (for backoff)."""

    next_at: float
    delay: float


@dataclass
class Reconciler:
    """The operator's logic, bound to its settings, an API client and the results stores."""

    settings: OperatorSettings
    kube: Kube

    def __post_init__(self) -> None:
        self._stores: dict[str, ResultsStore] = {}
        self.materializers: dict[str, Materializer] = {}
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._retries: dict[str, _Retry] = {}
        self._finishing: set[str] = set()

    # ---------------------------------------------------------------- helpers

    def event(self, test: Any, kind: str, reason: str, message: str) -> None:
        """An Event on the test (posted with our client, so it works from any thread)."""
        self.kube.post_event(_plain(test), kind, reason, message[:_MESSAGE_LIMIT])

    def store_uri(self, spec: TestSpec | None) -> str:
        """The results store URI of a test (its spec's `results`, else the operator's)."""
        return (spec.results if spec is not None else None) or self.settings.results_uri

    def store_for(self, spec: TestSpec | None) -> ResultsStore:
        """The results store of a test (its spec's `results`, else the operator's)."""
        uri = self.store_uri(spec)
        with self._lock:
            if uri not in self._stores:
                self._stores[uri] = ResultsStore(uri)
                self.materializers[self._stores[uri].uri] = Materializer(self._stores[uri])
            return self._stores[uri]

    def record(self, spec: TestSpec | None, record: RunRecord) -> bool:
        """Add a record; False if this run id is already stored (a replay: nothing to do)."""
        store = self.store_for(spec)
        try:
            store.add(record)
        except RecordExists:
            log.info("run %s was already recorded; not recording it again", record.run_id)
            return False
        self.materializers[store.uri].request()
        result = record.document.result
        detail = (
            record.exclusion_reason.value
            if record.exclusion_reason
            else (record.document.error_class.value if record.document.error_class else "")
        )
        metrics.TESTS.labels(result.value, detail).inc()
        if record.document.timings.wall_time_s is not None:
            metrics.WALL_SECONDS.observe(record.document.timings.wall_time_s)
        return True

    def place(self, spec: TestSpec, namespace: str) -> Placement | Exclusion:
        """Cores and host memory: the spec's override, else sized from the checkpoint."""
        floor = int(self.settings.min_host_memory_gib * GiB)
        if spec.cores is not None:
            return Placement(spec.cores, spec.parallelism or Parallelism.NONE, floor)
        token = None
        if spec.hubTokenSecret is not None and self.settings.read_token_secrets:
            token = self.kube.secret_value(
                namespace, spec.hubTokenSecret.name, spec.hubTokenSecret.key
            )
        profile = "cpu" if spec.profile == "cpu" else spec.profile
        plan = size_model(
            spec.model,
            spec.revision,
            profile=profile,
            lnc=spec.lnc,
            max_cores=spec.maxCores,
            dtype=spec.dtype,
            task=spec.task.value,
            token=token,
            trust_remote_code=spec.trustRemoteCode,
        )
        if isinstance(plan, Exclusion):
            return plan
        # The verdict's reference pass runs in float32 on the host: 4 bytes per parameter.
        host = int(plan.parameters * 4 * self.settings.host_memory_factor)
        return Placement(plan.cores, plan.parallelism, max(floor, host))

    # ---------------------------------------------------------------- test created / changed / resumed

    def reconcile(
        self, body: kopf.Body, status: dict[str, Any], patch: kopf.Patch, resumed: bool
    ) -> None:
        """Bring one generation of a test to a running Job (or a recorded EXCLUDED)."""
        meta = body["metadata"]
        ref = TestRef(
            meta["namespace"], meta["name"], meta["uid"], int(meta.get("generation") or 1)
        )
        if status.get("observedGeneration") == ref.generation and status.get("phase"):
            if resumed and status.get("phase") in ACTIVE_PHASES:
                self._check_job_exists(body, ref, status)
            return  # this generation is handled; its Job's events carry it on
        conditions = status.get("conditions")
        try:
            spec = parse_spec(dict(body.get("spec") or {}))
        except SpecError as exc:
            patch.status.update(
                phase=INVALID,
                observedGeneration=ref.generation,
                message=str(exc)[:_MESSAGE_LIMIT],
                conditions=set_condition(
                    conditions, "Ready", False, "InvalidSpec", str(exc), ref.generation
                ),
            )
            self.event(body, "Warning", "InvalidSpec", str(exc))
            return
        self._delete_superseded_job(ref, status)
        try:
            placement = self.place(spec, ref.namespace)
        except (ValueError, OSError) as exc:
            # Sizing could not read the model (not found, Hub unreachable): retry with backoff.
            message = f"sizing {spec.model} failed: {exc}"
            self.event(body, "Warning", "SizingFailed", message)
            raise kopf.TemporaryError(message, delay=60) from exc
        if isinstance(placement, Exclusion):
            self._record_exclusion(body, ref, spec, placement, conditions, patch)
            return
        config = spec.run_config(placement.cores, placement.parallelism)
        run_py = render_script(config)
        attempt = 1
        names = self._start(ref, spec, placement, run_py, attempt)
        conditions = set_condition(
            conditions,
            "Sized",
            True,
            "Override" if spec.cores else "Sized",
            f"{placement.cores} core(s), parallelism {placement.parallelism.value}",
            ref.generation,
        )
        queued = f" queued in Kueue LocalQueue {spec.queueName}" if spec.queueName else ""
        conditions = set_condition(
            conditions,
            "JobCreated",
            True,
            "JobCreated",
            f"Job {names[1]} created{queued}",
            ref.generation,
        )
        conditions = set_condition(
            conditions, "Recorded", False, "Running", "no result yet", ref.generation
        )
        if spec.queueName:
            conditions = set_condition(
                conditions, "Queued", True, "KueueAdmission",
                f"waiting for Kueue to admit the Job (LocalQueue {spec.queueName})", ref.generation,
            )  # fmt: skip
        patch.status.update(
            phase=QUEUED if spec.queueName else PENDING,
            observedGeneration=ref.generation,
            cores=placement.cores,
            parallelism=placement.parallelism.value,
            hostMemoryBytes=placement.host_memory_bytes,
            attempt=attempt,
            configMapName=names[0],
            jobName=names[1],
            runId=run_id_for(ref.uid, ref.generation, attempt),
            result=None,
            errorClass=None,
            exclusionReason=None,
            message=None,
            conditions=conditions,
        )
        self._phases[(ref.uid, ref.generation, attempt)] = (
            (QUEUED, "KueueAdmission") if spec.queueName else (PENDING, "JobCreated")
        )
        self.event(
            body,
            "Normal",
            "JobCreated",
            f"runner Job {names[1]} on {placement.cores} core(s){queued}",
        )

    def _start(
        self, ref: TestRef, spec: TestSpec, placement: Placement, run_py: str, attempt: int
    ) -> tuple[str, str]:
        """Create (or adopt) the ConfigMap and the Job of one attempt; returns their names."""
        cm_name = child_name(ref.name, ref.uid, ref.generation)
        job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
        with contextlib.suppress(AlreadyExists):  # 409: made by an earlier try of this handler
            self.kube.create_configmap(build_configmap(ref, cm_name, run_py))
        job = build_job(
            ref,
            spec,
            placement,
            job_name=job_name,
            configmap_name=cm_name,
            attempt=attempt,
            run_id=run_id_for(ref.uid, ref.generation, attempt),
            settings=self.settings,
            deliver_to=delivery_target(self.store_uri(spec), self.settings),
        )
        try:
            self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
        except AlreadyExists:
            log.info("Job %s/%s already exists; adopting it", ref.namespace, job_name)
        return cm_name, job_name

    def _delete_superseded_job(self, ref: TestRef, status: dict[str, Any]) -> None:
        """A spec change supersedes the running Job of the previous generation."""
        old_job = status.get("jobName")
        if (
            old_job
            and status.get("phase") in ACTIVE_PHASES
            and status.get("observedGeneration") != ref.generation
        ):
            self.kube.delete_job(ref.namespace, old_job)

    def _record_exclusion(
        self,
        body: kopf.Body,
        ref: TestRef,
        spec: TestSpec,
        exclusion: Exclusion,
        conditions: list[dict[str, Any]] | None,
        patch: kopf.Patch,
    ) -> None:
        config = spec.run_config(1, Parallelism.NONE)
        record = excluded_record(
            config,
            exclusion.reason,
            exclusion.message,
            source="operator",
            labels=self._labels(ref, None, 0),
        )
        run_id = run_id_for(ref.uid, ref.generation, 0)
        self.record(spec, record.model_copy(update={"run_id": run_id}))
        conditions = set_condition(
            conditions, "Sized", False, "Excluded", exclusion.message, ref.generation
        )
        conditions = set_condition(
            conditions, "Recorded", True, "Recorded", f"run {run_id} recorded", ref.generation
        )
        patch.status.update(
            phase=COMPLETED,
            observedGeneration=ref.generation,
            result=Result.EXCLUDED.value,
            exclusionReason=exclusion.reason.value,
            errorClass=None,
            message=exclusion.message[:_MESSAGE_LIMIT],
            runId=run_id,
            finishedAt=_now(),
            conditions=conditions,
        )
        self.event(body, "Normal", "Excluded", f"{exclusion.reason.value}: {exclusion.message}")

    def _labels(self, ref: TestRef, job_name: str | None, attempt: int) -> dict[str, str]:
        labels = {
            "namespace": ref.namespace,
            "test": ref.name,
            "test_uid": ref.uid,
            "generation": str(ref.generation),
        }
        if job_name:
            labels |= {"job": job_name, "attempt": str(attempt)}
        return labels

    def _check_job_exists(self, body: kopf.Body, ref: TestRef, status: dict[str, Any]) -> None:
        """On restart: a test whose Job vanished while the operator was away gets an ERROR."""
        job_name = status.get("jobName")
        if job_name and self.kube.read_job(ref.namespace, job_name) is None:
            attempt = int(status.get("attempt") or 1)
            reading = Reading(
                JobState.INFRASTRUCTURE,
                f"the runner Job {job_name} disappeared before its result was read",
            )
            self.finish(dict(body), ref, attempt, job_name, reading)

    # ---------------------------------------------------------------- runner Job events

    def on_job(self, job: dict[str, Any], event_type: str) -> None:
        """A runner Job changed: mark the test Running, retry after node loss, or finish it."""
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        try:
            ref = TestRef(
                meta["namespace"],
                labels[LABEL_TEST],
                labels[LABEL_UID],
                int(labels[LABEL_GENERATION]),
            )
            attempt = int(labels[LABEL_ATTEMPT])
        except (KeyError, ValueError):
            log.warning(
                "Job %s/%s carries our label but not the test's labels; ignoring it",
                meta.get("namespace"),
                meta.get("name"),
            )
            return
        job_name = meta["name"]
        reading = read_job(job, [])
        if reading.state == JobState.ACTIVE and event_type != "DELETED":
            self._progress(ref, attempt, job)
            return
        test = self._current_test(ref, attempt, completed=True)
        if test is None:
            return
        if (test.get("status") or {}).get("phase") == COMPLETED:
            if LABEL_RECORDED not in labels and event_type != "DELETED":
                # Recorded, but the operator stopped before it released the Job to its TTL.
                self.kube.mark_job_recorded(
                    ref.namespace, job_name, self.settings.ttl_seconds_after_finished
                )
            return
        pods = self.kube.list_pods(ref.namespace, labels_for(ref, attempt))
        reading = read_job(job, pods)
        if reading.state == JobState.ACTIVE:
            # The Job was deleted under a running test (by hand, or its node pool went away).
            reading = Reading(
                JobState.INFRASTRUCTURE,
                f"the runner Job {job_name} was deleted before it finished",
                pod_name=reading.pod_name,
            )
        if (
            reading.state == JobState.NODE_LOST
            and attempt < self.settings.max_attempts
            and not self._delivered(test, ref, attempt)
        ):
            self._retry(test, ref, attempt, reading)
            return
        self.finish(
            test,
            ref,
            attempt,
            job_name,
            reading,
            ended_at=_ended_at(job),
            final=event_type == "DELETED",
        )

    def _delivered(self, test: dict[str, Any], ref: TestRef, attempt: int) -> bool:
        """Whether the runner of this attempt delivered its document (so it finished)."""
        try:
            spec = parse_spec(dict(test.get("spec") or {}))
        except SpecError:
            spec = None
        try:
            area = DeliveryArea(self.store_uri(spec))
            return area.get(run_id_for(ref.uid, ref.generation, attempt)) is not None
        except (DeliveryError, ValueError):
            return False

    def _current_test(
        self, ref: TestRef, attempt: int, *, completed: bool = False
    ) -> dict[str, Any] | None:
        """The test a Job serves, if that Job is still the test's current, unfinished attempt
        (``completed``: finished ones too)."""
        test = self.kube.get_test(ref.namespace, ref.name)
        if test is None or test["metadata"].get("uid") != ref.uid:
            return None  # deleted (its children go with it)
        if int(test["metadata"].get("generation") or 1) != ref.generation:
            return None  # the spec changed: this Job's generation is superseded
        status = test.get("status") or {}
        if (
            status.get("observedGeneration") != ref.generation
            or int(status.get("attempt") or 0) != attempt
        ):
            return None  # superseded by a spec change or a retry
        if status.get("phase") == COMPLETED and not completed:
            return None  # a terminal phase is never overwritten
        return test

    def _progress(self, ref: TestRef, attempt: int, job: dict[str, Any]) -> None:
        """Move the test forward as its active Job does: Queued (Kueue has not admitted it),
        Pending (admitted, no pod ready), Running (a runner pod is ready)."""
        job_status, job_spec = job.get("status") or {}, job.get("spec") or {}
        if int(job_status.get("ready") or 0) > 0:
            self._set_phase(
                ref, attempt, RUNNING, "Running", True, "PodReady", "a runner pod is ready",
                started=job_status.get("startTime"),
            )  # fmt: skip
        elif job_spec.get("suspend"):
            queue = (job.get("metadata") or {}).get("labels", {}).get(LABEL_KUEUE_QUEUE)
            self._set_phase(
                ref, attempt, QUEUED, "Queued", True, "KueueAdmission",
                f"waiting for Kueue to admit the Job (LocalQueue {queue})",
            )  # fmt: skip
        else:
            self._set_phase(
                ref, attempt, PENDING, "Queued", False, "Admitted", "the Job is admitted",
                only_from=QUEUED,
            )  # fmt: skip

    def _set_phase(
        self,
        ref: TestRef,
        attempt: int,
        phase: str,
        condition: str,
        value: bool,
        reason: str,
        message: str,
        *,
        started: str | None = None,
        only_from: str | None = None,
        backwards: bool = False,
        event: tuple[str, str] | None = None,
    ) -> None:
        """Set an active test's phase (and one condition) unless it is already there.

        Phases only move forward (Queued -> Pending -> Running) unless ``backwards`` (a pod
        that lost its node goes back to waiting); ``only_from`` restricts the move to one phase.
        """
        key = (ref.uid, ref.generation, attempt)
        known = self._phases.get(key)
        if known is not None and (
            known == (phase, reason)
            or (only_from is not None and known[0] != only_from)
            or (not backwards and _PHASE_ORDER[phase] < _PHASE_ORDER.get(known[0], 0))
        ):
            return  # nothing to change, by what this operator last set: no request
        test = self._current_test(ref, attempt)
        if test is None:
            return
        status = test.get("status") or {}
        current = status.get("phase")
        current_reason = next(
            (c.get("reason") for c in status.get("conditions") or [] if c.get("type") == condition),
            None,
        )
        if (current, current_reason) == (phase, reason) or current not in _PHASE_ORDER:
            self._phases[key] = (phase, reason)
            return
        if only_from is not None and current != only_from:
            return
        if not backwards and _PHASE_ORDER[phase] < _PHASE_ORDER[current]:
            return
        conditions = set_condition(
            status.get("conditions"), condition, value, reason, message, ref.generation
        )
        if phase == RUNNING:
            conditions = set_condition(
                conditions, "Queued", False, "Started", "a runner pod is ready", ref.generation
            )
        patch: dict[str, Any] = {"phase": phase, "conditions": conditions}
        if phase == RUNNING:
            patch["startedAt"] = started or _now()
        self.kube.patch_test_status(ref.namespace, ref.name, patch)
        self._phases[key] = (phase, reason)
        if event is not None:
            self.event(test, event[0], event[1], message)

    def _retry(self, test: dict[str, Any], ref: TestRef, attempt: int, reading: Reading) -> None:
        """Node lost: the same run.py again in a new Job (attempt + 1); bounded by max_attempts."""
        spec = parse_spec(dict(test.get("spec") or {}))
        status = test.get("status") or {}
        placement = Placement(
            int(status["cores"]),
            Parallelism(status.get("parallelism") or Parallelism.NONE.value),
            int(status.get("hostMemoryBytes") or self.settings.min_host_memory_gib * GiB),
        )
        cm_name = child_name(ref.name, ref.uid, ref.generation)
        job_name = child_name(ref.name, ref.uid, ref.generation, attempt + 1)
        job = build_job(
            ref, spec, placement, job_name=job_name, configmap_name=cm_name, attempt=attempt + 1,
            run_id=run_id_for(ref.uid, ref.generation, attempt + 1), settings=self.settings,
            deliver_to=delivery_target(self.store_uri(spec), self.settings),
        )  # fmt: skip
        try:
            self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
            metrics.RETRIES.inc()
        except AlreadyExists:
            log.info("retry Job %s/%s already exists; adopting it", ref.namespace, job_name)
        conditions = set_condition(
            status.get("conditions"),
            "JobCreated",
            True,
            "NodeLost",
            f"{reading.message}; attempt {attempt + 1} in Job {job_name}",
            ref.generation,
        )
        self.kube.patch_test_status(
            ref.namespace,
            ref.name,
            {
                "phase": PENDING,
                "attempt": attempt + 1,
                "jobName": job_name,
                "runId": run_id_for(ref.uid, ref.generation, attempt + 1),
                "conditions": conditions,
            },
        )
        self._phases[(ref.uid, ref.generation, attempt + 1)] = (PENDING, "NodeLost")
        self.event(
            test,
            "Warning",
            "NodeLost",
            f"{reading.message}; retrying as Job {job_name} (attempt {attempt + 1})",
        )

    # ---------------------------------------------------------------- the end of a run

    def finish(
        self,
        test: dict[str, Any],
        ref: TestRef,
        attempt: int,
        job_name: str,
        reading: Reading,
        *,
        ended_at: datetime | None = None,
        final: bool = False,
    ) -> bool:
        """Turn a finished Job into one run record and the test's final status.

        Returns False when nothing was recorded yet: the result document could not be read
        (``Unavailable``) or the store refused the record. Both are retried by the watchdog,
        with a condition and an Event on the test; neither is ever recorded as the model's
        result. A result that stays unreadable past ``result_unavailable_limit_s`` after
        ``ended_at`` (at once when ``final``: the Job is gone) is recorded as
        ERROR/infrastructure.
        """
        run_id = run_id_for(ref.uid, ref.generation, attempt)
        with self._lock:
            retry = self._retries.get(run_id)
            if run_id in self._finishing or (retry and time.monotonic() < retry.next_at):
                return False  # another thread is at it, or its backoff has not elapsed
            self._finishing.add(run_id)
        try:
            return self._finish(test, ref, attempt, job_name, reading, run_id, ended_at, final)
        finally:
            with self._lock:
                self._finishing.discard(run_id)

    def _finish(
        self,
        test: dict[str, Any],
        ref: TestRef,
        attempt: int,
        job_name: str,
        reading: Reading,
        run_id: str,
        ended_at: datetime | None,
        final: bool,
    ) -> bool:
        spec: TestSpec | None
        try:
            spec = parse_spec(dict(test.get("spec") or {}))
        except SpecError:
            spec = (
                None  # recorded in the operator's store; the spec was valid when the Job was made
            )
        store = self.store_for(spec)
        run_py = self._run_py(ref, test, spec)
        config = read_config(run_py)
        found = self._document(ref, reading, config, store.uri, run_id)
        if isinstance(found, Unavailable):
            waited = (datetime.now(UTC) - ended_at).total_seconds() if ended_at else 0.0
            if not final and waited < self.settings.result_unavailable_limit_s:
                self._defer(test, ref, run_id, "ResultUnavailable", found.reason)
                return False
            found = (
                failure_document(
                    config,
                    Result.ERROR,
                    error_class=ErrorClass.INFRASTRUCTURE,
                    error=f"no result document could be read ({found.reason}); "
                    "the runner's outcome is unknown, so no verdict on the model",
                ),
                DocumentSource.OPERATOR,
            )
        document, source = found
        document = trusted_document(document, config)
        record = record_from_document(
            document,
            run_py,
            source="operator",
            labels={**self._labels(ref, job_name, attempt), "document_source": source.value},
            run_id=run_id,
        )
        try:
            self.record(spec, record)
        except Exception as exc:  # any store failure: classified as the store being unavailable
            log.exception("recording run %s in %s failed; retrying", run_id, store.uri)
            self._defer(
                test,
                ref,
                run_id,
                "StoreUnavailable",
                f"the results store {store.uri} refused the record: {exc}",
            )
            return False
        with self._lock:
            self._retries.pop(run_id, None)
        if source is DocumentSource.DELIVERY:
            try:
                DeliveryArea(store.uri).remove(run_id)
            except DeliveryError:
                log.warning("run %s is recorded; its delivery stays until removed by hand", run_id)
        self._complete(test, ref, document, run_id)
        self.kube.mark_job_recorded(
            ref.namespace, job_name, self.settings.ttl_seconds_after_finished
        )
        return True

    def _defer(
        self, test: dict[str, Any], ref: TestRef, run_id: str, reason: str, message: str
    ) -> None:
        """Retry later with backoff; say why on the test (a condition, and an Event once)."""
        with self._lock:
            previous = self._retries.get(run_id)
            delay = min(
                self.settings.retry_cap_s,
                previous.delay * 2 if previous else self.settings.watchdog_interval_s,
            )
            self._retries[run_id] = _Retry(time.monotonic() + delay, delay)
        status = test.get("status") or {}
        current: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Recorded"), {}
        )
        if current.get("reason") == reason and current.get("status") == "False":
            return  # already said; the condition's message keeps the first occurrence
        conditions = set_condition(
            status.get("conditions"), "Recorded", False, reason, message, ref.generation
        )
        patched = self.kube.patch_test_status(ref.namespace, ref.name, {"conditions": conditions})
        if patched is not None:
            test["status"] = patched.get("status") or {}
        self.event(test, "Warning", reason, f"{message}; retrying in {delay:g} s")

    def _run_py(self, ref: TestRef, test: dict[str, Any], spec: TestSpec | None) -> str:
        """The run.py that ran: the ConfigMap's, byte for byte (else rendered again from the spec)."""
        name = child_name(ref.name, ref.uid, ref.generation)
        cm = self.kube.read_configmap(ref.namespace, name)
        if cm is not None:
            return str(cm["data"]["run.py"])
        status = test.get("status") or {}
        if spec is None or not status.get("cores"):
            raise RuntimeError(
                f"ConfigMap {ref.namespace}/{name} with the run.py of this run is missing and "
                "the test no longer says how it ran"
            )
        log.warning("ConfigMap %s/%s is gone; recording run.py rendered again", ref.namespace, name)
        parallelism = Parallelism(status.get("parallelism") or Parallelism.NONE.value)
        return render_script(spec.run_config(int(status["cores"]), parallelism))

    def _document(
        self, ref: TestRef, reading: Reading, config: RunConfig, store_uri: str, run_id: str
    ) -> tuple[ResultDocument, DocumentSource] | Unavailable:
        """The runner's document: delivered, else from the log, else from the termination
        message; else one the operator writes for the Job's outcome; else Unavailable."""
        problems: list[str] = []
        try:
            delivered = DeliveryArea(store_uri).get(run_id)
        except (DeliveryError, ValueError) as exc:
            return Unavailable(f"the delivery area could not be read: {exc}")
        if delivered is not None:
            try:
                return ResultDocument.model_validate_json(delivered), DocumentSource.DELIVERY
            except ValidationError as exc:
                problems.append(f"the delivered document is malformed: {_short(str(exc))}")
        if reading.state in INFRA_RESULTS:
            result, infra_class = INFRA_RESULTS[reading.state]
            return (
                failure_document(config, result, error_class=infra_class, error=reading.message),
                DocumentSource.OPERATOR,
            )
        texts: list[tuple[DocumentSource, str | None]] = []
        if reading.pod_name:
            try:
                text = self.kube.pod_log(
                    ref.namespace, reading.pod_name, RUNNER_CONTAINER, self.settings.log_tail_lines
                )
            except ApiException as exc:
                return Unavailable(f"the runner's log could not be read: {exc.status} {exc.reason}")
            texts.append((DocumentSource.LOG, text))
        texts.append((DocumentSource.TERMINATION_MESSAGE, reading.termination_message))
        for source, text in texts:
            if not text:
                continue
            try:
                document = parse_result_line(text)
            except (ValueError, ValidationError) as exc:
                problems.append(
                    f"the result line in the {source.value} is malformed: {_short(str(exc))}"
                )
                continue
            if document is not None:
                return document, source
        if reading.pod_name is None:
            return Unavailable(
                "the runner pod is gone and no result document was delivered"
                + (f" ({'; '.join(problems)})" if problems else "")
            )
        message = reading.termination_message or ""
        if message.startswith(RUNNER_MESSAGE_PREFIX):
            # The runner ran and says why run.py left no document (e.g. killed by SIGKILL
            # without the container being OOMKilled).
            error_class, error = ErrorClass.RUNTIME, f"{reading.message}: {message}"
        else:
            # Not even the runner's own message: the runner itself did not run as it should.
            error_class = ErrorClass.INFRASTRUCTURE
            error = (
                f"{reading.message} and the runner left no result document and no message of "
                "its own (is model_support installed in the runner image?)"
                + (f"; {'; '.join(problems)}" if problems else "")
                + f". Termination message:\n{message or '(none)'}"
            )
        return (
            failure_document(config, Result.ERROR, error_class=error_class, error=error),
            DocumentSource.OPERATOR,
        )

    def _complete(
        self, test: dict[str, Any], ref: TestRef, document: ResultDocument, run_id: str
    ) -> None:
        with self._lock:
            for key in [k for k in list(self._phases) if k[0] == ref.uid]:
                del self._phases[key]
        status = test.get("status") or {}
        summary = document.result.value + (
            f"/{document.error_class.value}" if document.error_class else ""
        )
        conditions = set_condition(
            status.get("conditions"),
            "Running",
            False,
            "Finished",
            "the runner finished",
            ref.generation,
        )
        conditions = set_condition(
            conditions,
            "Completed",
            True,
            summary.replace("/", "_").replace("-", "_"),
            _short(document.error) or summary,
            ref.generation,
        )
        conditions = set_condition(
            conditions, "Recorded", True, "Recorded", f"run {run_id} recorded", ref.generation
        )
        timings, memory = document.timings, document.memory
        new_status: dict[str, Any] = {
            "phase": COMPLETED,
            "result": document.result.value,
            "errorClass": document.error_class.value if document.error_class else None,
            "message": _short(document.error) or None,
            "runId": run_id,
            "wallTimeSeconds": timings.wall_time_s,
            "compileSeconds": timings.compile_s,
            "decodeTokensPerSecond": timings.decode_tokens_per_s,
            "peakDeviceMemoryBytes": memory.peak_device_memory_bytes,
            "hostPeakRssBytes": memory.host_peak_rss_bytes,
            "finishedAt": _now(),
            "conditions": conditions,
        }
        self.kube.patch_test_status(ref.namespace, ref.name, new_status)
        warning = document.result not in (Result.PASS, Result.EXCLUDED)
        message = f"{summary}: {_short(document.error)}" if document.error else summary
        self.event(
            test, "Warning" if warning else "Normal", _EVENT_REASON[document.result], message
        )

    # ---------------------------------------------------------------- stuck pods

    def watched_namespaces(self) -> list[str | None]:
        """The namespaces to list children in; [None] means every namespace."""
        return list(self.settings.namespaces) if self.settings.namespaces else [None]

    def check_waiting(self, now: datetime | None = None) -> int:
        """Look at pending runner pods: a pod no node fits makes its test Queued (or ends it,
        past ``unschedulable_limit_s`` when set); an image that cannot be pulled past its limit
        (counted from scheduling) ends the test. Returns the number of tests ended."""
        ended = 0
        for namespace in self.watched_namespaces():
            for pod in self.kube.list_pods(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, phase="Pending"
            ):
                ref, attempt = self._pod_owner(pod)
                if ref is None:
                    continue
                why = stuck_reason(
                    pod,
                    now=now,
                    unschedulable_limit_s=self.settings.unschedulable_limit_s,
                    image_pull_limit_s=self.settings.image_pull_limit_s,
                )
                if why is not None:
                    test = self._current_test(ref, attempt)
                    if test is None:
                        continue
                    job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
                    reading = Reading(
                        JobState.INFRASTRUCTURE, f"runner pod {pod['metadata']['name']} {why}"
                    )
                    if self.finish(test, ref, attempt, job_name, reading, final=True):
                        self.kube.delete_job(ref.namespace, job_name)
                        ended += 1
                    continue
                waiting = pod_waiting(pod, now)
                if waiting is not None and waiting.kind is WaitKind.UNSCHEDULABLE:
                    self._set_phase(
                        ref, attempt, QUEUED, "Queued", True, "Unschedulable",
                        f"waiting for capacity: {waiting.message}", backwards=True,
                        event=("Normal", "WaitingForCapacity"),
                    )  # fmt: skip
                else:
                    self._set_phase(
                        ref, attempt, PENDING, "Queued", False, "Scheduled",
                        "the runner pod is scheduled", only_from=QUEUED,
                    )  # fmt: skip
        return ended

    def _pod_owner(self, pod: dict[str, Any]) -> tuple[TestRef | None, int]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        try:
            ref = TestRef(
                pod["metadata"]["namespace"],
                labels[LABEL_TEST],
                labels[LABEL_UID],
                int(labels[LABEL_GENERATION]),
            )
            return ref, int(labels[LABEL_ATTEMPT])
        except (KeyError, ValueError):
            return None, 0


def _ended_at(job: dict[str, Any]) -> datetime | None:
    """When a Job finished: its completionTime, else its terminal condition's transition."""
    status = job.get("status") or {}
    stamps = [status.get("completionTime")] + [
        c.get("lastTransitionTime")
        for c in status.get("conditions") or []
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
    ]
    for stamp in stamps:
        if stamp:
            return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return None


def _resync_finished_jobs(reconciler: Reconciler) -> int:
    """Finish tests whose Job ended but whose completion was never handled.

    kopf does not retry event handlers: if the API failed while a Job's end was being read, the
    test would stay Running until an operator restart. The watchdog offers every finished Job
    again; ``on_job`` ignores tests already completed, so this is idempotent.
    """
    offered = 0
    for namespace in reconciler.watched_namespaces():
        for job in reconciler.kube.list_jobs(
            namespace, {LABEL_MANAGED_BY: MANAGED_BY}, without=(LABEL_RECORDED,)
        ):
            if read_job(job, []).state != JobState.ACTIVE:
                reconciler.on_job(job, "RESYNC")
                offered += 1
    return offered


def build_registry(settings: OperatorSettings, kube: Kube | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers (a fresh one per operator, tests included)."""
    registry = kopf.OperatorRegistry()
    reconciler = Reconciler(settings, kube or Kube(api_client(settings.api_server)))
    watchdog: dict[str, asyncio.Task[None]] = {}

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Progress and diff-base go to annotations, so the status schema stays strict.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.loggers = False  # our own Events only, not one per handler log line
        settings.execution.max_workers = 32
        settings.peering.standalone = True
        settings.networking.request_timeout = 60
        watchdog["task"] = asyncio.create_task(_watchdog(reconciler), name="model-support watchdog")

    @kopf.on.cleanup(registry=registry)
    async def stop_watchdog(**_: Any) -> None:
        task = watchdog.pop("task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if settings.api_server is not None:
            return kopf.ConnectionInfo(server=settings.api_server, insecure=True)
        return kopf.login_via_client(**kwargs)

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    def resume_test(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        reconciler.reconcile(body, dict(status), patch, resumed=True)

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    def reconcile_test(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        reconciler.reconcile(body, dict(status), patch, resumed=False)

    @kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
    def job_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        # type None: the Job was listed when the watch (re)started, e.g. after an operator restart.
        reconciler.on_job(_plain(body), type or "LISTED")

    return registry


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A kopf body as plain nested dicts (the manifest builders and readers expect those)."""
    return dict(json.loads(json.dumps(body, default=dict)))


async def _watchdog(reconciler: Reconciler) -> None:
    interval = reconciler.settings.watchdog_interval_s
    while True:
        await asyncio.sleep(interval)
        for check in (reconciler.check_waiting, lambda: _resync_finished_jobs(reconciler)):
            try:
                await asyncio.to_thread(check)
            except Exception:
                # The next round tries again; an API hiccup must not stop the watchdog for good.
                log.exception("the watchdog's check failed; retrying in %s s", interval)


__all__ = ["FIELD_MANAGER", "Reconciler", "build_registry", "set_condition"]
