"""The main job end to end: `model-support demo` writes the dataset; pandas and `results` read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import transformers

from model_support.checkpoints import TASK_MODELS, DemoModel

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).with_name("model-support"))
DEMO_NAMES = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-llava"]
DEMO_NAMES += [model.name for model in TASK_MODELS]  # one per task family beyond text generation


@pytest.fixture(scope="module")
def demo_results(
    demo_models: dict[str, DemoModel], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    results = tmp_path_factory.mktemp("demo") / "results"
    done = subprocess.run(
        [CLI, "demo", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return results, done.stdout


def test_demo_tests_every_model_and_prints_the_table(demo_results: tuple[Path, str]) -> None:
    _, stdout = demo_results
    for name in DEMO_NAMES:
        assert name in stdout
    assert f"model-support results ({len(DEMO_NAMES)} rows)" in stdout
    assert stdout.count("PASS") >= 2 * len(DEMO_NAMES)  # a line per run and a row per model


@pytest.mark.parametrize("name", DEMO_NAMES)
def test_the_documented_pandas_query_works_on_the_demo_dataset(
    name: str, demo_results: tuple[Path, str], demo_models: dict[str, DemoModel]
) -> None:
    results, _ = demo_results
    X = str(demo_models[name].require_path())  # the README's query, verbatim
    rows = pd.read_parquet(results / "data")[lambda d: d.model_id == X][
        ["neuronx_cc", "library", "library_version", "neuron_cores", "result"]
    ]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert pd.isna(row.neuronx_cc)  # not on Trainium here
    assert (row.library, row.library_version) == ("transformers", transformers.__version__)
    assert (row.neuron_cores, row.result) == (1, "PASS")


def test_the_demo_dataset_has_its_card(demo_results: tuple[Path, str]) -> None:
    results, _ = demo_results
    card = (results / "README.md").read_text()
    assert "configs:" in card and "PASS" in card and "EXCLUDED" in card


def test_results_json_filters_rows(demo_results: tuple[Path, str]) -> None:
    results, _ = demo_results
    done = subprocess.run(
        [
            CLI,
            "results",
            "--results",
            str(results),
            "--model",
            "QWEN3",
            "--result",
            "PASS",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(done.stdout)
    assert sorted(Path(r["model_id"]).name for r in rows) == ["tiny-qwen3", "tiny-qwen3-moe"]
    assert all(r["result"] == "PASS" and r["task"] == "text-generation" for r in rows)


def test_a_second_run_adds_a_record_and_the_matrix_keeps_the_latest(
    demo_results: tuple[Path, str], demo_models: dict[str, DemoModel]
) -> None:
    results, _ = demo_results
    before = len(list((results / "records").iterdir()))
    path = str(demo_models["tiny-llama"].require_path())
    done = subprocess.run(
        [
            CLI,
            "run",
            path,
            "--results",
            str(results),
            "--compile-backend",
            "model_support.faults:noise_100pct",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]  # a FAIL is a verdict, not a broken run
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["result"] == "FAIL"
    assert len(list((results / "records").iterdir())) == before + 1
    matrix = pd.read_parquet(results / "data")
    llama = matrix[matrix.model_id == path]
    # The compile backend is part of the stack key: the noisy run lands in its own file and row.
    assert set(llama.result) == {"PASS", "FAIL"}
    assert summary["run_id"] in set(llama.run_id)


def test_the_demo_keeps_its_models_as_the_selected_list(
    demo_results: tuple[Path, str], demo_models: dict[str, DemoModel]
) -> None:
    from model_support.selection import load_selected

    results, _ = demo_results
    selected, where = load_selected(str(results))
    assert selected is not None and where.endswith("selected.yaml")
    assert [(e.model, e.task.value, e.reason) for e in selected.models] == [
        (str(demo_models[name].require_path()), demo_models[name].task.value, None)
        for name in DEMO_NAMES
    ]
