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

from model_support.pricing import PriceTable
from model_support.records import divergence_where
from model_support.viewer.markup import inline_code
from model_support.vocabulary import Result, is_fix, is_regression

if TYPE_CHECKING:
    from model_support.store import ResultsStore

STACK_COLUMNS = ("compiler", "compiler_version", "library", "library_version")
SLOT = ("model_id", "task")
STACK_ORDER_COLUMNS = (*STACK_COLUMNS, "run_id", "started_at", "finished_at", "recorded_at")
"""What ordering the stacks reads (a few columns of every run)."""
DIVERGENCE_COLUMNS = (
    "first_divergence", "first_divergence_phase", "first_divergence_step", "first_divergence_ratio",
)  # fmt: skip
"""Where a FAIL starts: its first diverging module, where it was found, its error ratio."""
COMPARED_COLUMNS = (
    *SLOT, *STACK_COLUMNS, "result", "error_class", "failed_checks", "run_id", "instance_type",
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
    (null where the table has no price for it, or the run recorded no times)."""
    if frame.empty:
        return frame.assign(cost_usd=pd.Series(dtype="Float64"))
    instance = frame["instance_type"].astype("object")
    lnc = frame["lnc"].astype("object")
    rates: dict[tuple[Any, Any], float | None] = {}
    keys = list(
        zip(instance.where(instance.notna(), None), lnc.where(lnc.notna(), None), strict=True)
    )
    for key in set(keys):
        rates[key] = prices.core_hour_usd(key[0], None if key[1] is None else int(key[1]))
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


ChangeKind = Literal["regression", "slower", "compile-time", "memory", "fix"]


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


class Report(BaseModel):
    """What changed from one stack to another."""

    model_config = ConfigDict(extra="forbid")

    before: str
    after: str
    compared: int = Field(..., description="(model, task) pairs with a result on both stacks.")
    thresholds: Thresholds
    regressions: list[Change] = Field(default_factory=list)
    fixes: list[Change] = Field(default_factory=list)
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


def divergence_detail(row: Mapping[str, Any]) -> str | None:
    """Where a FAIL starts, for the report: "first diverging module from decode step 18:
    model.layers.0.mlp.act_fn, 125x"; None where the run names no module."""
    module = row.get("first_divergence")
    if not isinstance(module, str) or not module:
        return None
    where = divergence_where(row.get("first_divergence_phase"), row.get("first_divergence_step"))
    ratio = _number(row.get("first_divergence_ratio"))
    return f"first diverging module{' ' + where if where else ''}: {module}" + (
        f", {ratio:.3g}x" if ratio is not None else ""
    )


def _number(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)  # type: ignore[arg-type]


def _slots(frame: pd.DataFrame) -> set[str]:
    """Each (model, task) of ``frame`` as ``model · task``."""
    if frame.empty:
        return set()
    return {f"{m} · {t}" for m, t in zip(frame["model_id"], frame["task"], strict=True)}


def regressions(
    history: pd.DataFrame,
    before: Stack,
    after: Stack,
    thresholds: Thresholds,
    prices: PriceTable,
    task: str | None = None,
) -> Report:
    """What changed from ``before`` to ``after``: each (model, task) tested on both, latest
    run on each; a worse result (PASS -> FAIL/ERROR/TIMEOUT, EXCLUDED -> ERROR) or, between
    two PASSes, decode tok/s, compile time or peak memory past ``thresholds``; and fixes.

    The comparisons are vectorized; only the rows that changed become :class:`Change` objects
    (a comparison of 5,000 models per stack costs tens of milliseconds).
    """
    frame = history if task is None else history[history["task"] == task]
    frame = frame[[c for c in COMPARED_COLUMNS if c in frame.columns]]
    old = with_cost(latest_per_slot(frame[before.matches(frame)]), prices)
    new = with_cost(latest_per_slot(frame[after.matches(frame)]), prices)
    report = Report(
        before=before.label,
        after=after.label,
        compared=0,
        thresholds=thresholds,
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
    rb = both["result_before"].astype("object")
    ra = both["result_after"].astype("object")
    pairs = list(zip(rb, ra, strict=True))
    worse = pd.Series([is_regression(b, a) for b, a in pairs], index=both.index, dtype=bool)
    fixed = pd.Series([is_fix(b, a) for b, a in pairs], index=both.index, dtype=bool)
    passed = (rb == Result.PASS.value) & (ra == Result.PASS.value)

    def growth(column: str) -> pd.Series:
        old_v = both[f"{column}_before"].astype("Float64")
        new_v = both[f"{column}_after"].astype("Float64")
        change = (new_v - old_v) / old_v.where(old_v > 0)
        return change.astype("float64")  # NaN where either side is unknown

    decode = growth("decode_tokens_per_s")
    compile_ = growth("compile_time_s")
    memory = growth("peak_device_memory_bytes")
    cache_b = both["compile_cache_hit_before"].astype("object")
    cache_a = both["compile_cache_hit_after"].astype("object")
    same_cache = (cache_b.isna() & cache_a.isna()) | (cache_b == cache_a).fillna(False)
    slower = passed & (-decode > thresholds.decode_drop.value)
    longer = passed & same_cache.astype(bool) & (compile_ > thresholds.compile_growth.value)
    larger = passed & (memory > thresholds.memory_growth.value)

    # Only the rows that changed are read row by row: a column at a time, then zipped.
    changed = both.index[worse | fixed | slower | longer | larger]
    sub = both.loc[changed]
    slots = [
        dict(zip(SLOT, values, strict=True))
        for values in zip(*(sub[c].tolist() for c in SLOT), strict=True)
    ]
    columns = {
        suffix: {c: sub[f"{c}{suffix}"].tolist() for c in SIDE_COLUMNS}
        for suffix in ("_before", "_after")
    }
    sides = {
        i: tuple(
            slots[n] | {c: columns[suffix][c][n] for c in SIDE_COLUMNS}
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
            "reproduce": reproduce_command(str(a["run_id"])),
            "core_seconds_after": _number(a["core_seconds"]),
            "cost_usd_after": _number(a["cost_usd"]),
        }

    def figure(i: int, column: str, scale: float = 1.0) -> tuple[float, float]:
        b, a = sides[i]
        return float(b[column]) * scale, float(a[column]) * scale

    for i in both.index[worse]:
        report.regressions.append(
            Change(
                kind="regression",
                group=_group_of(sides[i][1]),
                detail=divergence_detail(sides[i][1]),
                **common(i),
            )
        )
    for i in both.index[fixed]:
        report.fixes.append(Change(kind="fix", group=f"was {_group_of(sides[i][0])}", **common(i)))
    for i in both.index[slower]:
        old_v, new_v = figure(i, "decode_tokens_per_s")
        report.regressions.append(
            Change(
                kind="slower",
                group="decode tokens/s dropped",
                detail=f"decode {old_v:.1f} -> {new_v:.1f} tokens/s ({decode[i]:+.0%})",
                **common(i),
            )
        )
    for i in both.index[longer]:
        old_v, new_v = figure(i, "compile_time_s")
        report.regressions.append(
            Change(
                kind="compile-time",
                group="compile time grew",
                detail=f"compile {old_v:.1f} -> {new_v:.1f} s ({compile_[i]:+.0%})",
                **common(i),
            )
        )
    for i in both.index[larger]:
        old_v, new_v = figure(i, "peak_device_memory_bytes", 2**-30)
        report.regressions.append(
            Change(
                kind="memory",
                group="peak device memory grew",
                detail=f"peak memory {old_v:.2f} -> {new_v:.2f} GiB ({memory[i]:+.0%})",
                **common(i),
            )
        )
    order = {"regression": 0, "slower": 1, "compile-time": 2, "memory": 3}
    report.regressions.sort(key=lambda c: (order[c.kind], c.group, c.model, c.task))
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


def render_markdown(report: Report, store_uri: str | None = None) -> str:
    """The report as Markdown, ready to paste into a bug report (with reproduce commands)."""
    lines = [f"# Regressions: {_cell(report.before)} -> {_cell(report.after)}", ""]
    where = f" in {inline_code(store_uri)}" if store_uri else ""
    lines.append(
        f"{len(report.regressions)} regression(s) and {len(report.fixes)} fix(es) among "
        f"{report.compared} model(s) with a result on both stacks{where}. The newer stack's "
        f"runs held {report.core_seconds_after / 3600:,.2f} core-hours "
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
    lines += ["", "Thresholds (between two PASSes):", ""]
    t = report.thresholds
    lines += [
        f"- decode tokens/s dropped by more than {t.decode_drop.value:.0%}: {_cell(t.decode_drop.reason)}",
        f"- compile time grew by more than {t.compile_growth.value:.0%}: {_cell(t.compile_growth.reason)}",
        f"- peak device memory grew by more than {t.memory_growth.value:.0%}: {_cell(t.memory_growth.reason)}",
    ]
    for title, changes in (("Regressions", report.regressions), ("Fixes", report.fixes)):
        lines += ["", f"## {title}", ""]
        if not changes:
            lines.append("None.")
            continue
        for group, members in report.groups(changes).items():
            lines += [f"### {_cell(group)} ({len(members)})", ""]
            lines.append("| model | task | before | after | detail | cost | reproduce |")
            lines.append("| --- | --- | --- | --- | --- | --- | --- |")
            for c in members:
                lines.append(
                    f"| {_code(c.model)} | {_cell(c.task)} | {_cell(c.before)} | "
                    f"{_cell(c.after)} | {_cell(c.detail or '')} | {money(c.cost_usd_after)} | "
                    f"{_code(c.reproduce)} |"
                )
            lines.append("")
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
