"""The operator's logic: a ModelSupportTest becomes a ConfigMap (run.py) and a runner Job; the
Job's end becomes the test's status and one run record.

State lives in the resource's status, never in the operator: every child has a deterministic
name per generation and attempt, a create that meets 409 adopts what is there, a completed test
is never touched again, and the run id is derived from uid + generation + attempt, so an
operator that restarts (or sees an event twice) records each run exactly once. What the operator
keeps in memory (the tests it watches, backoff timers, the phases it last wrote) only saves API
requests; losing it on a restart loses nothing.

Methods are synchronous on purpose: they use the blocking Kubernetes client and the results
store, and kopf runs synchronous handlers in its thread pool, off its event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from model_support.config import RunConfig
from model_support.delivery import DeliveryArea, DeliveryError, delivery_key, slot_for
from model_support.operator import metrics
from model_support.operator.costing import run_cost
from model_support.operator.kube import AlreadyExists, Conflict, Kube, being_deleted
from model_support.operator.manifests import (
    Placement,
    TestRef,
    build_delivery_secret,
    delivery_url_expiry,
    delivery_wiring,
    job_reference,
)
from model_support.operator.outcome import (
    INFRA_RESULTS,
    DocumentSource,
    JobState,
    Reading,
    Unavailable,
    WaitKind,
    job_ended_at,
    job_outcome_stands,
    pod_waiting,
    read_job,
    reported_stack_fields,
    stuck_reason,
    trusted_document,
)
from model_support.operator.planning import (
    InvalidTest,
    LoadFailure,
    Transient,
    check_compile_cache,
    check_model_path,
    check_store_allowed,
    children,
    claim_template,
    pin,
    place,
    store_uri,
)
from model_support.operator.recording import Materializer, sweep_deliveries
from model_support.operator.resource import (
    ANNOTATION_TEST_NAME,
    LABEL_ATTEMPT,
    LABEL_GENERATION,
    LABEL_KUEUE_QUEUE,
    LABEL_MANAGED_BY,
    LABEL_RECORDED,
    LABEL_UID,
    MANAGED_BY,
    RUNNER_CONTAINER,
    child_name,
    run_id_for,
)
from model_support.operator.settings import OperatorSettings, RunnerStack
from model_support.operator.spec import SpecError, TestSpec, parse_spec
from model_support.operator.status import (
    ACTIVE_PHASES,
    MESSAGE_LIMIT,
    PHASE_ORDER,
    Phase,
    TestStatus,
    kstatus_conditions,
    now,
    set_condition,
)
from model_support.records import (
    ResultDocument,
    RunRecord,
    excluded_record,
    failure_document,
    parse_result_line,
    record_from_document,
)
from model_support.runner_pod import RUNNER_MESSAGE_PREFIX
from model_support.script import read_config, render_script
from model_support.sizing import Exclusion
from model_support.store import RecordExists, RecordNotFound, ResultsStore
from model_support.vocabulary import ErrorClass, Parallelism, Result

log = logging.getLogger(__name__)

GiB = 2**30
HUB_TOKEN_LABEL = "modelsupport.dev/hub-token"
"""A Secret the operator may read for a test's hubTokenSecret must carry this label ("true")."""
_EVENT_REASON = {
    Result.PASS: "Passed",
    Result.FAIL: "Failed",
    Result.ERROR: "Errored",
    Result.TIMEOUT: "TimedOut",
    Result.EXCLUDED: "Excluded",
    Result.UNVERIFIED: "Unverified",
}


def _handled(status: TestStatus, ref: TestRef) -> bool:
    """Whether ``status`` shows generation ``ref.generation`` launched or finished (and not
    waiting for a retry): nothing is to be created for it again."""
    return (
        status.observedGeneration == ref.generation
        and status.phase is not None
        and not _retrying(status)
    )


def _short(text: str | None) -> str:
    if not text:
        return ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:MESSAGE_LIMIT]


class CreateRefused(Exception):
    """The API server refused to create a child (quota, admission, validation)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@contextlib.contextmanager
def _refusal(kind: str, body: dict[str, Any] | None) -> Iterator[None]:
    """Turn the API server's refusal of a create (403, 422, ...) into CreateRefused, with its
    own message (a ResourceQuota's or LimitRange's, an admission webhook's)."""
    try:
        yield
    except ApiException as exc:
        if exc.status in (404, 409) or exc.status is None or exc.status >= 500:
            raise
        detail = exc.reason or ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            detail = json.loads(exc.body).get("message") or detail
        name = ((body or {}).get("metadata") or {}).get("name")
        raise CreateRefused(
            exc.status,
            f"the API server refused to create {kind}{' ' + name if name else ''} "
            f"({exc.status}): {detail}",
        ) from exc


def _retrying(status: TestStatus) -> bool:
    """Whether the status says this generation waits for a retry (sizing, or a refused create)."""
    return (
        status.reason("Sized") == "SizingRetrying" or status.reason("JobCreated") == "CreateRefused"
    )


class _NoSpec:
    """Stands for a spec that no longer parses (only what a message needs of it)."""

    queueName: str | None = None


class _NotRead:
    """Marks a delivery not read yet (``finish`` reads it itself)."""


_NOT_READ = _NotRead()


_WAITING_FOR_ADMISSION = frozenset(
    {(Phase.QUEUED, "KueueAdmission"), (Phase.QUEUED, "NotAdmitted")}
)
_WAITING_FOR_CAPACITY = frozenset({(Phase.QUEUED, "Unschedulable")})
_NOT_ADMITTED = frozenset({(Phase.QUEUED, "NotAdmitted")})
RESYNC = "RESYNC"
"""The event type resync_jobs offers a listed Job with (kopf's are ADDED/MODIFIED/DELETED/None)."""

StatusPatch = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any] | None]
"""A status merge patch, or a function making it from the test as the API has it."""
_CONFLICT_TRIES = 5

_RELEASE_MEMORY_S = 600.0
"""How long a released Job is remembered (a stale listing of it is not released again)."""


@dataclass
class _Audit:
    """When what this process knows of a kind was last compared with the API."""

    listed: bool = False
    at: float = 0.0

    def due(self, interval_s: float) -> bool:
        return self.listed or time.monotonic() - self.at >= interval_s

    def done(self) -> None:
        self.listed, self.at = False, time.monotonic()


@dataclass(frozen=True)
class _RunningWrite:
    """A Running phase to write once due (unless the run ended before)."""

    due: float
    ref: TestRef
    attempt: int
    started: str | None


