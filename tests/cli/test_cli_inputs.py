"""The command line refuses bad input clearly, before anything runs, and loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


# --- numbers, results locations, configs and offline: one line saying what to do, exit 2 --------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cores", "0"], "--cores"),
        (["--max-cores", "0"], "--max-cores"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--timeout", "nan"], "greater than 0"),
        (["--timeout", "-5"], "greater than 0"),
        (["--timeout", "0"], "greater than 0"),
        (["--timeout", "inf"], "greater than 0"),
    ],
)
def test_numbers_out_of_range_are_refused(
    args: list[str], message: str, tmp_path: Path, tiny_llama_path: Path
) -> None:
    results = tmp_path / "results"
    result = runner.invoke(app, ["run", str(tiny_llama_path), *args, "--results", str(results)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not results.exists()


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("memory://x", "lost when it exits"),
        ("nosuch://x", "Protocol not known: nosuch"),
        ("http://127.0.0.1:9/results", "read-only"),
        ("https://example.com/results", "read-only"),
    ],
)
def test_results_locations_that_would_lose_the_result_are_refused(
    location: str, message: str, tiny_llama_path: Path
) -> None:
    result = runner.invoke(
        app, ["run", str(tiny_llama_path), "--cores", "1", "--results", location]
    )
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert message in text and "Traceback" not in text
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_an_unwritable_results_location_is_refused_before_the_run(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = runner.invoke(
        app, ["run", str(tiny_llama_path), "--cores", "1", "--results", str(blocker / "results")]
    )
    assert result.exit_code == 2
    assert "cannot write to the results store" in " ".join(result.output.split())
    assert "→" not in result.output  # run.py never started


def test_a_folder_of_other_files_is_refused_unless_forced(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("my project")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (checkpoint / "pytorch_model.bin").write_bytes(b"pickle")
    result = runner.invoke(app, ["run", str(checkpoint), "--cores", "1", "--results", str(folder)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "already holds other files (README.md)" in text and "--force" in text
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]
    forced = runner.invoke(
        app, ["run", str(checkpoint), "--cores", "1", "--results", str(folder), "--force"]
    )
    assert forced.exit_code == 3, forced.output  # excluded (no safetensors), and recorded
    assert (folder / "README.md").read_text() != "my project"  # the card, as asked
    assert len(list((folder / "records").iterdir())) == 1


def test_a_config_with_zero_attention_heads_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "zero-heads"
    checkpoint.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_attention_heads": 0,
        "hidden_size": 64,
    }
    (checkpoint / "config.json").write_text(json.dumps(config))
    (checkpoint / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    result = runner.invoke(app, ["size", str(checkpoint)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "sets num_attention_heads to 0; it must be a positive integer" in text


def test_sizing_a_hub_model_offline_says_so(tmp_path: Path) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE when imported: a fresh process, as users run it.
    cli = str(Path(sys.executable).with_name("model-support"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for args in (["size", "org/model"], ["run", "org/model", "--results", str(tmp_path / "r")]):
        done = subprocess.run(
            [cli, *args], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        assert done.returncode == 2, done.stderr[-2000:]
        text = " ".join(done.stderr.split())
        assert "HF_HUB_OFFLINE is set" in text and "Traceback" not in text
        assert len(done.stderr.strip().splitlines()) <= 3  # a short message, not a traceback


def test_a_pickle_only_checkpoint_is_refused_the_same_way_with_and_without_cores(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "pickled"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    (checkpoint / "pytorch_model.bin").write_bytes(b"a pickle")
    messages = []
    for extra in ([], ["--cores", "2"]):
        results = tmp_path / f"results{len(extra)}"
        result = runner.invoke(
            app, ["run", str(checkpoint), "--results", str(results), "--json", *extra]
        )
        assert result.exit_code == 3, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["result"] == "EXCLUDED"
        messages.append(summary["error"])
        [record] = (results / "records").iterdir()
        assert json.loads(record.read_text())["exclusion_reason"] == "no-safetensors"
    assert messages[0] == messages[1] and "pickle checkpoints are not loaded" in messages[0]
    sized = runner.invoke(app, ["size", str(checkpoint)])
    assert sized.exit_code == 3 and "pickle checkpoints are not loaded" in sized.output


def test_an_unsupported_task_model_is_excluded_not_an_error_with_and_without_cores(
    tmp_path: Path,
) -> None:
    """A CTC speech model (run.py's speech loader takes sequence-to-sequence models only)."""
    from safetensors.torch import save_file
    from torch import zeros

    checkpoint = tmp_path / "ctc"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"]})
    )
    save_file({"lm_head.weight": zeros(4, 4)}, str(checkpoint / "model.safetensors"))
    for extra in ([], ["--cores", "1"]):
        results = tmp_path / f"results{len(extra)}"
        result = runner.invoke(
            app,
            [
                *("run", str(checkpoint), "--task", "automatic-speech-recognition"),
                *("--results", str(results), "--json", *extra),
            ],
        )
        assert result.exit_code == 3, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["result"] == "EXCLUDED" and "Wav2Vec2ForCTC" in summary["error"]
        [record] = (results / "records").iterdir()
        assert json.loads(record.read_text())["exclusion_reason"] == "unsupported-task"


