"""RunConfig: the parameters of one test, exactly what is rendered into run.py's config block."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from model_support.tasks import TASK_SPECS
from model_support.vocabulary import (
    SHARDABLE_TASKS,
    Backend,
    Float32Precision,
    LocalizeMode,
    Parallelism,
    Task,
)

Dtype = Literal["bfloat16", "float16", "float32"]


class VerificationConfig(BaseModel):
    """Thresholds of the verdict (see images/runner/run.py, verdict(), and docs/verification.md).

    Defaults come from the fault-injection suite (tests/runner/test_fault_injection.py).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    near_tie_multiple: float = Field(
        3.0,
        gt=0,
        description="A mismatch is a near-tie if the reference margin is within this multiple of the dtype baseline's deviation.",
    )
    near_tie_floor: float = Field(
        0.02,
        ge=0,
        description="Smallest near-tie margin (nats), for dtypes whose baseline deviation is ~0.",
    )
    max_error_ratio: float = Field(
        3.0,
        gt=0,
        description="FAIL when the median over positions of the device's logit error is more than this multiple of the baseline's.",
    )
    max_q90_ratio: float = Field(
        3.5,
        gt=0,
        description="FAIL when the 90th percentile over positions of the logit error is more than this multiple of the baseline's.",
    )
    max_peak_ratio: float = Field(
        4.0,
        gt=0,
        description="FAIL when the largest logit error over positions is more than this multiple of the baseline's.",
    )
    max_kl_ratio: float = Field(
        10.0,
        gt=0,
        description="FAIL when the mean whole-vocabulary KL divergence from the reference is more than this multiple of the baseline's.",
    )
    error_floor: float = Field(
        1e-3,
        gt=0,
        description="Smallest baseline logit error (nats) used as a ratio's denominator.",
    )
    kl_floor: float = Field(
        1e-6,
        gt=0,
        description="Smallest baseline KL divergence (nats) used as the KL ratio's denominator.",
    )
    relative_error_floor: float = Field(
        1e-5,
        gt=0,
        description="Smallest baseline error used as a ratio's denominator for the relative measures of embeddings (angle, length) and latents: about float32's own rounding, so strict float32 runs are held to it.",
    )
    router_tie_multiple: float = Field(
        3.0,
        ge=0,
        description="A mixture-of-experts router decision is a near-tie (either expert is correct) when the reference's top-k gap is within this multiple of the baseline's router-logit deviation.",
    )
    router_tie_floor: float = Field(
        1e-4,
        ge=0,
        description="Smallest router gap (logits) counted as a near-tie, for baselines without deviation.",
    )
    router_tie_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Largest share of a prompt's positions excused from the q90, peak and kl checks as router near-ties.",
    )
    localize: LocalizeMode = Field(
        LocalizeMode.ON_FAIL,
        description="When to search the first module whose compiled output diverges from the reference (first_divergence): on_fail, always (any verdict) or never.",
    )
    localize_budget_s: float = Field(
        600.0,
        gt=0,
        description="Seconds the search for the first diverging module may take before it stops and records what it found so far.",
    )
    float32_precision: Float32Precision = Field(
        Float32Precision.AUTO,
        description="Arithmetic a float32 run's baseline reproduces: ieee (strict), tf32 or bf16 matmul operands with float32 accumulation; auto = the backend's (neuron: ieee unless NEURON_CC_FLAGS asks for auto-casting; cuda tf32; cpu ieee).",
    )


MAX_RUN_CORES = 128
"""The most cores one run may be sharded over (a run.py config's ``cores``)."""
COMPILE_BACKEND_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_]*)?$"
"""A torch.compile backend name, or module:function naming one (the CRDs use the same)."""


class RunConfig(BaseModel):
    """Everything run.py needs. JSON-encoded into its config block; nothing else varies."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        ..., min_length=1, description="Hub model id (org/name) or a local checkpoint path."
    )
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit); None = main."
    )
    task: Task = Task.TEXT_GENERATION
    backend: Backend = Backend.AUTO
    compile_backend: str | None = Field(
        None,
        description="torch.compile backend: a registered name or 'module:function'. None = 'neuron' on Trainium, 'inductor' elsewhere.",
    )
    dtype: Dtype = "bfloat16"
    max_new_tokens: int = Field(32, ge=1, le=4096)
    prompts: list[str] = Field(
        default_factory=list,
        description="Prompts generated from as one batch; empty = the task's defaults.",
    )
    trust_remote_code: bool = False
    cores: int = Field(1, ge=1, le=MAX_RUN_CORES)
    parallelism: Parallelism = Parallelism.NONE
    verification: VerificationConfig = Field(default_factory=VerificationConfig)
    result_path: str = "result.json"
    judge_model: str | None = Field(
        None,
        description="Optional local path of a small judge model (fluency verdict, recorded beside the real one).",
    )
    worker_timeout_s: float = Field(
        1800.0, gt=0, description="Longest a sharded run waits for any worker."
    )
    denoising_steps: int = Field(
        4,
        ge=1,
        le=1000,
        description="text-to-image: denoising steps of the pipeline call (the denoiser runs compiled at each).",
    )

    @field_validator("prompts")
    @classmethod
    def _prompts_not_blank(cls, prompts: list[str]) -> list[str]:
        if any(not p.strip() for p in prompts):
            raise ValueError("prompts must not be blank")
        return prompts

    @model_validator(mode="after")
    def _task_defaults(self) -> RunConfig:
        # The stored run.py must hold the exact prompts that ran, so defaults are filled in here.
        spec = TASK_SPECS[self.task]
        if not self.prompts:
            self.prompts = list(spec.default_prompts)
        if spec.prompt_choices is not None:
            unknown = [p for p in self.prompts if p not in spec.prompt_choices]
            if unknown:
                raise ValueError(
                    f"a prompt of {self.task.value} is {spec.inputs}; unknown: "
                    f"{', '.join(map(repr, unknown))}; choose from {', '.join(spec.prompt_choices)}"
                )
        if self.cores > 1 and self.task not in SHARDABLE_TASKS:
            raise ValueError(
                f"{self.task.value} runs on one core; sharding over cores is supported for "
                f"{', '.join(sorted(t.value for t in SHARDABLE_TASKS))}"
            )
        if self.cores == 1 and self.parallelism != Parallelism.NONE:
            raise ValueError("parallelism must be 'none' on one core")
        if self.cores > 1 and self.parallelism == Parallelism.NONE:
            raise ValueError("a run on more than one core needs parallelism 'tensor' or 'expert'")
        return self
