"""The page's parts: one function per view, plus the model details panel.

Each function draws into the current Streamlit container from a :class:`Context` holding the
chosen results location, stack and filters. Data comes through the cached readers in this module
(keyed by file path + fingerprint, so a rematerialized file is read again).
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from model_support.markdown import inline_code, literal
from model_support.selection import SelectionError, load_selected
from model_support.viewer import formatting, queries, table_pages
from model_support.viewer.data import (
    StackFile,
    UnreadableFile,
    ViewerDataError,
    list_stack_files,
    read_columns_reporting,
    unlisted_data_files,
)
from model_support.viewer.markup import shown_frame
from model_support.vocabulary import Result, Task

if TYPE_CHECKING:
    from streamlit.elements.lib.column_types import ColumnConfig

    # Imported where used: the Hub client and altair cost a second or two of a fresh server's
    # first page, and only the ranking and chart views need them.
    from model_support.ranking_snapshots import RankingSnapshot
    from model_support.rankings import RankingResult, RankingSort

RANKING_TTL_S = 900
FILE_LIST_TTL_S = 30
MAX_DETAIL_OPTIONS = 2000
"""The details picker lists at most this many models of the current table (search narrows it)."""
RESULT_COLOURS = {
    Result.PASS.value: "green",
    Result.FAIL.value: "red",
    Result.ERROR.value: "orange",
    Result.TIMEOUT.value: "violet",
    Result.EXCLUDED.value: "gray",
    Result.UNVERIFIED.value: "blue",
}
"""Streamlit's badge colour per result (every result has one: a test checks it)."""
RESULT_CHART_COLOURS = {
    Result.PASS.value: "#21a366",
    Result.FAIL.value: "#e0474c",
    Result.ERROR.value: "#f28e2b",
    Result.TIMEOUT.value: "#9467bd",
    Result.EXCLUDED.value: "#9a9a9a",
    Result.UNVERIFIED.value: "#4c78a8",
}
"""The same results' colours in charts (hex: altair needs exact colours)."""
TASKS = [t.value for t in Task]


@dataclass(frozen=True)
class Context:
    """What every view needs: where the results are, which stack file, the filters."""

    results_uri: str
    files: tuple[StackFile, ...]
    current: StackFile | None
    search: str
    task: str | None
    hub_endpoint: str | None

    @property
    def hub_url(self) -> str:
        """Where the Hub's model pages are: the configured endpoint, else the Hub client's."""
        from huggingface_hub import constants

        return self.hub_endpoint or constants.ENDPOINT


# ---------------------------------------------------------------------------------------------
# Cached readers


@st.cache_data(ttl=FILE_LIST_TTL_S, show_spinner=False)
def stack_files(results_uri: str) -> tuple[list[StackFile], list[UnreadableFile]]:
    """The dataset's matrix files, and the Parquet files under data/ that are not readable
    matrix files (re-listed at most every FILE_LIST_TTL_S seconds)."""
    files = list_stack_files(results_uri)
    return files, unlisted_data_files(results_uri, files)


def cache_key(files: tuple[StackFile, ...] | list[StackFile]) -> tuple[tuple[str, str], ...]:
    """How the cached readers name ``files``: each one's path and fingerprint (a rematerialized
    file is a new key, read again)."""
    return tuple((f.path, f.fingerprint) for f in files)


# A resource cache (no copy on each use, unlike cache_data): frames are never modified in place
# (pandas copy-on-write), and copying 100k rows on every rerun cost more than the rest.
@st.cache_resource(show_spinner=False, max_entries=64)
def _read(
    results_uri: str,
    files: tuple[tuple[str, str], ...],
    columns: tuple[str, ...],
    model_id: str | None,
) -> tuple[pd.DataFrame, list[UnreadableFile]]:
    # ``files`` carries (path, fingerprint): a changed file is a new cache key.
    return read_columns_reporting(
        results_uri, [path for path, _ in files], columns, model_id=model_id
    )


REPORTED_KEY = "_reported-files"
"""Session state: the unreadable files already reported in this run of the page."""


def report_unreadable(unreadable: list[UnreadableFile]) -> None:
    """One warning per unreadable file per run of the page: what it is, why, and what to do."""
    reported: set[str] = st.session_state.setdefault(REPORTED_KEY, set())
    for bad in unreadable:
        if bad.path in reported:
            continue
        reported.add(bad.path)
        st.warning(
            f"Left out {inline_code(bad.path)}: {literal(bad.reason)}. The other files are "
            "shown; rebuild the matrix from the records with "
            "`model-support dataset materialize --rebuild`."
        )


