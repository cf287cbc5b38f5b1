"""The main job end to end: `model-support demo` writes a dataset holding every result state over
four stacks, with a regression and a fix between the two newest; pandas, `results`, `run`,
`history`, `regressions` and the viewer read it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest
import transformers
from filelock import FileLock
from processes import processes_with
from streamlit.testing.v1 import AppTest
from waiting import wait_until

from model_support.checkpoints import STAMP_FILE, TASK_MODELS, DemoModel
from model_support.cli.commands_demo import NEWER_RELEASE, OLDER_RELEASE
from model_support.store import ResultsStore

# One worker runs this module: the demo is made once per session, and a second worker given one
# of these tests would only wait on its lock (minutes) instead of running other tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

CLI = str(Path(sys.executable).with_name("model-support"))
APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")
DEMO_NAMES = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-llava"]
DEMO_NAMES += [model.name for model in TASK_MODELS]  # one per task family beyond text generation
OVERSIZED = "demo/llama-405b-headers"


@pytest.fixture(scope="module")
def demo_results(
    demo_models: dict[str, DemoModel], tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> tuple[Path, str, str]:
    """The demo's dataset and output, made once per test session (xdist workers share it)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base if worker_id == "master" else base.parent) / "demo"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared / ".lock")):
        if not (shared / "stderr.txt").exists():
            done = subprocess.run(  # output captured: not a terminal, as in a CI log
                [CLI, "demo", "--results", str(shared / "results")],
                capture_output=True,
                text=True,
                timeout=1200,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            (shared / "stdout.txt").write_text(done.stdout)
            (shared / "stderr.txt").write_text(done.stderr)
    return (
        shared / "results",
        (shared / "stdout.txt").read_text(),
        (shared / "stderr.txt").read_text(),
    )


def test_demo_tests_every_model_and_prints_the_table(demo_results: tuple[Path, str, str]) -> None:
    _, stdout, _ = demo_results
    for name in DEMO_NAMES:
        assert f"demo/{name}" in stdout
    rows = len(DEMO_NAMES) + 6  # + a second compiler, four faulty runs, the oversized model
    assert f"model-support results ({rows} rows)" in stdout
    # A line per passing run and a row per passing result: every model on the main stack and
    # tiny-llama on the second.
    assert stdout.count("PASS") >= 2 * (len(DEMO_NAMES) + 1)
    for state in ("FAIL", "ERROR", "EXCLUDED"):
        assert state in stdout
    assert str(Path.home()) not in stdout.split("model-support results")[1]  # readable ids


def test_demo_prints_progress_lines_when_not_on_a_terminal(
    demo_results: tuple[Path, str, str],
) -> None:
    _, _, stderr = demo_results
    lines = stderr.splitlines()
    for label in ("demo/tiny-llama · aot_eager", "demo/tiny-llama · inductor"):
        assert any(line.startswith(f"  {label}: load done in") for line in lines), label
        assert any(line.startswith(f"  {label}: verify done in") for line in lines), label
    assert f"  demo/tiny-qwen3-moe · {OLDER_RELEASE}: compile failed" in lines
    assert any("sizing llama-405b-headers" in line for line in lines)
    assert lines[-1].startswith("demo: demo done in")
    # The session built every checkpoint before the demo ran: it finds and reuses them all.
    assert not [line for line in lines if line.startswith("demo: build")], lines[:20]
    assert any(line.startswith("demo: checkpoints ready in") for line in lines)


def test_the_dataset_holds_every_state_over_four_stacks(
    demo_results: tuple[Path, str, str], demo_models: dict[str, DemoModel]
) -> None:
    results, _, _ = demo_results
    matrix = pd.read_parquet(results / "data").set_index(["model_id", "compiler"])
    assert sorted(set(matrix.index.get_level_values("compiler"))) == sorted(
        ["aot_eager", "inductor", OLDER_RELEASE, NEWER_RELEASE]
    )
    # The faulty compiler's two releases: a regression (tiny-llama) and a fix (the MoE).
    assert matrix.loc[("demo/tiny-llama", OLDER_RELEASE), "result"] == "PASS"
    assert matrix.loc[("demo/tiny-llama", NEWER_RELEASE), "result"] == "FAIL"
    # The FAIL says where it starts: the release adds noise after the last layer's MLP output.
    fail = matrix.loc[("demo/tiny-llama", NEWER_RELEASE)]
    assert (fail.first_divergence, fail.first_divergence_kind) == (
        "model.layers.1.mlp.down_proj",
        "Linear",
    )
    # Where its tokens differ from the reference's choice, the record holds both as text.
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_models["tiny-llama"].require_path())
    positions = json.loads(fail.verification_json)["positions"]
    differing = [p for p in positions if p["verdict"] != "match"]
    assert differing, "a FAIL has positions that differ from the reference"
    for position in differing:
        assert position["token_text"] == tokenizer.decode([position["token"]])
        assert position["reference_text"] == tokenizer.decode([position["reference_token"]])
    assert not any("token_text" in p for p in positions if p["verdict"] == "match")
    assert pd.isna(matrix.loc[("demo/tiny-qwen3-moe", NEWER_RELEASE), "first_divergence"])
    assert matrix.loc[("demo/tiny-qwen3-moe", NEWER_RELEASE), "result"] == "PASS"
    error = matrix.loc[("demo/tiny-qwen3-moe", OLDER_RELEASE)]
    assert (error.result, error.error_class) == ("ERROR", "compile")
    assert "InjectedCompilerError" in error.error
    excluded = matrix.loc[(OVERSIZED, "aot_eager")]
    assert (excluded.result, excluded.exclusion_reason) == ("EXCLUDED", "too-large")
    assert "GiB" in excluded.error  # what it needs against what one core has
    assert matrix.loc[("demo/tiny-llama", "inductor"), "result"] == "PASS"
    # Readable ids; each checkpoint's path kept in its own column.
    assert matrix.loc[("demo/tiny-llava", "aot_eager"), "model_path"] == str(
        demo_models["tiny-llava"].require_path()
    )
    assert excluded.model_path.endswith("/llama-405b-headers")


