"""How the viewer writes figures for people: separators, units, blanks for missing values.

Pure functions of one value each (None, NaN and pandas' NA are "missing" and show as a blank
or a dash), so every view and the details panel say a figure the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

MISSING = "—"
"""What a missing figure shows as where a blank would be ambiguous (a metric)."""

BLANK_CELL = ""
"""What a table's cell shows for a missing value, text or number (every ``st.dataframe``'s
``placeholder``): Streamlit's default draws the word "None". The value itself stays missing, so
a number column still sorts as numbers."""


def missing(value: object) -> bool:
    """Whether ``value`` is absent (None, NaN, NA, NaT)."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))  # type: ignore[call-overload]
    except (TypeError, ValueError):  # a list or an array: present
        return False


def seconds(value: object) -> str:
    """``1,234.5 s``; a dash when missing."""
    return MISSING if missing(value) else f"{float(value):,.1f} s"  # type: ignore[arg-type]


def gib(value: object) -> str:
    """Bytes as ``3.00 GiB``; a dash when missing."""
    return MISSING if missing(value) else f"{int(value) / 2**30:,.2f} GiB"  # type: ignore[call-overload]


def rate(value: object, unit: str) -> str:
    """``55.5 tok/s``; a dash when missing."""
    return MISSING if missing(value) else f"{float(value):,.1f} {unit}"  # type: ignore[arg-type]


def count(value: object) -> str:
    """An integer with thousands separators; a dash when missing."""
    return MISSING if missing(value) else f"{int(value):,}"  # type: ignore[call-overload]


_SCALES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def parameters(value: object) -> str:
    """A parameter count people read at a glance, never rounded to zero: ``1.7 B``, ``600 M``,
    ``12.3 k``, ``512`` (three significant figures)."""
    if missing(value):
        return MISSING
    number = int(value)  # type: ignore[call-overload]
    for scale, suffix in _SCALES:
        if abs(number) >= scale:
            return f"{number / scale:.3g} {suffix}"
    return f"{number:,}"


def when(value: object) -> str:
    """A timestamp as ``2026-10-02 14:03 UTC``; a dash when missing."""
    if missing(value):
        return MISSING
    stamp = pd.Timestamp(value)  # type: ignore[arg-type]
    moment: datetime = stamp.to_pydatetime()
    if moment.tzinfo is None:  # the matrix stores UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(start: object, end: object) -> str | None:
    """The time from ``start`` to ``end`` as ``2 min 5 s`` / ``41.0 s``; None when unknown."""
    if missing(start) or missing(end):
        return None
    total = (pd.Timestamp(end) - pd.Timestamp(start)).total_seconds()  # type: ignore[arg-type]
    if total < 0:
        return None
    if total < 60:
        return f"{total:.1f} s"
    minutes, secs = divmod(round(total), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 failure``, ``2 failures``, ``0 models`` (``many``: the plural when not word + s)."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"


def hub_page(model: str, endpoint: str) -> str | None:
    """The model's page on the Hub at ``endpoint`` (``https://huggingface.co/org/name``); None
    for what is no Hub repository id (a model tested from a local path)."""
    try:
        validate_repo_id(model)
    except HFValidationError:
        return None
    return f"{endpoint.rstrip('/')}/{model}"
