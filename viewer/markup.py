"""Values from the dataset as the viewer's pages show them: plain text, never markup.

Everything a run or a dataset supplies (model ids, error messages, verification reasons, paths,
compiler names, Hub answers) is data, never markup, and its control characters are shown as
escapes (:mod:`model_support.printable`, the command line's rule too). Streamlit renders
Markdown (CommonMark with GitHub extensions, LaTeX between ``$``, ``:color[...]`` directives) in
``st.markdown``, captions, headings, alerts and widget labels: a value placed there goes through
:func:`model_support.markdown.literal` or :func:`model_support.markdown.inline_code` first.
Longer values go to elements that never interpret anything (``st.text``, ``st.code``, tables,
JSON), through :func:`shown_row` / :func:`shown_frame` here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from model_support.printable import printable_data


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
