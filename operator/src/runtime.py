"""Running the operator: kopf's event loop, the liveness endpoint and the metrics server."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging

import kopf
from prometheus_client import start_http_server

from model_support.operator.handlers import build_registry
from model_support.operator.memory import give_freed_memory_back
from model_support.operator.settings import OperatorSettings

log = logging.getLogger(__name__)

LOADED_AT_STARTUP = (
    "pandas",  # pyarrow imports it at its first conversion of Python lists (the materializer)
    "pyarrow.dataset",  # the stack metrics' first read of the matrix
    "model_support.evidence",  # these three: the release metrics' first round
    "model_support.history",
    "model_support.pricing",
    "model_support.rankings",  # a sweep's first ranking
)
"""Modules the operator would otherwise import in the middle of its first burst of work."""

YOUNG_GENERATION_THRESHOLD = 5_000
"""Allocations between two collections of the youngest generation (CPython's default: 700).
20,000 kept cycles alive longer: the 1,000-test benchmark's peak rose by about 55 MiB."""


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
    for module in LOADED_AT_STARTUP:
        # At startup, not in the first burst (a fifth of a second of the first materializer
        # pass), and frozen out of the collector's view with the rest of what lives forever.
        importlib.import_module(module)
    collect_garbage_less_often()
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=settings.all_namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=liveness,
        )
    )


def collect_garbage_less_often() -> None:
    """Spare the operator most of the cyclic garbage collector's passes.

    Every watch event, Hub answer and API response makes thousands of short-lived containers,
    and CPython's default threshold (700 allocations) then runs a young-generation pass many
    times per event: a twentieth of the operator's CPU in a 1,000-model sweep. The objects the
    operator holds for its life (modules, settings, the registry) are moved out of the
    collector's view once (``gc.freeze``), and the young generation is collected after
    ``YOUNG_GENERATION_THRESHOLD`` allocations. Reference counting still frees everything not
    in a cycle at once; cycles wait a little longer (see the gc module's documentation).
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
