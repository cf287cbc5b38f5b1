"""The verdict as a pure function of log-probabilities, on synthetic tensors, one fault class each.

A synthetic "model" has decisive next-token distributions over a small vocabulary; the
baseline and a correct device each add independent noise of a reduced-precision run's size to
the reference logits. Each fault class the verdict must see is then written directly into the
device's logits, so every check is shown catching what it is for and nothing else.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from model_support.config import RunConfig
from model_support.records import Verification
from model_support.runner import run as runner

PROMPTS, POSITIONS, VOCAB = 3, 32, 200
NOISE = 0.02  # nats: a bf16 run's logit noise, about
DECISIVE = 14.0  # the winning token's lead in logits: the tail holds little probability


def _params(**overrides: Any) -> dict[str, Any]:
    verification = RunConfig(model="org/model").verification.model_dump(mode="json")
    return verification | overrides


class Synthetic:
    """Reference logits, the generated (argmax) tokens, and noisy baseline/device logits."""

    def __init__(self, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.generator = generator
        logits = torch.randn(PROMPTS, POSITIONS, VOCAB, generator=generator, dtype=torch.float64)
        logits *= 2.0
        winners = torch.randint(0, VOCAB, (PROMPTS, POSITIONS), generator=generator)
        logits.scatter_add_(
            -1,
            winners[..., None],
            torch.full((PROMPTS, POSITIONS, 1), DECISIVE, dtype=torch.float64),
        )
        self.logits = logits
        self.tokens = logits.argmax(dim=-1)
        self.baseline_logits = self.noisy(NOISE)

    def noisy(self, scale: float) -> torch.Tensor:
        noise = torch.randn(self.logits.shape, generator=self.generator, dtype=torch.float64)
        return self.logits + scale * noise

    def judge(
        self, device: torch.Tensor, *, baseline: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        params = kwargs.pop("params", _params())
        base = self.baseline_logits if baseline is None else baseline
        return runner.verdict(
            [torch.log_softmax(x, dim=-1) for x in self.logits],
            [torch.log_softmax(x, dim=-1) for x in base],
            [x.float() for x in device],
            kwargs.pop("tokens", self.tokens),
            params,
            **kwargs,
        )


@pytest.fixture
def synthetic() -> Synthetic:
    return Synthetic()


def _assert_failed_by(verdict: dict[str, Any], checks: set[str]) -> None:
    assert verdict["passed"] is False
    assert set(verdict["failed_checks"]) == checks, verdict["reason"]
    for check in checks:
        assert f"{check}:" in verdict["reason"]  # the reason names each failed check


def test_a_correct_reduced_precision_run_passes(synthetic: Synthetic) -> None:
    verdict = synthetic.judge(synthetic.noisy(NOISE))
    assert verdict["passed"] is True and verdict["failed_checks"] == []
    for key in ("error_ratio", "q90_ratio", "peak_ratio", "kl_ratio"):
        assert 0.5 < verdict[key] < 2.0, (key, verdict[key])
    # Every figure is recorded, in the shape the records declare.
    Verification.model_validate(verdict)
    assert set(verdict) <= set(Verification.model_fields)
    assert len(verdict["prompt_statistics"]) == PROMPTS
    assert len(verdict["positions"]) == PROMPTS * POSITIONS


def test_a_fault_everywhere_fails_the_median(synthetic: Synthetic) -> None:
    verdict = synthetic.judge(synthetic.noisy(10 * NOISE))
    assert "median" in verdict["failed_checks"]
    assert verdict["error_ratio"] > 5


def test_a_late_onset_fault_fails_the_high_quantile_not_the_median(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    device[:, 24:] = synthetic.noisy(10 * NOISE)[:, 24:]  # the last quarter of decoding
    verdict = synthetic.judge(device)
    assert verdict["error_ratio"] < 2  # the median does not see a quarter of the positions
    assert "q90" in verdict["failed_checks"]


def test_one_batch_row_wrong_at_one_step_fails_the_peak(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    device[1, 16] = synthetic.noisy(30 * NOISE)[1, 16]
    verdict = synthetic.judge(device)
    assert "peak" in verdict["failed_checks"]
    assert not {"median", "q90"} & set(verdict["failed_checks"])  # one position of 32
    worst = max(verdict["prompt_statistics"], key=lambda s: s["peak_ratio"])
    assert worst["prompt"] == 1  # the headline comes from the prompt that holds the fault
    assert "prompt 1's largest logit error" in verdict["reason"]


def test_a_fault_in_the_vocabulary_tail_fails_kl_only(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    tail = synthetic.logits < synthetic.logits.topk(20, dim=-1).values[..., -1:]
    device = torch.where(tail, device + 1.5, device)  # outside the top 20: invisible to top-k
    verdict = synthetic.judge(device)
    _assert_failed_by(verdict, {"kl"})


def test_a_small_scaling_everywhere_fails(synthetic: Synthetic) -> None:
    # A 10% scaling inside a layer shows as a systematic distortion of every position's logits.
    verdict = synthetic.judge(synthetic.noisy(NOISE) * 1.05)
    assert {"median", "kl"} <= set(verdict["failed_checks"])


def test_a_router_flip_at_a_nearly_tied_position_is_excused(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    flips = [(2, 5), (2, 20)]
    for prompt, position in flips:
        device[prompt, position] = synthetic.noisy(30 * NOISE)[prompt, position]
    gaps = [torch.full((POSITIONS, 2), 1.0, dtype=torch.float64) for _ in range(PROMPTS)]
    noise = [torch.full((POSITIONS, 2), 0.01, dtype=torch.float64) for _ in range(PROMPTS)]
    for prompt, position in flips:
        gaps[prompt][position, 1] = 0.005  # the reference's top-k gap in layer 1: a near-tie

    flipped = synthetic.judge(device, router_gaps=gaps, router_noise=noise)
    assert flipped["passed"] is True, flipped["reason"]
    assert flipped["router_ties"] == 2
    excused = {(p["prompt"], p["position"]) for p in flipped["positions"] if p["excused"]}
    assert excused == set(flips)

    # Without the router's evidence the same spikes are a fault: the peak check sees them.
    unexplained = synthetic.judge(device)
    assert "peak" in unexplained["failed_checks"]

    # A tie elsewhere does not excuse a spike: the excuse needs the near-tie at that position.
    elsewhere = [g.clone() for g in gaps]
    for prompt, position in flips:
        elsewhere[prompt][position, 1] = 1.0
        elsewhere[prompt][position + 1, 1] = 0.005
    assert (
        "peak"
        in synthetic.judge(device, router_gaps=elsewhere, router_noise=noise)["failed_checks"]
    )


def test_a_token_changed_by_a_router_flip_at_a_tied_position_is_that_routings(
    synthetic: Synthetic,
) -> None:
    # Seen on a correct bf16 run of the tiny Qwen3-MoE: at a position whose reference routing
    # was nearly tied the device took the other expert, and with it another token that the
    # reference rejects by 0.54 nats, far beyond the rounding allowance of that position.
    device = synthetic.noisy(NOISE)
    tokens = synthetic.tokens.clone()
    prompt, position = 0, 16
    runner_up = int(synthetic.logits[prompt, position].topk(2).indices[1])
    tokens[prompt, position] = runner_up
    device[prompt, position, runner_up] = synthetic.logits[prompt, position].max() + 1.0
    gaps = [torch.full((POSITIONS, 2), 1.0, dtype=torch.float64) for _ in range(PROMPTS)]
    noise = [torch.full((POSITIONS, 2), 0.01, dtype=torch.float64) for _ in range(PROMPTS)]
    gaps[prompt][position, 1] = 0.005

    tied = synthetic.judge(device, tokens=tokens, router_gaps=gaps, router_noise=noise)
    assert tied["passed"] is True, tied["reason"]
    assert (tied["bad_tokens"], tied["router_tie_tokens"], tied["mismatches"]) == (0, 1, 1)
    (flipped,) = [p for p in tied["positions"] if p["token"] != p["reference_token"]]
    assert (flipped["prompt"], flipped["position"], flipped["verdict"]) == (0, 16, "router-tie")
    Verification.model_validate(tied)

    # The same token where the routing was decisive is a bad token.
    decisive = synthetic.judge(device, tokens=tokens, router_gaps=None, router_noise=None)
    assert "tokens" in decisive["failed_checks"] and decisive["bad_tokens"] == 1
    assert "prompt 0 token 16" in decisive["reason"]


def test_router_ties_everywhere_excuse_only_a_share_of_positions(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    device[0, 3:9] = synthetic.noisy(30 * NOISE)[0, 3:9]  # six wrong positions
    tied = [torch.zeros(POSITIONS, 1, dtype=torch.float64) for _ in range(PROMPTS)]
    noise = [torch.full((POSITIONS, 1), 0.01, dtype=torch.float64) for _ in range(PROMPTS)]
    verdict = synthetic.judge(device, router_gaps=tied, router_noise=noise)
    limit = math.ceil(_params()["router_tie_share"] * POSITIONS)
    assert verdict["prompt_statistics"][0]["router_ties"] == limit < 6
    assert "peak" in verdict["failed_checks"]


def test_a_clearly_wrong_token_fails_and_a_near_tie_does_not(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    tokens = synthetic.tokens.clone()
    runner_up = synthetic.logits[0, 4].topk(2).indices[1]
    tokens[0, 4] = runner_up  # the reference prefers its own token by about 5 nats
    verdict = synthetic.judge(device, tokens=tokens)
    _assert_failed_by(verdict, {"tokens"})
    assert verdict["bad_tokens"] == 1 and verdict["first_mismatch"] == 4

    tied = synthetic.logits.clone()
    top = tied[0, 4].topk(2).indices
    tied[0, 4, top[1]] = tied[0, 4, top[0]] - 0.01  # a near-tie in the reference
    near = Synthetic()
    near.logits, near.baseline_logits = tied, tied + (near.baseline_logits - near.logits)
    verdict = near.judge(tied + (device - synthetic.logits), tokens=tokens)
    assert verdict["passed"] is True and verdict["near_ties"] == 1


def test_float32_strict_has_no_tolerance_beyond_the_floor(synthetic: Synthetic) -> None:
    reference = synthetic.logits
    # ieee: the baseline is the reference itself; only float32-level differences pass.
    assert synthetic.judge(reference + 1e-6, baseline=reference)["passed"] is True
    bf16_level = synthetic.judge(synthetic.noisy(NOISE), baseline=reference)
    assert bf16_level["passed"] is False
    assert {"median", "q90", "peak"} <= set(bf16_level["failed_checks"])
    # The same device against a baseline with the allowed reduced precision passes.
    assert synthetic.judge(synthetic.noisy(NOISE))["passed"] is True


def test_thresholds_come_from_the_parameters(synthetic: Synthetic) -> None:
    device = synthetic.noisy(NOISE)
    device[1, 16] = synthetic.noisy(30 * NOISE)[1, 16]
    loose = synthetic.judge(device, params=_params(max_peak_ratio=1000.0, max_kl_ratio=1000.0))
    assert loose["passed"] is True
    assert loose["parameters"]["max_peak_ratio"] == 1000.0


# ------------------------------------------------------------------ float32 precision policy


def test_float32_precision_defaults_per_backend_and_override() -> None:
    # neuronx-cc keeps float32 matmuls float32 unless told to auto-cast (since 2.22)
    assert runner.float32_precision({"float32_precision": "auto"}, "neuron") == "ieee"
    assert runner.float32_precision({"float32_precision": "auto"}, "cuda") == "tf32"
    assert runner.float32_precision({"float32_precision": "auto"}, "cpu") == "ieee"
    assert runner.float32_precision({"float32_precision": "ieee"}, "neuron") == "ieee"
    assert runner.float32_precision({}, "cpu") == "ieee"


def _tf32(x: torch.Tensor) -> torch.Tensor:
    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_bf16_precision_rounds_matmul_operands_and_accumulates_in_float32() -> None:
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    with runner.reduced_precision("bf16"):
        inside = F.linear(x, w)
        product = x @ w.T
    expected = F.linear(x.bfloat16().float(), w.bfloat16().float())
    assert inside.dtype == torch.float32
    assert torch.equal(inside, expected) and torch.equal(product, expected)
    assert not torch.equal(inside, F.linear(x, w))  # the rounding did happen
    # Not a matmul: untouched.
    with runner.reduced_precision("bf16"):
        assert torch.equal(torch.exp(x), torch.exp(x.clone()))


def test_tf32_precision_keeps_ten_mantissa_bits() -> None:
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    assert torch.all((_tf32(x).view(torch.int32) & 0x1FFF) == 0)
    assert torch.max(torch.abs(_tf32(x) - x) / torch.abs(x)) <= 2.0**-11
    with runner.reduced_precision("tf32"):
        inside = F.linear(x, w)
    assert torch.equal(inside, F.linear(_tf32(x), _tf32(w)))


def test_ieee_precision_changes_nothing() -> None:
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    with runner.reduced_precision("ieee"):
        assert torch.equal(F.linear(x, w), F.linear(x.clone(), w.clone()))


@pytest.mark.parametrize("causal", [True, False])
def test_reduced_precision_attention_is_scaled_dot_product_attention(causal: bool) -> None:
    # Values exact in bfloat16, so the rounding changes nothing and only the math is compared;
    # grouped-query attention (2 key/value heads for 4 query heads) and a boolean mask too.
    def exact(*shape: int) -> torch.Tensor:
        return torch.randint(-8, 8, shape).float() / 8

    q, k, v = exact(1, 4, 6, 8), exact(1, 2, 6, 8), exact(1, 2, 6, 8)
    mask = None if causal else torch.ones(6, 6, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
    )
    with runner.reduced_precision("bf16"):
        inside = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
    assert torch.allclose(inside, expected, atol=1e-2)  # softmax output is rounded to bf16


# ------------------------------------------------------------------ mixture-of-experts routers


def _tiny_moe() -> Any:
    """A randomly initialised two-layer Qwen3-MoE: four experts, two per token."""
    import transformers

    config = transformers.Qwen3MoeConfig(
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        vocab_size=50,
    )
    torch.manual_seed(0)
    return transformers.Qwen3MoeForCausalLM(config).eval()


def test_routers_of_a_mixture_of_experts_model_are_observed() -> None:
    import transformers

    model = _tiny_moe()
    ids = torch.randint(0, 50, (1, 7))
    with runner.observe_routers(model) as seen, torch.no_grad():
        model(input_ids=ids)
    assert len(seen) == 2  # one router per layer
    for logits, top_k in seen.values():
        assert logits.shape == (7, 4) and top_k == 2
    dense = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            vocab_size=50,
        )
    ).eval()
    with runner.observe_routers(dense) as seen, torch.no_grad():
        dense(input_ids=ids)
    assert seen == {}


def test_a_flipped_routing_sends_the_token_to_the_next_expert_in_line() -> None:
    """What match_routing replays where a device took the other of two tied experts: the
    flipped token's k-th and (k+1)-th router logits change places, so it goes to the expert
    that was next in line with the k-th's weight; no other token of that layer moves."""
    model = _tiny_moe()
    (_, router, top_k), *_ = runner.moe_routers(model)
    ids = torch.randint(0, 50, (1, 7), generator=torch.Generator().manual_seed(1))
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hook = router.register_forward_hook(lambda _m, _a, out: seen.append((out[0], out[2])))
    try:
        with torch.no_grad():
            model(input_ids=ids)
            with runner.flipped_routing(model, {0: [3]}):
                model(input_ids=ids)
    finally:
        hook.remove()
    (logits, chosen), (flipped_logits, flipped_chosen) = seen
    order = torch.sort(logits[3], descending=True).indices
    inside, outside = int(order[top_k - 1]), int(order[top_k])
    expected = logits[3].clone()
    expected[inside], expected[outside] = logits[3, outside], logits[3, inside]
    assert torch.equal(flipped_logits[3], expected)
    assert set(flipped_chosen[3].tolist()) == set(chosen[3].tolist()) - {inside} | {outside}
    others = [row for row in range(7) if row != 3]
    assert torch.equal(flipped_logits[others], logits[others])
    assert torch.equal(flipped_chosen[others], chosen[others])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (None, "ieee"),
        ("--model-type=transformer -O1", "ieee"),
        ("--auto-cast=none", "ieee"),
        ("--auto-cast matmult", "bf16"),
        ("--auto-cast=matmult --auto-cast-type=tf32", "tf32"),
        ("--auto-cast=all --auto-cast-type fp16", "tf32"),
        ("--auto-cast=matmult --auto-cast=none", "ieee"),  # the right-most option wins
        ("--auto-cast-type=bf16 --auto-cast=all", "bf16"),
    ],
)
def test_the_neuron_baseline_follows_the_compiler_flags_in_effect(
    flags: str | None, expected: str
) -> None:
    """neuronx-cc's --auto-cast / --auto-cast-type (its CLI reference) decide whether float32
    matmuls read bfloat16 or TF32 operands; a strict run is judged strictly."""
    assert runner.float32_precision({"float32_precision": "auto"}, "neuron", flags) == expected
    assert runner.float32_precision({"float32_precision": "bf16"}, "neuron", flags) == "bf16"
