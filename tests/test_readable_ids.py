"""Readable model ids: a local checkpoint is named by its folder in results, its path kept aside."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from factories import make_record
from typer.testing import CliRunner

from model_support.cli import app
from model_support.models import (
    BadModelReference,
    check_model_id,
    is_local_path,
    readable_model_id,
)
from model_support.records import RunRecord, Stack
from model_support.store import ResultsStore

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),  # a Hub id is its own name
        ("gpt2", "gpt2"),  # legacy un-namespaced Hub id: still not a path
        ("/home/me/.cache/model-support/demo-models/tiny-llama", "local/tiny-llama"),
        ("/data/runs/my ckpt (v2)/", "local/my-ckpt-v2"),
        ("C:\\models\\step-500", "local/step-500"),
        ("/", "local/checkpoint"),
    ],
)
def test_readable_ids(model: str, expected: str) -> None:
    assert readable_model_id(model) == expected
    assert is_local_path(model) == (expected != model)


def test_model_ids_look_like_hub_ids() -> None:
    assert check_model_id("demo/tiny-llama") == "demo/tiny-llama"
    for bad in ("tiny-llama", "a/b/c", "/abs/path", "a/b c", "org/../x", ""):
        with pytest.raises(BadModelReference, match="namespace/name"):
            check_model_id(bad)


def record(model: str, when: datetime, **fields: object) -> RunRecord:
    """A CPU run of ``model`` that finished at ``when``; ``fields`` are the record's own."""
    return make_record(
        model,
        neuron=False,
        finished=when,
        stack=Stack(torch="2.13.0", transformers="5.24.0"),
        run_id=f"{when:%Y%m%dT%H%M%S}-{abs(hash(model)) % 10**6}",
        run_py="",
        **fields,
    )


def test_a_record_names_its_model_and_keeps_the_path() -> None:
    path = "/home/me/ckpts/tiny-llama"
    derived = record(path, T0)
    assert (derived.model_id, derived.document.model) == ("local/tiny-llama", path)
    named = record(path, T0, model_id="demo/tiny-llama")
    assert RunRecord.from_json(named.to_json()).model_id == "demo/tiny-llama"
    # A record written before ids existed (no model_id field) gets the derived one.
    old = json.loads(derived.to_json())
    del old["model_id"]
    assert RunRecord.model_validate(old).model_id == "local/tiny-llama"
    assert record("Qwen/Qwen3-0.6B", T0).model_id == "Qwen/Qwen3-0.6B"


def test_the_matrix_shows_ids_with_paths_beside_them(tmp_path: Path) -> None:
    store = ResultsStore(str(tmp_path))
    store.add(record("/machine-a/ckpts/tiny-llama", T0))
    store.add(record("Qwen/Qwen3-0.6B", T0))
    # The same checkpoint moved to another machine is the same model: its latest run wins.
    store.add(record("/machine-b/models/tiny-llama", T0 + timedelta(hours=1)))
    store.materialize()
    matrix = store.matrix(columns=["model_id", "model_path"]).set_index("model_id")
    assert sorted(matrix.index) == ["Qwen/Qwen3-0.6B", "local/tiny-llama"]
    assert matrix.loc["local/tiny-llama", "model_path"] == "/machine-b/models/tiny-llama"
    assert pd.isna(matrix.loc["Qwen/Qwen3-0.6B", "model_path"])


def test_model_id_option_is_checked_before_anything_runs(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    bad = CliRunner().invoke(app, ["run", str(checkpoint), "--model-id", "no namespace"])
    assert bad.exit_code == 2 and "namespace/name" in " ".join(bad.output.split())
    hub = CliRunner().invoke(app, ["run", "Qwen/Qwen3-0.6B", "--model-id", "me/qwen"])
    assert hub.exit_code == 2 and "named by its Hub id" in " ".join(hub.output.split())
    assert not (tmp_path / "results").exists()
