"""The Compare view: what changed between two (compiler, library) version pairs, and a model's
Before and After side by side for exactly those two stacks (never the sidebar's)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from model_support.viewer import details, failures, formatting, headline, queries
from model_support.viewer.data import StackFile
from model_support.viewer.markup import literal
from model_support.viewer.views import RESULT_COLOURS, Context, read, stack_label
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


def view_compare(ctx: Context) -> Comparison | None:
    """Regressions and fixes between two (compiler, library) version pairs; None when the dataset
    has fewer than two."""
    if len(ctx.files) < 2:
        st.info(
            "Comparing needs results for at least two compiler/library version pairs; this dataset has one."
        )
        return None
    labels = [stack_label(f) for f in ctx.files]
    after_index = ctx.files.index(ctx.current) if ctx.current in ctx.files else 0
    # Compare with the next older stack; the newest one's neighbour when this is the oldest.
    before_index = after_index + 1 if after_index + 1 < len(labels) else after_index - 1
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


def _delta(after: object, before: object) -> float | None:
    if formatting.missing(after) or formatting.missing(before):
        return None
    return round(float(after) - float(before), 1)  # type: ignore[arg-type]


def _side(
    title: str, stack: StackFile, row: pd.Series | None, other: pd.Series | None, after: bool
) -> None:
    """One side: the stack, the result line, why it did not pass, wall time and tok/s (with the
    change from Before on the After side)."""
    st.markdown(f"**{title}** · {literal(stack_label(stack))}")
    if row is None:
        st.info(f"{queries.UNTESTED}: no result with this stack.")
        return
    result = str(row["result"])
    badge = f":{RESULT_COLOURS.get(result, 'gray')}-background[{literal(result)}]"
    st.markdown(headline.headline(row, badge))
    if result == Result.FAIL.value:
        checks = failures.failed_checks(row, details.json_column(row, "verification_json"))
        named = failures.checks_in_words(checks) if not checks.empty else "none named"
        st.markdown(f"**Failed checks**: {named}")
    elif result in (Result.ERROR.value, Result.TIMEOUT.value):
        error_class = row.get("error_class")
        st.markdown(
            f"**Error**: {literal(error_class if isinstance(error_class, str) else 'not classified')}"
        )
        if isinstance(row.get("error"), str) and row["error"]:
            st.code(row["error"], language=None)
    elif result == Result.EXCLUDED.value:
        failures.show_excluded(row)
    wall, rate = st.columns(2)
    compared = other if after and other is not None else None
    wall.metric(
        "wall time (compile incl.)",
        formatting.seconds(row["wall_time_s"]),
        delta=None if compared is None else _delta(row["wall_time_s"], compared["wall_time_s"]),
        delta_color="inverse",  # less time is better
    )
    rate.metric(
        "decode",
        formatting.rate(row["decode_tokens_per_s"], "tok/s"),
        delta=None
        if compared is None
        else _delta(row["decode_tokens_per_s"], compared["decode_tokens_per_s"]),
    )


def side_by_side(ctx: Context, comparison: Comparison, model_id: str) -> None:
    """The model's Before and After for the two compared stacks, side by side."""
    st.set_page_config(page_title=f"{model_id} · Compare")
    st.subheader(literal(model_id))
    before = _row(ctx, comparison.before, model_id)
    after = _row(ctx, comparison.after, model_id)
    left, right = st.columns(2)
    with left:
        _side("Before", comparison.before, before, None, after=False)
    with right:
        _side("After", comparison.after, after, before, after=True)
    st.caption(
        "Every figure, the verdict and the Reproduce steps of one side: pick its stack in the "
        "sidebar and open the All results view."
    )
