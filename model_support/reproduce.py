"""Reproducing a row: its exact run.py, what to install for it, where to run it, and a rerun here.

A row holds the run.py that ran (byte for byte), its stack (the versions that decide the
outcome) and every package installed where it ran. What a reproduction needs installed is less:
only what run.py uses beyond its stack's base image, at the row's versions. For a Trainium row
the base is the TorchNeuron Deep Learning Container (torch, torch-neuronx and neuronx-cc come
with it; the runner image adds the model libraries: images/runner/Dockerfile); elsewhere it is a
plain Python image of the row's Python, and torch is installed too, from PyTorch's own package
index when its version names a build (``+cpu``, ``+cu128``).

The packages are the closure of run.py's libraries over their declared dependencies (read from
the distributions installed here, the same names wherever they are installed), minus what the
base image brings, each pinned to the version the row recorded.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from model_support.records import ResultDocument

PYPI_INDEX = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{build}"

LIBRARIES_BY_TASK_FAMILY: dict[str, tuple[str, ...]] = {
    "feature-extraction": ("sentence-transformers",),
    "sentence-similarity": ("sentence-transformers",),
    "text-to-image": ("diffusers",),
}
"""What a task's section of run.py imports beyond transformers (Appendix A of run.py)."""
COMMON_LIBRARIES = ("transformers", "huggingface-hub", "tokenizers", "safetensors", "accelerate")
"""What every run.py imports or loads through (STACK_PACKAGES of run.py, less the device's)."""
IMAGE_LIBRARIES = ("pillow", "numpy")
"""Image and audio inputs: run.py draws its test images with PIL and its tones with numpy."""
NEURON_BASE_PACKAGES = ("torch", "torch-neuronx", "neuronx-cc")
"""What the TorchNeuron Deep Learning Container brings (its whole dependency closure with it)."""
STACK_DISTRIBUTIONS = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "huggingface_hub": "huggingface-hub",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "torch_neuronx": "torch-neuronx",
    "neuronx_cc": "neuronx-cc",
    "sentence_transformers": "sentence-transformers",
    "diffusers": "diffusers",
}
"""A recorded stack's fields and the distributions they are the versions of."""
THIS_PACKAGE = "model-support"
THIS_PACKAGE_MODULE = "model_support"
"""This project's distribution and module (compile backends such as model_support.faults)."""


class NotReproducible(ValueError):
    """The row cannot be reproduced as asked (no run.py stored, an unknown run id); says why."""


@dataclass(frozen=True)
class Recipe:
    """How to reproduce one row."""

    run_id: str
    model_id: str
    run_py: str
    image: str
    image_note: str
    requirements: list[str]  # name==version, sorted
    indexes: list[str]  # package indexes the requirements need (the first one is the main index)
    instance: str | None
    lnc: int | None
    cores: int
    notes: list[str] = field(default_factory=list)
    docker_flags: list[str] = field(default_factory=list)  # a Neuron row: devices and LNC
    requirement_notes: list[str] = field(default_factory=list)  # said in requirements.txt

    def requirements_text(self) -> str:
        """requirements.txt: the indexes, then one pinned package a line."""
        lines = [
            f"# What run {self.run_id} used on top of {self.image}, at its versions.",
            "# Install: python3 -m pip install -r requirements.txt",
            *(f"# NOTE: {note}" for note in self.requirement_notes),
        ]
        if self.indexes:
            lines.append(f"--index-url {self.indexes[0]}")
            lines += [f"--extra-index-url {index}" for index in self.indexes[1:]]
        lines += self.requirements
        return "\n".join(lines) + "\n"

    def commands(self, folder: str) -> list[str]:
        """Shell commands that set up and run the reproduction from ``folder``."""
        quoted = shlex.quote(folder)
        flags = "".join(f"{flag} " for flag in self.docker_flags)
        return [
            f"cd {quoted}",
            f'docker run --rm -it {flags}-v "$PWD":/work -w /work {shlex.quote(self.image)} '
            "sh -c 'python3 -m pip install -r requirements.txt && python3 run.py'",
            "# or, on a machine with that stack: python3 -m venv .venv && . .venv/bin/activate "
            "&& python3 -m pip install -r requirements.txt && python3 run.py",
        ]


