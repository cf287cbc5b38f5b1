"""A Hub model end to end: sized from Hub metadata, pinned, downloaded and tested by run.py.

The Hub is a local stand-in (tests/hubserver.py) reached through the real huggingface_hub
client via HF_ENDPOINT, so from_pretrained, safetensors metadata and revision pinning all take
their real paths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hubserver import HubServer, Repo

from model_support.checkpoints import DemoModel
from model_support.script import read_config
from model_support.store import ResultsStore
from model_support.vocabulary import Result

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).with_name("model-support"))


def test_a_hub_model_is_pinned_downloaded_and_tested(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    repo = Repo.from_dir("tiny-org/tiny-llama", demo_models["tiny-llama"].require_path())
    with HubServer([repo]) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
        env.pop("HF_HUB_OFFLINE", None)
        done = subprocess.run(
            [
                CLI,
                "run",
                "tiny-org/tiny-llama",
                "--compile-backend",
                "aot_eager",
                "--results",
                str(tmp_path / "results"),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
        sha = repo.sha("main")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["result"] == "PASS", summary
    [record] = list(ResultsStore(str(tmp_path / "results")).records())
    assert record.document.result == Result.PASS
    assert record.document.revision == sha  # the run.py names the commit, not "main"
    assert record.document.resolved_revision == sha
    assert read_config(record.run_py).revision == sha
    # The weights came through the client into this test's own cache.
    assert list((tmp_path / "hf-home").rglob("*.safetensors"))
