"""Compare: a model's Before and After side by side for the two compared stacks (never the
sidebar's), and models tested with one stack only counted and shown as not tested."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, OLD_CC, START, TRANSFORMERS, make_record, viewer_page

from model_support.store import ResultsStore

OLD = f"neuronx-cc {OLD_CC} · transformers {TRANSFORMERS}"
NEW = f"neuronx-cc {NEW_CC} · transformers {TRANSFORMERS}"


def markdown(at: AppTest) -> list[str]:
    return [m.value.replace("\\", "") for m in at.markdown]


def test_a_compared_model_shows_before_and_after_of_the_compared_stacks(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    at = viewer_page(dataset, monkeypatch, dead_hub)
    # The sidebar is on the older stack, where the model passed; the comparison is newer -> older.
    at.query_params.update(
        view="compare", compiler=OLD_CC, before=NEW, after=OLD, model="Qwen/Qwen3-1.7B"
    )
    at.run()
    assert not at.exception
    text = markdown(at)
    before = text.index(f"**Before** · {NEW}")
    after = text.index(f"**After** · {OLD}")
    assert ":orange-background[ERROR]" in text[before + 1]
    assert text[before + 2] == "**Error**: compile"
    assert "PASS" in text[after + 1] and NEW_CC not in text[after + 1]
    assert any("exceeds SBUF" in c.value for c in at.code)  # the newer stack's error
    walls = [m for m in at.metric if m.label == "wall time (compile incl.)"]
    assert [m.value for m in walls] == ["123.4 s", "123.4 s"]
    # After (the older stack) against Before: the same wall time, no change.
    assert walls[1].proto.delta in ("0.0", "0")
    assert at.selectbox(key="compiler").value == f"neuronx-cc {OLD_CC}"  # the sidebar untouched


def test_models_tested_with_one_stack_only_are_counted_and_not_tested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    store = ResultsStore(str(tmp_path))
    for model, stacks in (
        ("org/both", (OLD_CC, NEW_CC)),
        ("org/old-only", (OLD_CC,)),
        ("org/new-only", (NEW_CC,)),
        ("org/new-too", (NEW_CC,)),
    ):
        for stack in stacks:
            store.add(make_record(model, "text-generation", "PASS", stack, START))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="compare").run()
    assert not at.exception
    counts = {m.label: m.value for m in at.metric}
    assert counts["only after"] == "2" and counts["only before"] == "1"
    rows = at.dataframe[0].value.set_index("model")
    assert rows.loc["org/new-only", "before"] == "not tested"
    assert rows.loc["org/old-only", "after"] == "not tested"
    at.selectbox(key="model").select("org/new-only").run()
    assert any(i.value.startswith("not tested: no result with this stack") for i in at.info)
    assert any(m.startswith(f"**After** · {NEW}") for m in markdown(at))
