"""The viewer tests' data: a results dataset built through the real record and store code, a
stand-in Hub (tests/hubserver.py) listing models, and their fixtures (re-exported by conftest.py)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared hubserver module
import factories
from hubserver import HubServer, Repo
from ports import unused_port

from model_support.cli.commands_viewer import viewer_command
from model_support.config import RunConfig
from model_support.records import (
    Memory,
    ResultDocument,
    RunRecord,
    Stack,
    Timings,
    Verification,
    new_run_id,
)
from model_support.script import render_script
from model_support.store import ResultsStore
from model_support.vocabulary import (
    CompileFailure,
    ErrorClass,
    ExclusionReason,
    Parallelism,
    Result,
    Task,
)

OLD_CC, NEW_CC = "2.27.100.0", "2.28.7631.0"
TRANSFORMERS = "5.24.0"
START = datetime(2026, 10, 1, 12, 0, tzinfo=UTC)

# (model, task, result on the old compiler, result on the new compiler)
MODELS: list[tuple[str, str, str, str]] = [
    ("Qwen/Qwen3-0.6B", "text-generation", "PASS", "PASS"),
    ("Qwen/Qwen3-1.7B", "text-generation", "PASS", "ERROR"),  # regression
    ("meta-llama/Llama-3.2-1B", "text-generation", "FAIL", "PASS"),  # fix
    ("google/gemma-3-1b-it", "text-generation", "ERROR", "ERROR"),
    ("mistralai/Mistral-7B-v0.3", "text-generation", "ERROR", "ERROR"),
    ("deepseek-ai/DeepSeek-V3", "text-generation", "EXCLUDED", "EXCLUDED"),
    ("llava-hf/llava-1.5-7b-hf", "image-text-to-text", "PASS", "TIMEOUT"),
]

# Errors that differ only in numbers, addresses, paths and names: triage must group them.
COMPILE_ERRORS = {
    "Qwen/Qwen3-1.7B": "neuronx-cc failed: tensor 'model.layers.3.mlp' of shape 1024x4096 exceeds SBUF at 0x7f3a2c0 (/tmp/neff/abc123/graph.hlo)\nTraceback tail ...",
    "google/gemma-3-1b-it": "neuronx-cc failed: tensor 'model.layers.17.self_attn' of shape 2048x8192 exceeds SBUF at 0x55d1e0 (/var/tmp/neff/ffe0/graph.hlo)\nother tail",
    "mistralai/Mistral-7B-v0.3": "neuronx-cc failed: tensor 'lm_head' of shape 4096x32768 exceeds SBUF at 0xdeadbeef (/tmp/x/y/graph.hlo)",
}
RERUN = ("Qwen/Qwen3-0.6B", "text-generation", "TIMEOUT", NEW_CC)
"""An earlier run of a model on the new stack that timed out (it passed when run again)."""
LOAD_ERROR = "OSError: gated repo google/gemma-3-1b-it requires a token"
RUN_PY = "#!/usr/bin/env python3\n# model-support run.py for {model}\nCONFIG = {{'model': '{model}'}}\nprint('hello')\n"


APP = str(Path(__file__).resolve().parents[2] / "viewer" / "app.py")


def viewer_page(
    results: Path | str,
    monkeypatch: pytest.MonkeyPatch,
    hub: str,
    *,
    timeout: float = 30,
    **params: str,
) -> AppTest:
    """The viewer app (AppTest, not run yet) on ``results``, its Hub at ``hub``, opened on a
    URL with the query ``params``."""
    monkeypatch.setenv("MODEL_SUPPORT_RESULTS", str(results))
    monkeypatch.setenv("MODEL_SUPPORT_HUB_ENDPOINT", hub)
    page = AppTest.from_file(APP, default_timeout=timeout)
    page.query_params.update(params)
    return page


def rendered_run_py(model: str, task: str) -> str:
    """The run.py model-support renders for ``model`` (the runner with its config block)."""
    return render_script(RunConfig(model=model, task=Task(task)))


def make_record(
    model: str, task: str, result: str, compiler_version: str, when: datetime
) -> RunRecord:
    """A RunRecord as run.py + the runner would produce it, for one model on one stack."""
    state = Result(result)
    error_class = error = None
    if state == Result.ERROR:
        if compiler_version == OLD_CC and model == "google/gemma-3-1b-it":
            error_class, error = ErrorClass.LOAD, LOAD_ERROR
        else:
            error_class, error = ErrorClass.COMPILE, COMPILE_ERRORS[model]
    if state == Result.TIMEOUT:
        error = "run.py ran past its 3600 s limit"
    ran = state != Result.EXCLUDED
    verdict = state in (Result.PASS, Result.FAIL)
    return factories.make_record(
        model,
        state,
        stack=Stack(
            python="3.11.9",
            torch="2.13.0",
            transformers=TRANSFORMERS,
            torch_neuronx="2.13.0",
            neuronx_cc=compiler_version,
        ),
        finished=when + timedelta(minutes=3),
        recorded=when + timedelta(minutes=4),
        cores=4 if "7b" in model.lower() else 1,
        run_id=new_run_id(when),
        run_py=rendered_run_py(model, task),
        exclusion=None if ran else ExclusionReason.TOO_LARGE,
        document={
            "task": task,
            "revision": None,
            "resolved_revision": None,
            "backend": "neuron",
            "compile_backend": "neuron",
            "parallelism": Parallelism.NONE,
            "max_new_tokens": None,
            "error_class": error_class,
            "error": error,
            "stage": None,
            "timings": Timings(
                wall_time_s=123.4, compile_s=100.0, load_s=10.0, decode_tokens_per_s=55.5
            )
            if ran
            else Timings(),
            "memory": Memory(peak_device_memory_bytes=3 * 2**30) if ran else Memory(),
            "parameters": _parameter_count(model) if ran else None,
            "prompts": [],
            "text": ["def fibonacci(n): return n"] if verdict else [],
            "verification": Verification(
                passed=state == Result.PASS,
                exact=state == Result.PASS,
                error_ratio=1.02 if state == Result.PASS else 8.6,
                mismatches=0 if state == Result.PASS else 3,
                bad_tokens=0 if state == Result.PASS else 3,
                reason="all tokens match the float32 reference"
                if state == Result.PASS
                else "3 bad tokens",
            )
            if verdict
            else Verification(),
            "packages": ["torch==2.13.0", "torch-neuronx==2.13.0", f"transformers=={TRANSFORMERS}"],
            "started_at": when,
            "finished_at": when + timedelta(minutes=3),
        },
    )


SELECTED_YAML = """\
models:
  - model: Qwen/Qwen3-0.6B
    task: text-generation
  - model: Qwen/Qwen3-1.7B
    task: text-generation
  - model: meta-llama/Llama-3.2-1B
  - model: llava-hf/llava-1.5-7b-hf
    task: image-text-to-text
  - model: openai/gpt-oss-120b
    reason: needs MXFP4 kernels that TorchNeuron does not have yet
  - model: someone/not-yet-run
