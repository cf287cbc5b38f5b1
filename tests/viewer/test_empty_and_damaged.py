"""An empty results location says so in every view and says how to fill it; a damaged matrix file
is reported and never hides the others' results."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import OLD_CC

APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")
VIEWS = ["selected", "trending", "downloads", "all", "triage", "compare", "charts", "history", "regressions"]  # fmt: skip
MISLEADING = (
    "No failures on this stack",
    "this dataset has one",
    "No models ran yet",
    "materialize",
)
"""What a view said of an empty location that was not so (no stack, no failures, no history)."""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> pytest.MonkeyPatch:
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", dead_hub)
    return monkeypatch


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_of_an_empty_location_says_so_and_how_to_fill_it(
    view: str, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty results"
    empty.mkdir()
    env.setenv("MODEL_SUPPORT_RESULTS", str(empty))
    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params["view"] = view
    at.run()
    assert not at.exception
    main = [i.value for i in at.main.info]
    said = [m for m in main if "No results yet" in m]
    assert len(said) == 1, main
    assert f"model-support demo --results '{empty}'" in said[0]  # quoted: the path has a space
    assert f"model-support run ORG/NAME --results '{empty}'" in said[0]
    everything = " ".join(e.value for e in [*at.info, *at.warning, *at.success, *at.caption])
    assert not [m for m in MISLEADING if m in everything]


def _damage(path: Path) -> None:
    """Zero the middle of a Parquet file: its footer still reads, its data does not."""
    data = bytearray(path.read_bytes())
    data[200 : len(data) // 2] = bytes(len(data) // 2 - 200)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["damaged data", "truncated"])
def test_a_damaged_matrix_file_is_reported_and_the_others_still_show(
    how: str, dataset: Path, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "results"
    shutil.copytree(dataset, copy)
    [old] = [p for p in (copy / "data").glob("*.parquet") if OLD_CC in p.name]
    if how == "truncated":
        old.write_bytes(old.read_bytes()[:100])
    else:
        _damage(old)
    env.setenv("MODEL_SUPPORT_RESULTS", str(copy))
    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params["view"] = "charts"  # reads every stack's file
    at.run()
    assert not at.exception
    warnings = [
        w.value
        for w in at.warning
        if old.name.replace("-", "\\-") in w.value or old.name in w.value
    ]
    assert len(warnings) == 1, [w.value for w in at.warning]
    assert "dataset materialize --rebuild" in warnings[0]
    at.radio(key="view").set_value("All results").run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 7  # the newer stack's results, all of them
