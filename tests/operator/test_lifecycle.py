"""The test lifecycle's table (operator/src/lifecycle.py), checked against the rules the
operator promises, not against itself: finished generations never move, a new generation
starts over, waiting moves forward unless a pod lost its place, an attempt's events stop
counting once the test moved on, and every move writes the stage it claims.

Every status here is reached from an empty one by the table's own moves, and each move's patch
is merged as the API server merges it (StatusPatch.applied_to), so a transition that writes the
wrong phase or conditions shows here as the wrong stage.
"""

from __future__ import annotations

from pathlib import Path

from factories import make_record

from model_support.operator.lifecycle import (
    BEFORE_JOB,
    TERMINAL,
    TRANSITIONS,
    WITH_JOB,
    Admitted,
    Event,
    Excluded,
    FailedBeforeRun,
    KueueWaiting,
    Launched,
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
    stage_of,
    step,
    table_markdown,
    transition,
)
from model_support.operator.manifests import Placement
from model_support.operator.status import Phase, TestStatus
from model_support.vocabulary import ErrorClass, ExclusionReason, Parallelism, Result

GENERATION = 3
STARTED = "2026-11-02T09:00:00Z"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operator.md"


def launched(queue: str | None = None, generation: int = GENERATION) -> Launched:
    return Launched(
        placement=Placement(2, Parallelism.TENSOR, 24 * 2**30, 10**9, pod_cores=4),
        overridden=False,
        queue=queue,
        job_name=f"qwen-abc-g{generation}-a1",
        configmap_name="model-support-run-py-0123456789abcdef",  # the namespace's program
        run_id=f"run-g{generation}-a1",
        run_script_sha256="0" * 64,
        revision="1" * 40,
    )


def recorded(result: Result, attempt: int = 1) -> Recorded:
    document = make_record(result=result).document
    return Recorded(attempt, f"run-a{attempt}", document, 200.0, 0.5, None)


def one_of_each(attempt: int = 1) -> list[Event]:
    """An event of every kind the table knows, about ``attempt``."""
    return [
        launched(),
        RetryLater("Sized", "SizingRetrying", "the Hub did not answer", first=True),
        SpecInvalid("spec.cores: must be at least 1"),
        FailedBeforeRun("run-a0", Result.ERROR, ErrorClass.LOAD, "bad config", "LoadFailed"),
        Excluded("run-a0", ExclusionReason.TOO_LARGE, "needs 96 cores"),
        KueueWaiting(attempt, "team-a"),
        Admitted(attempt),
        NotAdmitted(attempt, "Kueue has not admitted the Job"),
        Unschedulable(attempt, "0/3 nodes are available"),
        Scheduled(attempt),
        PodReady(attempt, STARTED),
        NodeLost(attempt, "qwen-abc-g3-a2", "run-a2", "node ip-10-0-0-1 went away"),
        WaitedPastDeadline(attempt, "qwen-abc-g3-a2", "run-a2", "the backstop passed"),
        NextAttemptRefused(attempt, "exceeded quota: trainium; retrying in 15 s", first=True),
        PodRefused(attempt, 'Error creating: pods "qwen-abc-g3-a1-x" is forbidden'),
        PodCreated(attempt),
        RecordingDeferred(attempt, "ResultUnavailable", "the store is unreachable", 5.0),
        recorded(Result.FAIL, attempt),
    ]


def apply(status: TestStatus, event: Event, generation: int = GENERATION) -> TestStatus:
    """``status`` after ``event``'s move, as the API server stores it; the move must happen."""
    move = step(status, generation, event)
    assert move is not None, f"{type(event).__name__} refused in {stage_of(status, generation)}"
    return move.patch.applied_to(status)


