"""`model-support operator`: run the Kubernetes operator (kopf) for ModelSupportTest resources."""

from __future__ import annotations

import logging
from typing import Annotated

import typer


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
            str,
            typer.Option(
                "--results", envvar="MODEL_SUPPORT_RESULTS", help="Default results store URI."
            ),
        ] = "results",
        runner_image: Annotated[
            str | None,
            typer.Option(
                "--runner-image", envvar="MODEL_SUPPORT_RUNNER_IMAGE", help="Default runner image."
            ),
        ] = None,
        liveness: Annotated[
            str | None,
            typer.Option("--liveness", help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz."),
        ] = None,
        metrics_port: Annotated[
            int, typer.Option("--metrics-port", help="Prometheus /metrics port.")
        ] = 9090,
        no_metrics: Annotated[bool, typer.Option("--no-metrics", help="Serve no metrics.")] = False,
        unschedulable_limit: Annotated[
            float,
            typer.Option(
                "--unschedulable-limit", help="Seconds a runner pod may stay unschedulable."
            ),
        ] = 1800.0,
        image_pull_limit: Annotated[
            float,
            typer.Option(
                "--image-pull-limit", help="Seconds a runner image pull may keep failing."
            ),
        ] = 600.0,
        max_attempts: Annotated[
            int, typer.Option("--max-attempts", help="Attempts per test after node loss.")
        ] = 3,
        min_host_memory: Annotated[
            float,
            typer.Option(
                "--min-host-memory",
                help="Smallest host memory (GiB) a runner pod requests; sizing asks more for big models.",
            ),
        ] = 16.0,
        verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    ) -> None:
        """Reconcile ModelSupportTest resources into runner Jobs and record their results."""
        from pydantic import ValidationError

        from model_support.operator.runtime import run_operator
        from model_support.operator.settings import OperatorSettings

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO)
        extra = {"runner_image": runner_image} if runner_image else {}
        try:
            settings = OperatorSettings(
                results_uri=results,
                namespaces=list(namespace or []),
                all_namespaces=all_namespaces,
                metrics_port=None if no_metrics else metrics_port,
                unschedulable_limit_s=unschedulable_limit,
                image_pull_limit_s=image_pull_limit,
                max_attempts=max_attempts,
                min_host_memory_gib=min_host_memory,
                **extra,
            )
            run_operator(settings, liveness=liveness)
        except (ValidationError, ValueError) as exc:
            raise typer.BadParameter(str(exc)) from exc
