"""The History and Regressions views: every run of a model across stacks and time, and what
changed between two stacks.

Their own module (the page's other views are in ``views.py``), drawn from the store's history
(``history/runs.parquet``) through :mod:`model_support.history`, the functions the command
line uses. Data is read through caches keyed by the history file's fingerprint, so a
rematerialized history is read again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from model_support.history import (
    Change,
    Confirmation,
    Report,
    Stack,
    StackInfo,
    StackNotFound,
    Thresholds,
    default_pair,
    model_history,
    money,
    read_stack_runs,
    read_stacks,
    regression_table,
    regressions,
    render_json,
    render_markdown,
    reproduce_command,
)
from model_support.markdown import inline_code, literal
from model_support.pricing import DEFAULT_PRICES, PriceTable, PriceTableError, load_prices
from model_support.store import ResultsStore
from model_support.viewer import formatting
from model_support.viewer.markup import shown_frame
from model_support.viewer.queries import UNTESTED
from model_support.viewer.views import RESULT_COLOURS, result_column

FINGERPRINT_TTL_S = 30
CHART_TIME_FORMAT = "%Y-%m-%d %H:%M"
"""The History chart's times (d3's format), as the table writes them: 24-hour, in UTC."""
HISTORY_METRICS: dict[str, tuple[str, float]] = {
    "wall time (s)": ("wall_time_s", 1.0),
    "compile time (s)": ("compile_time_s", 1.0),
    "decode tokens/s": ("decode_tokens_per_s", 1.0),
    "peak device memory (GiB)": ("peak_device_memory_bytes", 2**-30),
    "core-hours": ("core_seconds", 1 / 3600),
    "error ratio": ("error_ratio", 1.0),
}
"""What the History chart can plot over time: label -> (history column, scale)."""


@dataclass(frozen=True)
class HistoryContext:
    """Where the results are, and the page's task filter."""

    results_uri: str
    task: str | None


# ---------------------------------------------------------------------------------------------
# Cached readers


@st.cache_data(ttl=FINGERPRINT_TTL_S, show_spinner=False)
def _fingerprint(results_uri: str) -> str | None:
    """The history file's modification stamp and size; None when there is none."""
    store = ResultsStore(results_uri)
    path = store.history_path()
    fs_path = store.fs._strip_protocol(path)
    if not store.fs.exists(fs_path):
        return None
    info = store.fs.info(fs_path)
    stamp = next(
        (str(info[k]) for k in ("mtime", "LastModified", "ETag", "etag", "created") if info.get(k)),
        "",
    )
    return f"{stamp}:{info.get('size')}"


@st.cache_resource(show_spinner=False, max_entries=64)
def _model_runs(results_uri: str, fingerprint: str, model_id: str) -> pd.DataFrame:
    return ResultsStore(results_uri).history(filters=[("model_id", "==", model_id)])


@st.cache_resource(show_spinner=False, max_entries=8)
def _models(results_uri: str, fingerprint: str) -> list[str]:
    frame = ResultsStore(results_uri).history(columns=["model_id"])
    return sorted(pd.unique(frame["model_id"]).tolist())


@st.cache_resource(show_spinner=False, max_entries=8)
def _stacks(results_uri: str, fingerprint: str) -> list[StackInfo]:
    return read_stacks(ResultsStore(results_uri))


# Frames are never changed in place (pandas copy-on-write): shared without copies.
@st.cache_resource(show_spinner=False, max_entries=16)
def _stack_runs(results_uri: str, fingerprint: str, chosen: tuple[Stack, ...]) -> pd.DataFrame:
    return read_stack_runs(ResultsStore(results_uri), chosen)


@st.cache_resource(show_spinner=False, max_entries=32)
def _report(
    results_uri: str,
    fingerprint: str,
    before: Stack,
    after: Stack,
    thresholds: Thresholds,
    prices: PriceTable,
    task: str | None,
) -> Report:
    runs = _stack_runs(results_uri, fingerprint, (before, after))
    # Every worse result the history holds is listed (none waits for re-runs here); flaky
    # models and the samples speed needs are judged as `model-support regressions` does.
    return regressions(
        runs, before, after, thresholds, prices, task, confirmation=Confirmation(reruns=0)
    )


@st.cache_resource(show_spinner=False)
def _prices() -> PriceTable | PriceTableError:
    try:
        return load_prices()
    except PriceTableError as exc:
        return exc


def _usable_prices() -> tuple[PriceTable, PriceTableError | None]:
    """The price table to use ($MODEL_SUPPORT_PRICES over the default, else the default), and
    why that file could not be used, if it could not."""
    table = _prices()
    if isinstance(table, PriceTableError):
        return DEFAULT_PRICES, table
    return table, None


