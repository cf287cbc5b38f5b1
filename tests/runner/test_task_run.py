"""run.py end to end for every task beyond text generation: the tiny fixture loads with its
library's from_pretrained, compiles, runs, is verified against the CPU reference, and PASSes;
the document says what ran and what was compared."""

from __future__ import annotations

import pytest
import torch

from model_support.checkpoints import DemoModel, build_demo_models, default_cache_dir
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.records import MetricStatistics, ResultDocument
from model_support.script import render_script
from model_support.vocabulary import GENERATING_TASKS, TASK_METHODS, Result, Task

pytestmark = pytest.mark.slow

# (fixture, task, what the document's text holds per input)
CASES = [
    ("tiny-sentence-bert", Task.SENTENCE_SIMILARITY, None),
    ("tiny-sentence-bert", Task.FEATURE_EXTRACTION, None),
    ("tiny-bert-classifier", Task.TEXT_CLASSIFICATION, {"function", "code", "prose"}),
    ("tiny-vit-classifier", Task.IMAGE_CLASSIFICATION, {"horizontal", "vertical", "checkerboard", "diagonal"}),
    ("tiny-t5", Task.TEXT2TEXT_GENERATION, "generated"),
    ("tiny-whisper", Task.AUTOMATIC_SPEECH_RECOGNITION, "generated"),
    ("tiny-stable-diffusion", Task.TEXT_TO_IMAGE, None),
]  # fmt: skip


def _fixture(name: str) -> DemoModel:
    (model,) = build_demo_models(default_cache_dir(), [name])
    return model


@pytest.mark.parametrize(("fixture", "task", "text"), CASES, ids=[f"{c[1].value}" for c in CASES])
def test_every_task_runs_and_passes_through_run_py(fixture: str, task: Task, text: object) -> None:
    config = RunConfig(
        model=str(_fixture(fixture).require_path()), task=task, compile_backend="aot_eager"
    )
    record = run_local(config, timeout_s=900)
    assert record.run_py == render_script(config)
    doc: ResultDocument = record.document
    assert doc.result == Result.PASS, (doc.error, doc.traceback, doc.verification.reason)
    assert doc.task == task.value and doc.error_class is None and doc.stage == "verify"
    v = doc.verification
    assert v.passed is True and v.failed_checks == []
    assert v.method == TASK_METHODS[task]
    assert v.error_ratio is not None and v.error_ratio <= v.parameters["max_error_ratio"]

    t = doc.timings
    assert t.load_s and t.first_generate_s and t.steady_generate_s and t.reference_s
    assert t.first_generate_s > t.steady_generate_s > 0  # the first call compiled
    assert t.wall_time_s == pytest.approx(t.load_s + t.first_generate_s)
    assert doc.compilation.graphs and doc.compilation.graphs >= 1
    assert doc.parameters and doc.parameters > 10_000
    assert doc.stack.torch == torch.__version__

    n = len(config.prompts)
    if task in GENERATING_TASKS:
        assert doc.max_new_tokens == 32
        assert len(doc.tokens) == n and all(len(row) == 32 for row in doc.tokens)
        assert t.prefill_s and t.decode_tokens_per_s and t.decode_tokens_per_s > 0
        assert len(v.positions) == 32 * n and v.bad_tokens == 0
        # Both the encoder's forward and the decoder steps were compiled.
        assert doc.compilation.graphs >= 2
    else:
        assert doc.max_new_tokens is None and doc.tokens == [] and t.prefill_s is None
        assert v.metrics and all(m.median_ratio is not None for m in v.metrics)
        # run.py fills every field of the typed record (unknown ones are refused on reading).
        assert all(m.model_fields_set == set(MetricStatistics.model_fields) for m in v.metrics)
        assert v.items
    if isinstance(text, set):
        assert len(doc.text) == n and set(doc.text) <= text
    elif text == "generated":
        assert len(doc.text) == n and all(doc.text)

    if task in (Task.SENTENCE_SIMILARITY, Task.FEATURE_EXTRACTION):
        assert doc.stack.sentence_transformers is not None
        assert {m.check for m in v.metrics} == {"cosine", "norm"}
        assert len(v.items) == n  # one per sentence, with its ranking swaps
    if task == Task.TEXT_TO_IMAGE:
        assert doc.stack.diffusers is not None
        assert any(p.startswith("diffusers==") for p in doc.packages)
        assert {m.check for m in v.metrics} == {"denoiser", "latents"}
        steps = {i["step"] for i in v.items}
        assert steps == set(range(config.denoising_steps))


def test_a_sharded_run_of_a_single_core_task_is_refused_before_it_starts() -> None:
    with pytest.raises(ValueError, match="runs on one core"):
        RunConfig(model="org/m", task=Task.TEXT_TO_IMAGE, cores=2, parallelism="tensor")  # type: ignore[arg-type]


def test_image_classification_prompts_name_the_drawn_test_images() -> None:
    assert RunConfig(model="org/m", task=Task.IMAGE_CLASSIFICATION).prompts[0] == (
        "gradient-checkerboard"
    )
    with pytest.raises(ValueError, match="choose from"):
        RunConfig(model="org/m", task=Task.IMAGE_CLASSIFICATION, prompts=["a cat"])
