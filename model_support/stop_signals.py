"""What a process does when asked to stop (SIGINT: Ctrl-C; SIGTERM: kill, a pod's eviction)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

STOPPED_EXIT = 128 + signal.SIGTERM
"""143: the status of a runner pod's container (the runner, an init step) asked to stop, and
only then. The runner Job's pod failure policy ignores it (a preemption or a deleted pod is not
the run's outcome), so a program that exits 143 by itself is reported as 1."""

StopHandler = Callable[[int, FrameType | None], object]


@contextmanager
def on_stop_signals(handler: StopHandler) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM call ``handler``; the previous handlers come back
    after it, however it ends. Main thread only (Python delivers signals there).

    Both signals are always set, never left to Python's default: a process started with SIGINT
    ignored (a shell's background job is, and passes that on through exec) would otherwise never
    stop on Ctrl-C.
    """
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
