"""A small package index made here: pure-Python distributions in several versions, built into
wheels by setuptools (its PEP 517 backend, as pip builds them) and laid out as a PEP 503 "simple"
index that pip reads through a file:// URL.

Built once per content (the sources, the versions) into the shared cache, like the demo
checkpoints: later sessions find it built.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from model_support.checkpoints import default_cache_dir


@dataclass(frozen=True)
class Distribution:
    """One distribution in several versions: its module's source, with ``{version}`` filled in."""

    name: str
    module: str
    source: str
    versions: tuple[str, ...]


_BUILD = """
import os, sys
from setuptools import build_meta
out = sys.argv[1]
for folder in sys.argv[2:]:
    os.chdir(folder)
    build_meta.build_wheel(out)
"""


def _pyproject(dist: Distribution, version: str) -> str:
    return (
        '[build-system]\nrequires = ["setuptools>=70"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{dist.name}"\nversion = "{version}"\n'
        f'[tool.setuptools]\npy-modules = ["{dist.module}"]\n'
    )


def build_index(distributions: list[Distribution]) -> str:
    """The file:// URL of a simple index holding every version of ``distributions``."""
    digest = hashlib.sha256(
        json.dumps([d.__dict__ for d in distributions], sort_keys=True).encode()
    ).hexdigest()[:16]
    root = default_cache_dir().parent / "test-package-index" / digest
    if (root / "ready").is_file():
        return (root / "simple").as_uri()
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="package-index-") as tmp:
        folders = []
        for dist in distributions:
            for version in dist.versions:
                folder = Path(tmp) / f"{dist.name}-{version}"
                folder.mkdir()
                (folder / "pyproject.toml").write_text(_pyproject(dist, version))
                (folder / f"{dist.module}.py").write_text(dist.source.format(version=version))
                folders.append(str(folder))
        # One process builds them all (a pip wheel per version would start a backend each time).
        subprocess.run(
            [sys.executable, "-c", _BUILD, str(files), *folders],
            check=True,
            capture_output=True,
            env={**os.environ, "SETUPTOOLS_USE_DISTUTILS": "local"},
        )
    simple = root / "simple"
    projects = []
    for dist in distributions:
        project = canonicalize_name(dist.name)
        projects.append(project)
        stem = dist.name.replace("-", "_")
        links = []
        for wheel in sorted(files.glob(f"{stem}-*.whl")):
            sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append(
                f'<a href="../../files/{html.escape(wheel.name)}#sha256={sha}">'
                f"{html.escape(wheel.name)}</a><br>"
            )
        (simple / project).mkdir(parents=True, exist_ok=True)
        (simple / project / "index.html").write_text(
            "<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>\n"
        )
    (simple / "index.html").write_text(
        "<!DOCTYPE html><html><body>"
        + "".join(f'<a href="{p}/">{p}</a><br>' for p in projects)
        + "</body></html>\n"
    )
    (root / "ready").write_text("built\n")
    return simple.as_uri()
