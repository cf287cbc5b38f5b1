"""Shared pytest fixtures for the whole suite.

Tiny demo checkpoints come first: they are built (briefly trained) once into the shared cache
(``$MODEL_SUPPORT_CACHE`` or ~/.cache/model-support/demo-models) and reused by later test
sessions and by the demo. Fixtures that need only one model build only that one.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_support.checkpoints import DEMO_MODELS, DemoModel, build_demo_models, default_cache_dir

# The models here are tiny: torch's intra-op threads only fight each other (and the other
# xdist worker) over the 2 cores, which made each decode step ~20x slower. One thread per
# process, inherited by every run.py the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Sizing remembers what it derived (model_support.sizing.remembered_metadata): each test session
# starts with an empty memory of its own, so the suite always exercises the derivation itself.
_SIZING_CACHE = tempfile.TemporaryDirectory(prefix="model-support-sizing-")
os.environ["MODEL_SUPPORT_SIZING_CACHE"] = _SIZING_CACHE.name

# --- tiny demo checkpoints -------------------------------------------------------------------


def _demo_model_path(name: str) -> Path:
    (model,) = build_demo_models(default_cache_dir(), [name])
    return model.require_path()


@pytest.fixture(scope="session")
def demo_models() -> dict[str, DemoModel]:
    """Every demo model of the catalogue, built (or reused) in the shared cache, by name.

    On a machine without them, pytest-xdist's workers build from opposite ends of the
    catalogue (each training on one thread), so two cores build two models at once instead
    of one worker waiting on the other's lock for each model in turn.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    order = list(DEMO_MODELS)
    if int(worker.removeprefix("gw") or 0) % 2:
        order.reverse()
    built = {model.name: model for model in build_demo_models(default_cache_dir(), order)}
    return {model.name: built[model.name] for model in DEMO_MODELS}


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    """Directory of the tiny trained LlamaForCausalLM checkpoint (text-generation)."""
    return _demo_model_path("tiny-llama")


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> Path:
    """Directory of the tiny trained Qwen3ForCausalLM checkpoint (text-generation)."""
    return _demo_model_path("tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_qwen3_moe_path() -> Path:
    """Directory of the tiny trained Qwen3MoeForCausalLM checkpoint (4 experts, top-2)."""
    return _demo_model_path("tiny-qwen3-moe")


@pytest.fixture(scope="session")
def tiny_mixtral_path() -> Path:
    """Directory of the tiny trained MixtralForCausalLM checkpoint (4 experts, top-2)."""
    return _demo_model_path("tiny-mixtral")


@pytest.fixture(scope="session")
def tiny_llava_path() -> Path:
    """Directory of the tiny LlavaForConditionalGeneration checkpoint with its processor."""
    return _demo_model_path("tiny-llava")


# --- reports -----------------------------------------------------------------------------------


_SESSION_STARTED = time.time()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server (the real S3 protocol) on 127.0.0.1, shared by the session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (the order is otherwise kept). xdist hands tests to whichever worker is
    free: a long test handed out last keeps one worker busy while the other has nothing left,
    and with the long ones first the short ones even out the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault-injection tables and the image build log this session wrote (also under xdist)."""
    artifacts = Path(__file__).resolve().parents[1] / "test-artifacts"
    started = _SESSION_STARTED
    tables = sorted(artifacts.glob("fault-injection-*.md")) if artifacts.is_dir() else []
    fresh = [t for t in tables if t.stat().st_mtime >= started]
    if fresh:
        terminalreporter.section("verification fidelity (fault injection)")
        for table in fresh:
            terminalreporter.write_line(table.read_text())
    images = artifacts / "container-images.txt"
    if images.is_file() and images.stat().st_mtime >= started:
        terminalreporter.section("container images (built, or found built by content hash)")
        terminalreporter.write_line(images.read_text())
