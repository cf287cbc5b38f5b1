"""Fixtures of the operator tests: kmock with our CRD, the operator in a thread, the kubelet stand-in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from k8s_harness import Emulator, Harness, declare_resources

from model_support.operator.settings import OperatorSettings


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """An emulated API server, operator settings pointing at it, results under tmp_path."""
    async with Emulator() as server, kmock.Server(server) as srv:
        declare_resources(server)
        settings = OperatorSettings(
            results_uri=str(tmp_path / "results"),
            api_server=str(srv.url).rstrip("/"),
            runner_image="registry.example/model-support/runner:test",
            image_pull_limit_s=0.5,
            watchdog_interval_s=0.2,
            namespaces=["default"],
            metrics_port=None,
        )
        h = Harness(server, settings, tmp_path / "results")
        try:
            yield h
        finally:
            await h.stop_operator()
