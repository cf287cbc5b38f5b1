"""API failures injected into the emulated API server, by the family of call they hit.

A real API server, or the network to it, fails in three ways the operator must survive:

* ``REFUSED``: the connection is refused or reset. The client gets no HTTP answer at all: the
  kubernetes client raises a urllib3 error (``ProtocolError``, ``MaxRetryError`` once urllib3's
  own retries of an idempotent request are spent), never an ``ApiException``. Played by
  resetting the request's connection (TCP RST) before anything is answered: the same exception
  classes a refused connect gives (a port refuses before any path is known, so a refusal of
  one family of calls alone can only be played this way).
* ``TIMEOUT``: the server accepts the request and does not answer in time (an overloaded API
  server, a partition): the client's read timeout fires (urllib3 ``ReadTimeoutError``). Played
  by holding the request ``hold_s`` seconds (longer than the client's timeout), then dropping
  it unanswered; nothing is stored.
* ``SERVER_ERROR``: an HTTP 5xx Status (``ServiceUnavailable``, 503): an ``ApiException``.

Each is injected into one family of the calls the operator makes (:class:`Family`) for a number
of requests (``times``; None: until cleared). The harness's own requests (User-Agent kmock/)
are never touched: they play the other controllers and the test's view.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import kmock


class Fault(StrEnum):
    """How a request fails."""

    REFUSED = "refused"
    TIMEOUT = "timeout"
    SERVER_ERROR = "server-error"


def _plural(request: kmock.Request) -> str | None:
    return request.resource.plural if request.resource is not None else None


def _watching(request: kmock.Request) -> bool:
    # kmock knows watch=true; the API server (Go's ParseBool) also takes the kubernetes
    # client's watch=True, which kmock serves as a list.
    return request.action == kmock.action.WATCH or str(request.params.get("watch", "")).lower() in (
        "true",
        "1",
    )


def _named(plural: str) -> Callable[[kmock.Request], bool]:
    """Calls on one object (or a create) of ``plural``: not lists or watches, not status."""

    def matches(request: kmock.Request) -> bool:
        return (
            _plural(request) == plural
            and request.subresource != "status"
            and request.action not in (kmock.action.LIST, kmock.action.WATCH)
        )

    return matches


class Family(StrEnum):
    """The families of API calls the operator makes."""

    LEASE = "lease"  # leader election's reads and writes of its Lease
    STATUS = "status"  # status subresource writes and reads (tests, sweeps)
    JOBS = "jobs"  # runner Jobs: create, read, patch, delete
    CONFIGMAPS = "configmaps"  # run.py's ConfigMap
    SECRETS = "secrets"  # delivery URL Secrets, Hub token Secrets
    EVENTS = "events"  # Events posted on tests and sweeps
    TESTS = "tests"  # a sweep's test creates and patches, test reads
    PODS = "pods"  # pod logs
    LIST = "list"  # every list call (the watchdog's resyncs, kopf's initial listings)
    WATCH = "watch"  # every watch stream (kopf's)

    def matches(self, request: kmock.Request) -> bool:
        """Whether ``request`` belongs to this family."""
        return _FAMILIES[self](request)


_FAMILIES: dict[Family, Callable[[kmock.Request], bool]] = {
    Family.LEASE: lambda r: _plural(r) == "leases",
    Family.STATUS: lambda r: r.subresource == "status",
    Family.JOBS: _named("jobs"),
    Family.CONFIGMAPS: _named("configmaps"),
    Family.SECRETS: _named("secrets"),
    Family.EVENTS: lambda r: _plural(r) == "events" and r.action == kmock.action.CREATE,
    Family.TESTS: _named("modelsupporttests"),
    Family.PODS: lambda r: _plural(r) == "pods" and r.subresource == "log",
    Family.LIST: lambda r: r.action == kmock.action.LIST and not _watching(r),
    Family.WATCH: _watching,
}


@dataclass
class Injected:
    """One injected failure: ``fault`` on the next ``times`` requests of ``family`` (None:
    until cleared), optionally only those on ``resource`` (a plural)."""

    fault: Fault
    family: Family
    times: int | None = None
    resource: str | None = None
    hold_s: float = 3.0
    hits: int = 0

    def takes(self, request: kmock.Request) -> bool:
        """Whether this failure hits ``request`` (and counts it)."""
        if request.headers.get("User-Agent", "").startswith("kmock/"):
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        if self.resource is not None and _plural(request) != self.resource:
            return False
        if not self.family.matches(request):
            return False
        self.hits += 1
        return True


class _Dropped(Exception):
    """The connection was dropped: there is nobody to answer."""


def _reset(request: kmock.Request) -> None:
    """Reset the request's connection (RST: SO_LINGER 0, then close)."""
    raw = request._raw_request  # kmock keeps aiohttp's request; its transport is the socket
    transport = raw.transport if raw is not None else None
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def apply(faults: list[Injected], request: kmock.Request) -> None:
    """Fail ``request`` as the first injected failure that takes it says (or let it pass)."""
    for injected in faults:
        if not injected.takes(request):
            continue
        if injected.fault is Fault.SERVER_ERROR:
            raise kmock.KubernetesError(
                status=503,
                reason="ServiceUnavailable",
                message="injected: the API server is unavailable",
            )
        if injected.fault is Fault.TIMEOUT:
            await asyncio.sleep(injected.hold_s)
        _reset(request)
        raise _Dropped(f"injected {injected.fault} on {injected.family}")
