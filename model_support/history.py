"""Answers from the history of every run: a model's runs across stacks and time, the stacks in
order, and what changed between two of them (regressions, slowdowns, fixes).

Everything here is pandas over the store's history (``history/runs.parquet``, every run with
the columns of :data:`model_support.dataset.HISTORY_COLUMNS`), so the CLI (``model-support
history`` / ``regressions``), the viewer and the benchmarks use the same functions. A stack is
one matrix file's (compiler, compiler version, library, library version); a model's result on
a stack is its latest run there, chosen exactly as the matrix chooses it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field

from model_support.dataset import NEURON_COMPILER
from model_support.markdown import inline_code
from model_support.pricing import PriceTable
from model_support.records import divergence_where
from model_support.vocabulary import (
    CONFIRMING_RERUNS,
    MAX_CONFIRMING_RERUNS,
    Result,
    is_fix,
    is_regression,
)

if TYPE_CHECKING:
    from model_support.store import ResultsStore

STACK_COLUMNS = ("compiler", "compiler_version", "library", "library_version")
SLOT = ("model_id", "task")
STACK_ORDER_COLUMNS = (*STACK_COLUMNS, "run_id", "started_at", "finished_at", "recorded_at")
"""What ordering the stacks reads (a few columns of every run)."""
DIVERGENCE_COLUMNS = (
    "first_divergence", "first_divergence_kind", "first_divergence_phase", "first_divergence_step",
    "first_divergence_ratio",
)  # fmt: skip
"""Where a FAIL starts: its first diverging module, its class, where it was found, its error
ratio."""
COMPARED_COLUMNS = (
    *SLOT, *STACK_COLUMNS, "result", "error_class", "failed_checks", "run_id", "instance_type",
    "resolved_revision",
    "lnc", "core_seconds", "decode_tokens_per_s", "compile_time_s", "compile_cache_hit",
    "peak_device_memory_bytes", *DIVERGENCE_COLUMNS, "finished_at", "recorded_at",
)  # fmt: skip
"""What comparing two stacks reads of each run."""
SIDE_COLUMNS = (
    "result", "error_class", "failed_checks", "run_id", "core_seconds", "cost_usd",
    "decode_tokens_per_s", "compile_time_s", "peak_device_memory_bytes", *DIVERGENCE_COLUMNS,
)  # fmt: skip
"""What a reported change says of each side."""


def reproduce_command(run_id: str, results: str | None = None) -> str:
    """The command line that runs a recorded test again, exactly as it ran (its record read
    from ``results`` when given, else from the default results location)."""
    command = f"model-support reproduce {shlex.quote(run_id)}"
    return command if results is None else f"{command} --results {shlex.quote(results)}"


# ---------------------------------------------------------------------------------------------
# Stacks


@dataclass(frozen=True)
class Stack:
    """One (compiler, compiler version, library, library version): a matrix file's key."""

    compiler: str | None
    compiler_version: str | None
    library: str | None
    library_version: str | None

    @property
    def compiler_label(self) -> str:
        return f"{self.compiler or 'unknown'} {self.compiler_version or 'unknown'}"

    @property
    def label(self) -> str:
        """E.g. ``neuronx-cc 2.28.7631.0 · transformers 5.24.0``."""
        return f"{self.compiler_label} · {self.library or 'unknown'} {self.library_version or 'unknown'}"

    def names(self) -> set[str]:
        """Every way a user may name this stack: its label, ``compiler version``, the compiler
        version alone, the compiler alone, and ``compiler version/library version``."""
        forms = {self.label, self.compiler_label, f"{self.compiler_label}/{self.library_version}"}
        forms |= {v for v in (self.compiler, self.compiler_version) if v}
        return forms

    def matches(self, frame: pd.DataFrame) -> pd.Series:
        """Which rows of ``frame`` belong to this stack."""
        mask = pd.Series(True, index=frame.index)
        for column in STACK_COLUMNS:
            value = getattr(self, column)
            values = frame[column].astype("object")
            mask &= values.isna() if value is None else values == value
        return mask


@dataclass(frozen=True)
class StackInfo:
    """A stack with what orders it: when it first had a result, and how many runs it has."""

    stack: Stack
    first_seen: pd.Timestamp | None
    runs: int


def _version_key(version: str | None) -> tuple[int, Version | str]:
    if version is None:
        return (0, "")
    try:
        return (2, Version(version))
    except InvalidVersion:
        return (1, version)


def _when(frame: pd.DataFrame) -> pd.Series:
    """Each run's time as the matrix orders runs: finished_at, else recorded_at."""
    return frame["finished_at"].fillna(frame["recorded_at"])


def stacks(history: pd.DataFrame | pa.Table) -> list[StackInfo]:
    """The stacks with results, oldest first: by compiler version, then library version
    (PEP 440 order where they parse), then by when each first had a result (a set of
    torch.compile backends at one torch version is ordered by when each was first tested)."""
    table = (
        history
        if isinstance(history, pa.Table)
        else pa.Table.from_pandas(history[list(STACK_ORDER_COLUMNS)], preserve_index=False)
    )
    if table.num_rows == 0:
        return []
    when = pc.coalesce(table["started_at"], table["finished_at"], table["recorded_at"])
    grouped = (
        table.select(list(STACK_COLUMNS))
        .append_column("first", when)
        .append_column("run", table["run_id"])
        .group_by(list(STACK_COLUMNS), use_threads=False)
        .aggregate([("first", "min"), ("run", "count")])
    )
    infos = [
        StackInfo(
            stack=Stack(*(row[c] for c in STACK_COLUMNS)),
            first_seen=None if row["first_min"] is None else pd.Timestamp(row["first_min"]),
            runs=int(row["run_count"]),
        )
        for row in grouped.to_pylist()
    ]
    oldest = pd.Timestamp.min.tz_localize("UTC")
    return sorted(
        infos,
        key=lambda i: (
            _version_key(i.stack.compiler_version),
            _version_key(i.stack.library_version),
            i.first_seen if i.first_seen is not None else oldest,
            i.stack.label,
        ),
    )