def read(
    ctx: Context,
    files: tuple[StackFile, ...] | list[StackFile],
    columns: tuple[str, ...],
    model_id: str | None = None,
) -> pd.DataFrame:
    """Only ``columns`` of ``files`` (cached by path + fingerprint); a file that cannot be read
    is left out and reported."""
    frame, unreadable = _read(ctx.results_uri, cache_key(files), columns, model_id)
    report_unreadable(unreadable)
    return frame


def current_frame(ctx: Context, columns: tuple[str, ...]) -> pd.DataFrame:
    """The current stack's rows, restricted to the task filter and the search box."""
    frame = read(ctx, [ctx.current] if ctx.current else [], columns)
    return queries.search(queries.with_task(frame, ctx.task), ctx.search)


@st.cache_data(ttl=RANKING_TTL_S, show_spinner="Fetching the Hub ranking…")
def ranking(
    results_uri: str,
    task: str,
    sort: RankingSort,
    limit: int,
    endpoint: str | None,
    unreachable: str | None = None,
) -> RankingResult:
    """The Hub ranking (live, else the stored snapshot), cached for RANKING_TTL_S seconds.

    ``unreachable``: the Hub already failed for another task: read only the snapshot.
    """
    from model_support.rankings import get_ranking

    return get_ranking(
        results_uri, task, sort, limit=limit, endpoint=endpoint, unreachable=unreachable
    )


@st.cache_data(ttl=RANKING_TTL_S, show_spinner=False)
def sweep_snapshot(results_uri: str, task: str) -> RankingSnapshot | None:
    """The newest ranking a sweep tested ``task`` models from (rankings/snapshots/), if any."""
    from model_support.store import ResultsStore

    return ResultsStore(results_uri).latest_ranking_snapshot(task)


def show_sweep(ctx: Context, task: str, frame: pd.DataFrame, *, heading: bool = False) -> None:
    """What the last sweep of ``task`` ranked, when, and how much of it this stack has.

    ``heading``: the task has no Hub ranking to show, so its heading is written here (only when
    a sweep ranked it).
    """
    from model_support.store import StoreError

    try:
        swept = sweep_snapshot(ctx.results_uri, task)
    except StoreError as exc:
        st.warning(f"The sweeps' ranking snapshots could not be read: {literal(exc)}")
        return
    if swept is None:
        return
    if heading:
        st.subheader(literal(task))
    taken = swept.taken_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    tested = set(frame["model_id"]) if "model_id" in frame.columns else set()
    done = sum(1 for model in swept.models if model in tested)
    who = f"Sweep {literal(swept.sweep)}" if swept.sweep else "A sweep"
    st.caption(
        f"{who} ranked {len(swept.models)} models ({literal(swept.source)}) on {taken}; "
        f"{done} of them have a result on this stack."
    )


# ---------------------------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class NumberColumn:
    """How a table writes one number column: a short header (the lists' columns are sized to
    what they hold), the full name and unit in its help, and a format."""

    label: str
    help: str
    format: str = "localized"  # the reader's thousands separators


NUMBER_COLUMNS: dict[str, NumberColumn] = {
    "cores": NumberColumn(
        "cores", "NeuronCores it ran on; for a model too large to run, the cores it would need"
    ),
    "wall time (s)": NumberColumn("wall (s)", "Wall time: load + compile + generate, in seconds"),
    "compile time (s)": NumberColumn("compile (s)", "Compile time, in seconds"),
    "decode (tok/s)": NumberColumn("tok/s", "Decode speed: generated tokens per second"),
    "peak device memory (GiB)": NumberColumn("mem (GiB)", "Peak device memory, in GiB"),
    "wall time before (s)": NumberColumn("wall before (s)", "Wall time on the Before stack"),
    "wall time after (s)": NumberColumn("wall after (s)", "Wall time on the After stack"),
    "downloads": NumberColumn("downloads", "Downloads on the Hub in the last 30 days"),
    "trending score": NumberColumn("trending", "The Hub's trending score"),
    "parameters": NumberColumn(
        "parameters", "Parameter count (k: thousand, M: million, B: billion)", "compact"
    ),
}
"""The number columns of the lists by column name (the data keeps the long names)."""

