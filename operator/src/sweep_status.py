"""The ModelSupportSweep's status as a typed model, and its conditions (kstatus's, with Ready
and Progressing). The CRD's status schema is generated from it (crd.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.operator.openapi import Int64, Timestamp
from model_support.operator.status import CONDITIONS_LIST, Condition, Conditioned, set_condition
from model_support.operator.sweep_spec import MAX_SWEEP_MODELS, SkippedModel, SweepModel
from model_support.vocabulary import MAX_CONFIRMING_RERUNS

# ----------------------------------------------------------------------------- status

MAX_LISTED_REGRESSIONS = 100
"""A sweep's status names at most this many regressions (the count is always whole)."""
MAX_RUNS_LISTED = 1 + MAX_CONFIRMING_RERUNS
"""A model's runs under one run key: its test's, then each re-run's."""
MAX_LISTED_SKIPPED = 100
"""A sweep's status names at most this many skipped models (the count is always whole)."""


class SweepCounts(BaseModel):
    """How the sweep's models stand (the printer columns read these)."""

    model_config = ConfigDict(extra="forbid")

    models: int = Field(0, description="Models in the current ranking.")
    queued: int = Field(
        0,
        description="Ranked models waiting for a slot (no test yet, or one of an earlier run key).",
    )
    running: int = Field(
        0,
        description="Tests not finished, ranked, retained or re-runs confirming a regression "
        "(at most maxRunning).",
    )
    done: int = Field(0, description="Ranked models finished under the current run key.")
    passed: int = 0
    failed: int = 0
    errored: int = 0
    timedOut: int = 0
    excluded: int = 0
    unverified: int = 0
    invalid: int = Field(0, description="Tests that cannot run as written (phase Invalid).")
    skipped: int = Field(
        0,
        description="Ranked models with no test: the API server would refuse it "
        "(ranking.skipped says which and why).",
    )
    retained: int = Field(0, description="Tests of models that left the ranking, kept as they are.")
    regressions: int = Field(
        0,
        description="Models whose result got worse than under the previous run key (PASS to "
        "FAIL, ERROR or TIMEOUT; EXCLUDED to ERROR), confirmed: every re-run "
        "(spec.confirm.reruns) gave the same result.",
    )
    confirming: int = Field(
        0, description="Worse results waiting for their re-runs before they count (or not)."
    )
    flaky: int = Field(
        0,
        description="Models whose runs under the current run key disagree (a worse result a "
        "re-run did not repeat): neither a regression nor a fix.",
    )
    fixes: int = Field(
        0, description="Models that did not pass under the previous run key and now pass."
    )


class SweepBaseline(BaseModel):
    """The results of the previous run key, what this run's results are compared with."""

    model_config = ConfigDict(extra="forbid")

    runKey: str
    results: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_SWEEP_MODELS,
        description="Model id -> its result under that run key.",
    )


class SweepRegression(BaseModel):
    """One model whose result got worse than under the previous run key, in every run."""

    model_config = ConfigDict(extra="forbid")

    model: str
    before: str
    after: str
    runs: list[str] = Field(
        default_factory=list,
        max_length=MAX_RUNS_LISTED,
        description="The run ids that agree on it: the test's run, then each re-run's.",
    )


class SweepFlaky(BaseModel):
    """One model whose runs under the current run key disagree: a worse result that a re-run
    did not repeat. Neither a regression nor a fix."""

    model_config = ConfigDict(extra="forbid")

    model: str
    before: str = Field(..., description="Its result under the previous run key.")
    results: list[str] = Field(
        default_factory=list,
        max_length=MAX_RUNS_LISTED,
        description="Each run's result: the test's first, then each finished re-run's "
        "(Invalid: a re-run that could not run).",
    )
    runs: list[str] = Field(
        default_factory=list, max_length=MAX_RUNS_LISTED, description="Their run ids, in order."
    )


class SweepCost(BaseModel):
    """What the current run key's finished tests cost so far (docs/pricing.md)."""

    model_config = ConfigDict(extra="forbid")

    coreHours: float = Field(0.0, ge=0)
    usd: float | None = Field(None, ge=0, description="Null when no finished test has a price.")
    unpriced: int = Field(
        0, ge=0, description="Finished tests without a price (no instance price)."
    )


class RankingState(BaseModel):
    """The ranking the sweep works from."""

    model_config = ConfigDict(extra="forbid")

    source: str
    sourceKey: str
    fetchedAt: Timestamp
    models: list[SweepModel] = Field(default_factory=list, max_length=MAX_SWEEP_MODELS)
    skipped: list[SkippedModel] = Field(
        default_factory=list,
        max_length=MAX_LISTED_SKIPPED,
        description="Ranked models the sweep makes no test of, because the API server would "
        f"refuse their tests (e.g. a Hub id the model pattern refuses), and why; the first "
        f"{MAX_LISTED_SKIPPED}.",
    )
    skippedCount: int = Field(0, ge=0, description="How many ranked models were skipped.")
    snapshot: str | None = Field(None, description="Where the snapshot is in the results store.")


