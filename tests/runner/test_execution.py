"""Local execution of run.py: whatever the child prints, the reader keeps up and nothing is lost.

These run small stand-in scripts through the real ``run_script`` (a real subprocess, a real
pipe): what is under test is the parent's side, not a model.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import pytest

from model_support.config import RunConfig
from model_support.execution import (
    RunOutput,
    StageEvent,
    parse_stage_event,
    run_local,
    run_script,
)
from model_support.records import PROGRESS_MARKER, RESULT_MARKER, ResultDocument
from model_support.vocabulary import ErrorClass, Result

CONFIG = RunConfig(model="org/model")


def _script(body: str) -> str:
    """A stand-in run.py: ``body``, then a PASS document written as run.py writes it."""
    document = ResultDocument(model="org/model", task="text-generation", result=Result.PASS)
    return textwrap.dedent(
        """
        import json, sys
        PROGRESS = {progress!r}
        RESULT = {result!r}
        DOC = {doc!r}
        {body}
        open("result.json", "w").write(DOC)
        print(RESULT + DOC, flush=True)
        """
    ).format(
        progress=PROGRESS_MARKER,
        result=RESULT_MARKER,
        doc=document.model_dump_json(),
        body=textwrap.dedent(body).strip(),
    )


def test_unparseable_stage_lines_and_a_flood_after_them_do_not_block_the_run() -> None:
    events: list[StageEvent] = []
    run_py = _script(
        """
        print(PROGRESS + '{"stage": "load", "status": "start", "seconds": null, "detail": null}')
        print(PROGRESS + "this is not JSON")
        print(PROGRESS + '["a", "list"]')
        print(PROGRESS + '{"stage": 3, "status": "start"}', flush=True)
        sys.stdout.buffer.write(b"\\xff\\xfe not UTF-8\\n")
        line = "x" * 1023 + "\\n"
        for _ in range(20 * 1024):  # 20 MiB after the bad lines: far more than a pipe holds
            sys.stdout.write(line)
        print(PROGRESS + '{"stage": "load", "status": "done", "seconds": 1.5, "detail": null}')
        """
    )
    document = run_script(run_py, CONFIG, timeout_s=120, on_stage=events.append)
    assert document.result == Result.PASS  # not TIMEOUT: the child never blocked on its output
    assert [(e.stage, e.status) for e in events] == [("load", "start"), ("load", "done")]


def test_the_tail_of_a_failed_run_is_kept_and_bounded() -> None:
    run_py = textwrap.dedent(
        f"""
        import sys
        print({PROGRESS_MARKER!r} + '{{"stage": "compile", "status": "start"}}')
        for i in range(100_000):
            print("line", i)
        print({PROGRESS_MARKER!r} + "garbage")
        sys.exit(7)
        """
    )
    document = run_script(run_py, CONFIG, timeout_s=120)
    assert document.result == Result.ERROR and document.stage == "compile"
    assert "status 7" in (document.error or "") and "line 99999" in (document.error or "")
    assert "line 10 " not in (document.error or "")


def test_a_failing_progress_callback_is_raised_after_the_run_not_lost() -> None:
    def broken(event: StageEvent) -> None:
        raise RuntimeError("display broke")

    run_py = _script(
        """
        print(PROGRESS + '{"stage": "load", "status": "start"}')
        for _ in range(10 * 1024):
            sys.stdout.write("y" * 1023 + "\\n")
        """
    )
    try:
        run_script(run_py, CONFIG, timeout_s=120, on_stage=broken)
    except RuntimeError as exc:
        assert "display broke" in str(exc)
    else:
        raise AssertionError("the callback's error was swallowed")


def test_the_run_directory_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_script(_script("pass"), CONFIG, timeout_s=120)
    assert list(tmp_path.iterdir()) == []


def test_stage_events_are_validated() -> None:
    good = PROGRESS_MARKER + '{"stage": "verify", "status": "done", "seconds": 2}'
    assert parse_stage_event(good) == StageEvent("verify", "done", 2)
    for bad in ("{", "null", '{"stage": "x"}', '{"stage": "x", "status": "s", "seconds": "1"}'):
        assert parse_stage_event(PROGRESS_MARKER + bad) is None
    output = RunOutput()
    output.feed(PROGRESS_MARKER + "{")
    assert output.last_stage is None and list(output.tail) == [PROGRESS_MARKER + "{"]


@pytest.mark.slow
def test_run_py_loads_safetensors_only(tiny_llama_path: Path, tmp_path: Path) -> None:
    """A pickle checkpoint is never unpickled, even when run.py is run without the CLI's checks."""
    import shutil

    import torch
    from safetensors.torch import load_file

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_llama_path, pickled)
    weights = pickled / "model.safetensors"
    torch.save(load_file(weights), pickled / "pytorch_model.bin")
    weights.unlink()
    config = RunConfig(
        model=str(pickled), dtype="float32", compile_backend="aot_eager", max_new_tokens=2
    )
    document = run_local(config, timeout_s=300).document
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.LOAD)
    assert "safetensors" in (document.error or "")


def test_a_malformed_result_document_is_recorded_as_an_error_that_says_so() -> None:
    """One policy for the CLI and the pod: what does not validate is an ERROR saying what was
    wrong (the CLI used to raise and record nothing)."""
    run_py = _script("DOC = json.dumps({'model': 'org/model', 'result': 'PASS', 'cores': 'many'})")
    document = run_script(run_py, CONFIG, timeout_s=60)
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.RUNTIME)
    assert document.error and "malformed result document (result file" in document.error
    assert document.model == "org/model"  # identity from the config, not the child's claim


def test_a_run_killed_by_sigkill_is_not_guessed_out_of_memory() -> None:
    """SIGKILL without the kernel's OOM report is a runtime ERROR that says what is known (the
    CLI used to record out-of-memory for any SIGKILL)."""
    run_py = _script("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    document = run_script(run_py, CONFIG, timeout_s=60)
    assert (document.result, document.error_class) == (Result.ERROR, ErrorClass.RUNTIME)
    assert document.error and "killed by SIGKILL without a result document" in document.error