HUB_COLUMN = "Hub"
"""The lists' last column: a link to the model's page on the Hub."""


BADGE_ALPHA = "66"
"""The opacity of a table's result badge (hex: 40%): the theme's own colours are too pale."""


def result_column(label: str = "result") -> ColumnConfig:
    """A column of results drawn as badges in the charts' colours, tinted so their names read
    in dark text ("not tested" grey); its values stay the results' names (Streamlit draws a
    read-only multiselect column's text as badges)."""
    tinted = [f"{colour}{BADGE_ALPHA}" for colour in RESULT_CHART_COLOURS.values()]
    return st.column_config.MultiselectColumn(
        label,
        options=[*RESULT_CHART_COLOURS, queries.UNTESTED],
        color=[*tinted, f"{RESULT_CHART_COLOURS[Result.EXCLUDED.value]}{BADGE_ALPHA}"],
        width=95,
    )


CELL_PADDING_PX, MAX_TEXT_PX = 18, 360
"""A text column's room around its text (the grid's 8 pixels a side, and 2 to spare), and its widest
width (a longer value is cut, and shown whole in the cell's tooltip and the details)."""

GRID_FONT = '14px "Source Sans"'
"""The font Streamlit's grid draws its cells in."""

# The advance widths of ASCII 32 (space) to 126 (~) in GRID_FONT, in tenths of a pixel rounded
# up, as Chromium measures them (the browser test measures them again): a text column as wide
# as its longest value needs, so neither cut nor padded by a rule of thumb.
ASCII_TENTHS_PX = (
    "28 41 60 70 70 116 86 35 43 43 59 70 35 44 35 49 70 70 70 70 70 70 70 70 70 70 35 35 70 "
    "70 70 60 119 77 83 80 87 74 70 87 92 37 68 82 69 102 91 93 80 93 80 75 76 91 73 111 72 "
    "67 76 43 49 43 70 70 76 71 78 64 78 70 41 71 77 35 35 70 36 117 77 76 78 78 49 59 48 77 "
    "66 101 63 66 60 43 34 43 70"
)
GLYPH_PX = {chr(32 + i): int(tenths) / 10 for i, tenths in enumerate(ASCII_TENTHS_PX.split())}
WIDE_GLYPH_PX = 14.0
"""A glyph beyond ASCII, at its widest (a CJK glyph fills the 14-pixel em)."""


def text_px(text: str) -> float:
    """The width of ``text`` in pixels in the grid's font (a glyph beyond ASCII at its
    widest)."""
    return sum(GLYPH_PX.get(char, WIDE_GLYPH_PX) for char in text)


ELLIPSIS = "…"


def _cut(text: str, max_px: float) -> str:
    """``text`` cut at its end, with an ellipsis, to ``max_px`` (whole when it fits)."""
    if text_px(text) <= max_px:
        return text
    while text and text_px(text + ELLIPSIS) > max_px:
        text = text[:-1]
    return text.rstrip() + ELLIPSIS


def short_label(label: str, max_px: float) -> str:
    """A stack's label (``compiler version``) shortened to ``max_px`` in the grid's font so
    two labels stay apart: whole when it fits; else a compile backend given as a Python
    function (``package.module:function``) by its function's name, then the version's local
    part (``+82129205``, a build) cut, then the name cut; the version's public part is kept."""
    if text_px(label) <= max_px:
        return label
    name, _, version = label.rpartition(" ")
    if not name:
        return _cut(label, max_px)
    if ":" in name:
        name = name.rpartition(":")[2]
    shorter = f"{name} {version}"
    if text_px(shorter) <= max_px:
        return shorter
    public, plus, build = version.partition("+")
    if build:
        room = max_px - text_px(f"{name} {public}+")
        version = public + plus + _cut(build, room) if room >= text_px(ELLIPSIS) else public
        shorter = f"{name} {version}"
        if text_px(shorter) <= max_px:
            return shorter
    return f"{_cut(name, max_px - text_px(' ' + version))} {version}"


def short_stack_label(label: str, max_px: float) -> str:
    """A stack's whole label (``compiler version · library version``) within ``max_px``: its
    compiler shortened as ``short_label`` does, the library kept."""
    compiler, sep, library = label.partition(" · ")
    if not sep or text_px(label) <= max_px:
        return short_label(label, max_px)
    return f"{short_label(compiler, max_px - text_px(sep + library))}{sep}{library}"


