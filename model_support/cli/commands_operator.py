"""`model-support operator`: run the Kubernetes operator (kopf) for ModelSupportTest resources."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

QUIET_LOGGERS = ("httpx", "httpx2", "kopf.objects")
"""Loggers the operator keeps at WARNING unless --verbose: the Hub client's request lines and
kopf's per-event "handler succeeded"."""


def register(app: typer.Typer) -> None:
    """Add the `operator` command to the CLI."""

    @app.command("operator")
    def operator_command(
        namespace: Annotated[
            list[str] | None,
            typer.Option("--namespace", "-n", help="Namespace to watch (repeatable)."),
        ] = None,
        all_namespaces: Annotated[
            bool, typer.Option("--all-namespaces", "-A", help="Watch every namespace.")
        ] = False,
        results: Annotated[
            str | None,
            typer.Option(
                "--results", envvar="MODEL_SUPPORT_RESULTS", help="Default results store URI."
            ),
        ] = None,
        runner_image: Annotated[
            str | None,
            typer.Option(
                "--runner-image", envvar="MODEL_SUPPORT_RUNNER_IMAGE", help="Default runner image."
            ),
        ] = None,
        settings_json: Annotated[
            str,
            typer.Option(
                "--settings",
                envvar="MODEL_SUPPORT_SETTINGS",
                help="Every setting as one JSON object with camelCase keys (what the Helm chart "
                "passes); the options here override it.",
            ),
        ] = "",
        liveness: Annotated[
            str | None,
            typer.Option("--liveness", help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz."),
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option("--metrics-port", help="Prometheus /metrics port (9090).")
        ] = None,
        no_metrics: Annotated[bool, typer.Option("--no-metrics", help="Serve no metrics.")] = False,
        unschedulable_limit: Annotated[
            float | None,
            typer.Option(
                "--unschedulable-limit",
                help="Seconds a runner pod may stay unschedulable before the test is recorded "
                "ERROR/infrastructure (default: wait for capacity, phase Queued).",
            ),
        ] = None,
        image_pull_limit: Annotated[
            float | None,
            typer.Option(
                "--image-pull-limit", help="Seconds a runner image pull may keep failing (600)."
            ),
        ] = None,
        max_attempts: Annotated[
            int | None,
            typer.Option("--max-attempts", help="Attempts per test after node loss (3)."),
        ] = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    ) -> None:
        """Reconcile ModelSupportTest resources into runner Jobs and record their results."""
        from pydantic import ValidationError

        from model_support.operator.runtime import run_operator
        from model_support.operator.settings import settings_from_json

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO)
        if not verbose:
            # A line per Hub request and per handled event is thousands a sweep, written by
            # every handler thread through one lock; their warnings and errors still show.
            for chatty in QUIET_LOGGERS:
                logging.getLogger(chatty).setLevel(logging.WARNING)
        overrides: dict[str, object] = {
            key: value
            for key, value in {
                "results_uri": results,
                "runner_image": runner_image,
                "unschedulable_limit_s": unschedulable_limit,
                "image_pull_limit_s": image_pull_limit,
                "max_attempts": max_attempts,
                "metrics_port": metrics_port,
            }.items()
            if value is not None
        }
        if namespace:
            overrides |= {"namespaces": list(namespace), "all_namespaces": False}
        if all_namespaces:
            overrides |= {"all_namespaces": True}
        if no_metrics:
            overrides["metrics_port"] = None
        if results is None and "resultsUri" not in settings_json:
            overrides["results_uri"] = "results"  # a folder here, as `model-support run` uses
        try:
            settings = settings_from_json(settings_json, **overrides)
            run_operator(settings, liveness=liveness)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise typer.BadParameter(f"invalid operator settings: {problems}") from exc
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
