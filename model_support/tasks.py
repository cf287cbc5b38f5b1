"""The task families model-support tests, each declared once, here.

A task is a Hub pipeline tag; a family is the tags that one section of run.py runs (its
Appendix A, headed ``# ---- task: <tags>``). Everything else about a family is derived from its
:class:`Family` below: the command line's and the CRDs' task choices (:class:`Task`), the run
config's default prompts and the check on them, what sizing takes and refuses
(:mod:`model_support.sizing`), what ``reproduce`` installs, the dataset card, the viewer's
output heading and view, the demo's tiny checkpoints (built by
:mod:`model_support.task_fixtures`) and the test cases: every task run end to end, every
checkpoint sized, every checkpoint's fault-injection cases.

run.py stands alone and keeps its own section per family; ``tests/test_vocabulary.py`` holds
the two in step. docs/extending.md says what a new family touches.

This module imports nothing of the package but :mod:`model_support.fixture_training` (the
recipe a checkpoint is trained with), so that the vocabulary can take :class:`Task` from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from model_support.fixture_training import INIT_RANGE, TOKENIZER_VOCAB_SIZE, TrainingRecipe


class Task(StrEnum):
    """Hub pipeline tags that model-support tests (each in one :class:`Family` below)."""

    TEXT_GENERATION = "text-generation"
    IMAGE_TEXT_TO_TEXT = "image-text-to-text"
    FEATURE_EXTRACTION = "feature-extraction"
    SENTENCE_SIMILARITY = "sentence-similarity"
    TEXT2TEXT_GENERATION = "text2text-generation"
    AUTOMATIC_SPEECH_RECOGNITION = "automatic-speech-recognition"
    IMAGE_CLASSIFICATION = "image-classification"
    TEXT_CLASSIFICATION = "text-classification"
    TOKEN_CLASSIFICATION = "token-classification"
    TEXT_TO_IMAGE = "text-to-image"


class Loader(StrEnum):
    """How run.py loads a task's model, which decides what sizing checks before a run."""

    CAUSAL_LM = "causal-lm"
    """transformers' causal LM or image-text-to-text model: sizing's own checks (remote code,
    tensor and expert parallel plans)."""
    AUTO_CLASS = "auto-class"
    """A transformers auto class: a model must have one of its mapping's architectures."""
    SENTENCE_TRANSFORMERS = "sentence-transformers"
    """sentence-transformers over a transformers text encoder."""
    DIFFUSERS = "diffusers"
    """A diffusers pipeline (model_index.json) whose denoiser is a unet or a transformer."""

    @property
    def library(self) -> str:
        """The distribution that loads the model."""
        if self in (Loader.SENTENCE_TRANSFORMERS, Loader.DIFFUSERS):
            return self.value
        return "transformers"


class Shows(StrEnum):
    """How the viewer's details show what a run produced (``model_support.viewer.output``)."""

    TEXT = "text"
    """The text per prompt: a continuation, a transcription."""
    LABELS = "labels"
    """A label per item (an input, or a token of an input): the device's beside the float32
    reference's, differences marked."""
    PICTURES = "pictures"
    """The picture per prompt beside the reference's."""
    MEASURES = "measures"
    """Nothing beyond the verdict's measures and items (embeddings)."""


IMAGE_LIBRARIES = ("pillow", "numpy")
"""What run.py draws its test images (PIL) and tones (numpy) with."""


@dataclass(frozen=True)
class TaskSpec:
    """One pipeline tag of a family: how its model loads, what a prompt is, how its output is
    named."""

    task: Task
    loader: Loader
    inputs: str
    """What a prompt of this task is (run.py turns it into the model's input)."""
    default_prompts: tuple[str, ...]
    output_label: str = "Generated text"
    """The viewer's heading over a run's text (``text`` of the record)."""
    architectures: str | None = None
    """The transformers mapping (``transformers.models.auto.modeling_auto``) of the classes
    run.py's auto class loads: sizing takes a model with one of them, and recognises a local
    checkpoint's task by them."""
    prompt_choices: tuple[str, ...] | None = None
    """The only prompts this task takes (names of inputs run.py draws); None: any text."""
    input_libraries: tuple[str, ...] = ()
    """What run.py draws this task's inputs or outputs with, beyond the model's library."""
    unsupported_note: str = ""
    """Said after why a model's architecture is refused (what else is not tested yet)."""

    @property
    def libraries(self) -> tuple[str, ...]:
        """What a run of this task imports beyond transformers (``reproduce`` installs them)."""
        own = () if self.loader.library == "transformers" else (self.loader.library,)
        return (*own, *self.input_libraries)