def prices() -> PriceTable:
    """The price table ($MODEL_SUPPORT_PRICES over the default); the default with a warning
    when that file cannot be used."""
    table, problem = _usable_prices()
    if problem is not None:
        st.warning(
            f"The price table could not be used, so costs use the default one: {literal(problem)}"
        )
    return table


def stack_order(results_uri: str) -> list[Stack]:
    """The stacks of the store's history, oldest first, as the Regressions view orders them
    (its default pair is the last two); none without a history."""
    fingerprint = _fingerprint(results_uri)
    if fingerprint is None:
        return []
    return [info.stack for info in _stacks(results_uri, fingerprint)]


def read_ahead(results_uri: str) -> None:
    """Read what a first visit to Regressions reads, its default comparison (the two newest
    stacks' runs and their report at the default thresholds, every task), into the page's
    caches: the server's first visitor of that view then waits no longer than later ones."""
    fingerprint = _fingerprint(results_uri)
    if fingerprint is None:
        return
    try:
        older, newer = default_pair(_stacks(results_uri, fingerprint))
    except StackNotFound:
        return  # the view says so; nothing to read
    table, _ = _usable_prices()  # a file that cannot be used is reported by the page's run
    _report(results_uri, fingerprint, older, newer, Thresholds(), table, None)


def _no_history(ctx: HistoryContext) -> None:
    st.info(
        f"No history under {inline_code(ctx.results_uri)} yet: it is written with the matrix "
        "by every recorded run (`model-support dataset materialize` builds it for an older store)."
    )


# ---------------------------------------------------------------------------------------------
# History


def view_history(ctx: HistoryContext) -> None:
    """Every run of one model, oldest first, a chart of a figure over time, and a run's details."""
    fingerprint = _fingerprint(ctx.results_uri)
    if fingerprint is None:
        _no_history(ctx)
        return
    models = _models(ctx.results_uri, fingerprint)
    wanted = st.session_state.get("model")
    index = models.index(wanted) if wanted in models else None
    model = st.selectbox(
        "Model",
        models,
        index=index,
        key="history-model",
        placeholder="Pick a model (or open the page with ?view=history&model=org/name)",
    )
    if not model:
        st.caption(f"{len(models):,} models have runs in this dataset.")
        return
    if model != wanted:
        st.session_state["model"] = model  # the page's details and its URL follow
    table = prices()
    runs = model_history(_model_runs(ctx.results_uri, fingerprint, model), model, ctx.task, table)
    if runs.empty:
        st.info(f"{literal(model)} has no runs of {literal(ctx.task)}.")
        return
    flips = int(runs["flip"].notna().sum())
    cols = st.columns(4)
    cols[0].metric("runs", len(runs))
    cols[1].metric("stacks", runs["stack_label"].nunique())
    cols[2].metric("changes on one stack", flips)
    known = runs["cost_usd"].dropna()
    cols[3].metric("cost of these runs", money(float(known.sum())) if not known.empty else "—")
    _history_chart(runs)
    table = shown_frame(history_table(runs))
    event = st.dataframe(
        table,
        hide_index=True,
        placeholder=formatting.BLANK_CELL,
        on_select="rerun",
        selection_mode="single-row",
        key="history-table",
        column_config={
            "result": result_column(),
            "reproduce": st.column_config.TextColumn("reproduce", width="large"),
            "cost": st.column_config.NumberColumn("cost (USD)", format="$%.4f"),
        },
    )
    rows = event.selection.rows if event is not None else []
    run_id = str(table.iloc[rows[0]]["run id"]) if rows else st.session_state.get("run")
    if run_id and run_id in set(table["run id"]):
        st.session_state["run"] = run_id
        _run_details(ctx, run_id)
    else:
        st.session_state.pop("run", None)
        st.caption("Click a run for its details and how to reproduce it.")


