"""`model-support render`: what the operator would create for a ModelSupportTest, as YAML."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.cli.common import fail

EXIT_LAUNCH = 0
EXIT_NO_JOB = 3  # the test would end without a Job (Invalid, EXCLUDED, ERROR/load)


def _load_yaml(path: Path, what: str) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except OSError as exc:
        raise fail(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise fail(
            f"{what} {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}): save it as UTF-8, as Kubernetes and Helm read it"
        ) from exc
    except yaml.YAMLError as exc:
        raise fail(f"{what} {path} is not valid YAML: {exc}") from exc


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (run.py) as literal blocks, readable in a review."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


class _Metadata(BaseModel):
    """The metadata render reads, typed as the API server types it (it refuses other types)."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = Field(None, ge=1)


def _problems(exc: ValidationError, prefix: str | None = None) -> str:
    """Each problem of ``exc`` as ``field.path: what is wrong``, joined by "; "."""
    return "; ".join(
        f"{'.'.join([*([prefix] if prefix else []), *(str(p) for p in e['loc'])])}: "
        + ("Input should be a mapping" if e["type"] == "model_type" else e["msg"])
        for e in exc.errors()
    )


def _check_manifest(test: dict[str, Any], index: int, file: Path) -> None:
    """Refuse a manifest the API server would refuse before the operator sees it: metadata
    or spec that is not a mapping, metadata fields of the wrong type."""
    from model_support.operator.resource import KIND

    where = f"{file}, {KIND} #{index + 1}"
    for part in ("metadata", "spec"):
        if test.get(part) is not None and not isinstance(test[part], dict):
            raise fail(
                f"{where}: {part} is a {type(test[part]).__name__}; it must be a mapping "
                f"({part}: followed by indented fields)"
            )
    try:
        _Metadata.model_validate(test.get("metadata") or {})
    except ValidationError as exc:
        raise fail(
            f"{where}: {_problems(exc, 'metadata')}; the API server would refuse it: fix the "
            "manifest"
        ) from exc


def _uid(namespace: str, name: str) -> str:
    """A stable stand-in uid (the API server assigns the real one; child names carry it)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"modelsupport.dev/{namespace}/{name}"))


def render_test(
    body: dict[str, Any], settings: Any, *, namespace: str, token: str | None
) -> tuple[list[dict[str, Any]], bool]:
    """The objects the operator would create for ``body`` (program ConfigMap, Job), or the test
    itself with the status it would record instead; True when a Job would be created.

    Runs the operator's own planning steps (``planning.plan``) and, for a test that ends
    without a Job, the operator's own lifecycle move (``lifecycle.step``), so whatever the
    operator checks or writes, render shows.
    """
    from model_support.operator import planning
    from model_support.operator.lifecycle import Excluded, FailedBeforeRun, SpecInvalid, step
    from model_support.operator.manifests import TestRef
    from model_support.operator.resource import run_id_for
    from model_support.operator.status import TestStatus
    from model_support.vocabulary import ErrorClass, Result

    meta = body.get("metadata") or {}
    name = meta.get("name") or "unnamed"
    ns = meta.get("namespace") or namespace
    ref = TestRef(ns, name, meta.get("uid") or _uid(ns, name), int(meta.get("generation") or 1))
    planned = planning.plan(dict(body.get("spec") or {}), settings, ns, token=lambda _: token)
    if isinstance(planned, planning.Unreachable):
        raise fail(f"{planned.message}; the operator would retry this (the Hub did not answer)")
    if isinstance(planned, planning.Launch):
        configmap, job = planning.children(ref, planned.spec, planned.placement, settings)
        template = planning.claim_template(ref, planned.spec, planned.placement, settings)
        return [configmap, *([template] if template is not None else []), job], True
    run_id = run_id_for(ref.uid, ref.generation, 0)  # a generation that ends at sizing
    event: SpecInvalid | FailedBeforeRun | Excluded
    if isinstance(planned, planning.Invalid):
        event = SpecInvalid(planned.message)
    elif isinstance(planned, planning.Unreadable):
        event = FailedBeforeRun(
            run_id, Result.ERROR, ErrorClass.LOAD, planned.message, "LoadFailed"
        )
    else:
        event = Excluded(run_id, planned.exclusion.reason, planned.exclusion.message)
    move = step(TestStatus(), ref.generation, event)
    assert move is not None  # a new generation takes every outcome of planning
    status = move.patch.applied_to(TestStatus())
    test = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": name, "namespace": ns},
        # The conditions and the finish time are the operator's moment, not the review's.
        "status": status.model_dump(
            mode="json", exclude_none=True, exclude={"conditions", "finishedAt"}
        ),
    }
    return [test], False


def register(app: typer.Typer) -> None:
    """Add the `render` command to the CLI."""

    @app.command("render")
    def render(
        file: Annotated[
            Path,
            typer.Option("--file", "-f", help="ModelSupportTest manifest(s) (YAML, one or more)."),
        ],
        values: Annotated[
            Path | None,
            typer.Option(
                "--values", help="Helm values of the chart (what the operator runs with)."
            ),
        ] = None,
        results: Annotated[
            str, typer.Option("--results", help="The results store, when no --values give one.")
        ] = "results",
        namespace: Annotated[
            str, typer.Option("--namespace", "-n", help="Namespace of tests that name none.")
        ] = "default",
    ) -> None:
        """Print the Job (and, with DRA, the ResourceClaimTemplate) the operator would create for
        each test (sizing included), run.py's program ConfigMap once per namespace, or the
        status it would record instead; exit 3 if any would get no Job."""
        from model_support.operator.resource import API_VERSION, KIND
        from model_support.operator.settings import OperatorSettings, settings_from_values

        try:
            if values is not None:
                loaded = _load_yaml(values, "values file")
                if loaded and not isinstance(loaded[0], dict):
                    raise fail(
                        f"values file {values} holds a {type(loaded[0]).__name__}; it must be "
                        "a mapping of chart values (as the chart's values.yaml)"
                    )
                settings = settings_from_values(loaded[0] if loaded else {})
            else:
                settings = OperatorSettings(results_uri=results)
        except ValidationError as exc:
            raise fail(f"the values do not make valid operator settings: {_problems(exc)}") from exc
        except ValueError as exc:
            raise fail(str(exc)) from exc
        tests = [d for d in _load_yaml(file, "file") if isinstance(d, dict)]
        tests = [d for d in tests if d.get("kind") == KIND]
        if not tests:
            raise fail(f"{file} holds no {KIND} (apiVersion {API_VERSION})")
        for index, test in enumerate(tests):
            _check_manifest(test, index, file)
            if test.get("apiVersion") != API_VERSION:
                raise fail(
                    f"{(test.get('metadata') or {}).get('name')}: apiVersion "
                    f"{test.get('apiVersion')!r}, expected {API_VERSION}"
                )
        documents: list[dict[str, Any]] = []
        all_launch = True
        token = os.environ.get("HF_TOKEN")
        for test in tests:
            objects, launches = render_test(test, settings, namespace=namespace, token=token)
            documents.extend(o for o in objects if o not in documents)  # a namespace's program once
            all_launch = all_launch and launches
        sys.stdout.write(
            "# What the model-support operator would create (names carry the test's uid: the\n"
            "# API server assigns it; set metadata.uid to render exact names).\n"
        )
        sys.stdout.write(yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=120))
        raise typer.Exit(EXIT_LAUNCH if all_launch else EXIT_NO_JOB)