class StackNotFound(LookupError):
    """A stack name that names no stack, or more than one."""


def find_stack(name: str, known: Sequence[StackInfo]) -> Stack:
    """The stack ``name`` names (see :meth:`Stack.names`); raises :class:`StackNotFound`
    listing the stacks when it names none or several."""
    matches = [i.stack for i in known if name in i.stack.names()]
    listing = "; ".join(i.stack.label for i in known) or "(none: the store has no results)"
    if not matches:
        raise StackNotFound(f"no stack is named {name!r}; the stacks are: {listing}")
    if len(matches) > 1:
        found = "; ".join(s.label for s in matches)
        raise StackNotFound(f"{name!r} names {len(matches)} stacks ({found}): give the full label")
    return matches[0]


def default_pair(known: Sequence[StackInfo]) -> tuple[Stack, Stack]:
    """The two newest stacks (older, newer); raises :class:`StackNotFound` with fewer than two."""
    if len(known) < 2:
        raise StackNotFound(
            f"comparing needs results on two stacks; this store has {len(known)}"
            + (f" ({known[0].stack.label})" if known else "")
        )
    return known[-2].stack, known[-1].stack


# ---------------------------------------------------------------------------------------------
# Cost


def with_cost(frame: pd.DataFrame, prices: PriceTable) -> pd.DataFrame:
    """``frame`` with ``cost_usd``: core_seconds priced by the run's instance type and LNC
    (null where the table has no price for it, or the run recorded no times; a run off Neuron
    is never priced as the table's default instance)."""
    if frame.empty:
        return frame.assign(cost_usd=pd.Series(dtype="Float64"))
    instance = frame["instance_type"].astype("object")
    lnc = frame["lnc"].astype("object")
    # A run off Neuron is priced only by its own instance, never as the default Trainium one.
    neuron = (frame["compiler"].astype("object") == NEURON_COMPILER).tolist()
    rates: dict[tuple[Any, Any, bool], float | None] = {}
    keys = list(
        zip(
            instance.where(instance.notna(), None),
            lnc.where(lnc.notna(), None),
            neuron,
            strict=True,
        )
    )
    for key in set(keys):
        rates[key] = prices.core_hour_usd(key[0], None if key[1] is None else int(key[1]), key[2])
    rate = pd.Series([rates[k] for k in keys], index=frame.index, dtype="Float64")
    return frame.assign(cost_usd=frame["core_seconds"].astype("Float64") / 3600 * rate)


# ---------------------------------------------------------------------------------------------
# History of one model


def latest_per_slot(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task) the latest run, as the matrix picks it (finished_at, else
    recorded_at; then run id)."""
    if frame.empty:
        return frame
    ordered = frame.assign(_when=_when(frame)).sort_values(["_when", "run_id"], kind="stable")
    return ordered.drop_duplicates(list(SLOT), keep="last").drop(columns="_when")


def read_history(
    store: ResultsStore, model_id: str | None = None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """The store's history, or one model's runs (only the row groups that can hold it)."""
    filters = [("model_id", "==", model_id)] if model_id is not None else None
    return store.history(columns=list(columns) if columns else None, filters=filters)


def read_stacks(store: ResultsStore) -> list[StackInfo]:
    """The store's stacks, oldest first (reads only the columns that order them)."""
    return stacks(store.history_table(columns=list(STACK_ORDER_COLUMNS)))


def read_stack_runs(store: ResultsStore, chosen: Sequence[Stack]) -> pd.DataFrame:
    """Every run on the ``chosen`` stacks (filtered while reading: the rows of other stacks
    are never turned into pandas)."""
    expression = None
    for stack in chosen:
        one = None
        for column in STACK_COLUMNS:
            value = getattr(stack, column)
            term = pc.field(column).is_null() if value is None else pc.field(column) == value
            one = term if one is None else one & term
        expression = one if expression is None else expression | one
    return store.history(columns=list(COMPARED_COLUMNS), filters=expression)


def model_history(
    history: pd.DataFrame, model_id: str, task: str | None, prices: PriceTable
) -> pd.DataFrame:
    """Every run of ``model_id`` (of ``task``), oldest first, with its stack's label, the
    change from the previous run on the same stack (``flip``), and its cost."""
    runs = history[history["model_id"] == model_id]
    if task:
        runs = runs[runs["task"] == task]
    if runs.empty:
        return runs.assign(stack_label=pd.Series(dtype="string"), flip=pd.Series(dtype="string"))
    runs = with_cost(runs, prices)
    labels = {
        info.stack: info.stack.label
        for info in stacks(runs)  # few stacks per model
    }
    stack_of = [
        Stack(*(None if pd.isna(v) else str(v) for v in values))
        for values in runs[list(STACK_COLUMNS)].itertuples(index=False, name=None)
    ]
    runs = runs.assign(stack_label=[labels[s] for s in stack_of], _when=_when(runs))
    runs = runs.sort_values(["_when", "run_id"], kind="stable")
    flips = []
    previous: dict[tuple[str, str], pd.Series] = {}
    for _, row in runs.iterrows():
        key = (str(row["stack_label"]), str(row["task"]))
        before = previous.get(key)
        flips.append(_flip(before, row))
        previous[key] = row
    return runs.assign(flip=pd.Series(flips, index=runs.index, dtype="string")).drop(
        columns="_when"
    )


def _outcome(row: Mapping[str, Any]) -> str:
    result = str(row["result"])
    if result == Result.ERROR.value and isinstance(row.get("error_class"), str):
        return f"{result}/{row['error_class']}"
    return result


def _flip(before: pd.Series | None, row: pd.Series) -> str | None:
    """How a run differs from the previous run of the same model and task on the same stack:
    its outcome flipped, and/or the Hub revision it ran moved."""
    if before is None:
        return None
    notes = []
    if _outcome(before) != _outcome(row):
        notes.append(f"{_outcome(before)} -> {_outcome(row)}")
    old, new = before.get("resolved_revision"), row.get("resolved_revision")
    if isinstance(old, str) and isinstance(new, str) and old != new:
        notes.append(f"revision {old[:12]} -> {new[:12]}")
    return "; ".join(notes) or None