def history_table(runs: pd.DataFrame) -> pd.DataFrame:
    """A model's runs as the History view's table (one row per run, readable columns)."""
    when = runs["finished_at"].fillna(runs["recorded_at"])
    checks = pd.Series(
        [", ".join(_strings(v)) or None for v in runs["failed_checks"]],
        index=runs.index,
        dtype="object",
    )
    # The list's "why": an ERROR's class, a FAIL's failed checks, an EXCLUDED model's reason.
    why = (
        runs["error_class"]
        .astype("object")
        .where(
            runs["result"] == "ERROR",
            checks.where(runs["result"] == "FAIL", runs["exclusion_reason"].astype("object")),
        )
    )
    return pd.DataFrame(
        {
            "finished": when,
            "stack": runs["stack_label"],
            "task": runs["task"],
            "result": runs["result"],
            "why": why.where(why.notna(), None),
            "changed on this stack": runs["flip"],
            "cores": runs["neuron_cores"].astype("Int64"),
            "wall time (s)": runs["wall_time_s"].astype("Float64").round(1),
            "compile time (s)": runs["compile_time_s"].astype("Float64").round(1),
            "decode tokens/s": runs["decode_tokens_per_s"].astype("Float64").round(1),
            "peak device memory (GiB)": (
                runs["peak_device_memory_bytes"].astype("Float64") / 2**30
            ).round(2),
            "failed checks": checks,
            "error ratio": runs["error_ratio"].astype("Float64").round(2),
            "q90 ratio": runs["q90_ratio"].astype("Float64").round(2),
            "peak ratio": runs["peak_ratio"].astype("Float64").round(2),
            "kl ratio": runs["kl_ratio"].astype("Float64").round(2),
            "bad tokens": runs["bad_tokens"].astype("Int64"),
            "core-hours": (runs["core_seconds"].astype("Float64") / 3600).round(3),
            "compile share": runs["compile_share"].astype("Float64").round(2),
            "cost": runs["cost_usd"].astype("Float64"),
            "run id": runs["run_id"],
            "reproduce": [reproduce_command(r) for r in runs["run_id"]],
        }
    ).reset_index(drop=True)


def _strings(value: object) -> list[str]:
    """A list column's value (None, a list or an array of strings) as a list."""
    if value is None or isinstance(value, float):
        return []
    return [str(v) for v in value]  # type: ignore[attr-defined]


LEGEND_PX = 340
"""The History chart's legend: room for a stack's label (its compiler shortened, ``views.short_stack_label``)."""


def _legend_labels(labels: pd.Series) -> list[str]:
    """Each stack's label in the legend: shortened to LEGEND_PX so two stacks of one package's
    compile backends stay apart (Vega cuts a label at its limit, from its end); whole where
    shortening would make two the same."""
    from model_support.viewer.views import short_stack_label

    short = {label: short_stack_label(label, LEGEND_PX) for label in set(labels)}
    if len(set(short.values())) < len(short):
        return list(labels)
    return [short[label] for label in labels]


def _history_chart(runs: pd.DataFrame) -> None:
    import altair as alt

    from model_support.viewer.views import RESULT_CHART_COLOURS

    label = st.selectbox("Chart", list(HISTORY_METRICS), key="history-metric")
    column, scale = HISTORY_METRICS[label]
    points = pd.DataFrame(
        {
            "finished": runs["finished_at"].fillna(runs["recorded_at"]),
            "when": [formatting.when(v) for v in runs["finished_at"].fillna(runs["recorded_at"])],
            label: runs[column].astype("Float64") * scale,
            "stack": _legend_labels(runs["stack_label"]),
            "whole stack": runs["stack_label"],
            "result": runs["result"],
            "run": runs["run_id"],
        }
    ).dropna(subset=[label])
    if points.empty:
        st.caption(f"No run of this model recorded {literal(label)}.")
        return
    points[label] = points[label].astype("float64")
    # In UTC and on a 24-hour clock, as the table beside it writes times.
    base = alt.Chart(points).encode(
        x=alt.X(
            "finished:T",
            title="finished (UTC)",
            scale=alt.Scale(type="utc"),
            axis=alt.Axis(format=CHART_TIME_FORMAT, labelAngle=0),
        ),
        y=alt.Y(f"{label}:Q", title=label),
    )
    stack = alt.Color("stack:N", legend=alt.Legend(labelLimit=LEGEND_PX))
    chart = base.mark_line(opacity=0.4).encode(color=stack) + base.mark_point(
        size=80, filled=True
    ).encode(
        color=stack,
        shape=alt.Shape(
            "result:N",
            scale=alt.Scale(domain=list(RESULT_CHART_COLOURS)),
        ),
        tooltip=[
            alt.Tooltip("when:N", title="finished"),
            alt.Tooltip("whole stack:N", title="stack"),
            "result:N",
            f"{label}:Q",
            "run:N",
        ],
    )
    st.altair_chart(chart, width="stretch")