@dataclass(frozen=True)
class _Backoff:
    """When a test's sizing is tried again, and how many tries it had."""

    next_at: float
    tries: int


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
    delivery_key: bytes | None = None
    """The key of delivery slots (:func:`model_support.delivery.slot_for`); None: from the
    environment (``MODEL_SUPPORT_DELIVERY_KEY``), else random for this process."""

    def __post_init__(self) -> None:
        if self.delivery_key is None:
            self.delivery_key, configured = delivery_key()
            if not configured:
                log.warning(
                    "MODEL_SUPPORT_DELIVERY_KEY is not set: delivery slots use a key of this "
                    "process, so runs started before a restart fall back to log and "
                    "termination message"
                )
        self._stores: dict[str, ResultsStore] = {}
        self.materializers: dict[str, Materializer] = {}
        self._lock = threading.Lock()
        self._retries: dict[str, _Retry] = {}
        self._released: dict[tuple[str, str], float] = {}
        self._sizing: dict[tuple[str, int], _Backoff] = {}
        self._reconciling: set[tuple[str, int]] = set()
        self._finishing: set[str] = set()
        self._phases: dict[tuple[str, int, int], tuple[Phase, str]] = {}
        self._running: dict[tuple[str, int, int], _RunningWrite] = {}
        self.tests: dict[str, dict[str, Any]] = {}
        """Every watched test by uid, as the watch last showed it (saves a GET per Job event)."""
        self._audit = _Audit()

    # ---------------------------------------------------------------- the tests we know of

    def observe_test(self, body: dict[str, Any], event_type: str | None) -> None:
        """Keep :attr:`tests` as the watch shows them (called for every test event)."""
        uid = (body.get("metadata") or {}).get("uid")
        if not uid:
            return
        with self._lock:
            if event_type == "DELETED":
                self.tests.pop(uid, None)
                for key in [k for k in list(self._phases) if k[0] == uid]:
                    del self._phases[key]
            elif _newer(body, self.tests.get(uid)):
                self.tests[uid] = body

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
        with self._lock:
            known = set(self.tests)
        listed: set[str] = set()
        for namespace in self.watched_namespaces():
            listed.update(
                str(t["metadata"].get("uid")) for t in self.kube.list_tests(namespace, {})
            )
        gone = known - listed
        for uid in gone:
            self.forget_test(uid)
        self._audit.done()
        return len(gone)

    def _test(self, ref: TestRef) -> dict[str, Any] | None:
        """A test as last seen, else read from the API (None when it is gone)."""
        known = self.tests.get(ref.uid)
        if known is not None:
            return known
        test = self.kube.get_test(ref.namespace, ref.name)
        if test is not None and test["metadata"].get("uid") == ref.uid:
            self.observe_test(test, "FETCHED")
            return test
        return None

    def patch_status(self, ref: TestRef, build: StatusPatch) -> dict[str, Any] | None:
        """Write a test's status; what the API returns becomes what we know.

        ``build`` is the merge patch, or makes it from the test (None: nothing to write). The
        write carries the resourceVersion of the test it was made from, so a stale view never
        wins: on 409 the test is read again and ``build`` runs again on what it says. Nothing
        is written to a test of another generation, or to one whose generation is Completed
        (a terminal phase is never moved back). Returns the patched test, None when nothing
        was written.
        """
        test = self._test(ref)
        for _ in range(_CONFLICT_TRIES):
            if test is None or int(test["metadata"].get("generation") or 1) != ref.generation:
                return None  # gone, or a newer spec: this write is about the past
            status = TestStatus.read(test.get("status"))
            if status.phase is Phase.COMPLETED and status.observedGeneration == ref.generation:
                return None
            patch = build(test) if callable(build) else build
            if patch is None:
                return None
            version = (test.get("metadata") or {}).get("resourceVersion")
            try:
                patched = self.kube.patch_test_status(
                    ref.namespace, ref.name, patch, resource_version=version
                )
            except Conflict:
                metrics.STATUS_CONFLICTS.inc()
                fresh = self.kube.get_test(ref.namespace, ref.name)
                if fresh is None or fresh["metadata"].get("uid") != ref.uid:
                    self.forget_test(ref.uid)
                    return None
                self.observe_test(fresh, "FETCHED")
                test = fresh
                continue
            if patched is None or patched["metadata"].get("uid") != ref.uid:
                self.forget_test(ref.uid)
                return None
            self.observe_test(patched, "PATCHED")
            return patched
        log.warning(
            "%s/%s: the status write kept conflicting (%d tries); the next event retries it",
            ref.namespace, ref.name, _CONFLICT_TRIES,
        )  # fmt: skip
        return None

    def event(self, test: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """An Event on the test (posted with our client, so it works from any thread)."""
        self.kube.post_event(test, kind, reason, message[:MESSAGE_LIMIT])

    # ---------------------------------------------------------------- stores

    def store_uri(self, spec: TestSpec | None) -> str:
        """The results store URI of a test (its spec's `results`, else the operator's)."""
        return store_uri(spec, self.settings)

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

    # ---------------------------------------------------------------- sizing

    def hub_token(self, spec: TestSpec, namespace: str) -> str | None:
        """The Hub token of a test's hubTokenSecret, when the operator may read it."""
        if spec.hubTokenSecret is None or not self.settings.read_token_secrets:
            return None
        # Only a Secret labelled so is ever returned to the operator (a selected list).
        secret = self.kube.read_labelled_secret(
            namespace, spec.hubTokenSecret.name, {HUB_TOKEN_LABEL: "true"}
        )
        name = f"{namespace}/{spec.hubTokenSecret.name}"
        if secret is None:
            raise InvalidTest(
                f"spec.hubTokenSecret names Secret {name}, which does not exist or lacks the "
                f"label {HUB_TOKEN_LABEL}=true; the operator reads only Secrets labelled so "
                f"(kubectl label secret -n {namespace} {spec.hubTokenSecret.name} "
                f"{HUB_TOKEN_LABEL}=true)"
            )
        value = self.kube.secret_key(secret, spec.hubTokenSecret.key)
        if value is None:
            raise InvalidTest(f"Secret {name} has no key {spec.hubTokenSecret.key!r}")
        return value

    def pin(self, spec: TestSpec, namespace: str) -> TestSpec:
        """The spec at the commit its revision names now (see :func:`planning.pin`)."""
        return pin(spec, self.settings, token=self.hub_token(spec, namespace))

    def place(self, spec: TestSpec, namespace: str) -> Placement | Exclusion:
        """Cores, host memory and storage of a test (see :func:`planning.place`), with the
        token of its hubTokenSecret when the operator may read it."""
        return place(spec, self.settings, token=self.hub_token(spec, namespace))

    # ---------------------------------------------------------------- test created / changed / resumed

    def on_test(self, body: dict[str, Any], event_type: str | None) -> None:
        """A test changed (or was listed: ``event_type`` None at startup): reconcile it when
        its generation is not handled yet; on startup, look after its Job.

        Level-based: kopf only reports events, nothing is persisted besides the status (no
        progress or diff-base annotations to write), and what the event cannot finish (a Hub
        outage) the watchdog offers again (:meth:`retry_tests`).
        """
        self.observe_test(body, event_type)
        if event_type == "DELETED" or being_deleted(body):
            return  # a test being deleted is never sized, launched or recorded
        # A late event (older than what this process wrote or saw since, e.g. the startup
        # listing after the test was completed) must not undo a handled generation: act on
        # the newest view.
        uid = (body.get("metadata") or {}).get("uid")
        with self._lock:
            newest = self.tests.get(uid, body) if uid else body
        self.reconcile(newest, resumed=event_type is None)

    def reconcile(
        self, body: dict[str, Any], *, resumed: bool = False, from_cache: bool = False
    ) -> None:
        """Bring one generation of a test to a running Job (or a recorded final state).

        ``from_cache``: ``body`` is what this process last saw, not an event just received, so
        the API is asked whether the test still exists before anything is created for it.
        """
        meta = body["metadata"]
        if being_deleted(body):
            return
        ref = TestRef(
            meta["namespace"], meta["name"], meta["uid"], int(meta.get("generation") or 1)
        )
        status = TestStatus.read(body.get("status"))
        if _handled(status, ref):
            if resumed and status.phase in ACTIVE_PHASES:
                self._check_job_exists(body, ref, status)
            return  # this generation is handled; its Job's events carry it on
        key = (ref.uid, ref.generation)
        with self._lock:
            backoff = self._sizing.get(key)
            if key in self._reconciling or (backoff and time.monotonic() < backoff.next_at):
                return  # being reconciled in another thread, or waiting for its retry
            # Another thread may have launched this generation since ``body`` was read (the
            # watchdog's snapshot, an event queued behind the launch): the newest view says.
            latest = self.tests.get(ref.uid)
            if latest is not None and _handled(TestStatus.read(latest.get("status")), ref):
                return
            self._reconciling.add(key)
        try:
            self._reconcile(body, ref, status, backoff.tries if backoff else 0, from_cache)
        finally:
            with self._lock:
                self._reconciling.discard(key)

    def retry_tests(self) -> int:
        """Reconcile again every known test whose generation is not handled (a sizing retry
        that is due, or an event whose handling failed). No API requests for the others."""
        offered = 0
        for test in list(self.tests.values()):
            status = TestStatus.read(test.get("status"))
            generation = int(test["metadata"].get("generation") or 1)
            if status.observedGeneration != generation or _retrying(status):
                self.reconcile(test, from_cache=True)
                offered += 1
        return offered

    def _reconcile(
        self,
        body: dict[str, Any],
        ref: TestRef,
        status: TestStatus,
        retry: int,
        from_cache: bool = False,
    ) -> None:
        self._delete_superseded_job(ref, status)
        try:
            spec = parse_spec(dict(body.get("spec") or {}))
            check_store_allowed(spec, self.settings)
            check_model_path(spec, self.settings)
            check_compile_cache(spec, self.settings, ref.namespace)
            spec = self.pin(spec, ref.namespace)
            placement = self.place(spec, ref.namespace)
        except (SpecError, InvalidTest) as exc:
            self._invalid(body, ref, str(exc))
            return
        except LoadFailure as exc:
            self._record_final(
                body, ref, spec, Result.ERROR, ErrorClass.LOAD, str(exc), "LoadFailed"
            )
            return
        except Transient as exc:
            if retry >= self.settings.sizing_max_retries:
                message = f"{exc} (gave up after {retry + 1} tries)"
                self._record_final(
                    body, ref, spec, Result.ERROR, ErrorClass.INFRASTRUCTURE, message,
                    "SizingFailed",
                )  # fmt: skip
                return
            self._retry_later(body, ref, retry, "Sized", "SizingRetrying", str(exc))
            return
        with self._lock:
            self._sizing.pop((ref.uid, ref.generation), None)
        if isinstance(placement, Exclusion):
            self._record_exclusion(body, ref, spec, placement)
            return
        if from_cache:
            fresh = self._fresh_test(ref)
            if fresh is None:
                return  # what we knew is stale (e.g. missed after a watch relist): no owner, no Job
            if _handled(TestStatus.read(fresh.get("status")), ref):
                return  # launched meanwhile (by another replica, or before a restart)
        try:
            self._launch(body, ref, spec, placement)
        except CreateRefused as exc:
            if exc.status in (400, 422):  # admission or validation: the spec cannot run as is
                self._invalid(body, ref, str(exc))
            else:  # quota (403), throttling (429), the API server's trouble: retried
                self._retry_later(body, ref, retry, "JobCreated", "CreateRefused", str(exc))

    def _retry_later(
        self, body: dict[str, Any], ref: TestRef, retry: int, kind: str, reason: str, why: str
    ) -> None:
        """Reconcile this generation again after a capped backoff; say why on the test (a
        condition ``kind`` with ``reason``, and an Event on the first try)."""
        delay = min(self.settings.retry_cap_s, self.settings.sizing_retry_base_s * 2**retry)
        with self._lock:
            self._sizing[(ref.uid, ref.generation)] = _Backoff(time.monotonic() + delay, retry + 1)
        message = f"{why}; retrying in {delay:g} s (try {retry + 1})"
        log.warning("%s/%s: %s", ref.namespace, ref.name, message)
        self.patch_status(
            ref,
            TestStatus.new_generation(
                phase=Phase.PENDING,
                observedGeneration=ref.generation,
                message=message[:MESSAGE_LIMIT],
                conditions=kstatus_conditions(
                    set_condition(None, kind, False, reason, message, ref.generation),
                    Phase.PENDING,
                    ref.generation,
                    message=message,
                ),
            ),
        )
        if retry == 0:
            self.event(body, "Warning", reason, message)

    def _launch(
        self,
        body: dict[str, Any],
        ref: TestRef,
        spec: TestSpec,
        placement: Placement,
    ) -> None:
        config = spec.run_config(placement.cores, placement.parallelism)
        run_py = render_script(config)
        attempt = 1
        cm_name, job_name = self._start(ref, spec, placement, run_py, attempt)
        generation = ref.generation
        conditions = set_condition(
            None,
            "Sized",
            True,
            "Override" if spec.cores else "Sized",
            f"{placement.cores} core(s), parallelism {placement.parallelism.value}"
            + (
                f"; the pod holds {placement.held_cores} (whole devices the scheduler places)"
                if placement.held_cores != placement.cores
                else ""
            ),
            generation,
        )
        queued = f" queued in Kueue LocalQueue {spec.queueName}" if spec.queueName else ""
        conditions = set_condition(
            conditions,
            "JobCreated",
            True,
            "JobCreated",
            f"Job {job_name} created{queued}",
            generation,
        )
        conditions = set_condition(
            conditions, "Recorded", False, "Running", "no result yet", generation
        )
        phase = Phase.QUEUED if spec.queueName else Phase.PENDING
        if spec.queueName:
            conditions = set_condition(
                conditions, "Queued", True, "KueueAdmission",
                f"waiting for Kueue to admit the Job (LocalQueue {spec.queueName})", generation,
            )  # fmt: skip
        self.patch_status(
            ref,
            TestStatus.new_generation(
                phase=phase,
                observedGeneration=generation,
                cores=placement.cores,
                podCores=placement.held_cores,
                parallelism=placement.parallelism,
                hostMemoryBytes=placement.host_memory_bytes,
                checkpointBytes=placement.checkpoint_bytes,
                attempt=attempt,
                configMapName=cm_name,
                jobName=job_name,
                runId=run_id_for(ref.uid, generation, attempt),
                runScriptSha256=hashlib.sha256(run_py.encode()).hexdigest(),
                revision=spec.revision,
                conditions=kstatus_conditions(conditions, phase, generation),
            ),
        )
        self._phases[(ref.uid, generation, attempt)] = (
            (Phase.QUEUED, "KueueAdmission") if spec.queueName else (Phase.PENDING, "JobCreated")
        )

    def _start(
        self, ref: TestRef, spec: TestSpec, placement: Placement, run_py: str, attempt: int
    ) -> tuple[str, str]:
        """Create (or adopt) the ConfigMap and the Job of one attempt; returns their names."""
        configmap, job = children(
            ref, spec, placement, self.settings, attempt, run_py, self.delivery_key
        )
        with _refusal("ResourceClaimTemplate", None):
            self._create_claim_template(ref, spec, placement)
        self._prepare_delivery(ref, spec, attempt)  # before the pod that reads it
        name = job["metadata"]["name"]
        created: dict[str, Any] | None
        try:
            with _refusal("Job", job):
                created = self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
        except AlreadyExists:
            log.info("Job %s/%s already exists; adopting it", ref.namespace, name)
            created = self.kube.read_job(ref.namespace, name)
        if created is not None:
            # The Job owns its run.py: collected with it once the run is recorded. Its pod
            # waits for the ConfigMap (the kubelet retries the mount) the moment it takes.
            configmap["metadata"]["ownerReferences"] = [job_reference(created)]
        try:
            with _refusal("ConfigMap", configmap), contextlib.suppress(AlreadyExists):
                self.kube.create_configmap(configmap)  # 409: made by an earlier try: adopted
        except CreateRefused as exc:
            if exc.status in (400, 422):
                # Refused for good: the Job's pod would hold its cores waiting for a run.py
                # that never comes. (A quota's refusal is retried; the Job is adopted then.)
                self.kube.delete_job(ref.namespace, name)
            raise
        return configmap["metadata"]["name"], name

    def _create_claim_template(self, ref: TestRef, spec: TestSpec, placement: Placement) -> None:
        """Create (or adopt) the generation's ResourceClaimTemplate when cores come via DRA."""
        template = claim_template(ref, spec, placement, self.settings)
        if template is not None:
            with contextlib.suppress(AlreadyExists):  # shared by the generation's attempts
                self.kube.create_resource_claim_template(template)

    def _slot(self, run_id: str) -> str:
        assert self.delivery_key is not None  # set in __post_init__
        return slot_for(run_id, self.delivery_key)

    def _prepare_delivery(self, ref: TestRef, spec: TestSpec, attempt: int) -> None:
        """Make the attempt's delivery slot reachable by its runner pod alone: the slot's
        folder on the results volume, or a Secret with an upload URL signed for its one key.

        A store that cannot make the slot is logged, never fatal: the runner then cannot deliver
        (the Secret's env is optional) and the operator reads its log and termination message
        instead. The API server's refusal of the Secret is CreateRefused, as for the Job.
        """
        run_id = run_id_for(ref.uid, ref.generation, attempt)
        job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
        slot = self._slot(run_id)
        uri = self.store_uri(spec)
        wiring = delivery_wiring(uri, self.settings, slot, job_name)
        if wiring is None:
            return
        try:
            area = DeliveryArea(uri)
            if wiring.sub_path is not None:
                area.prepare(slot)
                return
            url = area.upload_url(slot, delivery_url_expiry(spec, self.settings))
        except (DeliveryError, ValueError) as exc:
            log.warning("run %s cannot deliver to %s: %s", run_id, uri, exc)
            return
        secret = build_delivery_secret(ref, job_name, attempt, url)
        # A refusal (a quota on Secrets, say) is said on the test like the Job's own.
        with _refusal("Secret", secret), contextlib.suppress(AlreadyExists):
            self.kube.create_secret(secret)  # made by an earlier try: signed alike

    def _delete_superseded_job(self, ref: TestRef, status: TestStatus) -> None:
        """A spec change supersedes the running Job of the previous generation."""
        old_job = status.jobName
        if (
            old_job
            and status.phase in ACTIVE_PHASES
            and status.observedGeneration != ref.generation
        ):
            self.kube.delete_job(ref.namespace, old_job)

    def _invalid(self, body: dict[str, Any], ref: TestRef, message: str) -> None:
        self.patch_status(
            ref,
            TestStatus.new_generation(
                phase=Phase.INVALID,
                observedGeneration=ref.generation,
                message=message[:MESSAGE_LIMIT],
                conditions=kstatus_conditions(None, Phase.INVALID, ref.generation, message=message),
            ),
        )
        self.event(body, "Warning", "InvalidSpec", message)

    def _record_final(
        self,
        body: dict[str, Any],
        ref: TestRef,
        spec: TestSpec,
        result: Result,
        error_class: ErrorClass,
        message: str,
        reason: str,
    ) -> None:
        """A test that ends before any Job (the model cannot be read): recorded, Completed."""
        config = spec.run_config(spec.cores or 1, spec.parallelism or Parallelism.NONE)
        document = failure_document(config, result, error_class=error_class, error=message)
        record = record_from_document(
            document,
            render_script(config),
            source="operator",
            labels={**self._labels(ref, None, 0), "document_source": DocumentSource.OPERATOR.value},
        )
        summary = f"{result.value}/{error_class.value}"
        self._complete_without_job(
            ref,
            spec,
            record,
            message,
            sized=reason,
            ready=(_reason(summary), _short(message)),
            errorClass=error_class,
        )
        self.event(body, "Warning", reason, f"{summary}: {message}")

    def _record_exclusion(
        self,
        body: dict[str, Any],
        ref: TestRef,
        spec: TestSpec,
        exclusion: Exclusion,
    ) -> None:
        """A test sizing excludes (too large, no parallel plan, ...): recorded, Completed."""
        record = excluded_record(
            spec.run_config(1, Parallelism.NONE),
            exclusion.reason,
            exclusion.message,
            source="operator",
            labels=self._labels(ref, None, 0),
            needed=exclusion.needed_split,
        )
        self._complete_without_job(
            ref,
            spec,
            record,
            exclusion.message,
            sized="Excluded",
            ready=("EXCLUDED", exclusion.message),
            exclusionReason=exclusion.reason,
        )
        self.event(body, "Normal", "Excluded", f"{exclusion.reason.value}: {exclusion.message}")

    def _complete_without_job(
        self,
        ref: TestRef,
        spec: TestSpec,
        record: RunRecord,
        message: str,
        *,
        sized: str,
        ready: tuple[str, str],
        **status: Any,
    ) -> None:
        """Record a generation that ends at sizing (run id of attempt 0) and mark it Completed:
        condition Sized False with reason ``sized``, Ready with ``ready`` (reason, message), and
        ``status``'s extra fields (its error class or exclusion reason)."""
        run_id = run_id_for(ref.uid, ref.generation, 0)
        self.record(spec, record.model_copy(update={"run_id": run_id}))
        conditions = set_condition(None, "Sized", False, sized, message, ref.generation)
        conditions = set_condition(
            conditions, "Recorded", True, "Recorded", f"run {run_id} recorded", ref.generation
        )
        self.patch_status(
            ref,
            TestStatus.new_generation(
                phase=Phase.COMPLETED,
                observedGeneration=ref.generation,
                result=record.document.result,
                message=message[:MESSAGE_LIMIT],
                runId=run_id,
                finishedAt=now(),
                conditions=kstatus_conditions(
                    conditions,
                    Phase.COMPLETED,
                    ref.generation,
                    result=ready[0],
                    message=ready[1],
                ),
                **status,
            ),
        )

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

    def _declared_stack(self, spec: TestSpec | None) -> RunnerStack | None:
        """The stack a test's record names: the configured runner image's, for a test on it
        that installs nothing over it; None (the pod's report, labelled by
        :meth:`_provenance` as what untrusted code said) for its own image or extraPackages,
        which may rightly change the versions."""
        if spec is None or spec.extraPackages:
            return None
        if (spec.image or self.settings.runner_image) != self.settings.runner_image:
            return None
        return self.settings.declared_runner_stack()

    def _provenance(self, spec: TestSpec | None) -> dict[str, str]:
        """What ran, as the operator knows it: the runner image, what in the test runs code the
        project does not control (the document's packages are what that code reported), and
        whether the row's stack is the image's declared one or its pod's report."""
        if spec is None:
            return {}
        labels = {"image": spec.image or self.settings.runner_image}
        untrusted = spec.untrusted_code(self.settings.runner_image)
        if untrusted:
            labels["untrusted_code"] = ",".join(untrusted)
        # Whose word the row's compiler and library versions are: the settings' declaration for
        # the runner image, or (no declaration: another image, or a runnerImage set without
        # runnerStack) only what its pod reported.
        declared = self._declared_stack(spec)
        labels["stack"] = (
            "declared"
            if declared is not None and declared.model_dump(exclude_none=True)
            else "reported"
        )
        return labels

    def _check_job_exists(self, body: dict[str, Any], ref: TestRef, status: TestStatus) -> None:
        """On restart: a test whose Job vanished while the operator was away is finished from
        its delivered document, or as ERROR/infrastructure when there is none."""
        job_name = status.jobName
        if job_name and self.kube.read_job(ref.namespace, job_name) is None:
            attempt = status.attempt or 1
            reading = Reading(
                JobState.INFRASTRUCTURE,
                f"the runner Job {job_name} disappeared before its result was read",
            )
            self.finish(body, ref, attempt, job_name, reading, final=True)

    # ---------------------------------------------------------------- runner Job events

    def job_owner(self, obj: dict[str, Any]) -> tuple[TestRef, int] | None:
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

    def on_job(self, job: dict[str, Any], event_type: str) -> None:
        """A runner Job changed: move the test's phase, retry after node loss, or finish it."""
        owner = self.job_owner(job)
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
                self._progress(ref, attempt, job)
            return
        test = self._current_test(ref, attempt, completed=True)
        if test is None:
            return
        if deleting and (test.get("status") or {}).get("phase") != Phase.COMPLETED:
            # A Job goes first when its test is deleted (the garbage collector deletes the
            # dependents of a test in foreground deletion while the test still exists, and the
            # test's own event may come later): ask the API, not what was last seen.
            fresh = self._fresh_test(ref)
            if fresh is None:
                return  # the test is gone or being deleted: nothing is recorded
            test = fresh
        if (test.get("status") or {}).get("phase") == Phase.COMPLETED:
            if (
                LABEL_RECORDED not in (meta.get("labels") or {})
                and event_type != "DELETED"
                and not self._released_lately(ref.namespace, job_name)
            ):
                # Recorded, but the operator stopped before it released the Job to its TTL.
                self._release(ref.namespace, job_name)
            return
        run_id = run_id_for(ref.uid, ref.generation, attempt)
        if not self._due(run_id):
            return  # a deferred recording whose backoff has not elapsed
        delivered = self._read_delivery(test, run_id)
        delivered_document = isinstance(delivered, bytes) and _is_document(delivered)
        if delivered_document and reading.state is JobState.SUCCEEDED:
            # The runner finished by itself and delivered: its pods no longer matter.
            self.finish(
                test, ref, attempt, job_name, reading, ended_at=_ended_at(job),
                final=event_type == "DELETED", delivered=delivered,
            )  # fmt: skip
            return
        pods = self.kube.list_pods(ref.namespace, {LABEL_UID: ref.uid, "job-name": job_name})
        reading = read_job(job, pods)
        if delivered_document and not job_outcome_stands(reading):
            # A delivery outlives a node lost after it; the Job's own end (deadline, OOM, a
            # runner that never started) is never overruled by what a pod wrote.
            self.finish(
                test, ref, attempt, job_name, reading, ended_at=_ended_at(job),
                final=event_type == "DELETED", delivered=delivered,
            )  # fmt: skip
            return
        if reading.state == JobState.ACTIVE:
            # The Job was deleted under a running test (by hand, or its node pool went away).
            reading = dataclasses.replace(
                reading,
                state=JobState.INFRASTRUCTURE,
                message=f"the runner Job {job_name} was deleted before it finished",
            )
        if reading.state == JobState.NODE_LOST and attempt < self.settings.max_attempts:
            self._retry(test, ref, attempt, reading)
            return
        self.finish(
            test, ref, attempt, job_name, reading, ended_at=_ended_at(job),
            final=event_type == "DELETED", delivered=delivered,
        )  # fmt: skip

    def _due(self, run_id: str) -> bool:
        with self._lock:
            retry = self._retries.get(run_id)
        return retry is None or time.monotonic() >= retry.next_at

    def _read_delivery(self, test: dict[str, Any], run_id: str) -> bytes | Unavailable | None:
        """What the runner of ``run_id`` delivered: the bytes, None (nothing), or Unavailable."""
        try:
            return DeliveryArea(self.store_uri(_spec_or_none(test))).get(self._slot(run_id))
        except (DeliveryError, ValueError) as exc:
            return Unavailable(f"the delivery area could not be read: {exc}")

    def _release(self, namespace: str, job_name: str) -> None:
        """Label a recorded Job and hand it to the TTL controller (once per Job, lately)."""
        self.kube.mark_job_recorded(namespace, job_name, self.settings.ttl_seconds_after_finished)
        with self._lock:
            self._released[(namespace, job_name)] = time.monotonic()

    def _released_lately(self, namespace: str, job_name: str) -> bool:
        """Whether this operator released the Job lately (a listing may predate its label)."""
        with self._lock:
            released = self._released.get((namespace, job_name))
        return released is not None and time.monotonic() - released < _RELEASE_MEMORY_S

    def _forget_old_releases(self) -> None:
        cutoff = time.monotonic() - _RELEASE_MEMORY_S
        with self._lock:
            for key in [k for k, t in self._released.items() if t < cutoff]:
                del self._released[key]

    def _current_test(
        self, ref: TestRef, attempt: int, *, completed: bool = False
    ) -> dict[str, Any] | None:
        """The test a Job serves, if that Job is still the test's current, unfinished attempt
        (``completed``: finished ones too)."""
        test = self._test(ref)
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

    def _progress(self, ref: TestRef, attempt: int, job: dict[str, Any]) -> None:
        """Move the test forward as its active Job does: Queued (Kueue has not admitted it),
        Pending (admitted, no pod ready), Running (a runner pod is ready)."""
        job_status, job_spec = job.get("status") or {}, job.get("spec") or {}
        if int(job_status.get("ready") or 0) > 0:
            started = job_status.get("startTime")
            key = (ref.uid, ref.generation, attempt)
            if self._phases.get(key) == (Phase.RUNNING, "PodReady"):
                return  # said already
            if self.settings.running_write_delay_s > 0:
                # Written a moment later, unless the run ends first: then one write says
                # Completed (see flush_running).
                due = time.monotonic() + self.settings.running_write_delay_s
                with self._lock:
                    self._running.setdefault(key, _RunningWrite(due, ref, attempt, started))
                return
            self._set_running(ref, attempt, started)
        elif job_spec.get("suspend"):
            # Not admitted yet, or preempted: Kueue suspends an admitted Job to preempt it (the
            # Job controller deletes its pods; the pod failure policy ignores the runner's stop
            # exit), and it runs again once Kueue resumes it. Either way it waits, as Queued.
            queue = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_QUEUE)
            known = self._phases.get((ref.uid, ref.generation, attempt))
            preempted = known is not None and known[0] in (Phase.PENDING, Phase.RUNNING)
            message = (
                f"suspended by Kueue (preempted); waiting to be admitted again (LocalQueue {queue})"
                if preempted
                else f"waiting for Kueue to admit the Job (LocalQueue {queue})"
            )
            self._set_phase(
                ref, attempt, Phase.QUEUED, "Queued", True, "KueueAdmission", message,
                backwards=True, event=("Normal", "Preempted") if preempted else None,
                keep=_NOT_ADMITTED,  # still waiting: what check_admission said stays said
            )  # fmt: skip
        else:
            self._set_phase(
                ref, attempt, Phase.PENDING, "Queued", False, "Admitted", "the Job is admitted",
                only_from=_WAITING_FOR_ADMISSION,
            )  # fmt: skip

    def _set_running(self, ref: TestRef, attempt: int, started: str | None) -> None:
        self._set_phase(
            ref, attempt, Phase.RUNNING, "Running", True, "PodReady", "a runner pod is ready",
            started=started,
        )  # fmt: skip

    def flush_running(self) -> int:
        """Write the Running phase of runner pods ready for ``running_write_delay_s`` whose run
        has not ended meanwhile; returns how many were written."""
        now_ = time.monotonic()
        with self._lock:
            due = [k for k, w in self._running.items() if w.due <= now_]
            writes = [self._running.pop(k) for k in due]
        for write in writes:
            self._set_running(write.ref, write.attempt, write.started)
        return len(writes)

    def _set_phase(
        self,
        ref: TestRef,
        attempt: int,
        phase: Phase,
        kind: str,
        value: bool,
        reason: str,
        message: str,
        *,
        started: str | None = None,
        only_from: frozenset[tuple[Phase, str]] | None = None,
        backwards: bool = False,
        event: tuple[str, str] | None = None,
        keep: frozenset[tuple[Phase, str]] = frozenset(),
    ) -> None:
        """Set an active test's phase (and one condition) unless it is already there.

        Phases only move forward (Queued -> Pending -> Running) unless ``backwards`` (a pod
        that lost its node goes back to waiting); ``only_from`` restricts the move to phases
        entered for given reasons (leaving Queued for Kueue is not leaving Queued for capacity).
        """
        key = (ref.uid, ref.generation, attempt)
        known = self._phases.get(key)
        if known is not None and (
            known == (phase, reason)
            or (only_from is not None and known not in only_from)
            or (not backwards and PHASE_ORDER[phase] < PHASE_ORDER.get(known[0], 0))
        ):
            return  # nothing to change, by what this operator last set: no request
        if known in keep:
            return
        test = self._current_test(ref, attempt)
        if test is None:
            return
        moved: list[bool] = []

        def build(test: dict[str, Any]) -> dict[str, Any] | None:
            status = TestStatus.read(test.get("status"))
            if (status.attempt or 0) != attempt:
                return None  # superseded by a retry
            current = status.phase
            if (current, status.reason(kind)) == (phase, reason) or current not in PHASE_ORDER:
                self._phases[key] = (phase, reason)
                return None
            if (current, status.reason("Queued")) in keep:
                return None
            if only_from is not None and (current, status.reason("Queued")) not in only_from:
                return None
            if not backwards and PHASE_ORDER[phase] < PHASE_ORDER[current]:
                return None
            conditions = set_condition(
                status.condition_dicts(), kind, value, reason, message, ref.generation
            )
            if phase is Phase.RUNNING:
                conditions = set_condition(
                    conditions, "Queued", False, "Started", "a runner pod is ready", ref.generation
                )
            fields: dict[str, Any] = {
                "phase": phase,
                "conditions": kstatus_conditions(
                    conditions, phase, ref.generation, message=message
                ),
            }
            if phase is Phase.RUNNING:
                fields["startedAt"] = started or now()
            moved.append(True)
            return TestStatus(**fields).patch()

        if self.patch_status(ref, build) is None:
            return
        self._phases[key] = (phase, reason)
        if event is not None and moved:
            self.event(test, event[0], event[1], message)

    def _retry(self, test: dict[str, Any], ref: TestRef, attempt: int, reading: Reading) -> None:
        """Node lost: the same run.py again in a new Job (attempt + 1); bounded by max_attempts."""
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
            _, job = children(
                ref, spec, placement, self.settings, attempt + 1, "", self.delivery_key
            )
            self._create_claim_template(ref, spec, placement)  # in case it was deleted by hand
            self._prepare_delivery(ref, spec, attempt + 1)
        except InvalidTest as exc:
            # The operator's settings changed since the first attempt (e.g. DRA's default LNC
            # removed): no record, since the model did nothing wrong; the message says what to fix.
            self._invalid(test, ref, f"cannot retry after {reading.message}: {exc}")
            return
        job_name = job["metadata"]["name"]
        try:
            self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
            metrics.RETRIES.inc()
        except AlreadyExists:
            log.info("retry Job %s/%s already exists; adopting it", ref.namespace, job_name)
        message = f"{reading.message}; attempt {attempt + 1} in Job {job_name}"

        def build(test: dict[str, Any]) -> dict[str, Any] | None:
            status = TestStatus.read(test.get("status"))
            if (status.attempt or 0) != attempt:
                return None  # another thread (or replica) retried it already
            conditions = set_condition(
                status.condition_dicts(), "JobCreated", True, "NodeLost", message, ref.generation
            )
            return TestStatus(
                phase=Phase.PENDING,
                attempt=attempt + 1,
                jobName=job_name,
                runId=run_id_for(ref.uid, ref.generation, attempt + 1),
                conditions=kstatus_conditions(conditions, Phase.PENDING, ref.generation),
            ).patch()

        self.patch_status(ref, build)
        self._phases[(ref.uid, ref.generation, attempt + 1)] = (Phase.PENDING, "NodeLost")
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
            retry = self._retries.get(run_id)
            if run_id in self._finishing or (retry and time.monotonic() < retry.next_at):
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
        store = self.store_for(spec)
        run_py = self._run_py(ref, test, spec)
        config = read_config(run_py)
        if isinstance(delivered, _NotRead):
            delivered = self._read_delivery(test, run_id)
        found = self._document(ref, reading, config, run_id, delivered)
        if isinstance(found, Unavailable):
            stored = self._stored(store, run_id)
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
        cache = spec.compileCache if spec is not None else None
        declared = self._declared_stack(spec)
        document = trusted_document(
            document,
            config,
            declared_stack=declared,
            cache_location=None if cache is None else (cache.target or cache.source),
            started_at=reading.started_at,
            ended_at=reading.ended_at or ended_at,
            node_instance_type=reading.node_instance_type,
        )
        labels = {
            **self._labels(ref, job_name, attempt),
            **self._provenance(spec),
            "document_source": source.value,
            "stack_reported": ",".join(
                reported_stack_fields(document, declared, reading.node_instance_type)
            ),
        }
        if (test.get("status") or {}).get("podCores"):
            labels["pod_cores"] = str(test["status"]["podCores"])  # the cores the pod held
        record = record_from_document(
            document, run_py, source="operator", labels=labels, run_id=run_id
        )
        try:
            first_time = self.record(spec, record)
            if not first_time:
                # Recorded before (the operator stopped before it wrote the status): the status
                # shows what was recorded then, not what can be read now.
                document = store.get(run_id).document
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
        try:  # the slot (prepared, delivered or not) is done with
            DeliveryArea(store.uri).remove(self._slot(run_id))
        except (DeliveryError, ValueError):
            log.warning("run %s is recorded; its delivery slot goes in a later sweep", run_id)
        with self._lock:  # before the status says Completed: a concurrent resync must not
            self._released[(ref.namespace, job_name)] = time.monotonic()  # release it twice
        if not first_time and self._completed_already(ref):
            self._release_attempts(ref, attempt)
            return True  # what we knew of the test was behind: it is complete, say nothing twice
        self._complete(test, ref, document, run_id)
        self._release_attempts(ref, attempt)
        return True

    def _release_attempts(self, ref: TestRef, attempt: int) -> None:
        """Release the recorded attempt's Job and those of the attempts before it (kept until
        now: the first one owns the generation's run.py, which a retry runs too)."""
        for earlier in range(attempt, 0, -1):
            self._release(ref.namespace, child_name(ref.name, ref.uid, ref.generation, earlier))

    def _fresh_test(self, ref: TestRef) -> dict[str, Any] | None:
        """The test as the API has it now; None when it is gone, replaced or being deleted."""
        fresh = self.kube.get_test(ref.namespace, ref.name)
        if fresh is None or fresh["metadata"].get("uid") != ref.uid:
            self.forget_test(ref.uid)
            return None
        self.observe_test(fresh, "FETCHED")
        return None if being_deleted(fresh) else fresh

    def forget_test(self, uid: str) -> None:
        """Drop a test that no longer exists from what this process keeps."""
        with self._lock:
            self.tests.pop(uid, None)
            for key in [k for k in list(self._phases) if k[0] == uid]:
                del self._phases[key]
            for key in [k for k in list(self._running) if k[0] == uid]:
                del self._running[key]

    def _completed_already(self, ref: TestRef) -> bool:
        """Whether the API (not what we last saw) says this generation is Completed."""
        fresh = self.kube.get_test(ref.namespace, ref.name)
        if fresh is None or fresh["metadata"].get("uid") != ref.uid:
            return True  # gone: nothing to complete
        self.observe_test(fresh, "FETCHED")
        status = TestStatus.read(fresh.get("status"))
        return status.phase is Phase.COMPLETED and status.observedGeneration == ref.generation

    @staticmethod
    def _stored(store: ResultsStore, run_id: str) -> RunRecord | None:
        try:
            return store.get(run_id)
        except RecordNotFound:
            return None
        except Exception:  # the store cannot answer now: as if unread, the retry asks again
            log.warning("could not look up run %s in %s", run_id, store.uri, exc_info=True)
            return None

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

        def build(test: dict[str, Any]) -> dict[str, Any] | None:
            status = TestStatus.read(test.get("status"))
            current = status.condition("Recorded")
            if current is not None and (current.reason, current.status) == (reason, "False"):
                return None  # already said; the condition's message keeps the first occurrence
            conditions = set_condition(
                status.condition_dicts(), "Recorded", False, reason, message, ref.generation
            )
            return TestStatus(conditions=conditions).patch()

        patched = self.patch_status(ref, build)
        if patched is not None:
            test["status"] = patched.get("status") or {}
            self.event(test, "Warning", reason, f"{message}; retrying in {delay:g} s")

    def _run_py(self, ref: TestRef, test: dict[str, Any], spec: TestSpec | None) -> str:
        """The run.py that ran: the ConfigMap's, byte for byte (else rendered again from the spec
        at the commit the status says it was pinned to)."""
        status = TestStatus.read(test.get("status"))
        parallelism = status.parallelism or Parallelism.NONE
        if spec is not None and status.revision:
            spec = spec.model_copy(update={"revision": status.revision})
        if spec is not None and status.cores and status.runScriptSha256:
            # Rendering is deterministic: when this operator renders the same bytes (their hash
            # is in the status), the ConfigMap need not be read.
            rendered = render_script(spec.run_config(status.cores, parallelism))
            if hashlib.sha256(rendered.encode()).hexdigest() == status.runScriptSha256:
                return rendered
        name = child_name(ref.name, ref.uid, ref.generation)
        cm = self.kube.read_configmap(ref.namespace, name)
        if cm is not None:
            return str(cm["data"]["run.py"])
        if spec is None or not status.cores:
            raise RuntimeError(
                f"ConfigMap {ref.namespace}/{name} with the run.py of this run is missing and "
                "the test no longer says how it ran"
            )
        log.warning("ConfigMap %s/%s is gone; recording run.py rendered again", ref.namespace, name)
        return render_script(spec.run_config(status.cores, parallelism))

    def _document(
        self,
        ref: TestRef,
        reading: Reading,
        config: RunConfig,
        run_id: str,
        delivered: bytes | Unavailable | None,
    ) -> tuple[ResultDocument, DocumentSource] | Unavailable:
        """The runner's document: delivered, else from the log, else from the termination
        message; else one the operator writes for the Job's outcome; else Unavailable."""
        problems: list[str] = []
        if job_outcome_stands(reading):
            result, infra_class = INFRA_RESULTS[reading.state]
            said = _delivered_result(delivered)
            overruled = (
                f" (the runner's delivery said {said}, which Kubernetes contradicts)"
                if said
                else ""
            )
            return (
                failure_document(
                    config, result, error_class=infra_class, error=reading.message + overruled
                ),
                DocumentSource.OPERATOR,
            )
        if isinstance(delivered, Unavailable):
            return delivered
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
                    ref.namespace,
                    reading.pod_name,
                    RUNNER_CONTAINER,
                    self.settings.log_tail_lines,
                    self.settings.log_tail_bytes,
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
        coalesced: str | None = None
        with self._lock:
            for key in [k for k in list(self._phases) if k[0] == ref.uid]:
                del self._phases[key]
            for key in [k for k in list(self._running) if k[0] == ref.uid]:
                # The run ended: Completed says it in one write, with the start Running had.
                write = self._running.pop(key)
                if key[1] == ref.generation:
                    coalesced = write.started or coalesced
        summary = document.result.value + (
            f"/{document.error_class.value}" if document.error_class else ""
        )
        timings, memory = document.timings, document.memory
        pod_cores = (test.get("status") or {}).get("podCores")
        used, cost = run_cost(
            test.get("spec") or {}, document, self.settings, int(pod_cores) if pod_cores else None
        )

        def build(test: dict[str, Any]) -> dict[str, Any]:
            conditions = set_condition(
                (test.get("status") or {}).get("conditions"), "Running", False, "Finished",
                "the runner finished", ref.generation,
            )  # fmt: skip
            conditions = set_condition(
                conditions, "Completed", True, _reason(summary),
                _short(document.error) or summary, ref.generation,
            )  # fmt: skip
            conditions = set_condition(
                conditions, "Recorded", True, "Recorded", f"run {run_id} recorded", ref.generation
            )
            started = (test.get("status") or {}).get("startedAt") or coalesced
            return TestStatus(
                phase=Phase.COMPLETED,
                **({"startedAt": started} if started else {}),
                result=document.result,
                errorClass=document.error_class,
                message=_short(document.error) or None,
                runId=run_id,
                wallTimeSeconds=timings.wall_time_s,
                compileSeconds=timings.compile_s,
                decodeTokensPerSecond=timings.decode_tokens_per_s,
                peakDeviceMemoryBytes=memory.peak_device_memory_bytes,
                hostPeakRssBytes=memory.host_peak_rss_bytes,
                coreSeconds=used,
                costUSD=cost,
                finishedAt=now(),
                conditions=kstatus_conditions(
                    conditions,
                    Phase.COMPLETED,
                    ref.generation,
                    result=_reason(summary),
                    message=_short(document.error) or summary,
                ),
            ).patch()

        if self.patch_status(ref, build) is None:
            return  # completed already (another writer), gone, or superseded: nothing to say
        if document.result in (Result.PASS, Result.EXCLUDED):
            return  # said by the status (Ready, result): an Event is an API request per test
        message = f"{summary}: {_short(document.error)}" if document.error else summary
        self.event(test, "Warning", _EVENT_REASON[document.result], message)

    # ---------------------------------------------------------------- the watchdog's checks

    def sweep_deliveries(self) -> int:
        """Remove delivery slots of recorded runs (:func:`recording.sweep_deliveries`)."""
        self.store_for(None)  # the operator's own store, whether or not it recorded yet
        with self._lock:
            stores = list(self._stores.values())
        return sweep_deliveries(stores)

    def watched_namespaces(self) -> list[str | None]:
        """The namespaces to list children in; [None] means every namespace."""
        return list(self.settings.namespaces) if self.settings.namespaces else [None]

    def check_admission(self, now: datetime | None = None) -> int:
        """Say so on tests whose Job Kueue has not admitted within ``kueue_admission_limit_s``
        (no Kueue installed, or no such LocalQueue, leaves a Job suspended forever): condition
        ``Queued`` with reason ``NotAdmitted`` and one Warning Event; the test keeps waiting.
        Works from the tests as watched: no API request unless one is overdue."""
        now = now or datetime.now(UTC)
        flagged = 0
        for test in list(self.tests.values()):
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
            queue = (_spec_or_none(test) or _NoSpec()).queueName
            message = (
                f"Kueue has not admitted the Job for {waited:.0f} s (more than "
                f"kueueAdmissionLimitSeconds, {self.settings.kueue_admission_limit_s:g} s): check "
                f"that Kueue is installed and that LocalQueue {queue} exists in namespace "
                f"{ref.namespace} (kubectl get localqueue -n {ref.namespace} {queue}); the test "
                "keeps waiting"
            )
            self._set_phase(
                ref, status.attempt or 1, Phase.QUEUED, "Queued", True, "NotAdmitted",
                message, only_from=_WAITING_FOR_ADMISSION, event=("Warning", "NotAdmitted"),
            )  # fmt: skip
            flagged += 1
        return flagged

    def check_waiting(self, now: datetime | None = None) -> int:
        """Look at pending runner pods: a pod no node fits makes its test Queued (or ends it,
        past ``unschedulable_limit_s`` when set); an image that cannot be pulled past its limit
        (counted from scheduling) ends the test. Returns the number of tests ended."""
        ended = 0
        for namespace in self.watched_namespaces():
            for pod in self.kube.list_pods(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, phase="Pending"
            ):
                owner = self.job_owner(pod)
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
                    test = self._current_test(ref, attempt)
                    if test is None:
                        continue
                    job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
                    reading = Reading(
                        JobState.INFRASTRUCTURE,
                        f"runner pod {pod['metadata']['name']} {why}",
                        runner_ran=False,  # it is still pending
                    )
                    if self.finish(test, ref, attempt, job_name, reading, final=True):
                        self.kube.delete_job(ref.namespace, job_name)
                        ended += 1
                    continue
                waiting = pod_waiting(pod, now)
                if waiting is not None and waiting.kind is WaitKind.UNSCHEDULABLE:
                    self._set_phase(
                        ref, attempt, Phase.QUEUED, "Queued", True, "Unschedulable",
                        f"waiting for capacity: {waiting.message}", backwards=True,
                        event=("Normal", "WaitingForCapacity"),
                    )  # fmt: skip
                else:
                    self._set_phase(
                        ref, attempt, Phase.PENDING, "Queued", False, "Scheduled",
                        "the runner pod is scheduled", only_from=_WAITING_FOR_CAPACITY,
                    )  # fmt: skip
        return ended

    def resync_jobs(self) -> int:
        """Offer again every runner Job whose result is not recorded yet.

        kopf does not retry event handlers: if the API failed while a Job's end was being read,
        or a recording was deferred, only this brings the test to its end. Lists only Jobs
        without the recorded label (filtered on the server), so its steady load after a sweep
        is one small list per namespace and interval. Idempotent: ``on_job`` ignores tests
        already completed, and moves no phase from a listing (it may be older than the events).
        """
        offered = 0
        self._forget_old_releases()
        for namespace in self.watched_namespaces():
            for job in self.kube.list_jobs(
                namespace, {LABEL_MANAGED_BY: MANAGED_BY}, without=(LABEL_RECORDED,)
            ):
                self.on_job(job, RESYNC)
                offered += 1
        return offered


