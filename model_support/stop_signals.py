"""What a process does when asked to stop (SIGINT: Ctrl-C; SIGTERM: kill, a pod's eviction)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

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