def _run_details(ctx: HistoryContext, run_id: str) -> None:
    """One run's whole record, as the page's details show a matrix row."""
    from model_support.dataset import record_to_row
    from model_support.store import StoreError
    from model_support.viewer.details import run_details

    st.subheader(f"Run {literal(run_id)}")
    try:
        record = ResultsStore(ctx.results_uri).get(run_id)
    except StoreError as exc:
        st.error(f"The run's record could not be read: {literal(exc)}")
        return
    run_details(
        pd.Series(record_to_row(record)),
        traceback=record.document.traceback,
        results_uri=ctx.results_uri,
    )


# ---------------------------------------------------------------------------------------------
# Regressions


def view_regressions(ctx: HistoryContext) -> None:
    """What changed between two stacks (default: the two newest), grouped, with thresholds."""
    fingerprint = _fingerprint(ctx.results_uri)
    if fingerprint is None:
        _no_history(ctx)
        return
    infos = _stacks(ctx.results_uri, fingerprint)
    known = [info.stack for info in infos]
    try:
        older, newer = default_pair(infos)
    except StackNotFound as exc:
        st.info(literal(exc))
        return
    labels = [s.label for s in known]
    for key, default in (("before", older.label), ("after", newer.label)):
        if st.session_state.get(key) not in labels:
            st.session_state[key] = default
    left, right = st.columns(2)
    before_label = left.selectbox("Before (older stack)", labels, key="before")
    after_label = right.selectbox("After (newer stack)", labels, key="after")
    thresholds = _thresholds()
    if before_label == after_label:
        st.info("Pick two different stacks.")
        return
    before, after = known[labels.index(before_label)], known[labels.index(after_label)]
    table = prices()
    report = _report(ctx.results_uri, fingerprint, before, after, thresholds, table, ctx.task)
    cols = st.columns(4)
    cols[0].metric("regressions", len(report.regressions))
    cols[1].metric("fixes", len(report.fixes))
    cols[2].metric("compared", report.compared)
    cols[3].metric("cost of the newer stack's runs", money(report.cost_usd_after))
    st.caption(
        "A regression: a worse result (PASS to FAIL, ERROR or TIMEOUT; EXCLUDED to ERROR) or, "
        "between two PASSes, a figure past its threshold. Grouped by the error class, the "
        "verdict's failed checks or the figure."
    )
    st.subheader("Regressions")
    clicked = None
    if report.regressions:
        clicked = _change_table(report.regressions, "regressions-table")
    else:
        st.success("No regressions.")
    st.subheader("Fixes")
    if report.fixes:
        clicked = _change_table(report.fixes, "fixes-table") or clicked
    else:
        st.caption("No fixes.")
    _not_compared(report)
    _side_by_side(ctx, [*report.regressions, *report.fixes], clicked, before, after)
    # The report is made on demand: a large comparison's text costs more than the tables.
    if st.toggle("The report for a bug report (Markdown, JSON)", key="report-toggle"):
        markdown = render_markdown(report, ctx.results_uri)
        left, right = st.columns(2)
        left.download_button(
            "Download the report (Markdown)", markdown, file_name="regressions.md", key="report-md"
        )
        right.download_button(
            "Download the report (JSON)",
            render_json(report),
            file_name="regressions.json",
            mime="application/json",
            key="report-json",
        )
        st.code(markdown, language="markdown")


def _change_table(changes: list[Change], key: str) -> Change | None:
    """A table of changes, each row clickable; the clicked change, if any."""
    event = st.dataframe(
        shown_frame(regression_table(changes)),
        hide_index=True,
        placeholder=formatting.BLANK_CELL,
        key=key,
        on_select="rerun",
        selection_mode="single-row",
        column_config={"cost (USD)": st.column_config.NumberColumn(format="$%.4f")},
    )
    rows = event.selection.rows if event is not None else []
    return changes[rows[0]] if rows else None


def _not_compared(report: Report) -> None:
    """The models tested on one of the two stacks only: counted, and listed as not tested."""
    after, before = report.not_tested_after, report.not_tested_before
    if not after and not before:
        return
    st.caption(
        f"Not compared: {len(after):,} tested before only (not tested after), "
        f"{len(before):,} tested after only (not tested before)."
    )
    with st.expander(f"Tested on one stack only ({len(after) + len(before):,})"):
        rows = [{"model · task": m, "before": "tested", "after": UNTESTED} for m in after]
        rows += [{"model · task": m, "before": UNTESTED, "after": "tested"} for m in before]
        st.dataframe(
            pd.DataFrame(rows),
            hide_index=True,
            placeholder=formatting.BLANK_CELL,
            key="not-compared-table",
        )


PAIR_KEY = "pair"


