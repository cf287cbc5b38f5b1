"""The ModelSupportTests a bisect creates: one per step it runs.

* **names**: ``<bisect>-<package>-<version>-<8 hex>`` of the environment and the run.py's
  sha256 (at most 63 characters, a DNS label): the same step of the same bisect is always the
  same test, so a replayed reconcile meets 409 instead of running the step twice, and a new
  generation whose steps run another run.py never takes an earlier generation's test;
* **ownership**: the bisect is the controller of its step tests (deleting it deletes them;
  their records stay in the steps' store); only the operator's labels and annotations are set.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from model_support.bisect import Request, Step, environment_key
from model_support.operator.resource import (
    ANNOTATION_BISECT_STEP,
    API_VERSION,
    BISECT_KIND,
    KIND,
    LABEL_BISECT,
)
from model_support.operator.sweep_manifests import MAX_NAME


def step_name(bisect: str, request: Request | Step, run_script_sha256: str) -> str:
    """The name of the test that runs ``request``'s environment with the run.py of that
    sha256 for bisect ``bisect``."""
    identity = f"{environment_key(request.pins)}\n{run_script_sha256}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    room = MAX_NAME - len(bisect) - len(digest) - 2
    slug = re.sub(r"[^a-z0-9]+", "-", f"{request.package}-{request.version}".lower())
    slug = slug.strip("-")[:room].strip("-") or "step"
    return f"{bisect}-{slug}-{digest}"


def owner_reference(bisect: dict[str, Any]) -> dict[str, Any]:
    """The bisect as the controller of its step tests."""
    meta = bisect["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": BISECT_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def step_pins(request: Request, good: dict[str, str], pin_all: bool) -> list[str]:
    """The step's extraPackages: the versions it moves away from the good side (every
    suspect's version with ``pin_all``, when the image may not hold the good side's)."""
    return [
        f"{name}=={version}"
        for name, version in sorted(request.pins.items())
        if pin_all or good.get(name) != version
    ]


def build_step(
    bisect: dict[str, Any],
    request: Request,
    spec: dict[str, Any],
    pins: list[str],
    run_script_sha256: str,
) -> dict[str, Any]:
    """The ModelSupportTest of one step: ``spec`` (``bisect_spec.step_spec``, whose run.py has
    that sha256) with ``pins`` as its extraPackages."""
    meta = bisect["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": step_name(meta["name"], request, run_script_sha256),
            "namespace": meta["namespace"],
            "labels": {LABEL_BISECT: meta["name"]},
            "annotations": {
                ANNOTATION_BISECT_STEP: f"{run_script_sha256} {environment_key(request.pins)}"
            },
            "ownerReferences": [owner_reference(bisect)],
        },
        "spec": {**spec, "extraPackages": pins},
    }


def bisect_owner(test: dict[str, Any]) -> str | None:
    """The uid of the bisect that controls ``test``, or None."""
    for ref in (test.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == BISECT_KIND and ref.get("controller"):
            return str(ref.get("uid"))
    return None


__all__ = ["bisect_owner", "build_step", "owner_reference", "step_name", "step_pins"]
