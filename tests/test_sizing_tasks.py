"""Sizing the tasks beyond text generation: the tiny fixtures on disk, and Hub repositories
through the real huggingface_hub client against the local stand-in (headers only, no weights).

What run.py cannot load for a task is EXCLUDED with reason unsupported-task (CTC speech
models, image encoders tagged feature-extraction, text-to-image repos without a diffusers
pipeline, timm classifiers), never left to fail as an ERROR.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from hubserver import HubServer, Repo
from safetensors.torch import save

from model_support.checkpoints import DemoModel, build_demo_models, default_cache_dir
from model_support.hardware import GiB, get_profile
from model_support.hub import TensorSpec, local_tensors
from model_support.sizing import (
    Exclusion,
    ModelMetadata,
    Plan,
    plan_from_metadata,
    read_metadata,
    size_model,
)
from model_support.tasks import CHECKPOINTS, family_of
from model_support.vocabulary import GENERATING_TASKS, ExclusionReason, Parallelism, Task

FIXTURES = {checkpoint.name: checkpoint.task for checkpoint in CHECKPOINTS}
"""Every task family's tiny checkpoint (model_support/tasks.py) and its task."""


def _fixture(name: str) -> DemoModel:
    (model,) = build_demo_models(default_cache_dir(), [name])
    return model


def _parameters(directory: Path) -> int:
    """Every tensor of a checkpoint or of every pipeline component, counted from the headers."""
    folders = [directory, *[p for p in directory.iterdir() if p.is_dir()]]
    return sum(t.numel for folder in folders for t in local_tensors(folder) or [])


@pytest.mark.parametrize("name", list(FIXTURES))
def test_each_task_fixture_is_sized_on_one_core(name: str) -> None:
    path = _fixture(name).require_path()
    task = FIXTURES[name]
    plan = size_model(str(path), task=task.value, profile="trn2")
    assert isinstance(plan, Plan), plan
    assert plan.cores == 1 and plan.parallelism is Parallelism.NONE
    assert plan.parameters == _parameters(path)
    if task not in GENERATING_TASKS:
        assert plan.memory.kv_cache == 0  # encoders, classifiers and denoisers keep no cache
    else:
        assert plan.memory.kv_cache > 0


def test_a_local_checkpoint_s_task_is_recognised_from_its_architecture() -> None:
    """A local checkpoint given without a task is tested as a task of its family: the one its
    architecture's auto class (or a pipeline's model_index.json) says."""
    for name, task in FIXTURES.items():
        recognised = read_metadata(str(_fixture(name).require_path())).task
        assert family_of(recognised) is family_of(task), (name, recognised)
    # A bare encoder is recognised as feature-extraction, not by its demo task.
    assert read_metadata(str(_fixture("tiny-sentence-bert").require_path())).task == (
        "feature-extraction"
    )


def _big(task: Task, model_type: str, architectures: list[str]) -> ModelMetadata:
    """40 GiB of bf16 weights: more than one trn2 core holds."""
    return ModelMetadata(
        model="org/big",
        task=task.value,
        model_type=model_type,
        architectures=architectures,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=64,
        tp_plan={"layers.*.self_attn.q_proj": "colwise"},
        tensors=[TensorSpec("layers.0.self_attn.q_proj.weight", "BF16", (20 * GiB,))],
    )


def test_a_task_run_on_one_core_is_never_sharded() -> None:
    meta = _big(Task.TEXT_CLASSIFICATION, "llama", ["LlamaForSequenceClassification"])
    result = plan_from_metadata(meta, profile=get_profile("trn2"), max_cores=16)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_PARALLEL_PLAN
    assert "runs text-classification on one core" in result.message
    # The same weights as a text-generation model are split over cores.
    text = meta.model_copy(
        update={"task": "text-generation", "architectures": ["LlamaForCausalLM"]}
    )
    assert isinstance(plan_from_metadata(text, profile="trn2"), Plan)