@pytest.mark.parametrize("name", DEMO_NAMES)
def test_the_documented_pandas_query_works_on_the_demo_dataset(
    name: str, demo_results: tuple[Path, str, str]
) -> None:
    results, _, _ = demo_results
    X = f"demo/{name}"  # the README's query, verbatim
    rows = pd.read_parquet(results / "data")[lambda d: d.model_id == X][
        ["neuronx_cc", "library", "library_version", "neuron_cores", "result"]
    ]
    assert len(rows) >= 1
    assert rows.neuronx_cc.isna().all()  # not on Trainium here
    assert set(zip(rows.library, rows.library_version, strict=True)) == {
        ("transformers", transformers.__version__)
    }
    assert (rows.neuron_cores == 1).all()
    assert "PASS" in set(rows.result)


def test_the_demo_dataset_has_its_card(demo_results: tuple[Path, str, str]) -> None:
    results, _, _ = demo_results
    card = (results / "README.md").read_text()
    assert "configs:" in card and "PASS" in card and "EXCLUDED" in card
    assert "`model_path`" in card
    assert "### Where a FAIL starts" in card and "`first_divergence`" in card


def test_results_json_filters_rows(demo_results: tuple[Path, str, str]) -> None:
    results, _, _ = demo_results
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
    # The MoE passes on the main stack and on the faulty compiler's newer release.
    assert sorted(r["model_id"] for r in rows) == [
        "demo/tiny-qwen3", "demo/tiny-qwen3-moe", "demo/tiny-qwen3-moe",
    ]  # fmt: skip
    assert all(r["result"] == "PASS" and r["task"] == "text-generation" for r in rows)


def test_a_rerun_under_the_demo_id_replaces_its_row(
    demo_results: tuple[Path, str, str], demo_models: dict[str, DemoModel]
) -> None:
    results, _, _ = demo_results
    before = len(list((results / "records").iterdir()))
    rows_before = len(pd.read_parquet(results / "data"))
    path = str(demo_models["tiny-llama"].require_path())
    done = subprocess.run(
        [
            CLI,
            "run",
            path,
            "--results",
            str(results),
            "--compile-backend",
            NEWER_RELEASE,
            "--model-id",
            "demo/tiny-llama",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]  # a FAIL is a verdict, not a broken run
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["result"], summary["model_id"]) == ("FAIL", "demo/tiny-llama")
    assert len(list((results / "records").iterdir())) == before + 1
    matrix = pd.read_parquet(results / "data")
    assert len(matrix) == rows_before  # the latest run replaced the row of its stack
    llama = matrix[matrix.model_id == "demo/tiny-llama"].set_index("compiler")
    assert llama.loc[NEWER_RELEASE, "run_id"] == summary["run_id"]
    assert set(llama.result) == {"PASS", "FAIL"}


