"""Tiny local checkpoints for the demo and the tests.

Every model here is built on this machine from a config, briefly trained on the bundled corpus
(``model_support/data/corpus.txt``) so that its predictions are decisive, and saved with
``save_pretrained`` (safetensors) next to its tokenizer or processor. Whatever loads them uses the
real ``from_pretrained`` path, exactly as for a Hub model.

Building is cached and keyed by the recipe: a model lives in ``<cache>/<key>/<name>``, where the
key is a fingerprint of everything that decides its contents (builder version, config, training
recipe and quality band, corpus, library versions), so a checkpoint built by another version of
this code is never found, let alone reused, and versions built side by side (two checkouts)
coexist. Each directory carries a stamp with that fingerprint and a SHA-256 of every file; an
up-to-date directory is reused, a corrupted or half-written one is rebuilt in a temporary
directory that then replaces it by rename. A file lock per model lets several processes
(pytest-xdist workers, the demo) share one cache.

Training is deterministic on one machine, not across machines (model_support.fixture_quality):
right after training, a model with a quality band is measured against it, and trained again
with the next seed when it falls outside; the stamp records the seed and the figures.

``transformers`` is imported only when something has to be built (importing it costs seconds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, ValidationError

from model_support.fixture_quality import (
    DECIDED,
    DECISIVE_MOE,
    DECISIVE_TEXT,
    DECISIVE_VISION_TEXT,
    UNDECIDED_TEXT,
    QualityBand,
    measure,
)
from model_support.fixture_training import (
    INIT_RANGE,
    TOKENIZER_MAX_LENGTH,
    TOKENIZER_VOCAB_SIZE,
    TrainingRecipe,
    token_stream,
    train,
    train_tokenizer,
)
from model_support.tasks import CHECKPOINTS, TASK_SPECS, DemoCheckpoint, Task

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Bump whenever the build or training code changes what ends up on disk: it is part of the
# fingerprint (the cache key), so every model is built once more, into a new folder.
BUILDER_VERSION = 4
SEED_ATTEMPTS = 3
"""Seeds tried (the recipe's, then the next ones) before a model out of its band is an error."""

CACHE_ENV = "MODEL_SUPPORT_CACHE"
_DIRECTORY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
STAMP_FILE = "demo-model-stamp.json"

IMAGE_TOKEN = "<image>"

# Llava-1.5 style prompt; the processor expands each <image> into one token per image patch.
LLAVA_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- message['role'] | upper + ': ' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<image>\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)

# Shapes shared by every text stack: hidden 64, 2 layers, built and run in seconds.
_TEXT_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": TOKENIZER_MAX_LENGTH,
    "vocab_size": TOKENIZER_VOCAB_SIZE,
    "initializer_range": INIT_RANGE,
    "tie_word_embeddings": False,
}
_VISION_IMAGE_SIZE = 32
LOW_MARGIN_STEPS = 150
_VISION_PATCH_SIZE = 8


class ModelKind(StrEnum):
    """What sort of model a demo model stands in for."""

    DENSE = "dense"
    MOE = "moe"
    VISION = "vision"
    TASK = "task"
    """A task family's checkpoint (model_support.tasks), built by model_support.task_fixtures."""


@dataclass(frozen=True)
class DemoModel:
    """One tiny demo checkpoint: what it is, and where it lies once built.

    ``path`` is None in the catalogue and set on what ``build_demo_models`` returns.
    """

    name: str
    task: Task
    kind: ModelKind
    architecture: str
    description: str
    config_class: str = field(repr=False)
    config: Mapping[str, Any] = field(repr=False, compare=False)
    recipe: TrainingRecipe = field(default_factory=TrainingRecipe, repr=False)
    quality: QualityBand | None = field(default=None, repr=False)
    """What the trained model must be (checked after training); None: not checked."""
    builder: str | None = field(default=None, repr=False)
    """A task family's checkpoint: the function of model_support.task_fixtures that builds it."""
    libraries: tuple[str, ...] = field(default=(), repr=False)
    """Libraries beyond transformers whose behaviour decides the built bytes (its loader's)."""
    path: Path | None = None

    def require_path(self) -> Path:
        """Return the built checkpoint's directory, or raise if this entry was never built."""
        if self.path is None:
            raise ValueError(
                f"demo model {self.name!r} has no path: it is a catalogue entry; "
                "call build_demo_models(dest, [name]) to build it and use the returned entry"
            )
        return self.path


