"""Typed records: the result document run.py writes and the immutable RunRecord stored from it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from model_support.vocabulary import ErrorClass, ExclusionReason, Parallelism, Result

RESULT_MARKER = "MODEL_SUPPORT_RESULT "
"""Prefix of the last stdout line of run.py: the result document as one line of JSON."""

PROGRESS_MARKER = "MODEL_SUPPORT_STAGE "
"""Prefix of run.py's progress lines (one JSON object each: stage, status, seconds)."""


PACKAGE_PIN = r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
"""One entry of a document's ``packages``: an installed distribution as ``name==version``."""


class Timings(BaseModel):
    """Seconds per stage of a run; None where the stage did not run."""

    load_s: float | None = None
    first_generate_s: float | None = Field(
        None, description="First generate call: includes compilation."
    )
    steady_generate_s: float | None = Field(
        None, description="A second, identical generate call (compiled)."
    )
    prefill_s: float | None = Field(
        None, description="A generate call of one token (prefill only, compiled)."
    )
    compile_s: float | None = Field(None, description="first_generate_s - steady_generate_s.")
    decode_tokens_per_s: float | None = Field(
        None,
        description="Generated tokens (all prompts) per second of decoding, excluding prefill.",
    )
    reference_s: float | None = Field(
        None, description="CPU reference pass for the verdict (not part of the test's wall time)."
    )
    wall_time_s: float | None = Field(
        None, description="Load + compile + generate; excludes the reference pass."
    )
    total_s: float | None = Field(None, description="Whole run.py, reference included.")


class Memory(BaseModel):
    """Peak memory. Device figures come from the allocator (cuda/neuron) or the process (cpu)."""

    peak_device_memory_bytes: int | None = None
    device_memory_source: str | None = Field(
        None, description="Which API gave peak_device_memory_bytes."
    )
    host_peak_rss_bytes: int | None = None
    host_rss_anon_bytes: int | None = None
    host_rss_file_bytes: int | None = None


class Verification(BaseModel):
    """The verdict's figures, kept whole so thresholds can be re-judged from the dataset."""

    model_config = ConfigDict(extra="allow")

    passed: bool | None = None
    exact: bool | None = Field(None, description="Every token equals the float32 reference argmax.")
    error_ratio: float | None = Field(
        None,
        description="Median per-position logit deviation of the device / of the dtype baseline (worst prompt).",
    )
    device_error: float | None = Field(
        None, description="The device's median deviation (nats), worst prompt."
    )
    baseline_error: float | None = Field(
        None, description="The baseline's median deviation (nats), same prompt."
    )
    rmse_ratio: float | None = Field(
        None,
        description="Whole-vocabulary log-probability RMSE ratio device / baseline (recorded, not judged).",
    )
    mismatches: int | None = Field(
        None, description="Tokens that differ from the reference argmax."
    )
    near_ties: int | None = Field(
        None, description="Mismatches accepted as within the dtype's noise."
    )
    bad_tokens: int | None = Field(
        None, description="Mismatches beyond the dtype's noise (each one FAILs)."
    )
    first_mismatch: int | None = Field(
        None, description="Index (over all prompts' generated tokens) of the first mismatch."
    )
    reason: str | None = None
    parameters: dict[str, float] = Field(default_factory=dict)
    positions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per prompt and position: token, reference argmax, margin, baseline deviation, verdict.",
    )


class Stack(BaseModel):
    """Versions of everything that decides the outcome."""

    model_config = ConfigDict(extra="allow")

    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    accelerate: str | None = None
    huggingface_hub: str | None = None
    tokenizers: str | None = None
    safetensors: str | None = None
    torch_neuronx: str | None = None
    neuronx_cc: str | None = None
    os: str | None = None
    instance_type: str | None = None
    device_name: str | None = None


class ResultDocument(BaseModel):
    """What run.py writes: one JSON object (file + marked last stdout line)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 1
    model: str
    revision: str | None = None
    resolved_revision: str | None = None
    task: str
    backend: str | None = None
    compile_backend: str | None = None
    dtype: str | None = None
    cores: int = 1
    parallelism: Parallelism = Parallelism.NONE
    max_new_tokens: int | None = None
    parameters: int | None = Field(
        None, description="Total parameter count of the model as loaded."
    )
    parameters_per_core: int | None = Field(
        None, description="Parameters held by one core (rank 0) after sharding."
    )
    result: Result
    error_class: ErrorClass | None = None
    error: str | None = None
    traceback: str | None = None
    stage: str | None = Field(None, description="Last stage reached.")
    timings: Timings = Field(default_factory=lambda: Timings())
    memory: Memory = Field(default_factory=lambda: Memory())
    prompts: list[str] = Field(default_factory=list)
    tokens: list[list[int]] = Field(default_factory=list)
    text: list[str] = Field(default_factory=list)
    verification: Verification = Field(default_factory=lambda: Verification())
    judge: dict[str, Any] | None = None
    stack: Stack = Field(default_factory=lambda: Stack())
    packages: list[Annotated[str, Field(pattern=PACKAGE_PIN, max_length=300)]] = Field(
        default_factory=list, description="Every installed distribution as name==version."
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None


def new_run_id(model: str, now: datetime | None = None) -> str:
    """A unique, sortable, path-safe run id: UTC timestamp + a random suffix."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}"


class RunRecord(BaseModel):
    """One immutable record in the results store: a result document plus how it came to be."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    document: ResultDocument
    run_py: str = Field(
        ..., description="The exact run.py that ran (or would have run, for EXCLUDED)."
    )
    source: str = Field("cli", description="Who ran it: cli, operator, demo.")
    exclusion_reason: ExclusionReason | None = None
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    labels: dict[str, str] = Field(
        default_factory=dict, description="Free labels (e.g. the CR name, sweep name)."
    )

    def to_json(self) -> str:
        """Serialize to one JSON document."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> RunRecord:
        """Parse a record written by to_json; raises pydantic.ValidationError when malformed."""
        return cls.model_validate_json(text)


def parse_result_line(stdout: str) -> ResultDocument | None:
    """Find the marked result line in run.py's stdout (the last one wins)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return ResultDocument.model_validate(json.loads(line[len(RESULT_MARKER) :]))
    return None
