"""`regressions --confirm`: an unconfirmed worse result is run again here (its exact run.py,
recorded in the store), and reported as a regression once the re-runs agree."""

from __future__ import annotations

import importlib.metadata
import json
from datetime import timedelta
from pathlib import Path

import pytest
from factories import CPU_STACK, T0, make_record
from typer.testing import CliRunner

from model_support.cli import app
from model_support.cli.commands_demo import NEWER_RELEASE, OLDER_RELEASE
from model_support.config import RunConfig, VerificationConfig
from model_support.records import RunRecord
from model_support.script import render_script
from model_support.store import ResultsStore
from model_support.vocabulary import LocalizeMode, Result

runner = CliRunner()


def row(path: Path, backend: str, result: Result, hours: int) -> RunRecord:
    """The tiny Llama as run here with ``backend``."""
    config = RunConfig(
        model=str(path),
        backend="cpu",
        compile_backend=backend,
        max_new_tokens=6,
        prompts=["The capital of France is"],
        verification=VerificationConfig(localize=LocalizeMode.NEVER),
    )
    here = {d: importlib.metadata.version(d) for d in ("torch", "transformers")}
    return make_record(
        str(path), result, neuron=False, stack=CPU_STACK.model_copy(update=here),
        finished=T0 + timedelta(hours=hours), run_py=render_script(config),
        document={"compile_backend": backend, "revision": None, "resolved_revision": None},
        model_id="demo/tiny-llama",
    )  # fmt: skip


@pytest.mark.slow
def test_confirm_reruns_a_worse_result_here_until_the_policy_holds(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    store = ResultsStore(tmp_path / "results")
    before = row(tiny_llama_path, OLDER_RELEASE, Result.PASS, 0)
    after = row(tiny_llama_path, NEWER_RELEASE, Result.FAIL, 1)
    for record in (before, after):
        store.add(record)
    store.materialize()
    location = str(tmp_path / "results")
    waiting = runner.invoke(app, ["regressions", "--results", location, "--reruns", "1", "--json"])
    assert waiting.exit_code == 0, waiting.output  # one FAIL: not yet a regression
    assert [c["model"] for c in json.loads(waiting.stdout)["unconfirmed"]] == ["demo/tiny-llama"]
    confirmed = runner.invoke(
        app, ["regressions", "--results", location, "--reruns", "1", "--confirm", "--json"]
    )
    assert confirmed.exit_code == 3, confirmed.output
    report = json.loads(confirmed.stdout)
    (change,) = report["regressions"]
    assert (change["model"], change["after"], change["runs_after"]) == (
        "demo/tiny-llama",
        "FAIL",
        2,
    )
    assert report["unconfirmed"] == []
    rerun = store.get(change["after_run_id"])
    assert rerun.run_id != after.run_id and rerun.labels["confirms"] == after.run_id
    assert rerun.run_py == after.run_py and rerun.document.result == Result.FAIL
    assert "re-ran demo/tiny-llama (text-generation)" in " ".join(confirmed.output.split())
    # Confirmed: running with --confirm again runs nothing more.
    again = runner.invoke(
        app, ["regressions", "--results", location, "--reruns", "1", "--confirm", "--json"]
    )
    assert again.exit_code == 3 and "re-ran" not in again.output
    assert len(list(store.records())) == 3
