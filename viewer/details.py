"""The model details panel: the answer first, then the figures, the verdict, the output, and
how to reproduce it.

Order matters to a reader: under the model's name, the result and one plain sentence (where the
output left the reference and which module diverges first, an ERROR's own message: ``answer.py``),
then the task, stack, where and when on one line; the figures that apply to the result; why it
did not pass (``failures.py``); what it produced; then the Reproduce steps (all at once with
``model-support reproduce``, or step by step, run.py's config block shown and the whole file a
download) and the large JSON collapsed.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from model_support.history import reproduce_command
from model_support.markdown import inline_code, literal
from model_support.printable import printable, printable_data
from model_support.viewer import (
    answer,
    failures,
    formatting,
    headline,
    output,
    queries,
    run_script,
)
from model_support.viewer.markup import shown_row
from model_support.viewer.views import Context, read, stack_label
from model_support.vocabulary import Result

if TYPE_CHECKING:
    from model_support.reproduce import Recipe

PAGE_TITLE = "Model support on Trainium"
"""The browser tab's title; a model's details put the model's name before it."""
PAGE_ICON = "🧪"
"""The browser tab's icon (an emoji: the server loads Streamlit's emoji catalog before it
listens, viewer/serve.py)."""
HISTORY_VIEW_LABEL = "History"
"""The page's label of the History view (app.VIEWS["history"])."""


def _open_history(model_id: str) -> None:
    """Switch the page to the History view of ``model_id`` (a button's callback: it runs before
    the widgets are drawn, so it may set their state)."""
    st.session_state["view"] = HISTORY_VIEW_LABEL
    st.session_state["model"] = model_id  # the History view opens on the page's model
    st.session_state.pop("run", None)


def history_button(model_id: str, results: int | None = None) -> None:
    """A button to the model's History view (every run, across stacks and dates)."""
    label = "History of this model across stacks and dates"
    if results is not None:
        label += f" ({results:,} result{'' if results == 1 else 's'} on other stacks)"
    st.button(label, key="open-history", on_click=_open_history, args=(model_id,))


@st.cache_data(show_spinner=False, max_entries=256)
def _traceback(results_uri: str, run_id: str) -> str | None:
    """The traceback kept in a run's record (the matrix keeps only the message's tail)."""
    from model_support.store import ResultsStore

    return ResultsStore(results_uri).get(run_id).document.traceback


def details(ctx: Context, model_id: str) -> None:
    """Everything about one model's result on the current stack, and how to reproduce it."""
    # Its own title: a tab, a bookmark and the browser's history name the model.
    st.set_page_config(page_title=f"{model_id} · {PAGE_TITLE}")
    st.subheader(literal(model_id))
    rows = read(
        ctx,
        [ctx.current] if ctx.current else [],
        tuple(queries.DETAIL_COLUMNS) + queries.COMPILE_CACHE_COLUMNS,
        model_id=model_id,
    )
    rows = (
        queries.with_task(rows, ctx.task)
        if ctx.task and not rows.empty and (rows["task"] == ctx.task).any()
        else rows
    )
    if rows.empty:
        where = stack_label(ctx.current) if ctx.current else "this dataset"
        st.info(f"{literal(model_id)} has no result with {literal(where)}.")
        elsewhere = read(ctx, ctx.files, ("model_id",), model_id=model_id)
        if not elsewhere.empty:
            history_button(model_id, len(elsewhere))
        else:
            st.warning(
                f"No stack in this dataset has a result for {literal(model_id)}: check the name "
                "(it is the Hub's ORG/NAME, e.g. from a link), or test it:"
            )
            st.code(f"model-support run {shlex.quote(model_id)}", language="bash")
        return
    for index, (_, row) in enumerate(rows.iterrows()):
        traceback = None
        if row["result"] in (Result.ERROR.value, Result.TIMEOUT.value):
            traceback = _record_traceback(ctx.results_uri, str(row["run_id"]))
        run_details(
            row,
            traceback=traceback,
            results_uri=ctx.results_uri,
            after_facts=functools.partial(history_button, model_id) if index == 0 else None,
        )


def _record_traceback(results_uri: str, run_id: str) -> str | None:
    from model_support.store import StoreError

    try:
        return _traceback(results_uri, run_id)
    except StoreError as exc:
        st.caption(f"The run's record (with its traceback) could not be read: {literal(exc)}")
        return None


def json_column(row: pd.Series, column: str) -> dict:
    """A JSON column's object; an empty one (with a warning naming the run) when malformed."""
    value = row.get(column)
    if not isinstance(value, str) or not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        st.warning(
            f"The run's {inline_code(column)} is not valid JSON ({literal(exc)}); the rest of its "
            "details are shown. Rebuild the matrix from the records with "
            "`model-support dataset materialize --rebuild`."
        )
        return {}
    return printable_data(parsed) if isinstance(parsed, dict) else {}


