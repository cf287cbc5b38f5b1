"""Finding processes a test started, by a marker in their environment (children inherit it),
and what they hold: their environment's values, the addresses they listen on."""

from __future__ import annotations

from pathlib import Path

import psutil


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains ``marker``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue  # ended while we looked, or not ours to read
    return found


def environment_value(pid: int, name: str) -> str | None:
    """``name``'s value in the environment ``pid`` started with (None when unset)."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, _, value = entry.decode(errors="replace").partition("=")
        if key == name:
            return value
    return None


def listening_addresses(pid: int, port: int) -> list[str]:
    """Addresses on which ``pid`` itself (not a child) listens on TCP ``port``."""
    return [
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
