"""Sweeps: a Hub ranking turned into ModelSupportTest manifests, for GitOps to apply.

A sweep is plain data: one resource per ranked model, named deterministically from the model
id (so re-generating a sweep updates the same resources instead of adding new ones), labelled
with the sweep's name, and validated with the operator's own spec model before it is written.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from model_support.operator.resource import GROUP, VERSION
from model_support.operator.spec import parse_spec
from model_support.rankings import Ranking

KIND = "ModelSupportTest"
LABEL_SWEEP = f"{GROUP}/sweep"
ANNOTATION_MODEL = f"{GROUP}/model"
ANNOTATION_RANK = f"{GROUP}/rank"
_NAME_LIMIT = 63


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


def resource_name(model_id: str) -> str:
    """A DNS-1123 label for a model id: readable slug + a short hash (ids differing only in
    case or punctuation, like Org/Model-1.5 and org/model-1-5, must not collide)."""
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.lower()).strip("-")
    slug = slug[: _NAME_LIMIT - len(digest) - 1].rstrip("-") or "model"
    return f"{slug}-{digest}"


def sweep_manifests(ranking: Ranking, options: SweepOptions) -> list[dict[str, Any]]:
    """One ModelSupportTest per ranked model, in rank order; raises SpecError on a bad option."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", options.name):
        raise ValueError(
            f"sweep name {options.name!r} must be a DNS label (lowercase letters, digits, '-')"
        )
    manifests = []
    for ranked in ranking.models:
        spec: dict[str, Any] = {
            "model": ranked.model_id,
            "task": ranking.task,
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
        parse_spec(spec)  # the operator's own validation: a sweep never holds a test it refuses
        metadata: dict[str, Any] = {
            "name": resource_name(ranked.model_id),
            "labels": {LABEL_SWEEP: options.name},
            "annotations": {ANNOTATION_MODEL: ranked.model_id, ANNOTATION_RANK: str(ranked.rank)},
        }
        if options.namespace:
            metadata["namespace"] = options.namespace
        manifests.append(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}
        )
    return manifests
