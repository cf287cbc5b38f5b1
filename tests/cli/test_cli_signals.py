"""Ctrl-C or SIGTERM to `model-support run` stops run.py and its workers and leaves nothing behind.

`model-support run` is started as users start it (a process), with a marker in its
environment that run.py and its workers inherit; after the signal, no process carries the
marker and the run's temporary folder is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from processes import processes_with
from waiting import wait_until

pytestmark = pytest.mark.slow
CLI = str(Path(sys.executable).with_name("model-support"))


def _cmdlines(marker: str) -> list[str]:
    lines = []
    for pid in processes_with(marker):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # ended meanwhile
    return lines


@pytest.mark.parametrize(
    ("sig", "cores", "workers"),
    [
        (signal.SIGTERM, None, 0),  # sized: the speculative one-core run is the one stopped
        (signal.SIGINT, "2", 2),  # sharded: run.py and its two torch.distributed workers
    ],
)
def test_a_signal_stops_the_whole_run_and_cleans_up(
    tiny_llama_path: Path, tmp_path: Path, sig: signal.Signals, cores: str | None, workers: int
) -> None:
    marker = f"signal-test-{uuid.uuid4().hex}"
    temp = tmp_path / "tmp"
    temp.mkdir()
    results = tmp_path / "results"
    command = [CLI, "run", str(tiny_llama_path), "--results", str(results)]
    command += ["--compile-backend", "aot_eager", "--dtype", "float32"]
    command += ["--cores", cores] if cores else []
    env = {**os.environ, "MODEL_SUPPORT_SIGNAL_MARKER": marker, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:

        def running() -> bool:
            lines = _cmdlines(marker)
            spawned = sum("multiprocessing" in line for line in lines)
            return any("run.py" in line for line in lines) and spawned >= workers

        wait_until(running, "run.py (and its workers) to start", 180)
        assert list(temp.glob("model-support-run-*")), "run.py runs in a temporary folder"
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # The command waits for the group to die before it exits: nothing outlives it.
    wait_until(lambda: not processes_with(marker), "every process of the run to end", 5)
    assert not list(temp.glob("model-support-run-*"))  # its folder is removed
    assert proc.returncode == 128 + sig, output[-3000:]
    assert "nothing was recorded" in output
    assert not (results / "records").exists() or not any((results / "records").iterdir())
