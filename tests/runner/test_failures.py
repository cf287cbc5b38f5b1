"""run.py classifies every failure by stage, with the message, and never loses the document."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from model_support.checkpoints import DemoModel
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.vocabulary import ErrorClass, Result

pytestmark = pytest.mark.slow


def _copy(demo: DemoModel, dest: Path) -> Path:
    target = dest / demo.name
    shutil.copytree(demo.require_path(), target)
    return target


def _edit_config(path: Path, **changes: object) -> None:
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def _run(model: Path | str, **kwargs: object) -> object:
    config = RunConfig(model=str(model), compile_backend="aot_eager", **kwargs)  # type: ignore[arg-type]
    return run_local(config, timeout_s=300).document


def test_missing_checkpoint_is_a_load_error(tmp_path: Path) -> None:
    doc = _run(tmp_path / "does-not-exist")
    assert doc.result == Result.ERROR
    assert doc.error_class == ErrorClass.LOAD
    assert doc.stage == "load"
    assert "does-not-exist" in doc.error
    assert doc.traceback and "Traceback" not in doc.error


def test_corrupt_safetensors_is_a_load_error(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    path = _copy(demo_models["tiny-llama"], tmp_path)
    weights = next(path.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:200])  # a truncated download
    doc = _run(path)
    assert (doc.result, doc.error_class, doc.stage) == (Result.ERROR, ErrorClass.LOAD, "load")
    assert doc.error


def test_unknown_architecture_is_classified(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    path = _copy(demo_models["tiny-llama"], tmp_path)
    _edit_config(path, model_type="tiny-unknown-arch", architectures=["TinyUnknownForCausalLM"])
    doc = _run(path)
    assert (doc.result, doc.error_class) == (Result.ERROR, ErrorClass.UNSUPPORTED_ARCHITECTURE)
    assert "tiny-unknown-arch" in doc.error


def test_remote_code_is_refused_unless_allowed(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    path = _copy(demo_models["tiny-llama"], tmp_path)
    _edit_config(
        path,
        model_type="custom-remote",
        auto_map={
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModelForCausalLM": "modeling_custom.CustomModel",
        },
    )
    # The module the repo points at would prove execution; it must never be imported.
    (path / "configuration_custom.py").write_text("raise SystemExit('remote code executed')\n")
    doc = _run(path)
    assert (doc.result, doc.error_class) == (Result.ERROR, ErrorClass.REMOTE_CODE_REFUSED)
    assert "trust_remote_code" in doc.error


def test_a_run_past_its_timeout_is_stopped(demo_models: dict[str, DemoModel]) -> None:
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()), compile_backend="inductor"
    )
    record = run_local(config, timeout_s=4)
    doc = record.document
    assert doc.result == Result.TIMEOUT
    assert "did not finish within 4 s" in doc.error
    assert record.run_py  # what would have run is kept even without a verdict
