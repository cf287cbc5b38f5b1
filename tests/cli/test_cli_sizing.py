"""`model-support run` sizes the model while a one-core run starts; disagreement stops that run."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from processes import processes_with

from model_support.checkpoints import DemoModel
from model_support.hub import TensorSpec
from model_support.store import ResultsStore
from model_support.vocabulary import ExclusionReason, Result

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).with_name("model-support"))


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
    assert processes_with(marker) == []  # the speculative one-core run is gone


def _header_only_checkpoint(
    directory: Path, config: dict[str, object], tensors: list[TensorSpec]
) -> Path:
    """A checkpoint whose safetensors file holds only its header: enough to size, nothing to load."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    header: dict[str, object] = {}
    offset = 0
    for tensor in tensors:
        size = tensor.numel * 2  # BF16
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return directory


def test_script_holds_the_sized_cores_and_parallelism(tmp_path: Path) -> None:
    from test_sizing import LLAMA31_8B, _decoder  # the hand-worked published configuration
    from typer.testing import CliRunner

    from model_support.cli import app
    from model_support.script import read_config

    path = _header_only_checkpoint(tmp_path / "llama-8b", LLAMA31_8B, _decoder(LLAMA31_8B))
    lnc1 = CliRunner().invoke(
        app, ["script", str(path), "--instance", "trn2", "--lnc", "1", "--backend", "neuron"]
    )
    assert lnc1.exit_code == 0, lnc1.output
    config = read_config(lnc1.stdout)
    assert (config.cores, config.parallelism.value) == (2, "tensor")  # ~12 GiB per LNC=1 core
    # TorchNeuron does not run on trn1: no script, the reason instead.
    trn1 = CliRunner().invoke(
        app, ["script", str(path), "--instance", "trn1", "--backend", "neuron"]
    )
    assert trn1.exit_code != 0 and "unsupported-instance" in trn1.output, trn1.output
    trn2 = CliRunner().invoke(
        app, ["script", str(path), "--instance", "trn2", "--backend", "neuron"]
    )
    assert (read_config(trn2.stdout).cores, read_config(trn2.stdout).parallelism.value) == (
        1,
        "none",
    )


PROFILE_PROBE = """
import importlib.util, json, sys
from model_support.cli.common import default_instance
from model_support.vocabulary import Backend
chosen = default_instance(Backend.AUTO)
imported = "torch" in sys.modules
import torch
print(json.dumps({
    "chosen": chosen,
    "imported_torch": imported,
    "neuron": importlib.util.find_spec("torch_neuronx") is not None,
    "cuda_available": torch.cuda.is_available(),
    "gpu_build": bool(torch.version.cuda or torch.version.hip),
}))
"""


def test_the_auto_sizing_profile_is_what_torch_itself_reports() -> None:
    """`run` sizes for the profile of the backend run.py will select; on a CPU-only torch it
    tells so from torch's build record, without the seconds an import of torch costs."""
    done = subprocess.run(
        [sys.executable, "-c", PROFILE_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    expected = "trn2" if facts["neuron"] else "cuda" if facts["cuda_available"] else "cpu"
    assert facts["chosen"] == expected
    if not facts["neuron"] and not facts["gpu_build"]:
        assert facts["imported_torch"] is False
