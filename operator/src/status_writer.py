"""The tests this process knows, and the one way their status is written.

What the watch showed of each test is kept (it saves a GET per Job event); a status write
replaces it with what the API returned. A write carries the resourceVersion of the test it was
computed from, so a stale view never wins: on 409 the test is read again and the write computed
again from what it says. Losing all of this on a restart loses nothing: the API holds the truth.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from model_support.operator import metrics
from model_support.operator.kube import Conflict, Kube, being_deleted
from model_support.operator.manifests import TestRef
from model_support.operator.status import MESSAGE_LIMIT, Phase, StatusPatch, TestStatus

log = logging.getLogger(__name__)

CONFLICT_TRIES = 5
"""How often a status write is computed again after a 409 before the next event retries it."""

Build = Callable[[TestStatus], StatusPatch | None]
"""Makes a status write from the test's status as the API has it (None: nothing to write)."""


def _newer(body: dict[str, Any], known: dict[str, Any] | None) -> bool:
    """Whether ``body`` is at least as recent as ``known`` (by resourceVersion when numeric)."""
    if known is None:
        return True
    new_rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
    old_rv = str((known.get("metadata") or {}).get("resourceVersion") or "")
    if new_rv.isdigit() and old_rv.isdigit():
        return int(new_rv) >= int(old_rv)
    return True  # resourceVersions are opaque: the latest seen wins


class StatusWriter:
    """Every watched test by uid, as last seen, and their status writes and Events."""

    def __init__(self, kube: Kube, on_forget: Callable[[str], None] | None = None) -> None:
        self.kube = kube
        self.tests: dict[str, dict[str, Any]] = {}
        """Every watched test by uid, as the watch (or our own write) last showed it."""
        self._shown_at: dict[str, float] = {}
        """When a watch event, a write's answer or a read last showed each test to exist (a
        listing does not count: deletions a relist missed are what it may hide)."""
        self._lock = threading.Lock()
        self._writing: dict[str, threading.Lock] = {}
        """One lock per test: this process's writes to a test go one after the other, each
        computed from what the one before returned (two threads writing at once, a held
        Running and the run's Completed, would meet a 409 and a read)."""
        self._on_forget = on_forget

    # ---------------------------------------------------------------- what the watch shows

    def observe(self, body: dict[str, Any], event_type: str | None) -> None:
        """Keep :attr:`tests` as the watch shows them (called for every test event)."""
        uid = (body.get("metadata") or {}).get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self.forget(uid)
            return
        with self._lock:
            if _newer(body, self.tests.get(uid)):
                self.tests[uid] = body
            if event_type is not None:
                self._shown_at[uid] = time.monotonic()

    def newest(self, body: dict[str, Any]) -> dict[str, Any]:
        """The newest view of the test ``body`` shows (a late event must not undo a write)."""
        uid = (body.get("metadata") or {}).get("uid")
        with self._lock:
            return self.tests.get(uid, body) if uid else body

    def snapshot(self) -> list[dict[str, Any]]:
        """Every known test, as last seen (a copy of the list: safe to iterate)."""
        with self._lock:
            return list(self.tests.values())

    def uids(self) -> set[str]:
        """The uids of every known test."""
        with self._lock:
            return set(self.tests)

    def forget(self, uid: str) -> None:
        """Drop a test that no longer exists from what this process keeps."""
        with self._lock:
            self.tests.pop(uid, None)
            self._shown_at.pop(uid, None)
            self._writing.pop(uid, None)
        if self._on_forget is not None:
            self._on_forget(uid)

    def get(self, ref: TestRef) -> dict[str, Any] | None:
        """A test as last seen, else read from the API (None when it is gone)."""
        known = self.tests.get(ref.uid)
        if known is not None:
            return known
        test = self.kube.get_test(ref.namespace, ref.name)
        if test is not None and test["metadata"].get("uid") == ref.uid:
            self.observe(test, "FETCHED")
            return test
        return None

    def shown(self, ref: TestRef, within_s: float) -> dict[str, Any] | None:
        """The test, as a watch event (or a write's answer) showed it within the last
        ``within_s`` seconds, else as the API has it now (:meth:`fresh`: a read); None when it
        is gone, replaced or being deleted. Saves a read per test the watch just showed."""
        with self._lock:
            shown_at = self._shown_at.get(ref.uid)
            known = self.tests.get(ref.uid)
        if shown_at is not None and known is not None and time.monotonic() - shown_at < within_s:
            return None if being_deleted(known) else known
        return self.fresh(ref)

    def fresh(self, ref: TestRef) -> dict[str, Any] | None:
        """The test as the API has it now; None when it is gone, replaced or being deleted."""
        fresh = self.kube.get_test(ref.namespace, ref.name)
        if fresh is None or fresh["metadata"].get("uid") != ref.uid:
            self.forget(ref.uid)
            return None
        self.observe(fresh, "FETCHED")
        return None if being_deleted(fresh) else fresh

    def completed(self, ref: TestRef) -> bool:
        """Whether the API (not what we last saw) says this generation is Completed, or the
        test is gone (nothing to complete either way)."""
        fresh = self.kube.get_test(ref.namespace, ref.name)
        if fresh is None or fresh["metadata"].get("uid") != ref.uid:
            return True
        self.observe(fresh, "FETCHED")
        status = TestStatus.read(fresh.get("status"))
        return status.phase is Phase.COMPLETED and status.observedGeneration == ref.generation

    # ---------------------------------------------------------------- writes

    def write(self, ref: TestRef, build: Build) -> dict[str, Any] | None:
        """Write a test's status; what the API returns becomes what we know.

        ``build`` makes the patch from the test's status (None: nothing to write). On 409 the
        test is read again and ``build`` runs again on what it says. Nothing is written to a
        test of another generation, or to one whose generation is Completed (a terminal phase
        is never moved back). Returns the patched test, None when nothing was written.
        """
        with self._lock:
            writing = self._writing.setdefault(ref.uid, threading.Lock())
        with writing:
            return self._write(ref, build)

    def _write(self, ref: TestRef, build: Build) -> dict[str, Any] | None:
        test = self.get(ref)
        for _ in range(CONFLICT_TRIES):
            if test is None or int(test["metadata"].get("generation") or 1) != ref.generation:
                return None  # gone, or a newer spec: this write is about the past
            status = TestStatus.read(test.get("status"))
            if status.phase is Phase.COMPLETED and status.observedGeneration == ref.generation:
                return None
            patch = build(status)
            if patch is None:
                return None
            version = (test.get("metadata") or {}).get("resourceVersion")
            try:
                patched = self.kube.patch_test_status(
                    ref.namespace, ref.name, patch.body(), resource_version=version
                )
            except Conflict:
                metrics.STATUS_CONFLICTS.inc()
                fresh = self.kube.get_test(ref.namespace, ref.name)
                if fresh is None or fresh["metadata"].get("uid") != ref.uid:
                    self.forget(ref.uid)
                    return None
                self.observe(fresh, "FETCHED")
                test = fresh
                continue
            if patched is None or patched["metadata"].get("uid") != ref.uid:
                self.forget(ref.uid)
                return None
            self.observe(patched, "PATCHED")
            return patched
        log.warning(
            "%s/%s: the status write kept conflicting (%d tries); the next event retries it",
            ref.namespace, ref.name, CONFLICT_TRIES,
        )  # fmt: skip
        return None

    def event(self, test: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """An Event on the test (posted with our client, so it works from any thread)."""
        self.kube.post_event(test, kind, reason, message[:MESSAGE_LIMIT])


__all__ = ["CONFLICT_TRIES", "Build", "StatusWriter"]
