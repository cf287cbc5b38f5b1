"""Prometheus metrics of the operator (served on /metrics by the `model-support operator` command)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

TESTS = Counter(
    "model_support_tests_total",
    "Tests recorded by the operator, by result and error class (or exclusion reason).",
    ["result", "detail"],
)
WALL_SECONDS = Histogram(
    "model_support_test_wall_seconds",
    "Load + compile + generate time of recorded tests (seconds).",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
JOBS_CREATED = Counter(
    "model_support_jobs_created_total", "Runner Jobs created (retries included)."
)
RETRIES = Counter(
    "model_support_node_loss_retries_total", "Runner Jobs re-created after their node was lost."
)
STATUS_CONFLICTS = Counter(
    "model_support_status_conflicts_total",
    "Test status writes refused with 409 (the test changed since it was read); each is read again.",
)
