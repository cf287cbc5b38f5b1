"""Localization: a FAIL names the first module whose compiled output diverges.

The pure parts (which modules form a level, when a module diverges, the level-by-level descent)
are tested on synthetic inputs; the whole search runs in run.py on the tiny checkpoints with
the faulty compilers of model_support.faults, whose target module is known: for text
generation and for every other task family (encoder-decoder text and speech, sentence
embeddings, text and image classifiers, a text-to-image pipeline's denoiser), each with a
correct compile that blames nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from model_support.checkpoints import DemoModel
from model_support.config import RunConfig
from model_support.execution import parse_stage_event, run_local
from model_support.records import PROGRESS_MARKER, ResultDocument
from model_support.runner import run as runner
from model_support.vocabulary import (
    DivergencePhase,
    ErrorClass,
    LocalizationStatus,
    LocalizeMode,
    Parallelism,
    Result,
    Task,
)

# The order in which a Llama-style forward first calls its modules (named_modules' names).
LLAMA_CALLS = [
    "model",
    "model.embed_tokens",
    "model.rotary_emb",
    "model.layers.0",
    "model.layers.0.input_layernorm",
    "model.layers.0.self_attn",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.o_proj",
    "model.layers.0.post_attention_layernorm",
    "model.layers.0.mlp",
    "model.layers.0.mlp.down_proj",
    "model.layers.1",
    "model.layers.1.input_layernorm",
    "model.layers.1.self_attn",
    "model.layers.1.self_attn.q_proj",
    "model.layers.1.self_attn.o_proj",
    "model.layers.1.post_attention_layernorm",
    "model.layers.1.mlp",
    "model.layers.1.mlp.down_proj",
    "model.norm",
    "lm_head",
]


def _params(**overrides: Any) -> dict:
    params = RunConfig(model="org/model").verification.model_dump(mode="json")
    return {**params, **overrides}


def test_a_level_is_the_called_children_in_call_order_looking_through_module_lists() -> None:
    assert runner.called_children("", LLAMA_CALLS) == ["model", "lm_head"]
    # model.layers (a ModuleList) is never called: its layers are model's children.
    assert runner.called_children("model", LLAMA_CALLS) == [
        "model.embed_tokens",
        "model.rotary_emb",
        "model.layers.0",
        "model.layers.1",
        "model.norm",
    ]
    assert runner.called_children("model.layers.1", LLAMA_CALLS) == [
        "model.layers.1.input_layernorm",
        "model.layers.1.self_attn",
        "model.layers.1.post_attention_layernorm",
        "model.layers.1.mlp",
    ]
    # A prefix of another name is not its parent (layers.1 is not under layers.10's parent).
    assert runner.called_children("model.layers.1", ["model.layers.1", "model.layers.10.mlp"]) == []
    assert runner.called_children("lm_head", LLAMA_CALLS) == []


def test_a_module_diverges_when_a_statistic_beats_the_baseline_by_the_verdicts_bound() -> None:
    params = _params()
    baseline = torch.full((20,), 0.01, dtype=torch.float64)
    same = runner.module_deviation("m", "Linear", baseline.clone(), baseline, params)
    assert same.failed_checks == []
    assert same.ratios["median"] == pytest.approx(1.0)
    # Just inside and just beyond max_error_ratio on every position: the median decides.
    inside = runner.module_deviation("m", "Linear", baseline * 2.9, baseline, params)
    assert inside.failed_checks == []
    beyond = runner.module_deviation("m", "Linear", baseline * 3.1, baseline, params)
    assert beyond.failed_checks == ["median"]
    # One position far off: the median and q90 hold, the peak check catches it.
    spike = baseline.clone()
    spike[7] = 0.05
    assert runner.module_deviation("m", "Linear", spike, baseline, params).failed_checks == ["peak"]
    # A strict float32 baseline (no deviation) is floored: float32 rounding passes, more fails.
    zero = torch.zeros(20, dtype=torch.float64)
    floor = params["relative_error_floor"]
    assert runner.module_deviation("m", "x", zero + floor, zero, params).failed_checks == []
    assert runner.module_deviation("m", "x", zero + 10 * floor, zero, params).failed_checks
    nan = torch.full((20,), float("nan"), dtype=torch.float64)
    assert runner.module_deviation("m", "x", nan, baseline, params).failed_checks


def test_relative_errors_are_per_position() -> None:
    reference = torch.ones(2, 3, 4)
    device = reference.clone()
    device[1, 2] *= 1.5
    errors = runner.row_errors(device, reference)
    assert errors.shape == (6,)
    assert errors[-1] == pytest.approx(0.5)
    assert errors[:-1].abs().max() == 0


def test_a_modules_output_tensor_is_found_or_it_has_none() -> None:
    x = torch.ones(2)
    assert runner.tensor_output(x) is x
    assert runner.tensor_output((x, None)) is x
    # A module whose output holds no tensor (a cache, None) has nothing to compare.
    assert runner.tensor_output((None, x)) is None
    assert runner.tensor_output(None) is None
    assert runner.tensor_output({"hidden": x}) is None


def _measure_with_fault(faulty: set[str], seen: list[list[str]]):
    """A measurement where each faulty module, and every module enclosing one, diverges."""

    def measure(names: list[str]) -> list:
        seen.append(names)
        deviations = []
        for name in names:
            bad = any(f == name or f.startswith(name + ".") for f in faulty)
            errors = torch.full((4,), 1.0 if bad else 0.01, dtype=torch.float64)
            base = torch.full((4,), 0.01, dtype=torch.float64)
            deviations.append(runner.module_deviation(name, "M", errors, base, _params()))
        return deviations

    return measure


def test_the_descent_names_the_deepest_first_diverging_module_and_only_opens_its_path() -> None:
    seen: list[list[str]] = []
    measure = _measure_with_fault({"model.layers.1.mlp.down_proj"}, seen)
    searched = runner.descend(measure, LLAMA_CALLS, lambda: True)
    assert searched["status"] == "found"
    assert searched["found"].module == "model.layers.1.mlp.down_proj"
    assert [d.module for d in searched["path"]] == ["model", "model.layers.1", "model.layers.1.mlp"]
    assert searched["candidates"] == []
    # One level per step down the path: layer 0's and the attention's children never ran.
    assert [names[0] for names in seen] == [
        "model",
        "model.embed_tokens",
        "model.layers.1.input_layernorm",
        "model.layers.1.mlp.down_proj",
    ]


def test_the_first_in_execution_order_wins_and_the_next_two_are_candidates() -> None:
    faulty = {"model.layers.0.post_attention_layernorm", "model.layers.1", "model.norm"}
    searched = runner.descend(_measure_with_fault(faulty, []), LLAMA_CALLS, lambda: True)
    assert searched["found"].module == "model.layers.0.post_attention_layernorm"
    assert [d.module for d in searched["path"]] == ["model", "model.layers.0"]
    # Nothing diverges after it inside layer 0: the next candidates come from model's level.
    assert [d.module for d in searched["candidates"]] == ["model.layers.1", "model.norm"]
    searched = runner.descend(
        _measure_with_fault({"model.embed_tokens", "model.layers.1", "model.norm", "lm_head"}, []),
        LLAMA_CALLS,
        lambda: True,
    )
    assert searched["found"].module == "model.embed_tokens"
    # At most two: the level's own (layers.1, norm) before the enclosing level's (lm_head).
    assert [d.module for d in searched["candidates"]] == ["model.layers.1", "model.norm"]


def test_a_fault_between_children_names_the_enclosing_module() -> None:
    # model.layers.1 diverges but none of its children does (a wrong residual add).
    def measure(names: list[str]) -> list:
        return [
            runner.module_deviation(
                name,
                "M",
                torch.full((4,), 1.0 if name in ("model", "model.layers.1") else 0.01),
                torch.full((4,), 0.01),
                _params(),
            )
            for name in names
        ]

    searched = runner.descend(measure, LLAMA_CALLS, lambda: True)
    assert (searched["status"], searched["found"].module) == ("found", "model.layers.1")


def test_no_diverging_module_and_an_exhausted_budget_say_so() -> None:
    clean = runner.descend(_measure_with_fault(set(), []), LLAMA_CALLS, lambda: True)
    assert (clean["status"], clean["found"]) == ("none", None)
    levels = iter([True, True, False])
    searched = runner.descend(
        _measure_with_fault({"model.layers.1.mlp.down_proj"}, []), LLAMA_CALLS, lambda: next(levels)
    )
    # Out of time after two levels: the deepest module confirmed so far, marked incomplete.
    assert searched["status"] == "incomplete"
    assert searched["found"].module == "model.layers.1"


def test_localization_runs_on_a_fail_unless_asked_otherwise() -> None:
    assert runner.localization_wanted(_params(), "FAIL")
    assert not runner.localization_wanted(_params(), "PASS")
    assert runner.localization_wanted(_params(localize="always"), "PASS")
    assert not runner.localization_wanted(_params(localize="never"), "FAIL")
    with pytest.raises(ValueError, match=r"verification\.localize is 'sometimes': use one of"):
        runner.localization_wanted(_params(localize="sometimes"), "FAIL")


def test_runner_localization_vocabulary_matches_the_package() -> None:
    assert set(runner.LOCALIZE_MODES) == {m.value for m in LocalizeMode}
    assert set(runner.LOCALIZATION_STATUSES) == {s.value for s in LocalizationStatus}
    assert tuple(runner.DIVERGENCE_PHASES) == tuple(p.value for p in DivergencePhase)


# ---- where a generation's FAIL is searched: the position it first shows at, and its step


def _position(
    prompt: int,
    position: int,
    deviation: float,
    *,
    verdict: str = "match",
    kl: float = 1e-5,
    excused: bool = False,
) -> dict:
    """One position of a token verdict whose baseline deviates 0.01 nats and 1e-5 in KL."""
    return {
        "prompt": prompt,
        "position": position,
        "device_deviation": deviation,
        "baseline_deviation": 0.01,
        "device_kl": kl,
        "baseline_kl": 1e-5,
        "verdict": verdict,
        "excused": excused,
    }


def _first(*positions: dict) -> list[int]:
    return runner.failing_positions({"positions": list(positions)}, _params())


def test_the_first_failing_position_is_the_first_that_fails_a_check_by_itself() -> None:
    # The peak bound (4) times the prompt's largest baseline deviation (0.01): 0.04.
    within = [_position(p, t, 0.01) for p in (0, 1) for t in range(8)]
    assert _first(*within) == []
    beyond_peak = _position(0, 5, 0.05)
    bad_token = _position(1, 3, 0.01, verdict="bad")
    assert _first(*within, beyond_peak) == [5]
    # A bad token fails by itself, whatever its deviation; the earliest position wins.
    assert _first(*within, beyond_peak, bad_token) == [3]
    # KL alone: beyond max_kl_ratio (10) times the prompt's largest baseline KL.
    assert _first(*within, beyond_peak, _position(0, 2, 0.01, kl=2e-4)) == [2]
    # A NaN fails; a router tie the verdict excused never counts.
    assert _first(*within, beyond_peak, _position(1, 4, float("nan"))) == [4]
    assert _first(*within, beyond_peak, _position(1, 1, 9.0, excused=True)) == [5]


def test_a_fault_that_began_below_the_bounds_is_searched_from_where_it_began_first() -> None:
    """A cache write miscompiled at step 3 shows 3.9x a correct run's largest error there, under
    the peak bound; step 4 reads it again and fails by itself. Step 3 is searched first, then
    step 4; a position beyond the baseline before a clean one does not count."""
    quiet = [_position(0, t, 0.01) for t in (0, 5, 6, 7)]
    began = [_position(0, 1, 0.02), _position(0, 2, 0.01), _position(0, 3, 0.039)]
    assert _first(*quiet, *began, _position(0, 4, 0.2)) == [3, 4]


def test_a_fail_spread_over_positions_starts_where_a_correct_run_is_first_exceeded() -> None:
    """No position fails by itself (a fault everywhere, caught by the median): the first
    position beyond the largest error a correct run reaches on its prompt."""
    spread = [_position(0, t, 0.009) for t in range(3)] + [_position(0, 3, 0.03)]
    assert _first(*spread, *[_position(0, t, 0.03) for t in range(4, 8)]) == [3]


def test_a_decode_fail_is_searched_at_its_step_a_prefill_fail_on_the_sequence_then_its_step() -> (
    None
):
    def plans(*positions: dict, failed: bool = True, generates: bool = True) -> list:
        verification = {"positions": list(positions)}
        chosen = runner.search_plans(generates, verification, _params(), failed)
        return [(plan.phase, plan.step) for plan in chosen]

    quiet = [_position(0, t, 0.01) for t in range(8)]
    assert plans(*quiet, _position(0, 6, 1.0)) == [("decode", 6)]
    assert plans(*quiet, _position(0, 5, 0.02), _position(0, 6, 1.0)) == [
        ("decode", 5),
        ("decode", 6),
    ]
    assert plans(*quiet, _position(0, 0, 1.0)) == [("prefill", None), ("prefill", 0)]
    # No failing position (a PASS searched with "always", or nothing beyond a correct run):
    # the whole sequence at once, as the verdict scores it.
    assert plans(*quiet, _position(0, 6, 1.0), failed=False) == [("prefill", None)]
    assert plans(*quiet) == [("prefill", None)]
    # A family that does not decode has one search, on its inputs.
    assert plans(*quiet, _position(0, 6, 1.0), generates=False) == [(None, None)]


def test_a_fail_whose_search_names_nothing_says_why_in_one_sentence() -> None:
    """Never a bare none: where it searched, and why nothing there can show the error."""
    decode, whole, prefill_step = (
        runner.SearchPlan("decode", 5),
        runner.SearchPlan("prefill", None),
        runner.SearchPlan("prefill", 0),
    )
    spread = {"positions": [_position(0, t, 0.02) for t in range(8)]}
    at_step = runner.none_reason([decode], spread, _params())
    assert at_step.startswith(
        "no module's output diverges at decode step 5 (one token per sequence, against the "
        "static cache), on the reference's inputs: the error arises outside"
    )
    assert runner.none_reason([whole], spread, _params()).startswith(
        "the failure is spread over positions (none is beyond the largest error or KL "
        "divergence a correct run reaches on its prompt), so no step is singled out"
    )
    assert runner.none_reason([whole, prefill_step], spread, _params()).startswith(
        "no module's output diverges on the whole sequence at once or at the prefill step as "
        "the run ran it"
    )
    assert runner.none_reason([runner.SearchPlan(None, None)], {}, _params()).startswith(
        "no module's output diverges on the reference's inputs"
    )


def test_a_replayed_step_is_the_step_the_run_made(tiny_llama_path: Path) -> None:
    """The search's root call at a decode step is the run's own: the run's batch, one token per
    sequence, the static cache of the run's length holding what the earlier steps wrote. Called
    on it, the reference gives the logits generate gave at that step; every call gets a copy of
    the cache, so calling again gives them again."""
    config = RunConfig(
        model=str(tiny_llama_path),
        backend="cpu",  # type: ignore[arg-type]
        dtype="float32",  # type: ignore[arg-type]
        max_new_tokens=6,
    ).model_dump(mode="json")
    scenario = runner.scenario_for("text-generation")
    cpu = torch.device("cpu")
    processor, model = scenario.load(config, "float32", cpu)
    inputs = scenario.inputs(config, processor, cpu, "float32")
    prompt_len = inputs["input_ids"].shape[1]
    out = runner.generate(model, inputs, 6, scenario.pad_token_id(processor))
    tokens = out.sequences[:, prompt_len:]
    step = 4
    args, kwargs = runner.replay_step(
        scenario, config, processor, model, tokens, step, cpu, "float32"
    )
    assert kwargs["input_ids"].tolist() == tokens[:, step - 1 : step].tolist()
    (cache,) = [value for value in kwargs.values() if runner.is_cache(value)]
    # generate's static cache: the prompt and every new token but the last.
    assert cache.layers[0].keys.shape[-2] == prompt_len + 6 - 1
    for _ in range(2):
        call_args, call_kwargs = runner.map_call((args, kwargs), lambda t: t)
        with torch.no_grad():
            logits = model(*call_args, **call_kwargs).logits[:, -1]
        torch.testing.assert_close(logits, out.logits[step])
    # Cast for the device (the run's dtype), the call's cache is a copy in that dtype.
    _, cast = runner._cast_call((args, kwargs), torch.bfloat16, cpu)
    (cast_cache,) = [value for value in cast.values() if runner.is_cache(value)]
    assert cast_cache.layers[0].keys.dtype == torch.bfloat16
    assert cache.layers[0].keys.dtype == torch.float32


def _run(
    model: DemoModel,
    backend: str,
    dtype: str = "bfloat16",
    task: Task = Task.TEXT_GENERATION,
    **verification: Any,
) -> dict:
    config = RunConfig(
        model=str(model.require_path()),
        task=task,
        compile_backend=backend,
        backend="cpu",  # type: ignore[arg-type]
        dtype=dtype,  # type: ignore[arg-type]
        max_new_tokens=8,
        # Enough denoising steps for stale_step's step (2, from 0), no more.
        denoising_steps=3,
        verification=verification,  # type: ignore[arg-type]
    ).model_dump(mode="json")
    doc = runner.execute(runner.RunContext(config))
    ResultDocument.model_validate(doc)  # the record keeps every field the search wrote
    return doc


@pytest.mark.slow
def test_the_dense_miscompiler_is_localized_to_the_last_layers_mlp_output(
    demo_models: dict[str, DemoModel], capsys: pytest.CaptureFixture[str]
) -> None:
    """dense_miscompiler adds noise after the last decoder layer's MLP output (down_proj)."""
    doc = _run(demo_models["tiny-llama"], "model_support.faults:dense_miscompiler")
    # The progress line says the search ended well (the CLI shows failed for anything else).
    events = [
        parse_stage_event(line)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(PROGRESS_MARKER)
    ]
    (ended,) = [e for e in events if e and e.stage == "localize" and e.status != "start"]
    assert (ended.status, ended.detail) == (
        "done",
        "found from the prefill: model.layers.1.mlp.down_proj",
    )
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert found["status"] == "found", found
    assert found["module"] == "model.layers.1.mlp.down_proj"
    # Wrong from the first token on: searched on the whole sequence, as today.
    assert (found["phase"], found["step"]) == ("prefill", None)
    assert [p["module"] for p in found["path"]] == ["model", "model.layers.1", "model.layers.1.mlp"]
    assert found["kind"] == "Linear"
    assert found["error_ratio"] > _params()["max_error_ratio"]
    assert found["rank"] == 0 and found["seconds"] > 0
    assert found["host_peak_rss_increase_bytes"] is not None
    assert found["device_peak_increase_bytes"] is not None  # on cpu: the process's own peak


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "module", "model", "dtype"),
    [
        # The last layer's input norm read 10% too large.
        ("scale_norm_10pct", "model.layers.1.input_layernorm", "tiny-llama", "bfloat16"),
        # Every logit outside a position's top 64 raised: the LM head's output.
        ("vocab_tail_bias", "lm_head", "tiny-llama", "bfloat16"),
        # Noise on the final norm's output, dense and MoE.
        ("final_norm_noise_30pct", "model.norm", "tiny-llama", "float32"),
        ("final_norm_noise_30pct", "model.norm", "tiny-qwen3-moe", "bfloat16"),
    ],
)
def test_faults_at_a_norm_and_at_the_lm_head_are_named_exactly(
    fault: str, module: str, model: str, dtype: str, demo_models: dict[str, DemoModel]
) -> None:
    doc = _run(demo_models[model], f"model_support.faults:{fault}", dtype)
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", module)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "dtype"), [("tiny-qwen3-moe", "float32"), ("tiny-llama", "bfloat16")]
)
def test_a_zeroed_head_is_localized_to_its_output_projection(
    model: str, dtype: str, demo_models: dict[str, DemoModel]
) -> None:
    """zero_head zeroes head 0 at the input of the last layer's o_proj: o_proj diverges."""
    doc = _run(demo_models[model], "model_support.faults:zero_head", dtype)
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", "model.layers.1.self_attn.o_proj")
    assert found["path"][-1]["module"] == "model.layers.1.self_attn"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "backend", "dtype"),
    [
        ("tiny-llama", "eager", "bfloat16"),
        ("tiny-llama", "aot_eager", "bfloat16"),
        ("tiny-llama", "inductor", "float32"),
        # More exact than the reference's own dtype: never a divergence.
        ("tiny-llama", "model_support.faults:float64_recompute", "bfloat16"),
        ("tiny-qwen3-moe", "aot_eager", "float32"),
        ("tiny-qwen3-moe", "model_support.faults:float64_recompute", "bfloat16"),
    ],
)
def test_a_correct_compile_passes_and_its_localization_blames_nothing(
    model: str, backend: str, dtype: str, demo_models: dict[str, DemoModel]
) -> None:
    doc = _run(demo_models[model], backend, dtype, localize="always")
    assert doc["result"] == "PASS"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"], found["path"]) == ("none", None, [])
    assert found["reason"] is None


