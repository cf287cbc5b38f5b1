"""The ModelSupportBisect's spec as a typed model, and the spec of each step's test.

A bisect names a model (and task), the good and the bad row of it in a results store (each a
stack's name or a run id, as ``model-support bisect --good/--bad`` take them) and how to
search (the packages to consider, the package index, each step's timeout). The search is
``model_support/bisect.py``'s; each step is a ModelSupportTest (``bisect_manifests.py``):

* **its run**: the bad row's run.py, as a test spec (model, revision, task, cores and
  parallelism, dtype, tokens, prompts, compile backend, verification): what the operator renders
  from it is what every step runs (``step_spec``);
* **its environment**: the good row's runner image (its ``image`` label; ``template.image`` or
  the operator's runnerImage when the row names none), with ``extraPackages`` pinning the
  step's versions, installed with ``pip.noDeps`` from the bisect's index so nothing else moves;
* **its place**: ``template`` (profile, scheduling, queue, Hub token ...), whatever a test
  takes but what the bisect sets; the profile defaults to the bad row's (cpu, or its instance
  type's family).

Pure of the cluster: the reconciler (``bisect_reconciler.py``) reads the rows and makes the
API calls.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.config import RunConfig, VerificationConfig
from model_support.operator.openapi import CelRule
from model_support.operator.spec import (
    PROFILES,
    VERIFICATION_FIELDS,
    ModelId,
    PackageIndexUrl,
    ResultsUri,
    SpecError,
    parse_spec,
)
from model_support.records import RunRecord
from model_support.vocabulary import Parallelism, Task

MAX_BISECT_NAME = 40
"""A bisect's name leaves room for a step's package and version in its tests' names."""
NAME_RULE = CelRule(
    rule=f"self.metadata.name.size() <= {MAX_BISECT_NAME}",
    message=f"a bisect's name has at most {MAX_BISECT_NAME} characters (its step tests are "
    "named <bisect>-<package>-<version>-<hash>, at most 63).",
)
"""The API server's rule (CEL) on a bisect's name."""
SIDE_PATTERN = r"^[^\x00-\x1f\x7f]+$"
PACKAGE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
MAX_SUSPECTS = 20
"""A step pins at most this many packages (a test's extraPackages hold 20)."""
OWNED = (
    "model", "revision", "task", "cores", "parallelism", "dtype", "maxNewTokens", "prompts",
    "compileBackend", "verification", "extraPackages", "pip", "results", "timeoutSeconds",
    "epoch",
)  # fmt: skip
OWNED_FIELDS = frozenset(OWNED)
"""Test fields a bisect sets on its steps (from the bad row's run.py and its own spec)."""


class _Camel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PackageName = Annotated[str, Field(min_length=1, max_length=200, pattern=PACKAGE_NAME_PATTERN)]


class IndexSpec(_Camel):
    """Where the versions between the good and the bad one are listed and installed from."""

    indexUrl: PackageIndexUrl | None = Field(
        None,
        description="The package index (pip --index-url); default pip's own configuration "
        "(the operator's to list versions, the runner image's to install them).",
    )
    extraIndexUrls: list[PackageIndexUrl] = Field(
        default_factory=list,
        max_length=5,
        description="More indexes (pip --extra-index-url), e.g. "
        "https://pip.repos.neuron.amazonaws.com for Neuron packages.",
    )


class BisectSpec(_Camel):
    """spec of a ModelSupportBisect; the CRD's schema is generated from it (crd.py)."""

    model: ModelId = Field(..., description="The model as results name it (its model_id).")
    task: Task | None = Field(None, description="The task (when the model has several).")
    good: str = Field(
        ...,
        min_length=1,
        max_length=200,
        pattern=SIDE_PATTERN,
        description="The row it passed on: a stack's label, 'compiler version', a compiler "
        "version, a compiler alone, or a run id of the model.",
    )
    bad: str = Field(
        ...,
        min_length=1,
        max_length=200,
        pattern=SIDE_PATTERN,
        description="The row it broke on, named as good is.",
    )
    results: ResultsUri | None = Field(
        None, description="The results store holding both rows; default the operator's."
    )
    steps: ResultsUri | None = Field(
        None,
        description="The store each step is recorded in (a step is a real run of an "
        "environment no stack is, so it never becomes a stack's row); default "
        "<results>/bisect.",
    )
    packages: list[PackageName] = Field(
        default_factory=list,
        max_length=MAX_SUSPECTS,
        description="Only these packages are suspects (default every package whose recorded "
        f"version differs between the rows; at most {MAX_SUSPECTS}).",
    )
    index: IndexSpec = Field(default_factory=IndexSpec, json_schema_extra={"default": {}})
    timeoutSeconds: int = Field(
        3600,
        ge=60,
        le=172800,
        description="Each step's run.py timeout (its test's timeoutSeconds).",
    )
    maxSteps: int = Field(
        32, ge=1, le=64, description="Steps to run at most (reused steps not counted)."
    )
    template: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields of every step's test (as in a ModelSupportTest's spec, less "
        + ", ".join(OWNED[:-1])
        + f" and {OWNED[-1]}, which the bisect sets): profile (default the bad row's), image "
        "(default the good row's), scheduling, queueName, hubTokenSecret, trustRemoteCode ...",
        json_schema_extra={"default": {}},
    )


