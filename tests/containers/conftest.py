"""Fixtures of the container tests: the Docker engine, the project's images, S3 and Hub stand-ins,
and a cluster made of kmock plus the Docker kubelet stand-in.

All container tests run in one xdist group (one worker): they share the engine and the images,
and a second worker building or running containers at the same time would only fight over the
two cores.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import kmock
import pytest
import yaml
from cluster import S3, TINY_LLAMA_REPO, Cluster
from container_images import REPO, Images, build_images
from docker_engine import DockerEngine, DockerUnavailable
from hubserver import HubServer, Repo
from k8s_harness import Emulator, Harness, declare_resources
from kubelet import Node
from moto.server import ThreadedMotoServer

from model_support.operator.settings import OperatorSettings

ARTIFACTS = REPO / "test-artifacts"


# tryfirst: pytest-xdist's own hook turns the mark into the group it schedules by, so the
# mark must be there before it runs (a plain conftest hook runs after it: no group at all).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("containers"))


# ----------------------------------------------------------------------------- session-wide


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A Docker engine: the one that answers, else ``dockerd`` started for this session."""
    engine = DockerEngine()
    try:
        client = engine.acquire()
    except DockerUnavailable as exc:
        unavailable = str(exc)
    else:
        unavailable = ""
    if unavailable:  # never skipped: a machine without Docker fails, saying how to get it
        pytest.fail(unavailable, pytrace=False)
    try:
        yield client
    finally:
        client.close()
        engine.release()


@pytest.fixture(scope="session")
def images(docker_client: docker.DockerClient) -> Images:
    """The local base, runner and operator images (built once per machine and content)."""
    log: list[str] = []
    started = time.monotonic()
    built = build_images(docker_client, log)
    log.append(f"images ready in {time.monotonic() - started:.0f} s")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "container-images.txt").write_text("\n".join(log) + "\n")
    return built


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3(f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hub(tiny_llama_path: Path) -> Iterator[HubServer]:
    """The Hub stand-in serving the tiny trained Llama (the runner downloads it from here)."""
    with HubServer([Repo.from_dir(TINY_LLAMA_REPO, tiny_llama_path)]) as server:
        yield server


# ----------------------------------------------------------------------------- one cluster per test


@pytest.fixture
async def cluster(
    docker_client: docker.DockerClient, images: Images, s3: S3, hub: HubServer, tmp_path: Path
) -> AsyncIterator[Cluster]:
    async with Emulator() as server, kmock.Server(server) as srv:
        declare_resources(server)
        api = str(srv.url).rstrip("/")
        bucket = await asyncio.to_thread(s3.new_bucket)  # never block the loop serving kmock
        results = f"s3://{bucket}/results"
        settings = OperatorSettings(results_uri=results, api_server=api, metrics_port=None)
        h = Harness(server, settings, tmp_path / "unused")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": api}}],
                    "users": [{"name": "operator", "user": {}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "operator"}}
                    ],
                    "current-context": "kmock",
                }
            )
        )
        kubeconfig.chmod(0o644)
        injected = {
            **s3.env,
            "HF_ENDPOINT": hub.url,
            # The same reason as tests/conftest.py: one torch thread per process on 2 shared cores.
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        node = Node(
            h, docker_client, tmp_path / "node", injected_env=injected, kubeconfig=kubeconfig
        )
        node.start()
        c = Cluster(h=h, node=node, images=images, s3=s3, results=results)
        try:
            yield c
        finally:
            await node.stop()
