"""Which compiler's cache this machine holds: its kind, version, target prefix and local folder.

A compile cache entry is only valid for the compiler that produced it, and TorchNeuron's NEFF
cache key does not include the compiler version. So every target keeps each compiler version
under its own prefix, and the prefix is derived here from what is installed, never typed:

* ``neuronxcc-<neuronx-cc version>-<target>-lnc<N>`` where neuronx-cc and torch-neuronx are
  installed: a NEFF is compiled for one target (trn2, trn3) at one logical NeuronCore size,
  which TorchNeuron's Python cache writer keys its entries by (docs/compile-cache.md); the
  target comes from the instance family, the LNC from what the runtime will use
  (NEURON_LOGICAL_NC_CONFIG, the node's file, else the family's default). Pulls also read the
  unkeyed ``neuronxcc-<version>`` folder, the seed buckets' and older targets' layout;
* ``inductor-torch-<torch version>`` elsewhere: inductor's on-disk caches, the stand-in on
  machines without Trainium (inductor keys its entries by torch version too, but a separate
  prefix keeps targets tidy and pulls small).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from model_support.compile_cache.errors import CacheDisabled, CompilerMismatch

CacheKind = Literal["neff", "inductor"]

NEFF_PREFIX = "neuronxcc"
INDUCTOR_PREFIX = "inductor-torch"
PREFIX_PATTERN = re.compile(
    rf"^(?P<family>{NEFF_PREFIX}|{INDUCTOR_PREFIX})-(?P<version>[^/\s]+?)"
    r"(?:-(?P<target>trn\d+)-lnc(?P<lnc>\d+))?$"
)
"""A path component that names a compiler prefix (a NEFF one may carry its target and LNC)."""
NEURON_TARGET_ENV = "MODEL_SUPPORT_NEURON_TARGET"
"""The compile target (trn2, trn3) where the instance type cannot be read (the operator sets it)."""
NEURON_TARGETS = {
    "trn2": "trn2",
    "trn2u": "trn2",
    "trn2p": "trn2",
    "trn2eu": "trn2",
    "trn3": "trn3",
}
"""The compile target of each instance family TorchNeuron runs on (Trainium2 or Trainium3)."""

NEFF_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_DISABLE_ENV = "TORCH_NEURONX_NEFF_DISABLE_CACHE"
NEFF_DEFAULT_DIR = "/tmp/neff_cache"
INDUCTOR_CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"

_NEURON_BACKENDS = {"neuron"}
_OTHER_BACKENDS = {"cpu", "cuda"}


@dataclass(frozen=True)
class CompilerCache:
    """The compile cache of the installed compiler: what it is and where it lives on disk."""

    kind: CacheKind
    compiler: str  # the distribution whose version keys the cache: neuronx-cc or torch
    version: str
    local_dir: Path
    target: str | None = None  # NEFF: the compile target (trn2, trn3)
    lnc: int | None = None  # NEFF: the logical NeuronCore size compiled for

    @property
    def key(self) -> str:
        """What a NEFF prefix adds to the version: ``-trn2-lnc2`` (empty when not keyed)."""
        if self.kind != "neff" or self.target is None or self.lnc is None:
            return ""
        return f"-{self.target}-lnc{self.lnc}"

    @property
    def prefix(self) -> str:
        """The target prefix for this compiler version, e.g. ``neuronxcc-2.28.7631.0``.

        A NEFF prefix carries neuronx-cc's public version: an installed neuronx-cc reports a
        build hash after ``+`` (``2.20.2831.0+8bfecb25`` in ``pip list``), which the CRD
        examples, the docs and people typing a path leave out. torch keeps its ``+cpu`` /
        ``+cu128``: those are different builds with different kernels.
        """
        if self.kind == "neff":
            return f"{NEFF_PREFIX}-{public_version(self.version)}{self.key}"
        return f"{INDUCTOR_PREFIX}-{self.version}"

    @property
    def accepted_prefixes(self) -> tuple[str, ...]:
        """Every spelling of this compiler's prefix a target may name: the canonical one first,
        then, for neuronx-cc, the installed version with its build hash (as Neuron's own caches
        name their folders, e.g. ``neuronxcc-2.16.372.0+4a9b2326``), then the same two without
        the target and LNC (the seed buckets' layout, and targets written before the key)."""
        family = NEFF_PREFIX if self.kind == "neff" else INDUCTOR_PREFIX
        spelled_out = f"{family}-{self.version}{self.key}"
        unkeyed = (f"{family}-{public_version(self.version)}", f"{family}-{self.version}")
        return tuple(dict.fromkeys((self.prefix, spelled_out, *unkeyed)))

    def check_prefix(self, named: str, uri: str) -> None:
        """Refuse a target that names another compiler's prefix (``named``)."""
        if named not in self.accepted_prefixes:
            raise CompilerMismatch(
                f"{uri} names the cache of {describe_prefix(named)}, but this machine has "
                f"{self.compiler} {self.version} installed (prefix {self.prefix}). A compile "
                "cache entry is only valid for the compiler that produced it (NEFF keys do not "
                "even include the compiler version), so it is never pulled or pushed across "
                f"versions. Give the cache's root ({uri.rstrip('/').rsplit('/', 1)[0]}) and the "
                "prefix is chosen from the installed stack."
            )


def public_version(version: str) -> str:
    """A version without its PEP 440 local segment: ``2.24.8799.0+6f62ff7c`` -> ``2.24.8799.0``."""
    return version.split("+", 1)[0]


def describe_prefix(prefix: str) -> str:
    """``neuronxcc-2.28.0`` -> ``neuronx-cc 2.28.0``; ``inductor-torch-2.13.0`` -> ``torch 2.13.0``;
    ``neuronxcc-2.28.0-trn2-lnc1`` -> ``neuronx-cc 2.28.0 for trn2 at LNC 1``."""
    match = PREFIX_PATTERN.fullmatch(prefix)
    if match is None:
        return prefix
    name = "neuronx-cc" if match["family"] == NEFF_PREFIX else "torch (inductor)"
    key = f" for {match['target']} at LNC {match['lnc']}" if match["target"] else ""
    return f"{name} {match['version']}{key}"


def neuron_target(environ: dict[str, str], instance: str | None) -> str | None:
    """The compile target of this machine: MODEL_SUPPORT_NEURON_TARGET, else the instance
    family's (trn2.3xlarge and trn2u.48xlarge are both trn2); None when neither is known."""
    named = (environ.get(NEURON_TARGET_ENV) or "").strip().lower()
    if named:
        return named
    family = (instance or "").strip().lower().split(".", 1)[0]
    return NEURON_TARGETS.get(family)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def neuron_installed() -> bool:
    """Whether the Trainium compiler stack (neuronx-cc and torch-neuronx) is installed."""
    return _version("neuronx-cc") is not None and _version("torch-neuronx") is not None


def installed_compiler_cache(
    backend: str | None = None, environ: dict[str, str] | None = None
) -> CompilerCache:
    """The compile cache run.py's compiler will use here.

    ``backend`` is run.py's device backend when it is forced (``neuron``, ``cpu``, ``cuda``);
    None or ``auto`` follows run.py's own choice: neuron wherever torch-neuronx is installed.
    The local folder comes from the same variables the compilers read.
    """
    env = dict(os.environ if environ is None else environ)
    backend = None if backend in (None, "auto") else backend
    use_neuron = backend in _NEURON_BACKENDS or (backend is None and neuron_installed())
    if use_neuron:
        version = _version("neuronx-cc")
        if version is None:
            raise CacheDisabled(
                "the neuron backend was asked for, but neuronx-cc is not installed here: "
                "no NEFF cache prefix can be derived (install the Neuron SDK or pick another backend)"
            )
        if env.get(NEFF_DISABLE_ENV, "").lower() in ("1", "true", "yes"):
            raise CacheDisabled(
                f"{NEFF_DISABLE_ENV} is set, so TorchNeuron neither reads nor writes its NEFF "
                f"cache: unset it to use a compile cache"
            )
        local = env.get(NEFF_CACHE_DIR_ENV) or NEFF_DEFAULT_DIR
        target, lnc = neff_key(env)
        return CompilerCache("neff", "neuronx-cc", version, Path(local), target, lnc)
    if backend is not None and backend not in _OTHER_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected neuron, cpu, cuda or auto")
    version = _version("torch")
    if version is None:
        raise CacheDisabled("torch is not installed here: there is no compiler cache to use")
    local = env.get(INDUCTOR_CACHE_DIR_ENV) or _inductor_default_dir()
    return CompilerCache("inductor", "torch", version, Path(local))


def neff_key(environ: dict[str, str]) -> tuple[str, int]:
    """The compile target and LNC a NEFF compiled here is for, as run.py reads them (the LNC:
    NEURON_LOGICAL_NC_CONFIG, the node's file, else the family's default). Raises CacheDisabled
    when either cannot be known: a NEFF cache is never shared across them."""
    from model_support.neuron_node import LncError, effective_lnc, instance_type, lnc_config_text

    instance = environ.get("MODEL_SUPPORT_INSTANCE_TYPE") or instance_type()
    target = neuron_target(environ, instance)
    try:
        lnc, _ = effective_lnc(environ, lnc_config_text(), instance)
    except LncError as exc:
        raise CacheDisabled(f"the NEFF cache is kept per LNC, and {exc}") from exc
    if target is None or lnc is None:
        unknown = " and ".join(
            what for what, value in (("compile target", target), ("LNC", lnc)) if value is None
        )
        raise CacheDisabled(
            "the NEFF cache is kept per compile target and logical NeuronCore size, and the "
            f"{unknown} cannot be known here (instance type {instance or 'unknown'}): set "
            f"MODEL_SUPPORT_INSTANCE_TYPE (e.g. trn2.48xlarge) or {NEURON_TARGET_ENV}, and "
            "NEURON_LOGICAL_NC_CONFIG"
        )
    return target, lnc


def _inductor_default_dir() -> str:
    # torch's own rule (a per-user folder under the temp dir), asked from torch so it cannot
    # drift; only imported when TORCHINDUCTOR_CACHE_DIR does not already say where.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return str(default_cache_dir())