class SweepStatus(Conditioned):
    """status of a ModelSupportSweep (see crds/modelsupportsweeps.yaml)."""

    model_config = ConfigDict(extra="forbid")

    observedGeneration: Int64 | None = Field(None, ge=0)
    runKey: str | None = Field(
        None,
        description="Hash of the epoch and the stack: tests made under another key are run again.",
    )
    epoch: Int64 | None = None
    source: str | None = Field(None, description="The source in a few words.")
    lastRankedAt: Timestamp | None = None
    ranking: RankingState | None = Field(
        None,
        description="The ranking the sweep works from (also stored with the dataset under "
        "rankings/snapshots/).",
    )
    counts: SweepCounts = Field(default_factory=SweepCounts)
    baseline: SweepBaseline | None = Field(
        None, description="The previous run key's results, what this run is compared with."
    )
    regressions: list[SweepRegression] = Field(
        default_factory=list,
        max_length=MAX_LISTED_REGRESSIONS,
        description=f"The models whose result got worse, confirmed by every re-run (at most "
        f"{MAX_LISTED_REGRESSIONS} listed; counts.regressions has them all).",
    )
    flaky: list[SweepFlaky] = Field(
        default_factory=list,
        max_length=MAX_LISTED_REGRESSIONS,
        description=f"The models whose runs disagree, with their runs (at most "
        f"{MAX_LISTED_REGRESSIONS} listed; counts.flaky has them all).",
    )
    regressionsReported: str | None = Field(
        None, description="The run key whose regressions an Event has reported (one per run)."
    )
    cost: SweepCost = Field(
        default_factory=SweepCost,
        description="What the current run's finished tests cost so far (docs/pricing.md).",
    )
    message: str | None = Field(None, max_length=4096)
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)

    @classmethod
    def read(cls, status: dict[str, Any] | None) -> SweepStatus:
        """Parse a status read from the API; a part that does not parse is dropped (it is
        written again from the sweep's state)."""
        known = {k: v for k, v in (status or {}).items() if k in cls.model_fields}
        try:
            return cls.model_validate(known)
        except ValidationError:
            ranking = known.pop("ranking", None)
            try:
                parsed = cls.model_validate({k: v for k, v in known.items() if k != "counts"})
            except ValidationError:
                parsed = cls()
            try:
                parsed.ranking = RankingState.model_validate(ranking) if ranking else None
            except ValidationError:
                parsed.ranking = None
            return parsed

    def patch(self, *, ranking: bool = True) -> dict[str, Any]:
        """The whole status as a merge patch: an unset field of an object is null (removed
        from what is stored); inside a list (which a merge patch replaces whole) it is left
        out, since the schema has no nullable fields. ``ranking`` False: the ranking is left
        out (a merge patch without it leaves the stored one as it is)."""
        dumped = self.model_dump(mode="json", exclude=None if ranking else {"ranking"})
        return dict(without_nulls_in_lists(dumped))


def without_nulls_in_lists(value: Any, in_list: bool = False) -> Any:
    """``value`` (a status as JSON) without the null fields of objects inside lists: a merge
    patch replaces a list whole, and stores its objects' nulls, which no schema here allows."""
    if isinstance(value, dict):
        return {
            k: without_nulls_in_lists(v, in_list)
            for k, v in value.items()
            if not (in_list and v is None)
        }
    if isinstance(value, list):
        return [without_nulls_in_lists(v, True) for v in value]
    return value


SweepState = Literal["done", "testing", "ranking", "invalid"]


def sweep_conditions(
    previous: list[dict[str, Any]] | None, state: SweepState, generation: int, message: str
) -> list[dict[str, Any]]:
    """Ready and Progressing, plus kstatus's Reconciling and Stalled, for ``state``."""
    ready = state == "done"
    reason = {"done": "Done", "testing": "Testing", "ranking": "Ranking", "invalid": "InvalidSpec"}[
        state
    ]
    progressing = state in ("testing", "ranking")
    conditions = set_condition(previous, "Ready", ready, reason, message, generation)
    conditions = set_condition(conditions, "Progressing", progressing, reason, message, generation)
    conditions = set_condition(conditions, "Reconciling", progressing, reason, message, generation)
    return set_condition(
        conditions, "Stalled", state == "invalid", reason, message if state == "invalid" else
        "not stalled", generation,
    )  # fmt: skip
