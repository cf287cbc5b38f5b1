"""Waiting in tests: poll a condition until it holds, or fail saying what never happened."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

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


async def wait_until_async(
    check: Callable[[], Any],
    what: str,
    timeout: float,
    interval: float = 0.05,
    abort: Callable[[], None] | None = None,
) -> Any:
    """:func:`wait_until` for tests on an event loop: ``check`` may be sync or async, and
    ``abort`` (when given) runs after each unmet check and raises to stop early (e.g. the
    operator under test died, so nothing will ever change)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if abort is not None:
            abort()
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what} (last: {value!r})"
            )
        await asyncio.sleep(interval)
