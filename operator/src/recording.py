"""Keeping a results store's matrix current while the operator records runs into it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from model_support.delivery import DeliveryArea, DeliveryError
from model_support.operator import metrics, notifications
from model_support.store import ResultsStore

log = logging.getLogger(__name__)


class Materializer:
    """Keeps one store's matrix current: at most one materialize running and one pending.

    Records are the truth and the matrix is derived, so a burst of completions (a sweep) costs
    a few materializations, not one each; a failed one is logged and redone on the next request.
    """

    def __init__(self, store: ResultsStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._running = False
        self._pending = False
        self.idle = threading.Event()
        self.idle.set()

    def request(self) -> None:
        """Materialize soon (in a background thread)."""
        with self._lock:
            if self._running:
                self._pending = True
                return
            self._running = True
            self.idle.clear()
        threading.Thread(target=self._loop, name="materialize", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                self.store.materialize()
                metrics.observe_stacks(self.store)
                for release in metrics.observe_releases(self.store):
                    if release.regressions:
                        notifications.notifier().tell(
                            notifications.release_regressions(release, self.store)
                        )
            except Exception:
                log.exception(
                    "materializing %s failed; records are intact, the next run redoes it",
                    self.store.uri,
                )
            with self._lock:
                if not self._pending:
                    self._running = False
                    self.idle.set()
                    return
                self._pending = False


def sweep_deliveries(stores: Iterable[ResultsStore]) -> int:
    """Remove the delivery slots of runs these stores hold a record of, and empty the slots
    set aside for removal a bounded amount: a slot written after its run was recorded (an
    upload URL used again before it expired) or one a removal missed. A store that cannot be
    swept now is said in the log and swept next time. Returns how many slots went."""
    removed = 0
    for store in stores:
        try:
            removed += DeliveryArea(store.uri).remove_recorded(store.has)
        except (DeliveryError, ValueError) as exc:
            log.warning("could not sweep the delivery slots of %s: %s", store.uri, exc)
    return removed
