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


RESULT_MEANINGS: dict[Result, str] = {
    Result.PASS: (
        "The model loaded with from_pretrained, its forward compiled, it generated the requested "
        "tokens with a static cache, and the verification against a float32 CPU reference "
        "accepted every token and the logit error."
    ),
    Result.FAIL: (
        "The model ran to the end but the verification rejected it: a generated token the "
        "reference clearly disagrees with (beyond the run dtype's own noise), or a logit error "
        "beyond the bound relative to a correct run in the same dtype. The verification fields "
        "say where and by how much."
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


class ExclusionReason(StrEnum):
    """Why a model is deliberately not run (machine-readable reason codes)."""

    TOO_LARGE = "too-large"
    NO_PARALLEL_PLAN = "no-parallel-plan"
    REMOTE_CODE_REQUIRED = "remote-code-required"
    UNSUPPORTED_TASK = "unsupported-task"
    GATED_WITHOUT_TOKEN = "gated-without-token"
    NO_SAFETENSORS = "no-safetensors"
    CURATED = "curated"


EXCLUSION_MEANINGS: dict[ExclusionReason, str] = {
    ExclusionReason.TOO_LARGE: "Does not fit the maximum number of cores for a test, even sharded.",
    ExclusionReason.NO_PARALLEL_PLAN: "Needs more than one core but has no valid tensor or expert parallel plan.",
    ExclusionReason.REMOTE_CODE_REQUIRED: "Needs trust_remote_code, which the test does not allow.",
    ExclusionReason.UNSUPPORTED_TASK: "Its task is not one that model-support tests.",
    ExclusionReason.GATED_WITHOUT_TOKEN: "A gated repository and no Hub token was given.",
    ExclusionReason.NO_SAFETENSORS: "Publishes no safetensors weights (pickle-only checkpoints are not loaded).",
    ExclusionReason.CURATED: "Left out of the selected list on purpose; the list gives the reason.",
}


class Task(StrEnum):
    """Hub pipeline tags that model-support tests."""

    TEXT_GENERATION = "text-generation"
    IMAGE_TEXT_TO_TEXT = "image-text-to-text"


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
