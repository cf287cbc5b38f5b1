"""The viewer's tables as people read them: blanks rather than "None", the failed checks in the
"why" column, a count on every list, numbers with separators and parameter counts that do not
round a tiny model to 0, and CPU results said to be CPU's."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import viewer_page

from model_support.rankings import RankedModel, Ranking
from model_support.viewer import queries

APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")


@pytest.fixture
def page(explained_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(explained_dataset, monkeypatch, dead_hub)


def _run(page: AppTest, **params: str) -> AppTest:
    page.query_params.update(params)
    page.run()
    assert not page.exception
    return page


def test_all_results_show_blanks_failed_checks_and_a_count(page: AppTest) -> None:
    _run(page, view="all")
    rows = page.dataframe[0].value.set_index("model")
    assert rows.loc["org/fails", "why"] == "tokens, median"  # a FAIL says which checks failed
    assert rows.loc["org/errors", "why"] == "compile"
    assert rows.loc["org/too-large", "why"] == "too-large"
    assert rows.loc["org/too-large", "cores"] == 64  # the cores sizing says it would need
    assert rows.loc["org/passes", "why"] == ""  # a PASS has no reason: a blank, not "None"
    assert not rows.select_dtypes(exclude="number").isna().any().any()
    # A missing number stays a number (it sorts as one).
    assert pd.api.types.is_numeric_dtype(rows["wall time (s)"])
    assert any(c.value == f"{len(rows)} rows" for c in page.caption)


def test_numbers_are_written_with_separators(page: AppTest) -> None:
    _run(page, view="all")
    config = json.loads(page.dataframe[0].proto.columns)
    assert config["wall time (s)"]["type_config"]["format"] == "localized"
    assert config["peak device memory (GiB)"]["type_config"]["format"] == "localized"


def test_triage_counts_its_groups_and_failures(page: AppTest) -> None:
    _run(page, view="triage")
    groups = page.dataframe[0].value
    assert any(
        c.value == f"{len(groups)} groups of {int(groups['count'].sum())} failures"
        for c in page.caption
    )
    assert not groups.isna().any().any()


def test_a_ranking_keeps_a_tiny_models_parameter_count() -> None:
    ranking = Ranking(
        task="text-generation",
        sort="downloads",
        endpoint="http://hub",
        fetched_at=datetime(2026, 12, 1, tzinfo=UTC),
        models=[
            RankedModel(rank=1, model_id="tiny/one", downloads=12_345, parameters=1_234_567),
            RankedModel(rank=2, model_id="big/two", downloads=10, parameters=7_000_000_000),
        ],
    )
    frame = pd.DataFrame(columns=list(queries.LIST_COLUMNS))
    table = queries.ranking_table(ranking, frame).set_index("model")
    assert table.loc["tiny/one", "parameters"] == 1_234_567  # not 0.0 (billions to 2 places)
    assert table.loc["big/two", "parameters"] == 7_000_000_000


def test_cpu_results_are_labelled_as_cpu(page: AppTest) -> None:
    _run(page, view="all", compiler="2.13.0")
    notes = [i.value for i in page.info if "not on Trainium" in i.value]
    assert len(notes) == 1 and "CPU" in notes[0] and "inductor" in notes[0]
    trainium = AppTest.from_file(APP, default_timeout=30)
    trainium.query_params["view"] = "all"
    trainium.run()
    assert not [i.value for i in trainium.info if "not on Trainium" in i.value]
