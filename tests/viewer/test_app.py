"""The viewer page through streamlit.testing.v1.AppTest, on a dataset made by the real store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, OLD_CC, START, TRANSFORMERS, make_record, viewer_page

from model_support.rankings import get_ranking
from model_support.script import runner_constant
from model_support.store import ResultsStore
from model_support.viewer.views import RESULT_CHART_COLOURS, RESULT_COLOURS
from model_support.vocabulary import Result, Task

APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")


@pytest.fixture
def page(dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str):
    """An AppTest on the shared dataset, Hub unreachable unless a test points it elsewhere."""
    return viewer_page(dataset, monkeypatch, dead_hub)


def table(at: AppTest, index: int = 0):
    return at.dataframe[index].value


def codes(at: AppTest) -> str:
    return "\n".join(c.value for c in at.code)


def test_the_page_shows_none_of_its_scripts_own_notes(page: AppTest) -> None:
    """Streamlit's magic draws every bare string of the page's script (its docstring aside) as
    markdown, on every view: a note to the code's reader must never reach the page."""
    import ast

    script = ast.parse(Path(APP).read_text())
    notes = [
        node.value.value
        for node in ast.walk(script)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and node is not script.body[0]
    ]
    page.run()
    assert not page.exception
    shown = [m.value for m in page.markdown]
    assert not [note for note in notes if note in shown]


def test_selected_view_lists_the_curated_models(page: AppTest) -> None:
    page.run()
    assert not page.exception
    rows = table(page).set_index("model")
    assert list(rows.index) == [
        "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "meta-llama/Llama-3.2-1B",
        "llava-hf/llava-1.5-7b-hf", "openai/gpt-oss-120b", "someone/not-yet-run",
    ]  # fmt: skip
    assert rows.loc["Qwen/Qwen3-1.7B", "result"] == "ERROR"
    assert rows.loc["Qwen/Qwen3-1.7B", "why"] == "compile"
    assert rows.loc["Qwen/Qwen3-0.6B", "cores"] == 1
    assert rows.loc["Qwen/Qwen3-0.6B", "wall time (s)"] == 123.4
    assert rows.loc["Qwen/Qwen3-0.6B", "peak device memory (GiB)"] == 3.0
    assert rows.loc["openai/gpt-oss-120b", "result"] == "EXCLUDED"
    assert "MXFP4" in rows.loc["openai/gpt-oss-120b", "why"]
    assert rows.loc["someone/not-yet-run", "result"] == "not tested"
    # The newest compiler is the default, and the page writes its state into the URL.
    assert page.selectbox(key="compiler").value == f"neuronx-cc {NEW_CC}"
    assert page.query_params["view"] == "selected"
    assert page.query_params["compiler"] == NEW_CC
    assert page.query_params["library"] == TRANSFORMERS


def test_compiler_selector_switches_the_stack(page: AppTest) -> None:
    page.run()
    assert page.selectbox(key="compiler").options == [
        f"neuronx-cc {NEW_CC}",
        f"neuronx-cc {OLD_CC}",
    ]
    assert page.selectbox(key="library").options == [f"transformers {TRANSFORMERS}"]
    page.selectbox(key="compiler").select(f"neuronx-cc {OLD_CC}").run()
    rows = table(page).set_index("model")
    assert rows.loc["Qwen/Qwen3-1.7B", "result"] == "PASS"
    assert rows.loc["meta-llama/Llama-3.2-1B", "result"] == "FAIL"
    assert page.query_params["compiler"] == OLD_CC


def test_search_narrows_all_results(page: AppTest) -> None:
    page.query_params["view"] = "all"
    page.run()
    assert len(table(page)) == 7
    page.text_input(key="q").input("QWEN").run()
    assert sorted(table(page)["model"]) == ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"]
    assert page.query_params["q"] == "QWEN"
    page.selectbox(key="task").select("image-text-to-text")
    page.text_input(key="q").input("").run()
    assert list(table(page)["model"]) == ["llava-hf/llava-1.5-7b-hf"]
    assert list(table(page)["result"]) == ["TIMEOUT"]


