"""The details of a run that used a compile cache: its figures, and the exact pull command."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, START, build_dataset, make_record, viewer_page

from model_support.records import CacheTransferFigures, Compilation, CompileCacheFigures
from model_support.viewer.queries import compile_cache_pull

MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_hub: str) -> AppTest:
    store = build_dataset(tmp_path / "results")
    record = make_record(MODEL, "text-generation", "PASS", NEW_CC, START + timedelta(days=3))
    document = record.document.model_copy(
        update={
            "compilation": Compilation(
                graphs=4, cache_hits=3, cache_misses=1, cache_hit=False, cache="neff"
            ),
            "compile_cache": CompileCacheFigures(
                target="s3://team bucket/neff-cache",
                prefix=f"neuronxcc-{NEW_CC}",
                pull=CacheTransferFigures(entries=3, bytes=6 * 2**20, seconds=1.25),
                push=CacheTransferFigures(entries=1, bytes=2**20, seconds=0.5, error=None),
            ),
        }
    )
    store.add(record.model_copy(update={"document": document}))
    store.materialize()
    monkeypatch.setenv("MODEL_SUPPORT_VIEWER_CACHE_TARGETS", "s3://team bucket")
    return viewer_page(tmp_path / "results", monkeypatch, dead_hub)


def test_details_show_the_cache_figures_and_the_pull_command_for_the_runs_compiler(
    page: AppTest,
) -> None:
    page.query_params["model"] = MODEL
    page.run()
    assert not page.exception
    codes = "\n".join(c.value for c in page.code)
    # the run's own cache, at its compiler's prefix, quoted for the shell
    assert f"model-support cache pull 's3://team bucket/neff-cache/neuronxcc-{NEW_CC}'" in codes
    frames = [f.value for f in page.dataframe]
    cache = next(f for f in frames if "pulled entries" in f.columns).iloc[0]
    assert (cache["hits"], cache["misses"], cache["pulled entries"], cache["pushed entries"]) == (
        3,
        1,
        3,
        1,
    )
    assert cache["pulled MiB"] == 6.0 and cache["pull s"] == 1.25


def test_the_pull_command_falls_back_to_the_public_neff_cache_and_never_invents_one() -> None:
    neuron = {"neuronx_cc": NEW_CC, "compiler": "neuronx-cc"}
    command, origin = compile_cache_pull(neuron) or ("", "")
    assert command == (
        f"model-support cache pull hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{NEW_CC}"
    )
    assert "public" in origin
    inductor = {"compiler": "inductor", "torch": "2.13.0+cpu", "neuronx_cc": None}
    assert compile_cache_pull(inductor) is None  # no shared inductor cache unless one was recorded
    recorded = {
        **inductor,
        "compile_cache_target": "/mnt/pvc/cache",
        "compile_cache_prefix": "inductor-torch-2.13.0+cpu",
    }
    assert compile_cache_pull(recorded, ["/mnt/pvc/{namespace}"]) == (
        "model-support cache pull /mnt/pvc/cache/inductor-torch-2.13.0+cpu",
        "the cache this run pulled and pushed",
    )
    # A target the operator did not configure is never offered: whoever wrote it runs code
    # in those who pull from it.
    assert compile_cache_pull(recorded, []) is None
    assert compile_cache_pull(recorded, ["/mnt/other"]) is None
    assert (
        compile_cache_pull(
            {**recorded, "compile_cache_target": "/mnt/pvc/../x"}, ["/mnt/pvc/{namespace}"]
        )
        is None
    )
    poisoned = {**neuron, "compile_cache_target": "s3://attacker/neff"}
    command, _ = compile_cache_pull(poisoned, ["s3://org-cache"]) or ("", "")
    assert "attacker" not in command and "torch-neuronx-neff-cache" in command
