"""The suite's servers' ports: never from the range the kernel hands other programs."""

from __future__ import annotations

import socket

import pytest
from ports import _ephemeral_start, _worker_slice, unused_port


def test_a_servers_port_is_outside_the_kernels_range_and_not_handed_out_twice() -> None:
    ports = [unused_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(port < _ephemeral_start() for port in ports)
    with socket.socket() as sock:  # and it is free: a server binds it
        sock.bind(("127.0.0.1", ports[-1]))


def test_two_workers_never_share_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = set(_worker_slice())
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = set(_worker_slice())
    assert first and second and not first & second


def test_no_port_a_browser_refuses_is_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A viewer on 10080 fails in Chromium with net::ERR_UNSAFE_PORT before it is looked at."""
    import ports

    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert 10080 in _worker_slice()  # in the range the ports come from
    candidates = ports._candidates()
    handed = {next(candidates) for _ in range(len(_worker_slice()))}
    assert len(handed) > 10_000 and not handed & ports.BROWSER_BLOCKED
