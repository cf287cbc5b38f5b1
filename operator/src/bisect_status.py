"""The ModelSupportBisect's status as a typed model, and its conditions (kstatus's, with Ready).
The CRD's status schema is generated from it (crd.py).

The status is the bisect's record of itself: the plan it works from (the two rows, the
suspects and the versions their index lists), every step taken (its environment, test, run,
result and verdict), and at the end the first bad version of each culprit with the command that
reproduces it, and the report (``model-support bisect``'s Markdown).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.bisect import BisectReport, Plan, Side, Step, Suspect
from model_support.operator.openapi import Int64
from model_support.operator.status import CONDITIONS_LIST, Condition, Conditioned, set_condition
from model_support.operator.sweep_status import without_nulls_in_lists

MAX_STEPS = 128
"""Steps a status lists: each suspect alone, then a binary search of each (at most 64 run)."""
MAX_VERSIONS = 2000
"""Versions a suspect's index may list between its good and bad one."""
REPORT_LIMIT = 32768
"""The report is cut to this many characters (the steps and the conclusion come first)."""

BisectPhase = Literal["Planning", "Bisecting", "Done", "Failed", "Invalid"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BisectSide(_Model):
    """One of the two rows."""

    runId: str
    stack: str
    result: str

    def side(self) -> Side:
        """The search's side (its packages are not kept: the search needs none)."""
        return Side(run_id=self.runId, stack=self.stack, result=self.result, packages={})


class BisectSuspect(_Model):
    """A package whose version differs between the rows, and the versions in between."""

    name: str
    good: str
    bad: str
    versions: list[str] = Field(
        default_factory=list,
        max_length=MAX_VERSIONS,
        description="good, every version the index lists between them, bad: oldest first.",
    )


class BisectPlanState(_Model):
    """What the search works from (kept so that it is planned once per generation)."""

    good: BisectSide
    bad: BisectSide
    suspects: list[BisectSuspect] = Field(default_factory=list, max_length=20)
    added: list[str] = Field(default_factory=list, description="Only the bad row has them.")
    removed: list[str] = Field(default_factory=list, description="Only the good row has them.")
    runScriptSha256: str = Field(..., description="sha256 of the run.py every step runs.")

    @classmethod
    def of(cls, plan: Plan, sha256: str) -> BisectPlanState:
        """The state of a plan (its packages and run.py aside)."""
        return cls(
            good=_side(plan.good),
            bad=_side(plan.bad),
            suspects=[BisectSuspect(**s.model_dump()) for s in plan.suspects],
            added=plan.added,
            removed=plan.removed,
            runScriptSha256=sha256,
        )

    def plan(self, model_id: str, task: str, run_py: str) -> Plan:
        """The plan the search takes (its rows' packages are not kept: it needs none)."""
        return Plan(
            model_id=model_id,
            task=task,
            run_py=run_py,
            good=self.good.side(),
            bad=self.bad.side(),
            suspects=[Suspect(**s.model_dump()) for s in self.suspects],
            added=self.added,
            removed=self.removed,
        )


def _side(side: Side) -> BisectSide:
    return BisectSide(runId=side.run_id, stack=side.stack, result=side.result)


class BisectStep(_Model):
    """One environment tried."""

    package: str
    version: str
    pins: dict[str, str] = Field(
        default_factory=dict, description="Every suspect's version in this step."
    )
    purpose: str
    test: str | None = Field(None, description="The ModelSupportTest that runs it (not reused).")
    runId: str | None = None
    result: str | None = Field(None, description="Null while its test runs.")
    verdict: Literal["good", "bad"] | None = None
    reused: bool = Field(False, description="An earlier run of the same environment, not run.")

    @classmethod
    def of(cls, step: Step, test: str | None) -> BisectStep:
        """A step of the search, run by ``test`` (None: reused)."""
        return cls(
            package=step.package,
            version=step.version,
            pins=step.pins,
            purpose=step.purpose,
            test=None if step.reused else test,
            runId=step.run_id,
            result=step.result,
            verdict=step.verdict,
            reused=step.reused,
        )


class BisectCulprit(_Model):
    """A package that breaks the model alone, and its first bad version."""

    package: str
    lastGood: str
    firstBad: str
    result: str = Field(..., description="The first bad version's result.")
    runId: str | None = None
    reproduce: str | None = Field(None, description="The command that reruns that run.")


class BisectStatus(Conditioned):
    """status of a ModelSupportBisect (see crds/modelsupportbisects.yaml)."""

    model_config = ConfigDict(extra="forbid")

    observedGeneration: Int64 | None = Field(None, ge=0)
    phase: BisectPhase | None = None
    plan: BisectPlanState | None = None
    steps: list[BisectStep] = Field(default_factory=list, max_length=MAX_STEPS)
    stepsStore: str | None = Field(None, description="Where the steps are recorded.")
    culprits: list[BisectCulprit] = Field(default_factory=list, max_length=20)
    innocent: list[str] = Field(
        default_factory=list, description="Suspects that do not break the model alone."
    )
    firstBad: str | None = Field(
        None, description="The first bad version(s), as 'package version' (printer column)."
    )
    report: str | None = Field(
        None,
        max_length=REPORT_LIMIT,
        description="The bisect as model-support bisect prints it (Markdown).",
    )
    message: str | None = Field(None, max_length=4096)
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)

    @classmethod
    def read(cls, status: dict[str, Any] | None) -> BisectStatus:
        """Parse a status read from the API; one that does not parse starts over (it is
        written again from the stores and the step tests)."""
        known = {k: v for k, v in (status or {}).items() if k in cls.model_fields}
        try:
            return cls.model_validate(known)
        except ValidationError:
            return cls()

    def patch(self) -> dict[str, Any]:
        """The whole status as a merge patch: an unset field of an object is null (removed
        from what is stored); inside a list it is left out."""
        return dict(without_nulls_in_lists(self.model_dump(mode="json")))

    def concluded(self, report: BisectReport) -> None:
        """Take the finished bisect's conclusion."""
        ran = [c.run_id for c in report.conclusion.culprits if c.run_id is not None]
        commands = dict(zip(ran, report.reproduce, strict=True))
        self.culprits = [
            BisectCulprit(
                package=c.package,
                lastGood=c.last_good,
                firstBad=c.first_bad,
                result=c.result,
                runId=c.run_id,
                reproduce=commands.get(c.run_id) if c.run_id else None,
            )
            for c in report.conclusion.culprits
        ]
        self.innocent = list(report.conclusion.innocent)
        self.firstBad = ", ".join(f"{c.package} {c.first_bad}" for c in report.conclusion.culprits)
        self.firstBad = self.firstBad or None


def bisect_conditions(
    previous: list[dict[str, Any]] | None, phase: BisectPhase, generation: int, message: str
) -> list[dict[str, Any]]:
    """Ready (Done), Reconciling (Planning, Bisecting) and Stalled (Failed, Invalid)."""
    reason = {
        "Planning": "Planning", "Bisecting": "Bisecting", "Done": "Done", "Failed": "Failed",
        "Invalid": "InvalidSpec",
    }[phase]  # fmt: skip
    working = phase in ("Planning", "Bisecting")
    stalled = phase in ("Failed", "Invalid")
    conditions = set_condition(previous, "Ready", phase == "Done", reason, message, generation)
    conditions = set_condition(conditions, "Reconciling", working, reason, message, generation)
    return set_condition(
        conditions, "Stalled", stalled, reason, message if stalled else "not stalled", generation
    )


__all__ = [
    "BisectCulprit",
    "BisectPhase",
    "BisectPlanState",
    "BisectSide",
    "BisectStatus",
    "BisectStep",
    "BisectSuspect",
    "bisect_conditions",
]
