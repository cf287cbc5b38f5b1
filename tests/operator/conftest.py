"""Fixtures of the operator tests: kmock with our CRD, the operator in a thread, the kubelet stand-in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import kmock
import pytest
from hubserver import HubServer, Repo
from k8s_harness import MODEL, Emulator, Harness, declare_resources, serve_model_commit

from model_support.operator.settings import OperatorSettings


@pytest.fixture(scope="session")
def operator_hub(tiny_llama_path: Path) -> Iterator[HubServer]:
    """The stand-in Hub the operator sizes from (even a test with spec.cores: its host memory
    and storage are sized from the model)."""
    with HubServer([Repo.from_dir(MODEL, tiny_llama_path)]) as hub:
        serve_model_commit(hub.repos[MODEL].sha("main"))
        yield hub


@pytest.fixture
async def harness(
    tmp_path: Path, operator_hub: HubServer, tiny_llama_path: Path
) -> AsyncIterator[Harness]:
    """An emulated API server, operator settings pointing at it, results under tmp_path."""
    async with Emulator() as server, kmock.Server(server) as srv:
        declare_resources(server)
        settings = OperatorSettings(
            results_uri=str(tmp_path / "results"),
            api_server=str(srv.url).rstrip("/"),
            runner_image="registry.example/model-support/runner:test",
            image_pull_limit_s=0.5,
            watchdog_interval_s=0.2,
            running_write_delay_s=0.2,
            namespaces=["default"],
            metrics_port=None,
            hub_endpoint=operator_hub.url,
            # Checkpoints named by path: the test's own folder and the built fixtures, as an
            # operator mounts its model volumes.
            model_volume_paths=[str(tmp_path), str(tiny_llama_path.parent)],
        )
        h = Harness(server, settings, tmp_path / "results")
        try:
            yield h
        finally:
            await h.stop_operator()
