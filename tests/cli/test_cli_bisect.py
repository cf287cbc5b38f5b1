"""`model-support bisect` for real: a package index built here holds a compile backend in eight
versions, the sixth of which starts miscompiling, and a helper package in four harmless ones;
each step runs the tiny Llama's run.py in a virtual environment of its own with the step's
versions installed from that index by pip."""

from __future__ import annotations

import importlib.metadata
import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from factories import CPU_STACK, T0, make_record
from package_index import BACKEND, HELPER, build_index
from typer.testing import CliRunner

from model_support.cli import app
from model_support.config import RunConfig, VerificationConfig
from model_support.records import RunRecord
from model_support.script import render_script
from model_support.store import ResultsStore
from model_support.vocabulary import LocalizeMode, Result

runner = CliRunner()

MODEL_ID = "demo/tiny-llama"


@pytest.fixture(scope="module")
def index_url() -> str:
    return build_index([BACKEND, HELPER])


@pytest.fixture
def isolated_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip reads only the index a test names (not this machine's pip configuration)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INPUT", "1")


def endpoint(path: Path, result: Result, backend: str, helper: str, hour: int) -> RunRecord:
    """A row of the tiny Llama run here with the backend and helper at these versions."""
    config = RunConfig(
        model=str(path),
        backend="cpu",
        compile_backend="tiny_compile_backend:compile",
        max_new_tokens=6,
        prompts=["The capital of France is"],
        verification=VerificationConfig(localize=LocalizeMode.NEVER),
    )
    here = {d: importlib.metadata.version(d) for d in ("torch", "transformers")}
    stack = CPU_STACK.model_copy(update=here)
    packages = [f"torch=={here['torch']}", f"transformers=={here['transformers']}",
                f"tiny-compile-backend=={backend}", f"tiny-helper=={helper}"]  # fmt: skip
    return make_record(
        str(path),
        result,
        neuron=False,
        stack=stack,
        finished=T0 + timedelta(hours=hour),
        run_py=render_script(config),
        document={"packages": packages, "compile_backend": config.compile_backend},
        model_id=MODEL_ID,
    )


@pytest.mark.slow
def test_bisect_names_the_first_bad_version_and_reuses_its_steps(
    tiny_llama_path: Path, index_url: str, isolated_pip: None, tmp_path: Path
) -> None:
    store = ResultsStore(tmp_path / "results")
    good = endpoint(tiny_llama_path, Result.PASS, "1.0.0", "2.0.0", 0)
    bad = endpoint(tiny_llama_path, Result.FAIL, "1.0.7", "2.0.0", 1)
    for record in (good, bad):
        store.add(record)
    store.materialize()
    common = ["--results", str(tmp_path / "results"), "--index-url", index_url,
              "--workdir", str(tmp_path / "envs"), "--json"]  # fmt: skip

    # One package changed, eight versions: the miscompiling one in three steps.
    found = runner.invoke(
        app, ["bisect", MODEL_ID, "--good", good.run_id, "--bad", bad.run_id, *common]
    )
    assert found.exit_code == 0, found.output
    report = json.loads(found.stdout)
    (suspect,) = report["plan"]["suspects"]
    assert suspect["versions"] == list(BACKEND.versions)
    steps = report["steps"]
    # Alone at its bad version it is the bad row itself (reused), then three bisection steps.
    assert [(s["version"], s["reused"]) for s in steps] == [
        ("1.0.7", True), ("1.0.3", False), ("1.0.5", False), ("1.0.4", False),
    ]  # fmt: skip
    assert [(s["result"], s["verdict"]) for s in steps[1:]] == [
        ("PASS", "good"), ("FAIL", "bad"), ("PASS", "good"),
    ]  # fmt: skip
    (culprit,) = report["conclusion"]["culprits"]
    assert culprit == {
        "package": "tiny-compile-backend", "last_good": "1.0.4", "first_bad": "1.0.5",
        "result": "FAIL", "run_id": steps[2]["run_id"],
    }  # fmt: skip
    steps_root = (tmp_path / "results" / "bisect").resolve()
    assert report["reproduce"] == [
        f"model-support reproduce {steps[2]['run_id']} --results {steps_root}"
    ]
    # Each step ran with its own version, every other package as the good side had it.
    kept = ResultsStore(steps_root)
    first_bad = kept.get(steps[2]["run_id"])
    assert "tiny-compile-backend==1.0.5" in first_bad.document.packages
    assert "tiny-helper==2.0.0" in first_bad.document.packages
    assert first_bad.model_id == MODEL_ID and first_bad.source == "bisect"

    # Two packages changed (the helper harmlessly): each is tried alone, the backend is
    # bisected again, and every step already run is reused; only the helper alone runs.
    both = endpoint(tiny_llama_path, Result.FAIL, "1.0.7", "2.0.3", 2)
    store.add(both)
    store.materialize()
    again = runner.invoke(
        app, ["bisect", MODEL_ID, "--good", good.run_id, "--bad", both.run_id, *common]
    )
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout)
    assert [s["name"] for s in second["plan"]["suspects"]] == [
        "tiny-compile-backend", "tiny-helper",
    ]  # fmt: skip
    assert [(s["package"], s["version"], s["reused"], s["verdict"]) for s in second["steps"]] == [
        ("tiny-compile-backend", "1.0.7", True, "bad"),
        ("tiny-helper", "2.0.3", False, "good"),
        ("tiny-compile-backend", "1.0.3", True, "good"),
        ("tiny-compile-backend", "1.0.5", True, "bad"),
        ("tiny-compile-backend", "1.0.4", True, "good"),
    ]
    assert second["conclusion"]["innocent"] == ["tiny-helper"]
    assert [c["first_bad"] for c in second["conclusion"]["culprits"]] == ["1.0.5"]
    assert len(list(kept.records())) == 4  # three steps, then one
    # Markdown: every step, its verdict, and the conclusion.
    text = runner.invoke(
        app, ["bisect", MODEL_ID, "--good", good.run_id, "--bad", both.run_id,
              *common[:-1]],
    ).stdout  # fmt: skip
    assert "first bad version: tiny-compile-backend 1.0.5 (FAIL; 1.0.4 is good)" in text
    assert "tiny-helper alone do(es) not break it" in text


