"""The page's URL: deep links read into the widgets' state, the state written back, Back/Forward.

The URL's query parameters are the page's state (view, stack, filters, model, the compared
stacks, a run). Streamlit pushes a browser history entry whenever the page changes them and
reruns the script with the old ones on Back, so every run compares the URL with what the page
last wrote: a different URL was navigated to (a link, Back or Forward) and is read again. A value
the page does not know (a view, a version, a task) is reported, never silently replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from model_support.markdown import inline_code, literal
from model_support.viewer.data import StackFile

PARAMS = ("view", "compiler", "library", "q", "task", "model", "before", "after", "run")
"""The query parameters the page reads; each sets the widget or page state of the same key,
cleared before a link (or Back) is read, so what it does not name returns to its default."""
WRITTEN_KEY = "_url-written"
"""Session state: the query parameters the page wrote last (None before the first run)."""


@dataclass(frozen=True)
class LinkOptions:
    """What a link's values may name."""

    views: Mapping[str, str]
    """URL name -> the view's label."""
    tasks: tuple[str, ...]
    stack_labels: tuple[str, ...]
    """The Compare and Regressions views' stack labels (``before``/``after``)."""


def current_params() -> dict[str, str]:
    """The URL's query parameters the page reads (non-empty ones)."""
    return {k: str(st.query_params[k]) for k in PARAMS if st.query_params.get(k)}


def _pick(param: str | None, options: list[str], versions: dict[str, str | None]) -> str | None:
    """Match a query parameter to an option: the full label, or just its version."""
    if not param:
        return None
    if param in options:
        return param
    return next((o for o in options if versions.get(o) == param), None)


def read_link(files: list[StackFile], options: LinkOptions) -> list[str]:
    """Set the widgets' state from the URL when it is not what the page wrote last (the first
    run, a link, Back or Forward); returns what the link named that does not exist, in words."""
    params = current_params()
    if st.session_state.get(WRITTEN_KEY) == params:
        return []
    for key in PARAMS:
        st.session_state.pop(key, None)
    problems: list[str] = []
    unknown_names = sorted(k for k in st.query_params if k not in PARAMS)
    if unknown_names:
        problems.append(
            f"The link's parameter{'s' if len(unknown_names) > 1 else ''} "
            f"{', '.join(inline_code(k) for k in unknown_names)} "
            f"{'are' if len(unknown_names) > 1 else 'is'} not read by the viewer (it reads "
            f"{', '.join(PARAMS)})."
        )
    view = params.get("view")
    if view and view in options.views:
        st.session_state["view"] = options.views[view]
    elif view:
        problems.append(
            f"The link's view {inline_code(view)} does not exist; showing the first view. "
            f"Views: {', '.join(options.views)}."
        )
    compilers = sorted({f.compiler_label for f in files})
    compiler = _pick(
        params.get("compiler"), compilers, {f.compiler_label: f.compiler_version for f in files}
    )
    if compiler:
        st.session_state["compiler"] = compiler
    elif params.get("compiler"):
        problems.append(
            f"The link's compiler {inline_code(params['compiler'])} has no results in this "
            "dataset; showing the newest compiler instead."
        )
    if params.get("library"):
        libraries = sorted(
            {f.library_label for f in files if compiler is None or f.compiler_label == compiler}
        )
        library = _pick(
            params["library"], libraries, {f.library_label: f.library_version for f in files}
        )
        if library:
            st.session_state["library"] = library
        else:
            problems.append(
                f"The link's library {inline_code(params['library'])} has no results "
                f"{'with ' + literal(compiler) if compiler else 'in this dataset'}; showing "
                "the newest library instead."
            )
    if params.get("q"):
        st.session_state["q"] = params["q"]
    task = params.get("task")
    if task in options.tasks:
        st.session_state["task"] = task
    elif task:
        problems.append(
            f"The link's task {inline_code(task)} is not one the viewer knows; showing all "
            f"tasks. Tasks: {', '.join(options.tasks)}."
        )
    if params.get("model"):
        st.session_state["model"] = params["model"]
    for side in ("before", "after"):  # the Compare and Regressions views' two stacks
        value = params.get(side)
        if value in options.stack_labels:
            st.session_state[side] = value
        elif value:
            problems.append(
                f"The link's {side} stack {inline_code(value)} has no results in this dataset; "
                "showing the default instead."
            )
    if params.get("run"):  # the History view's run
        st.session_state["run"] = params["run"]
    return problems


def report(problems: list[str]) -> None:
    """One warning per value of the link that does not exist."""
    for problem in problems:
        st.warning(problem)


def version_param(label: str, files: list[StackFile], attr: str) -> str:
    """The short form written to the URL: the version alone when it is unambiguous."""
    label_attr, version_attr = f"{attr}_label", f"{attr}_version"
    version = next(
        (getattr(f, version_attr) for f in files if getattr(f, label_attr) == label), None
    )
    same = {getattr(f, label_attr) for f in files if getattr(f, version_attr) == version}
    return version if version and len(same) == 1 else label


def write_link(state: Mapping[str, str | None]) -> None:
    """Write the page's state into the URL (a history entry when it changed), and remember it."""
    wanted = {k: v for k, v in state.items() if v}
    if current_params() != wanted:
        st.query_params.from_dict(wanted)
    st.session_state[WRITTEN_KEY] = wanted
