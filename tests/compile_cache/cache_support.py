"""Helpers for the compile cache tests: compilers and files as the real ones make them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from model_support.compile_cache.compilers import CompilerCache

TORCH_VERSION = "2.13.0+cpu"
NEURONX_CC = "2.28.7631.0"


def inductor_cache(root: Path) -> CompilerCache:
    return CompilerCache("inductor", "torch", TORCH_VERSION, root)


def neff_cache(root: Path, version: str = NEURONX_CC) -> CompilerCache:
    return CompilerCache("neff", "neuronx-cc", version, root)


def shared_object(path: Path, source: str = "int f(int x) { return x + 1; }") -> Path:
    """A real ELF shared object, built by the C compiler inductor uses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    c = path.with_name(path.name.split(".", 1)[0] + ".c")
    c.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(c)], check=True)
    c.unlink()
    return path


def write(root: Path, relpath: str, data: bytes) -> Path:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
