"""Data printed as data: control characters in what a record, a store or a pod supplied are
shown as escapes, never handed to a terminal or a page to act on.

A record's fields are written by runner pods that run code the project does not control. A
terminal acts on the control characters in what it is given: an escape sequence can write the
clipboard (OSC 52), clear the screen, retitle the window or hide what follows, and a
right-to-left override makes text read other than it is. Every command line output goes
through :class:`DataConsole` (or :func:`printable` where it prints without Rich), and the
viewer shows values through :func:`printable_data`: one rule for both.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline (ESC, BEL, CR, backspace, ...), DEL, C1 controls (8-bit
CSI and OSC among them), and the bidirectional marks, embeddings, overrides and isolates."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline shown as its escape
    (``\\x1b``, ``\\u202e``): what it says stays readable, nothing in it acts."""
    return _CONTROL.sub(_escape, text)


def printable_data(value: Any) -> Any:
    """``value`` with :func:`printable` applied to every string in it (dict keys and values,
    list and tuple items, nested); other values as they are."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(printable_data(v) for v in value)
    return value


class DataConsole(Console):
    """A Rich console that shows control characters in every string it renders as escapes:
    markup strings, table cells, titles (Rich's own styling is added after, so it still works).
    The command line's consoles are all of this class."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """Render ``text`` as Rich does, once its control characters are escaped."""
        return super().render_str(printable(text), **kwargs)