@pytest.mark.slow
def test_given_cores_a_local_diffusers_pipeline_is_not_excluded() -> None:
    """A pipeline keeps its weights in component folders, not a root model.safetensors."""
    from model_support.checkpoints import build_demo_models, default_cache_dir
    from model_support.cli.commands_run import given_cores_exclusion
    from model_support.config import RunConfig
    from model_support.vocabulary import Task

    (pipeline,) = build_demo_models(default_cache_dir(), ["tiny-stable-diffusion"])
    config = RunConfig(model=str(pipeline.require_path()), task=Task.TEXT_TO_IMAGE, cores=1)
    assert given_cores_exclusion(config, None, None) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cache", "prune", "{tmp}/cache", "--older-than", "nan"], "--older-than nan: give a"),
        (["cache", "pull", "{tmp}/cache", "--deadline", "inf"], "--deadline inf: give a finite"),
        (["cache", "push", "{tmp}/cache", "--report", "/"], "--report /: that is a folder"),
        (["cache", "pull", "s3://"], "s3:// names no bucket"),
        (["cache", "pull", "{tmp}/a-file"], "is a file, not a folder"),
        (["demo", "--timeout", "-1"], "--timeout -1: give a positive number of seconds"),
        (["demo", "--timeout", "nan"], "--timeout nan: give a positive number of seconds"),
        (["demo", "--results", "{tmp}/a-file"], "that is a file; give a folder"),
        (
            ["run", "org/name", "--compile-backend", "a b:c", "--results", "{tmp}/results"],
            "expected a backend name or module:function",
        ),
        (["results", "--results", "{tmp}/results"], "first run `model-support run MODEL"),
        (
            ["viewer", "--results", "{tmp}", "--address", "999.1.1.1"],
            "999.1.1.1 is not an IP address or a name this machine resolves",
        ),
        (["viewer", "--results", "weird://x"], "Protocol not known: weird"),
        (["sweep", "nightly", "--output", "{tmp}"], "that is a folder; give a file in it"),
        (["sweep", "nightly", "-o", "{tmp}/a-file/x.yaml"], "a-file is a file; give a file in"),
    ],
)
def test_each_bad_input_is_one_clear_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nonsense the commands once took (or crashed on): a message that says what to give, exit
    2, and nothing run or written."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing may reach a Hub
    monkeypatch.setattr(os, "execve", _no_exec)  # the viewer must refuse before it starts
    (tmp_path / "a-file").write_text("a plain file")
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, (output, result.exception)
    assert message in output
    assert "Traceback" not in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


