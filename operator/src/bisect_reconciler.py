"""The operator's logic for ModelSupportBisects: the search of ``model_support/bisect.py``,
each step a ModelSupportTest owned by the bisect.

A bisect is level-based like a sweep: its plan (the two rows, the suspects, the versions their
index lists) is in its status once made, each step's test is named after its environment, and
every reconcile walks the search from the start (:func:`model_support.bisect.walk`) over what is
known: the runs in the results store and the steps' store that match the plan (reused, never run
again), and the step tests this bisect made that finished. The first step whose outcome is not
known gets its test (created once: a replay meets 409); once the search concludes, the status
names the first bad version of each culprit, its result and the command that reproduces it,
with the report ``model-support bisect`` prints.

Reconciles come from the bisect's own events and from its step tests finishing; a store that
cannot be read is tried again after a backoff (the watchdog's tick). One bisect is reconciled
by one thread at a time; an event that arrives meanwhile makes that thread go round once more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model_support.bisect import (
    BisectError,
    Conclusion,
    PackageIndex,
    Plan,
    find_run,
    known_at_start,
    matching_runs,
    plan_from_rows,
    render_bisect,
    report_for,
    steps_location,
    stored_runs,
    walk,
)
from model_support.operator.bisect_manifests import bisect_owner, build_step, step_name, step_pins
from model_support.operator.bisect_spec import (
    MAX_SUSPECTS,
    BisectSpec,
    parse_bisect,
    step_spec,
)
from model_support.operator.bisect_status import (
    REPORT_LIMIT,
    BisectPhase,
    BisectPlanState,
    BisectStatus,
    BisectStep,
    bisect_conditions,
)
from model_support.operator.kube import AlreadyExists, Conflict, Kube, being_deleted
from model_support.operator.one_at_a_time import OneAtATime
from model_support.operator.planning import InvalidTest, check_store_allowed
from model_support.operator.resource import ANNOTATION_BISECT_STEP, LABEL_BISECT
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.operator.status import MESSAGE_LIMIT, Condition, Phase, TestStatus
from model_support.storage_errors import is_store_error
from model_support.store import StoreError

if TYPE_CHECKING:
    from model_support.store import ResultsStore

log = logging.getLogger(__name__)

TERMINAL: frozenset[BisectPhase] = frozenset({"Done", "Failed", "Invalid"})
"""Phases nothing moves a bisect generation out of (a changed spec is a new generation)."""
_CONFLICT_RETRIES = 3


@dataclass(frozen=True)
class Prepared:
    """What every reconcile of one bisect generation needs, made once per process."""

    generation: int
    plan: Plan
    """The search's plan; its run_py is what the operator renders for every step test."""
    step: dict[str, Any]
    """Every step test's spec but its extraPackages."""
    pin_all: bool
    """Pin every suspect in each step (the image may not hold the good side's versions)."""
    results: ResultsStore
    steps: ResultsStore
    steps_uri: str
    sha256: str
    """Of the run.py every step runs (part of each step test's name)."""


