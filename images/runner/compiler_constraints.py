"""Print pip constraints that hold the image's compiler stack where its base installed it.

The runner image adds transformers, diffusers and the rest on top of a base that carries
torch, torch-neuronx and neuronx-cc (a Neuron DLC, or torchneuron-base.Dockerfile). pip does
not look at what installed packages require when it resolves new ones, so a newer
transformers could pull a torch, numpy or protobuf that the compiler was not built for. This
script pins every installed compiler package and each installed distribution one of them
requires directly, at its installed version (``name==version``, one per line, sorted); the
Dockerfile installs everything else with ``pip install -c`` on that file, and keeps the file in
the image (/etc/model-support/compiler-constraints.txt) for anyone adding packages later.

It also says (on stderr, in the build's log) which Neuron SDK release the base's compiler stack
is (SDK_RELEASES, docs/neuron-releases.md), and refuses a base whose torch is not the one its
torch-neuronx requires: each torch-neuronx family is built for one PyTorch, and such an image
would fail at its first import.

Standard library only (and pip's vendored packaging where present): it runs in the base,
before anything of ours is installed.
Usage: python3 compiler_constraints.py [ROOT ...]   (default: the compiler stack below)
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

COMPILER_STACK = ("torch", "torch-neuronx", "neuronx-cc", "libneuronxla", "nki", "torchvision")
"""The distributions whose versions the compiler decides (absent ones are skipped)."""

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

SDK_RELEASES: dict[str, dict[str, str]] = {
    "2.33.0": {
        "torch": "2.14.0",
        "torch-neuronx": "2.14.3.0.*",
        "neuronx-cc": "2.28.7631.0",
        "nki": "0.7.0",
    },
}
"""Each Neuron SDK release's Python compiler stack (``.*``: a package family): a copy of
docs/neuron-releases.md's table, which tests/test_neuron_releases.py keeps equal."""


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


def version_matches(installed: str, pinned: str) -> bool:
    """Whether ``installed`` (its public part) is ``pinned``, or in the family ``pinned.*``."""
    public = installed.split("+", 1)[0]
    if pinned.endswith(".*"):
        return public.startswith(pinned[:-1])
    return public == pinned


def release_of(installed: dict[str, str | None]) -> str | None:
    """The SDK release whose pins the installed distributions are (None: no release's)."""
    for release, pins in SDK_RELEASES.items():
        if all(installed.get(name) and version_matches(installed[name], pinned)  # type: ignore[arg-type]
               for name, pinned in pins.items()):  # fmt: skip
            return release
    return None


def torch_problem() -> str | None:
    """Why the installed torch is not the one torch-neuronx requires (None: it is, or there is
    no torch-neuronx, or nothing to judge requirements with)."""
    if installed_version("torch-neuronx") is None:
        return None
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
        except ImportError:
            return None
    torch = installed_version("torch")
    for text in importlib.metadata.requires("torch-neuronx") or []:
        requirement = Requirement(text)
        if requirement.name.lower() != "torch":
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        if torch is None or not requirement.specifier.contains(
            torch.split("+", 1)[0], prereleases=True
        ):
            return (
                f"torch-neuronx {installed_version('torch-neuronx')} requires {text}, but "
                f"torch {torch or 'is not installed'}" + (" is installed" if torch else "")
            )
    return None


def main(argv: list[str]) -> int:
    problem = torch_problem()
    if problem:
        print(f"compiler_constraints: {problem}; the base image is broken", file=sys.stderr)
        return 1
    if installed_version("torch-neuronx") is not None:
        found = {
            name: installed_version(name)
            for name in ("torch", "torch-neuronx", "neuronx-cc", "nki")
        }
        release = release_of(found)
        print(
            f"compiler_constraints: the compiler stack of Neuron SDK {release}"
            if release
            else "compiler_constraints: a compiler stack of no release in docs/neuron-releases.md "
            f"({', '.join(f'{k} {v}' for k, v in found.items())})",
            file=sys.stderr,
        )
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
