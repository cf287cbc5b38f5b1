"""The Compare view: what changed between two (compiler, library) version pairs, and a model's
Before and After side by side for exactly those two stacks (never the sidebar's)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from model_support.markdown import literal
from model_support.viewer import (
    details,
    failures,
    formatting,
    headline,
    history_views,
    output,
    queries,
)
from model_support.viewer.data import StackFile
from model_support.viewer.views import Context, read, stack_label
from model_support.vocabulary import Result

CHANGES = (
    queries.REGRESSION,
    queries.FIX,
    queries.CHANGED,
    queries.ADDED,
    queries.REMOVED,
    queries.SAME,
)
"""Every kind of change, each counted above the table (one-sided rows included)."""


@dataclass(frozen=True)
class Comparison:
    """The table of changes and the two stacks it compares."""

    table: pd.DataFrame
    before: StackFile
    after: StackFile


def default_pair(ctx: Context) -> tuple[int, int]:
    """The stacks Compare opens on, as indexes of ``ctx.files`` (before, after): the two newest,
    as the Regressions view and ``model-support regressions`` order them (by version, then by
    when each was first tested); without a history, the two newest files by version."""
    from model_support.history import Stack

    keys = [Stack(f.compiler, f.compiler_version, f.library, f.library_version) for f in ctx.files]
    newest = history_views.stack_order(ctx.results_uri)
    ranked = [keys.index(stack) for stack in newest if stack in keys]  # oldest first
    if len(ranked) >= 2:
        return ranked[-2], ranked[-1]
    return 1, 0  # files are newest first


def view_compare(ctx: Context) -> Comparison | None:
    """Regressions and fixes between two (compiler, library) version pairs; None when the dataset
    has fewer than two."""
    if len(ctx.files) < 2:
        st.info(
            "Comparing needs results for at least two compiler/library version pairs; this dataset has one."
        )
        return None
    labels = [stack_label(f) for f in ctx.files]
    before_index, after_index = default_pair(ctx)
    left, right = st.columns(2)
    before_label = left.selectbox("Before", labels, index=before_index, key="before")
    after_label = right.selectbox("After", labels, index=after_index, key="after")
    before = ctx.files[labels.index(before_label)]
    after = ctx.files[labels.index(after_label)]
    table = queries.compare(
        queries.search(
            queries.with_task(read(ctx, [before], queries.COMPARE_COLUMNS), ctx.task), ctx.search
        ),
        queries.search(
            queries.with_task(read(ctx, [after], queries.COMPARE_COLUMNS), ctx.task), ctx.search
        ),
    )
    counts = table["change"].value_counts()
    for col, name in zip(st.columns(len(CHANGES)), CHANGES, strict=True):
        col.metric(name, f"{int(counts.get(name, 0)):,}")
    # A model tested with one stack only: its other side says so rather than staying blank.
    table = table.fillna({"before": queries.UNTESTED, "after": queries.UNTESTED})
    if not st.checkbox("Show unchanged models", key="show-same"):
        table = table[table["change"] != queries.SAME]
    return Comparison(table.reset_index(drop=True), before, after)


def _row(ctx: Context, stack: StackFile, model_id: str) -> pd.Series | None:
    """The model's latest row on ``stack`` (of the task filter when it has one), if any."""
    rows = read(ctx, [stack], queries.DETAIL_COLUMNS, model_id=model_id)
    if ctx.task and not rows.empty:
        rows = queries.with_task(rows, ctx.task)
    if rows.empty:
        return None
    return rows.sort_values("recorded_at", kind="stable").iloc[-1]


def _delta(after: object, before: object, unit: str) -> str | None:
    """The change from Before to After with its unit (``+1.2 s``); None when either is
    missing."""
    if formatting.missing(after) or formatting.missing(before):
        return None
    change = round(float(after) - float(before), 1)  # type: ignore[arg-type]
    return f"{change:+,.1f} {unit}" if change else None


def _cores_delta(after: object, before: object) -> str | None:
    if formatting.missing(after) or formatting.missing(before):
        return None
    change = int(after) - int(before)  # type: ignore[call-overload]
    return f"{change:+,} cores" if change else None


def _gib_delta(after: object, before: object) -> str | None:
    if formatting.missing(after) or formatting.missing(before):
        return None
    change = round((int(after) - int(before)) / 2**30, 2)  # type: ignore[call-overload]
    return f"{change:+,.2f} GiB" if change else None


def _side(
    ctx: Context,
    title: str,
    stack: StackFile,
    row: pd.Series | None,
    other: pd.Series | None,
) -> None:
    """One side: the stack, the answer (result and its sentence) and the facts, why it did
    not pass, cores, wall time, decode speed and peak memory (on the After side with the
    change from Before, in their units), what it produced, and how to reproduce it."""
    st.markdown(f"**{title}** · {literal(stack_label(stack))}")
    if row is None:
        st.info(f"{queries.UNTESTED}: no result with this stack.")
        return
    verification = details.json_column(row, "verification_json")
    details.show_answer(row, verification)
    st.caption(headline.facts(row))
    result = str(row["result"])
    if result == Result.FAIL.value:
        checks = failures.failed_checks(row, verification)
        named = failures.checks_in_words(checks) if not checks.empty else "none named"
        st.markdown(f"**Failed checks**: {named}")
    cores, wall = st.columns(2)
    rate, memory = st.columns(2)
    cores.metric(
        "cores",
        formatting.count(row["neuron_cores"]),
        delta=None if other is None else _cores_delta(row["neuron_cores"], other["neuron_cores"]),
        delta_color="off",
    )
    wall.metric(
        "wall time (compile incl.)",
        formatting.seconds(row["wall_time_s"]),
        delta=None if other is None else _delta(row["wall_time_s"], other["wall_time_s"], "s"),
        delta_color="inverse",  # less time is better
    )
    rate.metric(
        "decode",
        formatting.rate(row["decode_tokens_per_s"], "tok/s"),
        delta=None
        if other is None
        else _delta(row["decode_tokens_per_s"], other["decode_tokens_per_s"], "tok/s"),
    )
    memory.metric(
        "peak device memory",
        formatting.gib(row["peak_device_memory_bytes"]),
        delta=None
        if other is None
        else _gib_delta(row["peak_device_memory_bytes"], other["peak_device_memory_bytes"]),
        delta_color="inverse",  # less memory is better
    )
    output.show_output(row, verification=verification)
    from model_support.reproduce import NotReproducible, plain_row, recipe

    st.markdown("**Reproduce**")
    try:
        made = recipe(plain_row(row.to_dict()))
    except NotReproducible as exc:
        st.caption(literal(exc))
        return
    lines, replace = details.all_at_once(row, made, ctx.results_uri)
    st.code(lines, language="bash")
    if replace:
        st.caption(literal(replace))


def side_by_side(ctx: Context, comparison: Comparison, model_id: str) -> None:
    """The model's Before and After for the two compared stacks, side by side."""
    st.set_page_config(page_title=f"{model_id} · Compare")
    st.subheader(literal(model_id))
    before = _row(ctx, comparison.before, model_id)
    after = _row(ctx, comparison.after, model_id)
    left, right = st.columns(2)
    with left:
        _side(ctx, "Before", comparison.before, before, None)
    with right:
        _side(ctx, "After", comparison.after, after, before)
    st.caption(
        "Every figure, the verdict and the Reproduce steps of one side: pick its stack in the "
        "sidebar and open the All results view."
    )
