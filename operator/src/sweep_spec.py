"""The ModelSupportSweep's spec as a typed model, and what it means: which tests it makes.

Pure of the cluster (the reconciler in ``sweep_reconciler.py`` does the API calls; its status is
in ``sweep_status.py``, the tests it creates in ``sweep_manifests.py``). What lives here decides
the sweep's semantics:

* **run key**: a hash of ``spec.epoch`` and the stack (image, profile, compiler and library
  versions). A test whose run key is the sweep's current one is not run again; a new run key
  re-runs each test once (a new generation of the same test), never while it is running;
* **source key**: a hash of the source and the run key: when it changes the sweep ranks again;
* **a test's spec**: the template, then what the sweep sets itself (model, revision and task
  from the source, image and profile from the stack, queue from the concurrency, the epoch);
  an entry whose test the API server would refuse is skipped, with why.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from model_support.operator.openapi import CelRule, Int64, cel_rules
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import (
    DNS_LABEL_PATTERN,
    IMAGE_PATTERN,
    PROFILE_DESCRIPTION,
    ModelId,
    ProfileName,
    ResultsUri,
    Revision,
    SpecError,
    parse_spec,
    profile_rules,
)
from model_support.vocabulary import CONFIRMING_RERUNS, MAX_CONFIRMING_RERUNS, Task

MAX_SWEEP_NAME = 40
"""A sweep's name leaves room for a readable model slug in its tests' 63-character names."""
NAME_RULE = CelRule(
    rule=f"self.metadata.name.size() <= {MAX_SWEEP_NAME}",
    message=f"a sweep's name has at most {MAX_SWEEP_NAME} characters (its tests are named "
    "<sweep>-<model>-<hash>, at most 63).",
)
"""The API server's rule (CEL) on a sweep's name."""
MAX_SWEEP_MODELS = 1000
"""A sweep tests at most this many models (a list's length, a ranking's limit)."""
HUB_SORTS = {"trending": "trending_score", "downloads": "downloads", "likes": "likes"}
"""The sweep's sort names and the Hub's sort keys."""
LIBRARY_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$"
OWNED = ("model", "revision", "task", "profile", "image", "queueName", "epoch")
OWNED_FIELDS = frozenset(OWNED)
"""Test fields a sweep sets itself (from its source, stack, concurrency and epoch)."""


class _Camel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListedModel(_Camel):
    """One model of an explicit list."""

    model: ModelId
    revision: Revision | None = None
    task: Task = Task.TEXT_GENERATION


class HubSource(_Camel):
    """A Hub ranking: the top ``limit`` models of ``task`` by ``sort``."""

    sort: Literal["trending", "downloads", "likes"] = "trending"
    task: Task = Task.TEXT_GENERATION
    limit: int = Field(50, ge=1, le=MAX_SWEEP_MODELS, description="How many of the top models.")
    library: str | None = Field(
        None,
        max_length=63,
        pattern=LIBRARY_PATTERN,
        description="Only models of this library (e.g. transformers).",
    )
    refreshSeconds: int | None = Field(
        None,
        ge=1,
        description="Rank again this often (the operator's sweepMinRefreshSeconds is the "
        "floor). Models that enter are tested; models that leave keep their tests. Omit to rank "
        "once per run.",
    )


class SelectedSource(_Camel):
    """The dataset's selected list (``selected.yaml`` of a results store)."""

    results: ResultsUri | None = Field(
        None, description="Results store holding selected.yaml; default the operator's."
    )
    refreshSeconds: int | None = Field(
        None,
        ge=1,
        description="Read the list again this often (the operator's sweepMinRefreshSeconds is "
        "the floor).",
    )


