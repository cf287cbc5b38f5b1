"""The ModelSupportTests a sweep creates, and the patch that re-runs one.

* **names**: a sweep's test for a model is ``<sweep>-<model slug>-<8 hex of sha256(model id)>``
  (at most 63 characters, a DNS label): the same model always gets the same test, whatever its
  rank, and ids that differ only in case or punctuation get different tests;
* **re-runs**: a worse result's re-runs are tests of their own, named after the test with
  ``-r1``, ``-r2`` ... (``sweep_confirmation.py``);
* **ownership**: the sweep is the controller of its tests (deleting the sweep deletes them);
  only the operator's own labels and annotations are set on them.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from model_support.operator.resource import (
    ANNOTATION_CONFIRMS,
    ANNOTATION_MODEL,
    ANNOTATION_SWEEP_RUN,
    API_VERSION,
    LABEL_SWEEP,
    SWEEP_KIND,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.sweep_spec import (
    MAX_SWEEP_NAME,
    SweepModel,
    SweepSpec,
    child_spec,
    image_of,
)

MAX_NAME = 63
"""A Kubernetes name (a DNS label) holds at most this many characters."""
_NAMES_KEPT = 1 << 16
"""Test names kept once computed (a sha256 and a regex each): every pass of a sweep names each
of its ranked models' tests, and a pass follows every test that finishes."""


@functools.lru_cache(maxsize=_NAMES_KEPT)
def child_name(sweep: str, model_id: str, profile: str | None = None) -> str:
    """The name of a sweep's test for ``model_id``: stable, unique per sweep, a DNS label.

    ``profile`` is part of the name for flat sweeps (two profiles are two sets of resources);
    a ModelSupportSweep's tests keep their names when the stack changes (a new generation).
    Kept once made: every pass of a sweep looks up each ranked model's test by this name.
    """
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:8]
    prefix = f"{sweep}-{profile}-" if profile else f"{sweep}-"
    room = MAX_NAME - len(prefix) - len(digest) - 1
    if room < 1:
        raise ValueError(
            f"sweep name {sweep!r} is too long for its tests' names; use at most "
            f"{MAX_SWEEP_NAME} characters"
        )
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.lower()).strip("-")[:room].strip("-") or "model"
    return f"{prefix}{slug}-{digest}"


@functools.lru_cache(maxsize=_NAMES_KEPT)
def rerun_name(sweep: str, model_id: str, number: int) -> str:
    """The name of re-run ``number`` (from 1) of a sweep's test for ``model_id``: the test's
    name (its slug shortened to make room) with ``-r<number>``. Never another model's test
    name: those end in 8 hex digits."""
    suffix = f"-r{number}"
    first = child_name(sweep, model_id)
    if len(first) + len(suffix) <= MAX_NAME:
        return first + suffix
    digest = first.rsplit("-", 1)[1]
    head = first[: MAX_NAME - len(suffix) - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}{suffix}"


def owner_reference(sweep: dict[str, Any]) -> dict[str, Any]:
    """The sweep as the controller of its tests (deleting the sweep deletes them)."""
    meta = sweep["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": SWEEP_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_child(
    sweep: dict[str, Any],
    spec: SweepSpec,
    entry: SweepModel,
    key: str,
    settings: OperatorSettings,
    rerun: int | None = None,
) -> dict[str, Any]:
    """The ModelSupportTest a sweep creates for one model (``rerun``: its re-run with that
    number, the same spec, annotated with the name of the test it repeats).

    Only our own labels and annotations: copying the sweep's (e.g. Argo CD's tracking label
    app.kubernetes.io/instance) would make GitOps tools take the test for theirs and prune it.
    """
    meta = sweep["metadata"]
    annotations = {ANNOTATION_MODEL: entry.model, ANNOTATION_SWEEP_RUN: key}
    name = child_name(meta["name"], entry.model)
    if rerun is not None:
        annotations[ANNOTATION_CONFIRMS] = name
        name = rerun_name(meta["name"], entry.model, rerun)
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelSupportTest",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {LABEL_SWEEP: meta["name"]},
            "annotations": annotations,
            "ownerReferences": [owner_reference(sweep)],
        },
        "spec": child_spec(spec, entry, image=image_of(spec, settings)),
    }


def rerun_patch(
    spec: SweepSpec,
    entry: SweepModel,
    key: str,
    settings: OperatorSettings,
    current_fields: set[str],
) -> dict[str, Any]:
    """A merge patch that makes a finished test a new generation under run key ``key``
    (fields the new spec no longer has are removed)."""
    new = child_spec(spec, entry, image=image_of(spec, settings))
    removed = dict.fromkeys(current_fields - set(new))
    return {"metadata": {"annotations": {ANNOTATION_SWEEP_RUN: key}}, "spec": {**removed, **new}}