def test_a_local_checkpoint_is_named_by_its_folder(
    demo_results: tuple[Path, str, str], tmp_path: Path
) -> None:
    """`run ./folder` records local/<folder>, the path in model_path (here: an EXCLUDED one)."""
    results, _, _ = demo_results
    oversized = Path(
        pd.read_parquet(results / "data").set_index("model_id").loc[OVERSIZED, "model_path"]
    )
    folder = tmp_path / "my 405b checkpoint"
    shutil.copytree(oversized, folder)
    store = tmp_path / "results"
    done = subprocess.run(
        [CLI, "run", str(folder), "--results", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 3, done.stderr[-2000:]  # excluded: too large for this machine
    assert (
        json.loads(done.stdout.strip().splitlines()[-1])["model_id"] == "local/my-405b-checkpoint"
    )
    row = ResultsStore(str(store)).matrix().iloc[0]
    assert (row.model_id, row.model_path, row.result) == (
        "local/my-405b-checkpoint",
        str(folder),
        "EXCLUDED",
    )


def test_the_demo_keeps_its_models_as_the_selected_list(
    demo_results: tuple[Path, str, str], demo_models: dict[str, DemoModel]
) -> None:
    from model_support.selection import load_selected

    results, _, _ = demo_results
    selected, where = load_selected(str(results))
    assert selected is not None and where.endswith("selected.yaml")
    assert [(e.model, e.task.value, e.reason) for e in selected.models] == [
        *((f"demo/{name}", demo_models[name].task.value, None) for name in DEMO_NAMES),
        (OVERSIZED, "text-generation", None),
    ]


def test_the_viewer_shows_each_view_on_the_demo_dataset(
    demo_results: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results, _, _ = demo_results
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(results))
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", "http://127.0.0.1:9")
    page = AppTest.from_file(APP, default_timeout=60).run()
    assert not page.exception
    # Selected, on the main stack (the page opens on it): every tiny model PASSes (four text
    # models and one per task family) and the 405B one is excluded.
    assert page.selectbox(key="compiler").value.startswith("aot_eager ")
    selected = page.dataframe[0].value.set_index("model")
    assert list(selected["result"]) == ["PASS"] * len(DEMO_NAMES) + ["EXCLUDED"]
    assert selected.loc[OVERSIZED, "why"] == "too-large"
    # Triage on each faulty release: the ERROR (the compiler's message), then the FAIL.
    for release, state in ((OLDER_RELEASE, "ERROR"), (NEWER_RELEASE, "FAIL")):
        # The picker shows a stack's label shortened to the sidebar (a module-path compiler by
        # its function's name): pick the release by where its name stands.
        options = page.selectbox(key="compiler").options
        short = release.rsplit(":", 1)[-1]
        page.selectbox(key="compiler").select_index(
            next(i for i, o in enumerate(options) if short in o)
        )
        page.radio(key="view").set_value("Triage").run()
        groups = page.dataframe[0].value
        assert list(groups["results"]) == [state]
    # Compare the main stack with the newer release: tiny-llama regressed.
    page.radio(key="view").set_value("Compare").run()
    page.selectbox(key="before").set_value(
        next(o for o in page.selectbox(key="before").options if o.startswith("aot_eager "))
    ).run()
    changes = page.dataframe[0].value.set_index("model")
    assert changes.loc["demo/tiny-llama", "change"] == "regression"
    # Charts: a pass rate per compiler.
    page.radio(key="view").set_value("Charts").run()
    charts = page.get("vega_lite_chart")
    assert len(charts) == 2
    assert all(
        name in str(charts[0].proto)
        for name in ("aot_eager", "inductor", OLDER_RELEASE, NEWER_RELEASE)
    )
    # Regressions, by default between the two newest stacks (the faulty compiler's releases):
    # a regression and a fix, so a new user sees the view populated.
    page.radio(key="view").set_value("Regressions").run()
    assert OLDER_RELEASE in page.selectbox(key="before").value
    assert NEWER_RELEASE in page.selectbox(key="after").value
    regressed, fixed = page.dataframe[0].value, page.dataframe[1].value
    assert list(regressed["model"]) == ["demo/tiny-llama"]
    assert regressed["group"].iloc[0].startswith("FAIL")
    assert list(fixed["model"]) == ["demo/tiny-qwen3-moe"]
    # History of tiny-llama: a run on each of the four stacks, each with its core-hours.
    page.radio(key="view").set_value("History").run()
    page.selectbox(key="history-model").set_value("demo/tiny-llama").run()
    runs = page.dataframe[0].value
    assert runs["stack"].nunique() == 4
    assert (runs["core-hours"] > 0).all()


def test_regressions_and_history_commands_on_the_demo_dataset(
    demo_results: tuple[Path, str, str],
) -> None:
    results, _, _ = demo_results
    done = subprocess.run(
        [CLI, "regressions", "--results", str(results), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 3, done.stderr  # there is a regression
    report = json.loads(done.stdout)
    assert NEWER_RELEASE in report["after"] and OLDER_RELEASE in report["before"]
    assert [(c["model"], c["before"], c["after"]) for c in report["regressions"]] == [
        ("demo/tiny-llama", "PASS", "FAIL")
    ]
    assert [c["model"] for c in report["fixes"]] == ["demo/tiny-qwen3-moe"]
    shown = subprocess.run(
        [CLI, "history", "demo/tiny-llama", "--results", str(results)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.count("model-support reproduce ") >= 4


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopping_the_demo_stops_its_runs(
    stop: signal.Signals, demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    marker = f"demo-{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [CLI, "demo", "--results", str(tmp_path / "results")],
        env={**os.environ, "MODEL_SUPPORT_DEMO_MARKER": marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Started with SIGINT ignored, as a parent that ignores it (a shell's background job)
        # passes it on: the demo must still stop on it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:  # wait until run.py processes are working
            if ": load …" in line:
                break
        assert len(processes_with(marker)) >= 2  # the demo and at least one run.py
        process.send_signal(stop)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    wait_until(
        lambda: processes_with(marker) == [], "no run.py (or worker) to outlive the demo", 30
    )


def test_stopping_the_demo_while_it_builds_leaves_no_builder_and_no_half_model(
    tmp_path: Path,
) -> None:
    marker = f"demo-{uuid.uuid4().hex}"
    models = tmp_path / "models"
    process = subprocess.Popen(
        [CLI, "demo", "--results", str(tmp_path / "results"), "--models-dir", str(models)],
        env={**os.environ, "MODEL_SUPPORT_DEMO_MARKER": marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("demo: building "):
                break
        assert ", 2 at a time" in line or ", 1 at a time" in line, line
        wait_until(lambda: len(processes_with(marker)) >= 2, "the demo and its builders", 60)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    wait_until(lambda: processes_with(marker) == [], "no builder to outlive the demo", 30)
    # Whatever was being built is invisible: a model folder exists only once it is complete.
    for folder in models.glob("*/*"):
        if not folder.name.startswith("."):
            assert (folder / STAMP_FILE).is_file(), folder


def _demo_row(results: Path, model_id: str, compile_backend: str) -> pd.Series:
    frame = pd.read_parquet(results / "data")
    rows = frame[(frame.model_id == model_id) & (frame.compile_backend == compile_backend)]
    assert len(rows) == 1, rows[["run_id", "compile_backend"]]
    return rows.iloc[0]


@pytest.mark.parametrize(
    ("compile_backend", "expected"), [("aot_eager", "PASS"), (NEWER_RELEASE, "FAIL")]
)
def test_reproduce_reruns_a_demo_row_and_agrees(
    demo_results: tuple[Path, str, str], tmp_path: Path, compile_backend: str, expected: str
) -> None:
    """`reproduce RUN_ID --run` writes the row's exact run.py and the packages it needs, runs it
    here and finds the same verdict and tokens: the demo's PASS, and its FAIL (the miscompiling
    backend is a module:function the rerun imports as the run did)."""
    results, _, _ = demo_results
    row = _demo_row(results, "demo/tiny-llama", compile_backend)
    assert row.result == expected
    folder = tmp_path / "again"
    done = subprocess.run(
        [CLI, "reproduce", row.run_id, "--results", str(results), "-o", str(folder), "--run"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (folder / "run.py").read_text() == row.run_py  # byte for byte what ran
    requirements = (folder / "requirements.txt").read_text().splitlines()
    pinned = {line.split("==")[0].lower(): line for line in requirements if "==" in line}
    stack = json.loads(row.stack)
    assert pinned["transformers"] == f"transformers=={stack['transformers']}"
    assert pinned["torch"] == f"torch=={stack['torch']}"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in requirements
    # Only what run.py needs: not the harness's own environment.
    assert not {"kopf", "streamlit", "pytest", "pandas", "moto"} & set(pinned)
    rerun = json.loads((folder / "result.json").read_text())
    stored = json.loads(row.verification_json)
    assert rerun["result"] == expected
    assert rerun["verification"]["failed_checks"] == stored["failed_checks"]
    tokens = [p["token"] for p in stored["positions"]]
    assert [t for prompt in rerun["tokens"] for t in prompt] == tokens
    assert "they agree" in done.stdout and "python:3.11-slim" in done.stdout


def test_reproduce_asks_for_a_run_id_when_a_model_has_several_rows(
    demo_results: tuple[Path, str, str], tmp_path: Path
) -> None:
    results, _, _ = demo_results
    frame = pd.read_parquet(results / "data")
    run_ids = frame[frame.model_id == "demo/tiny-llama"].run_id
    done = subprocess.run(
        [CLI, "reproduce", "demo/tiny-llama", "--results", str(results), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "name one by its run id" in done.stderr
    assert all(run_id in " ".join(done.stderr.split()) for run_id in run_ids)
    assert not (tmp_path / "run.py").exists()
