"""The History and Regressions views through streamlit.testing.v1.AppTest, on the shared
dataset (two neuronx-cc versions, and a re-run on the newer one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, OLD_CC, TRANSFORMERS, viewer_page

from model_support.store import ResultsStore
from model_support.viewer.views import RESULT_COLOURS

OLD = f"neuronx-cc {OLD_CC} · transformers {TRANSFORMERS}"
NEW = f"neuronx-cc {NEW_CC} · transformers {TRANSFORMERS}"


@pytest.fixture
def page(dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(dataset, monkeypatch, dead_hub)


def _table(at: AppTest, key: str):
    """The Regressions view's tables: regressions first, then fixes."""
    return at.dataframe[{"regressions-table": 0, "fixes-table": 1}[key]].value


def test_history_shows_every_run_a_flip_and_a_chart(page: AppTest, dataset: Path) -> None:
    page.query_params["view"] = "history"
    page.query_params["model"] = "Qwen/Qwen3-0.6B"
    page.run()
    assert not page.exception
    runs = page.dataframe[0].value
    assert list(runs["stack"]) == [OLD, NEW, NEW]
    assert list(runs["result"]) == ["PASS", "TIMEOUT", "PASS"]
    assert runs["changed on this stack"].isna().tolist() == [True, True, False]
    assert runs["changed on this stack"].iloc[2] == "TIMEOUT -> PASS"
    assert runs["error ratio"].fillna(-1).tolist() == [1.02, -1, 1.02]  # the verdict's figures
    assert runs["core-hours"].tolist() == [0.05, 0.05, 0.05]  # 3 minutes on one core each
    assert runs["cost"].isna().all()  # the runs recorded no instance type: no price to use
    assert runs["reproduce"].iloc[1] == f"model-support reproduce {runs['run id'].iloc[1]}"
    assert {m.label: m.value for m in page.metric}["runs"] == "3"
    (chart,) = page.get("vega_lite_chart")
    spec = chart.proto.spec  # a point per run, coloured by stack, over time
    assert '"field": "stack"' in spec and '"field": "finished"' in spec and "wall time (s)" in spec
    assert page.query_params["view"] == "history"
    assert page.query_params["model"] == "Qwen/Qwen3-0.6B"
    # Nothing but the page's own text: a bare string in app.py would be drawn (Streamlit magic).
    assert not [m.value for m in page.markdown if "parameters" in m.value]


def test_history_deep_link_opens_one_runs_details(page: AppTest, dataset: Path) -> None:
    store = ResultsStore(dataset)
    older = store.history(filters=[("model_id", "==", "Qwen/Qwen3-1.7B")])
    run_id = older.sort_values("finished_at")["run_id"].iloc[0]  # the old stack's PASS
    page.query_params.update(view="history", model="Qwen/Qwen3-1.7B", run=run_id)
    page.run()
    assert not page.exception
    headings = [h.value for h in page.subheader]
    assert any(run_id.replace("-", "\\-") in h or run_id in h for h in headings)
    # The dataset is a folder of the viewer's machine: the command says what to replace.
    assert any(
        c.value.startswith(f"model-support reproduce {run_id} --results RESULTS") for c in page.code
    )
    assert not [c.value for c in page.code if str(dataset) in c.value]
    assert any('"model": "Qwen/Qwen3-1.7B"' in c.value for c in page.code)  # run.py's config
    assert page.query_params["run"] == run_id


def test_regressions_compare_the_two_newest_stacks_by_default(page: AppTest) -> None:
    page.query_params["view"] = "regressions"
    page.run()
    assert not page.exception
    assert page.selectbox(key="before").value == OLD
    assert page.selectbox(key="after").value == NEW
    found = _table(page, "regressions-table").set_index("model")
    assert found.loc["Qwen/Qwen3-1.7B", "group"] == "ERROR compile"
    assert found.loc["llava-hf/llava-1.5-7b-hf", "group"] == "TIMEOUT"
    assert found.loc["Qwen/Qwen3-1.7B", "reproduce"].startswith("model-support reproduce ")
    fixes = _table(page, "fixes-table")
    assert list(fixes["model"]) == ["meta-llama/Llama-3.2-1B"]
    assert list(fixes["group"]) == ["was FAIL"]
    metrics = {m.label: m.value for m in page.metric}
    assert (metrics["regressions"], metrics["fixes"]) == ("2", "1")
    page.toggle(key="report-toggle").set_value(True).run()
    markdown = next(c.value for c in page.code if c.value.startswith("# Regressions"))
    assert "### ERROR compile (1)" in markdown
    assert (page.query_params["before"], page.query_params["after"]) == (OLD, NEW)


def test_a_regression_opens_its_two_runs_side_by_side(page: AppTest) -> None:
    """Picked (or clicked), a regression shows the compared stacks' runs, never the sidebar's."""
    page.query_params["view"] = "regressions"
    page.run()
    pair = page.selectbox(key="pair")
    assert pair.value is None and "Qwen/Qwen3-1.7B · text-generation" in pair.options
    pair.set_value("Qwen/Qwen3-1.7B · text-generation").run()
    assert not page.exception
    said = [m.value.replace("\\", "") for m in page.markdown]  # labels are escaped markup
    before = next(i for i, m in enumerate(said) if m.startswith("**Before**"))
    assert OLD in said[before] and NEW in said[before + 2]
    assert said[before + 1].startswith(f":{RESULT_COLOURS['PASS']}-background[PASS]")
    after = said[before + 3]
    assert after.startswith(f":{RESULT_COLOURS['ERROR']}-background[ERROR]")
    assert "error class `compile`" in after and "neuronx-cc failed: tensor" in after
    assert "wall time 123.4 s" in after
    assert any(m.startswith("Change: wall time +0% · decode tokens/s +0%") for m in said)


def test_a_changed_threshold_without_a_reason_keeps_the_defaults(page: AppTest) -> None:
    page.query_params.update(view="regressions", before=NEW, after=OLD)
    page.run()
    page.toggle(key="report-toggle").set_value(True).run()
    assert list(_table(page, "regressions-table")["model"]) == ["meta-llama/Llama-3.2-1B"]
    page.number_input(key="decode-drop").set_value(50.0).run()
    assert any("needs a reason" in w.value for w in page.warning)
    markdown = next(c.value for c in page.code if c.value.startswith("# Regressions"))
    assert "by more than 10%" in markdown
    page.text_input(key="threshold-reason").input("decode is noisy on shared hosts").run()
    assert not page.warning
    markdown = next(c.value for c in page.code if c.value.startswith("# Regressions"))
    assert "by more than 50%: decode is noisy on shared hosts" in markdown


def test_a_fails_history_says_why_and_its_times_are_utc_on_a_24_hour_clock(
    explained_dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    import json

    at = viewer_page(explained_dataset, monkeypatch, dead_hub, view="history", model="org/fails")
    at.run()
    assert not at.exception
    runs = at.dataframe[0].value
    assert list(runs["why"]) == ["tokens, median"]  # a FAIL's failed checks, as the lists say
    (chart,) = at.get("vega_lite_chart")
    x = json.loads(chart.proto.spec)["layer"][0]["encoding"]["x"]
    assert x["scale"] == {"type": "utc"} and x["axis"]["format"] == "%Y-%m-%d %H:%M"
    assert x["title"] == "finished (UTC)"