def _side_by_side(
    ctx: HistoryContext, changes: list[Change], clicked: Change | None, before: Stack, after: Stack
) -> None:
    """One change, its two runs side by side: each stack's result, failed checks or error,
    wall time and decode speed, and how the figures moved."""
    if not changes:
        return
    labels = [f"{c.model} · {c.task}" for c in changes]
    if clicked is not None:
        st.session_state[PAIR_KEY] = f"{clicked.model} · {clicked.task}"
    if st.session_state.get(PAIR_KEY) not in labels:
        st.session_state.pop(PAIR_KEY, None)
    chosen = st.selectbox(
        "Before and after, side by side",
        labels,
        index=None,
        placeholder="Click a row above, or pick a model",
        key=PAIR_KEY,
    )
    if chosen is None:
        return
    change = changes[labels.index(chosen)]
    from model_support.dataset import record_to_row
    from model_support.store import ResultsStore, StoreError

    store = ResultsStore(ctx.results_uri)
    try:
        rows = [
            record_to_row(store.get(run)) for run in (change.before_run_id, change.after_run_id)
        ]
    except StoreError as exc:
        st.error(f"A run's record could not be read: {literal(exc)}")
        return
    columns = st.columns(2)
    for column, stack, row, side in zip(
        columns, (before, after), rows, ("Before", "After"), strict=True
    ):
        column.markdown(f"**{side}**: {literal(stack.label)}")
        column.markdown(side_summary(row))
    st.markdown(figure_changes(*rows))


def side_summary(row: Mapping[str, Any]) -> str:
    """One run in Markdown: its result, what failed it, wall time and decode speed."""
    result = str(row["result"])
    lines = [f":{RESULT_COLOURS.get(result, 'gray')}-background[{literal(result)}]"]
    checks = [str(c) for c in row.get("failed_checks") or []]
    if checks:
        lines.append("failed checks: " + ", ".join(inline_code(c) for c in checks))
    if row.get("error_class"):
        lines.append(f"error class {inline_code(str(row['error_class']))}")
    if row.get("error"):
        lines.append(literal(str(row["error"]).splitlines()[0][:300]))
    lines.append(f"wall time {_seconds(row.get('wall_time_s'))}")
    lines.append(f"decode {_rate(row.get('decode_tokens_per_s'))}")
    lines.append(f"run {inline_code(str(row['run_id']))}")
    return "  \n".join(lines)


def figure_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """How wall time and decode speed moved from one run to the other, in words."""
    moved = []
    for column, what in (("wall_time_s", "wall time"), ("decode_tokens_per_s", "decode tokens/s")):
        old, new = before.get(column), after.get(column)
        if isinstance(old, int | float) and isinstance(new, int | float) and old > 0:
            moved.append(f"{what} {(new - old) / old:+.0%}")
        else:
            moved.append(f"{what}: not measured on both")
    return "Change: " + " · ".join(moved)


def _seconds(value: object) -> str:
    return f"{value:,.1f} s" if isinstance(value, int | float) else formatting.MISSING


def _rate(value: object) -> str:
    return f"{value:,.1f} tokens/s" if isinstance(value, int | float) else formatting.MISSING


def _thresholds() -> Thresholds:
    """The thresholds as set on the page; a changed one needs a reason (else the defaults)."""
    defaults = Thresholds()
    with st.expander("Thresholds (between two PASSes)"):
        cols = st.columns(3)
        decode = cols[0].number_input(
            "decode tokens/s may drop by (%)", 0.0, 1000.0,
            defaults.decode_drop.value * 100, step=5.0, key="decode-drop",
            help=defaults.decode_drop.reason,
        )  # fmt: skip
        compile_ = cols[1].number_input(
            "compile time may grow by (%)", 0.0, 10000.0,
            defaults.compile_growth.value * 100, step=5.0, key="compile-growth",
            help=defaults.compile_growth.reason,
        )  # fmt: skip
        memory = cols[2].number_input(
            "peak memory may grow by (%)", 0.0, 1000.0,
            defaults.memory_growth.value * 100, step=1.0, key="memory-growth",
            help=defaults.memory_growth.reason,
        )  # fmt: skip
        reason = st.text_input("Why these values", key="threshold-reason")
    values = {
        "decode_drop": decode / 100,
        "compile_growth": compile_ / 100,
        "memory_growth": memory / 100,
    }
    changed = {k: v for k, v in values.items() if abs(v - getattr(defaults, k).value) > 1e-9}
    if not changed:
        return defaults
    if not reason.strip():
        st.warning(
            "A changed threshold needs a reason (it is printed with the report): the default "
            "thresholds are used until one is given."
        )
        return defaults
    return defaults.with_values(reason.strip(), **changed)