def _no_exec(path: str, args: list[str], env: dict[str, str]) -> None:
    raise AssertionError(f"started {' '.join(args)} for input it should have refused")


TEST_HEAD = "apiVersion: modelsupport.dev/v1alpha1\nkind: ModelSupportTest\n"


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        (
            {
                "t.yaml": (TEST_HEAD + "metadata: {name: caf\xe9}\nspec: {model: a/b}\n").encode(
                    "latin-1"
                )
            },
            ["render", "-f", "{tmp}/t.yaml"],
            "t.yaml is not UTF-8 text (byte 0xe9 at offset 81): save it as UTF-8",
        ),
        (
            {
                "t.yaml": TEST_HEAD + "metadata: {name: t}\nspec: {model: a/b}\n",
                "v.yaml": b"results: \xff\n",
            },
            ["render", "-f", "{tmp}/t.yaml", "--values", "{tmp}/v.yaml"],
            "v.yaml is not UTF-8 text (byte 0xff at offset 9)",
        ),
        (
            {"t.yaml": TEST_HEAD + "metadata: [t]\nspec: {model: a/b}\n"},
            ["render", "-f", "{tmp}/t.yaml"],
            "ModelSupportTest #1: metadata is a list; it must be a mapping",
        ),
        (
            {"t.yaml": TEST_HEAD + "metadata: {name: t, generation: two}\nspec: {model: a/b}\n"},
            ["render", "-f", "{tmp}/t.yaml"],
            "metadata.generation: Input should be a valid integer",
        ),
        (
            {"t.yaml": TEST_HEAD + "metadata: {name: [t]}\nspec: {model: a/b}\n"},
            ["render", "-f", "{tmp}/t.yaml"],
            "metadata.name: Input should be a valid string; the API server would refuse it",
        ),
        (
            {"t.yaml": TEST_HEAD + "metadata: {name: t}\nspec: [a/b]\n"},
            ["render", "-f", "{tmp}/t.yaml"],
            "ModelSupportTest #1: spec is a list; it must be a mapping",
        ),
        (
            {
                "t.yaml": TEST_HEAD + "metadata: {name: t}\nspec: {model: a/b}\n",
                "v.yaml": "- results\n",
            },
            ["render", "-f", "{tmp}/t.yaml", "--values", "{tmp}/v.yaml"],
            "v.yaml holds a list; it must be a mapping of chart values",
        ),
        (
            {
                "t.yaml": TEST_HEAD + "metadata: {name: t}\nspec: {model: a/b}\n",
                "v.yaml": "results: /r\nresultsVolume: on\nrunner: {env: 3}\nwatchNamespaces: ns\n",
            },
            ["render", "-f", "{tmp}/t.yaml", "--values", "{tmp}/v.yaml"],
            "watchNamespaces: Input should be a valid list; resultsVolume: Input should be a "
            "mapping; runner.env: Input should be a valid list",
        ),
    ],
)
def test_each_bad_file_is_one_clear_line_and_exit_2(
    files: dict[str, str | bytes],
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Files the commands once crashed on (not UTF-8, fields of the wrong type): a message that
    names the file and the field, exit 2, the files left as they were."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing may reach a Hub
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, (output, result.exception)
    assert message in output
    assert "Traceback" not in output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_the_script_carries_when_to_localize_a_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.chdir(tmp_path)
    default = runner.invoke(app, ["script", "./ckpt", "--cores", "1"])
    assert read_config(default.stdout).verification.localize == "on_fail"
    result = runner.invoke(app, ["script", "./ckpt", "--cores", "1", "--localize", "always"])
    assert result.exit_code == 0, result.output
    assert read_config(result.stdout).verification.localize == "always"
    refused = runner.invoke(app, ["run", "./ckpt", "--localize", "sometimes"])
    assert refused.exit_code == 2 and "sometimes" in refused.output