def figures(row: Mapping[str, object]) -> list[tuple[str, str]]:
    """The run's figures that apply to its result, as (label, value): a figure the run did not
    get to is left out, not drawn as a dash; a run that stopped (ERROR, TIMEOUT) has its time
    until it stopped instead of a wall time."""
    result = str(row.get("result"))
    shown: list[tuple[str, str]] = []
    if not formatting.missing(row.get("neuron_cores")):
        shown.append(("cores", formatting.count(row.get("neuron_cores"))))
    if result in (Result.ERROR.value, Result.TIMEOUT.value):
        wall = row.get("wall_time_s")
        took = (
            formatting.duration(row.get("started_at"), row.get("finished_at"))
            if formatting.missing(wall)
            else formatting.seconds(wall)
        )
        what = "failed" if result == Result.ERROR.value else "was stopped"
        if took:
            shown.append((f"time until it {what}", took))
    elif not formatting.missing(row.get("wall_time_s")):
        shown.append(("wall time (compile incl.)", formatting.seconds(row.get("wall_time_s"))))
    for label, column, write in (
        ("compile time", "compile_time_s", formatting.seconds),
        ("peak device memory", "peak_device_memory_bytes", formatting.gib),
        ("decode", "decode_tokens_per_s", lambda v: formatting.rate(v, "tok/s")),
        ("parameters", "parameters", formatting.parameters),
    ):
        if not formatting.missing(row.get(column)):
            shown.append((label, write(row.get(column))))
    return shown


FIGURES_PER_ROW = 3
"""Figures side by side: six to a row cut "1,389.4 tok/s" at 1280 pixels."""


def _figures(row: pd.Series) -> None:
    """The run's figures that apply, three to a row."""
    shown = figures(row)
    for start in range(0, len(shown), FIGURES_PER_ROW):
        for column, (label, value) in zip(
            st.columns(FIGURES_PER_ROW), shown[start : start + FIGURES_PER_ROW], strict=False
        ):
            column.metric(label, value)


def show_answer(row: Mapping[str, object], verification: Mapping[str, object]) -> None:
    """The answer: the result as a badge and one plain sentence; an ERROR's own message (the
    compiler's) under it, as code."""
    said = answer.answer(row, verification)
    st.markdown(f"{headline.badge(said.result)} {literal(said.sentence)}")
    if said.message:
        st.code(said.message, language=None, wrap_lines=True)


def _verdict_figures(row: pd.Series, verification: dict) -> None:
    """The verdict's figures: the token counts and ratios, a task measure table, the first
    diverging module."""
    verdict = {
        "exact": row["verified_exact"],
        "error ratio": row["error_ratio"],
        "mismatches": row["mismatches"],
        "near ties": row["near_ties"],
        "bad tokens": row["bad_tokens"],
        "first mismatch": row["first_mismatch"],
    }
    if all(formatting.missing(v) for v in verdict.values()):
        st.caption("No verdict: the test stopped before the verification ran.")
    else:
        st.dataframe(
            pd.DataFrame([{k: (None if formatting.missing(v) else v) for k, v in verdict.items()}]),
            hide_index=True,
            placeholder=formatting.BLANK_CELL,
        )
        unticked = answer.unticked_exact(row)
        if unticked and row["result"] == Result.PASS.value:
            st.caption(f"`exact` is unticked: {literal(unticked)}.")
    measures = queries.verdict_measures(verification)
    if not measures.empty:  # embeddings, classification, text-to-image: each measure's figures
        st.caption(
            f"Compared: {literal(verification.get('method'))}; ratios are the device's to the "
            "baseline's."
        )
        st.dataframe(measures, hide_index=True, placeholder=formatting.BLANK_CELL)
        with st.expander("Per input / per step"):
            st.dataframe(
                queries.verdict_items(verification),
                hide_index=True,
                placeholder=formatting.BLANK_CELL,
            )
    where, modules = queries.first_divergence(verification)
    if where is not None:
        st.markdown(literal(where))
        if not modules.empty:
            st.dataframe(modules, hide_index=True, placeholder=formatting.BLANK_CELL)


