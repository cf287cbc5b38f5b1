"""The lifecycle of one ModelSupportTest generation, as one state machine.

A test generation is always in one :class:`Stage` (its ``status.phase``, refined by the condition
that says what it waits for), read from its status by :func:`stage_of`. What happens to it
arrives as a typed event (``Launched``, ``PodReady``, ``Recorded`` ...). :data:`TRANSITIONS` is
the whole table: for each event, the stages it may leave, the stages it leads to, and the small
function that writes the move. :func:`step` is the only way a status changes::

    status (as the API has it) + event  ->  Move (one typed status patch, the Event to post)
                                        or  None (refused: not a move from this stage)

Nothing here touches the cluster (its only outside input is the clock, for the timestamps a
status carries), so the table is tested on its own (tests/operator/test_lifecycle.py) and the reconciler stays the part
that observes the cluster and does the work: it turns what it saw (a Job's event, the
watchdog's finding, sizing's answer) into an event, and writes the move once, through
:class:`~model_support.operator.status.StatusPatch`, with conflict retries.

Rules the table keeps, whoever sends the event:

* Completed and Invalid end a generation: nothing moves them (a new ``spec`` is a new
  generation, which starts again from New);
* waiting stages move forward only (Queued -> Pending -> Running), except that a runner pod
  that lost its place (Kueue preempted it, no node fits it any more) goes back to Queued;
* an event about one attempt (a Job) is refused once the test moved on to another attempt;
* waiting and a replaced pod are never a verdict: an attempt that ended that way leads to the
  next attempt (a new Job), never to Completed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from model_support.operator.manifests import Placement
from model_support.operator.status import (
    MESSAGE_LIMIT,
    Phase,
    StatusPatch,
    TestStatus,
    kstatus_conditions,
    now,
    set_condition,
)
from model_support.records import ResultDocument
from model_support.vocabulary import ErrorClass, ExclusionReason, Result


class Stage(StrEnum):
    """Where a test generation stands: its phase, and for a waiting one, what it waits for
    (each stage's meaning is in :func:`table_markdown`)."""

    NEW = "New"
    RETRYING = "Pending/retrying"
    NEXT_ATTEMPT_REFUSED = "Pending/nextAttemptRefused"
    PENDING = "Pending"
    QUEUED_FOR_ADMISSION = "Queued/KueueAdmission"
    NOT_ADMITTED = "Queued/NotAdmitted"
    QUEUED_FOR_CAPACITY = "Queued/Unschedulable"
    RUNNING = "Running"
    COMPLETED = "Completed"
    INVALID = "Invalid"

    @property
    def phase(self) -> Phase | None:
        """The ``status.phase`` this stage shows (None: New)."""
        return _PHASES[self]


_PHASES: dict[Stage, Phase | None] = {
    Stage.NEW: None,
    Stage.RETRYING: Phase.PENDING,
    Stage.NEXT_ATTEMPT_REFUSED: Phase.PENDING,
    Stage.PENDING: Phase.PENDING,
    Stage.QUEUED_FOR_ADMISSION: Phase.QUEUED,
    Stage.NOT_ADMITTED: Phase.QUEUED,
    Stage.QUEUED_FOR_CAPACITY: Phase.QUEUED,
    Stage.RUNNING: Phase.RUNNING,
    Stage.COMPLETED: Phase.COMPLETED,
    Stage.INVALID: Phase.INVALID,
}
_QUEUED_FOR = {"NotAdmitted": Stage.NOT_ADMITTED, "Unschedulable": Stage.QUEUED_FOR_CAPACITY}

BEFORE_JOB = frozenset({Stage.NEW, Stage.RETRYING})
"""Stages with no Job of this generation: sizing and launch may (still) happen."""
WITH_JOB = frozenset(
    {
        Stage.PENDING,
        Stage.QUEUED_FOR_ADMISSION,
        Stage.NOT_ADMITTED,
        Stage.QUEUED_FOR_CAPACITY,
        Stage.RUNNING,
    }
)
"""Stages with a runner Job in flight: its events move the test."""
ATTEMPTED = WITH_JOB | {Stage.NEXT_ATTEMPT_REFUSED}
"""Stages with a Job of this generation: in flight, or ended and waiting for the next attempt's
Job (whose end may still be handled: recorded, retried)."""
TERMINAL = frozenset({Stage.COMPLETED, Stage.INVALID})
"""Stages nothing moves a generation out of."""


def retrying(status: TestStatus) -> bool:
    """Whether ``status`` waits to size or create again (no Job of its generation yet: a
    refused next attempt has one, its attempt's)."""
    return status.attempt is None and (
        status.reason("Sized") == "SizingRetrying" or status.reason("JobCreated") == "CreateRefused"
    )


def stage_of(status: TestStatus, generation: int) -> Stage:
    """The stage generation ``generation`` of a test is in, by its status."""
    if status.observedGeneration != generation or status.phase is None:
        return Stage.NEW
    if status.phase is Phase.QUEUED:
        return _QUEUED_FOR.get(status.reason("Queued") or "", Stage.QUEUED_FOR_ADMISSION)
    if status.phase is Phase.PENDING:
        if retrying(status):
            return Stage.RETRYING
        if status.reason("JobCreated") == "CreateRefused":
            return Stage.NEXT_ATTEMPT_REFUSED
        return Stage.PENDING
    return Stage(status.phase.value)


def handled(status: TestStatus, generation: int) -> bool:
    """Whether ``generation`` is launched or ended: nothing is to be sized or created for it."""
    return stage_of(status, generation) not in BEFORE_JOB


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Launched:
    """The generation's first Job exists, and the namespace's program ConfigMap (created, or adopted after a 409)."""

    placement: Placement
    overridden: bool  # spec.cores set the core count (sizing only checked it)
    queue: str | None  # the Kueue LocalQueue the Job waits in, if any
    job_name: str
    configmap_name: str
    run_id: str
    run_script_sha256: str
    revision: str | None
    attempt: int = 1


@dataclass(frozen=True)
class RetryLater:
    """Sizing could not reach the Hub, or the API server refused a create for now (a quota,
    throttling): the generation is tried again after a backoff."""

    condition: Literal["Sized", "JobCreated"]
    reason: Literal["SizingRetrying", "CreateRefused"]
    message: str  # why, and when it is tried again
    first: bool  # the first try failed (an Event says so once)


@dataclass(frozen=True)
class SpecInvalid:
    """The test cannot run as written (spec, planning's checks, admission, or a retry the
    operator's settings no longer allow); nothing is recorded."""

    message: str


@dataclass(frozen=True)
class FailedBeforeRun:
    """Sizing ended the generation with a recorded error (the model cannot be read, or the Hub
    never answered): no Job."""

    run_id: str
    result: Result
    error_class: ErrorClass
    message: str
    reason: Literal["LoadFailed", "SizingFailed"]


@dataclass(frozen=True)
class Excluded:
    """Sizing excluded the model (too large, no parallel plan, gated ...): recorded, no Job."""

    run_id: str
    exclusion: ExclusionReason
    message: str


@dataclass(frozen=True)
class KueueWaiting:
    """The Job is suspended: Kueue has not admitted it yet, or preempted it."""

    attempt: int
    queue: str | None


@dataclass(frozen=True)
class Admitted:
    """The Job is no longer suspended and no runner pod is ready yet."""

    attempt: int


@dataclass(frozen=True)
class NotAdmitted:
    """The watchdog found the Job waiting for Kueue past kueueAdmissionLimitSeconds."""

    attempt: int
    message: str


@dataclass(frozen=True)
class Unschedulable:
    """The watchdog found the runner pod pending with no node that fits it."""

    attempt: int
    message: str  # the scheduler's


@dataclass(frozen=True)
class Scheduled:
    """The watchdog found the runner pod of a test waiting for capacity scheduled."""

    attempt: int


@dataclass(frozen=True)
class PodReady:
    """A runner pod of the Job is ready."""

    attempt: int
    started: str | None  # the Job's startTime


@dataclass(frozen=True)
class NodeLost:
    """The attempt's pod went with its node; the next attempt's Job exists."""

    attempt: int
    job_name: str  # the next attempt's
    run_id: str  # the next attempt's
    why: str


@dataclass(frozen=True)
class WaitedPastDeadline:
    """The Job's backstop deadline passed while run.py had not run the test's timeout: the time
    went to waiting (for a node, Kueue, a pod the API server refused) or to a pod replaced late
    in the same Job, whose start time a replacement does not reset. No verdict: the next
    attempt's Job exists."""

    attempt: int
    job_name: str  # the next attempt's
    run_id: str  # the next attempt's
    why: str


@dataclass(frozen=True)
class NextAttemptRefused:
    """The attempt's Job ended for the cluster's reasons and the API server refused the next
    attempt's Job for now (a quota, throttling): tried again after a backoff."""

    attempt: int  # the attempt whose Job ended
    message: str  # why, and when it is tried again
    first: bool  # the first try failed (an Event says so once)


@dataclass(frozen=True)
class PodRefused:
    """The watchdog found the Job active with no runner pod, and the Job controller's
    ``FailedCreate`` Event saying why the API server refused the pod (a ResourceQuota, a
    LimitRange, Pod Security admission, a webhook); the test keeps waiting."""

    attempt: int
    message: str  # the API server's, as the Job controller's Event gives it


@dataclass(frozen=True)
class PodCreated:
    """The watchdog found a runner pod of a Job whose pod the API server had refused."""

    attempt: int


@dataclass(frozen=True)
class RecordingDeferred:
    """The Job ended and no result can be recorded yet (nothing readable, or the store
    refused): tried again after a backoff; the stage stays."""

    attempt: int
    reason: Literal["ResultUnavailable", "StoreUnavailable"]
    message: str
    delay_s: float


@dataclass(frozen=True)
class Recorded:
    """The attempt's run is recorded in the results store."""

    attempt: int
    run_id: str
    document: ResultDocument
    core_seconds: float | None
    cost_usd: float | None
    started: str | None  # when the runner pod became ready, if no Running write said it


Event = (
    Launched
    | RetryLater
    | SpecInvalid
    | FailedBeforeRun
    | Excluded
    | KueueWaiting
    | Admitted
    | NotAdmitted
    | Unschedulable
    | Scheduled
    | PodReady
    | NodeLost
    | WaitedPastDeadline
    | NextAttemptRefused
    | PodRefused
    | PodCreated
    | RecordingDeferred
    | Recorded
)
"""Everything that moves a test generation."""


@dataclass(frozen=True)
class Announcement:
    """A Kubernetes Event on the test, posted once its move is written."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Move:
    """What a transition writes: one status patch, the stage it leads to, and its Event."""

    patch: StatusPatch
    to: Stage
    announce: Announcement | None = None


# ---------------------------------------------------------------------------------- transitions


def _launched(status: TestStatus, generation: int, event: Launched) -> Move:
    placement = event.placement
    conditions = set_condition(
        None,
        "Sized",
        True,
        "Override" if event.overridden else "Sized",
        f"{placement.cores} core(s), parallelism {placement.parallelism.value}"
        + (
            f"; the pod holds {placement.held_cores} (whole devices the scheduler places)"
            if placement.held_cores != placement.cores
            else ""
        ),
        generation,
    )
    queued = f" queued in Kueue LocalQueue {event.queue}" if event.queue else ""
    conditions = set_condition(
        conditions, "JobCreated", True, "JobCreated", f"Job {event.job_name} created{queued}",
        generation,
    )  # fmt: skip
    conditions = set_condition(
        conditions, "Recorded", False, "Running", "no result yet", generation
    )
    phase = Phase.QUEUED if event.queue else Phase.PENDING
    if event.queue:
        conditions = set_condition(
            conditions, "Queued", True, "KueueAdmission",
            f"waiting for Kueue to admit the Job (LocalQueue {event.queue})", generation,
        )  # fmt: skip
    fields = TestStatus(
        phase=phase,
        observedGeneration=generation,
        cores=placement.cores,
        podCores=placement.held_cores,
        parallelism=placement.parallelism,
        hostMemoryBytes=placement.host_memory_bytes,
        checkpointBytes=placement.checkpoint_bytes,
        attempt=event.attempt,
        configMapName=event.configmap_name,
        jobName=event.job_name,
        runId=event.run_id,
        runScriptSha256=event.run_script_sha256,
        revision=event.revision,
        conditions=kstatus_conditions(conditions, phase, generation),
    )
    to = Stage.QUEUED_FOR_ADMISSION if event.queue else Stage.PENDING
    return Move(StatusPatch(fields, new_generation=True), to)


def _retry_later(status: TestStatus, generation: int, event: RetryLater) -> Move:
    message = event.message
    fields = TestStatus(
        phase=Phase.PENDING,
        observedGeneration=generation,
        message=message[:MESSAGE_LIMIT],
        conditions=kstatus_conditions(
            set_condition(None, event.condition, False, event.reason, message, generation),
            Phase.PENDING,
            generation,
            message=message,
        ),
    )
    announce = Announcement("Warning", event.reason, message) if event.first else None
    return Move(StatusPatch(fields, new_generation=True), Stage.RETRYING, announce)


def _spec_invalid(status: TestStatus, generation: int, event: SpecInvalid) -> Move:
    fields = TestStatus(
        phase=Phase.INVALID,
        observedGeneration=generation,
        message=event.message[:MESSAGE_LIMIT],
        conditions=kstatus_conditions(None, Phase.INVALID, generation, message=event.message),
    )
    announce = Announcement("Warning", "InvalidSpec", event.message)
    return Move(StatusPatch(fields, new_generation=True), Stage.INVALID, announce)


def _ended_before_run(
    generation: int,
    run_id: str,
    result: Result,
    message: str,
    *,
    sized: str,
    ready: tuple[str, str],
    **extra: Any,
) -> StatusPatch:
    """Completed at sizing: condition Sized False with reason ``sized``, Ready with ``ready``
    (reason, message), and ``extra`` fields (the error class or the exclusion reason)."""
    conditions = set_condition(None, "Sized", False, sized, message, generation)
    conditions = set_condition(
        conditions, "Recorded", True, "Recorded", f"run {run_id} recorded", generation
    )
    fields = TestStatus(
        phase=Phase.COMPLETED,
        observedGeneration=generation,
        result=result,
        message=message[:MESSAGE_LIMIT],
        runId=run_id,
        finishedAt=now(),
        conditions=kstatus_conditions(
            conditions, Phase.COMPLETED, generation, result=ready[0], message=ready[1]
        ),
        **extra,
    )
    return StatusPatch(fields, new_generation=True)


def _failed_before_run(status: TestStatus, generation: int, event: FailedBeforeRun) -> Move:
    summary = f"{event.result.value}/{event.error_class.value}"
    patch = _ended_before_run(
        generation,
        event.run_id,
        event.result,
        event.message,
        sized=event.reason,
        ready=(condition_reason(summary), first_line(event.message)),
        errorClass=event.error_class,
    )
    announce = Announcement("Warning", event.reason, f"{summary}: {event.message}")
    return Move(patch, Stage.COMPLETED, announce)


def _excluded(status: TestStatus, generation: int, event: Excluded) -> Move:
    patch = _ended_before_run(
        generation,
        event.run_id,
        Result.EXCLUDED,
        event.message,
        sized="Excluded",
        ready=("EXCLUDED", event.message),
        exclusionReason=event.exclusion,
    )
    announce = Announcement("Normal", "Excluded", f"{event.exclusion.value}: {event.message}")
    return Move(patch, Stage.COMPLETED, announce)


def _waiting_move(
    status: TestStatus,
    generation: int,
    to: Stage,
    condition: tuple[str, bool, str],
    message: str,
    *,
    started: str | None = None,
    announce: tuple[Literal["Normal", "Warning"], str] | None = None,
) -> Move:
    """A move among the stages with a Job: ``to``'s phase, and ``condition`` (type, status,
    reason) saying why; Running also ends the wait (condition Queued False) and says when."""
    phase = to.phase
    assert phase is not None
    kind, value, reason = condition
    conditions = set_condition(status.condition_dicts(), kind, value, reason, message, generation)
    conditions = _pod_exists(conditions, generation)
    if phase is Phase.RUNNING:
        conditions = set_condition(
            conditions, "Queued", False, "Started", "a runner pod is ready", generation
        )
    fields = TestStatus(
        phase=phase,
        conditions=kstatus_conditions(conditions, phase, generation, message=message),
    )
    if phase is Phase.RUNNING:
        fields.startedAt = started or now()
    said = Announcement(announce[0], announce[1], message) if announce else None
    return Move(StatusPatch(fields), to, said)


def _kueue_waiting(status: TestStatus, generation: int, event: KueueWaiting) -> Move:
    # Suspended after it was admitted: Kueue preempted it (the Job controller deleted its
    # pods; the pod failure policy ignores the runner's stop exit), and it runs again once
    # Kueue resumes it. Either way it waits, as Queued.
    preempted = stage_of(status, generation) in (Stage.PENDING, Stage.RUNNING)
    message = (
        f"suspended by Kueue (preempted); waiting to be admitted again (LocalQueue {event.queue})"
        if preempted
        else f"waiting for Kueue to admit the Job (LocalQueue {event.queue})"
    )
    return _waiting_move(
        status, generation, Stage.QUEUED_FOR_ADMISSION, ("Queued", True, "KueueAdmission"),
        message, announce=("Normal", "Preempted") if preempted else None,
    )  # fmt: skip


def _admitted(status: TestStatus, generation: int, event: Admitted) -> Move:
    return _waiting_move(
        status, generation, Stage.PENDING, ("Queued", False, "Admitted"), "the Job is admitted"
    )


def _not_admitted(status: TestStatus, generation: int, event: NotAdmitted) -> Move:
    return _waiting_move(
        status, generation, Stage.NOT_ADMITTED, ("Queued", True, "NotAdmitted"), event.message,
        announce=("Warning", "NotAdmitted"),
    )  # fmt: skip


def _unschedulable(status: TestStatus, generation: int, event: Unschedulable) -> Move:
    return _waiting_move(
        status, generation, Stage.QUEUED_FOR_CAPACITY, ("Queued", True, "Unschedulable"),
        f"waiting for capacity: {event.message}", announce=("Normal", "WaitingForCapacity"),
    )  # fmt: skip


def _scheduled(status: TestStatus, generation: int, event: Scheduled) -> Move:
    return _waiting_move(
        status, generation, Stage.PENDING, ("Queued", False, "Scheduled"),
        "the runner pod is scheduled",
    )  # fmt: skip


def _pod_ready(status: TestStatus, generation: int, event: PodReady) -> Move:
    return _waiting_move(
        status, generation, Stage.RUNNING, ("Running", True, "PodReady"),
        "a runner pod is ready", started=event.started,
    )  # fmt: skip


_CREATED = "the Job created its runner pod"


def _pod_exists(conditions: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """``conditions`` with a ``PodCreated=False`` (the API server refused the pod) set True: the
    runner pod exists now."""
    refused = next((c for c in conditions if c.get("type") == "PodCreated"), None)
    if refused is None or refused.get("status") == "True":
        return conditions
    return set_condition(conditions, "PodCreated", True, "Created", _CREATED, generation)


def _next_attempt(
    status: TestStatus, generation: int, event: NodeLost | WaitedPastDeadline, reason: str
) -> Move:
    """The attempt ended without a verdict and the next attempt's Job exists: Pending at it."""
    next_attempt = event.attempt + 1
    message = f"{event.why}; attempt {next_attempt} in Job {event.job_name}"
    # What was said of the ended attempt's pod is not said of the next one's.
    earlier = [c for c in status.condition_dicts() if c.get("type") != "PodCreated"]
    conditions = set_condition(earlier, "JobCreated", True, reason, message, generation)
    fields = TestStatus(
        phase=Phase.PENDING,
        attempt=next_attempt,
        jobName=event.job_name,
        runId=event.run_id,
        message=None,
        conditions=kstatus_conditions(conditions, Phase.PENDING, generation),
    )
    announce = Announcement(
        "Warning", reason, f"{event.why}; retrying as Job {event.job_name} (attempt {next_attempt})"
    )
    return Move(StatusPatch(fields), Stage.PENDING, announce)