class BuildStamp(BaseModel):
    """What a built model directory records about itself (written last, read to reuse it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fingerprint: str
    builder_version: int
    built_at: datetime
    build_seconds: float
    initial_loss: float
    final_loss: float
    seed: int
    quality: dict[str, Any] | None
    rejected_seeds: dict[str, list[str]]  # seed -> why it came out outside the band
    versions: dict[str, str]
    files: dict[str, str]  # relative path -> sha256 of every other file in the directory


def task_model(checkpoint: DemoCheckpoint) -> DemoModel:
    """The catalogue entry of a task family's checkpoint (declared in model_support.tasks)."""
    spec = TASK_SPECS[checkpoint.task]
    library = spec.loader.library
    return DemoModel(
        name=checkpoint.name,
        task=checkpoint.task,
        kind=ModelKind.TASK,
        architecture=checkpoint.architecture,
        description=checkpoint.description,
        config_class=checkpoint.config_class,
        config=checkpoint.config,
        recipe=checkpoint.recipe,
        builder=checkpoint.builder,
        libraries=() if library == "transformers" else (library,),
    )


# One tiny model per task family beyond text generation (each declared in model_support.tasks),
# built and trained by model_support.task_fixtures (seconds each); part of the demo.
TASK_MODELS: tuple[DemoModel, ...] = tuple(task_model(c) for c in CHECKPOINTS)


