"""Reading the matrix for the viewer: one model's rows from its row groups only, older files."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from viewer_support import NEW_CC, START, make_record

from model_support import dataset
from model_support.store import ResultsStore
from model_support.viewer import queries
from model_support.viewer.data import list_stack_files, read_columns


@pytest.fixture
def many_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of 150 models whose matrix file is split into row groups of 64 rows."""
    monkeypatch.setattr(dataset, "MATRIX_ROW_GROUP_BYTES", 1)  # the 64-row minimum
    store = ResultsStore(str(tmp_path))
    for i in range(150):
        model = f"org{i % 7}/model-{i:03d}"
        store.add(make_record(model, "text-generation", "PASS", NEW_CC, START + timedelta(i)))
    store.materialize()
    return tmp_path


def test_one_models_rows_come_from_the_row_groups_that_hold_it(many_row_groups: Path) -> None:
    [matrix] = list_stack_files(str(many_row_groups))
    assert pq.ParquetFile(matrix.path).metadata.num_row_groups == 3
    everything = read_columns(str(many_row_groups), [matrix.path], queries.DETAIL_COLUMNS)
    for model in everything["model_id"]:  # first, last and every row in between
        rows = read_columns(
            str(many_row_groups), [matrix.path], queries.DETAIL_COLUMNS, model_id=model
        )
        assert list(rows["model_id"]) == [model]
        expected = everything[everything["model_id"] == model].reset_index(drop=True)
        assert rows.drop(columns=["packages", "texts", "prompts"]).equals(
            expected.drop(columns=["packages", "texts", "prompts"])
        )
    assert read_columns(str(many_row_groups), [matrix.path], ["model_id"], model_id="x/y").empty


def test_a_column_an_older_file_lacks_reads_as_missing(tmp_path: Path) -> None:
    store = ResultsStore(str(tmp_path))
    store.add(make_record("Qwen/Qwen3-0.6B", "text-generation", "PASS", NEW_CC, START))
    store.materialize()
    [matrix] = list_stack_files(str(tmp_path))
    table = pq.read_table(matrix.path)
    pq.write_table(table.drop_columns(["model_path", "parameters"]), matrix.path)  # older file
    rows = read_columns(
        str(tmp_path), [matrix.path], ("model_id", "model_path", "parameters", "result")
    )
    assert list(rows.columns) == ["model_id", "model_path", "parameters", "result"]
    assert rows["model_path"].isna().all() and rows["parameters"].isna().all()
    assert list(rows["result"]) == ["PASS"]
