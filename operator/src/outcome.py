"""Reading a runner Job's end: the result document, or the infrastructure outcome instead.

Pure functions over Job and Pod objects (plain dicts as the API returns them), so each rule is
tested on its own and the handlers stay small.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from model_support.config import RunConfig
from model_support.operator.manifests import INSTANCE_TYPE_LABEL
from model_support.operator.resource import ANNOTATION_TIMEOUT, RUNNER_CONTAINER
from model_support.operator.settings import RunnerStack
from model_support.records import ResultDocument
from model_support.runner_pod import STOPPED_MESSAGE
from model_support.stop_signals import STOPPED_EXIT
from model_support.vocabulary import Backend, ErrorClass, Result

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
# Reasons a pod (or its condition DisruptionTarget) gives when the node under it went away.
NODE_LOSS_REASONS = frozenset(
    {
        "NodeLost",
        "NodeShutdown",
        "Terminated",
        "DeletionByTaintManager",
        "TerminationByKubelet",
        "DeletionByPodGC",
    }
)


class JobState(StrEnum):
    """Where a runner Job stands, as far as the test is concerned."""

    ACTIVE = "active"  # still pending or running
    SUCCEEDED = "succeeded"  # run.py exited 0: read its document
    FAILED = "failed"  # run.py exited non-zero: its document (if any) says why
    TIMEOUT = "timeout"  # activeDeadlineSeconds passed
    OUT_OF_MEMORY = "out-of-memory"  # the runner container was OOM-killed
    NODE_LOST = "node-lost"  # the node went away: worth another attempt
    INFRASTRUCTURE = "infrastructure"  # failed for a reason of the cluster, not of the model
    STORAGE = "storage"  # evicted for using more local storage than the pod was sized for
    WAITED = "waited"  # the backstop deadline passed while run.py had not run its timeout


@dataclass(frozen=True)
class Reading:
    """A classified Job: its state, a human message, and the runner container's exit details."""

    state: JobState
    message: str
    exit_code: int | None = None
    termination_message: str | None = None
    pod_name: str | None = None
    runner_ran: bool | None = None
    """Whether the runner container started (None: unknown, no pod is left to tell)."""
    started_at: datetime | None = None
    """When the Job started (its startTime, else its creation), as Kubernetes says."""
    ended_at: datetime | None = None
    """When the Job ended (completionTime, else its terminal condition), as Kubernetes says."""
    deadline_passed: bool = False
    """The Job reached its backstop deadline (``DeadlineExceeded``): the Job controller ended
    it, whatever its state says the time went to."""
    node_instance_types: frozenset[str] | None = None
    """The instance types the runner pod could be placed on: the values of the
    ``node.kubernetes.io/instance-type`` label its nodeSelector and required node affinity (its
    Job's template's) allowed, which the scheduler enforced (None: any, a CPU test's pod for
    instance)."""


