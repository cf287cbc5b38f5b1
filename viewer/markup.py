"""Putting values from the dataset into Streamlit's Markdown, so they show as plain text.

Everything a run or a dataset supplies (model ids, error messages, verification reasons, paths,
compiler names, Hub answers) is data, never markup. Streamlit renders Markdown (CommonMark with
GitHub extensions, LaTeX between ``$``, ``:color[...]`` directives) in ``st.markdown``,
captions, headings, alerts and widget labels; a value placed there is escaped first. Longer
values go to elements that never interpret anything (``st.text``, ``st.code``, tables, JSON).
"""

from __future__ import annotations

import re

# CommonMark lets a backslash escape any ASCII punctuation character; escaping all of them also
# disarms the extensions (``$`` math, ``:`` directives, ``~`` strikethrough, ``|`` tables,
# ``www.`` autolinks) and HTML (``<``, ``&`` entities).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_BACKTICKS = re.compile(r"`+")


def _one_line(value: object) -> str:
    # A line break could start a block (heading, list, quote, indented code): inline values are
    # shown on one line, runs of whitespace as one space.
    return " ".join(str(value).split())


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