# ---------------------------------------------------------------------------------------------
# Regressions between two stacks


class Threshold(BaseModel):
    """How far a figure may move before it counts, and why that far."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(..., ge=0, description="The fraction of the older figure, e.g. 0.10.")
    reason: str = Field(..., min_length=1, description="Why this bound.")


class Thresholds(BaseModel):
    """The bounds of the performance comparisons (fractions of the older stack's figure)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decode_drop: Threshold = Threshold(
        value=0.10,
        reason="decode throughput of one compiled model varies by a few percent between "
        "runs on one stack (host load, clocks); a drop beyond 10% is more than that noise",
    )
    compile_growth: Threshold = Threshold(
        value=0.25,
        reason="compile time follows host load and the compile cache; a quarter more is "
        "beyond run-to-run noise (runs that hit the cache on one side only are not compared)",
    )
    memory_growth: Threshold = Threshold(
        value=0.05,
        reason="peak device memory of one graph is nearly deterministic; 5% leaves room for "
        "allocator rounding and a different sharding of small buffers",
    )

    def with_values(
        self,
        reason: str,
        *,
        decode_drop: float | None = None,
        compile_growth: float | None = None,
        memory_growth: float | None = None,
    ) -> Thresholds:
        """These thresholds with the given values replaced, each carrying ``reason``."""
        update = {
            name: Threshold(value=value, reason=reason)
            for name, value in (
                ("decode_drop", decode_drop),
                ("compile_growth", compile_growth),
                ("memory_growth", memory_growth),
            )
            if value is not None
        }
        return self.model_copy(update=update)


class Confirmation(BaseModel):
    """How much evidence a change needs before it is reported: a worse result must be seen
    again, and a figure must move past the spread of repeated samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reruns: int = Field(
        CONFIRMING_RERUNS,
        ge=0,
        le=MAX_CONFIRMING_RERUNS,
        description="Re-runs a worse result needs, on the newer stack, before it is reported "
        "as a regression (all agreeing: 1 + reruns runs).",
    )
    min_samples: int = Field(
        3,
        ge=2,
        le=100,
        description="PASS runs each stack needs before its speed, compile time or peak memory "
        "is compared (one sample never makes a speed regression).",
    )
    reason: str = Field(
        "a compiler bug reproduces on every run, a flaky failure does not: two more runs that "
        "agree leave about one chance in a hundred that a failure seen one time in ten is "
        "taken for a regression; three samples a side give each side a median and a spread",
        min_length=1,
        description="Why these numbers (printed with the report).",
    )

    @property
    def runs_needed(self) -> int:
        """Runs on the newer stack that must agree before a worse result is a regression."""
        return 1 + self.reruns


ChangeKind = Literal["regression", "slower", "compile-time", "memory", "fix"]


class RunOutcome(BaseModel):
    """One run of a flaky model: when, with what result."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    result: str
    finished_at: str | None = None


class Flaky(BaseModel):
    """A model whose runs on one stack disagree: never a regression or a fix."""

    model_config = ConfigDict(extra="forbid")

    model: str
    task: str
    stack: str
    runs: list[RunOutcome]

    @property
    def outcomes(self) -> str:
        """E.g. ``FAIL, PASS, PASS`` (oldest first)."""
        return ", ".join(r.result for r in self.runs)


class Evidence(BaseModel):
    """What a bug report says of one run: where it failed and how to run it again."""

    model_config = ConfigDict(extra="forbid")

    stack: dict[str, str] = Field(
        default_factory=dict,
        description="The run's stack: compiler, library, torch, torch-neuronx, instance.",
    )
    failed_checks: list[str] = Field(
        default_factory=list, description="A FAIL's failed checks with their figures and bounds."
    )
    first_divergence: str | None = Field(
        None,
        description="A FAIL: the first diverging module, where it was found (the prefill, a decode step), its class and its error ratio.",
    )
    error_class: str | None = None
    error_lines: list[str] = Field(
        default_factory=list, description="An ERROR: the first lines of its message."
    )
    container: str | None = Field(
        None,
        description="A Neuron run: the docker command that reruns it in the row's own image "
        "with the devices it needs.",
    )


class Change(BaseModel):
    """One model whose outcome or figures moved between the two stacks."""

    model_config = ConfigDict(extra="forbid")

    kind: ChangeKind
    group: str = Field(
        ..., description="The error class, the verdict's failed checks, or the figure."
    )
    model: str
    task: str
    before: str
    after: str
    detail: str | None = None
    before_run_id: str
    after_run_id: str
    reproduce: str = Field(..., description="Runs the newer stack's test again.")
    core_seconds_after: float | None = None
    cost_usd_after: float | None = None
    runs_before: int = Field(1, description="Runs of the model on the older stack (agreeing).")
    runs_after: int = Field(1, description="Runs of the model on the newer stack (agreeing).")
    needs: str | None = Field(
        None, description="An unconfirmed change: what it still needs before it is reported."
    )
    before_evidence: Evidence | None = None
    after_evidence: Evidence | None = None


