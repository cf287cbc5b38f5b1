"""The command line and the results store: a result is never lost, and tables read cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_record
from typer.testing import CliRunner

from model_support.cli import app
from model_support.cli.commands_run import save_record
from model_support.dataset import matrix_file_stem, matrix_key
from model_support.records import ResultDocument, RunRecord, record_from_document
from model_support.store import ResultsStore
from model_support.vocabulary import ErrorClass, Result

runner = CliRunner()


def test_a_result_that_cannot_be_stored_is_kept_on_disk_and_said_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    blocker = tmp_path / "a-file"
    blocker.write_text("the store's parent became a file")
    record = make_record("org/model")
    location = str(blocker / "results")
    assert save_record(ResultsStore(location), record, location) is False
    kept = work / f"model-support-unsaved-{record.run_id}.json"
    assert RunRecord.from_json(kept.read_text()) == record
    said = "".join(capsys.readouterr().err.split())  # rich wraps long paths anywhere
    assert "couldnotrecordtheresult" in said and str(kept) in said


def test_a_record_stored_but_not_materialized_is_folded_in_by_the_next_materialize(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = tmp_path / "results"
    store = ResultsStore(location)
    (location / "data").mkdir(parents=True)
    record = make_record("org/model")
    blocked = location / "data" / f"{matrix_file_stem(matrix_key(record))}.parquet"
    blocked.mkdir()  # the matrix file cannot be replaced: materialize fails after the add
    (blocked / "x").write_text("x")
    assert save_record(store, record, str(location)) is True
    assert "the next run with --results" in " ".join(capsys.readouterr().err.split())
    (blocked / "x").unlink()
    blocked.rmdir()
    store.add(make_record("org/other"))
    store.materialize()
    assert sorted(store.matrix().model_id) == ["org/model", "org/other"]


def test_the_results_table_shows_missing_values_as_blank(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    # An infrastructure ERROR: nothing ran, so no stack, no timings, no memory.
    document = ResultDocument(
        model="org/lost",
        task="text-generation",
        result=Result.ERROR,
        error_class=ErrorClass.INFRASTRUCTURE,
        error="node lost",
    )
    store.add_and_materialize(record_from_document(document, "# run.py\n"))
    result = runner.invoke(app, ["results", "--results", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "org/lost" in line)
    for placeholder in ("<NA>", "None", "nan", "NaN", "—"):
        assert placeholder not in row, row
    listed = json.loads(
        runner.invoke(app, ["results", "--results", str(tmp_path / "results"), "--json"]).stdout
    )
    assert listed[0]["wall_time_s"] is None


def test_results_of_an_unknown_location_is_a_clear_error() -> None:
    result = runner.invoke(app, ["results", "--results", "nosuch://x"])
    assert result.exit_code == 2
    assert "Protocol not known: nosuch" in " ".join(result.output.split())


def test_markup_in_results_is_printed_as_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text a model generated (`[/INST]`) and versions a record holds (`[/x]`) are data: the
    run's summary and the results table print them as they are, never as Rich markup."""
    from model_support.cli.run_output import print_record
    from model_support.records import Stack

    document = ResultDocument(
        model="org/[bold]model",
        task="text-generation",
        result=Result.PASS,
        compile_backend="[red]neuron",
        stack=Stack(torch="2.13.0", transformers="4.57.0[/x]"),
        text=["[INST] say hi [/INST] hi"],
    )
    record = record_from_document(document, "# run.py\n")
    print_record(record)
    printed = capsys.readouterr().out
    assert "[INST] say hi [/INST] hi" in printed and "org/[bold]model" in printed
    assert "[red]neuron" in printed
    location = str(tmp_path / "results")
    ResultsStore(location).add_and_materialize(record)
    result = runner.invoke(app, ["results", "--results", location])
    assert result.exit_code == 0, result.output
    assert "4.57.0[/x]" in result.output and "org/[bold]model" in result.output


def test_a_run_whose_model_generates_markup_passes_with_exit_0(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """`model-support run` of a model whose text holds `[/INST]` (here: the tiny checkpoint
    with a tokenizer that decodes every space as ` [/INST] `) prints the text as it is and
    exits 0 for its PASS, the whole command through."""
    import shutil

    model = tmp_path / "inst-llama"
    shutil.copytree(tiny_llama_path, model)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": " [/INST] "}
    tokenizer["decoder"] = {"type": "Sequence", "decoders": [tokenizer["decoder"], replace]}
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    results = tmp_path / "results"
    args = ["run", str(model), "--cores", "1", "--compile-backend", "aot_eager"]
    result = runner.invoke(app, [*args, "--max-new-tokens", "8", "--results", str(results)])
    [record] = ResultsStore(str(results)).records()
    assert record.document.result == Result.PASS, record.document.error
    assert any("[/INST]" in text for text in record.document.text)
    assert result.exit_code == 0, result.output
    assert "[/INST]" in result.output
