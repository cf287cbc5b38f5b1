"""Waiting in tests: poll a condition until it holds, or fail saying what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, timeout: float, interval: float = 0.2) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy, and return
    that; after ``timeout`` seconds, AssertionError naming ``what`` (and the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what} (last: {value!r})"
            )
        time.sleep(interval)