def test_cluster_writes_the_resource_and_refuses_what_the_operator_cannot_read(
    tmp_path: Path,
) -> None:
    """`bisect --cluster` runs nothing here: it writes the ModelSupportBisect (checked as the
    operator checks it), and refuses options that only mean something on this machine."""
    written = tmp_path / "bisect.yaml"
    done = runner.invoke(
        app,
        ["bisect", "org/model", "--good", "neuronx-cc 2.27.1000.0", "--bad", "2.28.7631.0",
         "--cluster", "--results", "s3://bucket/model-support", "--package", "neuronx-cc",
         "--extra-index-url", "https://pip.repos.neuron.amazonaws.com", "--namespace", "ml",
         "-o", str(written)],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    manifest = yaml.safe_load(written.read_text())
    assert manifest["kind"] == "ModelSupportBisect" and manifest["metadata"]["namespace"] == "ml"
    assert len(manifest["metadata"]["name"]) <= 40
    assert manifest["spec"] == {
        "model": "org/model", "good": "neuronx-cc 2.27.1000.0", "bad": "2.28.7631.0",
        "results": "s3://bucket/model-support", "packages": ["neuronx-cc"],
        "index": {"extraIndexUrls": ["https://pip.repos.neuron.amazonaws.com"]},
        "timeoutSeconds": 3600,
    }  # fmt: skip
    assert f"kubectl apply -f {written}" in done.stderr
    for extra, said in (
        (["--results", "results"], "is a path on this machine"),
        (["--find-links", "/wheels"], "--find-links and --workdir are for steps run here"),
        (["--index-url", "ftp://index.example/simple"], "spec.index.indexUrl"),
        (["--name", "Not_A_Name"], "is a DNS label"),
    ):
        refused = runner.invoke(
            app, ["bisect", "org/model", "--good", "a", "--bad", "b", "--cluster", *extra]
        )
        assert refused.exit_code == 2 and said in refused.output, refused.output
