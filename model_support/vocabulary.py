"""The one vocabulary of model-support: result states, error classes, exclusion reasons, tasks.

Every part (run.py's output, the CR status, run records, the dataset card, the viewer) uses
these strings. run.py cannot import this package (it must run standalone), so it repeats the
strings; ``tests/test_vocabulary.py`` keeps the two in step.
"""

from __future__ import annotations

from enum import StrEnum


class Result(StrEnum):
    """The outcome of one test of one model."""

    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    EXCLUDED = "EXCLUDED"
    UNVERIFIED = "UNVERIFIED"


_RAN_BADLY = (Result.FAIL, Result.ERROR, Result.TIMEOUT)
REGRESSION_CHANGES: frozenset[tuple[Result, Result]] = frozenset(
    {(Result.PASS, bad) for bad in _RAN_BADLY} | {(Result.EXCLUDED, Result.ERROR)}
)
"""(before, after) results that make a regression between two stacks: a PASS that no longer
passes, or a model once excluded by design that now errors."""
FIX_CHANGES: frozenset[tuple[Result, Result]] = frozenset(
    {(bad, Result.PASS) for bad in _RAN_BADLY}
)
"""(before, after) results that make a fix: a model that ran and did not pass, now passing."""


def is_regression(before: str | None, after: str | None) -> bool:
    """Whether going from result ``before`` to ``after`` is a regression (see above)."""
    return (before, after) in REGRESSION_CHANGES


def is_fix(before: str | None, after: str | None) -> bool:
    """Whether going from result ``before`` to ``after`` is a fix (see above)."""
    return (before, after) in FIX_CHANGES


CONFIRMING_RERUNS = 2
"""Re-runs a worse result needs, all agreeing with it, before it is a regression (by default:
``model-support regressions --reruns``, a ModelSupportSweep's ``spec.confirm.reruns``). A
compiler bug reproduces every time; a failure seen one time in ten survives two agreeing
re-runs about once in a hundred."""
MAX_CONFIRMING_RERUNS = 20
"""The most re-runs a confirmation may ask for."""


RESULT_MEANINGS: dict[Result, str] = {
    Result.PASS: (
        "The model loaded with from_pretrained, its forward compiled, it generated the requested "
        "tokens with a static cache, and the verification against a float32 CPU reference "
        "accepted every token and the logit error."
    ),
    Result.FAIL: (
        "The model ran to the end but the verification rejected it: a generated token the "
        "reference clearly disagrees with (beyond the run dtype's own noise), or a logit error "
        "beyond the bound relative to a correct run in the same dtype. `failed_checks` names the "
        "checks that failed; the verification fields say where and by how much."
    ),
    Result.ERROR: (
        "The test stopped before a verdict; `error_class` says at which stage (see the error "
        "classes) and `error` holds the message and a traceback tail."
    ),
    Result.TIMEOUT: "The test ran past its time limit and was stopped; no verdict.",
    Result.EXCLUDED: (
        "The model was deliberately not run; `exclusion_reason` says why (for example too "
        "large for the maximum number of cores, or it needs remote code)."
    ),
    Result.UNVERIFIED: (
        "The model loaded, compiled and generated the requested tokens, but the test's config "
        "disabled the verification: whether the tokens are right is unknown. Never counted as "
        "PASS; its timings and memory are measured as for any other run."
    ),
}


class ErrorClass(StrEnum):
    """Where an ERROR happened. Stages of run.py first, then infrastructure outcomes."""

    LOAD = "load"
    UNSUPPORTED_ARCHITECTURE = "unsupported-architecture"
    REMOTE_CODE_REFUSED = "remote-code-refused"
    COMPILE = "compile"
    RUNTIME = "runtime"
    OUT_OF_MEMORY = "out-of-memory"
    VERIFICATION = "verification"
    WORKER_CRASH = "worker-crash"
    INFRASTRUCTURE = "infrastructure"


ERROR_CLASS_MEANINGS: dict[ErrorClass, str] = {
    ErrorClass.LOAD: "Loading the tokenizer/processor or weights failed (missing files, corrupt checkpoint, unreachable Hub, gated repo).",
    ErrorClass.UNSUPPORTED_ARCHITECTURE: "The installed transformers does not know the model's architecture.",
    ErrorClass.REMOTE_CODE_REFUSED: "The model needs code from its Hub repository (trust_remote_code) and the test does not allow it.",
    ErrorClass.COMPILE: "Compiling the forward failed (graph capture, lowering or the backend compiler).",
    ErrorClass.RUNTIME: "Running the compiled model (generation) failed.",
    ErrorClass.OUT_OF_MEMORY: "Device or host memory ran out (allocator error or the container was OOM-killed).",
    ErrorClass.VERIFICATION: "The CPU reference needed for the verdict could not be computed.",
    ErrorClass.WORKER_CRASH: "A worker process of a sharded run died or stopped answering.",
    ErrorClass.INFRASTRUCTURE: "The cluster could not run the test (image pull, scheduling, node loss).",
}


