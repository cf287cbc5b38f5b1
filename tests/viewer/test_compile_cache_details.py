"""The details of a run that used a compile cache: its figures, and the exact pull command."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from chart_values import REQUIRED_CHART_VALUES
from streamlit.testing.v1 import AppTest
from viewer_support import NEW_CC, START, build_dataset, make_record, viewer_page

from model_support.records import CacheTransferFigures, Compilation, CompileCacheFigures
from model_support.viewer.queries import compile_cache_pull

MODEL = "Qwen/Qwen3-0.6B"
KEY = "ed25519:" + "A" * 43 + "="


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
    monkeypatch.setenv("MODEL_SUPPORT_VIEWER_CACHE_TRUSTED_KEYS", KEY)
    return viewer_page(tmp_path / "results", monkeypatch, dead_hub)


def test_details_show_the_cache_figures_and_the_pull_command_for_the_runs_compiler(
    page: AppTest,
) -> None:
    page.query_params["model"] = MODEL
    page.run()
    assert not page.exception
    codes = "\n".join(c.value for c in page.code)
    # the run's own (shared) cache, at its compiler's prefix, quoted for the shell, with the
    # keys its entries are checked against
    assert (
        f"model-support cache pull 's3://team bucket/neff-cache/neuronxcc-{NEW_CC}' "
        f"--trusted-key {KEY}"
    ) in codes
    captions = " ".join(c.value for c in page.caption)
    assert "takes only entries that a manifest signed by the operator" in captions
    frames = [f.value for f in page.dataframe]
    cache = next(f for f in frames if "pulled entries" in f.columns).iloc[0]
    assert (cache["hits"], cache["misses"], cache["pulled entries"], cache["pushed entries"]) == (
        3,
        1,
        3,
        1,
    )
    assert cache["pulled MiB"] == 6.0 and cache["pull s"] == 1.25


def test_only_caches_whose_entries_a_reader_can_verify_are_offered() -> None:
    shared = {
        "compiler": "inductor",
        "compile_cache_target": "/mnt/pvc/shared",
        "compile_cache_prefix": "inductor-torch-2.13.0+cpu",
    }
    roots = ["/mnt/pvc/{namespace}", "/mnt/pvc/shared"]
    assert compile_cache_pull(shared, roots, [KEY]) == (
        f"model-support cache pull /mnt/pvc/shared/inductor-torch-2.13.0+cpu --trusted-key {KEY}",
        "the shared cache this run pushed to; the pull takes only entries that a manifest "
        "signed by the operator's trusted pushers lists (--trusted-key), and nothing else",
    )
    # Without the keys to check, nothing a reader could verify: not offered.
    assert compile_cache_pull(shared, roots, []) is None
    # A namespace's own cache is written by whatever its tests run: never offered.
    own = {**shared, "compile_cache_target": "/mnt/pvc/team-a"}
    assert compile_cache_pull(own, roots, [KEY]) is None
    # A target the operator did not configure, or one that climbs out of one: never offered.
    assert compile_cache_pull(shared, ["/mnt/other"], [KEY]) is None
    climbing = {**shared, "compile_cache_target": "/mnt/pvc/shared/../team-a"}
    assert compile_cache_pull(climbing, roots, [KEY]) is None
    # A neuron row without a recorded cache: the public NEFF cache is an unsigned mirror.
    neuron = {"neuronx_cc": NEW_CC, "compiler": "neuronx-cc"}
    assert compile_cache_pull(neuron, roots, [KEY]) is None


def test_the_chart_gives_the_viewer_the_operators_shared_targets_and_trusted_keys() -> None:
    import helm_python
    import yaml

    chart = Path(__file__).resolve().parents[2] / "charts" / "model-support"
    rendered = helm_python.Chart.load(str(chart)).render(
        {
            "results": "s3://bucket/model-support",
            **REQUIRED_CHART_VALUES,
            "viewer": {"enabled": True},
            "settings": {
                "compileCachePushTargets": ["s3://org-cache/shared", "s3://org-cache/{namespace}"],
                "compileCacheTrustedKeys": [KEY],
            },
        },
        name="ms",
        namespace="model-support",
    )
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    [viewer] = [d for d in docs if d["kind"] == "Deployment" and "viewer" in d["metadata"]["name"]]
    env = {
        e["name"]: e.get("value")
        for e in viewer["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (
        env["MODEL_SUPPORT_VIEWER_CACHE_TARGETS"]
        == "s3://org-cache/shared,s3://org-cache/{namespace}"
    )
    assert env["MODEL_SUPPORT_VIEWER_CACHE_TRUSTED_KEYS"] == KEY


def test_the_viewer_refuses_a_trusted_key_that_is_no_key(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from model_support.cli import app

    result = CliRunner().invoke(
        app, ["viewer", "--results", str(tmp_path), "--cache-trusted-key", "not-a-key"]
    )
    assert result.exit_code == 2
    assert "--cache-trusted-key" in result.output and "ed25519:<base64>" in result.output
