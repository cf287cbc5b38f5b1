"""Running the operator: kopf's event loop, the liveness endpoint and the metrics server."""

from __future__ import annotations

import asyncio
import logging

import kopf
from prometheus_client import start_http_server

from model_support.operator.handlers import build_registry
from model_support.operator.memory import give_freed_memory_back
from model_support.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def run_operator(settings: OperatorSettings, *, liveness: str | None = None) -> None:
    """Run until interrupted: reconcile ModelSupportTests in the configured namespaces.

    ``liveness`` is kopf's liveness endpoint (e.g. ``http://0.0.0.0:8080/healthz``).
    """
    if not settings.all_namespaces and not settings.namespaces:
        raise ValueError("give --namespace (one or more) or --all-namespaces")
    if settings.all_namespaces and settings.namespaces:
        raise ValueError("--namespace and --all-namespaces exclude each other; give one of them")
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port)
        log.info("metrics on :%d/metrics", settings.metrics_port)
    give_freed_memory_back()  # before any burst: its peak, not its history, stays
    registry = build_registry(settings)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=settings.all_namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=liveness,
        )
    )