class CompileFailure(StrEnum):
    """Why an ERROR ``compile`` happened: the model's graph would not run compiled as a whole,
    or the compile stack itself failed (``error_reason`` of the record)."""

    COMPILER_ERROR = "compiler-error"
    GRAPH_BREAK = "graph-break"
    CPU_FALLBACK = "cpu-fallback"
    RECOMPILES_PER_STEP = "recompiles-per-step"


COMPILE_FAILURE_MEANINGS: dict[CompileFailure, str] = {
    CompileFailure.COMPILER_ERROR: "The compile stack failed: graph capture, lowering, or the device compiler (neuronx-cc) refused or crashed.",
    CompileFailure.GRAPH_BREAK: "The forward does not capture as one graph: a graph break (its reason is in the error), which the Neuron path treats as an error, as TorchNeuron recommends (fullgraph).",
    CompileFailure.CPU_FALLBACK: "Part of a compiled graph ran on the CPU (an operator TorchNeuron does not lower) or fell back to eager execution: the graph did not run compiled.",
    CompileFailure.RECOMPILES_PER_STEP: "The decode recompiles at every step, past Dynamo's recompile limit: a guard on a value that changes per step (the error quotes Dynamo's guard), e.g. a static sliding-window cache that keeps its length as a Python int. The model's cache cannot compile once; the compiler did not fail.",
}  # fmt: skip


class ExclusionReason(StrEnum):
    """Why a model is deliberately not run (machine-readable reason codes)."""

    TOO_LARGE = "too-large"
    NO_PARALLEL_PLAN = "no-parallel-plan"
    REMOTE_CODE_REQUIRED = "remote-code-required"
    UNSUPPORTED_TASK = "unsupported-task"
    GATED_WITHOUT_TOKEN = "gated-without-token"
    NO_SAFETENSORS = "no-safetensors"
    CURATED = "curated"
    UNSUPPORTED_INSTANCE = "unsupported-instance"


EXCLUSION_MEANINGS: dict[ExclusionReason, str] = {
    ExclusionReason.TOO_LARGE: "Does not fit the maximum number of cores for a test, even sharded.",
    ExclusionReason.NO_PARALLEL_PLAN: "Needs more than one core but has no valid tensor or expert parallel plan.",
    ExclusionReason.REMOTE_CODE_REQUIRED: "Needs trust_remote_code, which the test does not allow.",
    ExclusionReason.UNSUPPORTED_TASK: "Its task is not one that model-support tests.",
    ExclusionReason.GATED_WITHOUT_TOKEN: "A gated repository and no Hub token was given.",
    ExclusionReason.NO_SAFETENSORS: "Publishes no safetensors weights (pickle-only checkpoints are not loaded).",
    ExclusionReason.CURATED: "Left out of the selected list on purpose; the list gives the reason.",
    ExclusionReason.UNSUPPORTED_INSTANCE: "Asked for an instance type TorchNeuron does not run on (it supports Trn2 and Trn3 only, not trn1 or inf2).",
}


class Task(StrEnum):
    """Hub pipeline tags that model-support tests."""

    TEXT_GENERATION = "text-generation"
    IMAGE_TEXT_TO_TEXT = "image-text-to-text"
    # ---- tasks beyond text generation; run.py has one section per task family
    FEATURE_EXTRACTION = "feature-extraction"
    SENTENCE_SIMILARITY = "sentence-similarity"
    TEXT2TEXT_GENERATION = "text2text-generation"
    AUTOMATIC_SPEECH_RECOGNITION = "automatic-speech-recognition"
    IMAGE_CLASSIFICATION = "image-classification"
    TEXT_CLASSIFICATION = "text-classification"
    TEXT_TO_IMAGE = "text-to-image"


GENERATING_TASKS: frozenset[Task] = frozenset(
    {
        Task.TEXT_GENERATION,
        Task.IMAGE_TEXT_TO_TEXT,
        Task.TEXT2TEXT_GENERATION,
        Task.AUTOMATIC_SPEECH_RECOGNITION,
    }
)
"""Tasks that decode tokens greedily with a static cache (max_new_tokens applies)."""

SHARDABLE_TASKS: frozenset[Task] = frozenset({Task.TEXT_GENERATION, Task.IMAGE_TEXT_TO_TEXT})
"""Tasks run.py can shard over several cores; every other task runs on one core."""

