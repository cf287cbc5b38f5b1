"""The command line refuses bad input clearly, before anything runs, and loses nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubserver import HubServer, Repo
from typer.testing import CliRunner

from model_support.cli import app
from model_support.script import read_config

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "./no/such/dir"], "no such checkpoint directory"),
        (["run", "bad id!"], "is not a valid Hub model id"),
        (["run", "org/name", "--dtype", "int3"], "dtype"),
        (["run", "org/name", "--cores", "2", "--parallelism", "none"], "needs parallelism"),
        (["run", "org/name", "--compile-backend", "module:"], "expected module:function"),
        (["script", "a--b/c"], "is not a valid Hub model id"),
        (["run", "org/name", "--judge-model", "/no/judge"], "is not a checkpoint directory"),
    ],
)
def test_bad_input_gets_a_specific_error(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(
        app, [*args, *(["--results", str(tmp_path)] if args[0] == "run" else [])]
    )
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not any(tmp_path.iterdir())  # nothing recorded for input that never ran


def test_a_file_instead_of_a_checkpoint_directory_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    result = runner.invoke(app, ["script", str(weights)])
    assert result.exit_code == 2
    assert "is a file" in result.output


def test_unreachable_hub_is_reported_with_the_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    result = runner.invoke(
        app, ["run", "org/model", "--results", str(tmp_path), "--backend", "cpu"]
    )
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "could not reach the Hugging Face Hub at http://127.0.0.1:9" in text


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A local stand-in for the Hub, reached through the real client (HF_ENDPOINT)."""
    repo = Repo(
        "org/model",
        files={"config.json": b'{"model_type": "llama"}'},
        revisions={"v2": {"config.json": b'{"model_type": "llama"}'}},
    )
    with HubServer([repo]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_script_pins_the_hub_revision_it_would_test(hub: HubServer) -> None:
    result = runner.invoke(
        app,
        [
            "script",
            "org/model",
            "--revision",
            "v2",
            "--dtype",
            "float32",
            "--cores",
            "4",
            "--compile-backend",
            "aot_eager",
        ],
    )
    assert result.exit_code == 0, result.output
    config = read_config(result.stdout)
    assert config.model == "org/model"
    assert config.revision == hub.repos["org/model"].sha("v2")  # the commit, not the tag
    assert (config.dtype, config.cores, config.parallelism.value) == ("float32", 4, "tensor")
    assert config.compile_backend == "aot_eager"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["script", "org/missing"], "is not on the Hub"),
        (["script", "org/model", "--revision", "nope"], "has no revision 'nope'"),
    ],
)
def test_unknown_hub_models_and_revisions_are_refused(
    hub: HubServer, args: list[str], message: str
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_script_for_a_local_checkpoint_uses_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["script", "./ckpt", "--revision", "ignored", "--cores", "1"])
    assert result.exit_code == 0, result.output
    config = read_config(result.stdout)
    assert config.model == str((tmp_path / "ckpt").resolve())
    assert config.revision is None


def test_script_sizes_the_model_and_says_when_it_would_not_run(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = runner.invoke(app, ["script", str(tmp_path / "ckpt")])
    assert result.exit_code == 3
    text = " ".join(result.output.split())
    assert "would not be run (no-safetensors)" in text


def test_results_on_an_empty_location_says_what_to_do(tmp_path: Path) -> None:
    result = runner.invoke(app, ["results", "--results", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "model-support run MODEL" in " ".join(result.output.split())


def test_a_corrupt_checkpoint_is_refused_before_anything_runs(tmp_path: Path) -> None:
    checkpoint = tmp_path / "corrupt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    # A download cut short: the header announces 4 KiB of JSON, 20 bytes follow.
    (checkpoint / "model.safetensors").write_bytes(
        (4096).to_bytes(8, "little") + b'{"weight": {"dtype": '
    )
    result = runner.invoke(app, ["run", str(checkpoint), "--results", str(tmp_path / "results")])
    assert result.exit_code == 2
    compact = "".join(result.output.split())  # rich wraps long paths anywhere
    assert "cannotsize" in compact and "model.safetensors:headertruncated" in compact
    assert "→" not in result.output  # the cancelled one-core run showed no progress
    assert not (tmp_path / "results").exists()  # nothing recorded for a checkpoint that cannot load
