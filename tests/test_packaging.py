"""What `pip install .` ships: every package of the source tree (the images install it so)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_shipped() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    # An editable install finds a missing subpackage anyway; a wheel (an image) does not.
    assert found - shipped == set(), f"add these to [tool.setuptools] packages: {found - shipped}"


def test_repository_root_shadows_no_standard_module() -> None:
    """With the root on sys.path (PYTHONPATH=., IDEs, `python -c` run there), the top-level folders
    (operator/, viewer/, images/) never hide a standard-library module of the same name."""
    import subprocess
    import sys

    probe = (
        "import operator, sys; operator.eq; "
        "assert operator.__file__.startswith(sys.base_prefix), operator.__file__"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={"PYTHONPATH": ".", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    stdlib = set(sys.stdlib_module_names)
    packages = {init.parent.name for init in ROOT.glob("*/__init__.py")}
    assert packages & stdlib == set(), (
        f"these folders shadow the standard library: {packages & stdlib}"
    )
