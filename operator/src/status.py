"""The ModelSupportTest status as a typed model, and the patches that write it.

Every status the operator writes goes through :class:`TestStatus`, which a test checks against
the CRD's status schema. Two rules live here, so no handler has to remember them:

* a write is one :class:`StatusPatch`: the fields it sets, and for the first write of a
  generation (``new_generation``) every field of the previous run (result, timings, finish
  time, the Completed condition ...) set to null;
* status is kstatus-compatible: whenever a patch sets the phase, the ``Ready``, ``Reconciling``
  and ``Stalled`` conditions are derived from it, so ``kubectl wait --for=condition=Ready``,
  Flux and Argo CD see an active test as in progress, a finished one (whatever its result) as
  ready, and an Invalid one as stalled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.config import JsonDict

from model_support.operator.openapi import Int64, Timestamp
from model_support.vocabulary import ErrorClass, ExclusionReason, Parallelism, Result

MESSAGE_LIMIT = 2000
log = logging.getLogger(__name__)

CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class Phase(StrEnum):
    """Where a test stands."""

    PENDING = "Pending"  # its Job exists; no runner pod is ready yet
    QUEUED = "Queued"  # waiting for Kueue admission or for capacity (no node fits yet)
    RUNNING = "Running"  # a runner pod is ready
    COMPLETED = "Completed"  # a result is recorded (PASS, FAIL, ERROR, TIMEOUT or EXCLUDED)
    INVALID = "Invalid"  # the spec cannot be run as written; nothing was recorded


ACTIVE_PHASES = frozenset({Phase.PENDING, Phase.QUEUED, Phase.RUNNING})
PHASE_ORDER = {Phase.QUEUED: 0, Phase.PENDING: 1, Phase.RUNNING: 2}
"""How active phases move forward (only a lost pod moves a test back)."""


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Condition(BaseModel):
    """A metav1.Condition."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(..., min_length=1, max_length=316, pattern=CONDITION_TYPE_PATTERN)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(..., min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    message: str = Field(..., max_length=32768)
    lastTransitionTime: Timestamp
    observedGeneration: Int64 | None = Field(None, ge=0)


CONDITIONS_LIST: JsonDict = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
"""Conditions are a map keyed by type (server-side apply merges them by type)."""


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
        previous["lastTransitionTime"] if previous and previous.get("status") == value else now()
    )
    condition = Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message[:MESSAGE_LIMIT],
        lastTransitionTime=since,
        observedGeneration=generation,
    )
    result.append(condition.model_dump(exclude_none=True))
    return result


def kstatus_conditions(
    conditions: list[dict[str, Any]] | None,
    phase: Phase,
    generation: int,
    *,
    result: str | None = None,
    message: str = "",
) -> list[dict[str, Any]]:
    """``Ready`` / ``Reconciling`` / ``Stalled`` as kstatus reads them, for ``phase``."""
    if phase is Phase.COMPLETED:
        conditions = set_condition(
            conditions, "Ready", True, result or "Completed", message or "recorded", generation
        )
        conditions = set_condition(
            conditions, "Reconciling", False, "Completed", "recorded", generation
        )
        return set_condition(conditions, "Stalled", False, "Completed", "recorded", generation)
    if phase is Phase.INVALID:
        conditions = set_condition(conditions, "Ready", False, "InvalidSpec", message, generation)
        conditions = set_condition(
            conditions, "Reconciling", False, "InvalidSpec", message, generation
        )
        return set_condition(conditions, "Stalled", True, "InvalidSpec", message, generation)
    conditions = set_condition(
        conditions, "Ready", False, phase.value, message or f"the test is {phase.value}", generation
    )
    conditions = set_condition(
        conditions, "Reconciling", True, phase.value, message or "running the test", generation
    )
    return set_condition(conditions, "Stalled", False, phase.value, "not stalled", generation)


class Conditioned(BaseModel):
    """A status with conditions (a test's, a sweep's): typed access to them. Each subclass
    declares its own ``conditions`` field, where its schema wants it."""

    if TYPE_CHECKING:
        conditions: list[Condition]

    def condition(self, kind: str) -> Condition | None:
        """The condition of type ``kind``, if the status has one."""
        return next((c for c in self.conditions if c.type == kind), None)

    def reason(self, kind: str) -> str | None:
        """The reason of the condition of type ``kind`` (None without one)."""
        found = self.condition(kind)
        return found.reason if found is not None else None

    def is_true(self, kind: str) -> bool:
        """Whether the condition of type ``kind`` is there with status True."""
        found = self.condition(kind)
        return found is not None and found.status == "True"

    def condition_dicts(self) -> list[dict[str, Any]]:
        """The conditions as written (what :func:`set_condition` takes)."""
        return [c.model_dump(exclude_none=True) for c in self.conditions]


