"""Finding processes a test started, by a marker in their environment (children inherit it)."""

from __future__ import annotations

from pathlib import Path


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