# ---- faults only in decode steps: searched at the step the FAIL first shows at

CHOSEN_STEP = 5  # the decode step at which cache_write_noise starts (of the 8 generated)


def _prompt_length(model: DemoModel, task: Task = Task.TEXT_GENERATION) -> int:
    """The run's padded prompt length: the cache positions the prefill writes."""
    config = RunConfig(model=str(model.require_path()), task=task).model_dump(mode="json")
    scenario = runner.scenario_for(config["task"])
    processor, _ = scenario.load(config, "float32", torch.device("cpu"))
    return int(runner.build_inputs(config, processor, config["prompts"])["input_ids"].shape[1])


@pytest.mark.slow
def test_a_fault_only_in_decode_steps_is_named_at_the_first_step(
    demo_models: dict[str, DemoModel], capsys: pytest.CaptureFixture[str]
) -> None:
    """decode_noise_100pct corrupts the last layer's MLP output only where it computes one token
    per sequence: the prefill is right, every decode step wrong. Searched on the whole sequence
    (as the verdict scores it) nothing diverges; at decode step 1, as the run ran it, the MLP's
    output projection does."""
    doc = _run(demo_models["tiny-llama"], "model_support.faults:decode_noise_100pct")
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", "model.layers.1.mlp.down_proj"), found
    assert (found["phase"], found["step"]) == ("decode", 1)
    assert [p["module"] for p in found["path"]] == ["model", "model.layers.1", "model.layers.1.mlp"]
    events = [
        parse_stage_event(line)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(PROGRESS_MARKER)
    ]
    (ended,) = [e for e in events if e and e.stage == "localize" and e.status != "start"]
    assert ended.detail == "found from decode step 1: model.layers.1.mlp.down_proj"
    where = ResultDocument.model_validate(doc).verification.first_divergence
    assert where is not None
    assert where.summary().startswith(
        "first diverging module, from decode step 1: model.layers.1.mlp.down_proj (Linear)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3-moe"])