def _node_lost(status: TestStatus, generation: int, event: NodeLost) -> Move:
    return _next_attempt(status, generation, event, "NodeLost")


def _waited_past_deadline(status: TestStatus, generation: int, event: WaitedPastDeadline) -> Move:
    return _next_attempt(status, generation, event, "WaitedPastDeadline")


def _next_attempt_refused(status: TestStatus, generation: int, event: NextAttemptRefused) -> Move:
    message = event.message
    conditions = set_condition(
        status.condition_dicts(), "JobCreated", False, "CreateRefused", message, generation
    )
    fields = TestStatus(
        phase=Phase.PENDING,
        message=message[:MESSAGE_LIMIT],
        conditions=kstatus_conditions(conditions, Phase.PENDING, generation, message=message),
    )
    announce = Announcement("Warning", "CreateRefused", message) if event.first else None
    return Move(StatusPatch(fields), Stage.NEXT_ATTEMPT_REFUSED, announce)


def _pod_refused(status: TestStatus, generation: int, event: PodRefused) -> Move | None:
    current = status.condition("PodCreated")
    if current is not None and current.status == "False":
        # Said already; the condition keeps the first occurrence (each refusal names another
        # generated pod name, and the Job controller keeps trying).
        return None
    conditions = set_condition(
        status.condition_dicts(), "PodCreated", False, "FailedCreate", event.message, generation
    )
    announce = Announcement("Warning", "FailedCreate", event.message)
    return Move(
        StatusPatch(TestStatus(conditions=conditions)), stage_of(status, generation), announce
    )


