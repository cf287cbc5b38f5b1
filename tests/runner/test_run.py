"""run.py end to end on CPU: the tiny demo checkpoints load, compile, generate and PASS."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from model_support.checkpoints import DemoModel, build_demo_models, default_cache_dir
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.records import ResultDocument, parse_result_line
from model_support.script import render_script
from model_support.vocabulary import Result, Task

pytestmark = pytest.mark.slow


def _run(demo: DemoModel, **kwargs: object) -> ResultDocument:
    config = RunConfig(model=str(demo.require_path()), task=demo.task, **kwargs)  # type: ignore[arg-type]
    record = run_local(config, timeout_s=600)
    assert record.run_py == render_script(config)
    return record.document


def _assert_complete_pass(doc: ResultDocument, n_prompts: int) -> None:
    assert doc.result == Result.PASS, (doc.error, doc.traceback, doc.verification.reason)
    assert doc.error_class is None
    assert len(doc.tokens) == n_prompts and all(len(t) == 32 for t in doc.tokens)
    assert len(doc.text) == n_prompts
    t = doc.timings
    assert t.load_s and t.first_generate_s and t.steady_generate_s and t.prefill_s
    assert t.first_generate_s > t.steady_generate_s > t.prefill_s > 0
    assert t.decode_tokens_per_s and t.decode_tokens_per_s > 0
    assert t.wall_time_s == pytest.approx(t.load_s + t.first_generate_s)
    assert t.reference_s and t.total_s and t.total_s > t.wall_time_s
    assert doc.memory.peak_device_memory_bytes and doc.memory.peak_device_memory_bytes > 10 * 2**20
    assert doc.memory.host_rss_anon_bytes and doc.memory.host_rss_file_bytes is not None
    assert doc.stack.torch == torch.__version__
    assert doc.stack.transformers == transformers.__version__
    assert doc.stack.python and doc.stack.os
    assert doc.stack.neuronx_cc is None  # off Trainium
    assert any(p.startswith("transformers==") for p in doc.packages)
    v = doc.verification
    assert v.passed is True and v.bad_tokens == 0
    assert v.error_ratio is not None and v.error_ratio <= v.parameters["max_error_ratio"]
    assert len(v.positions) == 32 * n_prompts
    assert doc.started_at and doc.finished_at and doc.finished_at > doc.started_at
    # The timed second call compiled nothing: its tok/s is the compiled graphs' own.
    assert doc.compilation.timed_call_graphs == 0
    # Recompiles are counted, and stayed under Dynamo's limit (8): nothing ran eagerly.
    assert doc.compilation.recompiles is not None and doc.compilation.recompiles < 8


def test_dense_model_passes_in_bfloat16(demo_models: dict[str, DemoModel]) -> None:
    doc = _run(demo_models["tiny-llama"], compile_backend="aot_eager")
    _assert_complete_pass(doc, 3)
    assert doc.backend == "cpu" and doc.dtype == "bfloat16" and doc.compile_backend == "aot_eager"
    # Compiled once per shape: the prefill, then one recompile for the decode step's shapes.
    assert doc.compilation.recompiles == 1, doc.compilation.recompile_reasons
    # Trained on the bundled corpus: the continuation is recognisable Python.
    assert any(word in doc.text[0] for word in ("return", "if", "fib", "n"))


def test_a_model_that_recompiles_every_step_is_an_error_not_an_eager_pass() -> None:
    """A Gemma2-style checkpoint whose sliding window (16) the prompts and 32 new tokens cross
    recompiles its decode graph at every step: past Dynamo's recompile limit the rest would
    run eagerly and its figures would not be the compiled stack's, so it is ERROR compile
    saying so, never a PASS."""
    (gemma2,) = build_demo_models(default_cache_dir(), ["tiny-gemma2-softcap"])
    doc = _run(gemma2, compile_backend="aot_eager")
    assert (doc.result, doc.error_class) == (Result.ERROR, "compile"), doc.error
    # Its own reason: the model's cache cannot compile once; the compiler did not fail.
    assert doc.error_reason == "recompiles-per-step"
    assert doc.error is not None and doc.error.startswith("EagerFallback: the compiled call ")
    assert "hit torch._dynamo's recompile_limit (8)" in doc.error
    assert "it recompiles at every step" in doc.error
    assert "Dynamo's guard: 0/0: tensor" in doc.error  # Dynamo's own guard failure, quoted


def test_float32_inductor_run_is_exact(demo_models: dict[str, DemoModel]) -> None:
    doc = _run(demo_models["tiny-qwen3"], dtype="float32")
    _assert_complete_pass(doc, 3)
    assert doc.compile_backend == "inductor"  # the default off Trainium
    c = doc.compilation  # each compiled graph was a hit or a miss of inductor's FX graph cache
    assert (
        c.cache_per_graph and c.graphs and (c.cache_hits or 0) + (c.cache_misses or 0) == c.graphs
    )
    assert doc.verification.exact is True
    assert doc.verification.error_ratio < 1.0  # fp32 compiled vs fp32 reference: below the floor


def test_mixture_of_experts_passes(demo_models: dict[str, DemoModel]) -> None:
    _assert_complete_pass(_run(demo_models["tiny-qwen3-moe"], compile_backend="aot_eager"), 3)


def test_image_text_to_text_passes(demo_models: dict[str, DemoModel]) -> None:
    demo = demo_models["tiny-llava"]
    assert demo.task == Task.IMAGE_TEXT_TO_TEXT
    doc = _run(demo, compile_backend="aot_eager")
    _assert_complete_pass(doc, 1)
    assert doc.prompts == ["Describe this image."]


def test_stored_run_py_reproduces_the_run_standalone(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    """What is stored is what ran: the same file, run by hand elsewhere, gives the same tokens."""
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend="aot_eager",
        dtype="float32",
    )
    record = run_local(config, timeout_s=600)
    (tmp_path / "run.py").write_text(record.run_py)
    done = subprocess.run(
        [sys.executable, "run.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    again = parse_result_line(done.stdout)
    assert again is not None, done.stderr[-2000:]
    assert json.loads((tmp_path / "result.json").read_text())["tokens"] == again.tokens
    assert again.tokens == record.document.tokens
    assert again.result == record.document.result == Result.PASS


def test_a_tokenizer_without_pad_or_eos_token_still_batches(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    path = tmp_path / "no-pad"
    shutil.copytree(demo_models["tiny-llama"].require_path(), path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    for key in ("pad_token", "eos_token"):
        tokenizer_config.pop(key, None)
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    doc = run_local(RunConfig(model=str(path), compile_backend="aot_eager"), timeout_s=600).document
    _assert_complete_pass(doc, 3)
