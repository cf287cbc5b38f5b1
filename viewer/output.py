"""What a run produced, as the details panel shows it: each prompt (as a Python literal, so its
line breaks show) and the text generated for it (plain text, never markup); a classifier's
predicted label per input beside the float32 reference's, differences marked; a text-to-image
run's pictures beside the reference's."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from model_support.markdown import literal
from model_support.viewer import formatting, queries

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PICTURE_WIDTH = 192
"""Pixels a recorded picture (at most 128 a side) is shown at."""
SAME, DIFFERS = "same", "≠ differs"
"""The label table's marks: the device's label is the reference's, or not."""


def strings(value: object) -> list[str]:
    """A list column's value (None, a list or an array of strings) as a list."""
    if formatting.missing(value) or isinstance(value, str):
        return []
    return [str(v) for v in value]  # type: ignore[attr-defined]


def texts(row: Mapping[str, object]) -> list[str]:
    """The generated text per prompt (older rows: the first prompt's only)."""
    text = row.get("text")
    return strings(row.get("texts")) or ([text] if isinstance(text, str) else [])


def label_table(row: Mapping[str, object], verification: Mapping[str, object]) -> pd.DataFrame:
    """A classifier's inputs, one row each: the input, the label the device predicted, the
    float32 reference's label, whether they differ, the reference's margin between the two
    classes and the verdict. Empty unless the record holds both labels (older records hold
    only class indices: see :func:`labelled`)."""
    columns = ["input", "predicted (device)", "reference", "device vs reference"]
    columns += ["margin (nats)", "verdict"]
    prompts = strings(row.get("prompts"))
    rows = []
    for item in _items(verification):
        if "label" not in item or "reference_label" not in item:
            return pd.DataFrame(columns=columns)
        index = item.get("item")
        prompt = prompts[index] if isinstance(index, int) and 0 <= index < len(prompts) else None
        predicted, reference = str(item["label"]), str(item["reference_label"])
        rows.append(
            {
                "input": prompt if prompt is not None else f"input {index}",
                "predicted (device)": predicted,
                "reference": reference,
                "device vs reference": SAME if predicted == reference else DIFFERS,
                "margin (nats)": item.get("margin"),
                "verdict": item.get("verdict"),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _items(verification: Mapping[str, object]) -> list[Mapping[str, object]]:
    listed = verification.get("items")
    if not isinstance(listed, list):
        return []
    return [i for i in listed if isinstance(i, Mapping) and "class" in i]


def labelled(verification: Mapping[str, object]) -> bool:
    """Whether the record holds a classifier's labels, the device's and the reference's."""
    items = _items(verification)
    return bool(items) and all("label" in i and "reference_label" in i for i in items)


def _mark_differences(table: pd.DataFrame) -> Any:
    """The label table with the rows whose labels differ highlighted."""

    def colour(row: pd.Series) -> list[str]:
        shade = "background-color: rgba(255, 75, 75, 0.18)"
        return [shade if row["device vs reference"] == DIFFERS else ""] * len(row)

    return table.style.apply(colour, axis=1).format({"margin (nats)": "{:.4g}"}, na_rep="")


def show_output(
    row: Mapping[str, object], where: Any = st, verification: Mapping[str, object] | None = None
) -> None:
    """Each prompt and its output, under the task's heading, into ``where`` (a column or the
    page); a classifier's labels beside the reference's where the record holds both."""
    outputs = texts(row)
    if verification is not None and labelled(verification):
        table = label_table(row, verification)
        differ = int((table["device vs reference"] == DIFFERS).sum())
        where.markdown(
            f"**{queries.output_label(str(row.get('task')))}**: predicted on the device and by "
            "the float32 reference"
        )
        where.caption(
            f"{differ:,} of {len(table):,} input{'' if len(table) == 1 else 's'} "
            f"{'differs' if differ == 1 else 'differ'} from the reference"
            + (" (highlighted)." if differ else ".")
        )
        where.dataframe(
            _mark_differences(table),
            hide_index=True,
            placeholder=formatting.BLANK_CELL,
            key=f"labels-{row.get('run_id')}",
        )
        return
    if not outputs:
        return
    prompts = strings(row.get("prompts"))
    where.markdown(f"**{queries.output_label(str(row.get('task')))}** (as the run reported it)")
    for index, text in enumerate(outputs):
        where.caption(prompt_caption(prompts, index))
        where.text(text)


def prompt_caption(prompts: list[str], index: int) -> str:
    """The caption over prompt ``index``'s output: its number and the prompt as a Python
    literal (line breaks show), as plain text; the number alone where the record has none."""
    prompt = prompts[index] if index < len(prompts) else None
    return literal(f"prompt {index + 1}: {prompt!r}" if prompt else f"prompt {index + 1}")


def picture(encoded: object) -> bytes | None:
    """A recorded picture's PNG bytes; None when it is not base64 of a PNG."""
    if not isinstance(encoded, str):
        return None
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if data.startswith(PNG_SIGNATURE) else None


def show_pictures(row: Mapping[str, object], verification: Mapping[str, object]) -> None:
    """A text-to-image run's picture per prompt, beside the float32 reference's."""
    pictures = verification.get("images")
    if not isinstance(pictures, Mapping):
        return
    st.markdown("**Pictures drawn** (each prompt's final latents, decoded by the reference's VAE)")
    error = pictures.get("error")
    if isinstance(error, str) and error:
        st.caption(f"No pictures were drawn: {literal(error)}")
        return
    device, reference = strings(pictures.get("device")), strings(pictures.get("reference"))
    prompts = strings(row.get("prompts"))
    for index, encoded in enumerate(device):
        st.caption(prompt_caption(prompts, index))
        left, right = st.columns(2)
        for column, data, who in (
            (left, picture(encoded), "device"),
            (right, picture(reference[index]) if index < len(reference) else None, "reference"),
        ):
            if data is None:
                column.caption(f"The record's {who} picture is not a PNG.")
            else:
                column.image(
                    data,
                    caption="the device" if who == "device" else "the float32 reference",
                    width=PICTURE_WIDTH,
                    output_format="PNG",  # as recorded: no JPEG artefacts on a small picture
                )