def _is_document(data: bytes) -> bool:
    try:
        ResultDocument.model_validate_json(data)
    except ValidationError:
        return False
    return True


def _delivered_result(delivered: object) -> str | None:
    """The result a delivery claimed (for saying it was overruled), if it is a document."""
    if not isinstance(delivered, bytes):
        return None
    try:
        return ResultDocument.model_validate_json(delivered).result.value
    except ValidationError:
        return None


def _spec_or_none(test: dict[str, Any]) -> TestSpec | None:
    try:
        return parse_spec(dict(test.get("spec") or {}))
    except SpecError:
        return None  # recorded in the operator's store; the spec was valid when the Job was made


def _reason(summary: str) -> str:
    """A condition reason from a result summary (PASS, ERROR/out-of-memory -> ERROR_out_of_memory)."""
    return summary.replace("/", "_").replace("-", "_")


def _newer(body: dict[str, Any], known: dict[str, Any] | None) -> bool:
    """Whether ``body`` is at least as recent as ``known`` (by resourceVersion when numeric)."""
    if known is None:
        return True
    new_rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
    old_rv = str((known.get("metadata") or {}).get("resourceVersion") or "")
    if new_rv.isdigit() and old_rv.isdigit():
        return int(new_rv) >= int(old_rv)
    return True  # resourceVersions are opaque: the latest seen wins


def _ended_at(job: dict[str, Any]) -> datetime | None:
    """When a Job finished (see :func:`model_support.operator.outcome.job_ended_at`)."""
    return job_ended_at(job)