class TestStatus(Conditioned):
    """status of a ModelSupportTest; the CRD's status schema is generated from it (crd.py)."""

    __test__ = False  # not a pytest class, despite the name
    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    phase: Phase | None = Field(
        None,
        description="Pending (Job created, no pod ready), Queued (waiting for Kueue admission "
        "or capacity), Running (a runner pod is ready), Completed (result recorded), Invalid "
        "(cannot run as written).",
    )
    observedGeneration: Int64 | None = Field(None, ge=0)
    result: Result | None = None
    errorClass: ErrorClass | None = None
    exclusionReason: ExclusionReason | None = None
    message: str | None = Field(None, max_length=4096)
    cores: int | None = Field(
        None, ge=1, description="NeuronCores the model runs on (run.py's workers)."
    )
    podCores: int | None = Field(
        None,
        ge=1,
        description="NeuronCores the runner pod holds: every core of the fewest devices the "
        "scheduler can place together (1, 4, 8 or 16 devices on torus instances), at least "
        "cores.",
    )
    parallelism: Parallelism | None = None
    attempt: int | None = Field(None, ge=0)
    hostMemoryBytes: Int64 | None = Field(None, ge=0)
    checkpointBytes: Int64 | None = Field(
        None,
        ge=0,
        description="Size of the model's weights as stored (sized into the runner pod's storage).",
    )
    jobName: str | None = None
    configMapName: str | None = Field(
        None,
        description="The program ConfigMap the runner made run.py from (the namespace's).",
    )
    runId: str | None = None
    runScriptSha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the run.py that ran, byte for byte (the runner runs no other).",
    )
    revision: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{40}$",
        description="The Hub commit the test's run.py loads: spec.revision (a branch, a tag, "
        "or none for main) as it stood when the test was sized. Absent for a local checkpoint.",
    )
    wallTimeSeconds: float | None = None
    compileSeconds: float | None = None
    decodeTokensPerSecond: float | None = None
    peakDeviceMemoryBytes: Int64 | None = None
    hostPeakRssBytes: Int64 | None = None
    coreSeconds: float | None = Field(
        None,
        ge=0,
        description="Cores x the seconds the runner held them, compile included (docs/pricing.md).",
    )
    costUSD: float | None = Field(
        None,
        ge=0,
        description="coreSeconds at the price of the test's instance (settings.instancePrices "
        "over the default table).",
    )
    startedAt: Timestamp | None = None
    finishedAt: Timestamp | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)

    @classmethod
    def read(cls, status: dict[str, Any] | None) -> TestStatus:
        """Parse a status read from the API. Fields another writer added are ignored; a field
        that does not parse (a hand edit, an older writer) is read as absent and logged: the
        operator writes it again rather than stop on a test it cannot read."""
        known = {k: v for k, v in (status or {}).items() if k in cls.model_fields}
        while True:
            try:
                return cls.model_validate(known)
            except ValidationError as exc:
                bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]} & known.keys()
                if not bad:
                    raise
                log.warning("status fields %s do not parse; read as absent: %s", sorted(bad), exc)
                known = {k: v for k, v in known.items() if k not in bad}

    def patch(self) -> dict[str, Any]:
        """A merge patch with the fields set on this model (None: remove the field)."""
        return dict(self.model_dump(mode="json", exclude_unset=True))


@dataclass(frozen=True)
class StatusPatch:
    """One write of a test's status, typed: the fields set on ``status`` are written (one set
    to None is removed), the others are left as they are; with ``new_generation`` (the first
    write of a generation) every other field of the previous run is removed too (conditions
    are replaced whole either way: a merge patch replaces a list)."""

    status: TestStatus
    new_generation: bool = False

    def body(self) -> dict[str, Any]:
        """The JSON merge patch of the status subresource."""
        written = self.status.patch()
        if not self.new_generation:
            return written
        return {**dict.fromkeys(TestStatus.model_fields), **written}

    def applied_to(self, status: TestStatus) -> TestStatus:
        """The status the API server stores once this patch is merged into ``status``."""
        merged = {} if self.new_generation else status.model_dump(mode="json", exclude_none=True)
        merged.update(self.body())
        return TestStatus.read({k: v for k, v in merged.items() if v is not None})


__all__ = [
    "ACTIVE_PHASES",
    "PHASE_ORDER",
    "Condition",
    "Conditioned",
    "Phase",
    "StatusPatch",
    "TestStatus",
    "kstatus_conditions",
    "now",
    "set_condition",
]