FaultExpectation = Literal["PASS", "FAIL"] | None
FAULTS = "model_support.faults:"
DECODER = (("MODEL_SUPPORT_FAULT_STACK", "decoder"),)
ENCODER = (("MODEL_SUPPORT_FAULT_STACK", "encoder"),)


@dataclass(frozen=True)
class FaultCase:
    """One fault-injection case: the checkpoint compiled by ``backend`` (a registered
    torch.compile backend, or a fault of :mod:`model_support.faults`), in ``dtype`` with the
    verification's ``precision``; the verdict a correct verifier gives (None: reported only)."""

    backend: str
    expect: FaultExpectation
    dtype: str = "bfloat16"
    precision: str = "auto"
    env: tuple[tuple[str, str], ...] = ()
    task: Task | None = None
    """Run as this task of the family (None: the checkpoint's own)."""

    @property
    def label(self) -> str:
        name = self.backend.removeprefix(FAULTS)
        where = dict(self.env).get("MODEL_SUPPORT_FAULT_STACK")
        return f"{name} ({where})" if where else name


def fault(name: str, expect: FaultExpectation, **kwargs: Any) -> FaultCase:
    """A case of the fault ``name`` of :mod:`model_support.faults`."""
    return FaultCase(FAULTS + name, expect, **kwargs)


BF16_BENIGN = (FaultCase("eager", "PASS"), FaultCase("aot_eager", "PASS"))
FP32_BENIGN = (
    FaultCase("aot_eager", "PASS", dtype="float32"),  # strict: cpu's default precision is ieee
    fault("tf32_matmuls", "PASS", dtype="float32", precision="tf32"),
    fault("bf16_matmuls", "PASS", dtype="float32", precision="bf16"),
)
FP32_FAULTS = (
    fault("bf16_matmuls", "FAIL", dtype="float32"),  # reduced precision where strict was declared
    fault("noise_20pct", "FAIL", dtype="float32", precision="bf16"),
)
# One layer's MLP output with noise of 20% of its spread; whether that is visible in the output
# depends on what follows the layer (a classifier head sees it, mean pooling averages it away).
ENCODER_FAULTS = (
    fault("noise_20pct", "FAIL"),
    fault("noise_100pct", "FAIL"),
    fault("zero_head", "FAIL"),
    fault("row_noise_100pct", "FAIL"),
)
INDUCTOR = FaultCase("inductor", "PASS")


@dataclass(frozen=True)
class DemoCheckpoint:
    """A family's tiny checkpoint for the demo and the tests: built from ``config`` by
    ``model_support.task_fixtures.<builder>``, trained with ``recipe``, saved the way its
    library loads it; its fault-injection cases."""

    name: str
    task: Task
    architecture: str
    description: str
    config_class: str
    config: Mapping[str, Any] = field(repr=False)
    recipe: TrainingRecipe
    builder: str
    faults: tuple[FaultCase, ...] = ()


