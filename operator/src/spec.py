"""The ModelSupportTest spec as a typed model, and the RunConfig it renders into run.py.

The CRD schema validates first (the API server applies it); this model validates again because
the operator must never trust what it reads, and because it also runs against emulated API
servers that apply no schema. Field names follow the CRD (camelCase).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from model_support.config import COMPILE_BACKEND_PATTERN, RunConfig, VerificationConfig
from model_support.vocabulary import Backend, Float32Precision, LocalizeMode, Parallelism, Task

ProfileName = Literal["trn2", "trn1", "inf2", "cpu"]


@dataclass(frozen=True)
class Profile:
    """An instance profile: where a test runs and how many cores it may use."""

    name: str
    instance_type: str | None
    neuron: bool
    max_cores: int
    backend: Backend


PROFILES: dict[str, Profile] = {
    # trn2.48xlarge: 64 logical cores at LNC=2 (default), 128 at LNC=1 (see docs/hardware.md).
    "trn2": Profile("trn2", "trn2.48xlarge", True, 64, Backend.NEURON),
    "trn1": Profile("trn1", "trn1.32xlarge", True, 32, Backend.NEURON),
    "inf2": Profile("inf2", "inf2.48xlarge", True, 24, Backend.NEURON),
    "cpu": Profile("cpu", None, False, 128, Backend.CPU),
}


# The same patterns as the CRD's schema (a test keeps them equal): the operator re-checks them.
MODEL_PATTERN = r"^(/[A-Za-z0-9._@+/-]+|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)$"
REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
IMAGE_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$"
PACKAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+!-]+(,[<>=!~]=?[A-Za-z0-9.*+!-]+)*)?$"
# A compile cache location: a Hugging Face storage bucket, an S3 prefix, or an absolute path on
# the operator's compile cache volume. Path components are plain names (no "..", no hidden
# names), so a location can never climb out of where it points.
_CACHE_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
_HF_BUCKET = r"hf://buckets/[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
_S3_BUCKET = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
COMPILE_CACHE_PATTERN = (
    rf"^({_HF_BUCKET}(/{_CACHE_SEGMENT})*|{_S3_BUCKET}(/{_CACHE_SEGMENT})*|(/{_CACHE_SEGMENT})+)/?$"
)
COMPILE_CACHE_FORMS = (
    "hf://buckets/<namespace>/<name>[/<path>], s3://<bucket>[/<prefix>] or an absolute path "
    "on the operator's compile cache volume"
)
# A results store: a URI or an absolute path whose segments are plain names (no ".", "..",
# empty or hidden segments), so that a store under an allowed prefix stays under it.
_RESULTS_SEGMENT = r"[A-Za-z0-9_~@+=,%-][A-Za-z0-9._~@+=,%-]*"
RESULTS_PATTERN = rf"^([a-z][a-z0-9+.-]*://|/){_RESULTS_SEGMENT}(/{_RESULTS_SEGMENT})*/?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SpecError(ValueError):
    """The spec cannot be run as written; the message says which field and what to do.

    ``problems`` is what is wrong alone (``spec.field: why``, joined by "; "), for callers
    that say what to do themselves.
    """

    def __init__(self, message: str, problems: str | None = None) -> None:
        super().__init__(message)
        self.problems = problems or message


class _Camel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class VerificationSpec(_Camel):
    enabled: bool = True
    nearTieMultiple: float | None = Field(None, gt=0)
    nearTieFloor: float | None = Field(None, ge=0)
    maxErrorRatio: float | None = Field(None, gt=0)
    maxQ90Ratio: float | None = Field(None, gt=0)
    maxPeakRatio: float | None = Field(None, gt=0)
    maxKlRatio: float | None = Field(None, gt=0)
    errorFloor: float | None = Field(None, gt=0)
    klFloor: float | None = Field(None, gt=0)
    routerTieMultiple: float | None = Field(None, ge=0)
    routerTieFloor: float | None = Field(None, ge=0)
    routerTieShare: float | None = Field(None, ge=0, le=1)
    float32Precision: Float32Precision | None = None
    localize: LocalizeMode | None = None
    localizeBudgetSeconds: float | None = Field(None, gt=0)


class CompileCacheSpec(_Camel):
    """Where the compile cache is pulled from before run.py and pushed to after it."""

    source: str | None = Field(None, min_length=1, max_length=512)
    target: str | None = Field(None, min_length=1, max_length=512)

    @field_validator("source", "target")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        if value is None or re.fullmatch(COMPILE_CACHE_PATTERN, value):
            return value
        scheme = value.split("://", 1)[0] if "://" in value else None
        if scheme == "hf":
            raise ValueError(
                f"{value!r} is not a Hugging Face storage bucket: compile caches live in "
                "buckets, hf://buckets/<namespace>/<name>[/<path>] (model and dataset "
                "repositories suit neither thousands of small entries nor concurrent pushers)"
            )
        if scheme not in (None, "s3"):
            raise ValueError(
                f"{value!r}: {scheme}:// is not a compile cache store here; use {COMPILE_CACHE_FORMS}"
            )
        if scheme is None and not value.startswith("/"):
            raise ValueError(
                f"{value!r} is a relative path: a runner pod has no working directory of yours; "
                f"use {COMPILE_CACHE_FORMS}"
            )
        bucket = " (S3 bucket names are 3 to 63 lowercase letters, digits, '.' and '-')"
        raise ValueError(
            f"{value!r} is not a valid compile cache location ({COMPILE_CACHE_FORMS}); path "
            "components are letters, digits and . _ + - (no '..', no hidden names)"
            + (bucket if scheme == "s3" else "")
        )

    def local_paths(self) -> list[str]:
        """The locations that are paths on the compile cache volume (not URIs)."""
        return [v for v in (self.source, self.target) if v is not None and "://" not in v]


class SecretRef(_Camel):
    name: str = Field(..., min_length=1, max_length=253)
    key: str = "token"


class Toleration(_Camel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = Field(None, ge=0)


class SchedulingSpec(_Camel):
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    schedulerName: str | None = None
    priorityClassName: str | None = None


class TestSpec(_Camel):
    """spec of a ModelSupportTest (see crds/modelsupporttests.yaml for every field's meaning)."""

    __test__ = False  # not a pytest class, despite the name

    model: str = Field(..., min_length=1, max_length=200, pattern=MODEL_PATTERN)
    revision: str | None = Field(None, min_length=1, max_length=255, pattern=REVISION_PATTERN)
    task: Task = Task.TEXT_GENERATION
    profile: ProfileName = "trn2"
    instanceType: str | None = None
    lnc: Literal[1, 2] | None = None
    cores: int | None = Field(None, ge=1, le=128)
    maxCores: int = Field(16, ge=1, le=128)
    parallelism: Parallelism | None = None
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    maxNewTokens: int = Field(32, ge=1, le=4096)
    prompts: list[str] | None = Field(None, min_length=1, max_length=16)
    compileBackend: str | None = Field(None, max_length=200, pattern=COMPILE_BACKEND_PATTERN)
    verification: VerificationSpec = Field(default_factory=VerificationSpec)
    image: str | None = Field(None, min_length=1, max_length=512, pattern=IMAGE_PATTERN)
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    extraPackages: list[
        Annotated[str, Field(min_length=1, max_length=200, pattern=PACKAGE_PATTERN)]
    ] = Field(default_factory=list, max_length=20)
    timeoutSeconds: int = Field(7200, ge=60, le=172800)
    compileCache: CompileCacheSpec | None = None
    results: str | None = Field(None, min_length=1, max_length=1024, pattern=RESULTS_PATTERN)
    hubTokenSecret: SecretRef | None = None
    trustRemoteCode: bool = False
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    queueName: str | None = Field(None, max_length=63, pattern=DNS_LABEL_PATTERN)
    epoch: int | None = Field(None, ge=0)
    """Changing it re-runs the test (a new generation); nothing else reads it."""

    @model_validator(mode="after")
    def _consistent(self) -> TestSpec:
        profile = PROFILES[self.profile]
        if self.lnc is not None and self.profile != "trn2":
            raise ValueError("lnc (logical NeuronCore config) applies only to the trn2 profile")
        limit = 128 if (self.profile == "trn2" and self.lnc == 1) else profile.max_cores
        if self.cores is not None and self.cores > limit:
            raise ValueError(
                f"cores={self.cores} exceeds the {limit} cores of profile {self.profile}"
            )
        if self.parallelism not in (None, Parallelism.NONE) and self.cores is None:
            raise ValueError(
                "parallelism can only be set together with cores (sizing chooses both otherwise)"
            )
        if (
            self.cores is not None
            and self.cores > 1
            and self.parallelism in (None, Parallelism.NONE)
        ):
            raise ValueError(f"cores={self.cores} needs parallelism tensor or expert")
        return self

    def untrusted_code(self, default_image: str) -> list[str]:
        """What in this test runs code the project does not control (empty: none does).

        Such a test may still run, but never writes where others read and trust: it cannot
        push to a compile cache, and its record says what it ran.
        """
        reasons = []
        if self.trustRemoteCode:
            reasons.append("trustRemoteCode")
        if self.extraPackages:
            reasons.append("extraPackages")
        if self.compileBackend is not None and ":" in self.compileBackend:
            reasons.append("compileBackend")  # module:function; a plain name is torch's own
        if self.image is not None and self.image != default_image:
            reasons.append("image")
        return reasons

    @property
    def profile_info(self) -> Profile:
        """The instance profile this test runs on."""
        return PROFILES[self.profile]

    def run_config(self, cores: int, parallelism: Parallelism) -> RunConfig:
        """The RunConfig rendered into run.py for the chosen number of cores."""
        overrides = {
            name: value
            for name, value in {
                "near_tie_multiple": self.verification.nearTieMultiple,
                "near_tie_floor": self.verification.nearTieFloor,
                "max_error_ratio": self.verification.maxErrorRatio,
                "max_q90_ratio": self.verification.maxQ90Ratio,
                "max_peak_ratio": self.verification.maxPeakRatio,
                "max_kl_ratio": self.verification.maxKlRatio,
                "error_floor": self.verification.errorFloor,
                "kl_floor": self.verification.klFloor,
                "router_tie_multiple": self.verification.routerTieMultiple,
                "router_tie_floor": self.verification.routerTieFloor,
                "router_tie_share": self.verification.routerTieShare,
                "float32_precision": self.verification.float32Precision,
                "localize": self.verification.localize,
                "localize_budget_s": self.verification.localizeBudgetSeconds,
            }.items()
            if value is not None
        }
        kwargs: dict[str, Any] = {}
        if self.prompts is not None:
            kwargs["prompts"] = list(self.prompts)
        return RunConfig(
            model=self.model,
            revision=self.revision,
            task=self.task,
            backend=self.profile_info.backend,
            compile_backend=self.compileBackend,
            dtype=self.dtype,
            max_new_tokens=self.maxNewTokens,
            trust_remote_code=self.trustRemoteCode,
            cores=cores,
            parallelism=parallelism,
            verification=VerificationConfig(enabled=self.verification.enabled, **overrides),
            **kwargs,
        )


def parse_spec(spec: dict[str, Any]) -> TestSpec:
    """Validate a CR spec; raises SpecError naming each bad field."""
    try:
        return TestSpec.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecError(
            f"invalid ModelSupportTest spec: {problems}. Fix the resource and apply it again.",
            problems,
        ) from exc
