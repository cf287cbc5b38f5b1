"""Work on one resource at a time: a call while its work runs makes that run go round again."""

from __future__ import annotations

import threading
from collections.abc import Callable


class OneAtATime:
    """Runs each key's work in one thread at a time. A call for a key whose work is running
    returns at once and makes the running one go round again when it ends (so what changed
    meanwhile is seen), rather than blocking a watch thread or running the same work twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._again: set[str] = set()

    def run(self, key: str, work: Callable[[], None]) -> None:
        """Run ``work`` for ``key`` now, or have the running one go round once more."""
        with self._lock:
            if key in self._busy:
                self._again.add(key)
                return
            self._busy.add(key)
        try:
            while True:
                work()
                with self._lock:
                    if key not in self._again:
                        self._busy.discard(key)
                        return
                    self._again.discard(key)
        except BaseException:
            with self._lock:
                self._busy.discard(key)
                self._again.discard(key)
            raise

    def again(self, key: str) -> None:
        """Have ``key``'s running work go round once more when it ends."""
        with self._lock:
            self._again.add(key)