@dataclass(frozen=True)
class Family:
    """The tags one section of run.py runs, and everything the rest derives from them."""

    tasks: tuple[TaskSpec, ...]
    method: str
    """What the verdict compares (the record's ``verification.method``)."""
    verdict: str
    """How the verdict judges it, in a sentence (the dataset card)."""
    shows: Shows
    measures: tuple[str, ...] = ()
    """The error measures the verdict reports (``verification.metrics``), none for tokens."""
    generates: bool = False
    """Decodes tokens greedily with a static cache: max_new_tokens, prefill and decode timings."""
    shardable: bool = False
    """run.py can shard it over several cores (tensor or expert parallel)."""
    checkpoints: tuple[DemoCheckpoint, ...] = ()
    """The demo's tiny checkpoints of this family, built by model_support.task_fixtures (the
    language models of text generation are model_support.checkpoints' own)."""

    @property
    def name(self) -> str:
        """The family as run.py's section names it: its tags."""
        return ", ".join(spec.task.value for spec in self.tasks)

    def checkpoint_for(self, task: Task) -> DemoCheckpoint | None:
        """The checkpoint a test of ``task`` runs: the one built for it, else the family's
        first (an embedding model serves both of its tags)."""
        for checkpoint in self.checkpoints:
            if checkpoint.task is task:
                return checkpoint
        return self.checkpoints[0] if self.checkpoints else None


# ---- default inputs; run.py turns each prompt into the task's input (a sentence, a spoken
# waveform, a drawn test image, an image prompt).

DEFAULT_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n",
)
DEFAULT_IMAGE_PROMPT = "Describe this image."
# Four pairs of related sentences: each one's nearest neighbour is its partner, so the
# similarity ranking the embeddings verdict checks is decided.
DEFAULT_EMBEDDING_SENTENCES: tuple[str, ...] = (
    "The capital of France is Paris.",
    "Paris lies on the river Seine in the north of France.",
    "def fibonacci(n): return the n-th Fibonacci number",
    "a, b = b, a + b in a loop computes Fibonacci numbers",
    "Water boils at one hundred degrees Celsius.",
    "On a high mountain water boils at a lower temperature.",
    "The farmer sells apples, pears and plums at the market.",
    "There is a stall with fresh bread and cakes.",
)
DEFAULT_CLASSIFICATION_TEXTS: tuple[str, ...] = (
    "def fibonacci(n):\n    a, b = 0, 1",
    "The capital of France is Paris.",
    "import numpy as np\nx = np.linspace(0.0, 1.0, 11)",
    "Once upon a time there was a small village at the foot of a mountain.",
    "class Stack:\n    def push(self, item):",
    "Water boils at one hundred degrees Celsius at sea level.",
    "for i in range(10):\n    print(i)",
    "The picture shows a boat on a calm lake at sunset.",
)
# What the generated waveform says: run.py spells each prompt as a sequence of tones.
DEFAULT_SPOKEN_TEXTS: tuple[str, ...] = (
    "the capital of france is paris",
    "def fibonacci(n):",
)
# Test images run.py draws by name (see run.py, draw_test_image).
TEST_IMAGE_NAMES: tuple[str, ...] = (
    "gradient-checkerboard",
    "horizontal-stripes",
    "vertical-stripes",
    "checkerboard",
    "diagonal-stripes",
    "horizontal-stripes-wide",
    "vertical-stripes-wide",
    "checkerboard-fine",
)
DEFAULT_IMAGE_GENERATION_PROMPTS: tuple[str, ...] = (
    "a red apple on a wooden table",
    "a boat on a calm lake at sunset",
)

# Shapes of the encoder stacks of the task checkpoints (BERT, ViT): hidden 64, 2 layers.
ENCODER_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "initializer_range": INIT_RANGE,
}
TEXT_ENCODER_SHAPE: dict[str, Any] = {
    **ENCODER_SHAPE,
    "vocab_size": TOKENIZER_VOCAB_SIZE,
    "max_position_embeddings": 128,
}

# ---- the families, in the order of run.py's sections

TEXT_GENERATION = Family(
    tasks=(
        TaskSpec(Task.TEXT_GENERATION, Loader.CAUSAL_LM, "a prompt to continue", DEFAULT_PROMPTS),
        TaskSpec(
            Task.IMAGE_TEXT_TO_TEXT,
            Loader.CAUSAL_LM,
            "a question about run.py's test image",
            (DEFAULT_IMAGE_PROMPT,),
            input_libraries=IMAGE_LIBRARIES,
        ),
    ),
    method="tokens",
    verdict=(
        "32 greedy tokens, scored teacher forced, judged by the text verdict's checks "
        "(docs/verification.md)."
    ),
    shows=Shows.TEXT,
    generates=True,
    shardable=True,
    # Its own fault-injection suite: tests/runner/test_fault_injection.py.
)

