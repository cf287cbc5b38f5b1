"""Putting values from the dataset into Streamlit's Markdown, so they show as plain text.

Everything a run or a dataset supplies (model ids, error messages, verification reasons, paths,
compiler names, Hub answers) is data, never markup, and its control characters are shown as
escapes (:mod:`model_support.printable`, the command line's rule too): here in Markdown, and
through :func:`shown_row` / :func:`shown_frame` in code blocks, JSON and tables. Streamlit renders Markdown (CommonMark with
GitHub extensions, LaTeX between ``$``, ``:color[...]`` directives) in ``st.markdown``,
captions, headings, alerts and widget labels; a value placed there is escaped first. Longer
values go to elements that never interpret anything (``st.text``, ``st.code``, tables, JSON).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from model_support.printable import printable, printable_data

# CommonMark lets a backslash escape any ASCII punctuation character; escaping all of them also
# disarms the extensions (``$`` math, ``:`` directives, ``~`` strikethrough, ``|`` tables,
# ``www.`` autolinks) and HTML (``<``, ``&`` entities).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_BACKTICKS = re.compile(r"`+")


def _one_line(value: object) -> str:
    # A line break could start a block (heading, list, quote, indented code): inline values are
    # shown on one line, runs of whitespace as one space; control characters as escapes.
    return " ".join(printable(str(value)).split())


def literal(value: object) -> str:
    """``value`` as Markdown source that renders as exactly its text (on one line)."""
    return _PUNCTUATION.sub(r"\\\1", _one_line(value))


def inline_code(value: object) -> str:
    """``value`` as a Markdown code span (monospace, nothing inside interpreted), on one line."""
    text = _one_line(value)
    if not text:
        return ""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    # A span starting or ending with a backtick needs a space to stay apart from the fence.
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"


def shown(value: Any) -> Any:
    """A value as the page shows it: every string in it with its control characters escaped
    (lists and arrays of strings, as a matrix column holds them, included)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.array([shown(v) for v in value], dtype=object)
    return printable_data(value)


def shown_row(row: pd.Series) -> pd.Series:
    """A matrix row with :func:`shown` applied to each value (a details panel's data)."""
    return row.map(shown)


def shown_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A table with :func:`shown` applied to its text columns (what a page of it shows)."""
    text = [c for c in frame.columns if frame[c].dtype == object]
    return frame.assign(**{c: frame[c].map(shown) for c in text}) if text else frame
