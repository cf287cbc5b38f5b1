"""Giving freed memory back: the operator's memory comes in bursts (a sweep's materializations
hold every run.py of a matrix file at once), and what a burst freed must leave the process, so
that its peak, not its history, is what the chart's memory limit has to hold.

Two allocators keep freed memory by default:

- pyarrow's default pool (jemalloc or mimalloc in the wheels) keeps freed pages for reuse; the
  system allocator (``pa.system_memory_pool()``) hands them to glibc.
- glibc serves blocks below its mmap threshold from its heaps, and raises that threshold (up to
  32 MiB) each time a larger mapped block is freed, so a burst of run.py texts (a few hundred
  KiB each) and Arrow buffers ends up in heaps that fragment and never shrink. A fixed
  threshold (``mallopt(M_MMAP_THRESHOLD)``, see mallopt(3)) gives each large block its own
  mapping, returned to the system when it is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import pyarrow as pa

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 128 * 2**10
"""Blocks this large or larger get their own mapping (glibc's initial default, held fixed)."""
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def give_freed_memory_back() -> None:
    """Make this process return what it frees: Arrow through the system allocator, and glibc's
    mmap threshold fixed (where the C library is glibc; elsewhere only Arrow's pool changes)."""
    pa.set_memory_pool(pa.system_memory_pool())
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError) as exc:  # no C library found, or not glibc
        log.info(
            "the C library (%s) has no mallopt; its mmap threshold is left as it is (%s)", name, exc
        )
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) was refused", MMAP_THRESHOLD_BYTES)