def plain_row(cells: Mapping[str, Any]) -> dict[str, Any]:
    """A matrix row as pandas gives it, as :func:`recipe` takes it: missing cells (None, NaN,
    NA, NaT) as None, the packages as a list of strings."""
    import pandas as pd

    row = {
        name: None if not hasattr(value, "__len__") and bool(pd.isna(value)) else value
        for name, value in cells.items()
    }
    packages = row.get("packages")
    row["packages"] = [str(p) for p in packages] if packages is not None else []
    return row


def recipe(
    row: dict[str, Any], installed: Iterable[importlib.metadata.Distribution] | None = None
) -> Recipe:
    """The recipe of a matrix row (a dict of its columns)."""
    run_py = row.get("run_py")
    if not run_py:
        raise NotReproducible(f"run {row.get('run_id')} stores no run.py: it cannot be rerun")
    stack = (
        json.loads(row["stack"]) if isinstance(row.get("stack"), str) else row.get("stack") or {}
    )
    versions = pinned_versions(row.get("packages") or [])
    for key, distribution in STACK_DISTRIBUTIONS.items():
        # An EXCLUDED row ran nothing and lists no packages: its stack still names the
        # versions it was planned for (the writer's), which are what run.py would have used.
        if stack.get(key) and canonicalize_name(distribution) not in versions:
            versions[canonicalize_name(distribution)] = (distribution, str(stack[key]))
    neuron = row.get("backend") == "neuron" or stack.get("torch_neuronx") is not None
    roots = [*COMMON_LIBRARIES, *LIBRARIES_BY_TASK_FAMILY.get(row.get("task") or "", ())]
    if row.get("task") in ("image-text-to-text", "image-classification", "text-to-image",
                           "automatic-speech-recognition"):  # fmt: skip
        roots += IMAGE_LIBRARIES
    dependencies = (
        dependency_graph(installed) if installed is not None else installed_dependency_graph()
    )
    base = closure(NEURON_BASE_PACKAGES, dependencies) if neuron else set()
    if not neuron:
        roots.append("torch")
    wanted = closure(roots, dependencies) - base
    requirements, missing = [], []
    for name in sorted(wanted):
        if name in versions:
            requirements.append(f"{versions[name][0]}=={versions[name][1]}")
        elif name in {canonicalize_name(r) for r in roots}:
            missing.append(name)
    indexes = [PYPI_INDEX]
    torch_version = versions.get("torch", (None, stack.get("torch")))[1]
    build = torch_version.partition("+")[2] if torch_version else ""
    if not neuron and build:
        indexes.append(PYTORCH_INDEX.format(build=build))
    notes = []
    if missing:
        notes.append(
            f"the row recorded no version of {', '.join(missing)}: install the one of its stack"
        )
    compile_backend = row.get("compile_backend") or ""
    requirement_notes: list[str] = []
    if ":" in compile_backend:
        module = compile_backend.partition(":")[0]
        top = module.split(".")[0]
        providers = _distributions_of(top)
        if top == THIS_PACKAGE_MODULE:
            ran = versions.get(canonicalize_name(THIS_PACKAGE), (THIS_PACKAGE, None))[1]
            said = (
                f"run.py's compile backend {compile_backend} is importable only from "
                f"{THIS_PACKAGE} (this project's own package, not on the package index): install "
                f"it from the project's repository"
                + (f" at the version the row ran ({THIS_PACKAGE}=={ran})" if ran else "")
                + " before running run.py"
            )
            notes.append(said)
            requirement_notes.append(said)
        elif providers and any(canonicalize_name(d) in versions for d in providers):
            for distribution in providers:
                name = canonicalize_name(distribution)
                if (
                    name in versions
                    and f"{versions[name][0]}=={versions[name][1]}" not in requirements
                ):
                    requirements.append(f"{versions[name][0]}=={versions[name][1]}")
            requirements.sort(key=str.lower)
        else:
            notes.append(
                f"the compile backend {compile_backend} is a Python function: its module {module} "
                "must be importable where run.py runs (installed, or beside run.py)"
            )
    path = row.get("model_path") or ""
    if path.startswith("/"):
        notes.append(
            f"the model is a local checkpoint at {path}: have it at that path (or change "
            '"model" in run.py\'s CONFIG)'
        )
    labels = json_object(row.get("labels"))
    image, image_note = base_image(neuron, stack, labels.get("image"))
    lnc = _int(row.get("lnc") if row.get("lnc") is not None else stack.get("lnc"))
    cores = _int(row.get("neuron_cores")) or 1
    instance = row.get("instance_type") or stack.get("instance_type")
    return Recipe(
        run_id=str(row["run_id"]),
        model_id=str(row.get("model_id")),
        run_py=str(run_py),
        image=image,
        image_note=image_note,
        requirements=requirements,
        indexes=indexes,
        instance=instance,
        lnc=lnc,
        cores=cores,
        notes=notes,
        docker_flags=neuron_docker_flags(cores, instance, lnc) if neuron else [],
        requirement_notes=requirement_notes,
    )


