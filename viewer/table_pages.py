"""A results table a page at a time: the rows on screen, the page controls, the sort of all rows.

A table of 100,000 rows sent whole to the browser is a 5 MB message on every first page, and
Streamlit serializes and hashes it again on every rerun (a row click among them). A table of
more than ``PAGE_ROWS`` rows is therefore shown a page at a time: the page's rows only, with
their place in the whole ("rows 1–500 of 100,000"), a page number, and a sort of all rows done
here (the browser's column headers can only sort the rows it holds). Search and the task filter
narrow the whole table before it is paged, so every row stays reachable.

The page follows the page's model: a link, Back or Forward, or the picker naming a model on
another page turns to that page, so the highlighted row is on screen.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

PAGE_ROWS = 500
"""Rows per page: a page's message is some 30 kB; the table shows about 16 rows at a time."""
AS_LISTED = "(as listed)"
"""The sort choice that keeps the view's own order."""


@dataclass(frozen=True)
class TablePage:
    """The rows on screen and where they lie in the whole table."""

    rows: pd.DataFrame
    """The page's rows, index reset (a selection's row numbers count from the page's top)."""
    start: int
    """The position of the page's first row in the (sorted) whole table."""
    total: int


def page_count(total: int, size: int = PAGE_ROWS) -> int:
    """How many pages ``total`` rows fill (one, even when empty)."""
    return max(1, -(-total // size))


def rows_caption(start: int, stop: int, total: int) -> str:
    """Where the shown rows lie: ``rows 1–500 of 100,000``, or ``7 rows`` when all are shown."""
    if start == 0 and stop == total:
        return f"{total:,} row{'' if total == 1 else 's'}"
    return f"rows {start + 1:,}–{stop:,} of {total:,}"


def sorted_table(table: pd.DataFrame, column: str | None, descending: bool) -> pd.DataFrame:
    """``table`` sorted by ``column`` (stable, missing values last); as it is for None."""
    if column is None or column not in table.columns:
        return table
    return table.sort_values(
        column, ascending=not descending, kind="stable", na_position="last"
    ).reset_index(drop=True)


def turned_page(models: pd.Series, model: str | None, current: int) -> int | None:
    """The page that shows ``model``: ``current`` when one of its rows is on it (a model may
    have a row per task), else the page of its first row; None when it has no row."""
    if not model:
        return None
    pages = (models.to_numpy() == model).nonzero()[0] // PAGE_ROWS + 1
    if not len(pages):
        return None
    return current if current in pages else int(pages[0])


def show_page(table: pd.DataFrame, key: str, model: str | None) -> TablePage:
    """The page of ``table`` to show under the widget key ``key``: all of it when it fits on
    one page; else the sort and page controls, drawn here, and the chosen page's rows.

    ``model`` is the page's model: when it changed since this table was last drawn (a link,
    Back or Forward, the picker), the page turns to show its row; when only the table changed
    (another search, task or sort), to the first page.
    """
    total = len(table)
    if total <= PAGE_ROWS:
        return TablePage(rows=table, start=0, total=total)
    page_key, model_key, table_key = f"{key}-page", f"{key}-model", f"{key}-rows"
    left, middle, right = st.columns([3, 1, 2], vertical_alignment="bottom")
    column = left.selectbox(
        "Sort all rows by",
        [AS_LISTED, *map(str, table.columns)],
        key=f"{key}-sort",
        help="The table's column headers sort only the rows on this page.",
    )
    descending = middle.toggle("descending", key=f"{key}-descending")
    table = sorted_table(table, None if column == AS_LISTED else column, descending)
    models = table["model"].astype(str)
    pages = page_count(total)
    current = int(st.session_state.get(page_key, 1))
    rows = (total, str(models.iloc[0]), str(models.iloc[-1]))  # cheap: a new filter or sort
    if st.session_state.get(table_key) != rows:
        current = 1  # another search, task or sort: its first rows
    if page_key not in st.session_state or st.session_state.get(model_key) != model:
        # A first draw (or one back from another view), a link, Back or Forward, the picker:
        # the page shows the model's row, so its highlight is on screen.
        current = turned_page(models, model, current) or current
    st.session_state[model_key], st.session_state[table_key] = model, rows
    st.session_state[page_key] = current if 1 <= current <= pages else 1
    page = int(
        right.number_input(f"Page (of {pages:,})", min_value=1, max_value=pages, key=page_key)
    )
    start = (page - 1) * PAGE_ROWS
    return TablePage(
        rows=table.iloc[start : start + PAGE_ROWS].reset_index(drop=True), start=start, total=total
    )