def _pod_created(status: TestStatus, generation: int, event: PodCreated) -> Move | None:
    if status.is_true("PodCreated"):
        return None  # said already
    conditions = set_condition(
        status.condition_dicts(), "PodCreated", True, "Created", _CREATED, generation
    )
    return Move(StatusPatch(TestStatus(conditions=conditions)), stage_of(status, generation))


def _recording_deferred(
    status: TestStatus, generation: int, event: RecordingDeferred
) -> Move | None:
    current = status.condition("Recorded")
    if current is not None and (current.reason, current.status) == (event.reason, "False"):
        return None  # said already; the condition's message keeps the first occurrence
    conditions = set_condition(
        status.condition_dicts(), "Recorded", False, event.reason, event.message, generation
    )
    announce = Announcement(
        "Warning", event.reason, f"{event.message}; retrying in {event.delay_s:g} s"
    )
    return Move(
        StatusPatch(TestStatus(conditions=conditions)), stage_of(status, generation), announce
    )


_EVENT_REASON = {
    Result.PASS: "Passed",
    Result.FAIL: "Failed",
    Result.ERROR: "Errored",
    Result.TIMEOUT: "TimedOut",
    Result.EXCLUDED: "Excluded",
    Result.UNVERIFIED: "Unverified",
}


def _recorded(status: TestStatus, generation: int, event: Recorded) -> Move:
    document = event.document
    summary = document.result.value + (
        f"/{document.error_class.value}" if document.error_class else ""
    )
    said = first_line(document.error) or summary
    conditions = set_condition(
        status.condition_dicts(), "Running", False, "Finished", "the runner finished", generation
    )
    conditions = set_condition(
        conditions, "Completed", True, condition_reason(summary), said, generation
    )
    conditions = set_condition(
        conditions, "Recorded", True, "Recorded", f"run {event.run_id} recorded", generation
    )
    timings, memory = document.timings, document.memory
    fields = TestStatus(
        phase=Phase.COMPLETED,
        result=document.result,
        errorClass=document.error_class,
        message=first_line(document.error) or None,
        runId=event.run_id,
        wallTimeSeconds=timings.wall_time_s,
        compileSeconds=timings.compile_s,
        decodeTokensPerSecond=timings.decode_tokens_per_s,
        peakDeviceMemoryBytes=memory.peak_device_memory_bytes,
        hostPeakRssBytes=memory.host_peak_rss_bytes,
        coreSeconds=event.core_seconds,
        costUSD=event.cost_usd,
        finishedAt=now(),
        conditions=kstatus_conditions(
            conditions, Phase.COMPLETED, generation, result=condition_reason(summary), message=said
        ),
    )
    started = status.startedAt or event.started
    if started:
        fields.startedAt = started
    announce = None
    if document.result not in (Result.PASS, Result.EXCLUDED):
        # PASS and EXCLUDED are said by the status (Ready, result): an Event is an API request
        # per test, spent only on a result that needs attention.
        message = f"{summary}: {first_line(document.error)}" if document.error else summary
        announce = Announcement("Warning", _EVENT_REASON[document.result], message)
    return Move(StatusPatch(fields), Stage.COMPLETED, announce)


