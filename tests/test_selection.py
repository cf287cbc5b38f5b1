"""The selected list kept with the dataset: round trip and clear errors for a malformed file."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_support.selection import (
    SelectedEntry,
    SelectedList,
    SelectionError,
    load_selected,
    save_selected,
)
from model_support.vocabulary import Task


def test_saved_list_reads_back(tmp_path: Path) -> None:
    selected = SelectedList(
        models=[
            SelectedEntry(model="Qwen/Qwen3-0.6B"),
            SelectedEntry(model="llava-hf/llava-1.5-7b-hf", task=Task.IMAGE_TEXT_TO_TEXT),
            SelectedEntry(model="org/huge", reason="too large for 16 cores"),
        ]
    )
    path = save_selected(str(tmp_path), selected)
    assert path.endswith("selected.yaml")
    assert load_selected(str(tmp_path)) == (selected, path)
    assert not list(tmp_path.glob("*.tmp"))


def test_no_list_says_where_it_looked(tmp_path: Path) -> None:
    selected, where = load_selected(str(tmp_path))
    assert selected is None and "selected.yaml" in where


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [", "is not valid YAML"),
        ("models:\n  - model: a/b\n    task: text-to-speech\n", "models.0.task"),
        ("models:\n  - name: a/b\n", "Expected `models:`"),
    ],
)
def test_malformed_list_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "selected.yaml").write_text(text)
    with pytest.raises(SelectionError, match=message):
        load_selected(str(tmp_path))
