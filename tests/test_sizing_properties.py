"""Property tests of the pure sizing rule (plan_from_metadata) over generated models."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_support.config import MAX_RUN_CORES
from model_support.hardware import GiB, get_profile
from model_support.hub import TensorSpec
from model_support.sizing import (
    Exclusion,
    ModelMetadata,
    Plan,
    memory_at,
    plan_from_metadata,
    valid_parallelism,
)
from model_support.vocabulary import ExclusionReason, Parallelism

PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_norm": "replicated_with_grad_allreduce",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.experts": "moe_tp_experts",
    "lm_head": "colwise_gather_output",
}


@st.composite
def metadata(draw: st.DrawFn) -> ModelMetadata:
    """A decoder whose weights range from megabytes to terabytes, dense or MoE, with or without
    a TP plan, with head counts that do or do not divide."""
    layers = draw(st.integers(1, 4))
    heads = draw(st.sampled_from([1, 3, 4, 6, 8, 12, 16, 32, 64]))
    kv = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8, 16, 32, 64) if heads % d == 0]))
    experts = draw(st.sampled_from([0, 0, 3, 8, 16, 60, 128]))
    # elements per big matrix, spread evenly over orders of magnitude (16M .. 64G)
    scale = 2 ** draw(st.integers(24, 36)) + draw(st.integers(0, 2**20))
    tensors = [
        TensorSpec("model.embed_tokens.weight", "BF16", (draw(st.integers(1, 2**31)),)),
        TensorSpec("lm_head.weight", draw(st.sampled_from(["BF16", "F32"])), (scale // 4 + 1,)),
    ]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [
            TensorSpec(p + "self_attn.q_proj.weight", "BF16", (scale,)),
            TensorSpec(p + "self_attn.k_norm.weight", "BF16", (128,)),
            TensorSpec(p + "input_layernorm.weight", "F32", (4096,)),
        ]
        if experts:
            tensors.append(TensorSpec(p + "mlp.gate.weight", "BF16", (experts, 64)))
            tensors.append(TensorSpec(p + "mlp.experts.gate_up_proj", "BF16", (experts, scale)))
        else:
            tensors.append(TensorSpec(p + "mlp.up_proj.weight", "I8", (scale,)))
    return ModelMetadata(
        model="generated",
        task="text-generation",
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=draw(st.sampled_from([64, 128, 256])),
        num_experts=experts,
        tp_plan=PLAN if draw(st.booleans()) else None,
        tensors=tensors,
    )


RUN = st.fixed_dictionaries(
    {
        "profile": st.sampled_from(["trn2", "trn1", "inf2"]),
        "max_cores": st.sampled_from([1, 2, 3, 8, 16, 32]),
        "dtype": st.sampled_from(["bfloat16", "float32"]),
        "batch": st.integers(1, 8),
        "max_length": st.integers(1, 4096),
    }
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(meta=metadata(), run=RUN)
def test_chosen_degree_fits_and_no_smaller_valid_degree_does(
    meta: ModelMetadata, run: dict
) -> None:
    result = plan_from_metadata(meta, **run)
    profile = get_profile(run["profile"])
    kwargs = {k: run[k] for k in ("dtype", "batch", "max_length")}
    if isinstance(result, Exclusion):
        assert result.reason in (ExclusionReason.TOO_LARGE, ExclusionReason.NO_PARALLEL_PLAN)
        return
    assert result.cores == result.degree <= run["max_cores"]
    assert result.degree & (result.degree - 1) == 0  # a power of two
    assert valid_parallelism(meta, result.degree) is result.parallelism
    assert result.memory.fits and result.headroom_bytes >= 0
    assert result.total_bytes <= profile.bytes_per_core
    for smaller in (d for d in (1, 2, 4, 8, 16) if d < result.degree):
        parallelism = valid_parallelism(meta, smaller)
        if parallelism is not None:
            assert not memory_at(meta, profile, smaller, parallelism, **kwargs).fits


@FAST
@given(meta=metadata(), run=RUN)
def test_exclusions_are_justified(meta: ModelMetadata, run: dict) -> None:
    result = plan_from_metadata(meta, **run)
    if not isinstance(result, Exclusion):
        return
    profile = get_profile(run["profile"])
    kwargs = {k: run[k] for k in ("dtype", "batch", "max_length")}
    limit = min(run["max_cores"], profile.cores_per_instance)
    degrees = [d for d in (1, 2, 4, 8, 16, 32) if d <= limit]
    valid = {d: p for d in degrees if (p := valid_parallelism(meta, d)) is not None}
    # nothing valid fits
    assert not any(memory_at(meta, profile, d, p, **kwargs).fits for d, p in valid.items())
    if result.reason is ExclusionReason.NO_PARALLEL_PLAN:
        assert set(valid) == {1} and limit > 1
    else:
        assert result.reason is ExclusionReason.TOO_LARGE
        assert len(valid) > 1 or limit == 1
        assert result.closest is not None and result.closest.degree == max(valid)
        # ...and the cores it would need are the fewest valid ones beyond the limit that fit.
        beyond = [
            d
            for d in (2**i for i in range(MAX_RUN_CORES.bit_length()))
            if limit < d <= MAX_RUN_CORES
            and (p := valid_parallelism(meta, d)) is not None
            and memory_at(meta, profile, d, p, **kwargs).fits
        ]
        expected = None if profile.instance == "cpu" else min(beyond, default=None)
        assert (result.needed.degree if result.needed else None) == expected


@FAST
@given(meta=metadata(), run=RUN)
def test_more_cores_allowed_never_changes_a_plan_that_fits(meta: ModelMetadata, run: dict) -> None:
    first = plan_from_metadata(meta, **run)
    wider = plan_from_metadata(meta, **{**run, "max_cores": 64})
    if isinstance(first, Plan):
        assert isinstance(wider, Plan) and wider.cores == first.cores


@FAST
@given(meta=metadata())
def test_per_core_weights_never_grow_with_the_degree(meta: ModelMetadata) -> None:
    profile = get_profile("trn2")
    previous = None
    for degree in (1, 2, 4, 8, 16):
        parallelism = valid_parallelism(meta, degree)
        if parallelism is None:
            continue
        mem = memory_at(meta, profile, degree, parallelism)
        weights = mem.weights_sharded + mem.weights_replicated
        if previous is not None:
            assert weights <= previous
        previous = weights


# Every reason sizing can give is reachable from any generated model by changing the one fact
# that causes it. CURATED is not a sizing outcome: the curated model list sets it;
# UNSUPPORTED_INSTANCE is decided by the instance a run asks for, not by the model
# (tests/test_sizing.py, test_a_neuron_run_where_torchneuron_does_not_run_is_excluded).
MAKE: dict[ExclusionReason, Callable[[ModelMetadata], ModelMetadata]] = {
    ExclusionReason.GATED_WITHOUT_TOKEN: lambda m: m.model_copy(
        update={"gated": True, "token_available": False}
    ),
    ExclusionReason.REMOTE_CODE_REQUIRED: lambda m: m.model_copy(
        update={"needs_remote_code": True}
    ),
    ExclusionReason.UNSUPPORTED_TASK: lambda m: m.model_copy(update={"task": "text-to-image"}),
    ExclusionReason.NO_SAFETENSORS: lambda m: m.model_copy(update={"tensors": None}),
    ExclusionReason.TOO_LARGE: lambda m: m.model_copy(
        update={
            "tp_plan": PLAN,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "tensors": [
                *(m.tensors or []),
                TensorSpec("model.layers.0.mlp.up_proj.weight", "BF16", (2**40,)),
            ],
        }
    ),
    ExclusionReason.NO_PARALLEL_PLAN: lambda m: m.model_copy(
        update={
            "tp_plan": None,
            "num_experts": 0,
            "tensors": [*(m.tensors or []), TensorSpec("model.big.weight", "BF16", (2**40,))],
        }
    ),
}


def test_every_sizing_reason_has_a_maker() -> None:
    assert set(MAKE) == set(ExclusionReason) - {
        ExclusionReason.CURATED,
        ExclusionReason.UNSUPPORTED_INSTANCE,
    }


@pytest.mark.parametrize("reason", list(MAKE))
@settings(max_examples=25, deadline=None)
@given(meta=metadata())
def test_every_exclusion_reason_is_reachable(reason: ExclusionReason, meta: ModelMetadata) -> None:
    result = plan_from_metadata(MAKE[reason](meta))
    assert isinstance(result, Exclusion)
    assert result.reason is reason
    assert result.message  # a sentence for people, beside the code for machines


def test_trusting_remote_code_lifts_only_that_exclusion() -> None:
    meta = ModelMetadata(
        model="m",
        task="text-generation",
        needs_remote_code=True,
        tensors=[TensorSpec("w", "BF16", (GiB,))],
    )
    result = plan_from_metadata(meta, trust_remote_code=True)
    assert isinstance(result, Plan) and result.parallelism is Parallelism.NONE
    assert "KV cache is not counted" in result.notes[0]