"""


def build_dataset(root: Path) -> ResultsStore:
    """Two compiler versions x one library version, plus the selected list."""
    store = ResultsStore(str(root))
    for i, (model, task, old, new) in enumerate(MODELS):
        store.add(make_record(model, task, old, OLD_CC, START + timedelta(hours=i)))
        store.add(make_record(model, task, new, NEW_CC, START + timedelta(days=1, hours=i)))
    # A run on the new stack before the one the matrix shows: the history keeps both (a flip).
    store.add(make_record(*RERUN, START + timedelta(days=1, hours=-1)))
    store.materialize()
    (root / "selected.yaml").write_text(SELECTED_YAML)
    return store


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory (read-only use: tests that write get their own copy)."""
    root = tmp_path_factory.mktemp("results")
    build_dataset(root)
    return root


@pytest.fixture(autouse=True)
def _fresh_streamlit_caches() -> Iterator[None]:
    """Streamlit's caches are process-wide: each test starts from clean ones."""
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


# ---------------------------------------------------------------------------------------------
# Runs that did not pass, each with what explains it, and a CPU run.

TRACEBACK = 'Traceback (most recent call last):\n  File "run.py", line 812, in compile\nRuntimeError: SBUF overflow'
POSITIONS = [
    {"prompt": 0, "position": 0, "token": 11, "reference_token": 11, "margin": 0.0, "verdict": "match"},
    {"prompt": 0, "position": 1, "token": 4242, "reference_token": 17, "margin": 2.5, "verdict": "bad"},
    {"prompt": 0, "position": 2, "token": 9, "reference_token": 10, "margin": 0.01, "verdict": "near-tie"},
]  # fmt: skip
FAIL_VERDICT = Verification(
    passed=False,
    exact=False,
    failed_checks=["tokens", "median"],
    error_ratio=8.6,
    q90_ratio=2.0,
    mismatches=2,
    near_ties=1,
    bad_tokens=1,
    first_mismatch=1,
    reason="tokens: prompt 0 token 1: generated 4242 but the reference prefers 17",
    parameters={"max_error_ratio": 3.0, "max_q90_ratio": 3.5, "max_peak_ratio": 4.0},
    positions=POSITIONS,
)


