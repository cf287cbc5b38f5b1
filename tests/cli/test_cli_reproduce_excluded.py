"""`reproduce` of an EXCLUDED row: nothing ran, so --run sizes it again (never runs run.py),
and its requirements still name the stack it was planned on."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from typer.testing import CliRunner

from model_support.checkpoints import (
    LLAMA_3_1_405B_CONFIG,
    build_header_only_checkpoint,
    llama_tensors,
)
from model_support.cli import app
from model_support.cli.common import plan_cores
from model_support.config import RunConfig
from model_support.records import RunRecord
from model_support.store import ResultsStore

runner = CliRunner()


def test_reproducing_an_excluded_row_sizes_it_again(tmp_path: Path) -> None:
    huge = build_header_only_checkpoint(
        tmp_path / "ckpt", "huge", LLAMA_3_1_405B_CONFIG, llama_tensors(LLAMA_3_1_405B_CONFIG)
    )
    planned = plan_cores(RunConfig(model=str(huge), compile_backend="aot_eager"), None, None, 16)
    assert isinstance(planned, RunRecord)
    store = ResultsStore(tmp_path / "results")
    store.add(planned)
    store.materialize()
    folder = tmp_path / "again"
    done = runner.invoke(
        app,
        ["reproduce", planned.run_id, "--results", str(tmp_path / "results"), "-o",
         str(folder), "--run"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    text = " ".join(done.stdout.split())
    assert "they agree: sizing still excludes it (too-large)" in text
    assert not (folder / "result.json").exists()  # run.py never ran
    requirements = (folder / "requirements.txt").read_text().splitlines()
    for name in ("torch", "transformers"):
        assert f"{name}=={importlib.metadata.version(name)}" in requirements
    # Another profile may be asked for: it is said which, and 405B fits no trn2 either.
    again = runner.invoke(
        app,
        ["reproduce", planned.run_id, "--results", str(tmp_path / "results"), "-o",
         str(folder), "--run", "--profile", "trn2"],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "sizing it again for the trn2 profile" in " ".join(again.output.split())
