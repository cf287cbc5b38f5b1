"""Leader election over a ``coordination.k8s.io/v1`` Lease: one replica acts, the others wait.

Two replicas (or the old and the new pod of a rolling update) watch the same tests; only the
replica holding the Lease acts on them. The others keep watching (their view stays current)
and act only once they hold it. The rules are client-go's (``tools/leaderelection``): the
holder renews every ``renew`` seconds; a candidate takes the Lease over only when its record
(holder and renew time) has not changed for ``leaseDurationSeconds`` as measured on the
candidate's own clock (no comparison of clocks across nodes); every write carries the Lease's
resourceVersion, so two candidates never both win. A holder that could not renew for
``renew_deadline_s`` (shorter than the lease) stops acting before anyone may take over; one
that stops (a rolling update) stops acting first, then gives the Lease up, so its successor
takes over at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

POD_NAMESPACE_ENV = "POD_NAMESPACE"
"""Where the chart tells the operator its own namespace (the Lease lives there)."""


def default_identity() -> str:
    """This replica's name in the Lease: the pod's name (its hostname) and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class _Observed:
    """The Lease record as last read, and when (this process's monotonic clock)."""

    holder: str | None
    renewed: str | None
    at: float


class Leadership:
    """Acquire, renew and release one Lease; :meth:`acting` gates the operator's work."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_s: float,
        renew_deadline_s: float,
        retry_s: float,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.api = kubernetes.client.CoordinationV1Api(client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.timeout = request_timeout_s
        self.leading = threading.Event()
        self._observed: _Observed | None = None
        self._lease: dict[str, Any] | None = None  # as our last write left it
        self._renewed_at = 0.0
        self._inflight = 0
        self._idle = threading.Condition()

    # ------------------------------------------------------------------ the operator's side

    @contextmanager
    def acting(self) -> Iterator[bool]:
        """``with leadership.acting() as leading:`` -- act only when ``leading``; a release
        waits until every block entered while leading has left."""
        if not self.leading.is_set():
            yield False
            return
        with self._idle:
            self._inflight += 1
        try:
            yield True
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def step(self, on_gained: Callable[[], None]) -> float:
        """One round: acquire or renew; returns how long to wait before the next round.
        ``on_gained`` runs (in this thread) each time this replica becomes the leader."""
        try:
            won = self._try_acquire_or_renew()
        except ApiException as exc:
            log.warning("leader election: the Lease could not be read or written: %s", exc.reason)
            won = False
        now = time.monotonic()
        if won:
            self._renewed_at = now
            if not self.leading.is_set():
                log.info("leader election: %s leads (Lease %s/%s)", self.identity,
                         self.namespace, self.name)  # fmt: skip
                self.leading.set()
                on_gained()
            return self.retry_s
        if self.leading.is_set() and now - self._renewed_at >= self.renew_deadline_s:
            # Stop before anyone may take over (they wait lease_s > renew_deadline_s).
            log.warning("leader election: %s could not renew; it stops acting", self.identity)
            self.leading.clear()
        return self.retry_s

    def release(self, wait_s: float = 30.0) -> None:
        """Stop acting, wait for work in flight, then give the Lease up for a successor."""
        was_leading = self.leading.is_set()
        self.leading.clear()
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=wait_s)
        if not was_leading:
            return
        try:
            lease = self._read()
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == (
                self.identity
            ):
                body = {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
                }
                self.api.patch_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.timeout
                )
                self._lease = None
                log.info("leader election: %s gave up the Lease", self.identity)
        except ApiException as exc:  # it expires by itself: the successor waits lease_s
            log.warning("leader election: the Lease could not be given up: %s", exc.reason)

    # ------------------------------------------------------------------ the Lease

    def _read(self) -> dict[str, Any] | None:
        try:
            response = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(response.data))

    def _spec(self, acquired: str | None, transitions: int) -> dict[str, Any]:
        now = _stamp()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_s)),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _write(self, lease: dict[str, Any], spec: dict[str, Any]) -> bool:
        """Patch the Lease as read (its resourceVersion); False on 409 (changed since)."""
        body = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec}
        try:
            response = self.api.patch_namespaced_lease(
                self.name, self.namespace, body, _preload_content=False,
                _request_timeout=self.timeout,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status in (404, 409):
                self._lease = None
                return False
            raise
        self._lease = dict(json.loads(response.data))
        return True

    def _try_acquire_or_renew(self) -> bool:
        held = self._lease
        if held is not None and (held.get("spec") or {}).get("holderIdentity") == self.identity:
            # Renewing what we wrote last: one request (a 409 means someone else wrote it).
            mine = held["spec"]
            renewal = self._spec(mine.get("acquireTime"), int(mine.get("leaseTransitions") or 0))
            if self._write(held, renewal):
                return True
        lease = self._read()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, 0),
            }
            try:
                response = self.api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=self.timeout
                )
            except ApiException as exc:
                if exc.status == 409:
                    return False  # another candidate created it first
                raise
            self._lease = dict(json.loads(response.data))
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        renewed = spec.get("renewTime")
        now = time.monotonic()
        previous = self._observed
        if previous is None or (previous.holder, previous.renewed) != (holder, renewed):
            self._observed = previous = _Observed(holder, renewed, now)
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        if holder not in (None, self.identity) and now - previous.at < duration:
            return False  # held, and renewed within its duration as this process saw it
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        acquired = spec.get("acquireTime") if holder == self.identity else None
        return self._write(lease, self._spec(acquired, transitions))


def lease_namespace(configured: str | None) -> str:
    """The namespace of the Lease: the setting, else the operator's own (POD_NAMESPACE), else
    the one its service account is in."""
    if configured:
        return configured
    if os.environ.get(POD_NAMESPACE_ENV):
        return os.environ[POD_NAMESPACE_ENV]
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    return "default"