def _on(record: RunRecord, **changes: object) -> RunRecord:
    return record.model_copy(update={"document": record.document.model_copy(update=changes)})


def build_explained_dataset(root: Path) -> None:
    """A Trainium FAIL, ERROR, EXCLUDED and PASS, a CPU PASS, and a model on an older stack only."""
    store = ResultsStore(str(root))
    failed = make_record("org/fails", "text-generation", "FAIL", NEW_CC, START)
    stack = failed.document.stack.model_copy(update={"instance_type": "trn2.48xlarge", "lnc": 2})
    store.add(_on(failed, verification=FAIL_VERDICT, stack=stack, cores=4, parameters=1_234_567))
    errored = make_record("org/errors", "text-generation", "TIMEOUT", NEW_CC, START)
    store.add(
        _on(
            errored,
            result=Result.ERROR,
            error_class=ErrorClass.COMPILE,
            error_reason=CompileFailure.COMPILER_ERROR,
            error="neuronx-cc failed: SBUF overflow",
            traceback=TRACEBACK,
            stage="compile",
            timings=Timings(load_s=10.0),  # it loaded, then failed to compile
            memory=Memory(),
        )
    )
    too_large = make_record("org/too-large", "text-generation", "EXCLUDED", NEW_CC, START)
    store.add(_on(too_large, cores=64, parallelism=Parallelism.TENSOR))  # what it would need
    store.add(make_record("org/passes", "text-generation", "PASS", NEW_CC, START))
    cpu = make_record("org/on-cpu", "text-generation", "PASS", NEW_CC, START)
    store.add(
        _on(
            cpu,
            backend="cpu",
            compile_backend="inductor",
            stack=cpu.document.stack.model_copy(update={"neuronx_cc": None, "torch_neuronx": None}),
        )
    )
    store.add(make_record("org/older", "text-generation", "PASS", "2.27.100.0", START))
    store.materialize()


@pytest.fixture(scope="session")
def explained_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results of build_explained_dataset (read-only use)."""
    root = tmp_path_factory.mktemp("explained")
    build_explained_dataset(root)
    return root


# ---------------------------------------------------------------------------------------------
# A table longer than a page: one stack of LONG_ROWS models, PASS or FAIL.

LONG_ROWS = 1_234
"""Rows of the long dataset: two full pages of 500 and a part page."""


def long_model(number: int) -> str:
    """The long dataset's ``number``-th model (from 0), which is also its row in model order."""
    return f"org/model-{number:04d}"


def build_long_dataset(root: Path, rows: int = LONG_ROWS) -> None:
    """One matrix file of ``rows`` rows, written as the store writes one (a real record's row,
    varied per model: its id, run id, wall time, and every third one a FAIL); its records are
    not stored, as a dataset of that size is built in a second rather than a minute."""
    import pyarrow as pa

    from model_support.dataset import MATRIX_SCHEMA, record_to_row, write_matrix
    from model_support.store import MATRIX_KEY_METADATA

    template = record_to_row(make_record(long_model(0), "text-generation", "PASS", NEW_CC, START))
    columns = {name: [template[name]] * rows for name in MATRIX_SCHEMA.names}
    columns["model_id"] = [long_model(i) for i in range(rows)]
    columns["run_id"] = [f"run-{i:04d}" for i in range(rows)]
    columns["result"] = ["FAIL" if i % 3 == 2 else "PASS" for i in range(rows)]
    columns["wall_time_s"] = [float(i % 97) for i in range(rows)]
    key = {
        "compiler": "neuronx-cc",
        "compiler_version": NEW_CC,
        "library": "transformers",
        "library_version": TRANSFORMERS,
    }
    table = pa.table(columns, schema=MATRIX_SCHEMA)
    (root / "data").mkdir(parents=True)
    write_matrix(
        table.replace_schema_metadata({MATRIX_KEY_METADATA: json.dumps(key).encode()}),
        str(root / "data" / "long.parquet"),
    )


