"""Where a FAIL starts, in the viewer: a run's details name its first diverging module, and
Triage groups the FAILs of a stack by that module's kind across models."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from viewer_support import START, make_record, viewer_page

from model_support.records import FirstDivergence, ModuleDivergence, RunRecord
from model_support.store import ResultsStore
from model_support.vocabulary import DivergencePhase, LocalizationStatus

STACK = "2.28.7631.0"


def _module(name: str, kind: str, ratio: float) -> ModuleDivergence:
    return ModuleDivergence(
        module=name,
        kind=kind,
        error_ratio=ratio,
        q90_ratio=ratio,
        peak_ratio=ratio,
        device_error=ratio * 0.01,
        baseline_error=0.01,
        failed_checks=["median", "q90", "peak"],
    )


def _failed_at(model: str, layer: int) -> RunRecord:
    """A FAIL whose search found the attention output projection of one layer."""
    record = make_record(model, "text-generation", "FAIL", STACK, START + timedelta(days=2))
    found = _module(f"model.layers.{layer}.self_attn.o_proj", "Linear", 412.0)
    where = FirstDivergence(
        status=LocalizationStatus.FOUND,
        path=[
            _module("model", "LlamaModel", 50.0),
            _module(f"model.layers.{layer}", "LlamaDecoderLayer", 80.0),
            _module(f"model.layers.{layer}.self_attn", "LlamaAttention", 200.0),
        ],
        candidates=[_module(f"model.layers.{layer}.mlp", "LlamaMLP", 5.0)],
        rank=0,
        seconds=12.5,
        **found.model_dump(exclude={"rank", "ranks"}),
    )
    verification = record.document.verification.model_copy(update={"first_divergence": where})
    document = record.document.model_copy(update={"verification": verification})
    return record.model_copy(update={"document": document})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    store = ResultsStore(str(tmp_path))
    store.add(_failed_at("org/first", 3))
    store.add(_failed_at("org/second", 17))
    store.add(make_record("org/third", "text-generation", "FAIL", STACK, START + timedelta(days=2)))
    store.materialize()
    return tmp_path


def _page(results: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str, **params: str):
    page = viewer_page(results, monkeypatch, dead_hub, timeout=60)
    page.query_params.update(params)
    page.run()
    assert not page.exception, page.exception
    return page


def test_details_name_the_first_diverging_module_and_the_search(
    results: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    page = _page(results, monkeypatch, dead_hub, view="all", model="org/first")
    sentences = [m.value.replace("\\", "") for m in page.markdown]
    assert any(
        "first diverging module: model.layers.3.self_attn.o_proj (Linear), error ratio 412" in s
        and "(12.5 s)" in s
        for s in sentences
    ), sentences
    modules = next(d.value for d in page.dataframe if "role" in d.value.columns)
    assert list(modules["role"]) == [
        "enclosing",
        "enclosing",
        "enclosing",
        "first diverging",
        "next candidate",
    ]
    assert list(modules["module"])[3:] == [
        "model.layers.3.self_attn.o_proj",
        "model.layers.3.mlp",
    ]


def test_triage_groups_fails_by_the_kind_of_their_first_diverging_module(
    results: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    page = _page(results, monkeypatch, dead_hub, view="triage")
    groups = page.dataframe[0].value.set_index("signature")
    # Two models, different layers: one group. The FAIL without a search keeps its reason.
    group = groups.loc["FAIL, first diverging module: o_proj (Linear)"]
    assert (group["count"], group["models"]) == (2, "org/first, org/second")
    assert groups.loc["<n> bad tokens", "models"] == "org/third"


def test_details_name_the_rank_and_the_expert_of_a_sharded_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    record = make_record("org/moe", "text-generation", "FAIL", STACK, START + timedelta(days=2))
    layer = _module("model.layers.1", "Qwen3MoeDecoderLayer", 9.0).model_copy(
        update={"rank": 1, "ranks": [1]}
    )
    experts = _module("model.layers.1.mlp.experts", "Qwen3MoeExperts", 30.0)
    where = FirstDivergence(
        status=LocalizationStatus.FOUND,
        path=[layer],
        expert=2,
        diverging_experts=[2],
        seconds=3.0,
        **experts.model_dump(exclude={"rank", "ranks"}),
        rank=1,
        ranks=[1],
    )
    verification = record.document.verification.model_copy(update={"first_divergence": where})
    document = record.document.model_copy(update={"verification": verification})
    store = ResultsStore(str(tmp_path))
    store.add(record.model_copy(update={"document": document}))
    store.materialize()
    page = _page(tmp_path, monkeypatch, dead_hub, view="all", model="org/moe")
    sentences = [m.value.replace("\\", "") for m in page.markdown]
    assert any(
        "model.layers.1.mlp.experts (Qwen3MoeExperts)" in s and "on rank 1, expert 2 alone" in s
        for s in sentences
    ), sentences
    modules = next(d.value for d in page.dataframe if "role" in d.value.columns)
    assert list(modules["ranks"]) == ["1", "1"]


def test_a_fail_found_at_a_decode_step_says_so_in_the_details_and_in_triage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str
) -> None:
    """Where the search found the module is part of what is shown: the details say the decode
    step, and Triage groups it apart from the same kind of module found in the prefill."""
    store = ResultsStore(str(tmp_path))
    store.add(_failed_at("org/prefill", 3))
    decoding = make_record(
        "org/decode", "text-generation", "FAIL", STACK, START + timedelta(days=2)
    )
    act = _module("model.layers.0.mlp.act_fn", "SiLUActivation", 125.0)
    where = FirstDivergence(
        status=LocalizationStatus.FOUND,
        phase=DivergencePhase.DECODE,
        step=18,
        seconds=4.0,
        **act.model_dump(exclude={"rank", "ranks"}),
    )
    verification = decoding.document.verification.model_copy(update={"first_divergence": where})
    document = decoding.document.model_copy(update={"verification": verification})
    store.add(decoding.model_copy(update={"document": document}))
    store.materialize()
    page = _page(tmp_path, monkeypatch, dead_hub, view="all", model="org/decode")
    sentences = [m.value.replace("\\", "") for m in page.markdown]
    assert any(
        "first diverging module, from decode step 18: model.layers.0.mlp.act_fn (SiLUActivation)"
        ", error ratio 125" in s
        for s in sentences
    ), sentences
    groups = _page(tmp_path, monkeypatch, dead_hub, view="triage").dataframe[0].value
    signatures = set(groups["signature"])
    assert "FAIL, first diverging module in a decode step: act_fn (SiLUActivation)" in signatures
    # A record without a phase (searched before phases were recorded) keeps its label.
    assert "FAIL, first diverging module: o_proj (Linear)" in signatures