def text_width(values: pd.Series | None) -> int | None:
    """The pixels a text column needs to show its longest value whole (Streamlit's automatic
    width follows the header, which cut "too-large" to "too-larg"); None for no column."""
    if values is None:
        return None
    widest = max((text_px(value) for value in values.dropna().astype(str).unique()), default=0)
    return min(round(CELL_PADDING_PX + widest), MAX_TEXT_PX)


def table_config(table: pd.DataFrame) -> dict[str, ColumnConfig]:
    """The column configuration of a results table: result badges, Hub links, widths, number
    formats and help."""
    config: dict[str, ColumnConfig] = {
        # Pinned: a list wider than the window scrolls sideways under the model's name.
        "model": st.column_config.TextColumn(
            "model", pinned=True, width=text_width(table.get("model"))
        ),
        "task": st.column_config.TextColumn("task", width=text_width(table.get("task"))),
        "result": result_column(),
        "why": st.column_config.TextColumn(
            "why",
            help="The failed checks of a FAIL, the class of an ERROR, the reason of an EXCLUDED",
            width=text_width(table.get("why")),
        ),
        HUB_COLUMN: st.column_config.LinkColumn(
            HUB_COLUMN, display_text="open ↗", width=60, help="The model's page on the Hub"
        ),
    }
    for name, column in NUMBER_COLUMNS.items():
        if name in table.columns:
            config[name] = st.column_config.NumberColumn(
                column.label,
                help=column.help,
                format=column.format,  # type: ignore[arg-type]
            )
    return config


def _pick_row(key: str, models: pd.Series) -> None:
    """A table's row was ticked or unticked (the selection's callback, run before the script):
    the page's model becomes that row's model, or none, so the details and the URL follow."""
    rows = _selected_rows(key)
    st.session_state["model"] = str(models.iloc[rows[0]]) if rows else None


def _selected_rows(key: str) -> list[int]:
    """The rows ticked in the table with ``key`` (its selection state), none before any."""
    state = st.session_state.get(key)
    return list(state["selection"]["rows"]) if state is not None else []


def selection_rows(models: pd.Series, model: str | None) -> list[int]:
    """The table rows to highlight: the first row of ``model`` (the details shown), or none."""
    if not model:
        return []
    matches = (models.to_numpy() == model).nonzero()[0]
    return [int(matches[0])] if len(matches) else []


ALWAYS_SHOWN = ("model", "result")
"""The list columns shown even when empty on a page (the other empty ones are left out)."""