DEMO_MODELS: tuple[DemoModel, ...] = (
    DemoModel(
        name="tiny-llama",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.DENSE,
        architecture="LlamaForCausalLM",
        description="Dense Llama decoder, hidden 64, 2 layers, byte-level BPE vocab 1000.",
        config_class="LlamaConfig",
        config=dict(_TEXT_SHAPE),
        quality=DECISIVE_TEXT,
    ),
    DemoModel(
        name="tiny-qwen3",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.DENSE,
        architecture="Qwen3ForCausalLM",
        description="Dense Qwen3 decoder (q/k norms), hidden 64, 2 layers.",
        config_class="Qwen3Config",
        config={**_TEXT_SHAPE, "head_dim": 16},
        quality=DECISIVE_TEXT,
    ),
    DemoModel(
        name="tiny-qwen3-moe",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.MOE,
        architecture="Qwen3MoeForCausalLM",
        description="Qwen3 mixture of experts: 4 experts, top-2, every layer sparse.",
        config_class="Qwen3MoeConfig",
        config={
            **_TEXT_SHAPE,
            "head_dim": 16,
            "moe_intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        quality=DECISIVE_MOE,
    ),
    DemoModel(
        name="tiny-mixtral",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.MOE,
        architecture="MixtralForCausalLM",
        description="Mixtral mixture of experts: 4 experts, top-2.",
        config_class="MixtralConfig",
        config={
            **_TEXT_SHAPE,
            "intermediate_size": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        quality=DECISIVE_TEXT,  # no test aims router flips at it
    ),
    DemoModel(
        name="tiny-llava",
        task=Task.IMAGE_TEXT_TO_TEXT,
        kind=ModelKind.VISION,
        architecture="LlavaForConditionalGeneration",
        description=(
            "Llava: CLIP vision tower (32x32 images, 8x8 patches) + projector + tiny Llama; "
            "the language part is trained on the corpus, the vision part stays random."
        ),
        config_class="LlavaConfig",
        config={
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": _VISION_IMAGE_SIZE,
                "patch_size": _VISION_PATCH_SIZE,
                "projection_dim": 32,
                "initializer_range": INIT_RANGE,
            },
            # One more token than the BPE vocabulary: the <image> placeholder is added on top.
            "text_config": {
                **_TEXT_SHAPE,
                "model_type": "llama",
                "vocab_size": TOKENIZER_VOCAB_SIZE + 1,
            },
            "image_token_index": TOKENIZER_VOCAB_SIZE,
            "image_seq_length": (_VISION_IMAGE_SIZE // _VISION_PATCH_SIZE) ** 2,
            "vision_feature_select_strategy": "default",
            "vision_feature_layer": -2,
        },
        quality=DECISIVE_VISION_TEXT,
    ),
    *TASK_MODELS,
)


# Fixtures of the verdict's fault-injection suite (tests/runner/test_fault_injection.py): more
# architectures, and a model whose predictions are not decisive. Built into the same cache as
# the demo models, by name, but not part of the demo.
VERIFICATION_MODELS: tuple[DemoModel, ...] = (
    DemoModel(
        name="tiny-gemma2-softcap",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.DENSE,
        architecture="Gemma2ForCausalLM",
        description=(
            "Gemma2 decoder: final-logit and attention-logit softcapping, a sliding-window "
            "(16 tokens) layer then a global one, hidden 64, 2 layers."
        ),
        config_class="Gemma2Config",
        config={
            **_TEXT_SHAPE,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 16,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
        },
        quality=DECIDED,
    ),
    DemoModel(
        name="tiny-phi3-partial-rotary",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.DENSE,
        architecture="Phi3ForCausalLM",
        description="Phi3 decoder: fused qkv and gate/up projections, rotary on half of each head.",
        config_class="Phi3Config",
        config={**_TEXT_SHAPE, "partial_rotary_factor": 0.5},
        quality=DECIDED,
    ),
    DemoModel(
        name="tiny-llama-low-margin",
        task=Task.TEXT_GENERATION,
        kind=ModelKind.DENSE,
        architecture="LlamaForCausalLM",
        description=(
            "The tiny Llama trained far less: median top-1/top-2 margin about 0.5 nats on the "
            "default prompts, as undecided as a real model, so token flips are cheap."
        ),
        config_class="LlamaConfig",
        config=dict(_TEXT_SHAPE),
        recipe=TrainingRecipe(steps=LOW_MARGIN_STEPS, learning_rate=2e-3),
        quality=UNDECIDED_TEXT,
    ),
)


def demo_model(name: str) -> DemoModel:
    """Return the catalogue entry called ``name`` (not built; see ``build_demo_models``).

    Both catalogues are searched: the demo's and the verification fixtures'.
    """
    for model in (*DEMO_MODELS, *VERIFICATION_MODELS):
        if model.name == name:
            return model
    known = ", ".join(m.name for m in (*DEMO_MODELS, *VERIFICATION_MODELS))
    raise ValueError(f"unknown demo model {name!r}; known demo models: {known}")


def default_cache_dir() -> Path:
    """Where demo models are cached: ``$MODEL_SUPPORT_CACHE`` if set, else ~/.cache/model-support/demo-models."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "model-support" / "demo-models"


def corpus_text() -> str:
    """Return the bundled training corpus (plain text: Python source and English prose)."""
    return resources.files("model_support").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def library_versions(libraries: Iterable[str] = ()) -> dict[str, str]:
    """Versions of the libraries whose behaviour decides a built checkpoint's bytes: the
    common ones and ``libraries`` (a task checkpoint's loader, such as diffusers)."""
    packages = ["torch", "transformers", "tokenizers", "safetensors", *libraries]
    return {pkg: metadata.version(pkg) for pkg in packages}


def fingerprint(model: DemoModel, corpus: str) -> str:
    """Hash of everything that decides what ``model``'s directory holds once built."""
    payload = {
        "builder_version": BUILDER_VERSION,
        "name": model.name,
        "architecture": model.architecture,
        "config_class": model.config_class,
        "config": model.config,
        "recipe": asdict(model.recipe),
        "quality": asdict(model.quality) if model.quality is not None else None,
        "tokenizer_vocab_size": TOKENIZER_VOCAB_SIZE,
        "chat_template": LLAVA_CHAT_TEMPLATE if model.kind is ModelKind.VISION else None,
        "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest(),
        "versions": library_versions(model.libraries),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def read_stamp(model_dir: Path) -> BuildStamp | None:
    """Return the stamp of a built model directory, or None if it has none or an unreadable one."""
    try:
        raw = (model_dir / STAMP_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return BuildStamp.model_validate_json(raw)
    except ValidationError:
        # A truncated or foreign stamp means the directory cannot be trusted: treat as unbuilt.
        return None


def is_up_to_date(model: DemoModel, model_dir: Path, corpus: str | None = None) -> bool:
    """True if ``model_dir`` holds a complete build of ``model`` matching the current fingerprint."""
    stamp = read_stamp(model_dir)
    if stamp is None:
        return False
    if stamp.fingerprint != fingerprint(model, corpus_text() if corpus is None else corpus):
        return False
    present = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    if present != set(stamp.files) | {STAMP_FILE}:
        return False
    return all(_sha256(model_dir / rel) == digest for rel, digest in stamp.files.items())


def cache_key(model: DemoModel, corpus: str | None = None) -> str:
    """The folder of ``model``'s recipe in the cache: a prefix of its fingerprint."""
    return fingerprint(model, corpus_text() if corpus is None else corpus)[:16]


def checkpoint_dir(dest: Path, model: DemoModel, corpus: str | None = None) -> Path:
    """Where ``build_demo_models(dest, [model])`` keeps ``model``: ``dest/<key>/<name>``."""
    return Path(dest) / cache_key(model, corpus) / model.name


def build_demo_models(
    dest: Path, names: Iterable[str | DemoModel] | None = None, *, force: bool = False
) -> list[DemoModel]:
    """Build (or reuse) demo models under ``dest/<key>/<name>``; return them with ``path`` set.

    ``names`` are catalogue names or ``DemoModel`` entries (for example a catalogue entry with a
    shorter training recipe); by default the whole catalogue, returned in catalogue order. The
    key is the recipe's (:func:`cache_key`). An existing directory is reused when its stamp
    matches the fingerprint and every file's hash; otherwise (or with ``force``) the model is
    rebuilt in a temporary directory that then replaces it, so a reader never sees a
    half-written model. A model whose quality band no seed meets raises FixtureOutOfBand.
    """
    wanted: list[str | DemoModel] = list(DEMO_MODELS) if names is None else list(names)
    # Resolve every name before doing any work, so a typo fails fast and builds nothing.
    selected = [item if isinstance(item, DemoModel) else demo_model(item) for item in wanted]
    for model in selected:
        if not _DIRECTORY_NAME.fullmatch(model.name):
            raise ValueError(
                f"demo model name {model.name!r} cannot be a directory name: use lower-case "
                "letters, digits, '.', '_' and '-', starting with a letter or digit"
            )
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    corpus = corpus_text()
    result = []
    for model in selected:
        target = checkpoint_dir(dest, model, corpus)
        folder = target.parent
        folder.mkdir(exist_ok=True)
        # One lock per model: pytest-xdist workers and the demo may build into one cache at once.
        with FileLock(str(folder / f".{model.name}.lock")):
            _remove_leftovers(folder, model.name)
            if force or not is_up_to_date(model, target, corpus):
                _build_and_swap(model, folder, target, corpus)
        result.append(replace(model, path=target))
    return result


class FixtureOutOfBand(RuntimeError):
    """A demo model came out outside its quality band with every seed tried."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _remove_leftovers(dest: Path, name: str) -> None:
    """Delete temporary directories of an earlier build of ``name`` that was interrupted."""
    for leftover in dest.glob(f".{name}.building-*"):
        shutil.rmtree(leftover)
    for leftover in dest.glob(f".{name}.stale-*"):
        shutil.rmtree(leftover)


def _build_and_swap(model: DemoModel, dest: Path, target: Path, corpus: str) -> None:
    """Build into a temporary sibling directory, then move it into place by rename."""
    building = Path(tempfile.mkdtemp(prefix=f".{model.name}.building-", dir=dest))
    try:
        _build(model, building, corpus)
        building.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
        if target.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            stale = dest / f".{model.name}.stale-{uuid.uuid4().hex}"
            target.rename(stale)
            building.rename(target)
            shutil.rmtree(stale)
        else:
            building.rename(target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Train on one intra-op thread, whatever the environment asks for.

    A matmul's reduction order depends on how many threads split it: the same recipe trained
    with OMP_NUM_THREADS=1 (the tests) and with torch's default (the demo) gave different
    weights on one machine, and whichever process built first decided the cached model.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's global RNG seeded for one build, and restored after it.

    Training draws dropout masks from the global RNG: a builder process that had built
    another model first (the demo builds two at a time in a pool of processes) trained the
    same recipe to different weights."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _build(model: DemoModel, out: Path, corpus: str) -> None:
    """Build, train and save ``model`` into the empty directory ``out``, stamp last.

    A model with a quality band is measured right after training; outside the band, it is
    trained again from scratch with the next seed (SEED_ATTEMPTS in all).
    """
    started = time.perf_counter()
    rejected: dict[str, list[str]] = {}
    quality: dict[str, Any] | None = None
    for seed in range(model.recipe.seed, model.recipe.seed + SEED_ATTEMPTS):
        seeded = replace(model, recipe=replace(model.recipe, seed=seed))
        with _one_thread(), _seeded(seed):
            if model.builder is not None:
                from model_support import task_fixtures

                initial_loss, final_loss = task_fixtures.build(seeded, out, corpus)
            else:
                initial_loss, final_loss = _build_language_model(seeded, out, corpus)
        if model.quality is None:
            break
        measured = measure(out, model.quality, corpus, vision=model.kind is ModelKind.VISION)
        problems = measured.problems(model.quality)
        if not problems:
            quality = asdict(measured)
            break
        rejected[str(seed)] = problems
        shutil.rmtree(out)
        out.mkdir()
    else:
        tried = "; ".join(f"seed {seed}: {', '.join(why)}" for seed, why in rejected.items())
        raise FixtureOutOfBand(
            f"demo model {model.name!r} came out outside its quality band with every seed "
            f"tried ({tried}); the training recipe or the band in model_support/checkpoints.py "
            "needs a look (model_support/fixture_quality.py says what each figure means)"
        )
    files = {
        p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()
    }
    stamp = BuildStamp(
        name=model.name,
        fingerprint=fingerprint(model, corpus),
        builder_version=BUILDER_VERSION,
        built_at=datetime.now(UTC),
        build_seconds=round(time.perf_counter() - started, 3),
        initial_loss=initial_loss,
        final_loss=final_loss,
        seed=seed,
        quality=quality,
        rejected_seeds=rejected,
        versions=library_versions(model.libraries),
        files=files,
    )
    (out / STAMP_FILE).write_text(stamp.model_dump_json(indent=2), encoding="utf-8")


def _build_language_model(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """Build, train and save a causal LM (or Llava) with its tokenizer (or processor)."""
    import torch
    import transformers

    vision = model.kind is ModelKind.VISION
    tokenizer = train_tokenizer(
        corpus,
        image_token=IMAGE_TOKEN if vision else None,
        chat_template=LLAVA_CHAT_TEMPLATE if vision else None,
    )
    config_kwargs = json.loads(json.dumps(model.config))  # deep copy: configs mutate nested dicts
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if model.kind is ModelKind.VISION:
        config_kwargs["text_config"].update(special)
    config = getattr(transformers, model.config_class)(**config_kwargs, **special)
    config.architectures = [model.architecture]

    stream = token_stream(tokenizer, corpus)
    # A private RNG state: the build is deterministic and leaves the caller's seed untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model.recipe.seed)
        network = getattr(transformers, model.architecture)(config)
        initial_loss, final_loss = _train_language_model(
            network, stream, tokenizer.bos_token_id, model.recipe
        )

    network.save_pretrained(out, safe_serialization=True)
    if model.kind is ModelKind.VISION:
        _llava_processor(tokenizer).save_pretrained(out)
    else:
        tokenizer.save_pretrained(out)
    return initial_loss, final_loss


def _train_language_model(
    network: PreTrainedModel, stream: torch.Tensor, bos_id: int, recipe: TrainingRecipe
) -> tuple[float, float]:
    """Train on random windows of ``stream``; return the first and the last loss (mean of 10 steps).

    Each window is BOS followed by text from a random offset, which is exactly what a tokenized
    prompt looks like; the model never sees BOS or EOS mid-text, so it does not learn to emit them
    and its greedy continuations stay plain corpus-like text.
    """
    import torch

    span = recipe.sequence_length - 1
    offsets_limit = stream.numel() - span
    if offsets_limit <= 0:
        raise ValueError(f"the corpus has {stream.numel()} tokens, fewer than one window of {span}")
    bos = torch.full((recipe.batch_size, 1), bos_id, dtype=torch.long)

    def loss_of(generator: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, offsets_limit, (recipe.batch_size,), generator=generator)
        batch = torch.cat(
            [bos, torch.stack([stream[s : s + span] for s in starts.tolist()])], dim=1
        )
        return network(input_ids=batch, labels=batch).loss

    return train(network, recipe, loss_of)


def _llava_processor(tokenizer: PreTrainedTokenizerFast) -> Any:
    """A LlavaProcessor around ``tokenizer`` with a CLIP image processor for 32x32 images."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    # The PIL backend needs no torchvision (not installed here); both backends load it back.
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": _VISION_IMAGE_SIZE},
        crop_size={"height": _VISION_IMAGE_SIZE, "width": _VISION_IMAGE_SIZE},
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=_VISION_PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
    )


# ---------------------------------------------------------------------------------------------
# Header-only checkpoints: a real model's shape without its weights (enough to size, not to load)

LLAMA_3_1_405B_CONFIG: Mapping[str, Any] = {
    # The published meta-llama/Llama-3.1-405B config.json, as far as sizing reads it.
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
OVERSIZED_DEMO_NAME = "llama-405b-headers"
"""The demo's model too large to test: Llama-3.1-405B's shape, safetensors headers only."""


def llama_tensors(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight of a Llama-architecture checkpoint with ``config``."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def build_header_only_checkpoint(
    dest: Path, name: str, config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> Path:
    """``dest/name`` holding ``config.json`` and a ``model.safetensors`` that is only a header.

    The header lists every tensor (BF16, ``shapes``) with offsets into data that is not there:
    sizing reads headers only, so it sizes the model as if the weights were present, while
    loading it fails. Rewritten only when its contents differ (each file replaced atomically).
    """
    if not _DIRECTORY_NAME.fullmatch(name):
        raise ValueError(f"checkpoint name {name!r} cannot be a directory name")
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "content": "header only"}}
    offset = 0
    for tensor, shape in shapes.items():
        size = math.prod(shape) * 2  # BF16
        header[tensor] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    files = {
        "config.json": json.dumps(dict(config), indent=2, sort_keys=True).encode(),
        "model.safetensors": len(raw).to_bytes(8, "little") + raw,
    }
    target = Path(dest) / name
    target.mkdir(parents=True, exist_ok=True)
    for file_name, data in files.items():
        path = target / file_name
        if path.is_file() and path.read_bytes() == data:
            continue
        temp = target / f".{file_name}.{uuid.uuid4().hex}.tmp"
        temp.write_bytes(data)
        os.replace(temp, path)
    return target