# 20% noise in the encoder's last layer reaches the decoder through a norm and cross-attention:
# 2.8x a correct bfloat16 run's median error on T5 (reported); 100% must fail.
SEQ2SEQ_FAULTS = (
    fault("noise_20pct", "FAIL", env=DECODER),
    fault("noise_20pct", None, env=ENCODER),
    fault("noise_100pct", "FAIL", env=ENCODER),
    fault("zero_head", "FAIL", env=DECODER),
    fault("zero_head", "FAIL", env=ENCODER),
    fault("vocab_tail_bias", "FAIL"),
)

ENCODER_DECODER = Family(
    tasks=(
        TaskSpec(
            Task.TEXT2TEXT_GENERATION,
            Loader.AUTO_CLASS,
            "a text to transform",
            DEFAULT_PROMPTS,
            architectures="MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
        ),
        TaskSpec(
            Task.AUTOMATIC_SPEECH_RECOGNITION,
            Loader.AUTO_CLASS,
            "a text run.py speaks as tones",
            DEFAULT_SPOKEN_TEXTS,
            output_label="Transcription per waveform",
            architectures="MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
            input_libraries=IMAGE_LIBRARIES,
            unsupported_note=(
                "it is not a speech sequence-to-sequence model (Whisper-style); CTC and other "
                "speech models are not tested yet"
            ),
        ),
    ),
    method="tokens",
    verdict=(
        "32 greedy tokens, scored teacher forced with the encoder's inputs, judged by the text "
        "verdict's checks."
    ),
    shows=Shows.TEXT,
    generates=True,
    checkpoints=(
        DemoCheckpoint(
            name="tiny-t5",
            task=Task.TEXT2TEXT_GENERATION,
            architecture="T5ForConditionalGeneration",
            description="T5 encoder-decoder, d_model 64, 2+2 layers: continues the text it reads.",
            config_class="T5Config",
            config={
                "vocab_size": TOKENIZER_VOCAB_SIZE,
                "d_model": 64,
                "d_kv": 16,
                "d_ff": 128,
                "num_layers": 2,
                "num_heads": 4,
                "relative_attention_num_buckets": 16,
                "dropout_rate": 0.0,
            },
            recipe=TrainingRecipe(steps=400, learning_rate=3e-3, batch_size=16, sequence_length=64),
            builder="seq2seq",
            faults=(*BF16_BENIGN, *SEQ2SEQ_FAULTS, *FP32_BENIGN, *FP32_FAULTS, INDUCTOR),
        ),
        DemoCheckpoint(
            name="tiny-whisper",
            task=Task.AUTOMATIC_SPEECH_RECOGNITION,
            architecture="WhisperForConditionalGeneration",
            description=(
                "Whisper encoder-decoder, d_model 64, 2+2 layers, 2 s of 80-bin log-mel input: "
                "transcribes run.py's tone-spelled text and continues it."
            ),
            config_class="WhisperConfig",
            config={
                "vocab_size": TOKENIZER_VOCAB_SIZE,
                "d_model": 64,
                "encoder_layers": 2,
                "decoder_layers": 2,
                "encoder_attention_heads": 4,
                "decoder_attention_heads": 4,
                "encoder_ffn_dim": 128,
                "decoder_ffn_dim": 128,
                "max_target_positions": 64,
                "init_std": INIT_RANGE,
            },
            recipe=TrainingRecipe(steps=600, learning_rate=3e-3, batch_size=16, sequence_length=64),
            builder="speech",
            faults=(*BF16_BENIGN, *SEQ2SEQ_FAULTS, *FP32_BENIGN, *FP32_FAULTS),
        ),
    ),
)