# ---------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Transition:
    """One row of the table: ``event`` moves a generation from any of ``sources`` to one of
    ``targets`` by ``write`` (None from it: nothing to change, e.g. said already)."""

    event: type[Any]
    sources: frozenset[Stage]
    targets: frozenset[Stage]
    write: Callable[[TestStatus, int, Any], Move | None]
    per_attempt: bool
    """The event is about one attempt's Job: refused once the status is at another attempt."""


def _row(
    event: type[Any],
    sources: frozenset[Stage] | set[Stage],
    targets: frozenset[Stage] | set[Stage],
    write: Callable[[TestStatus, int, Any], Move | None],
    *,
    per_attempt: bool = True,
) -> Transition:
    return Transition(event, frozenset(sources), frozenset(targets), write, per_attempt)


_WAITING_FOR_KUEUE = {Stage.QUEUED_FOR_ADMISSION, Stage.NOT_ADMITTED}

_POD_MAY_BE_REFUSED = {Stage.PENDING, Stage.QUEUED_FOR_CAPACITY, Stage.RUNNING}
"""Stages whose Job is admitted (not suspended): the Job controller creates its pods."""

TRANSITIONS: tuple[Transition, ...] = (
    # Sizing and launch (no Job yet; a retry starts over from sizing).
    _row(
        Launched,
        BEFORE_JOB,
        {Stage.PENDING, Stage.QUEUED_FOR_ADMISSION},
        _launched,
        per_attempt=False,
    ),
    _row(RetryLater, BEFORE_JOB, {Stage.RETRYING}, _retry_later, per_attempt=False),
    _row(FailedBeforeRun, BEFORE_JOB, {Stage.COMPLETED}, _failed_before_run, per_attempt=False),
    _row(Excluded, BEFORE_JOB, {Stage.COMPLETED}, _excluded, per_attempt=False),
    _row(SpecInvalid, BEFORE_JOB | ATTEMPTED, {Stage.INVALID}, _spec_invalid, per_attempt=False),
    # The Job's own events.
    _row(
        KueueWaiting,
        {Stage.PENDING, Stage.RUNNING, Stage.QUEUED_FOR_CAPACITY},
        {Stage.QUEUED_FOR_ADMISSION},
        _kueue_waiting,
    ),
    _row(Admitted, _WAITING_FOR_KUEUE, {Stage.PENDING}, _admitted),
    _row(PodReady, WITH_JOB - {Stage.RUNNING}, {Stage.RUNNING}, _pod_ready),
    _row(NodeLost, ATTEMPTED, {Stage.PENDING}, _node_lost),
    _row(WaitedPastDeadline, ATTEMPTED, {Stage.PENDING}, _waited_past_deadline),
    _row(NextAttemptRefused, ATTEMPTED, {Stage.NEXT_ATTEMPT_REFUSED}, _next_attempt_refused),
    _row(RecordingDeferred, ATTEMPTED, ATTEMPTED, _recording_deferred),
    _row(Recorded, ATTEMPTED, {Stage.COMPLETED}, _recorded),
    # The watchdog's findings.
    _row(NotAdmitted, {Stage.QUEUED_FOR_ADMISSION}, {Stage.NOT_ADMITTED}, _not_admitted),
    _row(
        Unschedulable,
        WITH_JOB - {Stage.QUEUED_FOR_CAPACITY},
        {Stage.QUEUED_FOR_CAPACITY},
        _unschedulable,
    ),
    _row(Scheduled, {Stage.QUEUED_FOR_CAPACITY}, {Stage.PENDING}, _scheduled),
    _row(PodRefused, _POD_MAY_BE_REFUSED, _POD_MAY_BE_REFUSED, _pod_refused),
    _row(PodCreated, _POD_MAY_BE_REFUSED, _POD_MAY_BE_REFUSED, _pod_created),
)
"""The lifecycle: every event, the stages it leaves and the stages it leads to. A pair of
stage and event not in it is refused (no write)."""