class BisectReconciler:
    """Reconciles ModelSupportBisects; see the module docstring."""

    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self._lock = threading.Lock()
        self.bisects: dict[str, tuple[str, str]] = {}
        """Every watched bisect by uid: (namespace, name)."""
        self._prepared: dict[str, Prepared] = {}
        self._runs = OneAtATime()
        self._retry: dict[str, tuple[float, float, int]] = {}
        """Bisects waiting out a store outage, by uid: (next try at, delay, generation)."""
        self._stores: dict[str, Any] = {}

    # ---------------------------------------------------------------- events

    def on_bisect(self, body: dict[str, Any], event_type: str | None, *, act: bool = True) -> None:
        """A bisect changed (or was listed: ``event_type`` None); ``act`` False: only keep what
        this process knows of it (a replica waiting for leadership)."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self.forget(uid)
            return  # its step tests go with it (owner references); their records stay
        with self._lock:
            self.bisects[uid] = (meta["namespace"], meta["name"])
        generation = int(meta.get("generation") or 1)
        if act and not being_deleted(body) and not self._backing_off(uid, generation):
            self.reconcile(uid)

    def _backing_off(self, uid: str, generation: int) -> bool:
        """Whether the bisect waits out a store outage at this generation: an event of its own
        status write (which says so) must not retry before the backoff ends (tick does then)."""
        with self._lock:
            retry = self._retry.get(uid)
        return retry is not None and retry[2] == generation and time.monotonic() < retry[0]

    def on_test(self, body: dict[str, Any], event_type: str | None, *, act: bool = True) -> None:
        """A test changed: a step of a bisect that finished (or vanished) lets it go on."""
        uid = bisect_owner(body)
        if uid is None or not act:
            return
        with self._lock:
            known = uid in self.bisects
        status = TestStatus.read(body.get("status"))
        generation = int((body.get("metadata") or {}).get("generation") or 1)
        finished = status.observedGeneration == generation and status.phase in (
            Phase.COMPLETED, Phase.INVALID,
        )  # fmt: skip
        if known and (finished or event_type == "DELETED"):
            self.reconcile(uid)

    def forget(self, uid: str) -> None:
        """Drop a bisect that no longer exists from what this process keeps."""
        with self._lock:
            self.bisects.pop(uid, None)
            self._prepared.pop(uid, None)
            self._retry.pop(uid, None)

    def tick(self) -> int:
        """Reconcile the bisects whose retry (a store that could not be read) is due."""
        clock = time.monotonic()
        with self._lock:
            due = [uid for uid, (at, _, _) in self._retry.items() if clock >= at]
        for uid in due:
            self.reconcile(uid)
        return len(due)

    # ---------------------------------------------------------------- one bisect

    def reconcile(self, uid: str) -> None:
        """Bring one bisect forward; a concurrent call makes the running one go round again."""
        self._runs.run(uid, lambda: self._reconcile_reading_again_on_conflict(uid))

    def _reconcile_reading_again_on_conflict(self, uid: str) -> None:
        for _ in range(_CONFLICT_RETRIES):
            try:
                self._reconcile(uid)
                return
            except Conflict:
                continue  # written meanwhile: read it again and decide again

    def _reconcile(self, uid: str) -> None:
        with self._lock:
            where = self.bisects.get(uid)
        if where is None:
            return
        body = self.kube.get_bisect(*where)
        if body is None or body["metadata"].get("uid") != uid:
            self.forget(uid)
            return
        if being_deleted(body):
            return  # its step tests go as the garbage collector deletes them
        generation = int(body["metadata"].get("generation") or 1)
        status = BisectStatus.read(body.get("status"))
        if status.observedGeneration == generation and status.phase in TERMINAL:
            return
        if status.observedGeneration != generation:
            status = BisectStatus(conditions=status.conditions)  # a new generation starts over
        try:
            spec = parse_bisect(dict(body.get("spec") or {}))
            results_uri = spec.results or self.settings.results_uri
            for uri in (results_uri, spec.steps or steps_location(results_uri)):
                check_store_allowed(
                    parse_spec({"model": spec.model, "results": uri}), self.settings
                )
        except (SpecError, InvalidTest) as exc:
            self._conclude(body, status, generation, "Invalid", str(exc), "InvalidSpec")
            return
        try:
            prepared = self._prepare(uid, generation, spec, status)
            self._advance(body, spec, prepared, status, generation)
        except (BisectError, SpecError) as exc:
            self._conclude(body, status, generation, "Failed", str(exc), "BisectFailed")
        except Exception as exc:
            if is_store_error(exc):  # not reached now (an outage, throttling): try again
                self._retry_later(uid, body, status, generation, exc)
                return
            if isinstance(exc, StoreError):  # the store answered: what it holds does not do
                self._conclude(body, status, generation, "Failed", str(exc), "BisectFailed")
                return
            raise
        with self._lock:
            self._retry.pop(uid, None)

    def _prepare(
        self, uid: str, generation: int, spec: BisectSpec, status: BisectStatus
    ) -> Prepared:
        """The plan (made once, kept in the status) and the step tests' spec (made again by
        a restarted operator from the rows)."""
        with self._lock:
            known = self._prepared.get(uid)
        if known is not None and known.generation == generation and status.plan is not None:
            return known
        from model_support.dataset import record_to_row
        from model_support.evidence import shareable_uri
        from model_support.script import read_config, render_script

        results_uri = spec.results or self.settings.results_uri
        results = self.store(results_uri)
        steps = self.store(spec.steps or steps_location(results_uri))
        task = spec.task.value if spec.task else None
        if status.plan is None:
            good_id = find_run(results, spec.model, task, spec.good, "spec.good")
            bad_id = find_run(results, spec.model, task, spec.bad, "spec.bad")
            if good_id == bad_id:
                raise BisectError(
                    f"spec.good and spec.bad name the same run ({good_id}): give two rows"
                )
        else:
            good_id, bad_id = status.plan.good.runId, status.plan.bad.runId
        good, bad = results.get(good_id), results.get(bad_id)
        image = good.labels.get("image")
        pin_all = (
            image is None
            or "image" in spec.template
            or "extraPackages" in good.labels.get("untrusted_code", "")
        )
        where = shareable_uri(steps)
        step = step_spec(spec, bad, image, where)
        config = read_config(bad.run_py)
        test = parse_spec({**step, "extraPackages": ["placeholder==1"]})
        run_py = render_script(test.run_config(config.cores, config.parallelism))
        if status.plan is None:
            index = PackageIndex(
                index_url=spec.index.indexUrl, extra_index_urls=tuple(spec.index.extraIndexUrls)
            )
            plan = plan_from_rows(
                record_to_row(good), record_to_row(bad), index, consider=spec.packages
            ).model_copy(update={"run_py": run_py})
            if len(plan.suspects) > MAX_SUSPECTS:
                raise BisectError(
                    f"{len(plan.suspects)} packages changed between the rows ("
                    + ", ".join(s.name for s in plan.suspects)
                    + f"): a step pins at most {MAX_SUSPECTS}; name those to consider in "
                    "spec.packages"
                )
            status.plan = BisectPlanState.of(plan, hashlib.sha256(run_py.encode()).hexdigest())
        else:
            plan = status.plan.plan(bad.model_id, str(bad.document.task), run_py)
        sha256 = hashlib.sha256(run_py.encode()).hexdigest()
        prepared = Prepared(generation, plan, step, pin_all, results, steps, where, sha256)
        with self._lock:
            self._prepared[uid] = prepared
        return prepared

    def _advance(
        self,
        body: dict[str, Any],
        spec: BisectSpec,
        prepared: Prepared,
        status: BisectStatus,
        generation: int,
    ) -> None:
        """Walk the search over what is known; start the next step's test, or conclude."""
        from model_support.evidence import shareable_uri

        meta = body["metadata"]
        plan = prepared.plan
        found: dict[str, tuple[str, str | None, float]] = {}
        stored_in: dict[str, str] = {}
        recorded_by: dict[str, str] = {}  # run id -> the uid of the test that recorded it
        for store in (prepared.results, prepared.steps):
            runs = stored_runs(store, plan.model_id, plan.task)
            recorded_by |= {r.run_id: r.labels.get("test_uid", "") for r in runs}
            for key, run in matching_runs(runs, plan).items():
                if run[1] is not None:
                    stored_in[run[1]] = shareable_uri(store)
                if key not in found or run[2] > found[key][2]:
                    found[key] = run
        known = known_at_start(plan, found)
        fresh: set[str] = set()
        names: set[str] = set()
        for test in self.kube.list_tests(meta["namespace"], {LABEL_BISECT: meta["name"]}):
            if bisect_owner(test) != meta["uid"]:
                continue
            names.add(test["metadata"]["name"])
            said_step = (test["metadata"].get("annotations") or {}).get(ANNOTATION_BISECT_STEP)
            script, _, step = (said_step or "").partition(" ")
            if script != prepared.sha256 or not step:
                continue  # an earlier generation's step, of another run.py
            stored = found.get(step)
            if stored is not None and recorded_by.get(stored[1] or "") == test["metadata"]["uid"]:
                # Its record is stored before its status says Completed: this bisect ran it.
                fresh.add(step)
            said = TestStatus.read(test.get("status"))
            if said.observedGeneration != int(test["metadata"].get("generation") or 1):
                continue
            if said.phase is Phase.INVALID:
                raise BisectError(
                    f"step test {test['metadata']['name']} is Invalid: {said.message}; fix "
                    "spec.template (or the operator's settings) and apply the bisect again"
                )
            if said.phase is Phase.COMPLETED and said.result is not None and said.runId:
                known[step] = (said.result.value, said.runId)
                fresh.add(step)
                stored_in[said.runId] = prepared.steps_uri
        steps, decision = walk(plan, known, fresh)
        status.steps = [
            BisectStep.of(s, step_name(meta["name"], s, prepared.sha256)) for s in steps
        ]
        status.stepsStore = prepared.steps_uri
        if isinstance(decision, Conclusion):
            report = report_for(plan, steps, decision, prepared.steps_uri, stored_in)
            status.concluded(report)
            status.report = render_bisect(report)[:REPORT_LIMIT]
            found_any = bool(decision.culprits)
            self._conclude(
                body, status, generation, "Done", decision.message,
                "FirstBadVersion" if found_any else "NoCulprit",
                kind="Normal" if found_any else "Warning",
            )  # fmt: skip
            return
        name = step_name(meta["name"], decision, prepared.sha256)
        if name not in names:
            if len(fresh) >= spec.maxSteps:
                raise BisectError(
                    f"stopped after {spec.maxSteps} steps without a conclusion (spec.maxSteps)"
                )
            good = {s.name: s.good for s in plan.suspects}
            pins = step_pins(decision, good, prepared.pin_all)
            test = build_step(body, decision, prepared.step, pins, prepared.sha256)
            # AlreadyExists: made by an earlier reconcile whose listing this one did not see.
            with contextlib.suppress(AlreadyExists):
                self.kube.create_test(test)
        status.steps.append(
            BisectStep(
                package=decision.package,
                version=decision.version,
                pins=decision.pins,
                purpose=decision.purpose,
                test=name,
            )
        )
        message = (
            f"step {len(status.steps)}: {decision.purpose}: {decision.package}=="
            f"{decision.version} runs in test {name}"
        )
        self._write(body, status, generation, "Bisecting", message)

    # ---------------------------------------------------------------- status

    def _write(
        self,
        body: dict[str, Any],
        status: BisectStatus,
        generation: int,
        phase: BisectPhase,
        message: str,
    ) -> bool:
        """Write ``status`` in ``phase`` as of the bisect read; False when nothing changed.
        Raises Conflict when the bisect changed since."""
        status.observedGeneration = generation
        status.phase = phase
        status.message = message[:MESSAGE_LIMIT]
        status.conditions = [
            Condition.model_validate(c)
            for c in bisect_conditions(status.condition_dicts(), phase, generation, message)
        ]
        new = status.patch()
        if _stored(body.get("status") or {}) == _stored(new):
            return False
        meta = body["metadata"]
        self.kube.patch_bisect_status(
            meta["namespace"], meta["name"], new, str(meta.get("resourceVersion") or "")
        )
        return True

    def _conclude(
        self,
        body: dict[str, Any],
        status: BisectStatus,
        generation: int,
        phase: BisectPhase,
        message: str,
        reason: str,
        *,
        kind: str = "Warning",
    ) -> None:
        """End the generation in ``phase`` with one Event."""
        log.log(
            logging.INFO if phase == "Done" else logging.WARNING,
            "bisect %s/%s: %s",
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            message,
        )
        if self._write(body, status, generation, phase, message):
            self.kube.post_event(body, kind, reason, message[:MESSAGE_LIMIT])
        with self._lock:
            self._retry.pop(body["metadata"]["uid"], None)

    def _retry_later(
        self,
        uid: str,
        body: dict[str, Any],
        status: BisectStatus,
        generation: int,
        exc: BaseException,
    ) -> None:
        """A store could not be read now: say so, and try again after a backoff."""
        from model_support.storage_errors import access_failure_reason

        with self._lock:
            previous = self._retry.get(uid)
            delay = min(self.settings.retry_cap_s, previous[1] * 2 if previous else 5.0)
            self._retry[uid] = (time.monotonic() + delay, delay, generation)
        message = (
            f"a results store could not be read: {access_failure_reason(exc)}; trying again "
            f"in {delay:g} s"
        )
        log.warning("bisect %s: %s", uid, message)
        phase: BisectPhase = "Bisecting" if status.plan is not None else "Planning"
        self._write(body, status, generation, phase, message)

    def store(self, uri: str) -> ResultsStore:
        """The results store at ``uri`` (one per URI for this process)."""
        from model_support.store import ResultsStore

        with self._lock:
            if uri not in self._stores:
                self._stores[uri] = ResultsStore(uri)
            return self._stores[uri]


def _stored(value: Any) -> Any:
    """A merge patch as the API server stores it: null fields are absent."""
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored(v) for v in value]
    return value


__all__ = ["BisectReconciler", "Prepared"]