PATHS: dict[Stage, list[Event]] = {
    Stage.NEW: [],
    Stage.RETRYING: [RetryLater("Sized", "SizingRetrying", "the Hub did not answer", first=True)],
    Stage.NEXT_ATTEMPT_REFUSED: [launched(), NextAttemptRefused(1, "exceeded quota", first=True)],
    Stage.PENDING: [launched()],
    Stage.QUEUED_FOR_ADMISSION: [launched(queue="team-a")],
    Stage.NOT_ADMITTED: [launched(queue="team-a"), NotAdmitted(1, "not admitted for 600 s")],
    Stage.QUEUED_FOR_CAPACITY: [launched(), Unschedulable(1, "0/3 nodes are available")],
    Stage.RUNNING: [launched(), PodReady(1, STARTED)],
    Stage.COMPLETED: [launched(), PodReady(1, STARTED), recorded(Result.PASS)],
    Stage.INVALID: [SpecInvalid("spec.model: not a model id")],
}
"""How a test reaches each stage through the table's own moves."""


def reach(stage: Stage, generation: int = GENERATION) -> TestStatus:
    status = TestStatus()
    for event in PATHS[stage]:
        if isinstance(event, Launched):
            event = launched(event.queue, generation)
        status = apply(status, event, generation)
    return status


def test_each_stage_is_reached_by_its_moves_and_read_back_as_written() -> None:
    for stage in Stage:
        assert stage_of(reach(stage), GENERATION) is stage


def test_every_pair_of_stage_and_event_is_moved_to_its_stage_or_refused() -> None:
    for stage in Stage:
        status = reach(stage)
        for event in one_of_each():
            row = transition(type(event))
            move = step(status, GENERATION, event)
            if stage not in row.sources:
                assert move is None, f"{type(event).__name__} moved a test out of {stage}"
                continue
            assert move is not None, f"{type(event).__name__} refused in {stage}"
            assert move.to in row.targets
            # What the API stores after the patch reads back as the stage the move claims.
            assert stage_of(move.patch.applied_to(status), GENERATION) is move.to, (stage, event)


def test_nothing_moves_a_finished_generation() -> None:
    for stage in TERMINAL:
        status = reach(stage)
        for attempt in (1, 2):
            assert [e for e in one_of_each(attempt) if step(status, GENERATION, e)] == []


def test_a_new_generation_starts_over_whatever_the_last_one_ended_in() -> None:
    job_events = {
        KueueWaiting, Admitted, NotAdmitted, Unschedulable, Scheduled, PodReady, NodeLost,
        WaitedPastDeadline, NextAttemptRefused, PodRefused, PodCreated, RecordingDeferred,
        Recorded,
    }  # fmt: skip
    for stage in Stage:
        previous = reach(stage, generation=GENERATION - 1)
        assert stage_of(previous, GENERATION) is Stage.NEW
        for event in one_of_each():
            move = step(previous, GENERATION, event)
            if type(event) in job_events:
                assert move is None, f"{type(event).__name__} acted on an older generation"
                continue
            assert move is not None
            written = move.patch.applied_to(previous)
            assert written.observedGeneration == GENERATION
            # Nothing of the previous run survives into the new generation's status.
            kept = {
                k for k, v in previous.model_dump(exclude_none=True).items() if k != "conditions"
            }
            set_now = set(move.patch.status.model_dump(exclude_unset=True))
            for field in kept - set_now:
                assert getattr(written, field) is None, (stage, type(event).__name__, field)


def test_waiting_moves_forward_unless_the_pod_lost_its_place() -> None:
    order = {Phase.QUEUED: 0, Phase.PENDING: 1, Phase.RUNNING: 2}
    backwards: set[type] = set()
    for stage in WITH_JOB:
        status = reach(stage)
        for event in one_of_each():
            move = step(status, GENERATION, event)
            if move is None or move.to not in WITH_JOB:
                continue
            if move.patch.applied_to(status).attempt != status.attempt:
                continue  # a new attempt (after node loss) starts over at Pending
            assert stage.phase is not None and move.to.phase is not None
            if order[move.to.phase] < order[stage.phase]:
                backwards.add(type(event))
    # Within an attempt, only Kueue's preemption and a pod no node fits any more send a test
    # back to waiting.
    assert backwards == {KueueWaiting, Unschedulable}


