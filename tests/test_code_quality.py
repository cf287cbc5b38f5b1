"""The project's own checks, so CI keeps them: ruff (lint + format) and mypy stay clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        pytest.param([sys.executable, str(ROOT / ".ci" / "mypy")], marks=pytest.mark.slow),
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_check_is_clean(command: list[str]) -> None:
    program = command[0] if Path(command[0]).is_absolute() else str(BIN / command[0])
    done = subprocess.run([program, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
