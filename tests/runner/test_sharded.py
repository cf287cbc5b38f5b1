"""Sharded runs: run.py starts its own workers, shards the model, and fails loudly per rank."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil
import pytest
from processes import environment_value, listening_addresses, processes_with
from typer.testing import CliRunner
from waiting import wait_until

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


def _two_core_llama(demo_models: dict[str, DemoModel], fault: str, **settings: float) -> RunConfig:
    """A tensor-parallel run of the tiny Llama on two cores, compiled by ``fault`` (one of
    model_support.faults), with ``settings`` (e.g. worker_timeout_s) over the defaults."""
    return RunConfig(
        model=str(demo_models["tiny-llama"].require_path()),
        compile_backend=f"model_support.faults:{fault}",
        cores=2,
        parallelism=Parallelism.TENSOR,
        **settings,
    )


def test_a_fault_on_one_rank_only_fails_the_run(demo_models: dict[str, DemoModel]) -> None:
    config = _two_core_llama(demo_models, "noise_100pct")
    doc = run_local(
        config,
        timeout_s=600,
        env={"MODEL_SUPPORT_FAULT_RANK": "1", "MODEL_SUPPORT_FAULT_LAYER": "0"},
    ).document
    assert doc.result == Result.FAIL, (doc.error, doc.verification.reason)
    assert doc.verification.reason


def test_a_killed_worker_gives_error_not_a_hang(demo_models: dict[str, DemoModel]) -> None:
    config = _two_core_llama(demo_models, "kill_worker", worker_timeout_s=300)
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
    config = _two_core_llama(demo_models, "hang_worker", worker_timeout_s=25)
    start = time.monotonic()
    doc = run_local(config, timeout_s=600, env={"MODEL_SUPPORT_RUN_MARKER": marker}).document
    assert (doc.result, doc.error_class) == (Result.ERROR, ErrorClass.WORKER_CRASH)
    assert "gave no result within 25 s" in doc.error
    assert time.monotonic() - start < 120
    assert processes_with(marker) == []


def _launcher_and_workers(marker: str) -> tuple[psutil.Process, list[psutil.Process]] | None:
    """run.py's process of the run marked ``marker`` and its spawned workers, once both are up."""
    try:
        ours = [psutil.Process(pid) for pid in processes_with(marker)]
        launchers = [p for p in ours if p.cmdline()[-1:] == ["run.py"]]
        if not launchers:
            return None
        workers = [p for p in launchers[0].children() if "spawn_main" in " ".join(p.cmdline())]
    except psutil.NoSuchProcess:  # one ended while we looked (a helper process): look again
        return None
    return (launchers[0], workers) if len(workers) == 2 else None


def test_the_workers_meet_on_a_port_the_launcher_holds_from_before_they_start(
    demo_models: dict[str, DemoModel],
) -> None:
    """No other program can take the rendezvous port between its choice and the workers' use:
    the launcher (run.py's own process) listens on it, not a worker that binds it later, after
    a gap in which a busy host once took it and the run ended in EADDRINUSE."""
    marker = f"rendezvous-{uuid.uuid4().hex}"
    config = _two_core_llama(demo_models, "hang_worker", worker_timeout_s=60)
    run = BackgroundRun(config, timeout_s=600, env={"MODEL_SUPPORT_RUN_MARKER": marker})
    try:
        launcher, workers = wait_until(
            lambda: _launcher_and_workers(marker), "run.py and its two workers", timeout=60
        )
        ports = {environment_value(w.pid, "MASTER_PORT") for w in workers}
        assert len(ports) == 1 and None not in ports
        port = int(ports.pop())
        assert listening_addresses(launcher.pid, port), f"run.py does not listen on {port}"
        for worker in workers:
            assert listening_addresses(worker.pid, port) == []
    finally:
        run.cancel()
    assert processes_with(marker) == []