def test_deep_link_opens_the_model_details(page: AppTest) -> None:
    page.query_params["model"] = "Qwen/Qwen3-1.7B"
    page.run()
    assert not page.exception
    assert page.selectbox(key="model").value == "Qwen/Qwen3-1.7B"
    text = codes(page)
    assert "exceeds SBUF" in text  # the error
    assert '"model": "Qwen/Qwen3-1.7B"' in text  # run.py's config block
    assert "python3 run.py" in text
    # No cache whose entries a reader can verify holds its graphs (the public NEFF cache is an
    # unsigned mirror): no pull command, and the page says why.
    assert "model-support cache pull" not in text
    assert any("whose entries you can verify" in m.value for m in page.markdown)
    # What to install on top of the TorchNeuron image: what the run added, not what the image
    # brings (torch-neuronx comes with it), at the versions its pod reported: a claim, said so.
    assert "transformers==5.24.0" in text and "torch-neuronx==2.13.0" not in text
    assert any("its pod reported" in m.value and "not checked" in m.value for m in page.markdown)
    where = next(m.value for m in page.markdown if m.value.startswith("Or step by step. Where: "))
    assert str(runner_constant("TORCHNEURON_BASE_IMAGE")) in where, where
    assert any("Package indexes" in c.value and "pypi.org" in c.value for c in page.caption)
    assert "model-support reproduce" in text and "--results" in text and "-o reproduce" in text
    labels = [b.proto.label for b in page.get("download_button")]
    assert "Download requirements.txt" in labels
    assert any(label.startswith("Download run.py") for label in labels)
    stacks = [j.value for j in page.json]
    assert any(f'"neuronx_cc": "{NEW_CC}"' in s for s in stacks)
    assert page.query_params["model"] == "Qwen/Qwen3-1.7B"


def test_deep_link_with_view_and_versions(page: AppTest) -> None:
    page.query_params.update(
        view="all", compiler=OLD_CC, library=TRANSFORMERS, model="meta-llama/Llama-3.2-1B"
    )
    page.run()
    assert page.radio(key="view").value == "All results"
    assert page.selectbox(key="compiler").value == f"neuronx-cc {OLD_CC}"
    assert any("3 bad tokens" in m.value for m in page.markdown)
    details = page.dataframe[1].value  # the verification figures
    assert details.loc[0, "bad tokens"] == 3


def test_model_without_a_result_on_the_stack_says_where_it_has_one(page: AppTest) -> None:
    page.query_params["model"] = "someone/not-yet-run"
    page.run()
    assert any("has no result" in i.value for i in page.info)


def test_trending_view_marks_untested_and_excluded(
    page: AppTest, hub: str, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "results"
    shutil.copytree(dataset, copy)
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(copy))
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", hub)
    page.query_params["view"] = "trending"
    page.run()
    assert not page.exception
    text_gen = table(page, 0).set_index("model")
    assert list(text_gen.index)[:2] == ["brand/new-model", "deepseek-ai/DeepSeek-V3"]
    assert text_gen.loc["brand/new-model", "result"] == "not tested"
    assert text_gen.loc["deepseek-ai/DeepSeek-V3", "result"] == "EXCLUDED"
    assert text_gen.loc["deepseek-ai/DeepSeek-V3", "why"] == "too-large"
    assert text_gen.loc["Qwen/Qwen3-1.7B", "result"] == "ERROR"
    assert "downloads" not in text_gen.columns
    vision = table(page, 1).set_index("model")
    assert vision.loc["llava-hf/llava-1.5-7b-hf", "result"] == "TIMEOUT"
    assert vision.loc["some/vision-model", "result"] == "not tested"
    # The live ranking was stored with the dataset for offline use.
    assert (copy / "rankings" / "text-generation-trending_score.json").is_file()


