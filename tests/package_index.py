"""A small package index made here: pure-Python distributions in several versions, built into
wheels by setuptools (its PEP 517 backend, as pip builds them) and laid out as a PEP 503 "simple"
index that pip reads through a file:// URL.

Built once per content (the sources, the versions) into the shared cache, like the demo
checkpoints: later sessions find it built. :func:`served` serves one over HTTP, as an index
outside the machine is (the operator's ``spec.index.indexUrl`` takes http(s) URLs only).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from packaging.utils import canonicalize_name

from model_support.checkpoints import default_cache_dir


@dataclass(frozen=True)
class Distribution:
    """One distribution in several versions: its module's source, with ``{version}`` filled in."""

    name: str
    module: str
    source: str
    versions: tuple[str, ...]


BACKEND = Distribution(
    name="tiny-compile-backend",
    module="tiny_compile_backend",
    versions=tuple(f"1.0.{n}" for n in range(8)),
    source='''"""A torch.compile backend in one of its releases: from 1.0.5 on it miscompiles."""
from model_support import faults

VERSION = "{version}"


def compile(gm, example_inputs):
    release = tuple(int(part) for part in VERSION.split("."))
    if release >= (1, 0, 5):
        return faults.dense_miscompiler(gm, example_inputs)
    return faults.benign(gm, example_inputs)
''',
)
"""A compile backend in eight versions, the sixth of which (1.0.5) starts miscompiling."""
HELPER = Distribution(
    name="tiny-helper",
    module="tiny_helper",
    versions=("2.0.0", "2.0.1", "2.0.2", "2.0.3"),
    source='VERSION = "{version}"\n',
)
"""A helper package in four harmless versions."""

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


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Requests are not logged (pip's listings would fill the test's output)."""


@contextmanager
def served(index_url: str) -> Iterator[str]:
    """The simple index at ``index_url`` (a file:// URL from :func:`build_index`) served over
    HTTP on localhost while the block runs: the URL of its simple/ page."""
    simple = Path(urlparse(index_url).path)
    handler = partial(_Quiet, directory=str(simple.parent))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, name="package index", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/{simple.name}/"
        finally:
            server.shutdown()
            thread.join(timeout=10)
