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
    SEED_ATTEMPTS,
    STAMP_FILE,
    DemoModel,
    FixtureOutOfBand,
    ModelKind,
    TrainingRecipe,
    build_demo_models,
    cache_key,
    corpus_text,
    default_cache_dir,
    demo_model,
    is_up_to_date,
    read_stamp,
)
from model_support.fixture_quality import NEW_TOKENS, QualityBand, greedy, measure
from model_support.vocabulary import Task

TEXT_MODELS = [m.name for m in DEMO_MODELS if m.task is Task.TEXT_GENERATION]
FOREIGN = Path(__file__).parent / "data" / "checkpoints"
# Checkpoints other machines trained (tests/data/checkpoints/README.md): folder -> catalogue name.
FOREIGN_MODELS = {
    "tiny-qwen3-moe-amd-epyc": "tiny-qwen3-moe",
    "tiny-qwen3-moe-amd-epyc-b4": "tiny-qwen3-moe",
}


def _trained(demo_models: dict[str, DemoModel], which: str) -> DemoModel:
    """A catalogue model built here (by name) or as another machine built it (by folder)."""
    if which in FOREIGN_MODELS:
        return replace(demo_model(FOREIGN_MODELS[which]), path=FOREIGN / which)
    return demo_models[which]


@pytest.mark.parametrize("which", [*TEXT_MODELS, *FOREIGN_MODELS])
def test_text_model_reloads_and_is_inside_its_quality_band(
    demo_models: dict[str, DemoModel], which: str
) -> None:
    """Every correctly trained fixture, whichever machine trained it, is what the demo and the
    verifier's tests rely on: decided predictions, corpus-like text, Paris, and for a mixture
    of experts some nearly tied routing on the prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = _trained(demo_models, which)
    band = entry.quality
    assert band is not None, f"{entry.name} has no quality band"
    tokenizer = AutoTokenizer.from_pretrained(entry.require_path())
    model = AutoModelForCausalLM.from_pretrained(entry.require_path())
    assert type(model).__name__ == entry.architecture
    # Prompts start like training windows: with BOS.
    assert tokenizer("def fibonacci(n):")["input_ids"][0] == tokenizer.bos_token_id

    measured = measure(entry.require_path(), band, corpus_text())
    assert measured.problems(band) == [], (which, measured)
    # A random tiny model sits at 0.001-0.05 nats (docs/verification.md): trained is decided.
    assert measured.median_margin > 1.0
    if band.router_ties:  # the mixture of experts the verifier's router-flip tests aim at
        assert measured.router_tie_positions


def test_the_build_records_what_it_measured(demo_models: dict[str, DemoModel]) -> None:
    for model in demo_models.values():
        stamp = read_stamp(model.require_path())
        assert stamp is not None and stamp.seed >= 0
        if model.quality is None:
            assert stamp.quality is None
            continue
        assert stamp.quality is not None, model.name
        low, high = model.quality.median_margin
        assert low <= stamp.quality["median_margin"] <= high


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

    new, _ = greedy(model, red)
    assert len(new) == NEW_TOKENS  # fixture_quality.greedy generates exactly this many

    # The vision tower is wired in: another image changes the next-token logits.
    blue = chat(Image.new("RGB", (48, 40), (20, 40, 230)))
    with torch.no_grad():
        red_logits = model(**red).logits[0, -1]
        blue_logits = model(**blue).logits[0, -1]
    assert not torch.allclose(red_logits, blue_logits, atol=1e-4)

    # Its language part is trained on the corpus like the text models.
    text = processor.tokenizer("The capital of France is", return_tensors="pt")
    new, margins = greedy(model, dict(text))
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


def _quick(
    name: str = "tiny-llama", steps: int = 3, quality: QualityBand | None = None
) -> DemoModel:
    return replace(demo_model(name), recipe=TrainingRecipe(steps=steps), quality=quality)


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
    assert second.path == first.path == tmp_path / cache_key(_quick()) / "tiny-llama"
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
    folder = tmp_path / cache_key(_quick())
    leftover = folder / ".tiny-llama.building-crashed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")

    (rebuilt,) = build_demo_models(tmp_path, [_quick()])
    assert read_stamp(rebuilt.require_path()) is not None
    assert is_up_to_date(_quick(), rebuilt.require_path())
    assert not leftover.exists()
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == [
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


def test_another_recipe_is_another_cache_entry(tmp_path: Path) -> None:
    (old,) = build_demo_models(tmp_path, [_quick(steps=3)])
    old_stamp = read_stamp(old.require_path())
    assert not is_up_to_date(_quick(steps=4), old.require_path())
    (new,) = build_demo_models(tmp_path, [_quick(steps=4)])
    new_stamp = read_stamp(new.require_path())
    assert old_stamp is not None and new_stamp is not None
    assert new_stamp.fingerprint != old_stamp.fingerprint
    # Built into its own folder: the old recipe's model is never found for the new one, and
    # both stay usable side by side (two checkouts of different versions share one cache).
    assert new.require_path() != old.require_path()
    assert read_stamp(old.require_path()) == old_stamp
    (again,) = build_demo_models(tmp_path, [_quick(steps=3)])
    assert read_stamp(again.require_path()) == old_stamp
    # A quality band is part of the recipe too.
    banded = _quick(steps=3, quality=QualityBand(median_margin=(0.0, 1e9), knows_paris=False))
    assert cache_key(banded) != cache_key(_quick(steps=3))


def test_a_model_outside_its_band_is_trained_again_then_refused(tmp_path: Path) -> None:
    # Three steps of training cannot know Paris: every seed comes out outside this band.
    hopeless = _quick(steps=3, quality=QualityBand(median_margin=(0.0, 1e9)))
    with pytest.raises(FixtureOutOfBand) as refused:
        build_demo_models(tmp_path, [hopeless])
    message = str(refused.value)
    for seed in range(SEED_ATTEMPTS):
        assert f"seed {seed}: " in message
    assert "not 'Paris'" in message and "tiny-llama" in message
    folder = tmp_path / cache_key(hopeless)
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".lock")] == []

    # A band the first seed meets: built once, its figures in the stamp.
    easy = _quick(
        steps=3,
        quality=QualityBand(median_margin=(0.0, 1e9), corpus_trigram_share=0.0, knows_paris=False),
    )
    (built,) = build_demo_models(tmp_path, [easy])
    stamp = read_stamp(built.require_path())
    assert stamp is not None and stamp.seed == 0 and stamp.rejected_seeds == {}
    assert stamp.quality is not None and stamp.quality["corpus_trigram_share"] is not None


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


def test_build_does_not_depend_on_the_callers_thread_count(tmp_path: Path) -> None:
    # The demo runs with torch's default threads, the tests with one: both must build the
    # same model, or whichever process builds first decides what the other tests.
    import torch

    threads = torch.get_num_threads()
    digests = []
    try:
        for count, folder in ((1, "one"), (4, "four")):
            torch.set_num_threads(count)
            (model,) = build_demo_models(tmp_path / folder, [_quick("tiny-qwen3-moe", steps=30)])
            weights = model.require_path() / "model.safetensors"
            digests.append(hashlib.sha256(weights.read_bytes()).hexdigest())
            assert torch.get_num_threads() == count  # the caller's setting is given back
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1]


def test_a_task_model_builds_the_same_whatever_its_process_did_before(tmp_path: Path) -> None:
    # The demo's builder processes build several models each, in whatever order the pool
    # hands them out: training (BERT's dropout) must not depend on what ran before it.
    import torch

    digests = []
    for state, folder in ((0, "fresh"), (1234, "after-another-build")):
        torch.manual_seed(state)
        torch.rand(1000)  # what an earlier build in the same process would have drawn
        (model,) = build_demo_models(tmp_path / folder, [_quick("tiny-bert-classifier", steps=5)])
        weights = model.require_path() / "model.safetensors"
        digests.append(hashlib.sha256(weights.read_bytes()).hexdigest())
    assert digests[0] == digests[1]


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


def test_every_task_checkpoint_has_its_declared_builder() -> None:
    """A family's checkpoint (model_support/tasks.py) names its builder; each builder of
    model_support/task_fixtures.py builds some declared checkpoint."""
    from model_support import task_fixtures
    from model_support.checkpoints import TASK_MODELS
    from model_support.tasks import CHECKPOINTS

    assert [m.name for m in TASK_MODELS] == [c.name for c in CHECKPOINTS]
    assert {c.builder for c in CHECKPOINTS} == set(task_fixtures.BUILDERS)
    assert all(m.kind is ModelKind.TASK and m.builder for m in TASK_MODELS)