def without_empty_columns(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` less the columns with no value in any row (a ranking without parameter counts,
    the "why" of a page that all passed, Hub links for models tested from local paths): at 1280
    pixels a list has no room for blank ones."""
    empty = [name for name in table.columns if name not in ALWAYS_SHOWN and _empty(table[name])]
    return table.drop(columns=empty)


def _empty(column: pd.Series) -> bool:
    """Whether ``column`` has no value: each is missing or empty text (the first value that is
    neither decides, without turning the column to text)."""
    return all(isinstance(value, str) and value == "" for value in column.dropna())


def hub_links(rows: pd.DataFrame, hub_url: str) -> list[str | None]:
    """Each row's model page on the Hub at ``hub_url``; None for a model tested from a local
    checkpoint (``queries.LOCAL``: the demo's, named ``demo/<name>``, are no Hub repositories)."""
    local = (
        rows[queries.LOCAL].fillna(False).astype(bool).tolist()
        if queries.LOCAL in rows.columns
        else [False] * len(rows)
    )
    return [
        None if is_local else formatting.hub_page(model, hub_url)
        for model, is_local in zip(rows["model"].astype(str), local, strict=True)
    ]


TABLE_MAX_PX = 600
"""A list's height at most: 16 rows under its header (the page scrolls past it below)."""


def show_table(table: pd.DataFrame, key: str, hub_url: str) -> None:
    """Draw a results table with row selection (blanks where a value is missing, the page of
    each model from the Hub linked at ``hub_url``); a table of more than
    ``table_pages.PAGE_ROWS`` rows a page at a time, which of its rows are shown and the page
    controls under it, columns empty on the page left out; nothing for no rows (the view says
    why). Ticking a row shows its model's details; the highlighted row is always the page's
    model (its details, named in the URL) or none: a link, Back and Forward, the picker or
    another table change the model, and the selection (and the page) follow it."""
    if table.empty:
        return
    model = st.session_state.get("model")
    holder = st.container()  # the table first, its page controls under it
    page = table_pages.show_page(table, key, model)
    rows = shown_frame(page.rows).assign(**{HUB_COLUMN: hub_links(page.rows, hub_url)})
    table = without_empty_columns(rows.drop(columns=[queries.LOCAL], errors="ignore"))
    config = table_config(table)
    models = table["model"].astype(str).reset_index(drop=True)
    wanted = selection_rows(models, model)
    if _selected_rows(key) != wanted:
        st.session_state[key] = {"selection": {"rows": wanted, "columns": [], "cells": []}}
    with holder:
        st.dataframe(
            table,
            hide_index=True,
            placeholder=formatting.BLANK_CELL,
            column_config=config,
            on_select=functools.partial(_pick_row, key, models),
            selection_mode="single-row",
            key=key,
            height=min(38 + 35 * len(table), TABLE_MAX_PX),
        )
        if page.total > len(table):
            st.caption(table_pages.rows_caption(page.start, page.start + len(table), page.total))


COUNTED = (Result.PASS.value, Result.FAIL.value, Result.ERROR.value, Result.EXCLUDED.value)
"""The results a list's counts always show, none or not; the others only when present."""


def state_counts(results: pd.Series) -> dict[str, int]:
    """How many rows hold each result (and "not tested"), in the order the counts show them."""
    counts = results.value_counts()
    every = [*COUNTED, *(r.value for r in Result if r.value not in COUNTED), queries.UNTESTED]
    return {state: int(counts.get(state, 0)) for state in every}


def counts_badges(counts: dict[str, int]) -> str:
    """The counts as one line of Markdown badges in the results' colours (``PASS 9``,
    ``FAIL 1``): the four main results always, the others when present."""
    return " ".join(
        f":{RESULT_COLOURS.get(state, 'gray')}-badge[{state} {count:,}]"
        for state, count in counts.items()
        if count or state in COUNTED
    )


def view_selected(ctx: Context) -> pd.DataFrame:
    """The curated list with each model's result on the current stack."""
    try:
        selected, where = load_selected(ctx.results_uri)
    except (ViewerDataError, SelectionError) as exc:
        st.error(literal(exc))
        return pd.DataFrame(columns=["model"])
    if selected is None:
        st.info(
            f"No selected list in this dataset (looked for {inline_code(where)}). Add one with entries such as "
            "`- model: Qwen/Qwen3-0.6B` / `task: text-generation` (and `reason:` for a model left out on purpose)."
        )
        return pd.DataFrame(columns=["model"])
    frame = read(ctx, [ctx.current] if ctx.current else [], queries.LIST_COLUMNS)
    table = queries.selected_table(selected.rows(), frame)
    if ctx.task:
        table = table[table["task"] == ctx.task]
    if ctx.search:
        table = table[table["model"].str.contains(ctx.search.strip(), case=False, regex=False)]
    shown = (
        formatting.plural(table["model"].nunique(), "model")
        if ctx.task or ctx.search
        else formatting.plural(len(selected.models), "model")
    )
    # The file's name (its whole path in the sidebar's location): the counts fit the line.
    lead = f"The curated list kept with the dataset ({inline_code(where.rsplit('/', 1)[-1])}): **{shown}**"
    st.markdown(f"{lead} {counts_badges(state_counts(table['result']))}" if len(table) else lead)
    return table.reset_index(drop=True)


def view_all(ctx: Context) -> pd.DataFrame:
    """Every result on the current stack, its counts above it."""
    files = (ctx.current,) if ctx.current else ()
    table, models, counts, unreadable = _all_results(
        ctx.results_uri, cache_key(files), ctx.task, ctx.search
    )
    report_unreadable(unreadable)
    if len(table):
        st.markdown(
            f"**{formatting.plural(len(table), 'result')}** of "
            f"{formatting.plural(models, 'model')}: {counts_badges(counts)}"
        )
    return table


def detail_options(table: pd.DataFrame | None) -> list[str]:
    """The details picker's models: the table's, in its order, at most MAX_DETAIL_OPTIONS."""
    if table is None:
        return []
    return [str(m) for m in pd.unique(table["model"])[:MAX_DETAIL_OPTIONS]]


# Kept as a resource (not copied on each use) for the reason _read is: every rerun of the page
# (a row click, a page turn) would otherwise rebuild the table of 100,000 rows (a tenth of a
# second). The key is _read's (path + fingerprint per file) and the filters; a few entries only,
# as each search typed is one and a table of 100,000 rows holds some 10 MB.
@st.cache_resource(show_spinner=False, max_entries=8)
def _all_results(
    results_uri: str, files: tuple[tuple[str, str], ...], task: str | None, search: str
) -> tuple[pd.DataFrame, int, dict[str, int], list[UnreadableFile]]:
    """The All results view's table, its number of models and its counts per result, and the
    files left out (pure: no drawing)."""
    frame, unreadable = _read(results_uri, files, queries.LIST_COLUMNS, None)
    frame = queries.search(queries.with_task(frame, task), search)
    table = queries.results_table(frame)
    return table, int(frame["model_id"].nunique()), state_counts(table["result"]), unreadable


def view_ranking(ctx: Context, sort: RankingSort) -> pd.DataFrame:
    """The Hub's ranking per task beside our results (tested or not, excluded with the reason)."""
    from model_support.rankings import DEFAULT_LIMIT

    frame = read(ctx, [ctx.current] if ctx.current else [], queries.LIST_COLUMNS)
    tables = []
    unreachable: str | None = None  # once the Hub fails, the other tasks read their snapshots
    missing: list[tuple[str, RankingResult]] = []
    warned: set[str] = set()  # the endpoints other than the Hub already named on this page
    for task in [ctx.task] if ctx.task else TASKS:
        result = ranking(ctx.results_uri, task, sort, DEFAULT_LIMIT, ctx.hub_endpoint, unreachable)
        if result.source != "live" and result.live_error:
            unreachable = unreachable or result.live_error
        if result.ranking is None:
            missing.append((task, result))
            show_sweep(ctx, task, frame, heading=True)
            continue
        st.subheader(literal(task))
        show_sweep(ctx, task, frame)
        say_origin(result, warned)
        warned.add(result.ranking.endpoint)
        table = queries.ranking_table(result.ranking, frame)
        if table.empty:
            st.caption(f"The Hub ranks no {literal(task)} models.")
            continue
        if ctx.search.strip():
            table = table[table["model"].str.contains(ctx.search.strip(), case=False, regex=False)]
            if table.empty:
                st.caption(f"No model of this ranking matches {inline_code(ctx.search.strip())}.")
                continue
        tested = int((table["result"] != queries.UNTESTED).sum())
        st.caption(f"{tested:,} of {formatting.plural(len(table), 'model')} tested on this stack.")
        tables.append(table)
        show_table(table.reset_index(drop=True), key=f"table-{sort}-{task}", hub_url=ctx.hub_url)
    if missing:
        # One warning for every task without a ranking (the Hub's reason is the same for all).
        first = missing[0][1]
        st.warning(
            f"No ranking of {literal(', '.join(task for task, _ in missing))} models: the Hub "
            f"could not be reached ({literal(unreachable or first.live_error)}) and there is no "
            f"stored ranking ({literal(first.snapshot_error)}"
            f"{'; likewise for the others' if len(missing) > 1 else ''})."
        )
        for task, _ in missing:
            table = tested_instead_of_ranking(ctx, task, frame, sort)
            if table is not None:
                tables.append(table)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["model"])


PUBLIC_HUB = "https://huggingface.co"
"""The Hugging Face Hub: a ranking from any other endpoint (a mirror, a test's stand-in) says so."""


def say_origin(result: RankingResult, warned: set[str] | frozenset[str] = frozenset()) -> None:
    """Where a ranking came from and when: live from the Hub, or the one stored with the
    dataset (how old); one from another endpoint than the Hugging Face Hub names that endpoint
    and says its models and scores are that server's, not the Hub's (a live one once a page:
    ``warned`` holds the endpoints already named)."""
    from model_support.rankings import format_age

    ranking = result.ranking
    assert ranking is not None
    fetched = ranking.fetched_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    elsewhere = ranking.endpoint.rstrip("/") != PUBLIC_HUB
    source = (
        f"{inline_code(ranking.endpoint)}, not the Hugging Face Hub ({PUBLIC_HUB}): its models "
        "and scores are that server's"
        if elsewhere
        else "the Hub"
    )
    if result.source == "snapshot":
        st.warning(
            f"The Hub could not be reached; showing the ranking stored with the dataset, "
            f"{format_age(ranking.age())} old (fetched {fetched} from {source})."
        )
    elif elsewhere and ranking.endpoint not in warned:
        st.warning(f"Live from {source}; fetched {fetched}.")
    else:
        st.caption(f"Live from {inline_code(ranking.endpoint)}, fetched {fetched}.")


def tested_instead_of_ranking(
    ctx: Context, task: str, frame: pd.DataFrame, sort: RankingSort
) -> pd.DataFrame | None:
    """With no ranking of ``task`` (Hub unreachable, none stored): the task's models tested on
    this stack, said to be that and not a ranking; None when it has none."""
    tested = queries.search(queries.with_task(frame, task), ctx.search)
    if tested.empty:
        return None
    table = queries.results_table(tested)
    what = "trending" if sort == "trending_score" else "most downloaded"
    st.subheader(literal(task))
    st.info(
        f"Not the Hub's {what} {literal(task)} models: the Hub could not be reached and no "
        f"ranking is stored, so these are the {len(table):,} {literal(task)} model"
        f"{'' if len(table) == 1 else 's'} tested on this stack."
    )
    show_table(table, key=f"table-{sort}-{task}-tested", hub_url=ctx.hub_url)
    return table


def view_triage(ctx: Context) -> pd.DataFrame:
    """Failures grouped by normalized error signature, largest groups first."""
    frame = current_frame(ctx, queries.TRIAGE_COLUMNS)
    groups = queries.triage(frame)
    st.caption(
        "Failures (FAIL, ERROR, TIMEOUT) grouped by the first line of their error (for a FAIL, the "
        "kind of its first diverging module when it was found, else the verdict's reason) with "
        "numbers, addresses, paths and quoted names stripped."
    )
    if groups.empty:
        st.success("No failures on this stack.")
        return pd.DataFrame(columns=["model"])
    st.caption(
        f"{formatting.plural(len(groups), 'group')} of "
        f"{formatting.plural(int(groups['count'].sum()), 'failure')}"
    )
    event = st.dataframe(
        shown_frame(groups),
        hide_index=True,
        placeholder=formatting.BLANK_CELL,
        column_config={
            "signature": st.column_config.TextColumn(width="large"),
            "example": st.column_config.TextColumn(width="medium"),
        },
        on_select="rerun",
        selection_mode="single-row",
        key="triage-table",
    )
    rows = event.selection.rows if event is not None else []
    clicked = str(groups.iloc[rows[0]]["signature"]) if rows else None
    # A selection persists across reruns: apply it once, so the picker below can change after.
    if clicked and st.session_state.get("_triage-clicked") != clicked:
        st.session_state["signature"] = clicked
    st.session_state["_triage-clicked"] = clicked
    signature = st.selectbox(
        "Models with this failure", groups["signature"].tolist(), key="signature"
    )
    models = queries.models_with_signature(frame, signature) if signature else []
    return pd.DataFrame({"model": models})


def no_results_message(results_uri: str) -> str:
    """What an empty results location says, in every view: that it is empty, and how to fill it."""
    option = f" --results {shlex.quote(results_uri)}" if results_uri != "results" else ""
    return (
        f"No results yet under {inline_code(results_uri)}. "
        f"{inline_code(f'model-support demo{option}')} tests a few tiny models on this machine and "
        f"records them here; "
        f"{inline_code(f'model-support run ORG/NAME{option}')} tests one model from the Hub."
    )


DEVICE_NAMES = {"neuron": "Trainium", "cpu": "CPU", "cuda": "CUDA"}


def device_note(ctx: Context) -> None:
    """One short line when the current stack's results did not run on Trainium (CPU or CUDA
    runs show whether a model runs unmodified through torch.compile, not Trainium's figures).
    Only rows that ran say where: an EXCLUDED row never resolved its backend ("auto")."""
    if ctx.current is None:
        return
    frame = read(ctx, [ctx.current], ("backend", "result"))
    ran = frame["backend"][frame["result"] != Result.EXCLUDED.value].dropna()
    backends = sorted(str(b) for b in pd.unique(ran) if str(b) in DEVICE_NAMES)
    if not backends or "neuron" in backends:
        return
    names = " and ".join(DEVICE_NAMES[b] for b in backends)
    st.caption(
        f"Ran on {names}, not Trainium: whether each model runs unmodified through "
        "torch.compile; the times and memory are not Trainium's."
    )


def coverage_note(ctx: Context) -> None:
    """One line on how many of the dataset's models the current stack has, and which stack has
    the most, when it is not this one (the page opens on the newest stack, which may hold a
    single run)."""
    if ctx.current is None or len(ctx.files) < 2:
        return
    frames = {f: read(ctx, [f], ("model_id",)) for f in ctx.files}
    models = {f: set(frame.get("model_id", ())) for f, frame in frames.items()}
    everywhere = len(set().union(*models.values()))
    per_file = {f: len(ids) for f, ids in models.items()}
    here = per_file.get(ctx.current, 0)
    most = max(per_file, key=lambda f: per_file[f])  # the newest of equals: files are newest first
    if here >= per_file[most]:
        return
    st.caption(
        f"{here:,} of {formatting.plural(everywhere, 'model')} tested on this stack; "
        f"{literal(stack_label(most))} has the most: {per_file[most]:,}."
    )


def stack_label(f: StackFile) -> str:
    """How a (compiler, library) version pair is named in selectors and links."""
    return f"{f.compiler_label} · {f.library_label}"


CHART_WIDTH_PX = 900
"""About the width a chart gets at 1280 pixels beside the sidebar (its bars' labels fit it)."""


def view_charts(ctx: Context) -> None:
    """Pass rate per compiler version; wall time against parameter count."""
    import altair as alt

    st.subheader("Pass rate per compiler version")
    everything = queries.with_task(read(ctx, ctx.files, queries.PASS_RATE_COLUMNS), ctx.task)
    rates = queries.pass_rate_by_compiler(everything)
    if rates.empty:
        st.info("No models ran yet (only EXCLUDED results), so there is no pass rate.")
    else:
        # Each bar named apart from the others within its width (two compile backends of one
        # package share a long prefix), the whole name in its tooltip, its runs written on it.
        band = max(CHART_WIDTH_PX / len(rates) - 16, 60)
        names = [short_label(label, band) for label in rates["label"]]
        rates = rates.assign(
            stack=names if len(set(names)) == len(names) else rates["label"],
            runs=[
                f"{passed:,} of {formatting.plural(tested, 'run')} passed"
                for passed, tested in zip(rates["passed"], rates["tested"], strict=True)
            ],
        )
        axis = alt.Axis(labelAngle=0, labelLimit=round(band))  # Vega's own limit is 180 px
        x = alt.X("stack:N", title="compiler version", sort=None, axis=axis)
        bars = (
            alt.Chart(rates)
            .mark_bar()
            .encode(
                x=x,
                y=alt.Y(
                    "pass_rate:Q",
                    title="pass rate",
                    axis=alt.Axis(format="%"),
                    scale=alt.Scale(domain=[0, 1]),
                ),
                tooltip=[
                    alt.Tooltip("label:N", title="compiler version"),
                    alt.Tooltip("tested:Q", title="runs"),
                    "passed",
                    alt.Tooltip("pass_rate:Q", format=".0%"),
                ],
            )
        )
        counts = bars.mark_text(dy=-8).encode(text="runs:N")
        st.altair_chart(bars + counts, width="stretch")
    st.subheader("Wall time against parameter count")
    points = queries.wall_time_vs_parameters(current_frame(ctx, queries.SCATTER_COLUMNS))
    if points is None:
        st.info(
            "This chart needs parameter counts, and the dataset has no `parameters` column yet, "
            "so it is not drawn."
        )
        return
    if points.empty:
        st.info("No run in this selection recorded a parameter count and a wall time yet.")
        return
    scatter = (
        alt.Chart(points)
        .mark_circle(size=70)
        .encode(
            x=alt.X("parameters:Q", scale=alt.Scale(type="log"), title="parameters"),
            y=alt.Y("wall time (s):Q", title="wall time (s), compile included"),
            color=alt.Color(
                "result:N",
                scale=alt.Scale(
                    domain=list(RESULT_CHART_COLOURS),
                    range=list(RESULT_CHART_COLOURS.values()),
                ),
            ),
            tooltip=["model", "parameters", "wall time (s)", "result"],
        )
    )
    st.altair_chart(scatter, width="stretch")
