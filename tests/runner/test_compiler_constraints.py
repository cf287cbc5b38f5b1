"""The runner image's compiler pins: what images/runner/compiler_constraints.py holds in place."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "images" / "runner" / "compiler_constraints.py"


def _constraints(*roots: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *roots], capture_output=True, text=True, check=False
    )


def test_the_installed_compiler_stack_and_its_direct_requirements_are_pinned() -> None:
    """Here the stack is CPU torch: it and what it requires are pinned at the versions found,
    and nothing the runner adds on top (transformers) is."""
    done = _constraints()
    assert done.returncode == 0, done.stderr
    pins = dict(line.split("==", 1) for line in done.stdout.split())
    assert pins["torch"] == importlib.metadata.version("torch")
    assert pins["filelock"] == importlib.metadata.version("filelock")  # torch requires it
    assert pins["typing-extensions"] == importlib.metadata.version("typing_extensions")
    assert "transformers" not in pins and "torch-neuronx" not in pins  # not a root / absent
    assert done.stdout.split() == sorted(done.stdout.split())


def test_a_base_without_the_compiler_is_refused_with_a_reason() -> None:
    done = _constraints("torch-neuronx", "neuronx-cc")
    assert done.returncode == 1 and done.stdout == ""
    assert "none of the compiler packages is installed (torch-neuronx, neuronx-cc)" in done.stderr


def test_pip_keeps_a_pinned_version_it_would_otherwise_move(tmp_path: Path) -> None:
    """The constraint binds: a request for another torch than the pinned one cannot resolve
    (pip's resolver, offline, with nothing to download)."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(_constraints("torch").stdout)
    pinned = importlib.metadata.version("torch")
    # Only our constraint: no pip configuration or PIP_* variables of this machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
            "--find-links", str(tmp_path), "--constraint", str(constraints), f"torch!={pinned}",
        ],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert f"The user requested (constraint) torch=={pinned}" in said, said
