"""The ModelSupportTest spec as a typed model, and the RunConfig it renders into run.py.

The CRD schema validates first (the API server applies it); this model validates again because
the operator must never trust what it reads, and because it also runs against emulated API
servers that apply no schema. Field names follow the CRD (camelCase).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from model_support import hardware
from model_support.config import COMPILE_BACKEND_PATTERN, RunConfig, VerificationConfig
from model_support.operator.openapi import CelRule, Int64, cel_rules
from model_support.vocabulary import Backend, Float32Precision, LocalizeMode, Parallelism, Task

ProfileName = Literal["trn2", "trn3", "trn1", "inf2", "cpu"]


@dataclass(frozen=True)
class Profile:
    """An instance profile: where a test runs and how many cores it may use."""

    name: str
    instance_type: str | None
    neuron: bool
    max_cores: int
    """Cores of one instance at the profile's default LNC (what a test may use without lnc)."""
    backend: Backend


def _profile(name: str) -> Profile:
    if name == "cpu":  # a CPU node: one "core" per worker process, as many as any profile has
        return Profile("cpu", None, False, hardware.MAX_CORES, Backend.CPU)
    figures = hardware.get_profile(name)
    return Profile(name, figures.instance_type, True, figures.cores_per_instance, Backend.NEURON)


PROFILES: dict[str, Profile] = {name: _profile(name) for name in get_args(ProfileName)}
"""The profiles a test may name; their figures come from model_support/hardware.py."""


LNC_VALUES: tuple[int, ...] = tuple(sorted({v for c in hardware.LNC_CHOICES.values() for v in c}))
"""Every LNC setting a test may name (which profile takes which: hardware.LNC_CHOICES)."""


def core_limit(profile: str, lnc: int | None) -> int:
    """The most cores a test on ``profile`` at ``lnc`` (None: the default) may use."""
    if profile in hardware.LNC_CHOICES:
        return hardware.get_profile(profile, lnc).cores_per_instance
    return PROFILES[profile].max_cores


def _article(word: str | None) -> str:
    return "an" if (word or "x")[0] in "aeio" else "a"


def _lnc_is_not(lnc: str, value: int, default: int) -> str:
    """CEL: the effective LNC (``lnc``, else ``default``) is not ``value``."""
    if value == default:
        return f"(has({lnc}) && {lnc} != {value})"
    return f"(!has({lnc}) || {lnc} != {value})"


def profile_rules(*, profile: str, lnc: str, cores: str, name: str = "") -> list[CelRule]:
    """The API server's rules (CEL) that tie ``lnc`` and ``cores`` to the profile, derived
    from the hardware table. ``profile``, ``lnc`` and ``cores`` are the fields as CEL reaches
    them from where the rules sit; ``name`` prefixes the field names in messages."""
    with_lnc = sorted(hardware.LNC_CHOICES)
    only = " or ".join(f"the {kind} profile" for kind in with_lnc)
    allowed = " || ".join(f"{profile} == '{kind}'" for kind in with_lnc)
    rules = [
        CelRule(
            rule=f"!has({lnc}) || {allowed}",
            message=f"{name}lnc (logical NeuronCore config) applies only to {only}.",
        )
    ]
    for kind, info in PROFILES.items():
        if not info.neuron:
            continue
        choices = hardware.LNC_CHOICES.get(kind)
        if choices is None:
            limit = core_limit(kind, None)
            rules.append(
                CelRule(
                    rule=f"!has({cores}) || {profile} != '{kind}' || {cores} <= {limit}",
                    message=f"{_article(info.instance_type)} {info.instance_type} has {limit} "
                    f"NeuronCores; "
                    f"{name}cores must be <= {limit}.",
                )
            )
            continue
        default = hardware.DEFAULT_LNC[kind]
        for value in choices:
            limit = core_limit(kind, value)
            if limit >= hardware.MAX_CORES:
                continue  # the schema's maximum says it
            larger = [
                f"set {name}lnc to {other} for up to {core_limit(kind, other)}"
                for other in choices
                if core_limit(kind, other) > limit
            ]
            rules.append(
                CelRule(
                    rule=f"!has({cores}) || {profile} != '{kind}' || "
                    f"{_lnc_is_not(lnc, value, default)} || {cores} <= {limit}",
                    message=f"{_article(info.instance_type)} {info.instance_type} has {limit} "
                    "logical NeuronCores at "
                    f"LNC={value}; {name}cores must be <= {limit}"
                    + (f" (or {', '.join(larger)})" if larger else "")
                    + ".",
                )
            )
    return rules


def parallelism_rules(name: str = "") -> list[CelRule]:
    """The API server's rules (CEL) that tie ``parallelism`` to ``cores`` on one object."""
    return [
        CelRule(
            rule="!has(self.parallelism) || self.parallelism == 'none' || has(self.cores)",
            message=f"{name}parallelism can only be set together with {name}cores "
            "(otherwise sizing chooses both).",
        ),
        CelRule(
            rule="!has(self.cores) || self.cores == 1 || "
            "(has(self.parallelism) && self.parallelism != 'none')",
            message=f"more than one core{f' ({name}cores)' if name else ''} needs "
            f"{name}parallelism tensor or expert.",
        ),
    ]