def _compile_cache(row: pd.Series) -> None:
    """The compile cache figures of a run: hits during it, what was pulled and pushed."""
    if formatting.missing(row.get("compile_cache_hits")) and not isinstance(
        row.get("compile_cache_target"), str
    ):
        return
    st.markdown("**Compile cache**")
    figures = {
        "hits": row.get("compile_cache_hits"),
        "misses": row.get("compile_cache_misses"),
        "prefix matched": row.get("compile_cache_prefix_matched"),
        "pulled entries": row.get("compile_cache_pulled_entries"),
        "pulled MiB": row.get("compile_cache_pulled_bytes"),
        "pull s": row.get("compile_cache_pull_s"),
        "pushed entries": row.get("compile_cache_pushed_entries"),
        "pushed MiB": row.get("compile_cache_pushed_bytes"),
        "push s": row.get("compile_cache_push_s"),
        "skipped": row.get("compile_cache_skipped"),
    }
    for key in ("pulled MiB", "pushed MiB"):
        if not formatting.missing(figures[key]):
            figures[key] = round(int(figures[key]) / 2**20, 2)  # type: ignore[call-overload]
    st.dataframe(
        pd.DataFrame([{k: (None if formatting.missing(v) else v) for k, v in figures.items()}]),
        hide_index=True,
        placeholder=formatting.BLANK_CELL,
    )
    if isinstance(row.get("compile_cache_target"), str):
        where = f"{row['compile_cache_target']}/{row.get('compile_cache_prefix') or ''}"
        st.caption(f"Cache: {inline_code(where)}")
    if isinstance(row.get("compile_cache_error"), str):
        st.caption(f"The cache failed (the result stands): {literal(row['compile_cache_error'])}")


def run_details(
    row: pd.Series,
    traceback: str | None = None,
    results_uri: str | None = None,
    after_facts: Callable[[], None] | None = None,
) -> None:
    """The details of one run, given as a matrix row (the History view shows any run so).

    ``traceback``: the one kept in the run's record, shown for an ERROR or TIMEOUT;
    ``results_uri``: where it was read from, for the ``model-support reproduce`` command;
    ``after_facts``: what to draw under the line of facts (the details' History button).
    """
    row = shown_row(row)  # every value of the run as data: control characters escaped
    traceback = printable(traceback) if traceback is not None else None
    result = str(row["result"])
    verification = json_column(row, "verification_json")
    show_answer(row, verification)
    st.caption(headline.facts(row))
    if after_facts is not None:
        after_facts()
    if result == Result.EXCLUDED.value:
        failures.show_excluded(row)
        _reproduce(row, results_uri)
        _more(row, {})
        return
    _figures(row)
    if result == Result.FAIL.value:
        failures.show_fail(row, verification)
    elif result in (Result.ERROR.value, Result.TIMEOUT.value):
        failures.show_error(row, traceback)
    st.markdown("**Verification**")
    if isinstance(row["verification_reason"], str):
        st.markdown(literal(row["verification_reason"]))
    _verdict_figures(row, verification)
    if result != Result.FAIL.value or not failures.token_verdict(verification):
        # A text FAIL showed its text beside the reference's tokens.
        output.show_output(row, verification=verification)
    output.show_pictures(row, verification)
    _compile_cache(row)
    _reproduce(row, results_uri)
    _more(row, verification)


RESULTS_PLACEHOLDER = "RESULTS"
"""What a reproduce command names for a dataset the viewer reads from a folder of its own
machine: its path there means nothing elsewhere."""


def results_argument(results_uri: str) -> tuple[str, str | None]:
    """What ``--results`` of a reproduce command shown to a reader names: the store's URI when
    it is one any machine with access reaches (s3://, hf://, ...), else RESULTS_PLACEHOLDER and
    what to replace it with."""
    scheme, sep, _ = results_uri.partition("://")
    if sep and scheme not in ("file", "local"):
        return results_uri, None
    return RESULTS_PLACEHOLDER, (
        f"Replace {RESULTS_PLACEHOLDER} with where this dataset is on your machine (this viewer "
        "reads it from a folder of its own)."
    )


def sizing_command(row: pd.Series) -> tuple[str, str | None]:
    """The command that sizes the row's model again, and what to replace in it (a model tested
    from a local checkpoint is sized from that folder, wherever it is)."""
    if isinstance(row.get("model_path"), str) and row["model_path"]:
        return "model-support size CHECKPOINT", (
            "Replace CHECKPOINT with the model's checkpoint folder (it was tested from a local "
            "checkpoint)."
        )
    return f"model-support size {shlex.quote(str(row['model_id']))}", None


REPRODUCE_FOLDER = "reproduce"


def all_at_once(row: pd.Series, made: Recipe, results_uri: str) -> tuple[str, str | None]:
    """The commands that reproduce a row at once, as the CLI prints them: ``model-support
    reproduce`` into a folder, then into it and ``docker run`` of the image; and what to
    replace in them (a dataset the viewer reads from its own folder)."""
    location, replace = results_argument(results_uri)
    lines = [
        f"{reproduce_command(str(row['run_id']), location)} -o {REPRODUCE_FOLDER}",
        *made.commands(REPRODUCE_FOLDER),
    ]
    return "\n".join(lines), replace


