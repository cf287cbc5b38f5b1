"""Builders of the tiny checkpoints for the tasks beyond text generation.

Each builder makes a model from a config, trains it briefly on a task built from the bundled
corpus (or drawn images, or tone-spelled text) so that its outputs are decisive, and saves it
the way its library loads it (``save_pretrained``, a sentence-transformers folder, a diffusers
pipeline folder). :mod:`model_support.checkpoints` calls :func:`build` for these kinds and
stamps and caches the result like every demo model.

The inputs the tests feed these models are drawn by run.py itself (test images, spoken
waveforms), so the builders train on the same drawings (:mod:`model_support.drawn_inputs`, a
copy of run.py's functions held to their source by a test).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_support.drawn_inputs import TONE_ALPHABET, draw_pattern, spoken_waveform
from model_support.fixture_training import (
    pad,
    random_span,
    token_stream,
    train,
    train_tokenizer,
    with_seed,
)

if TYPE_CHECKING:
    import torch

    from model_support.checkpoints import DemoModel

# Image classes of the tiny ViT, in label order: the patterns run.py's test images are drawn with.
PATTERN_LABELS: tuple[str, ...] = ("horizontal", "vertical", "checkerboard", "diagonal")
# Text classes of the tiny BERT classifier: what a paragraph of the corpus is.
TEXT_LABELS: tuple[str, ...] = ("function", "code", "prose")
IMAGE_SIZE = 32
PATCH_SIZE = 8
SPEECH_CHUNK_SECONDS = 2  # the tiny Whisper hears 2 s windows (200 frames), not Whisper's 30 s
SPEECH_MEL_BINS = 80
SPEECH_TEXT_CHARS = 40  # characters spelled per training example (1.6 s of tones)
SPEECH_CONTINUATION_TOKENS = 16  # tokens the target continues past what is spelled
TEXT_MAX_LENGTH = 16  # the tiny text-to-image pipeline's prompt length (tokens)


Builder = Callable[["DemoModel", Path, str], tuple[float, float]]
BUILDERS: dict[str, Builder] = {}
"""The builders, by the name a checkpoint's declaration gives (``DemoCheckpoint.builder``)."""


def builder(function: Builder) -> Builder:
    """Register ``function`` as the builder of the checkpoints that name it."""
    BUILDERS[function.__name__] = function
    return function


