"""Print pip constraints that hold the image's compiler stack where its base installed it.

The runner image adds transformers, diffusers and the rest on top of a base that carries
torch, torch-neuronx and neuronx-cc (a Neuron DLC, or torchneuron-base.Dockerfile). pip does
not look at what installed packages require when it resolves new ones, so a newer
transformers could pull a torch, numpy or protobuf that the compiler was not built for. This
script pins every installed compiler package and each installed distribution one of them
requires directly, at its installed version (``name==version``, one per line, sorted); the
Dockerfile installs everything else with ``pip install -c`` on that file, and keeps the file in
the image (/etc/model-support/compiler-constraints.txt) for anyone adding packages later.

Standard library only: it runs in the base, before anything of ours is installed.
Usage: python3 compiler_constraints.py [ROOT ...]   (default: the compiler stack below)
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

COMPILER_STACK = ("torch", "torch-neuronx", "neuronx-cc", "libneuronxla", "nki", "torchvision")
"""The distributions whose versions the compiler decides (absent ones are skipped)."""

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def required_names(name: str) -> list[str]:
    """The distributions ``name`` requires directly (any marker: an installed one is pinned)."""
    names = []
    for requirement in importlib.metadata.requires(name) or []:
        match = _NAME.match(requirement)
        if match:
            names.append(match.group(1))
    return names


def constraints(roots: tuple[str, ...] = COMPILER_STACK) -> list[str]:
    """``name==version`` for each installed root and each installed direct requirement."""
    pins: dict[str, str] = {}
    for root in roots:
        version = installed_version(root)
        if version is None:
            continue
        pins[canonical(root)] = version
        for dependency in required_names(root):
            dependency_version = installed_version(dependency)
            if dependency_version is not None:
                pins.setdefault(canonical(dependency), dependency_version)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def main(argv: list[str]) -> int:
    pins = constraints(tuple(argv) or COMPILER_STACK)
    if not pins:
        print(
            "compiler_constraints: none of the compiler packages is installed "
            f"({', '.join(tuple(argv) or COMPILER_STACK)}); the base image must carry torch",
            file=sys.stderr,
        )
        return 1
    print("\n".join(pins))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
