"""Sizing: real published configurations worked out by hand, local checkpoints, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from model_support.cli.commands_size import register
from model_support.hardware import GiB, get_profile
from model_support.hub import TensorSpec
from model_support.sizing import (
    Exclusion,
    MetadataError,
    ModelMetadata,
    Plan,
    memory_at,
    metadata_from_config,
    plan_from_metadata,
    size_model,
)
from model_support.vocabulary import ExclusionReason, Parallelism

# --------------------------------------------------------------------------- real configurations
# Config values copied from each model's public config.json; the tensors are the names and
# shapes its safetensors checkpoint holds (all BF16). The builders are checked against the
# published parameter counts before sizing.


def _decoder(config: dict, *, qk_norm: bool = False, moe: str | None = None) -> list[TensorSpec]:
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    t = [TensorSpec("model.embed_tokens.weight", "BF16", (config["vocab_size"], h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        t += [
            TensorSpec(p + "self_attn.q_proj.weight", "BF16", (heads * hd, h)),
            TensorSpec(p + "self_attn.k_proj.weight", "BF16", (kv * hd, h)),
            TensorSpec(p + "self_attn.v_proj.weight", "BF16", (kv * hd, h)),
            TensorSpec(p + "self_attn.o_proj.weight", "BF16", (h, heads * hd)),
            TensorSpec(p + "input_layernorm.weight", "BF16", (h,)),
            TensorSpec(p + "post_attention_layernorm.weight", "BF16", (h,)),
        ]
        if qk_norm:
            t += [
                TensorSpec(p + "self_attn.q_norm.weight", "BF16", (hd,)),
                TensorSpec(p + "self_attn.k_norm.weight", "BF16", (hd,)),
            ]
        if moe is None:
            inter = config["intermediate_size"]
            for name, shape in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter))):
                t.append(TensorSpec(p + f"mlp.{name}_proj.weight", "BF16", shape))
        elif moe == "qwen3":
            n, inter = config["num_experts"], config["moe_intermediate_size"]
            t.append(TensorSpec(p + "mlp.gate.weight", "BF16", (n, h)))  # router
            for e in range(n):
                q = p + f"mlp.experts.{e}."
                t += [
                    TensorSpec(q + "gate_proj.weight", "BF16", (inter, h)),
                    TensorSpec(q + "up_proj.weight", "BF16", (inter, h)),
                    TensorSpec(q + "down_proj.weight", "BF16", (h, inter)),
                ]
        else:  # mixtral checkpoint layout
            n, inter = config["num_local_experts"], config["intermediate_size"]
            t.append(TensorSpec(p + "block_sparse_moe.gate.weight", "BF16", (n, h)))
            for e in range(n):
                q = p + f"block_sparse_moe.experts.{e}."
                t += [
                    TensorSpec(q + "w1.weight", "BF16", (inter, h)),
                    TensorSpec(q + "w2.weight", "BF16", (h, inter)),
                    TensorSpec(q + "w3.weight", "BF16", (inter, h)),
                ]
    t.append(TensorSpec("model.norm.weight", "BF16", (h,)))
    if not config.get("tie_word_embeddings", False):
        t.append(TensorSpec("lm_head.weight", "BF16", (config["vocab_size"], h)))
    return t


def _llama(h: int, inter: int, layers: int, heads: int, kv: int, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
LLAMA31_8B = _llama(4096, 14336, 32, 32, 8, 128256)
MISTRAL_7B_V03 = {
    **_llama(4096, 14336, 32, 32, 8, 32768),
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "head_dim": 128,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
MIXTRAL_8X7B = {
    **_llama(4096, 14336, 32, 32, 8, 32000),
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
LLAMA33_70B = _llama(8192, 28672, 80, 64, 8, 128256)
LLAMA31_405B = _llama(16384, 53248, 126, 128, 8, 128256)

# Expected plans, worked out by hand from the module's memory model. Notation: P = parameters,
# W = parameters held whole on every core under TP (embeddings, norms, q/k norms, routers; the
# lm_head is in the class plan and split), weights = 2 bytes x (W + (P - W) / d),
# KV = layers x 2 x kv_heads_per_core x 128 x 160 tokens x 3 prompts x 2 bytes,
# total = 1.1 x (weights + KV) + 1 GiB reserve, must be <= 24 GiB (trn2 LNC=2),
# 12 GiB (trn2 LNC=1) or 16 GiB (trn1).  GiB = 1,073,741,824 bytes.
#
# Qwen3-0.6B: P = 596,049,920 (0.6B; 0.44B non-embedding, tied lm_head).
#   d=1: weights 1,192,099,840; KV 28x2x8x128x160x3x2 = 55,050,240;
#   total = 1,247,150,080 + 124,715,008 + 1 GiB = 2,445,606,912 (2.28 GiB) <= 24 GiB -> 1 core.
# Llama-3.1-8B: P = 8,030,261,248.
#   d=1: weights 16,060,522,496; KV 32x2x8x128x160x3x2 = 62,914,560;
#   total = 16,123,437,056 x 1.1 + 1 GiB = 18,809,522,586 (17.52 GiB) <= 24 -> 1 core on trn2.
#   trn1 (16 GiB): d=1 does not fit; d=2: W = 525,336,576 (embed) + 32x8192 + 4096 = 525,602,816,
#   weights = 2 x 525,602,816 + 2 x 7,504,658,432 / 2 = 8,555,864,064; KV /2 = 31,457,280;
#   total = 8,587,321,344 x 1.1 + 1 GiB = 10,519,795,303 (9.80 GiB) -> 2 cores.
# Mistral-7B-v0.3: P = 7,248,023,552.
#   d=1: weights 14,496,047,104 + KV 62,914,560 -> total 17,088,599,655 (15.92 GiB) -> 1 core on trn2.
#   trn2 LNC=1 (12 GiB): d=2: W = 134,217,728 + 262,144 + 4096 = 134,483,968,
#   weights = 268,967,936 + 7,113,539,584 = 7,382,507,520; KV 31,457,280;
#   total = 7,413,964,800 x 1.1 + 1 GiB = 9,229,103,104 (8.60 GiB) -> 2 cores.
# Qwen3-30B-A3B: P = 30,532,122,624; per layer whole: norms 4096 + q/k norm 256 + router 128x2048.
#   W = 311,164,928 (embed) + 48 x 266,496 + 2048 = 323,958,784.
#   d=2: weights 647,917,568 + 30,208,163,840 = 30,856,081,408 (28.7 GiB) > 24 GiB.
#   d=4: weights 647,917,568 + 15,104,081,920 = 15,751,999,488; KV 48x2x1x128x160x3x2 = 11,796,480;
#   total = 15,763,795,968 x 1.1 + 1 GiB = 18,413,917,389 (17.15 GiB) -> 4 cores.
# Mixtral-8x7B: P = 46,702,792,704; W = 131,072,000 + 32 x (8192 + 8x4096) + 4096 = 132,386,816.
#   d=4: weights 264,773,632 + 23,285,202,944 = 23,549,976,576 (21.9 GiB) -> x1.1 + 1 > 24.
#   d=8: weights 264,773,632 + 11,642,601,472 = 11,907,375,104; KV 32x2x1x128x160x3x2 = 7,864,320;
#   total = 11,915,239,424 x 1.1 + 1 GiB = 14,180,505,191 (13.21 GiB) -> 8 cores.
# Llama-3.3-70B: P = 70,553,706,496; W = 1,050,673,152 + 80x16384 + 8192 = 1,051,992,064.
#   d=4: weights 2,103,984,128 + 34,750,857,216 > 24 GiB.
#   d=8: weights 2,103,984,128 + 17,375,428,608 = 19,479,412,736; KV 80x2x1x128x160x3x2 = 19,660,800;
#   total = 19,499,073,536 x 1.1 + 1 GiB = 22,522,722,714 (20.98 GiB) -> 8 cores.
#   trn1: d=8 -> 20.98 GiB > 16; d=16: weights 2,103,984,128 + 8,687,714,304 = 10,791,698,432,
#   KV 80x2x(8 heads over 16 cores: 1 each)x... = 19,660,800 -> 12,966,236,980 (12.08 GiB) -> 16.
# Llama-3.1-405B: P = 405,853,388,800; W = 2,101,346,304 + 126x32768 + 16384 = 2,105,491,456.
#   At d=16 the weights alone are 2 x (2,105,491,456 + 403,747,897,344 / 16)
#   = 4,210,982,912 + 50,468,487,168 = 54,679,470,080 (50.9 GiB) > 24 GiB -> too large.
REAL = {
    "Qwen3-0.6B": (QWEN3_06B, {"qk_norm": True}, 596_049_920),
    "Llama-3.1-8B": (LLAMA31_8B, {}, 8_030_261_248),
    "Mistral-7B-v0.3": (MISTRAL_7B_V03, {}, 7_248_023_552),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, {"qk_norm": True, "moe": "qwen3"}, 30_532_122_624),
    "Mixtral-8x7B": (MIXTRAL_8X7B, {"moe": "mixtral"}, 46_702_792_704),
    "Llama-3.3-70B": (LLAMA33_70B, {}, 70_553_706_496),
    "Llama-3.1-405B": (LLAMA31_405B, {}, 405_853_388_800),
}

# (model, instance, lnc) -> (cores, weights bytes per core, KV bytes per core, total per core)
EXPECTED = [
    ("Qwen3-0.6B", "trn2", None, 1, 1_192_099_840, 55_050_240, 2_445_606_912),
    ("Llama-3.1-8B", "trn2", None, 1, 16_060_522_496, 62_914_560, 18_809_522_586),
    ("Llama-3.1-8B", "trn1", None, 2, 8_555_864_064, 31_457_280, 10_519_795_303),
    ("Mistral-7B-v0.3", "trn2", None, 1, 14_496_047_104, 62_914_560, 17_088_599_655),
    ("Mistral-7B-v0.3", "trn2", 1, 2, 7_382_507_520, 31_457_280, 9_229_103_104),
    ("Qwen3-30B-A3B", "trn2", None, 4, 15_751_999_488, 11_796_480, 18_413_917_389),
    ("Mixtral-8x7B", "trn2", None, 8, 11_907_375_104, 7_864_320, 14_180_505_191),
    ("Llama-3.3-70B", "trn2", None, 8, 19_479_412_736, 19_660_800, 22_522_722_714),
    ("Llama-3.3-70B", "trn1", None, 16, 10_791_698_432, 19_660_800, 12_966_236_980),
    # trn3 at LNC=2: 36 GiB (38,654,705,664 bytes) per logical core, so half the trn2 cores.
    # Mixtral: 264,773,632 replicated (the embedding) + 93,140,811,776 / 4 sharded bytes.
    ("Mixtral-8x7B", "trn3", None, 4, 23_549_976_576, 15_728_640, 26_996_017_562),
    ("Qwen3-30B-A3B", "trn3", None, 2, 30_856_081_408, 23_592_960, 35_041_383_629),
    ("Llama-3.3-70B", "trn3", 1, 16, 10_791_698_432, 19_660_800, 12_966_236_980),
]


@pytest.fixture(scope="module")
def real_metadata() -> dict[str, ModelMetadata]:
    metas = {}
    for name, (config, layout, published) in REAL.items():
        tensors = _decoder(config, **layout)
        assert sum(t.numel for t in tensors) == published, name  # builder matches the checkpoint
        metas[name] = metadata_from_config(config, tensors, model=name, task="text-generation")
    return metas


@pytest.mark.parametrize(("name", "instance", "lnc", "cores", "weights", "kv", "total"), EXPECTED)
def test_real_models_need_the_hand_worked_cores(
    real_metadata: dict[str, ModelMetadata],
    name: str,
    instance: str,
    lnc: int | None,
    cores: int,
    weights: int,
    kv: int,
    total: int,
) -> None:
    plan = plan_from_metadata(real_metadata[name], profile=instance, lnc=lnc)
    assert isinstance(plan, Plan), plan
    assert plan.cores == cores
    assert plan.parallelism == (Parallelism.NONE if cores == 1 else Parallelism.TENSOR)
    assert plan.memory.weights_sharded + plan.memory.weights_replicated == weights
    assert plan.memory.kv_cache == kv
    assert plan.total_bytes == total
    assert plan.headroom_bytes == get_profile(instance, lnc).bytes_per_core - total


def test_llama_405b_is_too_large_for_16_cores(real_metadata: dict[str, ModelMetadata]) -> None:
    result = plan_from_metadata(real_metadata["Llama-3.1-405B"])
    assert isinstance(result, Exclusion)
    assert result.reason is ExclusionReason.TOO_LARGE
    assert result.closest is not None and result.closest.degree == 16
    assert result.closest.weights_sharded + result.closest.weights_replicated == 54_679_470_080
    # ...but a whole trn2 instance holds it: 2 x (2,105,491,456 + 403,747,897,344 / 64)
    # = 16,828,104,704 bytes of weights per core (15.7 GiB), x1.1 + 1 GiB = 18.2 GiB at 64 cores.
    whole_instance = plan_from_metadata(real_metadata["Llama-3.1-405B"], max_cores=64)
    assert isinstance(whole_instance, Plan) and whole_instance.cores == 64
    # The exclusion says so: the fewest cores beyond the 16 allowed that hold it.
    assert result.needed == whole_instance.memory
    assert result.needed_split == (64, Parallelism.TENSOR)
    assert "It would fit 64 cores (tensor parallel)." in result.message
    # In float32 even a whole instance is too small: the cores it needs are more than one has.
    wider = plan_from_metadata(real_metadata["Llama-3.1-405B"], max_cores=64, dtype="float32")
    assert isinstance(wider, Exclusion) and wider.needed_split == (128, Parallelism.TENSOR)
    assert "It would fit 128 cores (tensor parallel), more than one trn2.48xlarge has." in (
        wider.message
    )
    # CPU processes share one host's memory: more of them would not hold it.
    on_cpu = plan_from_metadata(real_metadata["Llama-3.1-405B"], profile="cpu")
    assert isinstance(on_cpu, Exclusion) and on_cpu.needed is None
    assert "would fit" not in on_cpu.message
    mem = whole_instance.memory
    assert mem.weights_sharded + mem.weights_replicated == 16_828_104_704


def test_mixtral_checkpoint_names_are_matched_after_transformers_renames(
    real_metadata: dict[str, ModelMetadata],
) -> None:
    meta = real_metadata["Mixtral-8x7B"]
    mem = memory_at(meta, get_profile("trn2"), 8, Parallelism.TENSOR)
    # Only embeddings, norms and the 32 routers (8 x 4096 each) stay whole.
    assert mem.weights_replicated == 2 * 132_386_816


# --------------------------------------------------------------------------- rules, unit level


def _meta(**kwargs: object) -> ModelMetadata:
    base: dict[str, object] = {
        "model": "synthetic",
        "task": "text-generation",
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "tp_plan": {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.experts": "moe_tp_experts"},
        "tensors": [
            TensorSpec("model.embed_tokens.weight", "BF16", (1000, 512)),
            TensorSpec("model.layers.0.mlp.up_proj.weight", "BF16", (2 * GiB, 4)),
            TensorSpec("model.layers.0.mlp.experts.0.up_proj.weight", "BF16", (2 * GiB, 4)),
        ],
    }
    base.update(kwargs)
    return ModelMetadata.model_validate(base)


def test_moe_without_tp_plan_uses_expert_parallel_and_splits_only_experts() -> None:
    meta = _meta(tp_plan=None, num_experts=8)
    plan = plan_from_metadata(meta)  # 32 GiB of weights in bf16: 16 whole + 16 experts
    assert isinstance(plan, Plan)
    assert plan.parallelism is Parallelism.EXPERT
    # d=2: 16 GiB whole + 8 GiB of experts > 23 GiB usable; d=4: 16 + 4 = 20 GiB (+10 %) fits.
    assert plan.cores == 4
    assert plan.memory.weights_sharded == 4 * GiB
    assert plan.memory.weights_replicated == 16 * GiB + 1000 * 512 * 2
    # expert parallel keeps every KV head on every core
    assert plan.memory.kv_cache == 2 * 2 * 2 * 64 * 160 * 3 * 2


def test_expert_count_must_divide_the_degree() -> None:
    result = plan_from_metadata(_meta(tp_plan=None, num_experts=3))
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_PARALLEL_PLAN
    assert "3 experts" in result.message


def test_kv_heads_are_replicated_when_the_degree_exceeds_them() -> None:
    meta = _meta()
    prof = get_profile("trn2")
    assert memory_at(meta, prof, 2, Parallelism.TENSOR).kv_cache == 2 * 2 * 1 * 64 * 160 * 3 * 2
    assert memory_at(meta, prof, 8, Parallelism.TENSOR).kv_cache == 2 * 2 * 1 * 64 * 160 * 3 * 2
    assert memory_at(meta, prof, 1, Parallelism.NONE).kv_cache == 2 * 2 * 2 * 64 * 160 * 3 * 2


def test_heads_that_do_not_divide_leave_no_parallel_plan() -> None:
    # 7 query and key/value heads: no degree in 2, 4, 8, 16 divides them; 32 GiB needs a split.
    result = plan_from_metadata(_meta(num_attention_heads=7, num_key_value_heads=7))
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_PARALLEL_PLAN
    assert "7 query / 7 key-value heads" in result.message


def test_float32_tensors_count_in_the_run_dtype_and_int8_at_stored_width() -> None:
    meta = _meta(
        tensors=[TensorSpec("a.weight", "F32", (10, 10)), TensorSpec("q.weight", "I8", (10, 10))]
    )
    prof = get_profile("trn2")
    assert memory_at(meta, prof, 1, Parallelism.NONE).weights_replicated == 200 + 100
    f32 = memory_at(meta, prof, 1, Parallelism.NONE, dtype="float32")
    assert f32.weights_replicated == 400 + 100


def test_unknown_tensor_dtype_is_a_clear_error() -> None:
    meta = _meta(tensors=[TensorSpec("a.weight", "F6_E3M2", (10,))])
    with pytest.raises(MetadataError, match="F6_E3M2"):
        plan_from_metadata(meta)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int4"}, "unknown dtype 'int4'"),
        ({"batch": 0}, "batch must be at least 1"),
        ({"max_cores": 0}, "max_cores must be at least 1"),
        ({"profile": "tpu"}, "unknown instance kind 'tpu'"),
        ({"profile": "trn2", "lnc": 4}, "LNC=1 or LNC=2"),
        ({"profile": "trn1", "lnc": 2}, "only to trn2"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_from_metadata(_meta(), **kwargs)


def test_missing_local_directory_is_bad_input() -> None:
    with pytest.raises(MetadataError, match="no checkpoint directory"):
        size_model("./does/not/exist")


# --------------------------------------------------------------------------- local checkpoints


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    model.save_pretrained(path)
    return path, model.num_parameters()


def test_local_checkpoint_is_sized_from_its_safetensors_header(
    tiny_llama: tuple[Path, int],
) -> None:
    path, params = tiny_llama
    plan = size_model(str(path))
    assert isinstance(plan, Plan)
    assert plan.parameters == params
    assert plan.cores == 1 and plan.parallelism is Parallelism.NONE
    # saved in float32, sized in bf16: 2 bytes per parameter
    assert plan.memory.weights_replicated == 2 * params
    # 2 layers x 2 x 2 kv heads x 16 head_dim x 160 tokens x 3 prompts x 2 bytes
    assert plan.memory.kv_cache == 2 * 2 * 2 * 16 * 160 * 3 * 2


def test_the_run_is_sized_from_its_own_config(tiny_llama: tuple[Path, int]) -> None:
    """batch = the number of prompts, sequence = the longest prompt + maxNewTokens: the KV cache
    sized is the one run.py will hold (CLI and operator share this entry point)."""
    from model_support.config import RunConfig
    from model_support.sizing import PROMPT_OVERHEAD_TOKENS, run_shape, size_run

    path, params = tiny_llama
    prompts = ["short", "a much longer prompt of forty-one bytes..", "x"]
    config = RunConfig(model=str(path), prompts=prompts, max_new_tokens=100)
    batch, length = run_shape(config)
    assert (batch, length) == (3, 41 + PROMPT_OVERHEAD_TOKENS + 100)
    plan = size_run(config)
    assert isinstance(plan, Plan) and (plan.batch, plan.max_length) == (batch, length)
    assert plan.memory.kv_cache == 2 * 2 * 2 * 16 * length * 3 * 2
    assert plan.checkpoint_bytes == 4 * params  # stored in float32
    # More tokens: a larger cache, sized, not assumed.
    longer = size_run(config.model_copy(update={"max_new_tokens": 1000}))
    assert isinstance(longer, Plan) and longer.memory.kv_cache > plan.memory.kv_cache


@pytest.mark.parametrize(
    ("profile", "instance_type", "why"),
    [
        ("trn1", None, "trn1 instance.*Trn2 and Trn3 only"),
        ("inf2", None, "inf2 instance.*Trn2 and Trn3 only"),
        ("trn2", "trn1n.32xlarge", "trn1n instance.*Trn2 and Trn3 only"),
        ("trn2", "inf2.xlarge", "inf2 instance"),
        ("trn2", "m7i.4xlarge", "not a Trainium instance type"),
    ],
)
def test_a_neuron_run_where_torchneuron_does_not_run_is_excluded(
    tiny_llama: tuple[Path, int], profile: str, instance_type: str | None, why: str
) -> None:
    """TorchNeuron supports Trn2 and Trn3 only: a neuron test on trn1/inf2 (by profile or by
    the instance type asked for) is EXCLUDED with the reason, never sized and run to fail."""
    from model_support.config import RunConfig
    from model_support.sizing import size_run
    from model_support.vocabulary import Backend

    config = RunConfig(model=str(tiny_llama[0]), backend=Backend.NEURON)
    result = size_run(config, profile=profile, instance_type=instance_type)
    assert isinstance(result, Exclusion), result
    assert result.reason is ExclusionReason.UNSUPPORTED_INSTANCE
    assert re.search(why, result.message), result.message


@pytest.mark.parametrize(
    "instance_type",
    # trn2p and trn2eu: the Neuron driver's other Trainium2 UltraServer servers
    [None, "trn2.3xlarge", "trn2u.48xlarge", "trn2p.48xlarge", "trn2eu.48xlarge", "trn3.3xlarge"],
)
def test_trainium2_and_trainium3_instances_are_sized(
    tiny_llama: tuple[Path, int], instance_type: str | None
) -> None:
    from model_support.config import RunConfig
    from model_support.sizing import size_run
    from model_support.vocabulary import Backend

    config = RunConfig(model=str(tiny_llama[0]), backend=Backend.NEURON)
    assert isinstance(size_run(config, profile="trn2", instance_type=instance_type), Plan)
    # Off the neuron backend a trn1 profile is only a memory budget: sized as before.
    cpu = config.model_copy(update={"backend": Backend.CPU})
    assert isinstance(size_run(cpu, profile="trn1"), Plan)


def test_a_core_override_changes_only_the_core_count(tiny_llama: tuple[Path, int]) -> None:
    from model_support.config import RunConfig
    from model_support.sizing import size_run

    path, params = tiny_llama
    config = RunConfig(model=str(path), cores=2, parallelism=Parallelism.TENSOR)
    plan = size_run(config, cores=2)
    assert isinstance(plan, Plan)
    assert (plan.cores, plan.parallelism) == (2, Parallelism.TENSOR)
    assert plan.parameters == params  # still read from the model (host memory is sized from it)


def test_an_image_prompt_counts_its_image_tokens(tiny_llava_path: Path) -> None:
    from model_support.config import RunConfig
    from model_support.sizing import CHAT_TEMPLATE_TOKENS, read_metadata, run_shape
    from model_support.vocabulary import Task

    assert read_metadata(str(tiny_llava_path)).image_tokens == 16  # its image_seq_length

    config = RunConfig(model="org/vlm", task=Task.IMAGE_TEXT_TO_TEXT, prompts=["hi"])
    text_only = run_shape(config)[1]
    assert run_shape(config, image_tokens=576)[1] == text_only + 576
    assert text_only >= 2 + CHAT_TEMPLATE_TOKENS + config.max_new_tokens


def test_sharded_local_checkpoint_reads_every_shard(tmp_path: Path) -> None:
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    import torch

    for name, key in shards.items():
        save_file({f"model.layers.0.mlp.{key}.weight": torch.zeros(4, 8)}, str(tmp_path / name))
    weight_map = {f"model.layers.0.mlp.{k}.weight": n for n, k in shards.items()}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B | {"num_hidden_layers": 1}))
    plan = size_model(str(tmp_path))
    assert isinstance(plan, Plan) and plan.parameters == 2 * 32


def test_local_checkpoint_without_safetensors_is_excluded(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B))
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    result = size_model(str(tmp_path))
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_SAFETENSORS


def test_corrupt_safetensors_header_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B))
    (tmp_path / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{not json")
    with pytest.raises(ValueError, match="header truncated"):
        size_model(str(tmp_path))


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:  # keep `size` a sub-command, as in the real CLI
        """model-support"""

    return app


def test_cli_prints_the_plan_and_exits_0(cli: typer.Typer, tiny_llama: tuple[Path, int]) -> None:
    result = CliRunner().invoke(cli, ["size", str(tiny_llama[0])])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # rich wraps at the terminal width
    assert "1 core(s) of trn2-lnc2" in text
    assert "KV cache" in text and "headroom" in text


def test_cli_json_is_one_object(cli: typer.Typer, tiny_llama: tuple[Path, int]) -> None:
    result = CliRunner().invoke(
        cli, ["size", str(tiny_llama[0]), "--json", "--instance", "trn1", "--dtype", "float32"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["kind"] == "plan" and data["profile"] == "trn1" and data["cores"] == 1
    assert data["memory"]["weights_replicated"] == 4 * tiny_llama[1]


def test_cli_exclusion_exits_3_with_reason(cli: typer.Typer, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B))
    result = CliRunner().invoke(cli, ["size", str(tmp_path), "--json"])
    assert result.exit_code == 3, result.output
    assert json.loads(result.output)["reason"] == "no-safetensors"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["./no/such/dir"], "no checkpoint directory"),
        (["MODEL", "--instance", "tpu"], "unknown instance kind"),
        (["MODEL", "--lnc", "3"], "LNC=1 or LNC=2"),
    ],
)
def test_cli_bad_input_exits_2(
    cli: typer.Typer, tiny_llama: tuple[Path, int], args: list[str], message: str
) -> None:
    args = [str(tiny_llama[0]) if a == "MODEL" else a for a in args]
    result = CliRunner().invoke(cli, ["size", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_an_instance_type_holds_only_its_own_devices(tiny_llama: tuple[Path, int]) -> None:
    """trn2.3xlarge has one Trainium2 device: 4 cores at LNC 2, 8 at LNC 1; a trn2.48xlarge or an
    UltraServer's server 16 devices. A test is sized for what its instance holds."""
    from model_support.config import RunConfig
    from model_support.hardware import instance_max_cores, instance_types_holding
    from model_support.sizing import size_run

    assert instance_max_cores("trn2.3xlarge", get_profile("trn2", 2)) == 4
    assert instance_max_cores("trn2.3xlarge", get_profile("trn2", 1)) == 8
    assert instance_max_cores("trn2eu.48xlarge", get_profile("trn2", 2)) == 64
    assert instance_max_cores("m5.large", get_profile("trn2", 2)) is None
    assert "trn2.3xlarge" not in instance_types_holding("trn2", 4)
    config = RunConfig(model=str(tiny_llama[0]), cores=8, parallelism=Parallelism.TENSOR)
    with pytest.raises(ValueError, match=r"8 cores do not fit one trn2\.3xlarge: it has 4 cores"):
        size_run(config, profile="trn2", cores=8, instance_type="trn2.3xlarge")