# Patterns of the spec's fields: the CRD's schema is generated from the models below (crd.py).
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
PACKAGE_INDEX_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+/-]*)?$"
"""A package index URL: http(s), a host, a path; no user info (a password in a spec is in clear)
and no query."""
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
INSTANCE_TYPE_PATTERN = r"^[a-z0-9][a-z0-9.-]*$"


ModelId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=MODEL_PATTERN,
        description="Hub model id (org/name), or an absolute path of a checkpoint inside the "
        "runner image / its volumes.",
    ),
]
Revision = Annotated[
    str,
    Field(
        min_length=1,
        max_length=255,
        pattern=REVISION_PATTERN,
        description="Hub revision (branch, tag or commit). Default main.",
    ),
]
ResultsUri = Annotated[str, Field(min_length=1, max_length=1024, pattern=RESULTS_PATTERN)]
"""A results store: a URI, or an absolute path of plain names."""
PROFILE_DESCRIPTION = (
    "Instance profile the test sizes for and runs on. cpu runs the same run.py on a CPU node "
    "(no Neuron resources)."
)


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
    """How run.py's verdict compares the device's output with the CPU reference
    (docs/verification.md gives each bound's meaning and default)."""

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
    float32Precision: Float32Precision | None = Field(
        None,
        description="Arithmetic a float32 run's baseline reproduces (auto = neuron ieee unless "
        "NEURON_CC_FLAGS auto-casts, cuda tf32, cpu ieee).",
    )
    localize: LocalizeMode | None = Field(
        None,
        description="When to search the first module whose compiled output diverges "
        "(on_fail = on a FAIL).",
    )
    localizeBudgetSeconds: float | None = Field(
        None,
        gt=0,
        description="Seconds that search may take before it records what it found so far.",
    )


VERIFICATION_FIELDS = {
    "nearTieMultiple": "near_tie_multiple",
    "nearTieFloor": "near_tie_floor",
    "maxErrorRatio": "max_error_ratio",
    "maxQ90Ratio": "max_q90_ratio",
    "maxPeakRatio": "max_peak_ratio",
    "maxKlRatio": "max_kl_ratio",
    "errorFloor": "error_floor",
    "klFloor": "kl_floor",
    "routerTieMultiple": "router_tie_multiple",
    "routerTieFloor": "router_tie_floor",
    "routerTieShare": "router_tie_share",
    "float32Precision": "float32_precision",
    "localize": "localize",
    "localizeBudgetSeconds": "localize_budget_s",
}
"""Each field of :class:`VerificationSpec` but ``enabled`` -> the VerificationConfig field it
sets (None in the spec: the config's default)."""


class CompileCacheSpec(_Camel):
    """Where the compile cache is pulled from before run.py and pushed to after it."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            [
                CelRule(
                    rule="has(self.source) || has(self.target)",
                    message="compileCache needs a source, a target, or both.",
                ),
                *(
                    CelRule(
                        rule=f"!has(self.{end}) || self.{end}.startsWith('hf://buckets/') || "
                        f"self.{end}.startsWith('s3://') || self.{end}.startsWith('/')",
                        message=f"compileCache.{end} must be {COMPILE_CACHE_FORMS} "
                        "(compileCacheVolumeClaim).",
                    )
                    for end in ("source", "target")
                ),
            ]
        )
    )

    source: str | None = Field(
        None, min_length=1, max_length=512, json_schema_extra={"pattern": COMPILE_CACHE_PATTERN}
    )
    target: str | None = Field(
        None, min_length=1, max_length=512, json_schema_extra={"pattern": COMPILE_CACHE_PATTERN}
    )

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


class SecretRef(_Camel):
    name: str = Field(..., min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    key: str = Field("token", max_length=253, pattern=SECRET_KEY_PATTERN)


class Toleration(_Camel):
    key: str | None = Field(None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = Field(None, ge=0)


PackageIndexUrl = Annotated[str, Field(min_length=1, max_length=512, pattern=PACKAGE_INDEX_PATTERN)]
"""A package index (pip's ``--index-url``): http(s), without user info or query."""


class PipSpec(_Camel):
    """How extraPackages are installed (pip's options)."""

    indexUrl: PackageIndexUrl | None = Field(
        None, description="The package index (pip --index-url); default the image's pip's."
    )
    extraIndexUrls: list[PackageIndexUrl] = Field(
        default_factory=list, max_length=5, description="More indexes (pip --extra-index-url)."
    )
    noDeps: bool = Field(
        False,
        description="Install only the packages named, none of their dependencies (pip "
        "--no-deps): nothing else in the image moves (a bisect step's pins).",
    )

    def args(self) -> list[str]:
        """pip install's options for this spec."""
        args = ["--index-url", self.indexUrl] if self.indexUrl else []
        for url in self.extraIndexUrls:
            args += ["--extra-index-url", url]
        return args + (["--no-deps"] if self.noDeps else [])


class SchedulingSpec(_Camel):
    nodeSelector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=20
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=20)
    schedulerName: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_NAME_PATTERN,
        description="e.g. my-scheduler (the Neuron scheduler extension) for contiguous "
        "multi-core placement.",
    )
    priorityClassName: str | None = Field(None, max_length=253, pattern=DNS_NAME_PATTERN)


