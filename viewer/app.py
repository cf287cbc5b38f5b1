"""The model-support viewer: browse and query test results (``model-support viewer``).

The results location comes from ``--results URI`` after ``--`` on the streamlit command line, or
the MODEL_SUPPORT_RESULTS environment variable (default: ``results``). MODEL_SUPPORT_HUB_ENDPOINT
points the rankings at another Hub endpoint.

Deep links: ``?model=org/name&view=trending&compiler=<version>&library=<version>&q=<search>
&task=<task>``, ``view=compare`` or ``view=regressions`` with ``before`` and ``after`` (stack
labels), ``view=history`` with ``model`` and ``run`` (a run id); the page writes its state back
into the query parameters (``links.py``: unknown values are reported, Back and Forward work).
The History and Regressions views are in ``history_views.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from model_support.markdown import inline_code, literal
from model_support.viewer import compare, details, history_views, links, scroll, views
from model_support.viewer.queries import newest_first, version_key

RESULTS_ENV = "MODEL_SUPPORT_RESULTS"
HUB_ENDPOINT_ENV = "MODEL_SUPPORT_HUB_ENDPOINT"
DEFAULT_RESULTS = "results"
PAGE_TITLE = details.PAGE_TITLE
PAGE_ICON = details.PAGE_ICON

VIEWS = {
    "selected": "Selected",
    "trending": "Trending",
    "downloads": "Downloads",
    "all": "All results",
    "triage": "Triage",
    "compare": "Compare",
    "charts": "Charts",
    "history": "History",
    "regressions": "Regressions",
}
ALL_TASKS = "all tasks"
# Views that list models: a click on a row shows its details.
LIST_VIEWS = ("selected", "trending", "downloads", "all", "triage", "compare")
COMPARING_VIEWS = ("compare", "regressions")  # views whose two stacks are before and after
# Views with nothing to show without results (Selected and the rankings still list models).
# (A comment, not a docstring: Streamlit's magic draws a bare string in the page's script.)
NEEDS_RESULTS = ("all", "triage", "compare", "charts", "history", "regressions")
# At 1280 pixels the lists' eleven columns fit beside the sidebar: the sidebar at Streamlit's
# own width whichever way the page was reached (a stack picked or a link), a stack's long name
# shortened in its picker (whole in its help); 1.5rem either side of the main column instead of
# Streamlit's 5rem, and 3.5rem above it instead of 6rem (the toolbar is 3.75rem tall and
# transparent where the page is blank), so a list starts in the window's top third. Streamlit
# has no setting for those paddings (its theme's are vertical only within elements). The style
# sheet is a constant, which st.html draws out of the page's flow.
SIDEBAR_PX = 300
PICKER_CHROME_PX = 112  # a sidebar picker's room around its value: paddings, border, arrow
PICKER_TEXT_PX = SIDEBAR_PX - PICKER_CHROME_PX
MAIN_COLUMN_STYLE = (
    '<style>[data-testid="stMainBlockContainer"]'
    "{padding-left: 1.5rem; padding-right: 1.5rem; padding-top: 3.5rem}</style>"
)
TITLE = "Does it run on Trainium?"


def results_uri() -> str:
    """``--results`` from the script arguments, else the environment, else ``results``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--results", default=None)
    known, _ = parser.parse_known_args(sys.argv[1:])
    return known.results or os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS


def stack_picker(label: str, options: list[str], key: str) -> str | None:
    """A sidebar picker of stack versions: each shortened to the picker's width (two compile
    backends of one package stay apart), the one picked whole in its help."""
    if not options:
        return None
    picked = st.session_state.get(key, options[0])
    short = views.short_label(str(picked), PICKER_TEXT_PX)
    return st.selectbox(
        label,
        options,
        key=key,
        format_func=lambda option: views.short_label(option, PICKER_TEXT_PX),
        help=f"Whole name: {inline_code(picked)}" if short != picked else None,
    )


@dataclass(frozen=True)
class StackChoice:
    """The sidebar's compiler and library versions on offer, and the ones its pickers show."""

    compilers: list[str]
    compiler: str | None
    libraries: list[str]
    library: str | None


def choose_stack(files: list[views.StackFile]) -> StackChoice:
    """The versions on offer, newest first, and the ones picked: the page's (its link's or the
    reader's) when on offer, else the newest. Known before the sidebar is drawn, so the page's
    first configuration can make room for them."""
    compilers = newest_first((f.compiler_label, f.compiler_version) for f in files)
    if st.session_state.get("compiler") not in compilers:
        st.session_state.pop("compiler", None)
    compiler = st.session_state.get("compiler", compilers[0] if compilers else None)
    libraries = newest_first(
        (f.library_label, f.library_version) for f in files if f.compiler_label == compiler
    )
    if st.session_state.get("library") not in libraries:
        st.session_state.pop("library", None)
    library = st.session_state.get("library", libraries[0] if libraries else None)
    return StackChoice(compilers, compiler, libraries, library)


def _clear_search() -> None:
    """The search box emptied (a button's callback: it runs before the widgets are drawn)."""
    st.session_state["q"] = ""


def no_match(search: str) -> None:
    """What a search that matches nothing in the view says, and a way back."""
    st.info(f"No model in this view matches {inline_code(search.strip())}.")
    st.button("Clear the search", key="clear-search", on_click=_clear_search)