class Source(_Camel):
    """Exactly one of: an explicit list, a Hub ranking, the selected list."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            [
                CelRule(
                    rule="(has(self.models) ? 1 : 0) + (has(self.hub) ? 1 : 0) + "
                    "(has(self.selected) ? 1 : 0) == 1",
                    message="give exactly one source, models (a list), hub (a ranking) or "
                    "selected (the dataset's selected list).",
                )
            ]
        )
    )

    models: list[ListedModel] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SWEEP_MODELS,
        description="An explicit list, in this order.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["model"],
        },
    )
    hub: HubSource | None = Field(
        None,
        description="The Hub's ranking of one task, fetched when the sweep starts a run (a new "
        "epoch or stack) and every refreshSeconds.",
    )
    selected: SelectedSource | None = Field(
        None,
        description="The models of the dataset's selected list (selected.yaml at the results "
        "store's root) that are not left out on purpose.",
    )

    @model_validator(mode="after")
    def _one(self) -> Source:
        given = [k for k in ("models", "hub", "selected") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one source: models (a list), hub (a ranking) or selected "
                f"(the dataset's selected list); got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def refresh_seconds(self) -> int | None:
        """How often the source is ranked again while the sweep runs (None: per run key)."""
        if self.hub is not None:
            return self.hub.refreshSeconds
        if self.selected is not None:
            return self.selected.refreshSeconds
        return None


class Stack(_Camel):
    """What is tested on: a new stack (any field) tests every model again."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Runner image of every test (it holds the compiler and library); default "
        "the operator's runnerImage (an upgrade of it is a new stack).",
    )
    profile: ProfileName = Field("trn2", description=PROFILE_DESCRIPTION)
    compilerVersion: str | None = Field(
        None,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="The neuronx-cc version the image holds (part of the stack's identity; "
        "records carry the version that ran).",
    )
    libraryVersion: str | None = Field(
        None,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="The torch-neuronx version the image holds (part of the stack's identity; "
        "records carry the version that ran).",
    )


class Concurrency(_Camel):
    """How many of the sweep's tests may be unfinished at once, and their Kueue queue."""

    maxRunning: int = Field(
        8,
        ge=1,
        le=MAX_SWEEP_MODELS,
        description="At most this many of the sweep's tests unfinished at once (whatever their "
        "phase); the rest wait in the sweep (counts.queued).",
    )
    queueName: str | None = Field(
        None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Kueue LocalQueue of every test's Job.",
    )


class Confirm(_Camel):
    """How a regression is confirmed before the sweep counts and reports it."""

    reruns: int = Field(
        CONFIRMING_RERUNS,
        ge=0,
        le=MAX_CONFIRMING_RERUNS,
        description="Re-runs of a test whose result got worse than the previous run key's, "
        "each a test of its own (<test>-r1, -r2 ...) recorded as its own run; only a worse "
        "result every re-run repeats is a regression, and runs that disagree make the model "
        f"flaky (default {CONFIRMING_RERUNS}, as model-support regressions --reruns). 0: one "
        "run decides.",
    )


class SweepSpec(_Camel):
    """spec of a ModelSupportSweep; the CRD's schema is generated from it (crd.py), its
    template's from the test's spec."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            profile_rules(
                profile="self.stack.profile",
                lnc="self.template.lnc",
                cores="self.template.cores",
                name="template.",
            )
        )
    )

    source: Source = Field(
        ...,
        description="Which models the sweep tests, best ranked first. Exactly one of models, "
        "hub, selected.",
    )
    stack: Stack = Field(
        default_factory=Stack,
        description="What is tested on. A change of any field (or of spec.epoch) tests every "
        "model again, each once, never stopping a test that runs.",
        json_schema_extra={"default": {}},
    )
    template: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields of every test (as in a ModelSupportTest's spec, less "
        + ", ".join(OWNED[:-1])
        + f" and {OWNED[-1]}, which the sweep sets). A change applies to tests made or re-run afterwards; it "
        "re-runs nothing by itself.",
        json_schema_extra={"default": {}},
    )
    concurrency: Concurrency = Field(default_factory=Concurrency, json_schema_extra={"default": {}})
    confirm: Confirm = Field(
        default_factory=Confirm,
        description="Regressions against the previous run key are re-run before they count.",
        json_schema_extra={"default": {}},
    )
    epoch: Int64 = Field(
        0,
        ge=0,
        description="Change it (e.g. to the date) to test every model again on the same stack; "
        "earlier results stay in the dataset.",
    )


class SweepModel(BaseModel):
    """One model a sweep tests (an entry of its ranking)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    revision: str | None = None
    task: Task = Task.TEXT_GENERATION


PLACEHOLDER_MODEL = "org/placeholder"
"""A model id every rule admits: a sweep's shared settings are checked with it alone."""
MAX_SKIP_REASON = 512
"""A skipped model's reason is cut to this many characters (the status stays small)."""