TASK_METHODS: dict[Task, str] = {
    Task.TEXT_GENERATION: "tokens",
    Task.IMAGE_TEXT_TO_TEXT: "tokens",
    Task.TEXT2TEXT_GENERATION: "tokens",
    Task.AUTOMATIC_SPEECH_RECOGNITION: "tokens",
    Task.FEATURE_EXTRACTION: "embeddings",
    Task.SENTENCE_SIMILARITY: "embeddings",
    Task.TEXT_CLASSIFICATION: "classification",
    Task.IMAGE_CLASSIFICATION: "classification",
    Task.TEXT_TO_IMAGE: "latents",
}
"""How each task's output is verified (run.py's verification ``method``; docs/verification.md)."""


class Parallelism(StrEnum):
    """How a model is split over cores."""

    NONE = "none"
    TENSOR = "tensor"
    EXPERT = "expert"


class Backend(StrEnum):
    """Device backend run.py executes on; AUTO picks neuron, else cuda, else cpu."""

    AUTO = "auto"
    NEURON = "neuron"
    CUDA = "cuda"
    CPU = "cpu"


class VerdictCheck(StrEnum):
    """The checks of the verdict (run.py, verdict()); a FAIL lists the ones that failed."""

    TOKENS = "tokens"
    MEDIAN = "median"
    Q90 = "q90"
    PEAK = "peak"
    KL = "kl"
    # ---- checks of the tasks beyond text generation
    TOP1 = "top1"
    RANKING = "ranking"
    COSINE = "cosine"
    NORM = "norm"
    LATENTS = "latents"
    DENOISER = "denoiser"


VERDICT_CHECK_MEANINGS: dict[VerdictCheck, str] = {
    VerdictCheck.TOKENS: (
        "A generated token is not the reference's argmax and the reference prefers its own "
        "token by more than the run dtype's noise allows at that position (not a near-tie)."
    ),
    VerdictCheck.MEDIAN: (
        "The median over a prompt's positions of the logit error (largest log-probability "
        "deviation over the reference's top 8 tokens and the generated one) exceeds its bound "
        "times the baseline's median: a fault everywhere."
    ),
    VerdictCheck.Q90: (
        "The 90th percentile over positions of the logit error exceeds its bound times the "
        "baseline's: a fault in part of the run, such as one that starts late in decoding."
    ),
    VerdictCheck.PEAK: (
        "The largest logit error over positions exceeds its bound times the baseline's largest: "
        "a fault at a few positions, such as one batch row wrong at one step."
    ),
    VerdictCheck.KL: (
        "The mean over positions of the KL divergence of the device's whole next-token "
        "distribution from the reference's exceeds its bound times the baseline's: probability "
        "moved anywhere in the vocabulary, including its tail outside the top tokens."
    ),
    VerdictCheck.TOP1: (
        "Classification: an input's top-1 class is not the reference's and the reference "
        "prefers its own class by more than the run dtype's noise allows for that input."
    ),
    VerdictCheck.RANKING: (
        "Embeddings: with each input as the query, two other inputs are ranked by similarity "
        "in the opposite order to the reference's, and the reference's similarity gap is beyond "
        "the run dtype's noise for that query."
    ),
    VerdictCheck.COSINE: (
        "Embeddings: the angle between the device's and the reference's embedding of an input, "
        "in the median or the maximum over inputs, exceeds its bound times the baseline's."
    ),
    VerdictCheck.NORM: (
        "Embeddings: the relative error of an embedding's length, in the median or the maximum "
        "over inputs, exceeds its bound times the baseline's."
    ),
    VerdictCheck.LATENTS: (
        "Text-to-image: the relative error of the latents after each denoising step (per "
        "prompt), in the median or the maximum over steps, exceeds its bound times the baseline's."
    ),
    VerdictCheck.DENOISER: (
        "Text-to-image: the relative error of the denoiser's prediction at each step, against "
        "the float32 reference denoiser fed the device's own inputs (teacher forced), in the "
        "median or the maximum over steps, exceeds its bound times the baseline's."
    ),
}


class LocalizeMode(StrEnum):
    """When a run searches the first module whose compiled output diverges."""

    ON_FAIL = "on_fail"
    ALWAYS = "always"
    NEVER = "never"


class LocalizationStatus(StrEnum):
    """How the search for the first diverging module ended (``first_divergence.status``)."""

    FOUND = "found"
    NONE = "none"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    NOT_SUPPORTED = "not_supported"


LOCALIZATION_STATUS_MEANINGS: dict[LocalizationStatus, str] = {
    LocalizationStatus.FOUND: "A module diverges on its own: the first one in execution order, at the deepest level searched.",
    LocalizationStatus.NONE: "No module's output diverges on the reference's inputs (the error arises elsewhere, e.g. in the cached decode path).",
    LocalizationStatus.INCOMPLETE: "The time budget ran out; the module named, if any, is the deepest one confirmed so far.",
    LocalizationStatus.FAILED: "The search itself failed (a module that does not compile on its own, memory, a worker of a sharded run lost during it): the reason and its error class say why.",
    LocalizationStatus.NOT_SUPPORTED: "Not searched: a task family without root calls for the search (every family run.py knows has them).",
}  # fmt: skip


