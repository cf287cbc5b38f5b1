"""`model-support run` sizes the model while a one-core run starts; disagreement stops that run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from model_support.checkpoints import DemoModel
from model_support.store import ResultsStore
from model_support.vocabulary import ExclusionReason, Result

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).with_name("model-support"))


def _processes_with(marker: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue  # ended while we looked, or not ours to read
    return found


def test_an_excluded_model_is_recorded_and_its_speculative_run_stopped(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    path = tmp_path / "needs-remote-code"
    shutil.copytree(demo_models["tiny-llama"].require_path(), path)
    config = json.loads((path / "config.json").read_text())
    config.update(
        model_type="custom-remote", auto_map={"AutoConfig": "configuration_custom.CustomConfig"}
    )
    (path / "config.json").write_text(json.dumps(config))
    marker = f"speculative-{uuid.uuid4().hex}"
    done = subprocess.run(
        [CLI, "run", str(path), "--results", str(tmp_path / "results"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MODEL_SUPPORT_RUN_MARKER": marker},
        check=False,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["result"] == "EXCLUDED"
    [record] = list(ResultsStore(str(tmp_path / "results")).records())
    assert record.document.result == Result.EXCLUDED
    assert record.exclusion_reason == ExclusionReason.REMOTE_CODE_REQUIRED
    assert "auto_map" in (record.document.error or "") or "remote" in (record.document.error or "")
    assert _processes_with(marker) == []  # the speculative one-core run is gone
