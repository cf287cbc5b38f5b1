"""An init step of a runner pod, run so that the pod's stop signal stops it.

    python3 -m model_support.pod_step -- COMMAND [ARG...]

A container's command is PID 1 of the container's PID namespace, and the kernel delivers no
signal to PID 1 that PID 1 has no handler for (pid_namespaces(7)). pip, or the compile cache
pull, started directly as an init container's command would ignore the SIGTERM of a Kueue
preemption, a deleted pod or a drained node, and be killed with SIGKILL when the grace period
ends (exit 137): the runner Job's pod failure policy cannot tell that from a crash. Run through
this wrapper (PID 1 then), the step is stopped the way the runner stops run.py: SIGTERM (or
SIGINT) is passed on to the step's process group, which gets :data:`STOP_GRACE_S` before
SIGKILL, and the wrapper exits 143 (:data:`model_support.stop_signals.STOPPED_EXIT`), which the
policy ignores. The step's own status is passed through otherwise, except 143 (the step was not
asked to stop), which becomes 1: 143 always means "asked to stop".

Only the standard library and model_support.execution are imported: it runs in the runner
image before anything else.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from model_support.execution import run_command
from model_support.stop_signals import STOPPED_EXIT, on_stop_signals

STOP_GRACE_S = 10.0
"""How long a stopped step has before SIGKILL: well within the kubelet's default grace period
(30 s), so the wrapper's own 143 is what the kubelet reports."""


def step_status(returncode: int | None, stopped: bool) -> int:
    """The wrapper's exit status for a step that ended with ``returncode`` (negative: killed
    by that signal); ``stopped``: the wrapper was asked to stop."""
    if stopped:
        return STOPPED_EXIT
    if returncode is None:
        return 1
    code = returncode if returncode >= 0 else 128 - returncode
    return 1 if code == STOPPED_EXIT else code


def _copy(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command after ``--``; return its status as :func:`step_status` says."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(
            "usage: python3 -m model_support.pod_step -- COMMAND [ARG...] (no command given)",
            file=sys.stderr,
        )
        return 2
    asked: list[int] = []
    # From the first moment: PID 1 without a handler would drop a stop signal that arrives
    # before the step starts (run_command passes on the ones that arrive while it runs).
    with on_stop_signals(lambda signum, _frame: asked.append(signum)):
        if asked:
            return STOPPED_EXIT
        try:
            ended = run_command(
                args, Path.cwd(), _copy, pass_on_stop_signals=True, stop_grace_s=STOP_GRACE_S
            )
        except FileNotFoundError as exc:
            print(f"model-support: the step's command {args[0]!r} was not found: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 127
    if ended.stopped or asked:
        print(
            f"model-support: the step was asked to stop ({signal.Signals.SIGTERM.name}); "
            f"exiting {STOPPED_EXIT}",
            file=sys.stderr,
            flush=True,
        )
    return step_status(ended.returncode, ended.stopped or bool(asked))


if __name__ == "__main__":
    sys.exit(main())