def parse_bisect(spec: dict[str, Any]) -> BisectSpec:
    """Validate a bisect's spec; raises SpecError naming each bad field."""
    try:
        bisect = BisectSpec.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecError(
            f"invalid ModelSupportBisect spec: {problems}. Fix the resource and apply it again."
        ) from exc
    owned = sorted(set(bisect.template) & OWNED_FIELDS)
    if owned:
        raise SpecError(
            f"spec.template sets {', '.join(owned)}, which the bisect sets itself (the run from "
            "the bad row's run.py, the packages from the step, the store from spec.steps, the "
            "timeout from spec.timeoutSeconds): remove them from the template"
        )
    try:
        parse_spec({**bisect.template, "model": bisect.model})
    except SpecError as exc:
        raise SpecError(
            "spec.template does not make a valid test: "
            + str(exc).replace("invalid ModelSupportTest spec: ", "").replace("spec.", "template.")
        ) from exc
    return bisect


def profile_of(record: RunRecord) -> str | None:
    """The instance profile a row ran on: cpu off Neuron, else its instance type's family
    (trn2.48xlarge: trn2), when it names one."""
    if record.document.backend == "cpu":
        return "cpu"
    instance = record.document.stack.instance_type
    family = instance.split(".", 1)[0] if instance else None
    return family if family in PROFILES else None


def step_spec(
    bisect: BisectSpec,
    bad: RunRecord,
    image: str | None,
    steps_store: str,
) -> dict[str, Any]:
    """Every step test's spec but its extraPackages: the bad row's run.py as a test (the
    bisect's template under it), the good side's ``image``, recorded in ``steps_store``.
    Raises SpecError when the row cannot be run as a test here."""
    from model_support.script import read_config

    config: RunConfig = read_config(bad.run_py)
    spec = dict(bisect.template)
    if "profile" not in spec:
        profile = profile_of(bad)
        if profile is None:
            raise SpecError(
                f"the bad row ({bad.run_id}) names no instance profile (backend "
                f"{bad.document.backend}, instance {bad.document.stack.instance_type}): set "
                "spec.template.profile"
            )
        spec["profile"] = profile
    if config.trust_remote_code and not spec.get("trustRemoteCode"):
        raise SpecError(
            f"the bad row ({bad.run_id}) ran the model's own code from the Hub "
            "(trust_remote_code): its steps run it too only with spec.template.trustRemoteCode "
            "set to true"
        )
    if image and "image" not in spec:
        spec["image"] = image
    # Only what differs from the defaults: the spec stays short, run.py the same.
    said = config.verification.model_dump(mode="json")
    defaults = VerificationConfig().model_dump(mode="json")
    verification = {
        field: said[name]
        for field, name in {"enabled": "enabled", **VERIFICATION_FIELDS}.items()
        if said[name] != defaults[name]
    }
    spec.update(
        model=config.model,
        task=config.task.value,
        cores=config.cores,
        dtype=config.dtype,
        maxNewTokens=config.max_new_tokens,
        prompts=list(config.prompts),
        results=steps_store,
        timeoutSeconds=bisect.timeoutSeconds,
    )
    if config.revision:
        spec["revision"] = config.revision
    if config.parallelism is not Parallelism.NONE:
        spec["parallelism"] = config.parallelism.value
    if config.compile_backend:
        spec["compileBackend"] = config.compile_backend
    if verification:
        spec["verification"] = verification
    # Only the step's pins move: pip installs them alone, from the bisect's index.
    pip: dict[str, Any] = {"noDeps": True}
    if bisect.index.indexUrl:
        pip["indexUrl"] = bisect.index.indexUrl
    if bisect.index.extraIndexUrls:
        pip["extraIndexUrls"] = list(bisect.index.extraIndexUrls)
    spec["pip"] = pip
    parse_spec({**spec, "extraPackages": ["placeholder==1"]})
    return spec


__all__ = [
    "MAX_BISECT_NAME",
    "NAME_RULE",
    "OWNED_FIELDS",
    "BisectSpec",
    "IndexSpec",
    "parse_bisect",
    "profile_of",
    "step_spec",
]
