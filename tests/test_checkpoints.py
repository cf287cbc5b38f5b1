"""Tiny demo checkpoints: they load with the real Auto* classes, generate decisively, and the
build cache reuses what is current and rebuilds what is stale, corrupted or half-written."""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from model_support.checkpoints import (
    DEMO_MODELS,
    STAMP_FILE,
    DemoModel,
    ModelKind,
    TrainingRecipe,
    build_demo_models,
    corpus_text,
    default_cache_dir,
    demo_model,
    is_up_to_date,
    read_stamp,
)
from model_support.vocabulary import Task

PROMPTS = ("def fibonacci(n):", "The capital of France is", "import numpy as np")
NEW_TOKENS = 32
TEXT_MODELS = [m.name for m in DEMO_MODELS if m.task is Task.TEXT_GENERATION]


def _greedy(model: Any, inputs: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Greedy-generate NEW_TOKENS tokens; return them and the top-2 logit margin at each step."""
    import torch

    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    top2 = torch.stack(out.scores)[:, 0].topk(2, dim=-1).values
    return new, (top2[:, 0] - top2[:, 1]).tolist()


def _corpus_trigram_share(text: str) -> float:
    """Share of the word trigrams of ``text`` that also occur in the bundled corpus."""
    corpus_words = corpus_text().split()
    corpus_trigrams = set(zip(corpus_words, corpus_words[1:], corpus_words[2:], strict=False))
    words = text.split()
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    assert trigrams, f"too little text to compare with the corpus: {text!r}"
    return sum(t in corpus_trigrams for t in trigrams) / len(trigrams)


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_model_reloads_and_generates_decisively(
    demo_models: dict[str, DemoModel], name: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = demo_models[name]
    tokenizer = AutoTokenizer.from_pretrained(entry.require_path())
    model = AutoModelForCausalLM.from_pretrained(entry.require_path()).eval()
    assert type(model).__name__ == entry.architecture

    margins: list[float] = []
    continuations: dict[str, str] = {}
    for prompt in PROMPTS:
        inputs = tokenizer(prompt, return_tensors="pt")
        assert (
            inputs["input_ids"][0, 0] == tokenizer.bos_token_id
        )  # prompts start like training windows
        new, step_margins = _greedy(model, dict(inputs))
        assert len(new) == NEW_TOKENS
        margins += step_margins
        continuations[prompt] = tokenizer.decode(new, skip_special_tokens=True)

    # Trained predictions are decisive; a random tiny model sits at 0.001-0.05 nats (docs/verification.md).
    assert statistics.median(margins) > 1.0, (name, sorted(margins))
    fib = PROMPTS[0] + continuations[PROMPTS[0]]
    assert _corpus_trigram_share(fib) >= 0.6, fib
    assert continuations["The capital of France is"].lstrip().startswith("Paris"), continuations


@pytest.mark.parametrize("name", [m.name for m in DEMO_MODELS if m.kind is ModelKind.MOE])
def test_moe_models_keep_experts_and_a_tensor_parallel_plan(
    demo_models: dict[str, DemoModel], name: str
) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(demo_models[name].require_path())
    assert config.num_experts_per_tok == 2
    experts = config.num_experts if config.model_type == "qwen3_moe" else config.num_local_experts
    assert experts == 4
    plan = config.base_model_tp_plan
    assert plan, f"{name} lost its tensor-parallel plan"
    assert any("experts" in key for key in plan), plan


def test_llava_reloads_with_processor_and_generates(tiny_llava_path: Path) -> None:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_llava_path)
    model = AutoModelForImageTextToText.from_pretrained(tiny_llava_path).eval()
    assert type(model).__name__ == "LlavaForConditionalGeneration"

    def chat(image: Image.Image) -> dict[str, Any]:
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": "Describe the picture."},
                ],
            }
        ]
        return dict(
            processor.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
            )
        )

    red = chat(Image.new("RGB", (48, 40), (220, 30, 30)))
    # The processor expands <image> into one token per 8x8 patch of the 32x32 input.
    image_tokens = int((red["input_ids"] == model.config.image_token_index).sum())
    assert image_tokens == model.config.image_seq_length == 16
    assert tuple(red["pixel_values"].shape) == (1, 3, 32, 32)
    prompt_text = processor.tokenizer.decode(red["input_ids"][0], skip_special_tokens=True)
    assert prompt_text.startswith("USER:") and prompt_text.endswith("ASSISTANT:")

    new, _ = _greedy(model, red)
    assert len(new) == NEW_TOKENS

    # The vision tower is wired in: another image changes the next-token logits.
    blue = chat(Image.new("RGB", (48, 40), (20, 40, 230)))
    with torch.no_grad():
        red_logits = model(**red).logits[0, -1]
        blue_logits = model(**blue).logits[0, -1]
    assert not torch.allclose(red_logits, blue_logits, atol=1e-4)

    # Its language part is trained on the corpus like the text models.
    text = processor.tokenizer("The capital of France is", return_tensors="pt")
    new, margins = _greedy(model, dict(text))
    assert statistics.median(margins) > 1.0, sorted(margins)
    assert processor.tokenizer.decode(new, skip_special_tokens=True).lstrip().startswith("Paris")


def test_second_build_of_the_shared_cache_reuses_every_model(
    demo_models: dict[str, DemoModel],
) -> None:
    before = {name: (read_stamp(m.require_path()), _mtime(m)) for name, m in demo_models.items()}
    again = build_demo_models(default_cache_dir())
    assert [m.name for m in again] == [m.name for m in DEMO_MODELS]
    for model in again:
        stamp, mtime = before[model.name]
        assert stamp is not None
        assert read_stamp(model.require_path()) == stamp  # same built_at: not retrained
        assert _mtime(model) == mtime


# --- cache behaviour, on a variant trained for 3 steps so each build takes under a second ---


def _quick(name: str = "tiny-llama", steps: int = 3) -> DemoModel:
    return replace(demo_model(name), recipe=TrainingRecipe(steps=steps))


def _mtime(model: DemoModel) -> int:
    # Every weights file (a diffusers pipeline keeps them in its component folders).
    weights = sorted(model.require_path().rglob("*.safetensors"))
    assert weights, model.name
    return max(w.stat().st_mtime_ns for w in weights)


def _built_at(model: DemoModel) -> Any:
    stamp = read_stamp(model.require_path())
    assert stamp is not None
    return stamp.built_at


def test_up_to_date_model_is_reused_not_retrained(tmp_path: Path) -> None:
    (first,) = build_demo_models(tmp_path, [_quick()])
    (second,) = build_demo_models(tmp_path, [_quick()])
    assert second.path == first.path == tmp_path / "tiny-llama"
    assert _built_at(second) == _built_at(first)
    assert _mtime(second) == _mtime(first)


def test_corrupted_weights_are_rebuilt(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    (model,) = build_demo_models(tmp_path, [_quick()])
    weights = model.require_path() / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert not is_up_to_date(_quick(), model.require_path())

    built_before = _built_at(model)
    (rebuilt,) = build_demo_models(tmp_path, [_quick()])
    assert _built_at(rebuilt) > built_before
    assert is_up_to_date(_quick(), rebuilt.require_path())
    AutoModelForCausalLM.from_pretrained(rebuilt.require_path())  # loads again


def test_half_written_directory_and_leftovers_are_rebuilt(tmp_path: Path) -> None:
    (model,) = build_demo_models(tmp_path, [_quick()])
    # An interrupted writer: files without the stamp (which is written last), and the temporary
    # directory of a build that crashed.
    (model.require_path() / STAMP_FILE).unlink()
    leftover = tmp_path / ".tiny-llama.building-crashed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")

    (rebuilt,) = build_demo_models(tmp_path, [_quick()])
    assert read_stamp(rebuilt.require_path()) is not None
    assert is_up_to_date(_quick(), rebuilt.require_path())
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "tiny-llama"
    ]


def test_unreadable_stamp_and_stray_files_are_not_trusted(tmp_path: Path) -> None:
    (model,) = build_demo_models(tmp_path, [_quick()])
    path = model.require_path()
    (path / "extra.bin").write_bytes(b"not part of the build")
    assert not is_up_to_date(_quick(), path)
    (path / "extra.bin").unlink()
    assert is_up_to_date(_quick(), path)
    (path / STAMP_FILE).write_text("{ truncated", encoding="utf-8")
    assert read_stamp(path) is None
    assert not is_up_to_date(_quick(), path)


def test_changed_recipe_makes_the_build_stale(tmp_path: Path) -> None:
    (old,) = build_demo_models(tmp_path, [_quick(steps=3)])
    old_stamp = read_stamp(old.require_path())
    assert not is_up_to_date(_quick(steps=4), old.require_path())
    (new,) = build_demo_models(tmp_path, [_quick(steps=4)])
    new_stamp = read_stamp(new.require_path())
    assert old_stamp is not None and new_stamp is not None
    assert new_stamp.fingerprint != old_stamp.fingerprint
    assert new_stamp.built_at > old_stamp.built_at


def test_force_rebuilds_an_up_to_date_model(tmp_path: Path) -> None:
    (model,) = build_demo_models(tmp_path, [_quick()])
    before = _built_at(model)
    (forced,) = build_demo_models(tmp_path, [_quick()], force=True)
    assert _built_at(forced) > before


def test_build_is_deterministic(tmp_path: Path) -> None:
    (a,) = build_demo_models(tmp_path / "a", [_quick(steps=5)])
    (b,) = build_demo_models(tmp_path / "b", [_quick(steps=5)])
    digest = [
        hashlib.sha256((m.require_path() / "model.safetensors").read_bytes()).hexdigest()
        for m in (a, b)
    ]
    assert digest[0] == digest[1]
    stamps = [read_stamp(m.require_path()) for m in (a, b)]
    assert stamps[0] is not None and stamps[1] is not None
    assert stamps[0].files == stamps[1].files


def test_unknown_model_name_fails_before_building_anything(tmp_path: Path) -> None:
    dest = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"unknown demo model 'tiny-gpt'.*tiny-llama"):
        build_demo_models(dest, ["tiny-llama", "tiny-gpt"])
    assert not dest.exists()


def test_model_name_that_is_not_a_directory_name_is_refused(tmp_path: Path) -> None:
    escaping = replace(_quick(), name="../outside")
    with pytest.raises(ValueError, match="cannot be a directory name"):
        build_demo_models(tmp_path / "cache", [escaping])
    assert not (tmp_path / "outside").exists()


def test_catalogue_entry_has_no_path_until_built() -> None:
    with pytest.raises(ValueError, match="build_demo_models"):
        demo_model("tiny-qwen3").require_path()


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODEL_SUPPORT_CACHE", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("MODEL_SUPPORT_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "model-support" / "demo-models"


def test_catalogue_covers_dense_moe_and_vision() -> None:
    by_name = {m.name: m for m in DEMO_MODELS}
    assert by_name["tiny-llama"].architecture == "LlamaForCausalLM"
    assert by_name["tiny-qwen3"].architecture == "Qwen3ForCausalLM"
    assert by_name["tiny-qwen3-moe"].architecture == "Qwen3MoeForCausalLM"
    assert by_name["tiny-llava"].task is Task.IMAGE_TEXT_TO_TEXT
    assert {m.kind for m in DEMO_MODELS} == set(ModelKind)