def allowed_instance_types(pod_spec: dict[str, Any]) -> frozenset[str] | None:
    """The instance types a pod spec lets the scheduler place it on (the
    ``node.kubernetes.io/instance-type`` values its nodeSelector and its required node
    affinity admit; None: any). Node selector terms are alternatives, a term's expressions
    all hold (the Kubernetes API reference's NodeSelector); a term without an ``In`` on the
    label admits any type."""
    allowed: frozenset[str] | None = None
    selected = (pod_spec.get("nodeSelector") or {}).get(INSTANCE_TYPE_LABEL)
    if selected is not None:
        allowed = frozenset({selected})
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    admitted: set[str] | None = set() if terms else None
    for term in terms:
        values: frozenset[str] | None = None
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == INSTANCE_TYPE_LABEL and expression.get("operator") == "In":
                these = frozenset(expression.get("values") or [])
                values = these if values is None else values & these
        if values is None:
            admitted = None  # this term admits every instance type
            break
        assert admitted is not None
        admitted |= values
    if admitted is not None:
        allowed = frozenset(admitted) if allowed is None else allowed & admitted
    return allowed


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _runner_status(pod: dict[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == RUNNER_CONTAINER:
            return dict(status)
    return {}


def latest_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod that decided a Job's end: a pod that succeeded; else the latest one the Job's
    pod failure policy did not ignore (the Job replaced disrupted pods and containers stopped
    from outside, exit 143) and whose runner ran; else simply the latest. A Job now holds
    several pods (a pod refused at admission, or one whose init step failed, is started again
    in the same Job), and creation times have a one-second grain: a replacement made within the
    same second as its predecessor is still told apart by what it did."""
    if not pods:
        return None
    return max(
        pods,
        key=lambda p: (
            (p.get("status") or {}).get("phase") == "Succeeded",
            _condition(p, "DisruptionTarget") is None,
            ((_runner_status(p).get("state") or {}).get("terminated") or {}).get("exitCode")
            != STOPPED_EXIT,
            _runner_started(_runner_status(p)),
            (p.get("metadata") or {}).get("creationTimestamp") or "",
        ),
    )


ADMISSION_REASONS = ("UnexpectedAdmissionError", "OutOf")
"""How the kubelet says it refused a pod at admission (pkg/kubelet/lifecycle: a device plugin
that could not allocate, ``OutOf<resource>`` when the node's resources do not fit): the node's
doing, never the model's."""


def _refused_at_admission(pod: dict[str, Any]) -> bool:
    reason = str((pod.get("status") or {}).get("reason") or "")
    return reason == ADMISSION_REASONS[0] or reason.startswith(ADMISSION_REASONS[1])


def _failed_init_container(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") not in (None, 0):
            return {"name": status.get("name"), **terminated}
    return None


def read_job(job: dict[str, Any], pods: list[dict[str, Any]]) -> Reading:
    """Classify a runner Job and its pods.

    Disruptions never get here as failures: the Job's podFailurePolicy ignores pods with a
    ``DisruptionTarget`` condition (the Job controller starts a replacement), and fails the Job
    at once on any container's non-zero exit code. Out-of-memory comes only from the runner
    container's own ``OOMKilled`` reason, never from an exit status.
    """
    pod = latest_pod(pods)
    pod_name = (pod.get("metadata") or {}).get("name") if pod else None
    runner = _runner_status(pod) if pod else {}
    terminated = (runner.get("state") or {}).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    term_message = terminated.get("message")
    runner_ran = None if pod is None else _runner_started(runner)
    job_status = job.get("status") or {}
    started_at = _parse_time(job_status.get("startTime")) or _parse_time(
        (job.get("metadata") or {}).get("creationTimestamp")
    )
    ended_at = job_ended_at(job)

    # What the scheduler placed the pod by: its own spec, else its Job's template's (which a
    # pod is made from; Kueue sets a flavor's labels there before the Job starts).
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    node_instance_types = allowed_instance_types((pod or {}).get("spec") or template)

    def reading(state: JobState, message: str) -> Reading:
        return Reading(
            state,
            message,
            exit_code,
            term_message,
            pod_name,
            runner_ran,
            started_at,
            ended_at,
            node_instance_types=node_instance_types,
        )

    if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
        return reading(JobState.SUCCEEDED, "the runner finished")
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed is None:
        return reading(JobState.ACTIVE, "the runner has not finished")
    reason = failed.get("reason") or ""
    if reason == "DeadlineExceeded":
        state, message = _deadline(job, pod, failed)
        return dataclasses.replace(reading(state, message), deadline_passed=True)
    if terminated.get("reason") == "OOMKilled":
        return reading(
            JobState.OUT_OF_MEMORY,
            "the runner container was OOM-killed (host memory limit reached)",
        )
    if pod is None:
        # The pod is gone without a trace: the usual sign of a node that disappeared.
        return reading(
            JobState.NODE_LOST, f"the runner pod vanished ({reason or 'no reason given'})"
        )
    init = _failed_init_container(pod)
    if init is not None:
        detail = (init.get("message") or "").strip()[-500:]
        return reading(
            JobState.INFRASTRUCTURE,
            f"init container {init['name']} exited with status {init['exitCode']} before "
            f"run.py started{': ' + detail if detail else ''}",
        )
    pod_status = pod.get("status") or {}
    storage = storage_eviction(pod)
    if storage is not None:
        return reading(JobState.STORAGE, storage)
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None or pod_status.get("reason") in NODE_LOSS_REASONS:
        why = (disruption or {}).get("reason") or pod_status.get("reason")
        return reading(JobState.NODE_LOST, f"the runner pod was disrupted ({why})")
    if _refused_at_admission(pod):
        return reading(
            JobState.NODE_LOST,
            f"the kubelet refused the runner pod at admission ({pod_status.get('reason')}: "
            f"{pod_status.get('message') or 'no message'}), {reason or 'the Job failed'}",
        )
    if pod_status.get("reason") == "Evicted":
        return reading(
            JobState.NODE_LOST,
            f"the runner pod was evicted: {pod_status.get('message') or ''}".strip(),
        )
    if not terminated:
        return reading(
            JobState.INFRASTRUCTURE, f"the Job failed ({reason}) before the runner container ran"
        )
    if term_message == STOPPED_MESSAGE:
        # SIGTERM from outside without a DisruptionTarget condition (a pod deleted by hand, a
        # node shut down): a disruption all the same, worth another attempt.
        return reading(JobState.NODE_LOST, "the runner was stopped from outside its pod")
    return reading(JobState.FAILED, f"run.py exited with status {exit_code}")


_STORAGE_EVICTION = ("ephemeral local storage", "local ephemeral storage", "emptydir volume")
"""What the kubelet's eviction messages for local storage limits say (pkg/kubelet/eviction: a
pod or container over its ephemeral-storage limit, an emptyDir over its sizeLimit). A node low
on ephemeral-storage is node pressure instead: that eviction carries DisruptionTarget."""


def storage_eviction(pod: dict[str, Any]) -> str | None:
    """Why a pod evicted for local storage was (with its storage sizing), or None.

    These evictions carry no ``DisruptionTarget`` condition, and retrying with the same limits
    would end the same way: they are the pod's sizing, said with the numbers.
    """
    status = pod.get("status") or {}
    message = str(status.get("message") or "")
    if (
        status.get("reason") != "Evicted"
        or _condition(pod, "DisruptionTarget") is not None
        or not any(word in message.lower() for word in _STORAGE_EVICTION)
    ):
        return None
    spec = pod.get("spec") or {}
    limits = [
        f"{volume['name']} {volume['emptyDir']['sizeLimit']}"
        for volume in spec.get("volumes") or []
        if "emptyDir" in volume
        and (volume["emptyDir"] or {}).get("sizeLimit")
        and (volume["emptyDir"] or {}).get("medium") != "Memory"
    ]
    requested = next(
        (
            ((c.get("resources") or {}).get("requests") or {}).get("ephemeral-storage")
            for c in spec.get("containers") or []
            if c.get("name") == RUNNER_CONTAINER
        ),
        None,
    )
    sizing = f"emptyDir sizeLimits {', '.join(limits) or 'none'}" + (
        f", ephemeral-storage request {requested}" if requested else ""
    )
    return (
        f"the runner pod was evicted for local storage: {message.strip()} (the pod was sized "
        f"{sizing}); not retried with the same limits: raise the operator's workHeadroomGiB, "
        "tmpSizeGiB or neffCacheSizeGiB, and check the node's ephemeral storage"
    )


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _runner_started(status: dict[str, Any]) -> bool:
    """Whether the runner container ever started (running now, or terminated once)."""
    state, last = status.get("state") or {}, status.get("lastState") or {}
    return bool(state.get("running") or state.get("terminated") or last.get("terminated"))


def job_ended_at(job: dict[str, Any]) -> datetime | None:
    """When a Job finished: its completionTime, else its terminal condition's transition."""
    status = job.get("status") or {}
    stamps = [status.get("completionTime")] + [
        c.get("lastTransitionTime")
        for c in status.get("conditions") or []
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
    ]
    for stamp in stamps:
        if stamp:
            return _parse_time(stamp)
    return None


def job_outcome_stands(reading: Reading) -> bool:
    """Whether what Kubernetes says of a Job decides its result whatever a pod delivered.

    A delivery is a pod's claim about its own run, written by code the project does not
    control: it cannot undo a deadline the Job ran past (TIMEOUT, or ERROR/infrastructure when
    the time went to waiting), an out-of-memory kill of the runner container, or a runner that
    never started (a failed init step, an image never pulled).
    """
    return (
        reading.deadline_passed
        or reading.state in (JobState.TIMEOUT, JobState.OUT_OF_MEMORY)
        or (reading.state is JobState.INFRASTRUCTURE and reading.runner_ran is False)
    )


def _deadline(
    job: dict[str, Any], pod: dict[str, Any] | None, failed: dict[str, Any]
) -> tuple[JobState, str]:
    """A Job that reached its backstop deadline (``activeDeadlineSeconds``).

    That deadline counts from the Job's ``startTime``, waiting and pulling included, and a pod
    the Job controller starts in place of an evicted one does not reset it (only a resume after
    a suspension does: kubernetes pkg/controller/job/job_controller.go, ``syncJob`` and
    ``pastActiveDeadline``). The test's own timeout is the runner's, from run.py's start (it
    delivers TIMEOUT itself). So the backstop is TIMEOUT only when run.py demonstrably ran at
    least the test's timeout (the runner failed to stop it); otherwise the time went to waiting
    or to a pod replaced late: WAITED, no verdict (another attempt), saying for what.
    """
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    timeout = annotations.get(ANNOTATION_TIMEOUT)
    what = f"the Job's backstop deadline ({deadline} s, activeDeadlineSeconds)"
    runner = _runner_status(pod) if pod else {}
    state = runner.get("state") or {}
    ran = state.get("terminated") or state.get("running") or {}
    started = _parse_time(ran.get("startedAt"))
    if pod is None:
        return (
            JobState.WAITED,
            f"{what} passed with no runner pod (none was created, or none is left): no verdict "
            "on the model",
        )
    if started is None:
        return (
            JobState.WAITED,
            f"{what} passed before run.py started: the pod was {_waited_for(pod)}",
        )
    ended = _parse_time(ran.get("finishedAt")) or _parse_time(failed.get("lastTransitionTime"))
    ran_s = ((ended or datetime.now(UTC)) - started).total_seconds()
    if timeout is not None and ran_s >= float(timeout):
        return (
            JobState.TIMEOUT,
            f"run.py ran {ran_s:.0f} s, past the test's timeout of {timeout} s, and {what} "
            "ended it",
        )
    return (
        JobState.WAITED,
        f"{what} passed after run.py had run only {ran_s:.0f} s of its {timeout or '?'} s "
        "timeout: the rest went to waiting for a node, the image or the init steps, or to a pod "
        "replaced in the same Job (a replacement does not restart the Job's clock); no verdict "
        "on the model",
    )


def _waited_for(pod: dict[str, Any]) -> str:
    """What a runner pod that never ran run.py was waiting for, in words."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"never scheduled ({cond.get('reason') or 'Unschedulable'}: {cond.get('message') or 'no node fits'})"
    for container in status.get("initContainerStatuses") or []:
        state = container.get("state") or {}
        if "terminated" not in state or (state["terminated"] or {}).get("exitCode") != 0:
            waiting = state.get("waiting") or {}
            doing = waiting.get("reason") or ("running" if "running" in state else "waiting")
            return f"in its init step {container.get('name')} ({doing})"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"waiting to start container {container.get('name')} ({waiting.get('reason')}{detail})"
    return "scheduled but its runner container never started"


class WaitKind(StrEnum):
    """Why a runner pod has not started yet."""

    UNSCHEDULABLE = "Unschedulable"  # no node fits (capacity): the test is Queued
    IMAGE_PULL = "ImagePullFailing"  # scheduled, but its image cannot be pulled


@dataclass(frozen=True)
class Waiting:
    """A pending runner pod that is waiting for something, since when, and what it says."""

    kind: WaitKind
    since: datetime
    message: str


class PullFailures:
    """When each pending pod's image pull was first seen failing, by this process.

    A pod's status says that a pull fails (``ErrImagePull``, ``ImagePullBackOff``) but not
    since when, and a large image can pull for many minutes before it fails once: the image
    pull limit counts from the first failure seen, never from scheduling. A pull that is no
    longer failing starts over. The first failure seen is never earlier than the real one (an
    operator that restarts counts anew), so a limit is never cut short. At most ``capacity``
    pods are remembered (the oldest forgotten first).
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._first: collections.OrderedDict[str, datetime] = collections.OrderedDict()
        self._lock = threading.Lock()

    def since(self, key: str, failing: bool, now: datetime) -> datetime | None:
        """The first time ``key`` (a pod's container) was seen failing to pull, noting
        ``now`` when this is the first; None (and forgotten) when it is not failing."""
        with self._lock:
            if not failing:
                self._first.pop(key, None)
                return None
            first = self._first.setdefault(key, now)
            while len(self._first) > self.capacity:
                self._first.popitem(last=False)
            return first


def pod_waiting(pod: dict[str, Any], now: datetime | None, pulls: PullFailures) -> Waiting | None:
    """What a pending runner pod waits for (None: it is not pending, or simply starting).

    A failing image pull is dated by ``pulls`` (the watchdog's, :class:`PullFailures`): from
    the first time it was seen failing."""
    now = now or datetime.now(UTC)
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    created = _parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or now
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled":
            continue
        since = _parse_time(cond.get("lastTransitionTime")) or created
        if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return Waiting(WaitKind.UNSCHEDULABLE, since, cond.get("message") or "no node fits")
    meta = pod.get("metadata") or {}
    pod_key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
    found: Waiting | None = None
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        failing = waiting.get("reason") in IMAGE_PULL_REASONS
        # Counted from the first failure seen (a healthy pull of a large image is not one).
        first = pulls.since(f"{pod_key}/{container.get('name')}", failing, now)
        if first is not None and found is None:
            found = Waiting(
                WaitKind.IMAGE_PULL,
                first,
                f"{waiting['reason']}, container {container.get('name')}"
                + (f": {waiting['message']}" if waiting.get("message") else ""),
            )
    return found


def stuck_reason(
    pod: dict[str, Any],
    *,
    now: datetime | None = None,
    unschedulable_limit_s: float | None,
    image_pull_limit_s: float,
    pulls: PullFailures,
) -> str | None:
    """Why a pending runner pod will never start (past the limits), or None while it may.

    An unschedulable pod is stuck only when ``unschedulable_limit_s`` is set: by default a test
    waits for capacity as long as it takes (shown as the Queued phase). A failing image pull
    is stuck ``image_pull_limit_s`` after its first failure seen (``pulls``, see
    :class:`PullFailures`).
    """
    now = now or datetime.now(UTC)
    waiting = pod_waiting(pod, now, pulls)
    if waiting is None:
        return None
    waited = (now - waiting.since).total_seconds()
    if waiting.kind is WaitKind.UNSCHEDULABLE:
        if unschedulable_limit_s is not None and waited >= unschedulable_limit_s:
            return f"unschedulable for more than {unschedulable_limit_s:g} s: {waiting.message}"
        return None
    if waited >= image_pull_limit_s:
        return f"image pull failing for more than {image_pull_limit_s:g} s ({waiting.message})"
    return None


INFRA_RESULTS: dict[JobState, tuple[Result, ErrorClass | None]] = {
    JobState.TIMEOUT: (Result.TIMEOUT, None),
    JobState.OUT_OF_MEMORY: (Result.ERROR, ErrorClass.OUT_OF_MEMORY),
    JobState.NODE_LOST: (Result.ERROR, ErrorClass.INFRASTRUCTURE),
    JobState.INFRASTRUCTURE: (Result.ERROR, ErrorClass.INFRASTRUCTURE),
    JobState.STORAGE: (Result.ERROR, ErrorClass.INFRASTRUCTURE),
    # Retried, never recorded as such; here so that a Job gone before its retry (recorded
    # from what is left) is the cluster's error, not the model's.
    JobState.WAITED: (Result.ERROR, ErrorClass.INFRASTRUCTURE),
}
"""The result recorded for a Job that ended without a result document of its own."""


class DocumentSource(StrEnum):
    """Where the recorded result document came from (kept in the record's labels)."""

    DELIVERY = "delivery"  # the runner delivered it to the store (the normal case)
    LOG = "log"  # the marked last line of the runner's log
    TERMINATION_MESSAGE = "termination-message"  # compact copy in the pod's status
    OPERATOR = "operator"  # none was readable: the operator wrote one for the Job's outcome


def identity_problems(document: ResultDocument, config: RunConfig) -> list[str]:
    """Where ``document`` contradicts the test's config (empty when it agrees)."""
    asked: dict[str, Any] = {
        "model": config.model,
        "revision": config.revision,
        "task": config.task.value,
        "cores": config.cores,
        "parallelism": config.parallelism.value,
        "dtype": config.dtype,
    }
    if config.compile_backend is not None:  # None: run.py records the backend it chose
        asked["compile_backend"] = config.compile_backend
    said = document.model_dump(mode="json")
    problems = [
        f"{field} is {said.get(field)!r}, the test asked for {value!r}"
        for field, value in asked.items()
        if said.get(field) != value
    ]
    # The device backend is the test's profile's (and the node's it was placed on): a pod
    # that names another one would file the row under hardware it never ran on.
    if config.backend is not Backend.AUTO and document.backend not in (None, config.backend.value):
        problems.append(
            f"backend is {document.backend!r}, and the test's profile runs on "
            f"{config.backend.value!r}"
        )
    return problems


def node_problems(
    document: ResultDocument, node_instance_types: frozenset[str] | None
) -> list[str]:
    """Where the document contradicts the nodes its pod could be placed on (empty: agrees, or
    any node could take it)."""
    said = document.stack.instance_type
    if node_instance_types is None or said is None or said in node_instance_types:
        return []
    where = " or ".join(repr(kind) for kind in sorted(node_instance_types))
    return [
        f"instance_type is {said!r}, and the pod could only be placed on a {where} node "
        f"(label {INSTANCE_TYPE_LABEL})"
    ]


def _single(types: frozenset[str] | None) -> str | None:
    return next(iter(types)) if types is not None and len(types) == 1 else None


def reported_stack_fields(
    document: ResultDocument,
    declared: RunnerStack | None,
    node_instance_types: frozenset[str] | None,
) -> list[str]:
    """The stack fields a record holds only on its runner pod's word: every one with a value,
    less those the image declares (``declared``) and the instance type when the scheduler
    allowed only one (among several allowed, which one ran is the pod's word, checked only to
    be one of them). The record's label ``stack_reported`` lists them."""
    checked = set((declared or RunnerStack()).model_dump(exclude_none=True))
    if _single(node_instance_types) is not None:
        checked.add("instance_type")
    values = document.stack.model_dump(exclude_none=True)
    return sorted(field for field in values if field not in checked and field != "origin")


def _public(version: str) -> str:
    """A version without its local part (neuronx-cc reports a build hash after ``+``)."""
    return version.split("+", 1)[0]


def stack_problems(document: ResultDocument, declared: RunnerStack) -> list[str]:
    """Where the stack ``document`` reports contradicts what its image declares (empty: agrees;
    a version the pod did not report is no contradiction)."""
    said = document.stack.model_dump()
    return [
        f"{field} {said[field]}, the image declares {value}"
        for field, value in declared.model_dump(exclude_none=True).items()
        if said[field] is not None and _public(said[field]) != _public(value)
    ]


def trusted_document(
    document: ResultDocument,
    config: RunConfig,
    *,
    declared_stack: RunnerStack | None = None,
    cache_location: str | None = None,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
    node_instance_types: frozenset[str] | None = None,
) -> ResultDocument:
    """The document to record: the runner's when it agrees with the test, else an ERROR that
    says where it disagrees (what a pod printed never names what was tested).

    What the operator knows better than the pod replaces what the pod said: the compile cache
    location is the test's (``cache_location``; a pod's figures without one are dropped), and
    the document's times lie within the Job's (``started_at`` .. ``ended_at``, else now), so a
    pod cannot date its run into the future to stay the "latest" row.

    ``declared_stack`` (a test on the configured runner image) names the compiler and library
    versions recorded, so the (compiler, library) pair a row lands in is the image's, never the
    pod's say. A pod reporting other versions is an ERROR of the infrastructure rather than a
    row kept with the pod's versions: a user of the dataset reads a row under a pair as "this
    model on these versions", which such a pod (tampered with, or an image mislabelled in the
    settings) says nothing about; the versions it reported are in the error text.

    The device backend is the test's profile's, and the instance type one of those the pod
    could be placed on (``node_instance_types``): a document naming others is an ERROR; one
    naming none gets the backend, and the instance type when only one was allowed.
    """
    problems = identity_problems(document, config) + node_problems(document, node_instance_types)
    mismatch = [] if declared_stack is None else stack_problems(document, declared_stack)
    disagreement = None
    if problems:
        disagreement = (
            "the runner's result document disagrees with the test ("
            + "; ".join(problems)
            + f"), so its {document.result.value} is not recorded as this model's result: "
            "check the runner image and what else runs in the pod"
        )
    elif mismatch:
        disagreement = (
            "the runner image reports a different stack than the operator's settings declare "
            "for it (" + "; ".join(mismatch) + f"), so its {document.result.value} is not "
            "recorded as this model's result on the declared stack: fix the settings' "
            "runnerStack or the runner image"
        )
    if disagreement is not None:
        from model_support.records import failure_document

        document = failure_document(
            config, Result.ERROR, error_class=ErrorClass.INFRASTRUCTURE, error=disagreement
        )
    latest = ended_at or datetime.now(UTC)
    earliest = started_at if started_at is not None and started_at <= latest else None

    def clamp(when: datetime | None) -> datetime | None:
        if when is None:
            return None
        when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        if earliest is not None and when < earliest:
            return earliest
        return min(when, latest)

    update: dict[str, Any] = {
        "started_at": clamp(document.started_at),
        "finished_at": clamp(document.finished_at),
    }
    if config.backend is not Backend.AUTO:
        update["backend"] = config.backend.value
    known = declared_stack.model_dump(exclude_none=True) if declared_stack is not None else {}
    if _single(node_instance_types) is not None:
        known["instance_type"] = _single(node_instance_types)
    if known:
        update["stack"] = document.stack.model_copy(update=known)
    figures = document.compile_cache
    if figures is not None:
        from model_support.compile_cache.compilers import PREFIX_PATTERN
        from model_support.compile_cache.target import redact

        if cache_location is None:
            update["compile_cache"] = None
        else:
            prefix = figures.prefix if PREFIX_PATTERN.fullmatch(figures.prefix) else ""
            update["compile_cache"] = figures.model_copy(
                update={"target": redact(cache_location), "prefix": prefix}
            )
    return document.model_copy(update=update)