_BY_EVENT = {row.event: row for row in TRANSITIONS}


def transition(event: type[Any]) -> Transition:
    """The table's row for ``event``."""
    return _BY_EVENT[event]


def allows(stage: Stage, event: Event) -> bool:
    """Whether the table moves a generation in ``stage`` on ``event`` (a cheap check from what
    this process last wrote, before the status is read)."""
    return stage in _BY_EVENT[type(event)].sources


def step(status: TestStatus, generation: int, event: Event) -> Move | None:
    """The move ``event`` makes from ``status`` (the test's, generation ``generation``), or
    None when the table refuses it (not a move from this stage, another attempt's event) or
    there is nothing to change."""
    row = _BY_EVENT[type(event)]
    if stage_of(status, generation) not in row.sources:
        return None
    if row.per_attempt and (status.attempt or 0) != getattr(event, "attempt", None):
        return None  # the test moved on to another attempt (a retry after node loss)
    move = row.write(status, generation, event)
    if move is not None and move.to not in row.targets:
        raise AssertionError(
            f"{type(event).__name__} moved a test to {move.to}, which the table does not allow"
        )
    return move


def table_markdown() -> str:
    """The stages and the table as Markdown (docs/operator.md shows it; a test keeps the two
    the same)."""

    def names(stages: frozenset[Stage]) -> str:
        if stages == WITH_JOB:
            return "any with a Job"
        if stages == ATTEMPTED:
            return "any with a Job, Pending/nextAttemptRefused"
        return ", ".join(stage.value for stage in Stage if stage in stages)

    def said(item: type[Any] | Stage) -> str:
        doc = item.__doc__ if isinstance(item, type) else _STAGE_DOCS[item]
        return " ".join((doc or "").split())

    lines = ["| stage | status.phase | what it means |", "| --- | --- | --- |"]
    for stage in Stage:
        phase = stage.phase.value if stage.phase is not None else "(none)"
        lines.append(f"| {stage.value} | {phase} | {said(stage)} |")
    lines += ["", "| event | from | to | what happened |", "| --- | --- | --- | --- |"]
    for row in TRANSITIONS:
        lines.append(
            f"| `{row.event.__name__}` | {names(row.sources)} | "
            f"{'(the same)' if row.targets == row.sources else names(row.targets)} | "
            f"{said(row.event)} |"
        )
    return "\n".join(lines) + "\n"


