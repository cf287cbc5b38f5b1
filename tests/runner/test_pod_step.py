"""A runner pod's init steps stop on the pod's SIGTERM (model_support.pod_step), as PID 1.

A container's command is PID 1 of its PID namespace; the kernel drops signals PID 1 has no
handler for. The steps run here as they run in a container: PID 1 of a PID namespace of their
own (``unshare --pid``, in a user namespace: no privileges needed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from model_support.stop_signals import STOPPED_EXIT

AS_PID_1 = ("unshare", "--user", "--map-root-user", "--pid", "--fork")
STEP = "import time; print('ready', flush=True); time.sleep(60)"
"""A step that takes its time (pip downloading, a cache pull) and has no SIGTERM handler."""


def start_as_pid_1(argv: list[str], cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """Start ``argv`` as PID 1 of a new PID namespace; returns the process and the host pid of
    that PID 1 (unshare itself ignores SIGTERM while it waits for it), once it printed."""
    proc = subprocess.Popen(
        [*AS_PID_1, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "ready" in line or time.monotonic() > deadline:
            break
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return proc, int(children[0])


def stopped_within(proc: subprocess.Popen[str], pid: int, seconds: float) -> int | None:
    """SIGTERM to the namespace's PID 1, as the kubelet sends it; its exit status once it
    ended within ``seconds``, else None."""
    os.kill(pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
    return proc.returncode


def test_an_init_step_stops_on_the_pods_sigterm_as_pid_1(tmp_path: Path) -> None:
    # As the init container's bare command (pip, the cache pull: no handler), PID 1 ignores
    # SIGTERM: the kubelet would SIGKILL it after the grace period (exit 137).
    bare, pid = start_as_pid_1([sys.executable, "-c", STEP], tmp_path)
    try:
        assert stopped_within(bare, pid, 3) is None
    finally:
        os.kill(pid, signal.SIGKILL)  # as the kubelet does once the grace period is over
        bare.communicate(timeout=30)
    # Through the wrapper the step stops at once and the container exits 143, which the Job's
    # pod failure policy ignores.
    wrapped, pid = start_as_pid_1(
        [sys.executable, "-m", "model_support.pod_step", "--", sys.executable, "-c", STEP],
        tmp_path,
    )
    started = time.monotonic()
    assert stopped_within(wrapped, pid, 30) == STOPPED_EXIT
    assert time.monotonic() - started < 10  # not after the step's sleep, nor a grace period


def test_a_steps_own_status_is_passed_on_and_its_own_143_is_not_a_stop(tmp_path: Path) -> None:
    def status(code: int) -> int:
        argv = [sys.executable, "-m", "model_support.pod_step", "--", sys.executable, "-c",
                f"import sys; print('installing'); sys.exit({code})"]  # fmt: skip
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert "installing" in done.stdout  # the step's output goes to the container's log
        return done.returncode

    assert (status(0), status(3), status(STOPPED_EXIT)) == (0, 3, 1)
    missing = subprocess.run(
        [sys.executable, "-m", "model_support.pod_step", "--", "no-such-program-here"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 127 and "no-such-program-here" in missing.stderr
