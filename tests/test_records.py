"""run.py's result document and the package's typed records have exactly the same fields.

run.py cannot import the package (it runs standalone), so it builds its document as a dict;
these tests hold that dict and ResultDocument (with Timings, Memory, Verification and Stack) to
the same fields in both directions, and check that an unknown field is refused, not kept.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from model_support.config import RunConfig
from model_support.models import WEIGHT_SUFFIXES, weights_digest
from model_support.records import (
    Memory,
    ResultDocument,
    RunRecord,
    Stack,
    Timings,
    Verification,
    record_from_document,
)
from model_support.script import render_script, template_text
from model_support.store import ResultsStore
from model_support.vocabulary import ErrorClass, Result


def _runner_module(tmp_path: Path) -> ModuleType:
    """run.py imported as a module (its top level imports only the standard library)."""
    path = tmp_path / "run_module.py"
    path.write_text(template_text())
    spec = importlib.util.spec_from_file_location("run_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, as an import would: run.py's dataclasses resolve their
    # annotations through sys.modules.
    sys.modules["run_module"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["run_module"]
    return module


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_new_document_has_every_field_of_result_document(tmp_path: Path) -> None:
    run_py = _runner_module(tmp_path)
    config = RunConfig(model="org/model").model_dump(mode="json")
    document = run_py.new_document(config)
    assert set(document) == _fields(ResultDocument)
    ResultDocument.model_validate(document)  # the skeleton itself is a valid document


def _run_rendered(config: RunConfig, workdir: Path) -> dict[str, Any]:
    """Run the rendered run.py as users do (``python3 run.py``); its raw JSON document."""
    workdir.mkdir()
    (workdir / "run.py").write_text(render_script(config))
    done = subprocess.run(
        [sys.executable, "run.py"], cwd=workdir, capture_output=True, text=True, timeout=600
    )
    assert (workdir / "result.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    raw: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    return raw


@pytest.mark.slow
def test_a_real_documents_nested_fields_match_the_records(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    """A whole PASS run fills every timing, memory, verification and stack field."""
    config = RunConfig(
        model=str(tiny_llama_path), dtype="float32", compile_backend="aot_eager", max_new_tokens=4
    )
    raw = _run_rendered(config, tmp_path / "run")
    assert raw["result"] == "PASS", (raw["error"], raw["verification"].get("reason"))
    assert set(raw) == _fields(ResultDocument)
    # A local checkpoint's row names its weights.
    assert raw["weights_sha256"] == weights_digest(str(tiny_llama_path)) is not None
    for key, model in (
        ("timings", Timings),
        ("memory", Memory),
        ("verification", Verification),
        ("stack", Stack),
    ):
        # origin is the package's own mark (a writer's stack); run.py never sets it.
        expected = _fields(model) - ({"origin"} if model is Stack else set())
        assert set(raw[key]) == expected, f"{key}: run.py and records.{model.__name__} differ"
    ResultDocument.model_validate(raw)


@pytest.mark.parametrize(
    ("where", "model"),
    [
        ((), ResultDocument),
        (("timings",), Timings),
        (("memory",), Memory),
        (("verification",), Verification),
        (("stack",), Stack),
    ],
)
def test_unknown_fields_are_refused(where: tuple[str, ...], model: type[BaseModel]) -> None:
    document: dict[str, Any] = {"model": "org/m", "task": "text-generation", "result": "PASS"}
    target = document
    for key in where:
        target = target.setdefault(key, {})
    target["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        ResultDocument.model_validate(document)


@pytest.mark.slow
def test_disabled_verification_never_gives_a_pass_row(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    config = RunConfig(
        model=str(tiny_llama_path),
        dtype="float32",
        compile_backend="aot_eager",
        max_new_tokens=4,
        verification={"enabled": False},  # type: ignore[arg-type]
    )
    raw = _run_rendered(config, tmp_path / "run")
    document = ResultDocument.model_validate(raw)
    assert document.result == Result.UNVERIFIED
    assert document.verification.passed is None and document.verification.reason
    assert len(document.tokens[0]) == 4 and document.timings.wall_time_s  # it did run
    store = ResultsStore(tmp_path / "results")
    store.add_and_materialize(record_from_document(document, render_script(config)))
    matrix = store.matrix(columns=["result", "verified_exact"])
    assert matrix.result.tolist() == ["UNVERIFIED"]
    card = (tmp_path / "results" / "README.md").read_text()
    assert "**UNVERIFIED**" in card and "Never counted as PASS" in " ".join(card.split())


def test_the_operator_does_not_import_the_local_runner() -> None:
    code = (
        "import sys, model_support.operator.handlers; "
        "print('model_support.execution' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def test_record_builders_live_with_the_records() -> None:
    document = ResultDocument(model="org/m", task="text-generation", result=Result.PASS)
    record = record_from_document(document, "# run.py\n")
    assert isinstance(record, RunRecord) and record.run_py == "# run.py\n"
    assert RunRecord.from_json(record.to_json()) == record


def test_out_of_memory_is_recorded_only_on_the_kernels_report() -> None:
    """document_for_end: a SIGKILL is out-of-memory only when the memory cgroup counted an OOM
    kill; inside a pod (not the final word) an unexplained SIGKILL or a stop records nothing."""
    from model_support.runpath import RunEnd, document_for_end

    config = RunConfig(model="org/model")
    killed = RunEnd(returncode=-9, seconds=1.0, oom_killed=True)
    assert document_for_end(config, None, killed, final_word=False).error_class == (  # type: ignore[union-attr]
        ErrorClass.OUT_OF_MEMORY
    )
    unknown = RunEnd(returncode=-9, seconds=1.0, oom_killed=None)
    assert document_for_end(config, None, unknown, final_word=False) is None
    local = document_for_end(config, None, unknown, final_word=True)
    assert local is not None and local.error_class == ErrorClass.RUNTIME
    stopped = RunEnd(returncode=-15, seconds=1.0, stopped=True)
    assert document_for_end(config, None, stopped, final_word=False) is None
    exited = document_for_end(config, None, RunEnd(returncode=3, seconds=1.0), final_word=False)
    assert exited is not None and "exited with status 3" in (exited.error or "")


def test_run_py_and_the_package_hash_a_checkpoints_weights_alike(tmp_path: Path) -> None:
    """Rows made by run.py (runs) and by the package (EXCLUDED records) name weights alike:
    the weight files' paths and contents, nothing else."""
    run_py = _runner_module(tmp_path)
    assert run_py.WEIGHT_SUFFIXES == WEIGHT_SUFFIXES
    folder = tmp_path / "ckpt"
    (folder / "unet").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights-1")
    (folder / "unet" / "diffusion_pytorch_model.bin").write_bytes(b"weights-2")
    (folder / "config.json").write_text("{}")
    first = weights_digest(str(folder))
    assert first is not None and first == run_py.weights_digest(str(folder))
    (folder / "config.json").write_text('{"changed": true}')  # not a weight: same digest
    assert weights_digest(str(folder)) == first
    (folder / "model.safetensors").write_bytes(b"weights-3")
    assert weights_digest(str(folder)) != first
    assert weights_digest(str(folder)) == run_py.weights_digest(str(folder))
    assert weights_digest(str(tmp_path / "missing")) is None
    # An EXCLUDED record of a local checkpoint (nothing ran) names its weights too.
    from model_support.runpath import excluded_record
    from model_support.vocabulary import ExclusionReason

    record = excluded_record(RunConfig(model=str(folder)), ExclusionReason.TOO_LARGE, "too large")
    assert record.document.weights_sha256 == weights_digest(str(folder))