def build(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """Build, train and save a task family's ``model`` into ``out`` with the builder its
    declaration names (``DemoCheckpoint.builder``); the first and the last loss."""
    builder = BUILDERS.get(model.builder or "")
    if builder is None:
        raise ValueError(
            f"{model.name}: no builder {model.builder!r} in model_support/task_fixtures.py "
            f"(builders: {', '.join(sorted(BUILDERS))})"
        )
    return builder(model, out, corpus)


# --------------------------------------------------------------------------- shared parts


def paragraphs(corpus: str) -> list[str]:
    """The corpus's blank-line separated paragraphs with at least 40 characters."""
    return [p.strip("\n") for p in re.split(r"\n\s*\n", corpus) if len(p.strip()) >= 40]


def paragraph_label(paragraph: str) -> int:
    """Index in TEXT_LABELS: a Python function, other code, or English prose."""
    code = any(
        line.startswith(("    ", "def ", "class ", "import ", "from ", "@", "print("))
        or re.search(r"[=(\[{]", line)
        for line in paragraph.splitlines()
    )
    if not code:
        return TEXT_LABELS.index("prose")
    return TEXT_LABELS.index("function" if "def " in paragraph else "code")


# --------------------------------------------------------------------------- sentence embeddings


@builder
def sentence_embeddings(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny BERT trained contrastively (two spans of one paragraph are a pair, the rest of the
    batch are negatives), saved as a sentence-transformers model with mean pooling."""
    import tempfile

    import torch
    import torch.nn.functional as F
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer

    tokenizer = train_tokenizer(corpus)
    config = transformers.BertConfig(**model.config, pad_token_id=tokenizer.pad_token_id)
    network = with_seed(model.recipe.seed, lambda: transformers.BertModel(config))
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in paragraphs(corpus)]
    bos, pad_id = tokenizer.bos_token_id, tokenizer.pad_token_id
    batch = model.recipe.batch_size

    def embed(rows: list[list[int]]) -> torch.Tensor:
        ids, mask = pad([[bos, *row] for row in rows], pad_id)
        hidden = network(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # mean pooling
        return F.normalize(pooled, dim=-1)

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randperm(len(encoded), generator=generator)[:batch].tolist()
        anchors = [
            random_span(encoded[i], 6, model.recipe.sequence_length, generator) for i in chosen
        ]
        positives = [
            random_span(encoded[i], 6, model.recipe.sequence_length, generator) for i in chosen
        ]
        scores = embed(anchors) @ embed(positives).T * 20.0
        target = torch.arange(len(chosen))
        return (F.cross_entropy(scores, target) + F.cross_entropy(scores.T, target)) / 2

    losses = train(network, model.recipe, loss_of)
    with tempfile.TemporaryDirectory() as plain:
        network.save_pretrained(plain, safe_serialization=True)
        tokenizer.save_pretrained(plain)
        transformer = Transformer(plain, max_seq_length=model.recipe.sequence_length)
        pooling = Pooling(config.hidden_size, pooling_mode="mean")
        SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return losses


# --------------------------------------------------------------------------- classification


@builder
def text_classifier(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny BERT sequence classifier: is a span of the corpus a function, other code or prose."""
    import torch
    import torch.nn.functional as F
    import transformers

    tokenizer = train_tokenizer(corpus)
    labels = dict(enumerate(TEXT_LABELS))
    heads: dict[str, Any] = {
        "num_labels": len(labels),
        "id2label": labels,
        "label2id": {v: k for k, v in labels.items()},
    }
    config = transformers.BertConfig(**model.config, **heads, pad_token_id=tokenizer.pad_token_id)
    config.architectures = [model.architecture]
    network = with_seed(
        model.recipe.seed, lambda: transformers.BertForSequenceClassification(config)
    )
    texts = paragraphs(corpus)
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in texts]
    targets = [paragraph_label(p) for p in texts]
    bos, pad_id = tokenizer.bos_token_id, tokenizer.pad_token_id

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randint(0, len(encoded), (model.recipe.batch_size,), generator=generator)
        rows = [
            [bos, *random_span(encoded[i], 4, model.recipe.sequence_length, generator)]
            for i in chosen.tolist()
        ]
        ids, mask = pad(rows, pad_id)
        logits = network(input_ids=ids, attention_mask=mask).logits
        return F.cross_entropy(logits, torch.tensor([targets[i] for i in chosen.tolist()]))

    losses = train(network, model.recipe, loss_of)
    network.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return losses


# Token labels of the tiny BERT token classifier: what the word a token belongs to is.
TOKEN_LABELS: tuple[str, ...] = ("O", "NAME", "NUMBER", "KEYWORD")
_WORD = re.compile(r"\w+")


def word_labels(paragraph: str) -> list[tuple[int, int, int]]:
    """(start, end, index in TOKEN_LABELS) of every word of ``paragraph``: a Python keyword, a
    number, a name (a capitalised word that does not start a sentence), or O. A name needs its
    context: the same word starting a sentence is O."""
    labelled = []
    for word in _WORD.finditer(paragraph):
        text, before = word.group(), paragraph[: word.start()].rstrip(" \t")
        if text in keyword.kwlist:
            label = "KEYWORD"
        elif text.isdigit():
            label = "NUMBER"
        elif text[0].isupper() and before and before[-1] not in ".!?:\n":
            label = "NAME"
        else:
            label = "O"
        labelled.append((word.start(), word.end(), TOKEN_LABELS.index(label)))
    return labelled


def token_labels(paragraph: str, tokenizer: Any) -> tuple[list[int], list[int]]:
    """The paragraph's token ids and each token's label: that of the word its first non-space
    character belongs to (O for spaces and punctuation)."""
    encoded = tokenizer(paragraph, add_special_tokens=False, return_offsets_mapping=True)
    words = word_labels(paragraph)
    labels = []
    for start, end in encoded["offset_mapping"]:
        piece = paragraph[start:end]
        first = start + len(piece) - len(piece.lstrip())
        inside = first < end  # a token of spaces only belongs to no word
        labels.append(next((lab for a, b, lab in words if inside and a <= first < b), 0))
    return list(encoded["input_ids"]), labels


@builder
def token_classifier(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny BERT token classifier: each token of a span of the corpus is part of a name, a
    number, a Python keyword, or O (:func:`word_labels`); the BOS token is not labelled."""
    import torch
    import torch.nn.functional as F
    import transformers

    tokenizer = train_tokenizer(corpus)
    labels = dict(enumerate(TOKEN_LABELS))
    heads: dict[str, Any] = {
        "num_labels": len(labels),
        "id2label": labels,
        "label2id": {v: k for k, v in labels.items()},
    }
    config = transformers.BertConfig(**model.config, **heads, pad_token_id=tokenizer.pad_token_id)
    config.architectures = [model.architecture]
    network = with_seed(model.recipe.seed, lambda: transformers.BertForTokenClassification(config))
    encoded = [token_labels(p, tokenizer) for p in paragraphs(corpus)]
    bos, pad_id = tokenizer.bos_token_id, tokenizer.pad_token_id
    ignored = -100  # cross_entropy's ignore_index: the BOS token and padding

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randint(0, len(encoded), (model.recipe.batch_size,), generator=generator)
        rows, targets = [], []
        for i in chosen.tolist():
            ids, tags = encoded[i]
            span = random_span(list(range(len(ids))), 4, model.recipe.sequence_length, generator)
            rows.append([bos, *(ids[k] for k in span)])
            targets.append([ignored, *(tags[k] for k in span)])
        ids, mask = pad(rows, pad_id)
        target, _ = pad(targets, ignored)
        logits = network(input_ids=ids, attention_mask=mask).logits
        return F.cross_entropy(logits.reshape(-1, len(labels)), target.reshape(-1))

    losses = train(network, model.recipe, loss_of)
    network.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return losses


def pattern_image(kind: int, generator: Any) -> Any:
    """A random training image of pattern ``PATTERN_LABELS[kind]``: period, phase, colours."""
    import torch

    def colour() -> tuple[int, ...]:
        return tuple(int(c) for c in torch.randint(0, 256, (3,), generator=generator))

    first = colour()
    second = colour()
    while sum(abs(a - b) for a, b in zip(first, second, strict=True)) < 150:
        second = colour()
    period = int(torch.randint(14, 65, (1,), generator=generator))
    phase = int(torch.randint(0, period, (1,), generator=generator))
    return draw_pattern(PATTERN_LABELS[kind], period, first, second, phase=phase)


@builder
def image_classifier(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny ViT trained to tell run.py's test patterns apart (stripes, checkerboard, diagonal)."""
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    # The PIL backend needs no torchvision; AutoImageProcessor loads it back with either.
    processor = ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    labels = dict(enumerate(PATTERN_LABELS))
    heads: dict[str, Any] = {
        "num_labels": len(labels),
        "id2label": labels,
        "label2id": {v: k for k, v in labels.items()},
    }
    config = transformers.ViTConfig(
        **model.config, **heads, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE
    )
    config.architectures = [model.architecture]
    network = with_seed(model.recipe.seed, lambda: transformers.ViTForImageClassification(config))
    generator = torch.Generator().manual_seed(model.recipe.seed)
    pool = 64 * model.recipe.batch_size  # drawn once, then sampled from
    kinds = torch.randint(0, len(labels), (pool,), generator=generator)
    images = [pattern_image(int(k), generator) for k in kinds]
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randint(0, pool, (model.recipe.batch_size,), generator=generator)
        return F.cross_entropy(network(pixel_values=pixels[chosen]).logits, kinds[chosen])

    losses = train(network, model.recipe, loss_of)
    network.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return losses


# --------------------------------------------------------------------------- sequence to sequence


@builder
def seq2seq(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny encoder-decoder that repeats the text it reads and continues it (the decoder
    sees the repeated text as its own context, which makes the continuation quick to learn)."""
    import torch
    import transformers

    tokenizer = train_tokenizer(corpus)
    config = getattr(transformers, model.config_class)(
        **model.config,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    config.architectures = [model.architecture]
    network = with_seed(
        model.recipe.seed, lambda: getattr(transformers, model.architecture)(config)
    )
    stream = token_stream(tokenizer, corpus)
    bos, pad_id = tokenizer.bos_token_id, tokenizer.pad_token_id
    target_length = model.recipe.sequence_length // 2

    def loss_of(generator: Any) -> torch.Tensor:
        rows, targets = [], []
        for _ in range(model.recipe.batch_size):
            context = int(torch.randint(4, target_length // 2 + 1, (1,), generator=generator))
            start = int(torch.randint(0, stream.numel() - target_length, (1,), generator=generator))
            rows.append([bos, *stream[start : start + context].tolist()])
            targets.append(stream[start : start + target_length])
        ids, mask = pad(rows, pad_id)
        return network(input_ids=ids, attention_mask=mask, labels=torch.stack(targets)).loss

    losses = train(network, model.recipe, loss_of)
    network.generation_config.pad_token_id = tokenizer.pad_token_id
    network.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return losses


@builder
def speech(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny Whisper that transcribes run.py's tone-spelled text and then continues it.

    Each example spells SPEECH_TEXT_CHARS characters of the (lower-cased) corpus as tones
    (run.py's spoken_waveform); the target is their tokens followed by the next
    SPEECH_CONTINUATION_TOKENS tokens of the corpus, so 32 greedy tokens stay decisive.
    """
    import torch
    import transformers

    tokenizer = train_tokenizer(corpus)
    extractor = transformers.WhisperFeatureExtractor(
        feature_size=SPEECH_MEL_BINS, sampling_rate=16000, chunk_length=SPEECH_CHUNK_SECONDS
    )
    config = transformers.WhisperConfig(
        **model.config,
        num_mel_bins=SPEECH_MEL_BINS,
        max_source_positions=extractor.nb_max_frames // 2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        suppress_tokens=[],
        begin_suppress_tokens=[],
    )
    config.architectures = [model.architecture]
    network = with_seed(
        model.recipe.seed, lambda: transformers.WhisperForConditionalGeneration(config)
    )
    text = "".join(c for c in corpus.lower() if c in TONE_ALPHABET)
    generator = torch.Generator().manual_seed(model.recipe.seed)
    pool = 8 * model.recipe.batch_size
    features, targets = [], []
    for _ in range(pool):
        start = int(torch.randint(0, len(text) - 4 * SPEECH_TEXT_CHARS, (1,), generator=generator))
        spoken = text[start : start + SPEECH_TEXT_CHARS]
        wave = spoken_waveform(spoken, extractor.sampling_rate)
        features.append(
            extractor(wave, sampling_rate=extractor.sampling_rate, return_tensors="pt")[
                "input_features"
            ][0]
        )
        said = tokenizer(spoken, add_special_tokens=False)["input_ids"]
        after = tokenizer(
            text[start + SPEECH_TEXT_CHARS : start + 3 * SPEECH_TEXT_CHARS],
            add_special_tokens=False,
        )["input_ids"]
        targets.append([*said, *after[:SPEECH_CONTINUATION_TOKENS]])
    inputs = torch.stack(features)

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randint(0, pool, (model.recipe.batch_size,), generator=generator).tolist()
        labels, mask = pad([targets[i] for i in chosen], tokenizer.pad_token_id)
        labels = labels.masked_fill(mask == 0, -100)
        return network(input_features=inputs[chosen], labels=labels).loss

    losses = train(network, model.recipe, loss_of)
    network.generation_config.pad_token_id = tokenizer.pad_token_id
    network.save_pretrained(out, safe_serialization=True)
    transformers.WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(
        out
    )
    return losses


# --------------------------------------------------------------------------- text to image


@builder
def diffusion(model: DemoModel, out: Path, corpus: str) -> tuple[float, float]:
    """A tiny Stable Diffusion pipeline: CLIP text encoder, UNet with cross-attention, VAE and
    a DDIM scheduler. The UNet is trained briefly to denoise latents of drawn patterns whose
    kind the prompt names, so its predictions depend on the text and the timestep."""
    import torch
    import torch.nn.functional as F
    import transformers
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )

    tokenizer = train_tokenizer(corpus)
    tokenizer.model_max_length = TEXT_MAX_LENGTH
    parts = model.config
    text_config = transformers.CLIPTextConfig(
        **parts["text_encoder"],
        vocab_size=len(tokenizer),
        max_position_embeddings=TEXT_MAX_LENGTH,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )

    def make() -> tuple[Any, Any, Any]:
        return (
            transformers.CLIPTextModel(text_config),
            UNet2DConditionModel(**parts["unet"]),
            AutoencoderKL(**parts["vae"]),
        )

    text_encoder, unet, vae = with_seed(model.recipe.seed, make)
    scheduler: Any = DDIMScheduler(**parts["scheduler"])
    generator = torch.Generator().manual_seed(model.recipe.seed)
    size = unet.config.sample_size * 2 ** (len(vae.config.block_out_channels) - 1)
    pool = 8 * model.recipe.batch_size
    kinds = torch.randint(0, len(PATTERN_LABELS), (pool,), generator=generator)
    pictures = torch.stack(
        [
            torch.tensor(list(pattern_image(int(k), generator).resize((size, size)).getdata()))
            .float()
            .reshape(size, size, 3)
            .permute(2, 0, 1)
            / 127.5
            - 1.0
            for k in kinds
        ]
    )
    prompts = [f"{PATTERN_LABELS[int(k)]} pattern" for k in kinds]
    with torch.no_grad():
        latents = vae.encode(pictures).latent_dist.mean * vae.config.scaling_factor
        ids = tokenizer(
            prompts,
            padding="max_length",
            max_length=TEXT_MAX_LENGTH,
            truncation=True,
            return_tensors="pt",
        )["input_ids"]
        conditions = text_encoder(ids)[0]

    def loss_of(generator: Any) -> torch.Tensor:
        chosen = torch.randint(0, pool, (model.recipe.batch_size,), generator=generator)
        clean = latents[chosen]
        noise = torch.randn(clean.shape, generator=generator)
        steps = torch.randint(
            0, scheduler.config.num_train_timesteps, (len(chosen),), generator=generator
        )
        noisy = scheduler.add_noise(clean, noise, steps)
        predicted = unet(noisy, steps, encoder_hidden_states=conditions[chosen]).sample
        return F.mse_loss(predicted, noise)

    losses = train(unet, model.recipe, loss_of)
    pipeline: Any = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(out, safe_serialization=True)
    return losses
