"""Compare: a model's Before and After side by side for the two compared stacks (never the
sidebar's), and models tested with one stack only counted and shown as not tested."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, OLD_CC, START, TRANSFORMERS, make_record, viewer_page

from model_support.store import ResultsStore
from model_support.viewer import compare

OLD = f"neuronx-cc {OLD_CC} · transformers {TRANSFORMERS}"
NEW = f"neuronx-cc {NEW_CC} · transformers {TRANSFORMERS}"


def markdown(at: AppTest) -> list[str]:
    return [m.value.replace("\\", "") for m in at.markdown]


def test_a_compared_model_shows_before_and_after_of_the_compared_stacks(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """Each side of a compared model: its answer (result and sentence), what it produced, its
    cores, wall time, decode speed and memory (the After side's changes in their units), and
    the command that reproduces it."""
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
    assert text[before + 1] == (
        ":orange-background[ERROR] The compile stage failed after 3 min 0 s; the compiler said:"
    )
    assert text[after + 1] == (
        ":green-background[PASS] The output matches the float32 reference token for token."
    )
    assert any("exceeds SBUF" in c.value for c in at.code)  # the newer stack's error
    assert "def fibonacci(n): return n" in [t.value for t in at.text]  # what the PASS produced
    figures = [(m.label, m.value, m.proto.delta) for m in at.metric][-8:]  # the two sides
    labels = ["cores", "wall time (compile incl.)", "decode", "peak device memory"]
    assert [label for label, _, _ in figures] == labels * 2
    assert figures[4:] == [
        ("cores", "4", ""),  # its name says 1.7B: the fixture runs it on 4
        ("wall time (compile incl.)", "123.4 s", ""),  # the same on both: no change
        ("decode", "55.5 tok/s", ""),
        ("peak device memory", "3.00 GiB", ""),
    ]
    reproduce = [c.value for c in at.code if c.value.startswith("model-support reproduce")]
    assert len(reproduce) == 2 and all("--results RESULTS" in c for c in reproduce)
    assert all("docker run" in c for c in reproduce)
    assert at.selectbox(key="compiler").value == f"neuronx-cc {OLD_CC}"  # the sidebar untouched


def test_a_change_is_given_in_its_unit() -> None:
    assert compare._delta(130.0, 123.4, "s") == "+6.6 s"
    assert compare._delta(50.0, 55.5, "tok/s") == "-5.5 tok/s"
    assert compare._delta(55.5, 55.5, "tok/s") is None  # no change: no arrow
    assert compare._gib_delta(4 * 2**30, 3 * 2**30) == "+1.00 GiB"
    assert compare._cores_delta(4, 1) == "+3 cores"


def test_compare_opens_on_the_pair_regressions_compares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """Three compile backends at one torch version: Regressions compares the two tested last;
    Compare opens on the same two (not the first two by name)."""
    store = ResultsStore(str(tmp_path))
    for hours, backend in enumerate(("zeta", "alpha", "mid")):  # tested in this order
        record = make_record("org/m", "text-generation", "PASS", NEW_CC, START)
        document = record.document
        stack = document.stack.model_copy(update={"neuronx_cc": None, "torch_neuronx": None})
        changed = document.model_copy(
            update={
                "backend": "cpu",
                "compile_backend": backend,
                "stack": stack,
                "started_at": START + timedelta(hours=hours),
            }
        )
        store.add(record.model_copy(update={"document": changed, "run_id": f"run-{backend}"}))
    store.materialize()
    regressions = viewer_page(tmp_path, monkeypatch, dead_hub, view="regressions").run()
    pair = (regressions.selectbox(key="before").value, regressions.selectbox(key="after").value)
    assert pair == ("alpha 2.13.0 · transformers 5.24.0", "mid 2.13.0 · transformers 5.24.0")
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="compare").run()
    assert not at.exception
    assert (at.selectbox(key="before").value, at.selectbox(key="after").value) == pair


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
