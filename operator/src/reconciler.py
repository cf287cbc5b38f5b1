"""The operator's logic for ModelSupportTests: the state machine of :mod:`.lifecycle`, driven by
what the cluster reports.

Each input (a test's event, a runner Job's event, a finding of the :mod:`.watchdog`) is turned
into one typed lifecycle event, after the work it calls for is done by the module whose job it
is: planning and creating the children (:mod:`.launch`), the delivery slots (:mod:`.slots`),
reading what a run left (:mod:`.results`), recording it (:mod:`.recording`), the backoffs
(:mod:`.retries`), watching Jobs and releasing them (:mod:`.jobs`). The event then moves the
test by the table, in one status write (:meth:`Reconciler.apply`, through
:mod:`.status_writer`'s conflict retries), with the Kubernetes Event the move announces.

State lives in the resource's status, never in the operator: every child has a deterministic
name per generation and attempt, a create that meets 409 adopts what is there, a completed test
is never touched again, and the run id is derived from uid + generation + attempt, so an
operator that restarts (or sees an event twice) records each run exactly once. What the operator
keeps in memory (the tests it watches, backoff timers, the stages it last wrote) only saves API
requests; losing it on a restart loses nothing.

Methods are synchronous on purpose: they use the blocking Kubernetes client and the results
store, and kopf runs synchronous handlers in its thread pool, off its event loop.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from model_support.operator import planning
from model_support.operator.costing import run_cost
from model_support.operator.jobs import (
    RESYNC,
    AttemptKey,
    Releases,
    RunningWrites,
    job_owner,
    progress,
)
from model_support.operator.kube import CreateRefused, Kube, being_deleted
from model_support.operator.launch import Launcher
from model_support.operator.lifecycle import (
    TERMINAL,
    Admitted,
    Event,
    Excluded,
    FailedBeforeRun,
    KueueWaiting,
    Launched,
    Move,
    NextAttemptRefused,
    NodeLost,
    NotAdmitted,
    PodCreated,
    PodReady,
    PodRefused,
    Recorded,
    RecordingDeferred,
    RetryLater,
    Scheduled,
    SpecInvalid,
    Stage,
    Unschedulable,
    WaitedPastDeadline,
    allows,
    handled,
    stage_of,
    step,
)
from model_support.operator.manifests import Placement, TestRef
from model_support.operator.outcome import (
    DocumentSource,
    JobState,
    Reading,
    job_ended_at,
    job_outcome_stands,
    read_job,
    trusted_document,
)
from model_support.operator.planning import InvalidTest
from model_support.operator.recording import Recorder
from model_support.operator.resource import LABEL_RECORDED, LABEL_UID, run_id_for
from model_support.operator.results import ResultReader, is_document
from model_support.operator.retries import Retries
from model_support.operator.settings import OperatorSettings
from model_support.operator.slots import DeliverySlots
from model_support.operator.spec import SpecError, TestSpec, parse_spec
from model_support.operator.status import Phase, StatusPatch, TestStatus
from model_support.operator.status_writer import StatusWriter
from model_support.records import ResultDocument, failure_document
from model_support.runpath import Unavailable
from model_support.script import read_config
from model_support.vocabulary import ErrorClass, Parallelism, Result

log = logging.getLogger(__name__)

GiB = 2**30
SHOWN_LATELY_ROUNDS = 3
"""A test a watch event showed within this many watchdog intervals is launched from that view
without a read (the watchdog's retries of tests kopf has not handled yet)."""

WaitingMove = (
    KueueWaiting
    | Admitted
    | PodReady
    | NotAdmitted
    | Unschedulable
    | Scheduled
    | PodRefused
    | PodCreated
)
"""Events that move a test among the stages with a Job (Queued, Pending, Running), or say what
it waits for."""


class _NotRead:
    """Marks a delivery not read yet (``finish`` reads it itself)."""


_NOT_READ = _NotRead()


def ref_of(body: dict[str, Any]) -> TestRef:
    """The identity of the test ``body`` is, at its current generation."""
    meta = body["metadata"]
    return TestRef(meta["namespace"], meta["name"], meta["uid"], int(meta.get("generation") or 1))


@dataclass
class Reconciler:
    """The lifecycle of every watched test, bound to the operator's settings, an API client
    and the results stores."""

    settings: OperatorSettings
    kube: Kube
    delivery_key: bytes | None = None
    """The key of delivery slots (:func:`model_support.delivery.slot_for`); None: from the
    environment (``MODEL_SUPPORT_DELIVERY_KEY``), else random for this process."""

    def __post_init__(self) -> None:
        self.slots = DeliverySlots(self.settings, self.kube, self.delivery_key)
        self.delivery_key = self.slots.key
        self.recorder = Recorder(self.settings, self.kube)
        self.writer = StatusWriter(self.kube, on_forget=self._forget_memory)
        self.launcher = Launcher(self.settings, self.kube, self.slots, self.recorder.store_uri)
        self.reader = ResultReader(self.settings, self.kube)
        self.retries = Retries(self.settings)
        self.running = RunningWrites(self.settings)
        self.releases = Releases(self.settings, self.kube)
        self._lock = threading.Lock()
        self._reconciling: set[tuple[str, int]] = set()
        self._finishing: set[str] = set()
        self._stages: dict[AttemptKey, Stage] = {}
        """The stage this process last wrote or read per attempt (saves requests for moves the
        table refuses anyway)."""

    # ---------------------------------------------------------------- the tests we know of

    @property
    def tests(self) -> dict[str, dict[str, Any]]:
        """Every watched test by uid, as the watch last showed it (saves a GET per Job event)."""
        return self.writer.tests

    def observe_test(self, body: dict[str, Any], event_type: str | None) -> None:
        """Keep :attr:`tests` as the watch shows them (called for every test event)."""
        self.writer.observe(body, event_type)

    def forget_test(self, uid: str) -> None:
        """Drop a test that no longer exists from what this process keeps."""
        self.writer.forget(uid)

    def _forget_memory(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._stages if k[0] == uid]:
                del self._stages[key]
        self.running.forget(uid)

    def current_test(
        self, ref: TestRef, attempt: int, *, completed: bool = False
    ) -> dict[str, Any] | None:
        """The test a Job serves, if that Job is still the test's current, unfinished attempt
        (``completed``: finished ones too)."""
        test = self.writer.get(ref)
        if test is None or being_deleted(test):
            return None  # deleted or being deleted (its children go with it)
        if int(test["metadata"].get("generation") or 1) != ref.generation:
            return None  # the spec changed: this Job's generation is superseded
        status = TestStatus.read(test.get("status"))
        if status.observedGeneration != ref.generation or (status.attempt or 0) != attempt:
            return None  # superseded by a spec change or a retry (or not written yet)
        if status.phase is Phase.COMPLETED and not completed:
            return None  # a terminal phase is never overwritten
        return test

    # ---------------------------------------------------------------- the one way a test moves

    def apply(self, ref: TestRef, event: Event) -> dict[str, Any] | None:
        """Move the test's generation by ``event``: the table's move from the status as the API
        has it (computed again after a conflict), written once, then the Event it announces.
        Returns the test as written; None when nothing was (refused, nothing to change, gone)."""
        moves: list[Move] = []

        def build(status: TestStatus) -> StatusPatch | None:
            moves.clear()
            move = step(status, ref.generation, event)
            if move is None:
                self._remember(ref, status.attempt or 0, stage_of(status, ref.generation))
                return None
            moves.append(move)
            return move.patch

        written = self.writer.write(ref, build)
        if written is None or not moves:
            return None
        move = moves[-1]
        self._remember(ref, TestStatus.read(written.get("status")).attempt or 0, move.to)
        if move.announce is not None:
            said = move.announce
            self.writer.event(written, said.type, said.reason, said.message)
        return written

    def _remember(self, ref: TestRef, attempt: int, stage: Stage) -> None:
        with self._lock:
            if stage in TERMINAL:  # nothing moves it any more: what would be kept is moot
                for key in [k for k in self._stages if k[0] == ref.uid]:
                    del self._stages[key]
            else:
                self._stages[(ref.uid, ref.generation, attempt)] = stage

    def move(self, ref: TestRef, event: WaitingMove) -> None:
        """Move an active test on a Job's (or the watchdog's) word, unless what this process
        last wrote already says the table refuses it (then no request at all)."""
        with self._lock:
            known = self._stages.get((ref.uid, ref.generation, event.attempt))
        if known is not None and not allows(known, event):
            return
        if self.current_test(ref, event.attempt) is None:
            return
        self.apply(ref, event)

    # ---------------------------------------------------------------- test created / changed

    def on_test(self, body: dict[str, Any], event_type: str | None) -> None:
        """A test changed (or was listed: ``event_type`` None at startup): reconcile it when
        its generation is not handled yet; on startup, look after its Job.

        Level-based: kopf only reports events, nothing is persisted besides the status (no
        progress or diff-base annotations to write), and what the event cannot finish (a Hub
        outage) the watchdog offers again (:meth:`.watchdog.Watchdog.retry_tests`).
        """
        self.writer.observe(body, event_type)
        if event_type == "DELETED" or being_deleted(body):
            return  # a test being deleted is never sized, launched or recorded
        # A late event (older than what this process wrote or saw since, e.g. the startup
        # listing after the test was completed) must not undo a handled generation: act on
        # the newest view. (A Job that went while the operator was away, or while a watch
        # relisted, is found by the watchdog's audit after every listing: one list, not a read
        # per test.)
        self.reconcile(self.writer.newest(body))

    def reconcile(self, body: dict[str, Any], *, from_cache: bool = False) -> None:
        """Bring one generation of a test to a running Job (or a recorded final state).

        ``from_cache``: ``body`` is what this process last saw, not an event just received, so
        the API is asked whether the test still exists before anything is created for it.
        """
        if being_deleted(body):
            return
        ref = ref_of(body)
        status = TestStatus.read(body.get("status"))
        if handled(status, ref.generation):
            return  # this generation is handled; its Job's events carry it on
        key = (ref.uid, ref.generation)
        tries = self.retries.sizing_tries(key)
        with self._lock:
            if key in self._reconciling or tries is None:
                return  # being reconciled in another thread, or waiting for its retry
            # Another thread may have launched this generation since ``body`` was read (the
            # watchdog's snapshot, an event queued behind the launch): the newest view says.
            latest = self.writer.tests.get(ref.uid)
            if latest is not None and handled(
                TestStatus.read(latest.get("status")), ref.generation
            ):
                return
            self._reconciling.add(key)
        try:
            self._plan_and_launch(body, ref, status, tries, from_cache)
        finally:
            with self._lock:
                self._reconciling.discard(key)

    def _plan_and_launch(
        self, body: dict[str, Any], ref: TestRef, status: TestStatus, tries: int, from_cache: bool
    ) -> None:
        self.launcher.delete_superseded(ref, status)
        planned = self.launcher.plan(body, ref)
        if isinstance(planned, planning.Invalid):
            self.apply(ref, SpecInvalid(planned.message))
            return
        if isinstance(planned, planning.Unreadable):
            self._fail_before_run(ref, planned.spec, ErrorClass.LOAD, planned.message, "LoadFailed")
            return
        if isinstance(planned, planning.Unreachable):
            if self.retries.sizing_gives_up(tries):
                message = f"{planned.message} (gave up after {tries + 1} tries)"
                self._fail_before_run(
                    ref, planned.spec, ErrorClass.INFRASTRUCTURE, message, "SizingFailed"
                )
                return
            self._retry_later(ref, tries, "Sized", "SizingRetrying", planned.message)
            return
        self.retries.sized((ref.uid, ref.generation))
        if isinstance(planned, planning.Exclude):
            record = self.recorder.excluded(ref, planned.spec, planned.exclusion)
            run_id = self.recorder.before_run(ref, planned.spec, record)
            exclusion = planned.exclusion
            self.apply(ref, Excluded(run_id, exclusion.reason, exclusion.message))
            return
        if from_cache:
            # A test a watch event showed lately exists (a Job made for one deleted since goes
            # with its owner); else it is read: a relist may have missed its deletion.
            fresh = self.writer.shown(ref, SHOWN_LATELY_ROUNDS * self.settings.watchdog_interval_s)
            if fresh is None:
                return  # what we knew is stale (e.g. missed after a watch relist): no owner, no Job
            if handled(TestStatus.read(fresh.get("status")), ref.generation):
                return  # launched meanwhile (by another replica, or before a restart)
        try:
            self._launch(ref, planned.spec, planned.placement)
        except CreateRefused as exc:
            if exc.for_good:  # admission or validation: the spec cannot run as is
                self.apply(ref, SpecInvalid(str(exc)))
            else:  # quota (403), throttling (429), the API server's trouble: retried
                self._retry_later(ref, tries, "JobCreated", "CreateRefused", str(exc))

    def _launch(self, ref: TestRef, spec: TestSpec, placement: Placement) -> None:
        attempt = 1
        configmap_name, job_name, run_script_sha256 = self.launcher.start(
            ref, spec, placement, attempt
        )
        self.apply(
            ref,
            Launched(
                placement=placement,
                overridden=bool(spec.cores),
                queue=spec.queueName,
                job_name=job_name,
                configmap_name=configmap_name,
                run_id=run_id_for(ref.uid, ref.generation, attempt),
                run_script_sha256=run_script_sha256,
                revision=spec.revision,
                attempt=attempt,
            ),
        )

    def _retry_later(
        self,
        ref: TestRef,
        tries: int,
        condition: Literal["Sized", "JobCreated"],
        reason: Literal["SizingRetrying", "CreateRefused"],
        why: str,
    ) -> None:
        """Reconcile this generation again after a capped backoff, saying why on the test."""
        delay = self.retries.size_later((ref.uid, ref.generation), tries)
        message = f"{why}; retrying in {delay:g} s (try {tries + 1})"
        log.warning("%s/%s: %s", ref.namespace, ref.name, message)
        self.apply(ref, RetryLater(condition, reason, message, first=tries == 0))

    def _fail_before_run(
        self,
        ref: TestRef,
        spec: TestSpec,
        error_class: ErrorClass,
        message: str,
        reason: Literal["LoadFailed", "SizingFailed"],
    ) -> None:
        """A generation that ends before any Job (the model cannot be read): recorded."""
        record = self.recorder.failed_before_run(ref, spec, Result.ERROR, error_class, message)
        run_id = self.recorder.before_run(ref, spec, record)
        self.apply(ref, FailedBeforeRun(run_id, Result.ERROR, error_class, message, reason))

    def job_gone(self, body: dict[str, Any]) -> bool:
        """An active test whose Job a listing lacks (deleted while the operator was away, or
        while its Jobs watch relisted: no DELETED event came): asked of the API; a Job that is
        gone is handled as the Job-deleted path does. The test is finished from its delivered
        document, or as ERROR/infrastructure without one; a test that waited for its next
        attempt's Job tries that again. Returns whether the Job was gone."""
        ref = ref_of(body)
        status = TestStatus.read(body.get("status"))
        job_name, attempt = status.jobName, status.attempt or 1
        if job_name is None or self.current_test(ref, attempt) is None:
            return False
        if self.kube.read_job(ref.namespace, job_name) is not None:
            return False  # the listing was older than the Job (or it is recorded meanwhile)
        if stage_of(status, ref.generation) is Stage.NEXT_ATTEMPT_REFUSED:
            # Its end was read already (the cluster's doing): only the next Job is missing.
            why = status.condition("JobCreated")
            reading = Reading(JobState.NODE_LOST, why.message if why else "the Job ended")
            self._start_again(body, ref, attempt, reading, NodeLost)
            return True
        reading = Reading(
            JobState.INFRASTRUCTURE,
            f"the runner Job {job_name} disappeared before its result was read",
        )
        self.finish(body, ref, attempt, job_name, reading, final=True)
        return True

    # ---------------------------------------------------------------- runner Job events

    def on_job(self, job: dict[str, Any], event_type: str) -> None:
        """A runner Job changed: move the test's phase, retry after node loss, or finish it."""
        owner = job_owner(job)
        if owner is None:
            return
        ref, attempt = owner
        meta = job.get("metadata") or {}
        job_name = meta["name"]
        reading = read_job(job, [])
        deleting = event_type == "DELETED" or being_deleted(job)
        if reading.state == JobState.ACTIVE and not deleting:
            # Phases move with the Job's own events only: a resync's listing may be older than
            # events handled meanwhile (a Running from before a preemption would be written
            # over its Queued). The resync is there for Jobs that ended.
            if event_type != RESYNC:
                self._progress(ref, progress(job, attempt))
            return
        test = self.current_test(ref, attempt, completed=True)
        if test is None:
            return
        if deleting and TestStatus.read(test.get("status")).phase is not Phase.COMPLETED:
            # A Job goes first when its test is deleted (the garbage collector deletes the
            # dependents of a test in foreground deletion while the test still exists, and the
            # test's own event may come later): ask the API, not what was last seen.
            fresh = self.writer.fresh(ref)
            if fresh is None:
                return  # the test is gone or being deleted: nothing is recorded
            test = fresh
        if TestStatus.read(test.get("status")).phase is Phase.COMPLETED:
            if (
                LABEL_RECORDED not in (meta.get("labels") or {})
                and event_type != "DELETED"
                and not self.releases.released_lately(ref.namespace, job_name)
            ):
                # Recorded, but the operator stopped before it released the Job to its TTL.
                self.releases.release(ref.namespace, job_name, job_ended_at(job))
            return
        run_id = run_id_for(ref.uid, ref.generation, attempt)
        if not self.retries.recording_due(run_id):
            return  # a deferred recording whose backoff has not elapsed
        if self.retries.sizing_tries((ref.uid, ref.generation, attempt + 1)) is None:
            return  # its next attempt's Job was refused: tried again once the backoff passed
        delivered = self.slots.read(self.recorder.store_uri(_spec_or_none(test)), run_id)
        final = event_type == "DELETED"
        if is_document(delivered) and reading.state is JobState.SUCCEEDED:
            # The runner finished by itself and delivered: its pods no longer matter.
            self.finish(
                test, ref, attempt, job_name, reading, ended_at=job_ended_at(job), final=final,
                delivered=delivered,
            )  # fmt: skip
            return
        pods = self.kube.list_pods(ref.namespace, {LABEL_UID: ref.uid, "job-name": job_name})
        reading = read_job(job, pods)
        if is_document(delivered) and not job_outcome_stands(reading):
            # A delivery outlives a node lost after it; the Job's own end (deadline, OOM, a
            # runner that never started) is never overruled by what a pod wrote.
            self.finish(
                test, ref, attempt, job_name, reading, ended_at=job_ended_at(job), final=final,
                delivered=delivered,
            )  # fmt: skip
            return
        if reading.state == JobState.ACTIVE:
            # The Job was deleted under a running test (by hand, or its node pool went away).
            reading = dataclasses.replace(
                reading,
                state=JobState.INFRASTRUCTURE,
                message=f"the runner Job {job_name} was deleted before it finished",
            )
        if reading.state == JobState.NODE_LOST and self.retries.another_attempt(attempt):
            self._start_again(test, ref, attempt, reading, NodeLost)
            return
        if reading.state == JobState.WAITED:
            # Waiting and replacement are never a verdict, however often (a test waits for
            # capacity as long as it takes): the next attempt's Job starts the clock anew.
            self._start_again(test, ref, attempt, reading, WaitedPastDeadline)
            return
        self.finish(
            test, ref, attempt, job_name, reading, ended_at=job_ended_at(job), final=final,
            delivered=delivered,
        )  # fmt: skip

    def _progress(self, ref: TestRef, event: PodReady | KueueWaiting | Admitted) -> None:
        """Move the test forward as its active Job does; a Running write is held back a moment
        (unless the run ends first: then one write says Completed, see :meth:`flush_running`)."""
        if isinstance(event, PodReady) and self.settings.running_write_delay_s > 0:
            with self._lock:
                known = self._stages.get((ref.uid, ref.generation, event.attempt))
            if known is not None and not allows(known, event):
                return  # said already
            self.running.hold(ref, event)
            return
        self.move(ref, event)

    def flush_running(self) -> int:
        """Write the Running phase of runner pods ready for ``running_write_delay_s`` whose run
        has not ended meanwhile; returns how many were written."""
        due = self.running.due()
        for ref, event in due:
            self.move(ref, event)
        return len(due)

    def _start_again(
        self,
        test: dict[str, Any],
        ref: TestRef,
        attempt: int,
        reading: Reading,
        event: type[NodeLost] | type[WaitedPastDeadline],
    ) -> None:
        """The attempt ended without a verdict (its node lost, its time spent waiting): the
        same run.py again in a new Job (attempt + 1). A create the API server refuses for now
        is said on the test (``NextAttemptRefused``) and tried again after a backoff, as a
        refused first Job is; refused for good, the test is Invalid."""
        key = (ref.uid, ref.generation, attempt + 1)
        tries = self.retries.sizing_tries(key)
        if tries is None:
            return  # refused lately: tried again once its backoff passed
        spec = parse_spec(dict(test.get("spec") or {}))
        status = TestStatus.read(test.get("status"))
        if status.cores is None:
            raise RuntimeError(f"test {ref.namespace}/{ref.name} has no cores in its status")
        placement = Placement(
            status.cores,
            status.parallelism or Parallelism.NONE,
            status.hostMemoryBytes or int(self.settings.min_host_memory_gib * GiB),
            status.checkpointBytes or 0,
            pod_cores=status.podCores or None,
        )
        try:
            job_name = self.launcher.start_again(ref, spec, placement, attempt + 1)
        except InvalidTest as exc:
            # The operator's settings changed since the first attempt (e.g. DRA's default LNC
            # removed): no record, since the model did nothing wrong; the message says what to fix.
            self.apply(ref, SpecInvalid(f"cannot retry after {reading.message}: {exc}"))
            return
        except CreateRefused as exc:
            if exc.for_good:  # admission or validation: this retry cannot run as is
                self.apply(ref, SpecInvalid(f"cannot retry after {reading.message}: {exc}"))
                return
            delay = self.retries.size_later(key, tries)
            message = (
                f"{reading.message}; attempt {attempt + 1}: {exc}; retrying in {delay:g} s "
                f"(try {tries + 1})"
            )
            log.warning("%s/%s: %s", ref.namespace, ref.name, message)
            self.apply(ref, NextAttemptRefused(attempt, message, first=tries == 0))
            return
        self.retries.sized(key)
        next_run = run_id_for(ref.uid, ref.generation, attempt + 1)
        self.apply(ref, event(attempt, job_name, next_run, reading.message))

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
        delivered: bytes | Unavailable | _NotRead | None = _NOT_READ,
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
            if run_id in self._finishing or not self.retries.recording_due(run_id):
                return False  # another thread is at it, or its backoff has not elapsed
            self._finishing.add(run_id)
        try:
            return self._finish(
                test, ref, attempt, job_name, reading, run_id, ended_at, final, delivered
            )
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
        delivered: bytes | Unavailable | _NotRead | None,
    ) -> bool:
        spec = _spec_or_none(test)
        store = self.recorder.store_for(spec)
        status = TestStatus.read(test.get("status"))
        run_py = self.recorder.run_py(ref, status, spec)
        config = read_config(run_py)
        if isinstance(delivered, _NotRead):
            delivered = self.slots.read(self.recorder.store_uri(spec), run_id)
        found = self.reader.document(ref, reading, config, delivered)
        if isinstance(found, Unavailable):
            stored = self.recorder.stored(store, run_id)
            if stored is not None:
                # Recorded before (by an operator that stopped before writing the status).
                source = stored.labels.get("document_source", "")
                known = source in {s.value for s in DocumentSource}
                found = (
                    stored.document,
                    DocumentSource(source) if known else DocumentSource.OPERATOR,
                )
        if isinstance(found, Unavailable):
            waited = (datetime.now(UTC) - ended_at).total_seconds() if ended_at else 0.0
            if not final and waited < self.settings.result_unavailable_limit_s:
                self._defer(ref, attempt, run_id, "ResultUnavailable", found.reason)
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
        cache = spec.compileCache if spec is not None else None
        document = trusted_document(
            document,
            config,
            declared_stack=self.recorder.declared_stack(spec),
            cache_location=None if cache is None else (cache.target or cache.source),
            started_at=reading.started_at,
            ended_at=reading.ended_at or ended_at,
            node_instance_types=reading.node_instance_types,
        )
        record = self.recorder.of_run(
            ref, spec, job_name, attempt, document, source, run_py,
            pod_cores=status.podCores, node_instance_types=reading.node_instance_types,
        )  # fmt: skip
        try:
            first_time = self.recorder.record(spec, record)
            if not first_time:
                # Recorded before (the operator stopped before it wrote the status): the status
                # shows what was recorded then, not what can be read now.
                document = store.get(run_id).document
        except Exception as exc:  # any store failure: classified as the store being unavailable
            log.exception("recording run %s in %s failed; retrying", run_id, store.uri)
            self._defer(
                ref,
                attempt,
                run_id,
                "StoreUnavailable",
                f"the results store {store.uri} refused the record: {exc}",
            )
            return False
        self.retries.recorded(run_id)
        self.slots.remove(store.uri, run_id)  # the slot (prepared, delivered or not) is done with
        # Before the status says Completed: a concurrent resync must not release it twice.
        self.releases.about_to_release(ref.namespace, job_name)
        if not first_time and self.writer.completed(ref):
            self.releases.release_attempts(ref, attempt, reading.ended_at or ended_at)
            return True  # what we knew of the test was behind: it is complete, say nothing twice
        self._complete(test, ref, attempt, document, run_id)
        self.releases.release_attempts(ref, attempt, reading.ended_at or ended_at)
        return True

    def _complete(
        self,
        test: dict[str, Any],
        ref: TestRef,
        attempt: int,
        document: ResultDocument,
        run_id: str,
    ) -> None:
        # The run ended: Completed says it in one write, with the start a held Running had.
        started = self.running.ended(ref)
        status = TestStatus.read(test.get("status"))
        used, cost = run_cost(test.get("spec") or {}, document, self.settings, status.podCores)
        self.apply(ref, Recorded(attempt, run_id, document, used, cost, started))

    def _defer(
        self,
        ref: TestRef,
        attempt: int,
        run_id: str,
        reason: Literal["ResultUnavailable", "StoreUnavailable"],
        message: str,
    ) -> None:
        """Retry the recording later with backoff; say why on the test (a condition, and an
        Event once)."""
        delay = self.retries.record_later(run_id)
        self.apply(ref, RecordingDeferred(attempt, reason, message, delay))


def _spec_or_none(test: dict[str, Any]) -> TestSpec | None:
    try:
        return parse_spec(dict(test.get("spec") or {}))
    except SpecError:
        return None  # recorded in the operator's store; the spec was valid when the Job was made


__all__ = ["Reconciler", "ref_of"]
