"""Sizing decides from one read of a model: snapshots built in memory, no files, no Hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_support.hub import ModelSnapshot, TensorSpec, read_snapshot
from model_support.sizing import (
    SIZING_CACHE_ENV,
    Exclusion,
    Plan,
    metadata_from_snapshot,
    plan_from_metadata,
    read_metadata,
)
from model_support.vocabulary import ExclusionReason, Parallelism

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
}


def _tensors(config: dict) -> list[TensorSpec]:
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * 16, config["num_key_value_heads"] * 16
    tensors = [TensorSpec("model.embed_tokens.weight", "BF16", (v, h))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors += [
            TensorSpec(p + "self_attn.q_proj.weight", "BF16", (q, h)),
            TensorSpec(p + "self_attn.k_proj.weight", "BF16", (kv, h)),
            TensorSpec(p + "self_attn.v_proj.weight", "BF16", (kv, h)),
            TensorSpec(p + "self_attn.o_proj.weight", "BF16", (h, q)),
            TensorSpec(p + "mlp.gate_proj.weight", "BF16", (inter, h)),
            TensorSpec(p + "mlp.up_proj.weight", "BF16", (inter, h)),
            TensorSpec(p + "mlp.down_proj.weight", "BF16", (h, inter)),
        ]
    return tensors


@pytest.fixture(autouse=True)
def _no_sizing_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the sizing cache at an empty folder, to see that a snapshot is sized without it."""
    cache = tmp_path / "sizing-cache"
    monkeypatch.setenv(SIZING_CACHE_ENV, str(cache))
    return cache


def test_a_checkpoint_snapshot_is_sized_without_files_or_a_hub(tmp_path: Path) -> None:
    snapshot = ModelSnapshot("org/qwen", config=QWEN3, tensors=_tensors(QWEN3))
    meta = metadata_from_snapshot(snapshot)
    assert (meta.model_type, meta.num_key_value_heads, meta.task) == ("qwen3", 2, "text-generation")
    assert meta.tp_plan, "the full derivation reads transformers' parallel plan"
    plan = plan_from_metadata(meta, profile="trn2")
    assert isinstance(plan, Plan) and plan.cores == 1
    assert plan.parameters == sum(t.numel for t in snapshot.tensors or [])
    # Forced to two cores the same snapshot splits along the plan it carries.
    split = plan_from_metadata(meta, profile="trn2", cores=2)
    assert isinstance(split, Plan) and split.parallelism is Parallelism.TENSOR
    assert not (tmp_path / "sizing-cache").exists(), "a pure derivation remembers nothing"


def test_one_core_is_decided_from_the_config_alone_when_the_caller_accepts_it() -> None:
    snapshot = ModelSnapshot(
        "org/qwen", task="text-generation", config=QWEN3, tensors=_tensors(QWEN3)
    )
    asked = []

    def one_core(meta: object) -> bool:
        asked.append(meta)
        return True

    meta = metadata_from_snapshot(snapshot, one_core=one_core)
    assert meta.header_only and meta.tp_plan is None and len(asked) == 1
    refused = metadata_from_snapshot(snapshot, one_core=lambda meta: False)
    assert not refused.header_only and refused.tp_plan


@pytest.mark.parametrize(
    ("snapshot", "reason", "words"),
    [
        (
            ModelSnapshot("org/g", task="text-generation", gated=True, config=QWEN3),
            ExclusionReason.GATED_WITHOUT_TOKEN,
            "no Hub token was given",
        ),
        (
            ModelSnapshot(
                "org/g", task="text-generation", gated=True, token_available=True,
                access_refused=True,
            ),
            ExclusionReason.GATED_WITHOUT_TOKEN,
            "refused the token",
        ),
        # Gated, with access, but no safetensors: the verdict is the weights, not the gate.
        (
            ModelSnapshot("org/g", task="text-generation", gated=True, token_available=True),
            ExclusionReason.NO_SAFETENSORS,
            "publishes no safetensors",
        ),
        # Another library's checkpoint of a tested task: weights, no config.json.
        (
            ModelSnapshot("org/clip", task="feature-extraction", tensors=[TensorSpec("w", "F32", (4,))]),
            ExclusionReason.UNSUPPORTED_TASK,
            "not a text model",
        ),
        (
            ModelSnapshot("org/lora", task="text-to-image"),
            ExclusionReason.UNSUPPORTED_TASK,
            "model_index.json",
        ),
    ],
    ids=["gated-no-token", "gated-refused", "gated-no-safetensors", "no-config", "no-pipeline"],
)  # fmt: skip
def test_what_a_read_found_decides_the_exclusion(
    snapshot: ModelSnapshot, reason: ExclusionReason, words: str
) -> None:
    result = plan_from_metadata(metadata_from_snapshot(snapshot), profile="trn2")
    assert isinstance(result, Exclusion) and result.reason is reason, result
    assert words in result.message


def test_a_pipeline_snapshot_gives_its_components_on_one_core() -> None:
    index = {
        "_class_name": "StableDiffusionPipeline",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "scheduler": ["diffusers", "PNDMScheduler"],
    }
    tensors = [TensorSpec("unet.w", "F32", (64, 64)), TensorSpec("vae.w", "F32", (32,))]
    snapshot = ModelSnapshot("org/sd", task="text-to-image", tensors=tensors, pipeline_index=index)
    meta = metadata_from_snapshot(snapshot)
    assert meta.pipeline_class == "StableDiffusionPipeline"
    assert meta.components["unet"] == "UNet2DConditionModel"
    plan = plan_from_metadata(meta, profile="trn2")
    assert isinstance(plan, Plan) and plan.cores == 1 and plan.parameters == 64 * 64 + 32


def test_reading_a_checkpoint_is_one_snapshot_then_the_same_decision(
    tiny_llama_path: Path,
) -> None:
    path = str(tiny_llama_path)
    snapshot = read_snapshot(path)
    assert snapshot.source == "local" and snapshot.config and snapshot.tensors
    assert read_metadata(path) == metadata_from_snapshot(snapshot)