def test_a_job_event_needs_the_job_of_the_current_attempt() -> None:
    for stage in BEFORE_JOB:
        status = reach(stage)
        for event in one_of_each():
            if transition(type(event)).per_attempt:
                assert step(status, GENERATION, event) is None
    # No second launch once a Job exists.
    for stage in WITH_JOB | TERMINAL:
        assert step(reach(stage), GENERATION, launched()) is None
    # Retried after node loss: the first attempt's events no longer count.
    retried = apply(reach(Stage.RUNNING), NodeLost(1, "qwen-abc-g3-a2", "run-a2", "node gone"))
    assert (retried.attempt, retried.jobName, stage_of(retried, GENERATION)) == (
        2,
        "qwen-abc-g3-a2",
        Stage.PENDING,
    )
    stale = [e for e in one_of_each(attempt=1) if transition(type(e)).per_attempt]
    assert [e for e in stale if step(retried, GENERATION, e)] == []
    assert stage_of(apply(retried, PodReady(2, STARTED)), GENERATION) is Stage.RUNNING


def test_a_preempted_run_is_queued_again_and_ends_with_one_warning() -> None:
    status = reach(Stage.QUEUED_FOR_ADMISSION)
    assert step(status, GENERATION, KueueWaiting(1, "team-a")) is None  # said already
    status = apply(status, Admitted(1))
    ready = step(status, GENERATION, PodReady(1, STARTED))
    assert ready is not None and ready.announce is None
    status = ready.patch.applied_to(status)
    assert (status.phase, status.startedAt, status.reason("Queued")) == (
        Phase.RUNNING,
        STARTED,
        "Started",
    )
    assert status.is_true("Running") and not status.is_true("Ready")
    preempted = step(status, GENERATION, KueueWaiting(1, "team-a"))
    assert preempted is not None and preempted.announce is not None
    assert (preempted.announce.type, preempted.announce.reason) == ("Normal", "Preempted")
    status = preempted.patch.applied_to(status)
    assert stage_of(status, GENERATION) is Stage.QUEUED_FOR_ADMISSION
    queued = status.condition("Queued")
    assert queued is not None and "preempted" in queued.message
    status = apply(apply(status, Admitted(1)), PodReady(1, STARTED))
    ended = step(status, GENERATION, recorded(Result.FAIL))
    assert ended is not None and ended.announce is not None
    assert (ended.announce.type, ended.announce.reason) == ("Warning", "Failed")
    final = ended.patch.applied_to(status)
    assert (final.phase, final.result, final.runId, final.startedAt) == (
        Phase.COMPLETED,
        Result.FAIL,
        "run-a1",
        STARTED,
    )
    assert final.is_true("Ready") and not final.is_true("Reconciling")


def test_a_pass_is_said_by_the_status_alone_and_a_deferral_once() -> None:
    running = reach(Stage.RUNNING)
    passed = step(running, GENERATION, recorded(Result.PASS))
    assert passed is not None and passed.announce is None
    deferred = RecordingDeferred(1, "StoreUnavailable", "the store refused the record", 5.0)
    first = step(running, GENERATION, deferred)
    assert first is not None and first.announce is not None and first.to is Stage.RUNNING
    assert step(first.patch.applied_to(running), GENERATION, deferred) is None


def test_the_docs_show_the_table() -> None:
    assert table_markdown() in DOCS.read_text(encoding="utf-8"), (
        "docs/operator.md's lifecycle table differs from lifecycle.TRANSITIONS: paste "
        "lifecycle.table_markdown() into it"
    )


def test_every_event_has_one_row() -> None:
    kinds = [type(e) for e in one_of_each()]
    assert sorted(r.event.__name__ for r in TRANSITIONS) == sorted(k.__name__ for k in kinds)