class DivergencePhase(StrEnum):
    """Where a generating task's search compiled the modules (``first_divergence.phase``)."""

    PREFILL = "prefill"
    DECODE = "decode"


DIVERGENCE_PHASE_MEANINGS: dict[DivergencePhase, str] = {
    DivergencePhase.PREFILL: "The FAIL first shows at the first generated token (or at no one position): the modules were compiled on the whole sequence at once, as the verdict scores it, and where that names none, at the prefill step as the run ran it (step 0).",
    DivergencePhase.DECODE: "The FAIL first shows at a decode step (first_divergence_step: that step, or the step just before where it began within the bounds): the modules were compiled with that step's shapes, one token per sequence against the static cache the earlier steps filled, as the run ran it.",
}  # fmt: skip


class Float32Precision(StrEnum):
    """The arithmetic a float32 run's compile backend may use, which its baseline reproduces."""

    AUTO = "auto"
    IEEE = "ieee"
    TF32 = "tf32"
    BF16 = "bf16"


FLOAT32_PRECISION_MEANINGS: dict[Float32Precision, str] = {
    Float32Precision.AUTO: "The backend's default (see FLOAT32_PRECISION_DEFAULTS).",
    Float32Precision.IEEE: "Strict float32: the baseline is the float32 reference itself.",
    Float32Precision.TF32: (
        "Matmul and convolution operands rounded to TF32 (10 mantissa bits), float32 "
        "accumulation: TensorFloat-32 tensor cores."
    ),
    Float32Precision.BF16: (
        "Matmul operands rounded to bfloat16, float32 accumulation: neuronx-cc's --auto-cast "
        "matmult (its default before 2.22)."
    ),
}

FLOAT32_PRECISION_DEFAULTS: dict[Backend, Float32Precision] = {
    # neuronx-cc's --auto-cast defaults to none since 2.22 (Neuron 2.27.0); run.py reads
    # NEURON_CC_FLAGS for a run that asks for auto-casting.
    Backend.NEURON: Float32Precision.IEEE,
    Backend.CUDA: Float32Precision.TF32,
    Backend.CPU: Float32Precision.IEEE,
}
"""What ``auto`` means per backend (docs/verification.md gives the reasons and sources)."""

PASS_GUARANTEES: tuple[str, ...] = (
    "The model loaded unmodified with from_pretrained, its forward compiled, and it generated "
    "every requested token greedily with a static cache on the recorded backend.",
    "Every generated token is the float32 reference's choice, or a near-tie: the reference "
    "prefers its own token by less than near_tie_multiple times what a correct run's "
    "arithmetic moves it at that position.",
    "On every prompt, the device's log-probabilities of the reference's top 8 tokens and of the "
    "generated token deviate from the reference by at most the bound times a correct run's "
    "deviation in the same arithmetic (the baseline), in the median, the 90th percentile and "
    "the maximum over positions: a fault everywhere, in part of the run, or at a single step.",
    "On every prompt, the device's whole next-token distribution, the vocabulary's tail "
    "included, diverges from the reference's (mean KL divergence over positions) by at most "
    "the bound times the baseline's.",
    "For a float32 run, a correct run's arithmetic is the recorded float32_precision: strict "
    "float32 (ieee), or TF32 / bfloat16 matmul operands with float32 accumulation.",
)
"""What a PASS guarantees, for the tested prompts (dataset card, README, docs/verification.md)."""

PASS_BLIND_SPOTS: tuple[str, ...] = (
    "Whatever the test's inputs do not reach: other prompts, longer contexts, other batch "
    "sizes, sampling instead of greedy decoding.",
    "Faults of the size of a correct run's own rounding: for example noise of 5% of one "
    "layer's output in bfloat16, or a 10% scaling of a Gemma2 layer's attention inputs, which "
    "its norms mostly undo (about 1.5 times a bfloat16 run's own error).",
    "A fault at one or a few positions that stays under the peak bound times the baseline's "
    "largest deviation: for example 20% noise at one step of one prompt.",
    "Positions where a mixture-of-experts router was nearly tied in the reference (at most "
    "router_tie_share of a prompt's positions) are judged by the median check only: their "
    "token may be the other nearly tied expert's choice.",
    "Changes confined to tokens of negligible probability: the KL divergence weighs each "
    "token by its probability.",
    "Errors the reference shares: it runs the same transformers code on CPU, so a bug in the "
    "modelling code or a bad checkpoint passes.",
    "Speed and memory: recorded, never judged.",
)
"""What a PASS cannot see."""
