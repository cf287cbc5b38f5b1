"""Leader election over a ``coordination.k8s.io/v1`` Lease: one replica acts, the others wait.

Two replicas (or the old and the new pod of a rolling update) watch the same tests; only the
replica holding the Lease acts on them. The others keep watching (their view stays current)
and act only once they hold it. The rules are client-go's (kubernetes/client-go
``tools/leaderelection/leaderelection.go``):

* the holder renews every ``retry_s`` seconds; a candidate takes the Lease over only when its
  record (holder and renew time) has not changed for ``leaseDurationSeconds`` as measured on
  the candidate's own clock (no comparison of clocks across nodes); every write carries the
  Lease's resourceVersion, so two candidates never both win;
* every error in a round (an API error, a connection refused or reset, a timeout, anything
  else) is a failed round, never the end of the election: a follower that hit one keeps
  trying and can lead later;
* a holder stops acting once ``renew_deadline_s`` passed since the start of its last
  successful renewal, timed by the clock alone (:meth:`Leadership.is_leading`), whatever call
  is in flight: client-go bounds each renewal by a context whose deadline is the renew
  deadline, and so does this, with no request allowed to run that long (each Lease call's
  timeout is a quarter of the renew deadline, and urllib3 does not retry them);
* ``lease_s > renew_deadline_s > 1.2 * retry_s`` (client-go's NewLeaderElector checks), so a
  holder has stopped before anyone may take over (they wait ``lease_s`` on their own clock).

One that stops (a rolling update) stops acting first, waits for work in flight, then gives the
Lease up, so its successor takes over at once.
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
import urllib3
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

POD_NAMESPACE_ENV = "POD_NAMESPACE"
"""Where the chart tells the operator its own namespace (the Lease lives there)."""


def default_identity() -> str:
    """This replica's name in the Lease: the pod's name (its hostname) and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


JITTER_FACTOR = 1.2
"""client-go's JitterFactor: the renew deadline must exceed retry_s by that factor."""


def check_timings(lease_s: float, renew_deadline_s: float, retry_s: float) -> None:
    """Refuse leader election timings client-go would refuse (NewLeaderElector), which would
    let two replicas act at once; ValueError says which and why."""
    if lease_s <= renew_deadline_s:
        raise ValueError(
            f"the lease duration ({lease_s:g} s) must be longer than the renew deadline "
            f"({renew_deadline_s:g} s): a holder that could not renew must have stopped before "
            "another replica may take the Lease over"
        )
    if renew_deadline_s <= JITTER_FACTOR * retry_s:
        raise ValueError(
            f"the renew deadline ({renew_deadline_s:g} s) must be longer than {JITTER_FACTOR:g} "
            f"x the retry period ({retry_s:g} s): a holder must get more than one try to renew"
        )


def lease_request_timeout(request_timeout_s: float, renew_deadline_s: float) -> float:
    """The timeout of each Lease call: a round makes at most three (patch, read, patch), so a
    quarter of the renew deadline keeps a whole round inside it."""
    return min(request_timeout_s, renew_deadline_s / 4)


def describe_failure(exc: BaseException) -> str:
    """What went wrong in a round, in words (an API answer, an unreachable API server, or
    something unexpected)."""
    if isinstance(exc, ApiException):
        return f"the API server answered {exc.status} {exc.reason}"
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return f"the API server could not be reached ({type(exc).__name__}: {exc})"
    return f"unexpected {type(exc).__name__}: {exc}"


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_timings(lease_s, renew_deadline_s, retry_s)
        self.api = kubernetes.client.CoordinationV1Api(client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.timeout = lease_request_timeout(request_timeout_s, renew_deadline_s)
        self._clock = clock
        self._alone = False
        self.leading = threading.Event()
        """Set while this replica holds the Lease as far as its rounds know; acting also needs
        the renew deadline not to have passed (:meth:`is_leading`)."""
        self.last_round_at: float | None = None
        """When the last round ended (this process's clock), failed or not: the election's
        heartbeat, which the liveness probe checks."""
        self._observed: _Observed | None = None
        self._lease: dict[str, Any] | None = None  # as our last write left it
        self._renewed_at = 0.0
        self._inflight = 0
        self._idle = threading.Condition()

    # ------------------------------------------------------------------ the operator's side

    def lead_alone(self) -> None:
        """Act without an election (leader election turned off: one replica, by choice)."""
        self._alone = True
        self.leading.set()

    def is_leading(self) -> bool:
        """Whether this replica may act now: it holds the Lease and its renew deadline has not
        passed since the start of its last successful renewal. Timed by the clock alone, so a
        renewal stuck in flight cannot keep a replica acting past its deadline."""
        if not self.leading.is_set():
            return False
        if self._alone:
            return True
        if self._clock() - self._renewed_at < self.renew_deadline_s:
            return True
        self._stop_leading()
        return False

    def _stop_leading(self) -> None:
        with self._idle:
            if not self.leading.is_set():
                return
            self.leading.clear()
        log.warning(
            "leader election: %s could not renew the Lease within %g s of its last renewal; "
            "it stops acting", self.identity, self.renew_deadline_s,
        )  # fmt: skip

    @contextmanager
    def acting(self) -> Iterator[bool]:
        """``with leadership.acting() as leading:`` -- act only when ``leading``; a release
        waits until every block entered while leading has left."""
        if not self.is_leading():
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
        Every error is a failed round (logged, never raised). ``on_gained`` runs (in this
        thread) each time this replica becomes the leader."""
        started = self._clock()
        try:
            won = self._try_acquire_or_renew()
        except Exception as exc:  # every error is a failed round (client-go's rule)
            if isinstance(exc, ApiException | urllib3.exceptions.HTTPError | OSError):
                log.warning("leader election: the round failed: %s", describe_failure(exc))
            else:
                log.exception("leader election: the round failed: %s", describe_failure(exc))
            won = False
        finally:
            self.last_round_at = self._clock()
        if won and self._clock() - started < self.renew_deadline_s:
            # Valid from the moment the write was sent: a success that took long counts from
            # before it, never from its return.
            self._renewed_at = started
            if not self.leading.is_set():
                log.info("leader election: %s leads (Lease %s/%s)", self.identity,
                         self.namespace, self.name)  # fmt: skip
                self.leading.set()
                on_gained()
            return self.retry_s
        self.is_leading()  # stops acting once the renew deadline passed (and says so)
        return self.retry_s

    def release(self, wait_s: float = 30.0) -> None:
        """Stop acting, wait for work in flight, then give the Lease up for a successor."""
        was_leading = self.is_leading()
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
        except Exception as exc:  # it expires by itself: the successor waits lease_s
            log.warning("leader election: the Lease could not be given up: %s",
                        describe_failure(exc))  # fmt: skip

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
