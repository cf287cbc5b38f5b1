"""The part of a stored run.py a person reads: its config block (the rest is the fixed runner).

A rendered run.py is a few thousand lines of the same runner around one block of settings
(model_support.script's BEGIN/END markers). The details panel shows that block and offers the
whole file as a download, rather than printing every line.
"""

from __future__ import annotations

from model_support.script import BEGIN, END


def config_block(run_py: str) -> str | None:
    """The config block of ``run_py``, its markers included; None when it has none (an older or
    hand-made script) or more than one."""
    start = run_py.find(BEGIN)
    if start < 0 or run_py.find(BEGIN, start + len(BEGIN)) >= 0:
        return None
    end = run_py.find(END, start)
    if end < 0:
        return None
    return run_py[start : end + len(END)]


def line_count(run_py: str) -> int:
    """Lines in the script (what the download holds)."""
    return len(run_py.splitlines())