class TestSpec(_Camel):
    """spec of a ModelSupportTest; the CRD's schema is generated from it (crd.py)."""

    __test__ = False  # not a pytest class, despite the name
    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            [
                *profile_rules(profile="self.profile", lnc="self.lnc", cores="self.cores"),
                *parallelism_rules(),
            ]
        )
    )

    model: ModelId
    revision: Revision | None = None
    task: Task = Task.TEXT_GENERATION
    profile: ProfileName = Field("trn2", description=PROFILE_DESCRIPTION)
    instanceType: str | None = Field(
        None,
        max_length=63,
        pattern=INSTANCE_TYPE_PATTERN,
        description="Node instance type (node.kubernetes.io/instance-type); default from the "
        "profile.",
    )
    lnc: int | None = Field(
        None,
        description="Logical NeuronCore config (trn2 and trn3 only). Default "
        f"{hardware.DEFAULT_LNC['trn2']}.",
        json_schema_extra={"enum": list(LNC_VALUES)},
    )
    cores: int | None = Field(
        None,
        ge=1,
        le=hardware.MAX_CORES,
        description="NeuronCores to use; overrides sizing. Omit to size from the checkpoint.",
    )
    maxCores: int = Field(
        16,
        ge=1,
        le=hardware.MAX_CORES,
        description="Largest number of cores sizing may choose (larger models are EXCLUDED "
        "too-large).",
    )
    parallelism: Parallelism | None = None
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    maxNewTokens: int = Field(32, ge=1, le=4096)
    prompts: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None, min_length=1, max_length=16
    )
    compileBackend: str | None = Field(
        None,
        max_length=200,
        pattern=COMPILE_BACKEND_PATTERN,
        description="torch.compile backend (a registered name or module:function). Default "
        "neuron on Trainium, inductor elsewhere.",
    )
    verification: VerificationSpec = Field(default_factory=VerificationSpec)
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Runner image; default from the operator's settings.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    extraPackages: list[
        Annotated[str, Field(min_length=1, max_length=200, pattern=PACKAGE_PATTERN)]
    ] = Field(
        default_factory=list,
        max_length=20,
        description="pip requirements installed (into a separate directory) before run.py starts.",
    )
    pip: PipSpec = Field(
        default_factory=PipSpec,
        description="How extraPackages are installed: the index, --no-deps.",
    )
    timeoutSeconds: int = Field(
        7200,
        ge=60,
        le=172800,
        description="activeDeadlineSeconds of the runner Job; past it the result is TIMEOUT.",
    )
    compileCache: CompileCacheSpec | None = Field(
        None,
        description="Compile cache (NEFF on Trainium, inductor's on the cpu profile): pulled "
        "from source before run.py and pushed to target after it, whatever its outcome, under "
        "the installed compiler's prefix (neuronxcc-<version> / inductor-torch-<version>). A "
        "cache failure is recorded beside the result and never changes it. Each is "
        f"{COMPILE_CACHE_FORMS} (compileCacheVolumeClaim).",
    )
    results: ResultsUri | None = Field(
        None, description="Results store URI for this test's record; default the operator's."
    )
    hubTokenSecret: SecretRef | None = Field(
        None,
        description="Secret holding a Hugging Face token (gated models); passed to the runner "
        "as HF_TOKEN.",
    )
    trustRemoteCode: bool = False
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    queueName: str | None = Field(
        None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Kueue LocalQueue; the Job is created suspended with "
        "kueue.x-k8s.io/queue-name.",
    )
    epoch: Int64 | None = Field(
        None,
        ge=0,
        description="Any number; changing it runs the test again (a new generation) with "
        "nothing else changed. A sweep sets its own spec.epoch here.",
    )

    @field_validator("lnc")
    @classmethod
    def _lnc_choice(cls, value: int | None) -> int | None:
        if value is not None and value not in LNC_VALUES:
            raise ValueError(f"lnc must be one of {', '.join(map(str, LNC_VALUES))}, not {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TestSpec:
        if self.lnc is not None and self.profile not in hardware.LNC_CHOICES:
            raise ValueError(
                "lnc (logical NeuronCore config) applies only to the "
                + " or ".join(f"{kind} profile" for kind in sorted(hardware.LNC_CHOICES))
            )
        limit = core_limit(self.profile, self.lnc)
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
            for field, name in VERIFICATION_FIELDS.items()
            if (value := getattr(self.verification, field)) is not None
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