@pytest.mark.parametrize(
    ("task", "model_type", "architectures", "why"),
    [
        (Task.AUTOMATIC_SPEECH_RECOGNITION, "wav2vec2", ["Wav2Vec2ForCTC"], "CTC"),
        (Task.FEATURE_EXTRACTION, "dinov2", ["Dinov2Model"], "not a text model"),
        (Task.SENTENCE_SIMILARITY, None, [], "not a text model"),
        (Task.IMAGE_CLASSIFICATION, "timm_wrapper", ["TimmWrapperForImageClassification"], "timm"),
        (Task.TEXT2TEXT_GENERATION, "llama", ["LlamaForCausalLM"], "no architecture"),
        (Task.TEXT_CLASSIFICATION, "vit", ["ViTForImageClassification"], "no architecture"),
    ],
)
def test_what_a_task_s_loader_cannot_take_is_excluded_as_unsupported(
    task: Task, model_type: str | None, architectures: list[str], why: str
) -> None:
    meta = ModelMetadata(
        model="org/m",
        task=task.value,
        model_type=model_type,
        architectures=architectures,
        tensors=[TensorSpec("w", "BF16", (10,))],
    )
    result = plan_from_metadata(meta)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.UNSUPPORTED_TASK
    assert why in result.message


# --------------------------------------------------------------------------- through the Hub


def _directory_files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith("demo-model-stamp")
    }


def _bert_classifier() -> dict[str, bytes]:
    config = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    weights = {"bert.embeddings.word_embeddings.weight": torch.zeros(100, 64)}
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(weights)}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    pipeline = _directory_files(_fixture("tiny-stable-diffusion").require_path())
    fp16 = {  # a variant beside the default weights must not be counted twice
        name.replace(".safetensors", ".fp16.safetensors"): content
        for name, content in pipeline.items()
        if name.startswith("unet/") and name.endswith(".safetensors")
    }
    repos = [
        Repo(
            "org/tiny-sd",
            files=pipeline | fp16,
            pipeline_tag="text-to-image",
            library_name="diffusers",
        ),
        Repo(
            "org/lora",
            files={"pytorch_lora_weights.safetensors": save({"a": torch.zeros(4)})},
            pipeline_tag="text-to-image",
            library_name="diffusers",
        ),
        Repo("org/classifier", files=_bert_classifier(), pipeline_tag="text-classification"),
        Repo(
            "org/ctc",
            files={
                "config.json": json.dumps(
                    {"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"]}
                ).encode(),
                "model.safetensors": save({"w": torch.zeros(4)}),
            },
            pipeline_tag="automatic-speech-recognition",
        ),
        Repo(  # another library's checkpoint: safetensors weights, no transformers config.json
            "org/open-clip",
            files={
                "open_clip_config.json": b"{}",
                "model.safetensors": save({"w": torch.zeros(4)}),
            },
            pipeline_tag="feature-extraction",
            library_name="open_clip",
        ),
    ]
    with HubServer(repos) as s:
        yield s


def test_a_hub_pipeline_is_sized_from_its_components_headers(server: HubServer) -> None:
    plan = size_model("org/tiny-sd", task="text-to-image", endpoint=server.url)
    assert isinstance(plan, Plan), plan
    assert plan.cores == 1 and plan.memory.kv_cache == 0
    assert plan.parameters == _parameters(_fixture("tiny-stable-diffusion").require_path())
    weights = [
        r for r in server.requests if r["path"].endswith(".safetensors") and r["method"] == "GET"
    ]
    assert weights and all(r["range"] for r in weights)  # headers only, never the weights
    assert not any(".fp16." in r["path"] for r in weights)
    # The pipeline tag alone says text-to-image: no task argument needed.
    assert isinstance(size_model("org/tiny-sd", endpoint=server.url), Plan)


def test_a_text_to_image_repo_without_a_pipeline_is_unsupported(server: HubServer) -> None:
    result = size_model("org/lora", endpoint=server.url)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.UNSUPPORTED_TASK
    assert "model_index.json" in result.message


def test_hub_classifier_is_planned_and_a_ctc_model_excluded(server: HubServer) -> None:
    assert isinstance(size_model("org/classifier", endpoint=server.url), Plan)
    result = size_model("org/ctc", endpoint=server.url)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.UNSUPPORTED_TASK
    assert "Wav2Vec2ForCTC" in result.message


def test_another_library_s_checkpoint_of_a_tested_task_is_unsupported(server: HubServer) -> None:
    """No config.json: not something run.py's loaders take, so EXCLUDED, never an error."""
    result = size_model("org/open-clip", endpoint=server.url)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.UNSUPPORTED_TASK
    assert "not a text model" in result.message
