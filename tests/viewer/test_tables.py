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
from model_support.viewer import formatting, queries, views
from model_support.vocabulary import Result

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
    assert formatting.missing(rows.loc["org/passes", "why"])  # a PASS has no reason...
    assert page.dataframe[0].proto.placeholder == ""  # ...drawn as a blank, not as "None"
    # A missing number stays a number (it sorts as one) and is drawn blank too.
    assert rows["wall time (s)"].isna().any()
    assert pd.api.types.is_numeric_dtype(rows["wall time (s)"])
    (counts,) = [m.value for m in page.markdown if "results**" in m.value]
    assert counts.startswith(f"**{len(rows)} results** of {len(rows)} models: ")
    # Every result counted at a glance, as badges in the results' colours.
    assert ":red-badge[FAIL 1]" in counts and ":orange-badge[ERROR 1]" in counts


def test_a_column_empty_on_the_page_is_left_out(page: AppTest) -> None:
    """At 1280 pixels a list has no room for a column with nothing in it."""
    _run(page, view="all", q="passes")
    columns = set(page.dataframe[0].value.columns)
    assert "why" not in columns  # nothing on this page failed
    assert {"model", "result", "cores", "wall time (s)"} <= columns
    _run(page, view="all", q="")
    assert "why" in page.dataframe[0].value.columns


def test_a_list_leaves_out_columns_with_nothing_in_them() -> None:
    table = pd.DataFrame(
        {
            "model": ["/models/llama", "/models/qwen"],  # local paths: no Hub page
            "result": [None, None],
            "why": ["", None],
            "cores": [None, 4],
            views.HUB_COLUMN: [None, None],
        }
    )
    assert list(views.without_empty_columns(table).columns) == ["model", "result", "cores"]


EXPLAINED_MODELS = ("org/fails", "org/errors", "org/too-large", "org/passes", "org/on-cpu")
"""build_explained_dataset's models on the newest stack: one of each kind of result."""

TABLE_PAGES = [
    *({"view": view} for view in ("all", "triage", "compare", "regressions")),
    *({"view": "all", "model": model} for model in EXPLAINED_MODELS),
    {"view": "history", "model": "org/older"},
]


@pytest.mark.parametrize("params", TABLE_PAGES, ids=lambda p: "-".join(p.values()))
def test_no_table_draws_the_word_none_for_a_missing_value(
    page: AppTest, params: dict[str, str]
) -> None:
    """Streamlit's grid draws a missing value, text or number, as "None" unless the table says
    otherwise: every table of every view and of every kind of result's details says blank."""
    _run(page, **params)
    assert page.dataframe, "the page has tables"
    for table in page.dataframe:
        assert table.proto.HasField("placeholder") and table.proto.placeholder == ""


def test_a_list_shows_result_badges_speeds_and_hub_links(page: AppTest, dead_hub: str) -> None:
    _run(page, view="all")
    table = page.dataframe[0]
    config = json.loads(table.proto.columns)
    # Results as badges, one colour per result ("not tested" too), the values still the names.
    assert config["result"]["type_config"]["type"] == "multiselect"
    badges = {o["value"]: o["color"] for o in config["result"]["type_config"]["options"]}
    assert set(badges) == {r.value for r in Result} | {queries.UNTESTED}
    assert len({badges[r.value] for r in Result}) == len(Result)
    rows = table.value.set_index("model")
    assert rows.loc["org/passes", "result"] == "PASS"
    # The run's compile time and decode speed beside its wall time, with short headers.
    assert rows.loc["org/passes", "compile time (s)"] == 100.0
    assert rows.loc["org/passes", "decode (tok/s)"] == 55.5
    assert config["decode (tok/s)"]["label"] == "tok/s"
    assert "tokens per second" in config["decode (tok/s)"]["help"]
    # Each model's page on the Hub the viewer reads (here the test's), as a link.
    assert config["Hub"]["type_config"]["type"] == "link"
    assert rows.loc["org/passes", "Hub"] == f"{dead_hub}/org/passes"
    # Text columns as wide as their longest value (the automatic width follows the header),
    # and the model's name pinned while a wide list scrolls sideways.
    for column in ("model", "task", "why"):
        longest = int(table.value[column].astype("string").str.len().max())
        assert config[column]["width"] >= 6 * longest + 16, column
    assert config["model"]["pinned"] is True


def test_a_model_tested_from_a_local_path_has_no_hub_link() -> None:
    assert formatting.hub_page("org/name", "https://hub.example/") == "https://hub.example/org/name"
    assert formatting.hub_page("gpt2", "https://hub.example") == "https://hub.example/gpt2"
    assert formatting.hub_page("/models/llama", "https://hub.example") is None
    assert formatting.hub_page("org/../name", "https://hub.example") is None


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
    assert page.dataframe[0].proto.placeholder == ""


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
    notes = [c.value for c in page.caption if "not Trainium" in c.value]
    assert len(notes) == 1 and notes[0].startswith("Ran on CPU, not Trainium")
    trainium = AppTest.from_file(APP, default_timeout=30)
    trainium.query_params["view"] = "all"
    trainium.run()
    assert not [c.value for c in trainium.caption if "not Trainium" in c.value]


def test_a_too_large_model_no_hardware_holds_shows_no_core_count() -> None:
    """Sizing records 1 core for a too-large model no count of the hardware would hold (the
    demo's 405B one on a small machine): the list leaves the count blank rather than say 1."""
    base = dict.fromkeys(queries.LIST_COLUMNS)
    frame = pd.DataFrame(
        [
            base | {"model_id": "org/huge", "task": "text-generation", "result": "EXCLUDED",
                    "exclusion_reason": "too-large", "neuron_cores": 1},
            base | {"model_id": "org/large", "task": "text-generation", "result": "EXCLUDED",
                    "exclusion_reason": "too-large", "neuron_cores": 64},
            base | {"model_id": "org/small", "task": "text-generation", "result": "PASS",
                    "neuron_cores": 1},
        ]
    )  # fmt: skip
    cores = queries.results_table(frame).set_index("model")["cores"]
    assert pd.isna(cores["org/huge"])
    assert cores["org/large"] == 64  # the cores it would need
    assert cores["org/small"] == 1
