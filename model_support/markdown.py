"""Values as Markdown that renders as exactly their text: never markup, on one line.

A value from a run or a dataset (a model id, an error message, a path) placed into Markdown
(Streamlit's pages, the regression report's bug-report text) could otherwise start emphasis, a
link, raw HTML, math or a table; its control characters are shown as escapes
(:mod:`model_support.printable`).
"""

from __future__ import annotations

import re

from model_support.printable import printable

# CommonMark lets a backslash escape any ASCII punctuation character; escaping all of them also
# disarms the extensions (``$`` math, ``:`` directives, ``~`` strikethrough, ``|`` tables,
# ``www.`` autolinks) and HTML (``<``, ``&`` entities).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_BACKTICKS = re.compile(r"`+")


def _one_line(value: object) -> str:
    # A line break could start a block (heading, list, quote, indented code): inline values are
    # shown on one line, runs of whitespace as one space; control characters as escapes.
    return " ".join(printable(str(value)).split())


def literal(value: object) -> str:
    """``value`` as Markdown source that renders as exactly its text (on one line)."""
    return _PUNCTUATION.sub(r"\\\1", _one_line(value))


def inline_code(value: object) -> str:
    """``value`` as a Markdown code span (monospace, nothing inside interpreted), on one line."""
    text = _one_line(value)
    if not text:
        return ""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    # A span starting or ending with a backtick needs a space to stay apart from the fence.
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"
