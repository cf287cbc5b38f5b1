"""Sweeps: a Hub ranking turned into ModelSupportTest manifests, for GitOps to apply.

A sweep is plain data for users without the ModelSupportSweep CRD: one resource per ranked
model, named ``<sweep>-<profile>-<model slug>-<hash>`` (two sweeps, or two profiles, never write
the same resource; re-generating a sweep updates the same resources instead of adding new ones),
sorted by name and without the rank (a re-ranking changes only what entered or left), labelled
with the sweep's name, and validated with the operator's own spec model before it is written.

Each resource says it must not be pruned (Argo CD's ``Prune=false`` sync option, Flux's
``kustomize.toolkit.fluxcd.io/prune: disabled``): a model that drops out of the ranking leaves
the generated file, but its test (and a Job still running) stays until someone deletes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from model_support.operator.resource import (
    ANNOTATION_MODEL,
    API_VERSION,
    KIND,
    LABEL_SWEEP,
)
from model_support.operator.spec import parse_spec
from model_support.operator.sweep_manifests import child_name
from model_support.operator.sweep_spec import (
    MAX_SWEEP_NAME,
    PLACEHOLDER_MODEL,
    SkippedModel,
    refusal,
)
from model_support.rankings import Ranking

PRUNE_SAFE = {
    "argocd.argoproj.io/sync-options": "Prune=false",
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
}
"""Annotations that keep Argo CD and Flux from deleting a test that left the generated file."""


@dataclass(frozen=True)
class SweepOptions:
    """What every test of a sweep shares."""

    name: str
    profile: str = "trn2"
    namespace: str | None = None
    token_secret: str | None = None
    compile_cache_source: str | None = None
    compile_cache_target: str | None = None
    results: str | None = None
    queue_name: str | None = None
    max_cores: int = 16


@dataclass(frozen=True)
class FlatSweep:
    """The tests of a sweep, sorted by name, and the ranked models left out with why."""

    manifests: list[dict[str, Any]]
    skipped: list[SkippedModel]


def sweep_manifests(ranking: Ranking, options: SweepOptions) -> FlatSweep:
    """One ModelSupportTest per ranked model, sorted by name; a model whose test the API
    server would refuse is skipped (with why) and never blocks the others. Raises SpecError
    on a bad option (it would refuse every test) and ValueError on a bad sweep name."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", options.name):
        raise ValueError(
            f"sweep name {options.name!r} must be a DNS label (lowercase letters, digits, '-')"
        )
    if len(options.name) > MAX_SWEEP_NAME:
        raise ValueError(
            f"sweep name {options.name!r} has {len(options.name)} characters; use at most "
            f"{MAX_SWEEP_NAME} (its tests are named <sweep>-<profile>-<model>-<hash>, at most 63)"
        )
    parse_spec(_spec(PLACEHOLDER_MODEL, ranking.task, options))  # the options alone
    manifests = []
    skipped = []
    for ranked in ranking.models:
        spec = _spec(ranked.model_id, ranking.task, options)
        reason = refusal(spec)  # the operator's own validation, per model
        if reason is None and ranked.model_id.startswith("/"):
            # The CRD admits checkpoint paths, which the operator then sizes from its model
            # volumes; a Hub ranking names Hub models only, so a path there is never meant.
            reason = (
                f"spec.model: {ranked.model_id!r} is a path, not a Hub model id; a ranking's "
                "paths are never tested (name checkpoints on a model volume in a test or a "
                "sweep's list)"
            )
        if reason is not None:
            skipped.append(SkippedModel(model=ranked.model_id, reason=reason))
            continue
        metadata: dict[str, Any] = {
            "name": child_name(options.name, ranked.model_id, options.profile),
            "labels": {LABEL_SWEEP: options.name},
            "annotations": {ANNOTATION_MODEL: ranked.model_id, **PRUNE_SAFE},
        }
        if options.namespace:
            metadata["namespace"] = options.namespace
        manifests.append(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
        )
    return FlatSweep(sorted(manifests, key=lambda m: str(m["metadata"]["name"])), skipped)


def _spec(model: str, task: str, options: SweepOptions) -> dict[str, Any]:
    """The spec of the sweep's test of ``model``."""
    spec: dict[str, Any] = {
        "model": model,
        "task": task,
        "profile": options.profile,
        "maxCores": options.max_cores,
    }
    if options.token_secret:
        spec["hubTokenSecret"] = {"name": options.token_secret}
    if options.compile_cache_source or options.compile_cache_target:
        spec["compileCache"] = {
            key: value
            for key, value in (
                ("source", options.compile_cache_source),
                ("target", options.compile_cache_target),
            )
            if value
        }
    if options.results:
        spec["results"] = options.results
    if options.queue_name:
        spec["queueName"] = options.queue_name
    return spec