# Mean pooling over tokens averages per-token noise: 20% in the last layer moves a bfloat16
# embedding by 1.75x a correct run's own error, within a correct run's noise (reported).
EMBEDDING_FAULTS = (fault("noise_20pct", None), *ENCODER_FAULTS[1:])

SENTENCE_EMBEDDINGS = Family(
    tasks=(
        TaskSpec(
            Task.FEATURE_EXTRACTION,
            Loader.SENTENCE_TRANSFORMERS,
            "a sentence to embed",
            DEFAULT_EMBEDDING_SENTENCES,
            # A bare encoder is recognised as feature-extraction by its architecture.
            architectures="MODEL_MAPPING_NAMES",
        ),
        TaskSpec(
            Task.SENTENCE_SIMILARITY,
            Loader.SENTENCE_TRANSFORMERS,
            "a sentence to embed",
            DEFAULT_EMBEDDING_SENTENCES,
        ),
    ),
    method="embeddings",
    verdict=(
        "per sentence the angle to the reference embedding (`cosine`) and the error of its "
        "length (`norm`); with each sentence as the query, the similarity ranking of the "
        "others must keep the reference's order beyond near-ties (`ranking`)."
    ),
    shows=Shows.MEASURES,
    measures=("cosine", "norm"),
    checkpoints=(
        DemoCheckpoint(
            name="tiny-sentence-bert",
            task=Task.SENTENCE_SIMILARITY,
            architecture="BertModel",
            description=(
                "sentence-transformers model: tiny BERT + mean pooling, trained contrastively on "
                "pairs of spans of one paragraph (also a feature-extraction model)."
            ),
            config_class="BertConfig",
            config=TEXT_ENCODER_SHAPE,
            recipe=TrainingRecipe(steps=200, learning_rate=2e-3, batch_size=32, sequence_length=32),
            builder="sentence_embeddings",
            faults=(
                *BF16_BENIGN,
                *EMBEDDING_FAULTS,
                *FP32_BENIGN,
                *FP32_FAULTS,
                # The same model as a feature-extraction test, compiled by inductor.
                FaultCase("inductor", "PASS", task=Task.FEATURE_EXTRACTION),
            ),
        ),
    ),
)