_STAGE_DOCS = {
    Stage.NEW: "No status of this generation yet (a new test, or a changed spec).",
    Stage.RETRYING: "No Job: sizing could not reach the Hub, or the API server refused a "
    "create for now; tried again after a backoff.",
    Stage.NEXT_ATTEMPT_REFUSED: "The attempt's Job ended for the cluster's reasons and the API "
    "server refused the next attempt's Job for now; tried again after a backoff.",
    Stage.PENDING: "The Job exists; no runner pod is ready (condition PodCreated=False when the "
    "API server refused the pod).",
    Stage.QUEUED_FOR_ADMISSION: "The Job waits for Kueue to admit it (first, or again after a "
    "preemption).",
    Stage.NOT_ADMITTED: "Kueue has not admitted the Job within kueueAdmissionLimitSeconds.",
    Stage.QUEUED_FOR_CAPACITY: "The runner pod exists and no node fits it.",
    Stage.RUNNING: "A runner pod is ready.",
    Stage.COMPLETED: "A result is recorded. Terminal.",
    Stage.INVALID: "The spec cannot run as written; nothing was recorded. Terminal.",
}


# ---------------------------------------------------------------------------------- wording


def first_line(text: str | None) -> str:
    """The first line of ``text``, cut to what a status message holds ("" for none)."""
    if not text or not text.strip():
        return ""
    return text.strip().splitlines()[0][:MESSAGE_LIMIT]


def condition_reason(summary: str) -> str:
    """A condition reason from a result summary (ERROR/out-of-memory -> ERROR_out_of_memory)."""
    return summary.replace("/", "_").replace("-", "_")


__all__ = [
    "ATTEMPTED",
    "BEFORE_JOB",
    "TERMINAL",
    "TRANSITIONS",
    "WITH_JOB",
    "Admitted",
    "Announcement",
    "Event",
    "Excluded",
    "FailedBeforeRun",
    "KueueWaiting",
    "Launched",
    "Move",
    "NextAttemptRefused",
    "NodeLost",
    "NotAdmitted",
    "PodCreated",
    "PodReady",
    "PodRefused",
    "Recorded",
    "RecordingDeferred",
    "RetryLater",
    "Scheduled",
    "SpecInvalid",
    "Stage",
    "Transition",
    "Unschedulable",
    "WaitedPastDeadline",
    "allows",
    "handled",
    "retrying",
    "stage_of",
    "step",
    "table_markdown",
    "transition",
]