@pytest.fixture(scope="session")
def long_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results of build_long_dataset (read-only use)."""
    root = tmp_path_factory.mktemp("long")
    build_long_dataset(root)
    return root


# ---------------------------------------------------------------------------------------------
# The Hub: tests/hubserver.py's stand-in, listing these models (GET /api/models).

HUB_MODELS = [
    # id, pipeline_tag, downloads, likes, trendingScore, gated, parameters
    ("Qwen/Qwen3-0.6B", "text-generation", 9_000_000, 900, 50, False, 600_000_000),
    ("Qwen/Qwen3-1.7B", "text-generation", 3_000_000, 500, 80, False, 1_700_000_000),
    ("meta-llama/Llama-3.2-1B", "text-generation", 7_000_000, 2000, 20, "manual", 1_230_000_000),
    ("deepseek-ai/DeepSeek-V3", "text-generation", 1_000_000, 4000, 95, False, 671_000_000_000),
    ("brand/new-model", "text-generation", 10, 1, 99, False, None),
    ("llava-hf/llava-1.5-7b-hf", "image-text-to-text", 800_000, 300, 10, False, 7_000_000_000),
    ("some/vision-model", "image-text-to-text", 900_000, 30, 40, False, None),
]


def _safetensors_header(parameters: int) -> bytes:
    """A safetensors file holding only its header (the Hub counts parameters from headers)."""
    header = json.dumps(
        {"weight": {"dtype": "BF16", "shape": [parameters], "data_offsets": [0, 2 * parameters]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header


@pytest.fixture
def hub() -> Iterator[str]:
    """A running stand-in Hub (small pages, so listing follows the Link header); yields its URL."""
    repos = [
        Repo(
            model_id,
            files={"model.safetensors": _safetensors_header(params)}
            if params
            else {"config.json": b"{}"},
            pipeline_tag=tag,
            downloads=downloads,
            likes=likes,
            trending_score=trending,
            gated=gated,
        )
        for model_id, tag, downloads, likes, trending, gated, params in HUB_MODELS
    ]
    with HubServer(repos, page_size=2) as server:
        yield server.url


@contextmanager
def serve_streamlit(
    command_for: Callable[[int], list[str]],
    env: dict[str, str],
    *,
    start_timeout_s: float = 60,
) -> Iterator[str]:
    """Run ``command_for(port)`` (a Streamlit server listening on ``port``, one no other program
    takes first: tests/ports.py) with ``env``; yield its URL once healthy and stop it after. Its
    output goes to a file, read if it fails to start (a pipe nobody reads would stall a chatty
    server)."""
    port = unused_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command_for(port), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(process, url, log, start_timeout_s)
        except BaseException:
            process.kill()
            process.wait(timeout=30)
            raise
        try:
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def _wait_healthy(
    process: subprocess.Popen[bytes], url: str, log: IO[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                output = log.read().decode(errors="replace")[-4000:]
                raise RuntimeError(f"streamlit did not start: {output}") from None
            time.sleep(0.2)


@contextmanager
def serve_viewer(results: Path, hub: str, *, start_timeout_s: float = 60) -> Iterator[str]:
    """`streamlit run` of the viewer (the CLI's command line) on a free port, the Hub at
    ``hub``; yields its URL once healthy."""
    env = {**os.environ, "MODEL_SUPPORT_HUB_ENDPOINT": hub}
    with serve_streamlit(
        lambda port: viewer_command(str(results), port, headless=True),
        env,
        start_timeout_s=start_timeout_s,
    ) as url:
        yield url


@pytest.fixture
def dead_hub() -> str:
    """An endpoint where nothing listens (connection refused at once)."""
    return f"http://127.0.0.1:{unused_port()}"


def _parameter_count(model: str) -> int:
    """The count a run records, from the size in the model's name (e.g. "Qwen3-1.7B"), else 1B."""
    match = re.search(r"(\d+(?:\.\d+)?)[bB]\b", model)
    return int(float(match.group(1)) * 1e9) if match else 10**9


# ---------------------------------------------------------------------------------------------
# Hostile values: what a run (or whoever wrote the dataset) may put in any text field. The
# viewer must show each as exactly this text, never as Markdown or HTML.

HOSTILE_MODEL = "evil/**bold**-[x](javascript:alert(1))"
HOSTILE_ERROR_MODEL = "evil/<img src=x onerror=alert(1)>"
HOSTILE_REASON = (
    "**bold** <script>alert(1)</script> [link](javascript:alert(1)) :red[not red] $x^2$ "
    "&amp; _under_ www.example.com"
)
HOSTILE_ERROR = (
    "# not a heading\n**bold** <img src=x onerror=alert(1)>\n[link](javascript:alert(1))"
)
HOSTILE_TEXT = "<b>not bold</b> **not bold** [l](javascript:alert(1))"
HOSTILE_PROMPT = "<i>prompt</i> _not italic_"
HOSTILE_COMPILER = "evil:**compiler**<b>x</b>"


def build_hostile_dataset(root: Path) -> ResultsStore:
    """A FAIL and an ERROR whose every free-text field is hostile, on a hostile compiler."""
    store = ResultsStore(str(root))
    stack = Stack(python="3.11.9", torch="2.13.0", transformers=TRANSFORMERS)
    common = {
        "task": "text-generation",
        "backend": "cpu",
        "compile_backend": HOSTILE_COMPILER,
        "dtype": "bfloat16",
        "stack": stack,
        "started_at": START,
        "finished_at": START + timedelta(minutes=1),
    }
    failed = ResultDocument(
        model=HOSTILE_MODEL,
        result=Result.FAIL,
        prompts=[HOSTILE_PROMPT],
        text=[HOSTILE_TEXT],
        timings=Timings(wall_time_s=12.0),
        verification=Verification(passed=False, exact=False, bad_tokens=2, reason=HOSTILE_REASON),
        **common,
    )
    errored = ResultDocument(
        model=HOSTILE_ERROR_MODEL,
        result=Result.ERROR,
        error_class=ErrorClass.COMPILE,
        error=HOSTILE_ERROR,
        **common,
    )
    for number, document in enumerate((failed, errored)):
        store.add(
            RunRecord(
                run_id=f"20261001T120000000000Z-hostile{number}",
                document=document,
                run_py=RUN_PY.format(model="hostile"),
                recorded_at=START + timedelta(minutes=2),
            )
        )
    store.materialize()
    return store


@pytest.fixture(scope="session")
def hostile_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory of hostile values (read-only use)."""
    root = tmp_path_factory.mktemp("hostile")
    build_hostile_dataset(root)
    return root


TASK_RUNS: dict[str, tuple[str, Task, str]] = {
    # A real FAIL whose device predicts another label than the reference for one test image
    # and the reference's for the others: a sign error in the head's output for one input
    # (a fault that subtler, such as one lost attention head, may or may not move a label,
    # depending on the weights a machine trained).
    "local/tiny-vit-classifier": (
        "tiny-vit-classifier",
        Task.IMAGE_CLASSIFICATION,
        "model_support.faults:row_logits_negated",
    ),
    "local/tiny-bert-classifier": ("tiny-bert-classifier", Task.TEXT_CLASSIFICATION, "aot_eager"),
    "local/tiny-stable-diffusion": ("tiny-stable-diffusion", Task.TEXT_TO_IMAGE, "aot_eager"),
}
"""The task dataset's runs: model id -> (the demo's tiny checkpoint, task, compile backend)."""


def build_task_dataset(root: Path) -> ResultsStore:
    """Records of real run.py runs (on CPU) of the demo's tiny classifiers and Stable Diffusion
    pipeline: what the viewer shows of tasks beyond text comes from run.py itself."""
    from model_support.checkpoints import build_demo_models, default_cache_dir
    from model_support.execution import run_local

    store = ResultsStore(str(root))
    for fixture, task, backend in TASK_RUNS.values():
        (demo,) = build_demo_models(default_cache_dir(), [fixture])
        config = RunConfig(model=str(demo.require_path()), task=task, compile_backend=backend)
        store.add(run_local(config, timeout_s=900))
    store.materialize()
    return store


@pytest.fixture(scope="session")
def task_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory of real task runs (read-only use)."""
    root = tmp_path_factory.mktemp("tasks")
    build_task_dataset(root)
    return root