def test_a_cache_write_fault_from_a_chosen_step_is_named_at_that_step(
    model: str, demo_models: dict[str, DemoModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache_write_noise corrupts the keys and values the last layer's attention writes from a
    cache position on: decode step CHOSEN_STEP writes it first (prompt length + step - 1) and
    attends to it. Searched at that step, with the static cache as the earlier steps filled it,
    the attention diverges and none of its projections does."""
    position = _prompt_length(demo_models[model]) + CHOSEN_STEP - 1
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_CACHE_POSITION", str(position))
    doc = _run(demo_models[model], "model_support.faults:cache_write_noise")
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", "model.layers.1.self_attn"), found
    assert (found["phase"], found["step"]) == ("decode", CHOSEN_STEP)
    assert found["kind"].endswith("Attention")


@pytest.mark.slow
def test_a_fault_the_step_search_cannot_see_is_reported_with_the_step_it_searched(
    demo_models: dict[str, DemoModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """one_row_step_noise_300pct counts steps by watching the token embedding in the whole
    step's graph: the search at its step compiles the faulty layer without the embedding, so
    nothing diverges there. The FAIL keeps a reason naming the step, never a bare none."""
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_ROW_STEP", "1:5")
    doc = _run(demo_models["tiny-llama"], "model_support.faults:one_row_step_noise_300pct")
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"], found["phase"], found["step"]) == (
        "none",
        None,
        "decode",
        5,
    ), found
    assert found["reason"].startswith("no module's output diverges at decode step 5")


def _first_step_routed_to(model: DemoModel, tokens: list, layer: int, expert: int) -> int:
    """The first decode step at which the float32 reference routes some prompt's token to
    ``expert`` in MoE layer ``layer`` (each prompt alone, with the device's tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(model.require_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chosen: list[torch.Tensor] = []
    router = reference.get_submodule(f"model.layers.{layer}.mlp.gate")
    hook = router.register_forward_hook(lambda module, args, output: chosen.append(output[-1]))
    steps = []
    try:
        for prompt, generated in zip(RunConfig(model=path).prompts, tokens, strict=True):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                reference(input_ids=torch.cat([ids, torch.tensor([generated])], dim=1))
            routed = chosen.pop()  # (positions, top_k): decode step s reads token s - 1
            steps += [s for s in range(1, len(generated)) if expert in routed[ids.shape[1] + s - 1]]
    finally:
        hook.remove()
    return min(steps)


@pytest.mark.slow
def test_a_decode_only_expert_fault_is_named_with_its_expert_at_its_first_step(
    demo_models: dict[str, DemoModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode_expert_scaled scales expert 2's output in the last MoE layer only where the
    experts compute a decode step's tokens: the FAIL first shows at the first decode step
    that routes a token to expert 2, where the search names the experts module and, measured
    alone, expert 2."""
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_EXPERT", "2")
    moe = demo_models["tiny-qwen3-moe"]
    doc = _run(moe, "model_support.faults:decode_expert_scaled", "float32")
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", "model.layers.1.mlp.experts"), found
    assert (found["expert"], found["diverging_experts"]) == (2, [2])
    assert found["phase"] == "decode"
    assert found["step"] == _first_step_routed_to(moe, doc["tokens"], layer=1, expert=2)


# ---- the other task families: each scenario's own root calls, the same search


def _found(doc: dict) -> dict:
    assert doc["result"] == "FAIL", doc["verification"].get("reason")
    found = doc["verification"]["first_divergence"]
    assert found["status"] == "found", found
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "task", "stack", "module", "path"),
    [
        # T5: the decoder's last block's feed-forward output (its wo), the encoder left correct.
        (
            "tiny-t5",
            Task.TEXT2TEXT_GENERATION,
            "decoder",
            "decoder.block.1.layer.2.DenseReluDense.wo",
            ["decoder", "decoder.block.1", "decoder.block.1.layer.2"],
        ),
        # Whisper: the encoder's last layer's MLP output (fc2), the decoder left correct.
        (
            "tiny-whisper",
            Task.AUTOMATIC_SPEECH_RECOGNITION,
            "encoder",
            "model.encoder.layers.1.fc2",
            ["model", "model.encoder", "model.encoder.layers.1"],
        ),
    ],
    ids=["text2text-decoder", "speech-encoder"],
)
def test_an_encoder_decoders_fault_is_named_in_the_stack_it_is_in(
    fixture: str,
    task: Task,
    stack: str,
    module: str,
    path: list[str],
    demo_models: dict[str, DemoModel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """noise_100pct in one stack only: the teacher-forced forward (encoder and decoder in one
    call) is searched from the whole model down to the faulty linear layer."""
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_STACK", stack)
    found = _found(_run(demo_models[fixture], "model_support.faults:noise_100pct", task=task))
    assert found["module"] == module and found["kind"] == "Linear"
    assert [p["module"] for p in found["path"]][: len(path)] == path
    assert found["candidates"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "task", "fault", "module", "phase", "step"),
    [
        # The decoder's self-attention cache from decode step 3 on; its prefix is one token
        # (the decoder's start), so step s writes position s.
        (
            "tiny-t5",
            Task.TEXT2TEXT_GENERATION,
            "cache_write_noise",
            "decoder.block.1.layer.0.SelfAttention",
            "decode",
            3,
        ),
        (
            "tiny-whisper",
            Task.AUTOMATIC_SPEECH_RECOGNITION,
            "cache_write_noise",
            "model.decoder.layers.1.self_attn",
            "decode",
            3,
        ),
        (
            "tiny-llava",
            Task.IMAGE_TEXT_TO_TEXT,
            "cache_write_noise",
            "model.language_model.layers.1.self_attn",
            "decode",
            3,
        ),
        # One token per sequence from the decoder's first step (its start token) on: the
        # first generated token is already wrong. The whole teacher-forced sequence computes
        # correctly; the prefill step as the run ran it (one token against the encoder's
        # output) names the decoder's feed-forward output.
        (
            "tiny-t5",
            Task.TEXT2TEXT_GENERATION,
            "decode_noise_100pct",
            "decoder.block.1.layer.2.DenseReluDense.wo",
            "prefill",
            0,
        ),
    ],
    ids=["t5", "whisper", "llava", "t5-first-token"],
)
def test_a_decode_fault_of_every_family_that_decodes_is_named_at_its_step(
    fixture: str,
    task: Task,
    fault: str,
    module: str,
    phase: str,
    step: int,
    demo_models: dict[str, DemoModel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = 1 if task != Task.IMAGE_TEXT_TO_TEXT else _prompt_length(demo_models[fixture], task)
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_CACHE_POSITION", str(prefix + step - 1))
    if fault == "decode_noise_100pct":
        monkeypatch.setenv(
            "MODEL_SUPPORT_FAULT_STACK", "decoder"
        )  # the decoder's MLP, not the encoder's
    found = _found(_run(demo_models[fixture], f"model_support.faults:{fault}", task=task))
    assert (found["module"], found["phase"], found["step"]) == (module, phase, step)


@pytest.mark.slow
def test_a_sentence_encoders_fault_is_named_in_the_encoder_sentence_transformers_wraps(
    demo_models: dict[str, DemoModel],
) -> None:
    """noise_100pct on the last layer's MLP output. The searched module is the transformers
    encoder the run compiles (the BertModel's own names), called on the inputs
    sentence-transformers builds for it."""
    doc = _run(
        demo_models["tiny-sentence-bert"],
        "model_support.faults:noise_100pct",
        task=Task.SENTENCE_SIMILARITY,
    )
    found = _found(doc)
    assert (found["module"], found["kind"]) == ("encoder.layer.1.output.dense", "Linear")
    assert [p["module"] for p in found["path"]] == [
        "encoder",
        "encoder.layer.1",
        "encoder.layer.1.output",
    ]


@pytest.mark.slow
def test_a_fault_only_the_pooled_embedding_shows_blames_no_module(
    demo_models: dict[str, DemoModel],
) -> None:
    """zero_head moves every token's state by less than the verdict's bounds over a correct
    run's per-token error (about 2x), but coherently: mean pooling averages the correct run's
    rounding away and keeps the fault's, so the embedding verdict FAILs. The search judges
    per token: it blames nothing, and says so."""
    doc = _run(
        demo_models["tiny-sentence-bert"],
        "model_support.faults:zero_head",
        task=Task.SENTENCE_SIMILARITY,
    )
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"], found["path"]) == ("none", None, [])
    assert found["reason"].startswith("no module's output diverges on the reference's inputs")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "task", "fault", "module"),
    [
        # One batch row (one input text) wrong in the last layer's MLP output.
        (
            "tiny-bert-classifier",
            Task.TEXT_CLASSIFICATION,
            "row_noise_100pct",
            "bert.encoder.layer.1.output.dense",
        ),
        # The last layer's MLP output; the MLP's last module is fc2.
        ("tiny-vit-classifier", Task.IMAGE_CLASSIFICATION, "noise_100pct", "vit.layers.1.mlp.fc2"),
    ],
    ids=["text", "image"],
)
def test_a_classifiers_fault_is_named_exactly(
    fixture: str, task: Task, fault: str, module: str, demo_models: dict[str, DemoModel]
) -> None:
    found = _found(_run(demo_models[fixture], f"model_support.faults:{fault}", task=task))
    assert (found["module"], found["kind"]) == (module, "Linear")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "module"),
    [
        # Head 0 zeroed at the input of the denoiser's last self-attention output projection.
        ("denoiser_zero_head", "up_blocks.1.attentions.1.transformer_blocks.0.attn1.to_out.0"),
        # The timestep the time embedding reads is one scheduler step off: time_proj's output.
        ("wrong_timestep", "time_proj"),
    ],
)
def test_a_denoisers_fault_is_named_in_the_denoiser(
    fault: str, module: str, demo_models: dict[str, DemoModel]
) -> None:
    """The denoiser is searched, once per denoising step, on the device's inputs at that step."""
    doc = _run(
        demo_models["tiny-stable-diffusion"],
        f"model_support.faults:{fault}",
        task=Task.TEXT_TO_IMAGE,
    )
    found = _found(doc)
    assert found["module"] == module
    assert found["candidates"] == []


@pytest.mark.slow
def test_a_stale_denoising_step_is_named_at_the_denoisers_output_only(
    demo_models: dict[str, DemoModel],
) -> None:
    """stale_step is no module's miscomputation: at step 2 the denoiser returns step 1's
    prediction, a reused buffer at conv_out's output (the denoiser's last module). Every block
    computes correctly at every step, so none is blamed; conv_out is named, as the module whose
    output the fault replaces, and only one step of the three (one item in three) diverges."""
    doc = _run(
        demo_models["tiny-stable-diffusion"],
        "model_support.faults:stale_step",
        task=Task.TEXT_TO_IMAGE,
    )
    found = _found(doc)
    assert (found["module"], found["kind"], found["path"]) == ("conv_out", "Conv2d", [])
    assert found["candidates"] == []
    # One step in three: the median over positions stays within the baseline's bound.
    assert "median" not in found["failed_checks"] and "peak" in found["failed_checks"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "task"),
    [
        ("tiny-t5", Task.TEXT2TEXT_GENERATION),
        ("tiny-whisper", Task.AUTOMATIC_SPEECH_RECOGNITION),
        ("tiny-sentence-bert", Task.FEATURE_EXTRACTION),
        ("tiny-bert-classifier", Task.TEXT_CLASSIFICATION),
        ("tiny-vit-classifier", Task.IMAGE_CLASSIFICATION),
        ("tiny-stable-diffusion", Task.TEXT_TO_IMAGE),
    ],
    ids=lambda value: value.value if isinstance(value, Task) else None,
)
def test_a_correct_compile_of_every_family_passes_and_blames_nothing(
    fixture: str, task: Task, demo_models: dict[str, DemoModel]
) -> None:
    doc = _run(demo_models[fixture], "aot_eager", task=task, localize="always")
    assert doc["result"] == "PASS", doc["verification"].get("reason")
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"], found["path"]) == ("none", None, [])
    assert found["reason"] is None and found["seconds"] > 0


def _search_after_a_fail(model: Path, compile_backend: Any, **verification: Any) -> dict:
    """localize_stage on its own, after a FAIL verdict, with ``compile_backend``."""
    from transformers import AutoTokenizer

    config = RunConfig(
        model=str(model),
        backend="cpu",  # type: ignore[arg-type]
        max_new_tokens=4,
        verification=verification,  # type: ignore[arg-type]
    ).model_dump(mode="json")
    ctx = runner.RunContext(config)
    ctx.doc = {"result": "FAIL", "verification": {"passed": False, "first_divergence": None}}
    placement = runner.Placement(
        runner.select_backend("cpu"), torch.device("cpu"), compile_backend, None
    )
    tokens = torch.arange(1, 1 + 4 * len(config["prompts"])).reshape(len(config["prompts"]), 4)
    processor = AutoTokenizer.from_pretrained(config["model"])
    runner.localize_stage(ctx, placement, processor, runner.Generation(tokens, None))
    assert ctx.doc["result"] == "FAIL"  # whatever the search met, the verdict stands
    return ctx.doc["verification"]["first_divergence"]


def test_a_module_that_does_not_compile_on_its_own_is_recorded_not_raised(
    tiny_llama_path: Path,
) -> None:
    def refuses(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("cannot lower this graph (an injected compiler failure)")

    found = _search_after_a_fail(tiny_llama_path, refuses)
    assert (found["status"], found["error_class"], found["module"]) == ("failed", "compile", None)
    # One sentence: which modules, at which shapes, and the compiler's own message.
    assert found["reason"] == (
        "model, lm_head could not be compiled and run on its own on the whole sequence at "
        "once: RuntimeError: cannot lower this graph (an injected compiler failure)"
    )


def test_a_search_out_of_time_says_so(tiny_llama_path: Path) -> None:
    found = _search_after_a_fail(tiny_llama_path, "aot_eager", localize_budget_s=1e-9)
    assert (found["status"], found["module"]) == ("incomplete", None)
    assert found["reason"] == "the localization's time budget (1e-09 s) ran out"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_one_experts_fault_is_named_with_its_expert(
    dtype: str, demo_models: dict[str, DemoModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """one_expert_scaled scales expert 2's output in the last MoE layer: the search names the
    layer's experts module and, measuring each expert alone, expert 2."""
    monkeypatch.setenv("MODEL_SUPPORT_FAULT_EXPERT", "2")
    doc = _run(demo_models["tiny-qwen3-moe"], "model_support.faults:one_expert_scaled", dtype)
    assert doc["result"] == "FAIL"
    found = doc["verification"]["first_divergence"]
    assert (found["status"], found["module"]) == ("found", "model.layers.1.mlp.experts"), found
    assert (found["expert"], found["diverging_experts"]) == (2, [2])
    assert (
        "expert 2 alone"
        in ResultDocument.model_validate(doc).verification.first_divergence.summary()
    )


def _sharded(
    model: DemoModel,
    backend: str,
    env: dict[str, str],
    parallelism: Parallelism = Parallelism.TENSOR,
    dtype: str = "bfloat16",
    **verification: Any,
):
    """The whole run.py on two cores (its own workers), as a process."""
    config = RunConfig(
        model=str(model.require_path()),
        compile_backend=backend,
        backend="cpu",  # type: ignore[arg-type]
        cores=2,
        parallelism=parallelism,
        dtype=dtype,  # type: ignore[arg-type]
        max_new_tokens=8,
        verification=verification,  # type: ignore[arg-type]
    )
    return run_local(config, timeout_s=900, env=env).document


@pytest.mark.slow
def test_a_fault_on_one_rank_of_a_tensor_parallel_run_is_named_with_its_rank(
    demo_models: dict[str, DemoModel],
) -> None:
    """noise_100pct on rank 1 only, at layer 1's MLP output: each rank runs its shard of each
    module on its shard of the reference's inputs; only rank 1's outputs diverge."""
    doc = _sharded(
        demo_models["tiny-llama"],
        "model_support.faults:noise_100pct",
        {"MODEL_SUPPORT_FAULT_RANK": "1", "MODEL_SUPPORT_FAULT_LAYER": "1"},
    )
    assert doc.result == Result.FAIL, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module) == (
        LocalizationStatus.FOUND,
        "model.layers.1.mlp.down_proj",
    ), found
    assert (found.rank, found.ranks) == (1, [1])
    assert [p.module for p in found.path] == ["model", "model.layers.1", "model.layers.1.mlp"]
    assert all(p.ranks == [1] for p in found.path)
    assert "on rank 1" in found.summary()


@pytest.mark.slow
def test_a_cache_write_fault_on_one_rank_of_a_tensor_parallel_run_is_named_at_its_step(
    demo_models: dict[str, DemoModel],
) -> None:
    """cache_write_noise on rank 1 only, from decode step CHOSEN_STEP: every rank replays the
    step on its own shard (its cache holds its heads), runs its shard of each module on its
    shard of the reference's inputs and cache; the attention's output (summed over the ranks
    by o_proj) diverges on both ranks."""
    llama = demo_models["tiny-llama"]
    position = _prompt_length(llama) + CHOSEN_STEP - 1
    doc = _sharded(
        llama,
        "model_support.faults:cache_write_noise",
        {"MODEL_SUPPORT_FAULT_RANK": "1", "MODEL_SUPPORT_FAULT_CACHE_POSITION": str(position)},
    )
    assert doc.result == Result.FAIL, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module, found.ranks) == (
        LocalizationStatus.FOUND,
        "model.layers.1.self_attn",
        [0, 1],
    ), found
    assert (found.phase, found.step) == (DivergencePhase.DECODE, CHOSEN_STEP)
    assert f"from decode step {CHOSEN_STEP}: model.layers.1.self_attn" in found.summary()


@pytest.mark.slow
def test_a_zeroed_head_under_tensor_parallelism_is_named_at_its_output_projection(
    demo_models: dict[str, DemoModel],
) -> None:
    """Head 0 of rank 1's heads zeroed at o_proj's input: o_proj (row-parallel) sums every
    rank's part, so its output diverges on both ranks."""
    doc = _sharded(
        demo_models["tiny-llama"],
        "model_support.faults:zero_head",
        {"MODEL_SUPPORT_FAULT_RANK": "1"},
    )
    assert doc.result == Result.FAIL, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module) == (
        LocalizationStatus.FOUND,
        "model.layers.1.self_attn.o_proj",
    ), found
    assert found.ranks == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3-moe"])
def test_a_correct_tensor_parallel_compile_blames_nothing(
    model: str, demo_models: dict[str, DemoModel]
) -> None:
    doc = _sharded(demo_models[model], "aot_eager", {}, localize="always")
    assert doc.result == Result.PASS, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module, found.path) == (LocalizationStatus.NONE, None, [])


@pytest.mark.slow
def test_one_experts_fault_under_expert_parallelism_is_named_with_its_global_index(
    demo_models: dict[str, DemoModel],
) -> None:
    """Rank 1 holds experts 2 and 3; its first (global expert 2) is miscompiled. The experts
    module sums every rank's part, so it diverges on both ranks; measured alone, expert 2."""
    doc = _sharded(
        demo_models["tiny-qwen3-moe"],
        "model_support.faults:one_expert_scaled",
        {"MODEL_SUPPORT_FAULT_RANK": "1", "MODEL_SUPPORT_FAULT_EXPERT": "0"},
        Parallelism.EXPERT,
    )
    assert doc.result == Result.FAIL, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.module, found.ranks) == ("model.layers.1.mlp.experts", [0, 1]), found
    assert (found.expert, found.diverging_experts) == (2, [2])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_correct_expert_parallel_compile_blames_nothing(
    dtype: str, demo_models: dict[str, DemoModel]
) -> None:
    """In bfloat16 the ranks' expert outputs are summed in another order than the baseline's
    one process: a nearly tied routing choice may flip, at positions the search excuses."""
    doc = _sharded(
        demo_models["tiny-qwen3-moe"],
        "aot_eager",
        {},
        Parallelism.EXPERT,
        dtype,
        localize="always",
    )
    assert doc.result == Result.PASS, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module) == (LocalizationStatus.NONE, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "module"),
    [("final_norm_noise_30pct", "model.norm"), ("vocab_tail_bias", "lm_head")],
)
def test_faults_at_the_final_norm_and_the_lm_head_of_a_tensor_parallel_run_are_named(
    fault: str, module: str, demo_models: dict[str, DemoModel]
) -> None:
    """Both modules' outputs are whole on every rank (the LM head gathers its columns)."""
    doc = _sharded(demo_models["tiny-llama"], f"model_support.faults:{fault}", {}, dtype="float32")
    assert doc.result == Result.FAIL, doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.module, found.ranks) == (LocalizationStatus.FOUND, module, [0, 1])


@pytest.mark.slow
def test_a_worker_lost_during_the_search_never_changes_the_verdict(
    demo_models: dict[str, DemoModel],
) -> None:
    """Rank 1 dies while it compiles a level of the search: the run keeps its FAIL (rank 0
    reported it before the search) and the search is recorded as failed, naming the worker."""
    start = time.monotonic()
    doc = _sharded(demo_models["tiny-llama"], "model_support.faults:kill_worker_in_search", {})
    assert (doc.result, doc.error_class) == (Result.FAIL, None), doc.error
    found = doc.verification.first_divergence
    assert found is not None
    assert (found.status, found.error_class, found.module) == (
        LocalizationStatus.FAILED,
        ErrorClass.WORKER_CRASH,
        None,
    )
    assert "worker rank 1 exited with status -9" in (found.reason or "")
    assert time.monotonic() - start < 300  # noticed at once, not after worker_timeout_s