CLASSIFICATION = Family(
    tasks=(
        TaskSpec(
            Task.TEXT_CLASSIFICATION,
            Loader.AUTO_CLASS,
            "a text to classify",
            DEFAULT_CLASSIFICATION_TEXTS,
            output_label="Predicted class per input",
            architectures="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        ),
        TaskSpec(
            Task.IMAGE_CLASSIFICATION,
            Loader.AUTO_CLASS,
            "the name of a test image run.py draws",
            TEST_IMAGE_NAMES,
            output_label="Predicted class per test image",
            architectures="MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
            prompt_choices=TEST_IMAGE_NAMES,
            input_libraries=IMAGE_LIBRARIES,
        ),
    ),
    method="classification",
    verdict=(
        "per input the log-probability error over the top classes (`median`, `peak`), and the "
        "top class must be the reference's unless the reference's margin is within the "
        "baseline's noise (`top1`)."
    ),
    shows=Shows.LABELS,
    measures=("logits",),
    checkpoints=(
        DemoCheckpoint(
            name="tiny-vit-classifier",
            task=Task.IMAGE_CLASSIFICATION,
            architecture="ViTForImageClassification",
            description=(
                "ViT image classifier (32x32, 8x8 patches), trained to tell stripes, "
                "checkerboards and diagonals apart."
            ),
            config_class="ViTConfig",
            config=ENCODER_SHAPE,
            recipe=TrainingRecipe(steps=400, learning_rate=3e-3, batch_size=32),
            builder="image_classifier",
            faults=(*BF16_BENIGN, *ENCODER_FAULTS, *FP32_BENIGN, *FP32_FAULTS),
        ),
        DemoCheckpoint(
            name="tiny-bert-classifier",
            task=Task.TEXT_CLASSIFICATION,
            architecture="BertForSequenceClassification",
            description=(
                "BERT text classifier: is a span of the corpus a function, other code, or prose."
            ),
            config_class="BertConfig",
            config=TEXT_ENCODER_SHAPE,
            recipe=TrainingRecipe(steps=200, learning_rate=2e-3, batch_size=32, sequence_length=32),
            builder="text_classifier",
            faults=(*BF16_BENIGN, *ENCODER_FAULTS, *FP32_BENIGN, *FP32_FAULTS, INDUCTOR),
        ),
    ),
)

# Names, numbers and Python keywords among other words: the tiny token classifier's labels.
DEFAULT_TOKEN_TEXTS: tuple[str, ...] = (
    "The capital of France is Paris.",
    "Berlin is the capital of Germany and Rome is the capital of Italy.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Water boils at 100 degrees Celsius and freezes at 0.",
    "import numpy as np",
    "for i in range(10): print(i)",
    "The Seine flows through Paris to the sea.",
    "x = None if ready is False else 42",
)

TOKEN_CLASSIFICATION = Family(
    tasks=(
        TaskSpec(
            Task.TOKEN_CLASSIFICATION,
            Loader.AUTO_CLASS,
            "a text whose every token is labelled",
            DEFAULT_TOKEN_TEXTS,
            output_label="Predicted label per token",
            architectures="MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        ),
    ),
    method="token-classification",
    verdict=(
        "per token of the inputs (not padding or special tokens) the log-probability error over "
        "the top labels (`median`, `peak`), and each token's top label must be the reference's "
        "unless the reference's margin is within the baseline's noise (`top1`)."
    ),
    shows=Shows.LABELS,
    measures=("logits",),
    checkpoints=(
        DemoCheckpoint(
            name="tiny-bert-token-classifier",
            task=Task.TOKEN_CLASSIFICATION,
            architecture="BertForTokenClassification",
            description=(
                "BERT token classifier: labels each token of a span of the corpus as part of a "
                "name (a capitalised word within a sentence), a number, a Python keyword, or O."
            ),
            config_class="BertConfig",
            config=TEXT_ENCODER_SHAPE,
            recipe=TrainingRecipe(steps=200, learning_rate=2e-3, batch_size=32, sequence_length=32),
            builder="token_classifier",
            faults=(*BF16_BENIGN, *ENCODER_FAULTS, *FP32_BENIGN, *FP32_FAULTS),
        ),
    ),
)

# Noise in the UNet's middle block is bypassed by its skip connections (20%: 1.25x, 100%: about
# 4x a correct run's error; reported); the same noise in the last up block must fail.
DIFFUSION_FAULTS = (
    fault("wrong_timestep", "FAIL"),
    fault("stale_step", "FAIL"),
    fault("denoiser_last_block_noise_20pct", "FAIL"),
    fault("denoiser_noise_20pct", None),
    fault("denoiser_noise_100pct", None),
    fault("denoiser_zero_head", "FAIL"),
)

TEXT_TO_IMAGE = Family(
    tasks=(
        TaskSpec(
            Task.TEXT_TO_IMAGE,
            Loader.DIFFUSERS,
            "a prompt for the picture",
            DEFAULT_IMAGE_GENERATION_PROMPTS,
            input_libraries=IMAGE_LIBRARIES,
        ),
    ),
    method="latents",
    verdict=(
        "a few denoising steps from a fixed seed: per step the denoiser's prediction against "
        "the reference denoiser fed the device's own inputs (`denoiser`, teacher forced), and "
        "the latents after the step (`latents`)."
    ),
    shows=Shows.PICTURES,
    measures=("denoiser", "latents"),
    checkpoints=(
        DemoCheckpoint(
            name="tiny-stable-diffusion",
            task=Task.TEXT_TO_IMAGE,
            architecture="StableDiffusionPipeline",
            description=(
                "diffusers Stable Diffusion pipeline: CLIP text encoder, UNet with cross-attention "
                "(8x8 latents), VAE (16x16 images), DDIM; the UNet is trained to denoise patterns."
            ),
            config_class="StableDiffusionPipeline",
            config={
                "text_encoder": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                },
                "unet": {
                    "sample_size": 8,
                    "in_channels": 4,
                    "out_channels": 4,
                    "layers_per_block": 1,
                    "block_out_channels": [32, 64],
                    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
                    "cross_attention_dim": 32,
                    "attention_head_dim": 8,
                    "norm_num_groups": 8,
                },
                "vae": {
                    "in_channels": 3,
                    "out_channels": 3,
                    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
                    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
                    "block_out_channels": [16, 32],
                    "latent_channels": 4,
                    "layers_per_block": 1,
                    "norm_num_groups": 8,
                    "sample_size": 16,
                },
                "scheduler": {
                    "num_train_timesteps": 1000,
                    "beta_schedule": "scaled_linear",
                    "beta_start": 0.00085,
                    "beta_end": 0.012,
                    "clip_sample": False,
                    "set_alpha_to_one": False,
                    "steps_offset": 1,
                },
            },
            recipe=TrainingRecipe(steps=200, learning_rate=2e-3, batch_size=16),
            builder="diffusion",
            faults=(
                *BF16_BENIGN,
                *DIFFUSION_FAULTS,
                *FP32_BENIGN,
                fault("bf16_matmuls", "FAIL", dtype="float32"),
                fault("wrong_timestep", "FAIL", dtype="float32", precision="bf16"),
                INDUCTOR,
            ),
        ),
    ),
)

FAMILIES: tuple[Family, ...] = (
    TEXT_GENERATION,
    ENCODER_DECODER,
    SENTENCE_EMBEDDINGS,
    CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    TEXT_TO_IMAGE,
)
"""Every family, in the order of run.py's sections."""

# ---- what the rest of the package reads

TASK_SPECS: dict[Task, TaskSpec] = {spec.task: spec for f in FAMILIES for spec in f.tasks}
FAMILY_OF: dict[Task, Family] = {spec.task: f for f in FAMILIES for spec in f.tasks}
GENERATING_TASKS: frozenset[Task] = frozenset(t for t, f in FAMILY_OF.items() if f.generates)
"""Tasks that decode tokens greedily with a static cache (max_new_tokens applies)."""
SHARDABLE_TASKS: frozenset[Task] = frozenset(t for t, f in FAMILY_OF.items() if f.shardable)
"""Tasks run.py can shard over several cores; every other task runs on one core."""
TASK_METHODS: dict[Task, str] = {task: f.method for task, f in FAMILY_OF.items()}
"""How each task's output is verified (run.py's verification ``method``; docs/verification.md)."""
CHECKPOINTS: tuple[DemoCheckpoint, ...] = tuple(c for f in FAMILIES for c in f.checkpoints)
"""Every family's tiny checkpoint: part of the demo, built by model_support.task_fixtures."""


def task_spec(task: str | None) -> TaskSpec | None:
    """The declaration of pipeline tag ``task``; None for a tag model-support does not test."""
    if task is None:
        return None
    try:
        return TASK_SPECS[Task(task)]
    except ValueError:
        return None


def family_of(task: str | None) -> Family | None:
    """The family of pipeline tag ``task``; None for a tag model-support does not test."""
    spec = task_spec(task)
    return FAMILY_OF[spec.task] if spec is not None else None


def family_of_checkpoint(name: str) -> Family:
    """The family whose checkpoint is called ``name``."""
    for family in FAMILIES:
        if any(c.name == name for c in family.checkpoints):
            return family
    raise ValueError(f"no family declares a checkpoint {name!r}")


def _unique(values: list[str], what: str) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{what} declared twice in model_support/tasks.py: {', '.join(repeated)}")


_unique([spec.task.value for f in FAMILIES for spec in f.tasks], "tasks")
_unique([c.name for c in CHECKPOINTS], "checkpoint names")
if set(TASK_SPECS) != set(Task):
    raise ValueError(
        "every Task needs a family in model_support/tasks.py; undeclared: "
        + ", ".join(sorted(t.value for t in set(Task) - set(TASK_SPECS)))
    )
