"""The verdicts of the tasks beyond text generation, as pure functions on synthetic tensors.

Embeddings, class logits and denoising latents each get a reference, a baseline with a correct
reduced-precision run's noise, and a device output: a correct one (independent noise of the
same size) must PASS, and each fault class the verdict is for, written directly into the
device's output, must FAIL by the check meant to catch it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from model_support.config import RunConfig
from model_support.records import Verification
from model_support.runner import run as runner

NOISE = 0.004  # relative: about a bfloat16 run's error on an embedding or a latent


def _params(**overrides: Any) -> dict[str, Any]:
    verification = RunConfig(model="org/model").verification.model_dump(mode="json")
    return verification | overrides


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _noisy(x: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=_generator(seed), dtype=torch.float64)
    return x + scale * x.abs().mean() * noise


def _assert_failed_by(verdict: dict[str, Any], checks: set[str]) -> None:
    assert verdict["passed"] is False
    assert set(verdict["failed_checks"]) == checks, verdict["reason"]
    for check in checks:
        assert f"{check}:" in verdict["reason"]
    Verification.model_validate(verdict)  # what run.py writes is a valid record


# --------------------------------------------------------------------------- embeddings


class Embeddings:
    """Eight embeddings in four clear pairs (each one's nearest neighbour is its partner)."""

    def __init__(self) -> None:
        generator = _generator(1)
        centres = torch.randn(4, 64, generator=generator, dtype=torch.float64)
        offsets = 0.3 * torch.randn(8, 64, generator=generator, dtype=torch.float64)
        self.reference = centres.repeat_interleave(2, dim=0) + offsets
        self.baseline = _noisy(self.reference, NOISE, 2)

    def judge(self, device: torch.Tensor, **overrides: Any) -> dict[str, Any]:
        return runner.embedding_verdict(
            self.reference, self.baseline, device, _params(**overrides), "bfloat16"
        )


def test_correct_embeddings_pass() -> None:
    e = Embeddings()
    verdict = e.judge(_noisy(e.reference, NOISE, 3))
    assert verdict["passed"], verdict["reason"]
    assert verdict["method"] == "embeddings"
    assert [m["check"] for m in verdict["metrics"]] == ["cosine", "norm"]
    assert verdict["error_ratio"] == verdict["metrics"][0]["median_ratio"]
    assert len(verdict["items"]) == 8 and verdict["bad_tokens"] == 0
    Verification.model_validate(verdict)


def test_embeddings_moved_everywhere_fail_on_the_angle() -> None:
    e = Embeddings()
    verdict = e.judge(_noisy(e.reference, 10 * NOISE, 3))
    assert verdict["passed"] is False and "cosine" in verdict["failed_checks"]
    assert verdict["metrics"][0]["median_ratio"] > 3


def test_embeddings_scaled_fail_on_the_norm_only() -> None:
    e = Embeddings()
    verdict = e.judge(_noisy(e.reference, NOISE, 3) * 1.05)  # direction kept, 5% longer
    _assert_failed_by(verdict, {"norm"})


def test_one_wrong_embedding_fails_on_the_largest_angle() -> None:
    e = Embeddings()
    device = _noisy(e.reference, NOISE, 3)
    device[5] = _noisy(e.reference[5:6], 20 * NOISE, 4)[0]
    verdict = e.judge(device)
    assert "cosine" in verdict["failed_checks"]
    cosine = verdict["metrics"][0]
    assert cosine["peak_ratio"] > 4 and cosine["median_ratio"] < 3  # seen by the maximum only
    assert "largest angle" in verdict["reason"]


def test_a_swapped_ranking_fails_unless_the_reference_was_undecided() -> None:
    e = Embeddings()
    reference = e.reference.clone()
    # Input 2 sits clearly closer to input 0 than input 4 does.
    reference[2] = reference[0] + 0.5 * torch.randn(
        64, generator=_generator(5), dtype=torch.float64
    )
    e.reference = reference
    e.baseline = _noisy(reference, NOISE, 2)
    device = _noisy(reference, NOISE, 3)
    device[[2, 4]] = device[[4, 2]]  # the device ranks 4 where 2 belongs (and vice versa)
    verdict = e.judge(device)
    assert "ranking" in verdict["failed_checks"] and verdict["bad_tokens"] > 0
    assert "ranks input" in verdict["reason"]

    # A pair the reference barely orders may come out either way: a near-tie, accepted.
    tied = e.reference.clone()
    tied[3] = tied[2] + 1e-6 * torch.randn(64, generator=_generator(6), dtype=torch.float64)
    e.reference, e.baseline = tied, _noisy(tied, NOISE, 2)
    device = _noisy(tied, NOISE, 3)
    device[[2, 3]] = device[[3, 2]]
    verdict = e.judge(device)
    assert verdict["near_ties"] > 0 and verdict["bad_tokens"] == 0
    assert "ranking" not in verdict["failed_checks"]


def test_a_strict_float32_baseline_is_held_to_the_relative_floor() -> None:
    e = Embeddings()
    e.baseline = e.reference.clone()  # ieee: the baseline is the reference
    assert e.judge(_noisy(e.reference, 1e-7, 3))["passed"]  # float32 summation order
    verdict = e.judge(_noisy(e.reference, NOISE, 3))  # bfloat16-size error where none is allowed
    assert verdict["passed"] is False
    assert verdict["metrics"][0]["median_baseline"] == 0.0


# --------------------------------------------------------------------------- classification


class ClassLogits:
    """Eight inputs over five classes; input 0 is undecided (two classes 0.01 nats apart)."""

    def __init__(self) -> None:
        logits = torch.randn(8, 5, generator=_generator(7), dtype=torch.float64)
        logits[torch.arange(8), torch.arange(8) % 5] += 4.0  # decisive winners
        logits[0, 1] = logits[0, 0] - 0.01
        self.logits = logits
        self.baseline = _noisy(logits, 0.01, 8)

    def judge(self, device: torch.Tensor) -> dict[str, Any]:
        return runner.classification_verdict(
            torch.log_softmax(self.logits, -1),
            torch.log_softmax(self.baseline, -1),
            device,
            _params(),
            "bfloat16",
        )


def test_correct_class_logits_pass() -> None:
    c = ClassLogits()
    verdict = c.judge(_noisy(c.logits, 0.01, 9))
    assert verdict["passed"], verdict["reason"]
    assert verdict["method"] == "classification" and len(verdict["items"]) == 8
    Verification.model_validate(verdict)


def test_a_decided_top_class_that_changes_fails() -> None:
    c = ClassLogits()
    device = _noisy(c.logits, 0.01, 9)
    device[3, 0] = device[3, 3] + 0.5  # input 3: class 0 instead of its clear winner
    verdict = c.judge(device)
    assert "top1" in verdict["failed_checks"] and verdict["bad_tokens"] == 1
    assert "input 3: class 0" in verdict["reason"]


def test_a_fail_names_each_row_as_the_caller_names_it() -> None:
    """A token classifier's rows are tokens: its reasons say which token of which input."""
    c = ClassLogits()
    device = _noisy(c.logits, 0.01, 9)
    device[3, 0] = device[3, 3] + 0.5
    names = [f"input {i // 4} token {i % 4}" for i in range(8)]
    verdict = runner.classification_verdict(
        torch.log_softmax(c.logits, -1),
        torch.log_softmax(c.baseline, -1),
        device,
        _params(),
        "bfloat16",
        item_names=names,
    )
    assert "input 0 token 3: class 0 but the reference prefers 3" in verdict["reason"]


def test_an_undecided_top_class_may_change() -> None:
    c = ClassLogits()
    device = c.logits.clone()
    device[0, 0], device[0, 1] = c.logits[0, 1], c.logits[0, 0]  # the near-tie flips
    verdict = c.judge(device)
    assert verdict["passed"], verdict["reason"]
    assert verdict["mismatches"] == 1 and verdict["near_ties"] == 1
    assert verdict["items"][0]["verdict"] == "near-tie"


def test_logits_moved_everywhere_fail_on_the_median_one_input_on_the_peak() -> None:
    c = ClassLogits()
    everywhere = c.judge(_noisy(c.logits, 0.1, 9))
    assert {"median", "peak"} <= set(everywhere["failed_checks"])
    one = _noisy(c.logits, 0.01, 9)
    one[6] += torch.tensor([0.0, 0.4, -0.3, 0.2, 0.0], dtype=torch.float64)
    verdict = c.judge(one)
    _assert_failed_by(verdict, {"peak"})


# --------------------------------------------------------------------------- text to image


class Denoising:
    """Four steps of latents (2 prompts) and of denoiser predictions (4 rows, as with CFG)."""

    def __init__(self) -> None:
        self.latents = [
            torch.randn(2, 4, 8, 8, generator=_generator(10 + s), dtype=torch.float64)
            for s in range(4)
        ]
        self.predictions = [
            torch.randn(4, 4, 8, 8, generator=_generator(20 + s), dtype=torch.float64)
            for s in range(4)
        ]
        self.baseline = [_noisy(x, NOISE, 30 + s) for s, x in enumerate(self.latents)]
        self.baseline_predictions = [
            _noisy(x, NOISE, 40 + s) for s, x in enumerate(self.predictions)
        ]

    def correct(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return (
            [_noisy(x, NOISE, 50 + s) for s, x in enumerate(self.latents)],
            [_noisy(x, NOISE, 60 + s) for s, x in enumerate(self.predictions)],
        )

    def judge(self, latents: list[torch.Tensor], predictions: list[torch.Tensor]) -> dict[str, Any]:
        return runner.latent_verdict(
            self.latents,
            self.baseline,
            latents,
            _params(),
            "bfloat16",
            predictions=(self.predictions, self.baseline_predictions, predictions),
        )


def test_a_correct_denoising_run_passes() -> None:
    d = Denoising()
    verdict = d.judge(*d.correct())
    assert verdict["passed"], verdict["reason"]
    assert [m["check"] for m in verdict["metrics"]] == ["denoiser", "latents"]
    assert len(verdict["items"]) == 4 * 4 + 4 * 2
    Verification.model_validate(verdict)


def test_one_wrong_denoising_step_fails_on_the_denoiser_check() -> None:
    d = Denoising()
    latents, predictions = d.correct()
    predictions[2] = _noisy(d.predictions[2], 30 * NOISE, 70)  # a stale or wrong step
    verdict = d.judge(latents, predictions)
    _assert_failed_by(verdict, {"denoiser"})
    steps = {
        i["step"]
        for i in verdict["items"]
        if i["check"] == "denoiser" and i["device_error"] > 10 * NOISE
    }
    assert steps == {2}


def test_a_drifting_trajectory_fails_on_the_latents_check() -> None:
    d = Denoising()
    latents, predictions = d.correct()
    latents = [x * (1 + 0.05 * s) for s, x in enumerate(latents)]
    verdict = d.judge(latents, predictions)
    _assert_failed_by(verdict, {"latents"})


def test_steps_that_do_not_line_up_are_refused() -> None:
    d = Denoising()
    latents, predictions = d.correct()
    with pytest.raises(ValueError, match="steps differ"):
        d.judge(latents[:3], predictions)


# --------------------------------------------------------------------------- shared parts


def test_item_statistics_use_the_floor_for_an_exact_baseline() -> None:
    stats = runner.item_statistics(
        "norm", [2e-5, 4e-5], [0.0, 0.0], _params(), "relative_error_floor"
    )
    assert stats["median_ratio"] == pytest.approx(3e-5 / 1e-5)
    assert stats["peak_ratio"] == pytest.approx(4.0)
    assert stats["median_bound"] == 3.0 and stats["peak_bound"] == 4.0


def test_tone_spelled_speech_is_deterministic_and_distinguishes_characters() -> None:
    rate = 16000
    wave = runner.spoken_waveform("ab", rate)
    assert wave.dtype.name == "float32" and len(wave) == 2 * round(runner.TONE_SECONDS * rate)
    assert (wave == runner.spoken_waveform("ab", rate)).all()
    frequencies = [runner.tone_frequency(c) for c in runner.TONE_ALPHABET]
    assert all(f is not None for f in frequencies)
    assert frequencies == sorted(frequencies)  # one distinct, rising tone per character
    assert runner.tone_frequency("A") == runner.tone_frequency("a")
    assert runner.tone_frequency("~") is None  # unknown characters are silence


def test_every_named_test_image_is_drawn() -> None:
    from model_support.tasks import TEST_IMAGE_NAMES

    images = [runner.draw_test_image(name) for name in TEST_IMAGE_NAMES]
    assert all(image.size == (224, 224) and image.mode == "RGB" for image in images)
    assert len({image.tobytes() for image in images}) == len(images)
    with pytest.raises(ValueError, match="unknown test image"):
        runner.draw_test_image("sunset")


def test_run_py_has_one_section_per_task_family_holding_its_scenario() -> None:
    """A reader finds a task's code by its name: a ``# ---- task: <tags>`` section holding the
    scenario that runs exactly those tags, every task of the vocabulary in one section."""
    import inspect
    import re

    from model_support.script import template_text
    from model_support.vocabulary import Task

    source = template_text()
    headers = list(re.finditer(r"^# ---- task: (.+)$", source, flags=re.MULTILINE))
    sections = {
        tuple(h.group(1).split(", ")): source[h.end() : (headers[i + 1].start() if i + 1 < len(headers) else len(source))]
        for i, h in enumerate(headers)
    }  # fmt: skip
    assert sorted(t for tags in sections for t in tags) == sorted(t.value for t in Task)
    for tags, text in sections.items():
        for tag in tags:
            scenario = type(runner.scenario_for(tag))
            assert f"class {scenario.__name__}(" in text, (tag, scenario.__name__)
            assert set(scenario.tasks) <= set(tags)
            assert inspect.getsource(scenario) in text


def test_the_runner_image_installs_every_task_library_run_py_records() -> None:
    """Every task's loader library beyond transformers (sentence-transformers and diffusers):
    imported by run.py's task sections, recorded in the row's stack and packages, so the runner
    image must install them (pinned, never floating)."""
    import re
    from pathlib import Path

    from model_support.tasks import TASK_SPECS

    dockerfile = (Path(__file__).resolve().parents[2] / "images/runner/Dockerfile").read_text()
    loaders = {spec.loader.library for spec in TASK_SPECS.values()} - {"transformers"}
    assert {"sentence-transformers", "diffusers"} <= loaders  # what the declarations load with
    for key in sorted(library.replace("-", "_") for library in loaders):
        distribution = runner.STACK_PACKAGES[key]
        pinned = re.search(rf'"{re.escape(distribution)}==\$\{{(\w+)\}}"', dockerfile)
        assert pinned, f"{distribution} is not installed at a pinned build argument"
        assert re.search(rf"^ARG {pinned.group(1)}=[0-9]", dockerfile, re.M), distribution
