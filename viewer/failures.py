"""Why a run did not pass, in the details panel under its answer: a FAIL's failed checks with
their figures and bounds and its tokens against the reference's; an ERROR's class, whole message
and traceback (and where it was cut); what an EXCLUDED model's sizing said.

The pure functions build tables from a matrix row and its verification (JSON); the ``show_*``
functions draw them. Everything a run wrote is shown as data (tables, ``st.text``/``st.code``)
or escaped.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import streamlit as st

from model_support.markdown import inline_code, literal
from model_support.viewer import formatting, output
from model_support.vocabulary import (
    COMPILE_FAILURE_MEANINGS,
    ERROR_CLASS_MEANINGS,
    VERDICT_CHECK_MEANINGS,
    CompileFailure,
    ErrorClass,
    VerdictCheck,
)

RATIO_CHECKS: dict[str, tuple[str, str, str]] = {
    VerdictCheck.MEDIAN.value: ("error_ratio", "max_error_ratio", "median logit error"),
    VerdictCheck.Q90.value: ("q90_ratio", "max_q90_ratio", "90th-percentile logit error"),
    VerdictCheck.PEAK.value: ("peak_ratio", "max_peak_ratio", "largest logit error"),
    VerdictCheck.KL.value: ("kl_ratio", "max_kl_ratio", "mean KL divergence"),
}
"""A text verdict's ratio checks: the row's figure, the verification parameter bounding it, and
the figure in words (each a multiple of the baseline's same statistic)."""
MESSAGE_LINES = 6
"""The lines of an ERROR's message its answer shows (``answer.py``); a longer one is shown whole
below it."""
MAX_TOKEN_ROWS = 20
"""The token table shows at most this many positions that differ from the reference."""


def _number(value: object) -> float | None:
    return None if formatting.missing(value) else float(value)  # type: ignore[arg-type]


def _meaning(name: str) -> str:
    known = {c.value: c for c in VerdictCheck}
    return VERDICT_CHECK_MEANINGS.get(known[name], "") if name in known else ""


def failed_checks(row: Mapping[str, object], verification: Mapping[str, object]) -> pd.DataFrame:
    """One row per failed check: the check, its figure in words, its value, its bound and
    what the check means.

    The figure of a ratio check is the device's statistic over the baseline's (worst prompt),
    bounded by the verification's parameter; the tokens check counts tokens beyond the noise
    (any one fails); a check of another task shows its measure's largest ratio and bound.
    """
    names = output.strings(row.get("failed_checks")) or output.strings(
        verification.get("failed_checks")
    )
    given = verification.get("parameters")
    bounds: Mapping[str, object] = given if isinstance(given, Mapping) else {}
    listed = verification.get("metrics")
    metrics = [m for m in listed if isinstance(m, Mapping)] if isinstance(listed, list) else []
    rows = []
    for name in names:
        figure: float | None = None
        bound: float | None = None
        what = name
        if name == VerdictCheck.TOKENS.value:
            figure, bound = _number(row.get("bad_tokens")), 0.0
            what = "tokens beyond the noise"
        elif name in RATIO_CHECKS:
            column, parameter, words = RATIO_CHECKS[name]
            figure, bound = _number(row.get(column)), _number(bounds.get(parameter))
            what = f"{words} / the baseline's"
        else:
            measure = next((m for m in metrics if m.get("check") == name), None)
            if measure is not None:
                figure = _number(measure.get("peak_ratio"))
                bound = _number(measure.get("peak_bound"))
                what = f"{measure.get('what') or name}: largest ratio to the baseline's"
        rows.append(
            {
                "check": name,
                "figure": what,
                "value": figure,
                "bound": bound,
                "meaning": _meaning(name),
            }
        )
    return pd.DataFrame(rows, columns=["check", "figure", "value", "bound", "meaning"])


def _differing(verification: Mapping[str, object]) -> list[Mapping[str, object]]:
    listed = verification.get("positions")
    if not isinstance(listed, list):
        return []
    return [p for p in listed if isinstance(p, Mapping) and p.get("verdict") not in (None, "match")]


def token_table(verification: Mapping[str, object], limit: int = MAX_TOKEN_ROWS) -> pd.DataFrame:
    """The generated positions that differ from the float32 reference's choice (first ``limit``):
    what the device generated and what the reference prefers, as text where the record holds
    the decoded tokens, else as token ids."""
    rows = [
        {
            "prompt": p.get("prompt"),
            "position": p.get("position"),
            "generated": str(p.get("token_text", p.get("token"))),
            "reference prefers": str(p.get("reference_text", p.get("reference_token"))),
            "margin (nats)": p.get("margin"),
            "verdict": p.get("verdict"),
        }
        for p in _differing(verification)[:limit]
    ]
    columns = ["prompt", "position", "generated", "reference prefers", "margin (nats)", "verdict"]
    return pd.DataFrame(rows, columns=columns)


def token_verdict(verification: Mapping[str, object]) -> bool:
    """Whether the verdict compared tokens (text generation; older records name no method)."""
    return verification.get("method") in (None, "tokens")


def decoded(verification: Mapping[str, object]) -> bool:
    """Whether the record holds the positions' tokens as text (else only ids)."""
    return any("token_text" in p for p in _differing(verification))


def _figure(value: object) -> str:
    return formatting.MISSING if formatting.missing(value) else f"{float(value):,.4g}"  # type: ignore[arg-type]


def checks_in_words(checks: pd.DataFrame) -> str:
    """The failed checks as one Markdown sentence: each with its figure and bound."""
    return "; ".join(
        f"{inline_code(c.check)}: {literal(c.figure)} {_figure(c.value)} (bound {_figure(c.bound)})"
        for c in checks.itertuples()
    )


# ---------------------------------------------------------------------------------------------
# Drawing


def show_fail(row: Mapping[str, object], verification: Mapping[str, object]) -> None:
    """A FAIL: the failed checks in words with figures and bounds, the generated text beside
    the reference's preferred tokens."""
    checks = failed_checks(row, verification)
    if checks.empty:
        st.markdown("**Failed checks**: none named in the record (its reason is below).")
    else:
        st.markdown(f"**Failed checks**: {checks_in_words(checks)}")
        st.dataframe(
            checks,
            hide_index=True,
            placeholder=formatting.BLANK_CELL,
            key=f"checks-{row.get('run_id')}",
        )
    if not token_verdict(verification):
        return  # the details show what another task produced beside the reference's
    tokens = token_table(verification)
    if not output.texts(row) and tokens.empty:
        return
    left, right = st.columns(2)
    output.show_output(row, left)
    right.markdown("**The float32 reference prefers**")
    if tokens.empty:
        right.caption("The record holds no per-position tokens.")
        return
    how = "as text" if decoded(verification) else "as token ids (the record holds no decoded text)"
    total = len(_differing(verification))
    shown = f"{len(tokens):,} of {total:,}" if len(tokens) < total else f"{total:,}"
    right.caption(f"{shown} positions where the device's token differs, {how}.")
    right.dataframe(
        tokens,
        hide_index=True,
        placeholder=formatting.BLANK_CELL,
        key=f"tokens-{row.get('run_id')}",
    )


TRACEBACK_START = "Traceback (most recent call last):"
"""How Python begins a whole traceback: a kept one that does not begin so lost its top."""
KEPT_TRACEBACK_LINES = 40
"""How many of a traceback's last lines run.py keeps in its result (its TRACEBACK_LINES)."""


def traceback_cut(traceback: str) -> str | None:
    """Where a kept traceback was cut, in words; None when it is whole. run.py keeps a
    traceback's last lines: one that does not start as Python starts one lost its first lines
    (the outer calls), and the error itself is at its end."""
    first = traceback.lstrip().splitlines()[0] if traceback.strip() else ""
    if first.startswith(TRACEBACK_START):
        return None
    return (
        f"Cut at its top: run.py keeps a traceback's last {KEPT_TRACEBACK_LINES} lines, so the "
        "outermost calls are left out; the innermost ones and the error, at its end, are all here."
    )


def show_error(row: Mapping[str, object], traceback: str | None) -> None:
    """An ERROR or TIMEOUT, under its answer (which gave the stage, the time to failure and the
    message's first lines): the error class in words (and a compile failure's reason), the whole
    message when it is longer, and
    the traceback kept in the record (where it was cut, if it was)."""
    facts: list[str] = []
    error_class = row.get("error_class")
    if isinstance(error_class, str) and error_class:
        known = {c.value: c for c in ErrorClass}
        meaning = ERROR_CLASS_MEANINGS.get(known[error_class]) if error_class in known else None
        facts.append(inline_code(error_class) + (f": {literal(meaning)}" if meaning else ""))
    reason = row.get("error_reason")
    if isinstance(reason, str) and reason:
        # Why a compile failed: the compiler itself, or a model whose graph cannot run compiled.
        reasons = {r.value: r for r in CompileFailure}
        why = COMPILE_FAILURE_MEANINGS.get(reasons[reason]) if reason in reasons else None
        facts.append("reason " + inline_code(reason) + (f": {literal(why)}" if why else ""))
    if facts:
        st.markdown("**Error class** " + " · ".join(facts))
    error = row.get("error")
    if isinstance(error, str) and len(error.strip().splitlines()) > MESSAGE_LINES:
        with st.expander("The whole message"):
            st.code(error, language=None, wrap_lines=True)
    if traceback:
        with st.expander("Traceback (kept in the record)", expanded=True):
            cut = traceback_cut(traceback)
            if cut:
                st.caption(cut)
            st.code(traceback, language=None)


def show_excluded(row: Mapping[str, object]) -> None:
    """An EXCLUDED model, under its answer (which gave the reason and the cores it needs): the
    sizing's own words."""
    if isinstance(row.get("error"), str) and row["error"]:
        st.markdown("**The sizing said**")
        st.text(str(row["error"]))
