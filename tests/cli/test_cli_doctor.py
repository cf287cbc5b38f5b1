"""`model-support doctor` on this CPU machine: every check it adds to run.py's node checks
(TorchNeuron, the compile cache target, the results store, the Hub) on its failure path and its
passing one; the node checks' own failure paths are in tests/runner/test_trainium.py.

The Hub is the local stand-in (tests/hubserver.py) reached through the real huggingface_hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hubserver import HubServer, Repo
from ports import unused_port
from typer.testing import CliRunner

from model_support.cli import app
from model_support.compile_cache.compilers import CompilerCache
from model_support.doctor import compile_cache_check


def _doctor(*args: str) -> tuple[int, dict[str, dict]]:
    result = CliRunner().invoke(app, ["doctor", "--json", *args])
    report = json.loads(result.stdout)
    assert report["ok"] == (result.exit_code == 0)
    return result.exit_code, {c["name"]: c for c in report["checks"]}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> HubServer:
    public = Repo("org/open", files={"config.json": b"{}"})
    gated = Repo("org/gated", files={"config.json": b"{}"}, gated="manual", access={"hf_ok"})
    with HubServer([public, gated]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def test_this_cpu_machine_cannot_run_trainium_tests(hub: HubServer, tmp_path: Path) -> None:
    code, checks = _doctor("--results", str(tmp_path / "results"), "--model", "org/open")
    assert code == 1
    assert list(checks) == [
        "device files",
        "versions",
        "cores and LNC",
        "compile cache folder",
        "fallback setting",
        "runtime and driver",
        "device facts",
        "TorchNeuron",
        "smoke test",
        "compile cache target",
        "results store",
        "Hub",
    ]
    assert (
        not checks["device files"]["ok"] and "no /dev/neuron*" in checks["device files"]["detail"]
    )
    assert "aws.amazon.com/neuroncore" in checks["device files"]["fix"]  # each failure's fix
    assert "torch-neuronx missing" in checks["versions"]["detail"]
    assert "torch_neuronx failed to import" in checks["TorchNeuron"]["detail"]
    assert "neuronx-cc is not installed" in checks["compile cache target"]["detail"]
    assert all(c["fix"] for c in checks.values() if c["status"] == "FAILED")
    # Nothing to prove on a machine without a Neuron device: not applicable, not failed.
    for name in ("smoke test", "device facts", "runtime and driver"):
        assert checks[name]["status"] == "n/a", checks[name]
    # a sharded run takes its own devices' cores, not cores 0..n-1
    assert "0..n-1" not in checks["cores and LNC"]["detail"]
    # what this machine does have passes
    assert checks["results store"]["ok"], checks["results store"]
    assert checks["Hub"]["ok"] and "org/open readable" in checks["Hub"]["detail"]
    assert not (tmp_path / "results").exists()  # the probe leaves nothing behind


def test_an_unwritable_store_and_an_unreachable_hub_fail_their_checks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{unused_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    code, checks = _doctor("--results", str(tmp_path / "a-file" / "results"))
    assert code == 1
    assert not checks["results store"]["ok"]
    assert "cannot write to the results store" in checks["results store"]["detail"]
    assert not checks["Hub"]["ok"]
    assert "could not reach the Hugging Face Hub at http://127.0.0.1:" in checks["Hub"]["detail"]


def test_a_gated_model_needs_a_token_with_access(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, checks = _doctor("--model", "org/gated")
    assert not checks["Hub"]["ok"] and "HF_TOKEN" in checks["Hub"]["fix"]
    monkeypatch.setenv("HF_TOKEN", "hf_ok")
    _, checks = _doctor("--model", "org/gated")
    assert checks["Hub"]["ok"], checks["Hub"]
    _, checks = _doctor("--model", "org/missing")
    assert not checks["Hub"]["ok"] and "org/missing is not on" in checks["Hub"]["detail"]


def test_the_compile_cache_target_must_hold_the_installed_compilers_prefix(tmp_path: Path) -> None:
    installed = CompilerCache("neff", "neuronx-cc", "2.28.7631.0+6f62ff7c", tmp_path / "neff")
    other = compile_cache_check(str(tmp_path / "cache" / "neuronxcc-2.27.1.0"), installed, None)
    assert not other.ok and "neuronx-cc 2.27.1.0" in other.detail
    same = compile_cache_check(str(tmp_path / "cache" / "neuronxcc-2.28.7631.0"), installed, None)
    assert same.ok and same.detail.endswith("/cache/neuronxcc-2.28.7631.0")
    root = compile_cache_check(str(tmp_path / "cache"), installed, None)
    assert root.ok and root.detail.endswith("/cache/neuronxcc-2.28.7631.0")


def test_the_table_prints_what_it_found_as_text(hub: HubServer, tmp_path: Path) -> None:
    """Details are data: a path with Rich markup in it is printed as typed."""
    odd = tmp_path / "[bold]x[/bold]"
    result = CliRunner().invoke(app, ["doctor", "--results", str(odd)], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "device files" in result.stdout
    assert "[bold]x[/bold]" in result.stdout.replace("\n", "").replace(" ", "")
