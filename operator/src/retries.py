"""When the operator tries again: capped exponential backoff, kept in memory.

Four things are retried, each with its own rule:

* sizing that could not reach the Hub, or a create the API server refused for now (a quota,
  throttling), of a generation's first Job or of a next attempt's: tried again after
  ``sizing_retry_base_s`` x 2^tries, capped at ``retry_cap_s``; after ``sizing_max_retries``
  sizing gives up (recorded as ERROR/infrastructure), a refused create never does;
* a recording deferred (no document readable yet, the store refused): tried again after the
  watchdog's interval, doubled each time, capped at ``retry_cap_s``;
* a runner Job whose handling failed (an API error while the watchdog offered it): offered again
  after the watchdog's interval, doubled each time, capped at ``retry_cap_s``, without holding
  up the other Jobs;
* a runner whose node went away: another attempt in a new Job, up to ``max_attempts``.

Losing these timers on a restart loses nothing but a wait: the test's status says it waits
(its conditions), and the new process tries at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from model_support.operator.jobs import AttemptKey
from model_support.operator.settings import OperatorSettings


@dataclass(frozen=True)
class _Backoff:
    """When something is tried again, how many tries it had and the delay that led there."""

    next_at: float
    tries: int
    delay: float


class Retries:
    """The backoff of each generation's sizing (by test uid and generation), each next
    attempt's create (by :data:`AttemptKey`), each run's recording (by run id) and each runner
    Job's handling (by the Job's uid)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._sizing: dict[tuple[str, int] | AttemptKey, _Backoff] = {}
        self._recording: dict[str, _Backoff] = {}
        self._jobs: dict[str, _Backoff] = {}

    # ---------------------------------------------------------------- sizing and creates

    def sizing_tries(self, key: tuple[str, int] | AttemptKey) -> int | None:
        """How many tries a generation's sizing and first create (key: uid, generation), or a
        next attempt's create (key: uid, generation, attempt) had; None while the next try is
        not due."""
        with self._lock:
            backoff = self._sizing.get(key)
        if backoff is None:
            return 0
        return backoff.tries if time.monotonic() >= backoff.next_at else None

    def sizing_gives_up(self, tries: int) -> bool:
        """Whether sizing, failed ``tries`` + 1 times, is given up (recorded as an error)."""
        return tries >= self.settings.sizing_max_retries

    def size_later(self, key: tuple[str, int] | AttemptKey, tries: int) -> float:
        """Try a generation (or a next attempt's create) again after a capped backoff; returns
        the delay in seconds."""
        delay = min(self.settings.retry_cap_s, self.settings.sizing_retry_base_s * 2**tries)
        with self._lock:
            self._sizing[key] = _Backoff(time.monotonic() + delay, tries + 1, delay)
        return delay

    def sized(self, key: tuple[str, int] | AttemptKey) -> None:
        """Sizing answered (or the next attempt's Job was created): the backoff is over."""
        with self._lock:
            self._sizing.pop(key, None)

    # ---------------------------------------------------------------- recording

    def recording_due(self, run_id: str) -> bool:
        """Whether a run's recording may be tried now (never deferred, or its backoff passed)."""
        return self._due(self._recording, run_id)

    def record_later(self, run_id: str) -> float:
        """Try a run's recording again after a backoff (the watchdog's interval, doubled each
        time, capped); returns the delay in seconds."""
        return self._later(self._recording, run_id)

    def recorded(self, run_id: str) -> None:
        """A run is recorded: its backoff is over."""
        with self._lock:
            self._recording.pop(run_id, None)

    # ---------------------------------------------------------------- a Job's handling

    def job_due(self, job_uid: str) -> bool:
        """Whether a runner Job may be offered again (its handling never failed, or its
        backoff passed)."""
        return self._due(self._jobs, job_uid)

    def job_failed(self, job_uid: str) -> float:
        """Offer a Job whose handling failed again after a backoff (the watchdog's interval,
        doubled each time, capped); returns the delay in seconds."""
        return self._later(self._jobs, job_uid)

    def job_handled(self, job_uid: str) -> None:
        """A Job was handled: its backoff (if any) is over."""
        with self._lock:
            self._jobs.pop(job_uid, None)

    def keep_jobs(self, job_uids: set[str]) -> None:
        """Forget the backoffs of Jobs no longer listed (deleted, or recorded)."""
        with self._lock:
            for gone in [uid for uid in self._jobs if uid not in job_uids]:
                del self._jobs[gone]

    def _due(self, table: dict[str, _Backoff], key: str) -> bool:
        with self._lock:
            backoff = table.get(key)
        return backoff is None or time.monotonic() >= backoff.next_at

    def _later(self, table: dict[str, _Backoff], key: str) -> float:
        with self._lock:
            previous = table.get(key)
            delay = min(
                self.settings.retry_cap_s,
                previous.delay * 2 if previous else self.settings.watchdog_interval_s,
            )
            tries = previous.tries + 1 if previous else 1
            table[key] = _Backoff(time.monotonic() + delay, tries, delay)
        return delay

    # ---------------------------------------------------------------- node loss

    def another_attempt(self, attempt: int) -> bool:
        """Whether a run whose node went away at ``attempt`` gets another attempt."""
        return attempt < self.settings.max_attempts


__all__ = ["Retries"]
