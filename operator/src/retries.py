"""When the operator tries again: capped exponential backoff, kept in memory.

Three things are retried, each with its own rule:

* sizing that could not reach the Hub, or a create the API server refused for now (a quota,
  throttling): the generation is reconciled again after ``sizing_retry_base_s`` x 2^tries,
  capped at ``retry_cap_s``; after ``sizing_max_retries`` sizing gives up (recorded as
  ERROR/infrastructure);
* a recording deferred (no document readable yet, the store refused): tried again after the
  watchdog's interval, doubled each time, capped at ``retry_cap_s``;
* a runner whose node went away: another attempt in a new Job, up to ``max_attempts``.

Losing these timers on a restart loses nothing but a wait: the test's status says it waits
(its conditions), and the new process tries at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from model_support.operator.settings import OperatorSettings


@dataclass(frozen=True)
class _Backoff:
    """When something is tried again, how many tries it had and the delay that led there."""

    next_at: float
    tries: int
    delay: float


class Retries:
    """The backoff of each generation's sizing (by test uid and generation) and each run's
    recording (by run id)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._sizing: dict[tuple[str, int], _Backoff] = {}
        self._recording: dict[str, _Backoff] = {}

    # ---------------------------------------------------------------- sizing and creates

    def sizing_tries(self, key: tuple[str, int]) -> int | None:
        """How many tries a generation's sizing had; None while its next try is not due."""
        with self._lock:
            backoff = self._sizing.get(key)
        if backoff is None:
            return 0
        return backoff.tries if time.monotonic() >= backoff.next_at else None

    def sizing_gives_up(self, tries: int) -> bool:
        """Whether sizing, failed ``tries`` + 1 times, is given up (recorded as an error)."""
        return tries >= self.settings.sizing_max_retries

    def size_later(self, key: tuple[str, int], tries: int) -> float:
        """Try a generation again after a capped backoff; returns the delay in seconds."""
        delay = min(self.settings.retry_cap_s, self.settings.sizing_retry_base_s * 2**tries)
        with self._lock:
            self._sizing[key] = _Backoff(time.monotonic() + delay, tries + 1, delay)
        return delay

    def sized(self, key: tuple[str, int]) -> None:
        """Sizing answered: the generation's backoff is over."""
        with self._lock:
            self._sizing.pop(key, None)

    # ---------------------------------------------------------------- recording

    def recording_due(self, run_id: str) -> bool:
        """Whether a run's recording may be tried now (never deferred, or its backoff passed)."""
        with self._lock:
            backoff = self._recording.get(run_id)
        return backoff is None or time.monotonic() >= backoff.next_at

    def record_later(self, run_id: str) -> float:
        """Try a run's recording again after a backoff (the watchdog's interval, doubled each
        time, capped); returns the delay in seconds."""
        with self._lock:
            previous = self._recording.get(run_id)
            delay = min(
                self.settings.retry_cap_s,
                previous.delay * 2 if previous else self.settings.watchdog_interval_s,
            )
            tries = previous.tries + 1 if previous else 1
            self._recording[run_id] = _Backoff(time.monotonic() + delay, tries, delay)
        return delay

    def recorded(self, run_id: str) -> None:
        """A run is recorded: its backoff is over."""
        with self._lock:
            self._recording.pop(run_id, None)

    # ---------------------------------------------------------------- node loss

    def another_attempt(self, attempt: int) -> bool:
        """Whether a run whose node went away at ``attempt`` gets another attempt."""
        return attempt < self.settings.max_attempts


__all__ = ["Retries"]
