"""Ports for the servers a test starts, which no other program takes in the meantime.

A port found free by binding port 0 and letting go is an ephemeral port: the kernel hands the
same range to every other ``bind(("", 0))`` and to every outgoing connection's local end, and on
a busy host (the suite's other worker, its stand-in servers, Docker) one of them can take it
before the test's server binds it (EADDRINUSE, a failed test that is no fault of the code).
These ports come from below the kernel's ephemeral range (``ip_local_port_range``, see
ip(7)), where the kernel never picks one, split between the suite's workers (pytest-xdist) so
two tests never pick the same one; each is checked bindable before it is handed out.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

LOWEST = 10_000
"""Below this, ports of well-known services (and of other programs' fixed defaults)."""
BROWSER_BLOCKED = frozenset({10080})
"""Ports at or above LOWEST that browsers refuse to open (net::ERR_UNSAFE_PORT): Chromium's
restricted ports (``kRestrictedPorts`` in net/base/port_util.cc; 10080 since Chromium 90) and
Firefox's. A viewer served on one could not be tested in a browser (docs/testing-containers.md)."""


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 by default on Linux)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _worker_slice() -> range:
    """This pytest-xdist worker's share of the ports below the ephemeral range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker) if worker.isdigit() else 0
    ports = range(LOWEST, _ephemeral_start())
    size = len(ports) // max(count, 1)
    return ports[index * size : (index + 1) * size]


def _candidates() -> itertools.cycle[int]:
    ports = [port for port in _worker_slice() if port not in BROWSER_BLOCKED]
    start = random.randrange(len(ports))  # a new run does not reuse the last run's first ports
    return itertools.cycle([*ports[start:], *ports[:start]])


_CANDIDATES = _candidates()


def unused_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` for a server a test is about to start: bindable now, outside the
    range the kernel gives other programs, and not handed out again by this worker soon."""
    for _ in range(len(_worker_slice())):
        port = next(_CANDIDATES)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # a fixed port some program on this host uses
        return port
    raise RuntimeError(f"no bindable port on {host} in {_worker_slice()}")
