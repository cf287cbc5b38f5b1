"""run.py loads a Hub model through the real client (a local stand-in Hub) and records its commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubserver import HubServer, Repo

from model_support.checkpoints import DemoModel
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.vocabulary import Result

pytestmark = pytest.mark.slow


def test_an_unpinned_hub_model_records_the_commit_it_loaded(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    repo = Repo.from_dir("tiny-org/tiny-qwen3", demo_models["tiny-qwen3"].require_path())
    with HubServer([repo]) as hub:
        config = RunConfig(
            model="tiny-org/tiny-qwen3", compile_backend="aot_eager"
        )  # revision: main
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
        doc = run_local(config, timeout_s=600, env=env).document
        sha = repo.sha("main")
    assert doc.result == Result.PASS, (doc.error, doc.verification.reason)
    assert doc.revision is None
    assert doc.resolved_revision == sha
