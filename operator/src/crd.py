"""The three CustomResourceDefinitions, generated from the operator's models.

``crds/*.yaml`` and the chart's copies are this module's output: the spec and status schemas
come from the pydantic models (:mod:`.spec`, :mod:`.status`, :mod:`.sweep_spec`,
:mod:`.sweep_status`, :mod:`.bisect_spec`, :mod:`.bisect_status`) with the CEL rules kept beside them, the core limits from ``model_support/hardware.py``. Change a model,
then write the files again::

    python -m model_support.operator.crd          # write crds/ and charts/model-support/crds/
    python -m model_support.operator.crd --check  # exit 1 naming each file that differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from model_support.operator.bisect_spec import NAME_RULE as BISECT_NAME_RULE
from model_support.operator.bisect_spec import OWNED_FIELDS as BISECT_OWNED_FIELDS
from model_support.operator.bisect_spec import BisectSpec
from model_support.operator.bisect_status import BisectStatus
from model_support.operator.openapi import CelRule, cel_rule_list, openapi_schema
from model_support.operator.resource import (
    BISECT_KIND,
    BISECT_PLURAL,
    GROUP,
    KIND,
    PLURAL,
    SWEEP_KIND,
    SWEEP_PLURAL,
    VERSION,
)
from model_support.operator.spec import TestSpec, parallelism_rules
from model_support.operator.status import TestStatus
from model_support.operator.sweep_spec import NAME_RULE, OWNED_FIELDS, SweepSpec
from model_support.operator.sweep_status import SweepStatus

FOLDERS = ("crds", "charts/model-support/crds")
"""Where the CRDs are written, relative to the repository's root (the chart keeps a copy so
that ``helm install`` creates them)."""


def _column(name: str, kind: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, **extra, "jsonPath": path}


def _definition(
    *,
    kind: str,
    plural: str,
    short_name: str,
    description: str,
    columns: list[dict[str, Any]],
    spec: dict[str, Any],
    status: dict[str, Any],
    rules: list[CelRule] | None = None,
) -> dict[str, Any]:
    root: dict[str, Any] = {"type": "object", "description": description, "required": ["spec"]}
    if rules:
        root["x-kubernetes-validations"] = cel_rule_list(rules)
    root["properties"] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
        "status": status,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "model-support"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": ["model-support"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_for_tests() -> dict[str, Any]:
    """The ModelSupportTest CRD."""
    return _definition(
        kind=KIND,
        plural=PLURAL,
        short_name="mst",
        description="One test of one Hugging Face model on one instance profile.",
        columns=[
            _column("Model", "string", ".spec.model"),
            _column("Cores", "integer", ".status.cores"),
            _column("Phase", "string", ".status.phase"),
            _column("Result", "string", ".status.result"),
            _column(
                "Wall",
                "number",
                ".status.wallTimeSeconds",
                format="float",
                description="Load + compile + generate, seconds.",
            ),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
        spec=openapi_schema(TestSpec),
        status=openapi_schema(TestStatus, defaults=False),
    )


def crd_for_sweeps() -> dict[str, Any]:
    """The ModelSupportSweep CRD; its template is the test's spec less what a sweep sets."""
    spec = openapi_schema(SweepSpec)
    test_spec = openapi_schema(TestSpec)
    template = spec["properties"]["template"]
    spec["properties"]["template"] = {
        "type": "object",
        "description": template["description"],
        "x-kubernetes-validations": cel_rule_list(parallelism_rules("template.")),
        "default": template["default"],
        "properties": {
            name: field
            for name, field in test_spec["properties"].items()
            if name not in OWNED_FIELDS
        },
    }
    counts = ".status.counts."
    return _definition(
        kind=SWEEP_KIND,
        plural=SWEEP_PLURAL,
        short_name="mss",
        description="A set of ModelSupportTests over a Hub ranking, an explicit list or the "
        "dataset's selected list, on one stack.",
        columns=[
            _column("Source", "string", ".status.source"),
            _column("Models", "integer", counts + "models"),
            _column("Done", "integer", counts + "done"),
            _column("Pass", "integer", counts + "passed"),
            _column("Fail", "integer", counts + "failed"),
            _column("Error", "integer", counts + "errored"),
            _column("Excluded", "integer", counts + "excluded"),
            _column(
                "Regressions",
                "integer",
                counts + "regressions",
                description="Models whose result got worse than under the previous run key, "
                "in every re-run.",
            ),
            _column(
                "Flaky",
                "integer",
                counts + "flaky",
                priority=1,
                description="Models whose worse result a re-run did not repeat.",
            ),
            _column(
                "Cost",
                "number",
                ".status.cost.usd",
                priority=1,
                description="USD the current run's finished tests cost so far.",
            ),
            _column("Running", "integer", counts + "running", priority=1),
            _column("Queued", "integer", counts + "queued", priority=1),
            _column(
                "Ranked",
                "date",
                ".status.lastRankedAt",
                priority=1,
                description="When the models were last ranked.",
            ),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
        spec=spec,
        status=openapi_schema(SweepStatus, defaults=False),
        rules=[NAME_RULE],
    )


def crd_for_bisects() -> dict[str, Any]:
    """The ModelSupportBisect CRD; its template is the test's spec less what a bisect sets."""
    spec = openapi_schema(BisectSpec)
    test_spec = openapi_schema(TestSpec)
    template = spec["properties"]["template"]
    spec["properties"]["template"] = {
        "type": "object",
        "description": template["description"],
        "default": template["default"],
        "properties": {
            name: field
            for name, field in test_spec["properties"].items()
            if name not in BISECT_OWNED_FIELDS
        },
    }
    return _definition(
        kind=BISECT_KIND,
        plural=BISECT_PLURAL,
        short_name="msb",
        description="Which package change broke a model between a good and a bad row of the "
        "results: each changed package bisected over the versions its index lists, each step "
        "a ModelSupportTest.",
        columns=[
            _column("Model", "string", ".spec.model"),
            _column("Phase", "string", ".status.phase"),
            _column(
                "First bad",
                "string",
                ".status.firstBad",
                description="The first bad version of each package that breaks the model.",
            ),
            _column("Good", "string", ".spec.good", priority=1),
            _column("Bad", "string", ".spec.bad", priority=1),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
        spec=spec,
        status=openapi_schema(BisectStatus, defaults=False),
        rules=[BISECT_NAME_RULE],
    )


_HEADERS = {
    PLURAL: "ModelSupportTest: does this Hugging Face model run unmodified on Trainium, on how "
    "many cores?\nReconciled by the model-support operator into a runner Job.",
    SWEEP_PLURAL: "ModelSupportSweep: test these models (a Hub ranking, a list, the selected "
    "list) on this stack.\nReconciled by the model-support operator into owned "
    "ModelSupportTests.",
    BISECT_PLURAL: "ModelSupportBisect: which package change broke this model, down to its "
    "first bad version.\nReconciled by the model-support operator into owned "
    "ModelSupportTests, one per step.",
}
_BUILDERS = {PLURAL: crd_for_tests, SWEEP_PLURAL: crd_for_sweeps, BISECT_PLURAL: crd_for_bisects}


def render(plural: str) -> str:
    """The YAML text of one CRD file (``plural``: modelsupporttests, modelsupportsweeps or
    modelsupportbisects)."""
    header = "".join(f"# {line}\n" for line in _HEADERS[plural].splitlines())
    header += (
        "# Generated by `python -m model_support.operator.crd` from the operator's models "
        "(operator/src);\n# do not edit: change the models and generate it again.\n"
    )
    body = yaml.safe_dump(_BUILDERS[plural](), sort_keys=False, width=100, allow_unicode=True)
    return header + body


def files(root: Path) -> dict[Path, str]:
    """Every CRD file under ``root`` (the repository) and the text generation gives it."""
    return {
        root / folder / f"{plural}.yaml": render(plural)
        for folder in FOLDERS
        for plural in _BUILDERS
    }


def main(argv: list[str] | None = None) -> int:
    """Write the CRD files (or, with --check, name each one that differs and exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository's root")
    parser.add_argument("--check", action="store_true", help="only compare; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in files(args.root).items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        verb = "differs from its models" if args.check else "written"
        print(f"{path.relative_to(args.root)}: {verb}")
    if args.check and stale:
        print("run `python -m model_support.operator.crd` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