class SkippedModel(BaseModel):
    """A ranked model the sweep makes no test of, and why: the API server would refuse its
    test (the CRD's schema and rules, generated from the operator's spec model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    reason: str = Field(..., max_length=MAX_SKIP_REASON)


def refusal(spec: dict[str, Any]) -> str | None:
    """What the API server would refuse in a test with ``spec`` (``spec.field: why``; the
    CRD is generated from the operator's spec model), or None when it would admit it."""
    try:
        parse_spec(spec)
    except SpecError as exc:
        return exc.problems[:MAX_SKIP_REASON]
    return None


def parse_sweep(spec: dict[str, Any]) -> SweepSpec:
    """Validate a sweep's spec, its template included (as the tests it makes would be
    validated); raises SpecError naming each bad field."""
    try:
        sweep = SweepSpec.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecError(
            f"invalid ModelSupportSweep spec: {problems}. Fix the resource and apply it again."
        ) from exc
    owned = sorted(set(sweep.template) & OWNED_FIELDS)
    if owned:
        raise SpecError(
            f"spec.template sets {', '.join(owned)}, which the sweep sets itself (model, "
            "revision and task from spec.source; image and profile from spec.stack; queueName "
            "from spec.concurrency; epoch from spec.epoch): remove them from the template"
        )
    try:
        parse_spec(child_spec(sweep, SweepModel(model=PLACEHOLDER_MODEL), image=None))
    except SpecError as exc:
        raise SpecError(
            "spec.template and spec.stack do not make a valid test: "
            + str(exc).replace("invalid ModelSupportTest spec: ", "").replace("spec.", "template.")
        ) from exc
    return sweep


def image_of(sweep: SweepSpec, settings: OperatorSettings) -> str:
    """The runner image of the sweep's tests (its stack's, else the operator's)."""
    return sweep.stack.image or settings.runner_image


def stack_of(sweep: SweepSpec, settings: OperatorSettings) -> dict[str, str]:
    """The stack as recorded with a ranking snapshot (only the fields that are set)."""
    stack = {"image": image_of(sweep, settings), "profile": sweep.stack.profile}
    for key in ("compilerVersion", "libraryVersion"):
        value = getattr(sweep.stack, key)
        if value:
            stack[key] = value
    return stack


def _digest(data: Any, size: int = 16) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:size]


def run_key(sweep: SweepSpec, settings: OperatorSettings) -> str:
    """The epoch + stack key: a test made under another key is run again (once).

    The operator's default runner image counts when the stack names none, so upgrading it
    re-tests the sweeps that follow it.
    """
    return _digest({"epoch": sweep.epoch, "stack": stack_of(sweep, settings)})


def source_key(sweep: SweepSpec, key: str) -> str:
    """Changes when the source (its refresh interval aside) or the run key changes."""
    source = sweep.source.model_dump(mode="json", exclude_none=True)
    for kind in ("hub", "selected"):
        if kind in source:
            source[kind].pop("refreshSeconds", None)
    return _digest({"source": source, "run": key})


def describe_source(sweep: SweepSpec) -> str:
    """The source in a few words (the Source printer column)."""
    source = sweep.source
    if source.hub is not None:
        text = f"hub:{source.hub.sort}/{source.hub.task.value}/top{source.hub.limit}"
        return text + (f"/{source.hub.library}" if source.hub.library else "")
    if source.models is not None:
        return f"models:{len(source.models)}"
    return "selected"


def child_spec(sweep: SweepSpec, entry: SweepModel, *, image: str | None) -> dict[str, Any]:
    """The spec of the test of ``entry``: the template, then what the sweep sets itself."""
    spec = dict(sweep.template)
    spec.update(model=entry.model, task=entry.task.value, profile=sweep.stack.profile)
    if entry.revision:
        spec["revision"] = entry.revision
    if image:
        spec["image"] = image
    if sweep.concurrency.queueName:
        spec["queueName"] = sweep.concurrency.queueName
    spec["epoch"] = sweep.epoch
    return spec


def admitted(
    sweep: SweepSpec,
    entries: list[SweepModel],
    image: str | None,
    settings: OperatorSettings | None = None,
) -> tuple[list[SweepModel], list[SkippedModel]]:
    """The entries whose tests the API server would admit, in order, and the others with
    why: one model's refused test (an id from a Hub ranking that the CRD's pattern refuses)
    never blocks the models after it. With ``settings``, an entry the operator would refuse
    as a test (a checkpoint path off its model volumes, e.g. from a selected list) is skipped
    the same way."""
    from model_support.operator.planning import InvalidTest, check_model_path

    kept: list[SweepModel] = []
    skipped: list[SkippedModel] = []
    for entry in entries:
        spec = child_spec(sweep, entry, image=image)
        reason = refusal(spec)
        if reason is None and settings is not None:
            try:
                check_model_path(parse_spec(spec), settings)
            except InvalidTest as exc:
                reason = str(exc)[:MAX_SKIP_REASON]
        if reason is None:
            kept.append(entry)
        else:
            skipped.append(SkippedModel(model=entry.model, reason=reason))
    return kept, skipped