def test_trending_view_says_what_the_last_sweep_ranked_and_when(
    page: AppTest, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from model_support.ranking_snapshots import RankingSnapshot

    copy = tmp_path / "results"
    shutil.copytree(dataset, copy)
    store = ResultsStore(copy)
    store.add_ranking_snapshot(
        RankingSnapshot(
            taken_at=datetime(2026, 11, 30, 2, 5, tzinfo=UTC),
            kind="hub",
            source="hub:trending/text-generation/top3",
            models=["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "someone/not-yet-run"],
            task="text-generation",
            sweep="ml/nightly",
        )
    )
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(copy))
    page.query_params.update(view="trending", task="text-generation")
    page.run()
    assert not page.exception
    [caption] = [c.value for c in page.caption if "ranked 3 models" in c.value]
    # The sweep's names are shown literally (escaped markdown); the time and the share as is.
    assert caption.startswith("Sweep ml") and "nightly" in caption and "top3" in caption
    assert caption.endswith("on 2026-11-30 02:05 UTC; 2 of them have a result on this stack.")


def test_downloads_view_offline_uses_the_stored_ranking(
    page: AppTest, hub: str, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "results"
    shutil.copytree(dataset, copy)
    get_ranking(str(copy), "text-generation", "downloads", endpoint=hub)  # an earlier live fetch
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(copy))
    page.query_params.update(view="downloads", task="text-generation")
    page.run()
    assert any("stored with the dataset" in w.value and "old" in w.value for w in page.warning)
    rows = table(page)
    assert list(rows["model"])[:2] == ["Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B"]
    assert "downloads" in rows.columns


def test_ranking_without_hub_or_snapshot_says_so(page: AppTest) -> None:
    page.query_params["view"] = "downloads"
    page.run()
    # One warning for all the tasks (the Hub was probed once, not once per task).
    (warning,) = [w.value for w in page.warning]
    assert "could not be reached" in warning and "no stored ranking" in warning
    assert all(task.value in warning.replace("\\", "") for task in Task)  # escaped Markdown


def test_triage_groups_the_same_failure_across_models(page: AppTest) -> None:
    page.query_params["view"] = "triage"
    page.run()
    groups = table(page)
    assert groups.loc[0, "count"] == 3
    assert (
        groups.loc[0, "signature"]
        == "neuronx-cc failed: tensor <name> of shape <n>x<n> exceeds SBUF at <hex> (<path>)"
    )
    assert (
        groups.loc[0, "models"]
        == "Qwen/Qwen3-1.7B, google/gemma-3-1b-it, mistralai/Mistral-7B-v0.3"
    )
    assert page.selectbox(key="model").options == [
        "Qwen/Qwen3-1.7B",
        "google/gemma-3-1b-it",
        "mistralai/Mistral-7B-v0.3",
    ]


def test_compare_shows_regressions_and_fixes(page: AppTest) -> None:
    page.query_params["view"] = "compare"
    page.run()
    assert page.selectbox(key="before").value.startswith(f"neuronx-cc {OLD_CC}")
    assert page.selectbox(key="after").value.startswith(f"neuronx-cc {NEW_CC}")
    changes = table(page).set_index("model")
    assert changes.loc["Qwen/Qwen3-1.7B", "change"] == "regression"
    assert changes.loc["meta-llama/Llama-3.2-1B", "change"] == "fix"
    assert "Qwen/Qwen3-0.6B" not in changes.index  # unchanged models hidden by default
    page.checkbox(key="show-same").check().run()
    everything = table(page).set_index("model")
    assert everything.loc["Qwen/Qwen3-0.6B", "change"] == "same"
    # ERROR both times, but at another stage (load before, compile after): a change worth seeing.
    assert everything.loc["google/gemma-3-1b-it", "change"] == "changed"


def test_compare_choices_are_a_deep_link(page: AppTest) -> None:
    page.query_params["view"] = "compare"
    page.run()
    before, after = page.selectbox(key="before").value, page.selectbox(key="after").value
    # Swapped by hand: the URL follows, and a new session opened on that URL shows the same.
    page.selectbox(key="before").set_value(after).run()
    page.selectbox(key="after").set_value(before).run()
    assert (page.query_params["before"], page.query_params["after"]) == (after, before)
    fresh = AppTest.from_file(APP, default_timeout=30)
    for key, value in page.query_params.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception
    assert (fresh.selectbox(key="before").value, fresh.selectbox(key="after").value) == (
        after,
        before,
    )
    fresh.checkbox(key="show-same").check().run()
    assert table(fresh).set_index("model").loc["Qwen/Qwen3-1.7B", "change"] == "fix"  # reversed


def test_charts_show_pass_rate_and_wall_time_against_parameters(page: AppTest) -> None:
    page.query_params["view"] = "charts"
    page.run()
    assert not page.exception
    charts = page.get("vega_lite_chart")
    assert len(charts) == 2
    spec = charts[0].proto.spec
    assert "pass_rate" in spec and f"neuronx-cc {NEW_CC}" in str(charts[0].proto)
    scatter = str(charts[1].proto)
    assert "parameters" in scatter and "wall time (s)" in scatter
    assert "Qwen/Qwen3-1.7B" in scatter  # a model that ran is a point


def test_empty_results_location_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    at = viewer_page(tmp_path, monkeypatch, dead_hub).run()
    assert not at.exception
    assert any("No results yet" in i.value for i in at.sidebar.info)
    assert any("No selected list" in i.value for i in at.info)


def test_every_result_has_its_own_badge_colour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """An UNVERIFIED run (verification switched off) reads as such, not as a PASS or a grey row."""
    store = ResultsStore(str(tmp_path))
    store.add(make_record("org/unchecked", "text-generation", "UNVERIFIED", NEW_CC, START))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub)
    at.query_params["model"] = "org/unchecked"
    at.run()
    assert not at.exception
    assert any(":blue-background[UNVERIFIED]" in m.value for m in at.markdown)
    assert len(set(RESULT_COLOURS.values())) == len(Result) == len(RESULT_CHART_COLOURS)


def test_triage_lists_the_groups_models_in_a_clickable_table(page: AppTest) -> None:
    page.query_params["view"] = "triage"
    page.run()
    assert not page.exception
    assert list(table(page, 1)["model"]) == [
        "Qwen/Qwen3-1.7B",
        "google/gemma-3-1b-it",
        "mistralai/Mistral-7B-v0.3",
    ]
    signatures = page.selectbox(key="signature").options
    page.selectbox(key="signature").select(signatures[1]).run()
    assert list(table(page, 1)["model"]) == ["llava-hf/llava-1.5-7b-hf"]