def main() -> None:
    """Draw the page."""
    uri = results_uri()
    hub_endpoint = os.environ.get(HUB_ENDPOINT_ENV) or None
    st.session_state[views.REPORTED_KEY] = set()  # each run reports unreadable files anew
    unreadable: OSError | ValueError | None = None  # reported once the page is configured
    try:
        files, unlisted = views.stack_files(uri)
    except (OSError, ValueError) as exc:
        files, unlisted, unreadable = [], [], exc
    link_problems = links.read_link(
        files,
        links.LinkOptions(
            views=VIEWS,
            tasks=tuple(views.TASKS),
            stack_labels=tuple(views.stack_label(f) for f in files),
        ),
    )
    stack = choose_stack(files)
    st.set_page_config(
        page_title=PAGE_TITLE,
        page_icon=PAGE_ICON,
        layout="wide",
        initial_sidebar_state=SIDEBAR_PX,
    )
    st.html(MAIN_COLUMN_STYLE)
    views.report_unreadable(unlisted)
    if unreadable is not None:
        st.error(
            f"Cannot read the results at {inline_code(uri)}: "
            f"{literal(type(unreadable).__name__)}: {literal(unreadable)}"
        )

    links.report(link_problems)

    with st.sidebar:
        st.header(TITLE)
        st.caption(
            "Popular Hugging Face models, run unmodified through TorchNeuron "
            f'(`torch.compile(backend="neuron")`). Results from {inline_code(uri)}.'
        )
        label = st.radio("View", list(VIEWS.values()), key="view")
        compiler = stack_picker("Compiler version", stack.compilers, "compiler")
        library = stack_picker("Library version", stack.libraries, "library")
        search = st.text_input("Search models", key="q", placeholder="part of a name, e.g. qwen")
        task_choice = st.selectbox("Task", [ALL_TASKS, *views.TASKS], key="task")
        if not files:
            st.info(f"No results yet under {inline_code(uri)} (no `data/*.parquet`).")

    current = next(
        (f for f in files if f.compiler_label == compiler and f.library_label == library), None
    )
    ctx = views.Context(
        results_uri=uri,
        files=tuple(
            sorted(
                sorted(files, key=lambda f: (f.compiler_label, f.library_label)),
                key=lambda f: (version_key(f.compiler_version), version_key(f.library_version)),
                reverse=True,  # newest first; one version's stacks stay in name order
            )
        ),
        current=current,
        search=search or "",
        task=None if task_choice == ALL_TASKS else task_choice,
        hub_endpoint=hub_endpoint,
    )
    view = next(k for k, v in VIEWS.items() if v == label)
    st.header(label)
    views.device_note(ctx)
    views.coverage_note(ctx)
    table: pd.DataFrame | None = None
    comparison: compare.Comparison | None = None
    if not files:
        st.info(views.no_results_message(uri))
    if not files and view in NEEDS_RESULTS:
        pass  # nothing to show but the message above
    elif view == "selected":
        table = views.view_selected(ctx)
    elif view == "all":
        table = views.view_all(ctx)
    elif view in ("trending", "downloads"):
        table = views.view_ranking(ctx, "trending_score" if view == "trending" else "downloads")
    elif view == "triage":
        table = views.view_triage(ctx)
    elif view == "compare":
        comparison = compare.view_compare(ctx)
        table = comparison.table if comparison else None
    elif view in ("history", "regressions"):
        history_ctx = history_views.HistoryContext(results_uri=uri, task=ctx.task)
        if view == "history":
            history_views.view_history(history_ctx)
        else:
            history_views.view_regressions(history_ctx)
    else:
        views.view_charts(ctx)

    if table is not None and table.empty and search and view in LIST_VIEWS:
        no_match(search)
    elif table is not None and view in ("selected", "all", "compare", "triage"):
        views.show_table(table, key=f"table-{view}", hub_url=ctx.hub_url)

    options = views.detail_options(table)
    chosen = st.session_state.get("model")
    if chosen and chosen not in options:
        options.insert(0, chosen)
    model: str | None = None
    if options:  # nothing to pick from (an empty store, no failures) draws no picker
        st.divider()
        st.header("Model details", anchor=scroll.DETAILS_ANCHOR)
        model = st.selectbox(
            "Model",
            options,
            index=None,
            key="model",
            placeholder="Pick a model, or click a row of the table",
        )
    if model and comparison is not None:
        compare.side_by_side(ctx, comparison, model)  # the compared stacks, not the sidebar's
    elif model:
        details.details(ctx, model)
    # From a list, the details are what a click asked for (the other views' own content, a
    # model's history or the charts, comes first); after them, so the page is long enough.
    scroll.scroll_to_details(model if view in LIST_VIEWS else None)

    # Write the state back so the URL is a deep link to what is on screen.
    state = {
        "view": view,
        "compiler": links.version_param(compiler, files, "compiler") if compiler else None,
        "library": links.version_param(library, files, "library") if library else None,
        "q": search or None,
        "task": None if task_choice == ALL_TASKS else task_choice,
        "model": model,
        "before": st.session_state.get("before") if view in COMPARING_VIEWS else None,
        "after": st.session_state.get("after") if view in COMPARING_VIEWS else None,
        "run": st.session_state.get("run") if view == "history" else None,
    }
    links.write_link(state)


main()
