"""What a run produced, as the details panel shows it: each prompt (as a Python literal, so its
line breaks show) and the text generated for it (plain text, never markup)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from model_support.viewer import formatting, queries
from model_support.viewer.markup import literal


def strings(value: object) -> list[str]:
    """A list column's value (None, a list or an array of strings) as a list."""
    if formatting.missing(value) or isinstance(value, str):
        return []
    return [str(v) for v in value]  # type: ignore[attr-defined]


def texts(row: Mapping[str, object]) -> list[str]:
    """The generated text per prompt (older rows: the first prompt's only)."""
    text = row.get("text")
    return strings(row.get("texts")) or ([text] if isinstance(text, str) else [])


def show_output(row: Mapping[str, object], where: Any = st) -> None:
    """Each prompt and its output, under the task's heading, into ``where`` (a column or the
    page)."""
    outputs = texts(row)
    if not outputs:
        return
    prompts = strings(row.get("prompts"))
    where.markdown(f"**{queries.output_label(str(row.get('task')))}** (as the run reported it)")
    for index, text in enumerate(outputs):
        prompt = prompts[index] if index < len(prompts) else None
        where.caption(
            literal(f"prompt {index + 1}: {prompt!r}" if prompt else f"prompt {index + 1}")
        )
        where.text(text)