def neuron_docker_flags(cores: int, instance: str | None, lnc: int | None) -> list[str]:
    """What a container needs to run a Neuron row: one ``--device=/dev/neuronN`` per device
    its cores span (the Neuron SDK's container guide: ``docker run --device=/dev/neuron0``,
    deploy/environments/docker-setup.rst) and the row's LNC (TorchNeuron reads only
    NEURON_LOGICAL_NC_CONFIG)."""
    from model_support import hardware

    family = hardware.instance_family(instance or "trn2")
    per_device = max(1, hardware.PHYSICAL_CORES_PER_DEVICE.get(family, 8) // (lnc or 1))
    devices = -(-max(cores, 1) // per_device)
    flags = [f"--device=/dev/neuron{index}" for index in range(devices)]
    if lnc is not None:
        flags.append(f"-e NEURON_LOGICAL_NC_CONFIG={lnc}")
    return flags


def json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value) if isinstance(value, str) else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _distributions_of(module: str) -> list[str]:
    """The installed distributions that provide top-level module ``module``."""
    return list(importlib.metadata.packages_distributions().get(module, []))


def base_image(neuron: bool, stack: dict[str, Any], recorded: str | None = None) -> tuple[str, str]:
    """The image to reproduce a row in, and how it was chosen: for a Neuron row the runner
    image it ran in (``recorded``, as the operator labels its records), else the TorchNeuron
    base of the runner image."""
    if neuron and recorded:
        return recorded, (
            f"the runner image the row ran in (neuronx-cc {stack.get('neuronx_cc') or '(unknown)'}"
            f", torch-neuronx {stack.get('torch_neuronx') or '(unknown)'})"
        )
    if neuron:
        from model_support.script import runner_constant

        image = str(runner_constant("TORCHNEURON_BASE_IMAGE"))
        return image, (
            f"the TorchNeuron Deep Learning Container the runner image is built on; the row ran "
            f"neuronx-cc {stack.get('neuronx_cc') or '(unknown)'} and torch-neuronx "
            f"{stack.get('torch_neuronx') or '(unknown)'}: for another Neuron SDK pick its tag "
            "(docs/trainium.md)"
        )
    python = stack.get("python") or "3.11"
    major_minor = ".".join(python.split(".")[:2])
    return (
        f"python:{major_minor}-slim",
        f"a plain Python {major_minor} image (the row ran Python {python}); torch is installed "
        "with the rest",
    )


def pinned_versions(packages: Iterable[str]) -> dict[str, tuple[str, str]]:
    """name==version entries by canonical name: (the name as recorded, the version)."""
    versions: dict[str, tuple[str, str]] = {}
    for entry in packages:
        name, sep, version = str(entry).partition("==")
        if sep and name and version:
            versions[canonicalize_name(name)] = (name, version)
    return versions


def dependency_graph(
    installed: Iterable[importlib.metadata.Distribution] | None = None,
) -> dict[str, set[str]]:
    """Each installed distribution's unconditional dependencies (canonical names)."""
    graph: dict[str, set[str]] = {}
    for dist in installed if installed is not None else importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        needs = set()
        for text in dist.requires or []:
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            # Extras and markers for another platform are not what a plain install pulls in.
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            needs.add(canonicalize_name(requirement.name))
        graph.setdefault(canonicalize_name(name), set()).update(needs)
    return graph


@functools.cache
def installed_dependency_graph() -> dict[str, set[str]]:
    """The dependency graph of this environment, read once per process (a viewer asks for every
    row; reading every distribution's metadata takes 0.5-0.7 s on 2 cores)."""
    return dependency_graph()


def closure(roots: Iterable[str], graph: dict[str, set[str]]) -> set[str]:
    """``roots`` and everything they depend on, transitively (canonical names)."""
    seen: set[str] = set()
    todo: list[str] = [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(graph.get(name, ()))
    return seen


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def stored_tokens(row: dict[str, Any]) -> list[list[int]] | None:
    """The generated tokens a row recorded, per prompt, from its verdict's positions (None for
    tasks that decode no tokens)."""
    text = row.get("verification_json")
    if not text:
        return None
    positions = json.loads(text).get("positions") or []
    if not positions:
        return None
    tokens: dict[int, list[int]] = {}
    for position in positions:
        tokens.setdefault(int(position["prompt"]), []).append(int(position["token"]))
    return [tokens[p] for p in sorted(tokens)]


COMPARED_FIGURES = (
    "error_ratio",
    "q90_ratio",
    "peak_ratio",
    "kl_ratio",
    "mismatches",
    "near_ties",
    "bad_tokens",
)


@dataclass(frozen=True)
class Comparison:
    """A rerun beside the stored row: whether they agree, and the figures side by side."""

    agree: bool
    reasons: list[str]
    figures: list[tuple[str, Any, Any]]  # (what, stored, rerun)


def compare(row: dict[str, Any], rerun: ResultDocument) -> Comparison:
    """Agreement: the same result (and error class) and, for tasks that decode, the same
    tokens; the verdict's figures are shown beside each other (they may differ in the last
    digits where the arithmetic does)."""
    stored_verification = json.loads(row.get("verification_json") or "{}")
    new_verification = rerun.verification.model_dump()
    figures: list[tuple[str, Any, Any]] = [
        ("result", row.get("result"), rerun.result.value),
        (
            "error_class",
            row.get("error_class"),
            rerun.error_class.value if rerun.error_class else None,
        ),
        (
            "failed_checks",
            stored_verification.get("failed_checks"),
            new_verification.get("failed_checks"),
        ),
    ]
    figures += [
        (name, stored_verification.get(name), new_verification.get(name))
        for name in COMPARED_FIGURES
    ]
    reasons = []
    if row.get("result") != rerun.result.value:
        reasons.append(
            f"the result differs: stored {row.get('result')}, rerun {rerun.result.value}"
        )
    elif figures[1][1] != figures[1][2]:
        reasons.append(f"the error class differs: stored {figures[1][1]}, rerun {figures[1][2]}")
    tokens = stored_tokens(row)
    if tokens is not None:
        same = tokens == [list(t) for t in rerun.tokens]
        figures.append(
            ("tokens", f"{sum(map(len, tokens))} tokens", "identical" if same else "different")
        )
        if not same:
            reasons.append("the generated tokens differ")
    return Comparison(agree=not reasons, reasons=reasons, figures=figures)
