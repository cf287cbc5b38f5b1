"""Sharded runs: run.py starts its own workers, shards the model, and fails loudly per rank."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil
import pytest
from processes import processes_with
from typer.testing import CliRunner

from model_support.checkpoints import DemoModel
from model_support.cli import app
from model_support.config import RunConfig
from model_support.execution import BackgroundRun, run_local
from model_support.vocabulary import ErrorClass, Parallelism, Result

pytestmark = pytest.mark.slow
runner = CliRunner()


def _cli_run(path: Path, results: Path, *extra: str) -> dict[str, object]:
    outcome = runner.invoke(
        app,
        [
            "run",
            str(path),
            "--cores",
            "2",
            "--compile-backend",
            "aot_eager",
            "--results",
            str(results),
            "--json",
            *extra,
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    return json.loads(outcome.stdout.strip().splitlines()[-1])


def test_tensor_parallel_run_passes_and_is_recorded(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    summary = _cli_run(demo_models["tiny-llama"].require_path(), tmp_path)
    assert summary["result"] == "PASS", summary
    assert (summary["cores"], summary["parallelism"]) == (2, "tensor")
    assert summary["parameters_per_core"] < 0.75 * summary["parameters"]  # really split
    rows = pd.read_parquet(tmp_path / "data")
    assert rows[["neuron_cores", "parallelism", "result"]].values.tolist() == [
        [2, "tensor", "PASS"]
    ]


def test_expert_parallel_run_of_a_moe_passes(
    demo_models: dict[str, DemoModel], tmp_path: Path
) -> None:
    summary = _cli_run(
        demo_models["tiny-qwen3-moe"].require_path(), tmp_path, "--parallelism", "expert"
    )
    assert summary["result"] == "PASS", summary
    assert (summary["cores"], summary["parallelism"]) == (2, "expert")
    assert summary["parameters_per_core"] < summary["parameters"]  # experts split, the rest whole


def test_a_fault_on_one_rank_only_fails_the_run(demo_models: dict[str, DemoModel]) -> None:
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend="model_support.faults:noise_100pct",
        cores=2,
        parallelism=Parallelism.TENSOR,
    )
    doc = run_local(
        config,
        timeout_s=600,
        env={"MODEL_SUPPORT_FAULT_RANK": "1", "MODEL_SUPPORT_FAULT_LAYER": "0"},
    ).document
    assert doc.result == Result.FAIL, (doc.error, doc.verification.reason)
    assert doc.verification.reason


def test_a_killed_worker_gives_error_not_a_hang(demo_models: dict[str, DemoModel]) -> None:
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend="model_support.faults:kill_worker",
        cores=2,
        parallelism=Parallelism.TENSOR,
        worker_timeout_s=300,
    )
    start = time.monotonic()
    doc = run_local(config, timeout_s=600).document
    assert doc.result == Result.ERROR
    assert doc.error_class == ErrorClass.WORKER_CRASH
    assert "rank 1" in doc.error and "-9" in doc.error
    assert time.monotonic() - start < 120  # noticed at once, not after worker_timeout_s
    assert doc.stack.torch  # the record still says which stack it ran on


def test_a_hung_worker_fails_the_run_within_its_bound_and_leaves_no_process(
    demo_models: dict[str, DemoModel],
) -> None:
    marker = f"hung-worker-{uuid.uuid4().hex}"
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend="model_support.faults:hang_worker",
        cores=2,
        parallelism=Parallelism.TENSOR,
        worker_timeout_s=25,
    )
    start = time.monotonic()
    doc = run_local(config, timeout_s=600, env={"MODEL_SUPPORT_RUN_MARKER": marker}).document
    assert (doc.result, doc.error_class) == (Result.ERROR, ErrorClass.WORKER_CRASH)
    assert "gave no result within 25 s" in doc.error
    assert time.monotonic() - start < 120
    assert processes_with(marker) == []


def _environment_value(pid: int, name: str) -> str | None:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, _, value = entry.decode(errors="replace").partition("=")
        if key == name:
            return value
    return None


def test_the_workers_meet_on_a_port_the_launcher_holds_from_before_they_start(
    demo_models: dict[str, DemoModel],
) -> None:
    """No other program can take the rendezvous port between its choice and the workers' use:
    the launcher (run.py's own process) listens on it, not a worker that binds it later, after
    a gap in which a busy host once took it and the run ended in EADDRINUSE."""
    marker = f"rendezvous-{uuid.uuid4().hex}"
    config = RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend="model_support.faults:hang_worker",
        cores=2,
        parallelism=Parallelism.TENSOR,
        worker_timeout_s=60,
    )
    run = BackgroundRun(config, timeout_s=600, env={"MODEL_SUPPORT_RUN_MARKER": marker})
    try:
        deadline = time.monotonic() + 60
        launcher = workers = None
        while time.monotonic() < deadline:
            ours = [psutil.Process(pid) for pid in processes_with(marker)]
            launchers = [p for p in ours if p.cmdline()[-1:] == ["run.py"]]
            if launchers:
                launcher = launchers[0]
                workers = [p for p in launcher.children() if "spawn_main" in " ".join(p.cmdline())]
            if launcher and workers and len(workers) == 2:
                break
            time.sleep(0.5)
        assert launcher is not None and workers is not None and len(workers) == 2, "no workers"
        ports = {_environment_value(w.pid, "MASTER_PORT") for w in workers}
        assert len(ports) == 1 and None not in ports
        port = int(ports.pop())
        listening = {
            c.laddr.port for c in launcher.net_connections(kind="tcp") if c.status == "LISTEN"
        }
        assert port in listening, (port, listening)
        for worker in workers:
            assert port not in {
                c.laddr.port for c in worker.net_connections(kind="tcp") if c.status == "LISTEN"
            }
    finally:
        run.cancel()
    assert processes_with(marker) == []
