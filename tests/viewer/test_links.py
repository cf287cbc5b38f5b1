"""Links and offline states: unknown URL values are reported, each model's details name the page,
Back and Forward restore what the URL says, and the rankings offline show the tested models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from viewer_support import MODELS, NEW_CC, OLD_CC, START, TRANSFORMERS, make_record, viewer_page

from model_support.store import ResultsStore


@pytest.fixture
def page(dataset: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    return viewer_page(dataset, monkeypatch, dead_hub)


def warnings(at: AppTest) -> str:
    return "\n".join(w.value.replace("\\", "") for w in at.warning)


def test_unknown_link_values_are_reported_not_silently_replaced(page: AppTest) -> None:
    page.query_params.update(
        view="nonsense", compiler="9.9.9", library="0.0.1", task="no-such-task", colour="red"
    )
    page.run()
    assert not page.exception
    said = warnings(page)
    assert "view `nonsense` does not exist" in said
    assert "compiler `9.9.9` has no results" in said
    assert "library `0.0.1` has no results" in said
    assert "task `no-such-task` is not one the viewer knows" in said
    assert "parameter `colour` is not read" in said
    # What is shown instead is the default, and the URL now says so.
    assert page.radio(key="view").value == "Selected"
    assert page.query_params["compiler"] == NEW_CC
    assert "colour" not in page.query_params


def test_unknown_compared_stack_is_reported(page: AppTest) -> None:
    page.query_params.update(view="compare", before="neuronx-cc 0.0 · transformers 1.0")
    page.run()
    assert not page.exception
    assert "before stack `neuronx-cc 0.0 · transformers 1.0` has no results" in warnings(page)


def test_a_linked_model_no_stack_has_is_reported(page: AppTest) -> None:
    page.query_params["model"] = "nobody/no-such-model"
    page.run()
    assert not page.exception
    assert "No stack in this dataset has a result for nobody/no-such-model" in warnings(page)
    assert "model-support run nobody/no-such-model" in [c.value for c in page.code]


def test_known_link_values_raise_no_warning(page: AppTest) -> None:
    page.query_params.update(view="all", compiler=NEW_CC, task="text-generation")
    page.run()
    assert not page.exception
    assert warnings(page) == ""


def test_each_models_details_set_the_page_title(
    page: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    titles: list[str | None] = []
    real: Callable[..., Any] = st.set_page_config

    def recording(*args: Any, **kwargs: Any) -> Any:
        titles.append(kwargs.get("page_title"))
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "set_page_config", recording)
    page.query_params["model"] = "Qwen/Qwen3-1.7B"
    page.run()
    assert not page.exception
    assert titles[-1] == "Qwen/Qwen3-1.7B · Model support on Trainium"
    page.selectbox(key="model").select("Qwen/Qwen3-0.6B").run()
    assert titles[-1] == "Qwen/Qwen3-0.6B · Model support on Trainium"
    titles.clear()
    page.selectbox(key="model").set_value(None).run()
    assert titles == ["Model support on Trainium"]  # no model: the page's own title again


def test_back_and_forward_restore_what_the_url_says(page: AppTest) -> None:
    """Streamlit pushes a history entry for each change of the query parameters and reruns with
    the earlier ones on Back: the page must show them, not write its state over them."""
    page.query_params["view"] = "all"
    page.run()
    first = dict(page.query_params)
    page.selectbox(key="model").select("Qwen/Qwen3-1.7B").run()
    with_model = dict(page.query_params)
    assert with_model["model"] == "Qwen/Qwen3-1.7B"
    page.radio(key="view").set_value("Triage").run()
    triage = dict(page.query_params)
    assert triage["view"] == "triage"

    page.query_params = dict(with_model)  # Back
    page.run()
    assert page.radio(key="view").value == "All results"
    assert page.selectbox(key="model").value == "Qwen/Qwen3-1.7B"
    assert dict(page.query_params) == with_model
    page.query_params = dict(first)  # Back again: no model
    page.run()
    assert page.selectbox(key="model").value is None
    assert not any("exceeds SBUF" in c.value for c in page.code)  # its details are gone
    assert dict(page.query_params) == first
    page.query_params = dict(triage)  # Forward twice
    page.run()
    assert page.radio(key="view").value == "Triage"
    assert page.selectbox(key="model").value == "Qwen/Qwen3-1.7B"
    assert dict(page.query_params) == triage


@pytest.mark.parametrize("view", ["trending", "downloads"])
def test_rankings_offline_fall_back_to_the_tested_models(page: AppTest, view: str) -> None:
    page.query_params["view"] = view
    page.run()
    assert not page.exception
    assert "could not be reached" in warnings(page)
    notes = [i.value.replace("\\", "") for i in page.info]
    what = "trending" if view == "trending" else "most downloaded"
    for task in ("text-generation", "image-text-to-text"):
        tested = sorted(m for m, t, _, _ in MODELS if t == task)
        [note] = [n for n in notes if f"Not the Hub's {what} {task} models" in n]
        assert f"these are the {len(tested)} {task} model" in note
        [shown] = [d.value for d in page.dataframe if set(d.value["model"]) & set(tested)]
        assert sorted(shown["model"]) == tested
        assert set(shown["task"]) == {task}
    # The tables lead to the details like any other.
    assert "Qwen/Qwen3-1.7B" in page.selectbox(key="model").options


def test_a_stack_with_fewer_results_says_how_many_and_which_has_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """The page opens on the newest stack; when it tested fewer models than another, it says so."""
    store = ResultsStore(str(tmp_path))
    store.add(make_record("org/a", "text-generation", "PASS", NEW_CC, START))
    for model in ("org/a", "org/b", "org/c"):
        store.add(make_record(model, "text-generation", "PASS", OLD_CC, START))
    store.materialize()
    at = viewer_page(tmp_path, monkeypatch, dead_hub, view="all").run()
    assert not at.exception
    assert at.selectbox(key="compiler").value == f"neuronx-cc {NEW_CC}"
    notes = [c.value.replace("\\", "") for c in at.caption if "tested on this stack" in c.value]
    assert notes == [
        f"1 of 3 models tested on this stack; "
        f"neuronx-cc {OLD_CC} · transformers {TRANSFORMERS} has the most: 3."
    ]
    at.selectbox(key="compiler").select(f"neuronx-cc {OLD_CC}").run()
    assert not [c for c in at.caption if "tested on this stack" in c.value]


def test_the_table_highlights_the_row_of_the_model_the_url_names(page: AppTest) -> None:
    """The table's selection follows the page's model: a link's model is highlighted, a URL
    without one (Back) highlights nothing, and picking another model moves the highlight."""

    def highlighted() -> list[int]:
        return list(page.session_state["table-all"]["selection"]["rows"])

    page.query_params.update(view="all", model="google/gemma-3-1b-it")
    page.run()
    assert not page.exception
    models = list(page.dataframe[0].value["model"])
    assert highlighted() == [models.index("google/gemma-3-1b-it")]
    page.query_params.clear()
    page.query_params["view"] = "all"  # Back to the table without a model
    page.run()
    assert highlighted() == [] and page.selectbox(key="model").value is None
    page.selectbox(key="model").select("Qwen/Qwen3-1.7B").run()
    assert highlighted() == [models.index("Qwen/Qwen3-1.7B")]