def _reproduce(row: pd.Series, results_uri: str | None) -> None:
    """How to run this row again: all at once (``model-support reproduce`` and the ``docker
    run`` line it prints), then step by step: where (image, instance, LNC, cores), what to
    install on top of that image (only what the run added, at its versions, with the indexes it
    needs), the compile cache to pull, and run.py. An EXCLUDED row: the sizing that left it
    out, and what would have run."""
    from model_support.reproduce import NotReproducible, plain_row, recipe

    st.markdown("**Reproduce**")
    if row["result"] == Result.EXCLUDED.value:
        command, replace = sizing_command(row)
        st.markdown("It was not run. Size it again (why it was left out, and the cores it needs):")
        st.code(command, language="bash")
        if replace:
            st.caption(literal(replace))
    try:
        made = recipe(plain_row(row.to_dict()))
    except NotReproducible as exc:
        st.caption(literal(exc))
        return
    if row["result"] == Result.EXCLUDED.value:
        st.markdown(
            f"What would have run, on {formatting.plural(made.cores, 'core')} (its run.py "
            "and what it needs, as for any run):"
        )
    if results_uri is not None:
        lines, replace = all_at_once(row, made, results_uri)
        st.markdown(
            "All at once: write run.py and requirements.txt into a folder, and run them "
            "in the image (add `--run` to the first command to run it here instead):"
        )
        st.code(lines, language="bash")
        if replace:
            st.caption(literal(replace))
    where = [f"image {inline_code(made.image)}"]
    if made.instance:
        where.append(f"instance {inline_code(made.instance)}")
    if made.lnc is not None:
        where.append(f"LNC {made.lnc}")
    where.append(formatting.plural(made.cores, "core"))
    st.markdown("Or step by step. Where: " + ", ".join(where) + ".")
    st.caption(literal(made.image_note))
    st.markdown(
        f"1. Install what the run used on top of that image ({len(made.requirements):,} "
        "packages at the versions its pod reported, not checked by anyone): "
        "`python3 -m pip install -r requirements.txt`"
    )
    st.download_button(
        "Download requirements.txt",
        made.requirements_text(),
        file_name="requirements.txt",
        key=f"req-{row['run_id']}",
    )
    st.caption("Package indexes: " + ", ".join(inline_code(index) for index in made.indexes))
    with st.expander(f"Packages ({len(made.requirements):,})"):
        st.code("\n".join(made.requirements), language=None)
    for note in made.notes:
        st.caption(literal(note))
    pull = queries.compile_cache_pull(row)
    if pull is not None:
        command, how = pull
        st.markdown(
            "2. Pull the compiled graphs for this compiler version (saves compiling again; the "
            "installed compiler must be the same version, which the image gives):"
        )
        st.code(command, language="bash")
        st.caption(f"From {literal(how)}.")
    else:
        st.markdown(
            f"2. No compile cache whose entries you can verify holds this run's (compiler: "
            f"{literal(row['compiler'] or 'unknown')}); it compiles from scratch."
        )
        st.caption(
            "Only a shared cache whose entries the operator's trusted pushers sign is offered: "
            "whoever can write a compile cache runs code in those who pull from it, so a "
            "namespace's own cache and the public NEFF cache (an unsigned mirror) are not."
        )
    run_py = made.run_py
    st.markdown("3. Save `run.py` and run it:")
    st.code("python3 run.py", language="bash")
    st.download_button(
        f"Download run.py ({run_script.line_count(run_py):,} lines)",
        run_py,
        file_name="run.py",
        mime="text/x-python",
        key=f"runpy-{row['run_id']}",
    )
    block = run_script.config_block(run_py)
    if block is None:
        st.caption("This run.py has no config block to show; the download holds all of it.")
    else:
        st.caption("Its config block (the test's settings; the rest is the runner):")
        st.code(block, language="python")


def _more(row: pd.Series, verification: dict) -> None:
    """The large JSON, collapsed: the whole verification, every recorded version, the run."""
    if verification:
        with st.expander("Whole verification (JSON)"):
            st.json(verification, expanded=False)
    with st.expander("Stack (every recorded version)"):
        reported = headline.reported_stack_fields(row)
        if reported:
            st.caption(
                "As its runner pod reported them, checked against nothing the operator knows: "
                + literal(", ".join(reported))
            )
        st.json(json_column(row, "stack"), expanded=1)
    with st.expander("Run"):
        run = {
            name: (None if formatting.missing(row.get(name)) else str(row.get(name)))
            for name in (
                "run_id",
                "model_path",
                "source",
                "backend",
                "compile_backend",
                "dtype",
                "parallelism",
                "revision",
                "resolved_revision",
                "torch",
                "torch_neuronx",
                "started_at",
                "finished_at",
                "recorded_at",
            )
        }
        st.json(run)
