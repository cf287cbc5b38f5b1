"""The program ConfigMaps: run.py's text around its config block, one per namespace and runner
script, shared by every test there (a test's Job carries only its own config block and the
sha256 of the run.py they make; the runner writes run.py from the two and runs nothing else).

A test then costs the API server no ConfigMap of its own: the program is created once per
namespace, and looked at again now and then, so one deleted or changed by hand is made again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from model_support.operator.kube import AlreadyExists, Kube, refusal

log = logging.getLogger(__name__)

RECHECK_S = 300.0
"""How long a program ConfigMap found as built is taken to be there still."""


class ProgramConfigMaps:
    """Makes sure each namespace holds the program ConfigMap its tests' Jobs mount."""

    def __init__(
        self,
        kube: Kube,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.recheck_s = recheck_s
        self.clock = clock
        self._checked: dict[tuple[str, str], float] = {}
        # One maker at a time: a namespace's first tests arrive together, and one create
        # (not one per worker, each answered 409 and then read) is what it takes.
        self._lock = threading.Lock()

    def ensure(self, configmap: dict[str, Any]) -> None:
        """Make sure ``configmap`` (a program ConfigMap, as built) exists as built: created the
        first time, read again after :data:`RECHECK_S`, and made again when it is missing or
        holds something else. Raises CreateRefused when the API server refuses it."""
        meta = configmap["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            checked = self._checked.get(key)
            if checked is not None and self.clock() - checked < self.recheck_s:
                return
            self._make(configmap, first=checked is None)
            self._checked[key] = self.clock()

    def _make(self, configmap: dict[str, Any], *, first: bool) -> None:
        namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
        if first and self._create(configmap):
            return
        found = self.kube.read_configmap(namespace, name)
        if found is None:
            self._create(configmap)
            return
        if found.get("data") != configmap["data"]:
            # Immutable, so it was replaced by hand: the runners would refuse what it holds
            # (its sha256 is not their run.py's). Made again as the operator builds it.
            log.warning(
                "ConfigMap %s/%s does not hold the program it is named for; making it again",
                namespace,
                name,
            )
            self.kube.delete_configmap(namespace, name)
            self._create(configmap)

    def _create(self, configmap: dict[str, Any]) -> bool:
        """Create it; False when it already exists."""
        try:
            with refusal("ConfigMap", configmap):
                self.kube.create_configmap(configmap)
        except AlreadyExists:
            return False
        log.info(
            "created the program ConfigMap %s/%s (run.py around each test's config block)",
            configmap["metadata"]["namespace"],
            configmap["metadata"]["name"],
        )
        return True