class Report(BaseModel):
    """What changed from one stack to another."""

    model_config = ConfigDict(extra="forbid")

    before: str
    after: str
    compared: int = Field(..., description="(model, task) pairs with a result on both stacks.")
    thresholds: Thresholds
    confirmation: Confirmation = Field(default_factory=Confirmation)
    regressions: list[Change] = Field(
        default_factory=list, description="Confirmed: seen on enough runs or samples."
    )
    fixes: list[Change] = Field(default_factory=list)
    unconfirmed: list[Change] = Field(
        default_factory=list,
        description="Worse results not yet re-run enough, and figures with too few samples: "
        "not reported as regressions until confirmed.",
    )
    flaky: list[Flaky] = Field(
        default_factory=list,
        description="Models whose runs on one of the two stacks disagree (never a regression "
        "or a fix).",
    )
    not_tested_after: list[str] = Field(
        default_factory=list,
        description="'model · task' with a result on the older stack only (not tested after).",
    )
    not_tested_before: list[str] = Field(
        default_factory=list,
        description="'model · task' with a result on the newer stack only (not tested before).",
    )
    core_seconds_after: float = 0.0
    cost_usd_after: float | None = None

    def groups(self, changes: Iterable[Change]) -> dict[str, list[Change]]:
        """``changes`` by group, largest groups first."""
        grouped: dict[str, list[Change]] = {}
        for change in changes:
            grouped.setdefault(change.group, []).append(change)
        return dict(sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def _strings(value: object) -> list[str]:
    if value is None or isinstance(value, float):
        return []
    return [str(v) for v in value]  # type: ignore[attr-defined]


def _group_of(row: Mapping[str, Any]) -> str:
    """What a bad outcome is grouped by: the error class, or the verdict's failed checks."""
    result = str(row["result"])
    if result == Result.ERROR.value:
        return (
            f"ERROR {row['error_class'] if isinstance(row['error_class'], str) else '(no class)'}"
        )
    if result == Result.FAIL.value:
        checks = _strings(row.get("failed_checks"))
        return f"FAIL {', '.join(checks)}" if checks else "FAIL"
    return result


def divergence_line(row: Mapping[str, Any]) -> str | None:
    """Where a FAIL starts, from a history or matrix row, as the record's summary says it:
    "first diverging module, from decode step 18: model.layers.0.mlp.act_fn (SiLUActivation),
    error ratio 125"; None where the run names no module."""
    module = row.get("first_divergence")
    if not isinstance(module, str) or not module:
        return None
    where = divergence_where(row.get("first_divergence_phase"), row.get("first_divergence_step"))
    kind = row.get("first_divergence_kind")
    ratio = _number(row.get("first_divergence_ratio"))
    return (
        f"first diverging module{', ' + where if where else ''}: {module}"
        + (f" ({kind})" if isinstance(kind, str) and kind else "")
        + (f", error ratio {ratio:.3g}" if ratio is not None else "")
    )


def _number(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)  # type: ignore[arg-type]


def _count(value: object) -> int:
    """A sample count that may be missing (no sample at all)."""
    number = _number(value)
    return 0 if number is None else int(number)


def _slots(frame: pd.DataFrame) -> set[str]:
    """Each (model, task) of ``frame`` as ``model · task``."""
    if frame.empty:
        return set()
    return {f"{m} · {t}" for m, t in zip(frame["model_id"], frame["task"], strict=True)}


FIGURES = {
    "decode": "decode_tokens_per_s",
    "compile": "compile_time_s",
    "memory": "peak_device_memory_bytes",
}
"""The figures compared between two PASSes, by short name: the history column of each."""


def _figure_samples(runs: pd.DataFrame, column: str, name: str) -> pd.DataFrame:
    """Per slot, the PASS runs' ``column``: how many samples, their median, lowest, highest."""
    known = runs[runs[column].notna()]
    if known.empty:
        return pd.DataFrame(
            columns=[f"{name}_{s}" for s in ("n", "median", "low", "high")],
            index=pd.MultiIndex.from_tuples([], names=list(SLOT)),
        )
    values = known[column].astype("float64")
    grouped = values.groupby([known[c] for c in SLOT], sort=False)
    stats = grouped.agg(["size", "median", "min", "max"])
    stats.columns = [f"{name}_{s}" for s in ("n", "median", "low", "high")]
    return stats


def _summarize(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One stack's runs as one row per (model, task): the latest run's columns, how many runs
    it has (at the latest run's Hub revision: a new revision starts afresh), how many distinct
    results they gave, and the samples of each figure over its PASS runs; and those runs."""
    latest = latest_per_slot(frame)
    if latest.empty:
        return latest, frame
    revision = latest[[*SLOT, "resolved_revision"]].rename(
        columns={"resolved_revision": "_revision"}
    )
    runs = frame.merge(revision, on=list(SLOT), how="inner")
    ran = runs["resolved_revision"].astype("object")
    wanted = runs["_revision"].astype("object")
    runs = runs[(ran.isna() & wanted.isna()) | (ran == wanted).fillna(False).astype(bool)]
    keys = [runs[c] for c in SLOT]
    counts = pd.DataFrame(
        {
            "runs": runs["run_id"].groupby(keys, sort=False).size(),
            "results": runs["result"].astype("object").groupby(keys, sort=False).nunique(),
        }
    )
    passed = runs[runs["result"].astype("object") == Result.PASS.value]
    hit = passed["compile_cache_hit"].astype("boolean").fillna(False).astype(bool)
    parts = [
        counts,
        _figure_samples(passed, FIGURES["decode"], "decode"),
        _figure_samples(passed, FIGURES["memory"], "memory"),
        _figure_samples(passed[~hit], FIGURES["compile"], "cold"),
        _figure_samples(passed[hit], FIGURES["compile"], "warm"),
    ]
    summary = pd.concat(parts, axis=1)
    summary.index.names = list(SLOT)
    side = latest.merge(summary.reset_index(), on=list(SLOT), how="left")
    return side, runs


def _flaky(runs: pd.DataFrame, slots: set[tuple[str, str]], stack: Stack) -> list[Flaky]:
    """The runs of ``slots`` on ``stack``, oldest first, as :class:`Flaky` entries."""
    if not slots:
        return []
    keys = list(zip(runs["model_id"], runs["task"], strict=True))
    chosen = runs[[k in slots for k in keys]]
    chosen = chosen.assign(_when=_when(chosen)).sort_values(["_when", "run_id"], kind="stable")
    found: dict[tuple[str, str], list[RunOutcome]] = {}
    for row in chosen[[*SLOT, "run_id", "result", "error_class", "_when"]].to_dict("records"):
        when = row["_when"]
        found.setdefault((str(row["model_id"]), str(row["task"])), []).append(
            RunOutcome(
                run_id=str(row["run_id"]),
                result=_outcome(row),
                finished_at=None if pd.isna(when) else pd.Timestamp(when).isoformat(),
            )
        )
    return [
        Flaky(model=model, task=task, stack=stack.label, runs=outcomes)
        for (model, task), outcomes in sorted(found.items())
    ]


def regressions(
    history: pd.DataFrame,
    before: Stack,
    after: Stack,
    thresholds: Thresholds,
    prices: PriceTable,
    task: str | None = None,
    confirmation: Confirmation | None = None,
    results: str | None = None,
) -> Report:
    """What changed from ``before`` to ``after``, each (model, task) tested on both.

    A model whose runs on either stack disagree (at its latest Hub revision) is flaky: listed
    with its runs, never a regression or a fix. Otherwise its latest runs are compared: a worse
    result (PASS -> FAIL/ERROR/TIMEOUT, EXCLUDED -> ERROR) is a regression once
    ``confirmation.runs_needed`` runs on the newer stack agree (before that it is unconfirmed);
    between two PASSes, decode tok/s, compile time (runs that met the compile cache alike) or
    peak memory is a regression when both stacks have ``confirmation.min_samples`` samples and
    the medians moved past both the threshold and the spread either side measured (fewer
    samples: unconfirmed). ``results``: the store named in the reproduce commands.

    The comparisons are vectorized; only the rows that changed become :class:`Change` objects
    (a comparison of 5,000 models per stack costs tens of milliseconds).
    """
    confirmation = confirmation or Confirmation()
    frame = history if task is None else history[history["task"] == task]
    frame = frame[[c for c in COMPARED_COLUMNS if c in frame.columns]]
    old, old_runs = _summarize(frame[before.matches(frame)])
    new, new_runs = _summarize(frame[after.matches(frame)])
    old, new = with_cost(old, prices), with_cost(new, prices)
    report = Report(
        before=before.label,
        after=after.label,
        compared=0,
        thresholds=thresholds,
        confirmation=confirmation,
        core_seconds_after=float(new["core_seconds"].astype("Float64").fillna(0).sum())
        if not new.empty
        else 0.0,
        cost_usd_after=_total(new["cost_usd"]) if not new.empty else None,
    )
    old_slots, new_slots = _slots(old), _slots(new)
    report.not_tested_after = sorted(old_slots - new_slots)
    report.not_tested_before = sorted(new_slots - old_slots)
    if old.empty or new.empty:
        return report
    both = old.merge(new, on=list(SLOT), suffixes=("_before", "_after")).reset_index(drop=True)
    report.compared = len(both)
    flaky_before = both["results_before"] > 1
    flaky_after = both["results_after"] > 1
    steady = ~(flaky_before | flaky_after)
    for flags, runs, stack in ((flaky_before, old_runs, before), (flaky_after, new_runs, after)):
        disagreeing = set(zip(both.loc[flags, "model_id"], both.loc[flags, "task"], strict=True))
        report.flaky += _flaky(runs, disagreeing, stack)
    report.flaky.sort(key=lambda f: (f.model, f.task, f.stack != before.label))

    rb = both["result_before"].astype("object")
    ra = both["result_after"].astype("object")
    pairs = list(zip(rb, ra, strict=True))
    worse = steady & pd.Series([is_regression(b, a) for b, a in pairs], index=both.index)
    fixed = steady & pd.Series([is_fix(b, a) for b, a in pairs], index=both.index)
    confirmed = both["runs_after"] >= confirmation.runs_needed
    passed = steady & (rb == Result.PASS.value) & (ra == Result.PASS.value)
    enough = confirmation.min_samples

    def moved(name: str, sign: float) -> tuple[pd.Series, pd.Series, pd.Series]:
        """How far the medians moved (positive: worse), the noise (the wider side's range over
        its median) and whether both sides have enough samples."""
        med_b = both[f"{name}_median_before"].astype("float64")
        med_a = both[f"{name}_median_after"].astype("float64")
        change = sign * (med_a - med_b) / med_b.where(med_b > 0)
        spread = [
            (both[f"{name}_high{s}"].astype("float64") - both[f"{name}_low{s}"].astype("float64"))
            / both[f"{name}_median{s}"].astype("float64").where(lambda v: v > 0)
            for s in ("_before", "_after")
        ]
        noise = pd.concat(spread, axis=1).max(axis=1)
        sampled = (both[f"{name}_n_before"].fillna(0) >= enough) & (
            both[f"{name}_n_after"].fillna(0) >= enough
        )
        return change.fillna(0.0), noise.fillna(0.0), sampled.astype(bool)

    def latest_growth(column: str, sign: float) -> pd.Series:
        old_v = both[f"{column}_before"].astype("Float64")
        new_v = both[f"{column}_after"].astype("Float64")
        return (sign * (new_v - old_v) / old_v.where(old_v > 0)).astype("float64").fillna(0.0)

    perf: list[tuple[ChangeKind, str, str, float, float, float]] = [
        ("slower", "decode", "decode tokens/s dropped", -1.0, thresholds.decode_drop.value, 1.0),
        ("memory", "memory", "peak device memory grew", 1.0, thresholds.memory_growth.value,
         2**-30),
    ]  # fmt: skip
    judged: list[tuple[ChangeKind, str, pd.Series, pd.Series, pd.Series, pd.Series, float]] = []
    for kind, name, _, sign, bound, _ in perf:
        change, noise, sampled = moved(name, sign)
        column = FIGURES[name]
        hint = latest_growth(column, sign)
        judged.append((kind, name, change, noise, sampled, hint, bound))
    # Compile time: cold compiles against cold compiles where both stacks have enough; else
    # runs that met the compile cache against the same.
    cold = moved("cold", 1.0)
    warm = moved("warm", 1.0)
    use_cold = cold[2]
    compile_change = cold[0].where(use_cold, warm[0])
    compile_noise = cold[1].where(use_cold, warm[1])
    compile_sampled = use_cold | warm[2]
    cache_b = both["compile_cache_hit_before"].astype("object")
    cache_a = both["compile_cache_hit_after"].astype("object")
    same_cache = ((cache_b.isna() & cache_a.isna()) | (cache_b == cache_a).fillna(False)).astype(
        bool
    )
    compile_hint = latest_growth(FIGURES["compile"], 1.0).where(same_cache, 0.0)
    judged.append(
        ("compile-time", "compile", compile_change, compile_noise, compile_sampled,
         compile_hint, thresholds.compile_growth.value)
    )  # fmt: skip

    flagged: dict[ChangeKind, tuple[pd.Index, pd.Index]] = {}
    for kind, _, change, noise, sampled, hint, bound in judged:
        beyond = passed & sampled & (change > bound) & (change > noise)
        pending = passed & ~sampled & (hint > bound)
        flagged[kind] = (both.index[beyond], both.index[pending])

    # Only the rows that changed are read row by row: a column at a time, then zipped.
    rows = worse | fixed
    for hits, pending in flagged.values():
        rows |= both.index.isin(hits) | both.index.isin(pending)
    changed = both.index[rows]
    sub = both.loc[changed]
    slots = [
        dict(zip(SLOT, values, strict=True))
        for values in zip(*(sub[c].tolist() for c in SLOT), strict=True)
    ]
    columns = {
        suffix: {c: sub[f"{c}{suffix}"].tolist() for c in (*SIDE_COLUMNS, "runs")}
        for suffix in ("_before", "_after")
    }
    sides = {
        i: tuple(
            slots[n] | {c: columns[suffix][c][n] for c in (*SIDE_COLUMNS, "runs")}
            for suffix in ("_before", "_after")
        )
        for n, i in enumerate(changed)
    }

    def common(i: int) -> dict[str, Any]:
        b, a = sides[i]
        return {
            "model": str(a["model_id"]),
            "task": str(a["task"]),
            "before": _outcome(b),
            "after": _outcome(a),
            "before_run_id": str(b["run_id"]),
            "after_run_id": str(a["run_id"]),
            "reproduce": reproduce_command(str(a["run_id"]), results),
            "core_seconds_after": _number(a["core_seconds"]),
            "cost_usd_after": _number(a["cost_usd"]),
            "runs_before": int(b["runs"]),
            "runs_after": int(a["runs"]),
        }

    needed = confirmation.runs_needed
    for i in both.index[worse]:
        change = Change(
            kind="regression",
            group=_group_of(sides[i][1]),
            detail=divergence_line(sides[i][1]),
            **common(i),
        )
        if confirmed[i]:
            report.regressions.append(change)
        else:
            missing = needed - change.runs_after
            change.needs = (
                f"{change.runs_after} of {needed} agreeing runs on the newer stack: "
                f"{missing} more re-run(s) (model-support regressions --confirm)"
            )
            report.unconfirmed.append(change)
    for i in both.index[fixed]:
        report.fixes.append(Change(kind="fix", group=f"was {_group_of(sides[i][0])}", **common(i)))
    labels = {
        "slower": ("decode tokens/s dropped", "decode {:.1f} -> {:.1f} tokens/s", 1.0, "decode"),
        "memory": ("peak device memory grew", "peak memory {:.2f} -> {:.2f} GiB", 2**-30,
                   "memory"),
        "compile-time": ("compile time grew", "compile {:.1f} -> {:.1f} s", 1.0, None),
    }  # fmt: skip
    for kind, _, change_s, noise_s, _, hint_s, bound in judged:
        group, pattern, scale, sampled_as = labels[kind]
        hits, pending = flagged[kind]
        for i in hits:
            figure = sampled_as or ("cold" if use_cold[i] else "warm")
            med_b = float(both.at[i, f"{figure}_median_before"]) * scale
            med_a = float(both.at[i, f"{figure}_median_after"]) * scale
            n_b = int(both.at[i, f"{figure}_n_before"])
            n_a = int(both.at[i, f"{figure}_n_after"])
            sign = -1 if kind == "slower" else 1
            detail = (
                pattern.format(med_b, med_a)
                + f" ({sign * change_s[i]:+.0%}): medians of {n_b} and {n_a} PASS runs; noise "
                f"assumed ±{noise_s[i]:.0%} (the wider side's range over its median), "
                f"threshold {bound:.0%}"
                + ("" if sampled_as else f"; {'cold' if use_cold[i] else 'cached'} compiles")
            )
            report.regressions.append(Change(kind=kind, group=group, detail=detail, **common(i)))
        for i in pending:
            b, a = sides[i]
            column = FIGURES[sampled_as or "compile"]
            figures = pattern.format(float(b[column]) * scale, float(a[column]) * scale)
            n_b = _count(both.at[i, f"{sampled_as or 'cold'}_n_before"])
            n_a = _count(both.at[i, f"{sampled_as or 'cold'}_n_after"])
            change = Change(
                kind=kind,
                group=group,
                detail=f"{figures} ({(-1 if kind == 'slower' else 1) * hint_s[i]:+.0%}) "
                "between the latest runs",
                needs=f"{enough} PASS runs a stack to compare (it has {n_b} and {n_a}): "
                "one sample never makes a speed regression",
                **common(i),
            )
            report.unconfirmed.append(change)
    order = {"regression": 0, "slower": 1, "compile-time": 2, "memory": 3}
    for changes in (report.regressions, report.unconfirmed):
        changes.sort(key=lambda c: (order[c.kind], c.group, c.model, c.task))
    report.fixes.sort(key=lambda c: (c.group, c.model, c.task))
    return report


def _total(values: pd.Series) -> float | None:
    known = values.dropna()
    return None if known.empty else float(known.sum())


# ---------------------------------------------------------------------------------------------
# Rendering


_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<>|~$&!])")


def _cell(text: object) -> str:
    """``text`` on one line, as Markdown that renders as exactly it inside a line or a table
    cell: the characters that start inline markup (emphasis, code, links, HTML, entities,
    math, table pipes) are escaped; the rest stays readable when pasted raw."""
    return _MARKDOWN_INLINE.sub(r"\\\1", " ".join(str(text).split()))


def _code(text: str) -> str:
    """``text`` as a code span inside a Markdown table cell (its pipes escaped for the table)."""
    return inline_code(text).replace("|", "\\|")


def money(value: float | None) -> str:
    """Dollars for display; an em dash where the cost is unknown."""
    if value is None or pd.isna(value):
        return "—"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _fenced(text: str) -> list[str]:
    """``text`` as a fenced code block whose fence no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *text.splitlines(), fence]


def _evidence_lines(change: Change) -> list[str]:
    """A change's details as a bug report wants them: the stacks, where it failed, the error,
    and the commands that run it again."""
    lines: list[str] = []
    for side, evidence in (("before", change.before_evidence), ("after", change.after_evidence)):
        if evidence is not None and evidence.stack:
            stack = ", ".join(f"{k} {v}" for k, v in evidence.stack.items())
            lines.append(f"- stack {side}: {_cell(stack)}")
    after = change.after_evidence
    if after is not None:
        if after.failed_checks:
            lines.append("- failed checks: " + "; ".join(_cell(c) for c in after.failed_checks))
        if after.first_divergence:
            lines.append(f"- {_cell(after.first_divergence)}")
        if after.error_lines:
            lines += [f"- error ({_cell(after.error_class or 'no class')}):", ""]
            lines += ["  " + line for line in _fenced("\n".join(after.error_lines))]
            lines.append("")
    lines.append(f"- reproduce: {inline_code(change.reproduce)}")
    if after is not None and after.container:
        lines.append(f"- on a Trainium machine, in the row's image: {inline_code(after.container)}")
    return lines


def _change_tables(report: Report, changes: Sequence[Change], with_needs: bool) -> list[str]:
    lines: list[str] = []
    for group, members in report.groups(changes).items():
        lines += [f"### {_cell(group)} ({len(members)})", ""]
        last = "needs" if with_needs else "cost"
        lines.append(f"| model | task | before | after | runs | detail | {last} |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for c in members:
            tail = _cell(c.needs or "") if with_needs else money(c.cost_usd_after)
            lines.append(
                f"| {_code(c.model)} | {_cell(c.task)} | {_cell(c.before)} | "
                f"{_cell(c.after)} | {c.runs_before} / {c.runs_after} | {_cell(c.detail or '')} "
                f"| {tail} |"
            )
        lines.append("")
        for c in members:
            lines += [f"#### {_cell(c.model)} · {_cell(c.task)}", "", *_evidence_lines(c), ""]
    return lines


def render_markdown(report: Report, store_uri: str | None = None) -> str:
    """The report as Markdown, ready to paste into a bug report: per change the stacks, the
    failed checks or the error, the first diverging module and the commands that reproduce it."""
    lines = [f"# Regressions: {_cell(report.before)} -> {_cell(report.after)}", ""]
    where = f" in {inline_code(store_uri)}" if store_uri else ""
    c = report.confirmation
    lines.append(
        f"{len(report.regressions)} confirmed regression(s), {len(report.fixes)} fix(es), "
        f"{len(report.unconfirmed)} unconfirmed change(s) and {len(report.flaky)} flaky "
        f"model(s) among {report.compared} model(s) with a result on both stacks{where}. The "
        f"newer stack's runs held {report.core_seconds_after / 3600:,.2f} core-hours "
        + (
            f"(cost {money(report.cost_usd_after)})."
            if report.cost_usd_after is not None
            else "(no cost: they name no instance type with a price, as local runs do; "
            "docs/pricing.md says how to give one)."
        )
    )
    if report.not_tested_after or report.not_tested_before:
        lines += [
            "",
            f"Not compared (tested on one stack only): {len(report.not_tested_after)} not "
            f"tested after, {len(report.not_tested_before)} not tested before.",
        ]
    lines += ["", "Confirmation:", ""]
    lines += [
        f"- a worse result is a regression once {c.runs_needed} runs on the newer stack agree "
        f"(the first and {c.reruns} re-run(s)); runs that disagree on one stack make the model "
        "flaky, never a regression or a fix",
        f"- speed, compile time and memory are compared between medians of at least "
        f"{c.min_samples} PASS runs a stack, and only a move past both the threshold and the "
        "spread each side measured counts",
        f"- why: {_cell(c.reason)}",
    ]
    lines += ["", "Thresholds (between two PASSes):", ""]
    t = report.thresholds
    lines += [
        f"- decode tokens/s dropped by more than {t.decode_drop.value:.0%}: {_cell(t.decode_drop.reason)}",
        f"- compile time grew by more than {t.compile_growth.value:.0%}: {_cell(t.compile_growth.reason)}",
        f"- peak device memory grew by more than {t.memory_growth.value:.0%}: {_cell(t.memory_growth.reason)}",
    ]
    for title, changes, needs in (
        ("Regressions", report.regressions, False),
        ("Fixes", report.fixes, False),
        ("Unconfirmed (not reported as regressions yet)", report.unconfirmed, True),
    ):
        lines += ["", f"## {title}", ""]
        lines += _change_tables(report, changes, needs) if changes else ["None."]
    lines += ["", "## Flaky (runs on one stack disagree)", ""]
    if not report.flaky:
        lines.append("None.")
    else:
        lines.append("| model | task | stack | runs (oldest first) |")
        lines.append("| --- | --- | --- | --- |")
        for f in report.flaky:
            runs = ", ".join(f"{_cell(r.result)} {_code(r.run_id)}" for r in f.runs)
            lines.append(f"| {_code(f.model)} | {_cell(f.task)} | {_cell(f.stack)} | {runs} |")
    return "\n".join(lines).rstrip() + "\n"


def render_json(report: Report) -> str:
    """The report as one JSON object."""
    return json.dumps(report.model_dump(mode="json"), indent=1)


def regression_table(changes: Sequence[Change]) -> pd.DataFrame:
    """Changes as a table (the viewer's Regressions view)."""
    columns = [
        "kind",
        "group",
        "model",
        "task",
        "before",
        "after",
        "detail",
        "cost (USD)",
        "reproduce",
    ]
    return pd.DataFrame(
        [
            {
                "kind": c.kind,
                "group": c.group,
                "model": c.model,
                "task": c.task,
                "before": c.before,
                "after": c.after,
                "detail": c.detail,
                "cost (USD)": c.cost_usd_after,
                "reproduce": c.reproduce,
            }
            for c in changes
        ],
        columns=columns,
    )


# ---------------------------------------------------------------------------------------------
# A release at a glance


class ReleaseReport(BaseModel):
    """One stack (a release) at a glance: what was tested, how it went, what changed against
    the stack before it, and what it cost."""

    model_config = ConfigDict(extra="forbid")

    stack: str
    previous: str | None = Field(None, description="The stack it is compared with.")
    tested: int = Field(..., description="(model, task) pairs with a result on the stack.")
    results: dict[str, int] = Field(
        default_factory=dict, description="Latest results by kind (PASS, FAIL, ERROR...)."
    )
    regressions: list[Change] = Field(default_factory=list, description="Confirmed.")
    unconfirmed: list[Change] = Field(default_factory=list)
    fixes: list[Change] = Field(default_factory=list)
    flaky: list[Flaky] = Field(
        default_factory=list, description="Models whose runs on this stack disagree."
    )
    not_retested: list[str] = Field(
        default_factory=list,
        description="'model · task' tested on the previous stack and not on this one.",
    )
    core_seconds: float = 0.0
    cost_usd: float | None = None
    confirmation: Confirmation = Field(default_factory=Confirmation)


def previous_stack(stack: Stack, known: Sequence[StackInfo]) -> Stack | None:
    """The stack before ``stack`` in :func:`stacks` order (None for the oldest)."""
    order = [info.stack for info in known]
    index = order.index(stack)
    return order[index - 1] if index > 0 else None


def release_report(
    history: pd.DataFrame,
    stack: Stack,
    previous: Stack | None,
    thresholds: Thresholds,
    prices: PriceTable,
    confirmation: Confirmation | None = None,
    results: str | None = None,
) -> ReleaseReport:
    """``stack`` at a glance (see :class:`ReleaseReport`), compared with ``previous``."""
    confirmation = confirmation or Confirmation()
    frame = history[[c for c in COMPARED_COLUMNS if c in history.columns]]
    own = frame[stack.matches(frame)]
    summary, runs = _summarize(own)
    summary = with_cost(summary, prices)
    counts = summary["result"].astype("object").value_counts() if not summary.empty else {}
    disagreeing = (
        set(zip(summary.loc[summary["results"] > 1, "model_id"],
                summary.loc[summary["results"] > 1, "task"], strict=True))
        if not summary.empty
        else set()
    )  # fmt: skip
    costs = with_cost(own, prices)  # every run on the stack held its cores, re-runs included
    release = ReleaseReport(
        stack=stack.label,
        previous=previous.label if previous is not None else None,
        tested=len(summary),
        results={str(k): int(v) for k, v in dict(counts).items()},
        flaky=_flaky(runs, disagreeing, stack),
        core_seconds=float(costs["core_seconds"].astype("Float64").fillna(0).sum()),
        cost_usd=_total(costs["cost_usd"]) if not costs.empty else None,
        confirmation=confirmation,
    )
    if previous is not None:
        compared = regressions(
            frame, previous, stack, thresholds, prices, confirmation=confirmation, results=results
        )
        release.regressions = compared.regressions
        release.unconfirmed = compared.unconfirmed
        release.fixes = compared.fixes
        release.not_retested = compared.not_tested_after
    return release


def render_release_markdown(release: ReleaseReport, store_uri: str | None = None) -> str:
    """A release report as Markdown: the counts in one table, then the regressions, the flaky
    models and the models not re-tested, by name."""
    where = f" ({inline_code(store_uri)})" if store_uri else ""
    lines = [f"# Release: {_cell(release.stack)}", ""]
    lines.append(
        f"Against {_cell(release.previous)}{where}."
        if release.previous
        else f"The oldest stack{where}: nothing to compare it with."
    )
    kinds = [r.value for r in Result]
    lines += [
        "",
        "| tested | " + " | ".join(kinds) + " | regressions | fixes | unconfirmed | flaky | "
        "not re-tested | core-hours | cost |",
        "| " + " | ".join(["---"] * (len(kinds) + 8)) + " |",
        f"| {release.tested} | "
        + " | ".join(str(release.results.get(k, 0)) for k in kinds)
        + f" | {len(release.regressions)} | {len(release.fixes)} | {len(release.unconfirmed)} "
        f"| {len(release.flaky)} | {len(release.not_retested)} | "
        f"{release.core_seconds / 3600:,.2f} | {money(release.cost_usd)} |",
    ]
    sections: list[tuple[str, list[str]]] = [
        (
            "Regressions (confirmed)",
            [
                line
                for c in release.regressions
                for line in (
                    f"- {_code(c.model)} ({_cell(c.task)}): {_cell(c.before)} -> "
                    f"{_cell(c.after)}" + (f", {_cell(c.detail)}" if c.detail else ""),
                    *(
                        "  " + evidence
                        for evidence in _evidence_lines(c)
                        if c.after_evidence is not None or evidence.startswith("- reproduce")
                    ),
                )
            ],
        ),
        (
            "Unconfirmed",
            [
                f"- {_code(c.model)} ({_cell(c.task)}): {_cell(c.before)} -> {_cell(c.after)}; "
                f"needs {_cell(c.needs or '')}"
                for c in release.unconfirmed
            ],
        ),
        (
            "Fixes",
            [
                f"- {_code(c.model)} ({_cell(c.task)}): {_cell(c.before)} -> {_cell(c.after)}"
                for c in release.fixes
            ],
        ),
        (
            "Flaky (runs on this stack disagree)",
            [
                f"- {_code(f.model)} ({_cell(f.task)}): "
                + ", ".join(f"{_cell(r.result)} {_code(r.run_id)}" for r in f.runs)
                for f in release.flaky
            ],
        ),
        (
            "Not re-tested (tested on the previous stack only)",
            [f"- {_cell(slot)}" for slot in release.not_retested],
        ),
    ]
    for title, items in sections:
        lines += ["", f"## {title}", "", *(items or ["None."])]
    return "\n".join(lines).rstrip() + "\n"
