"""Hardware profiles: how much memory one core has and how many cores one test may use.

All figures live in ONE table (:data:`PROFILES`) so that a corrected figure (for example the
per-core memory at LNC=1, still unconfirmed) is changed in one place. Source: docs/hardware.md,
which gives each figure with its public source (trn2.48xlarge: 16 Trainium2 devices of 96 GiB;
LNC=2 gives 4 logical cores per device, 24 GiB each; LNC=1 gives 8 per device, ~12 GiB each;
trn3.48xlarge: 16 Trainium3 devices of 144 GiB, 8 physical cores each; trn1: 2 cores of 16 GiB
per device; inf2: 2 cores of 16 GiB per device). Each profile's core and memory figures are
derived from its devices (:func:`_neuron_profile`).

The local ``cpu`` and ``cuda`` profiles describe the machine sizing runs on, so that a model can
be sized for a local run: ``cpu`` is one "core" holding the host's physical memory, ``cuda`` one
core per visible GPU with that GPU's memory (read through torch when a GPU is present).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

GiB = 1024**3

InstanceKind = Literal["trn2", "trn3", "trn1", "inf2", "cpu", "cuda"]
INSTANCE_KINDS: tuple[str, ...] = ("trn2", "trn3", "trn1", "inf2", "cpu", "cuda")


@dataclass(frozen=True)
class HardwareProfile:
    """Memory and core counts of one kind of machine, as sizing sees it.

    ``bytes_per_core`` is what one (logical) core can address; ``runtime_reserve_bytes`` is held
    back on every core for the runtime itself (NEFF, collectives buffers, allocator slack);
    ``workspace_fraction`` of the model's own bytes is held back for activations and scratch.
    """

    name: str
    instance: InstanceKind
    lnc: int | None
    cores_per_device: int
    cores_per_instance: int
    bytes_per_core: int
    runtime_reserve_bytes: int
    workspace_fraction: float
    description: str
    instance_type: str | None = None
    """The EC2 instance type the figures describe (the node label tests are placed by)."""
    placeable_devices: tuple[int, ...] | None = None
    """Device counts one pod can be given when it spans more than one device (the Neuron
    scheduler extension and the DRA driver's connected groups on torus instances: 1, 4, 8 or 16
    devices; docs/hardware.md); None: any count."""

    def pod_cores(self, cores: int) -> int:
        """The cores a pod must hold for a run on ``cores`` cores: ``cores`` itself within one
        device, else every core of the fewest placeable devices that hold them.

        Raises ValueError when no placeable set of one instance holds them."""
        if self.placeable_devices is None or cores <= self.cores_per_device:
            return cores
        devices = -(-cores // self.cores_per_device)
        for count in self.placeable_devices:
            if count >= devices:
                return count * self.cores_per_device
        raise ValueError(
            f"{cores} cores need {devices} devices of {self.name}; a pod can hold at most "
            f"{self.placeable_devices[-1]} connected devices"
        )


# Neuron runtime reserve per core: the runtime, the loaded NEFF and collective buffers. A fixed
# 1 GiB is a deliberate over-estimate until device measurements replace it.
_NEURON_RESERVE = 1 * GiB
_WORKSPACE = 0.10
_TORUS_DEVICES = (1, 4, 8, 16)
"""Device counts the Neuron scheduler extension (and the DRA driver's device groups) places on
the 16-device 2D torus of trn1.32xlarge and trn2.48xlarge (docs/hardware.md)."""

PHYSICAL_CORES_PER_DEVICE: dict[str, int] = {
    "trn2": 8,
    "trn2u": 8,
    "trn2p": 8,
    "trn2eu": 8,
    "trn3": 8,
    "trn1": 2,
    "trn1n": 2,
    "inf2": 2,
}
"""Physical NeuronCores of one device by instance family (Trainium2: 8 NeuronCore-v3;
Trainium3: 8 NeuronCore-v4; Trainium and Inferentia2: 2 NeuronCore-v2; docs/hardware.md).
run.py keeps a copy (it derives a pod's cores from its devices); a test holds the two equal."""


def _neuron_profile(
    kind: InstanceKind,
    instance_type: str,
    devices: int,
    chip: str,
    device_gib: int,
    lnc: int | None,
    placeable: tuple[int, ...] | None,
) -> HardwareProfile:
    """One Neuron instance's profile, its core and memory figures derived from its devices:
    ``devices`` ``chip`` devices of ``device_gib`` GiB, each of PHYSICAL_CORES_PER_DEVICE[kind]
    physical cores grouped ``lnc`` to a logical core (None: no LNC setting)."""
    per_device = PHYSICAL_CORES_PER_DEVICE[kind] // (lnc or 1)
    per_core_gib = device_gib // per_device
    # At LNC=1 the split of a device's memory over its physical cores is derived, not stated.
    approx = "~" if lnc == 1 else ""
    cores = "logical cores" if lnc == 2 else "cores"
    return HardwareProfile(
        name=f"{kind}-lnc{lnc}" if lnc else kind,
        instance=kind,
        instance_type=instance_type,
        lnc=lnc,
        cores_per_device=per_device,
        cores_per_instance=devices * per_device,
        bytes_per_core=per_core_gib * GiB,
        runtime_reserve_bytes=_NEURON_RESERVE,
        workspace_fraction=_WORKSPACE,
        description=f"{instance_type}{f', LNC={lnc}' if lnc else ''}: {devices} {chip} devices "
        f"x {per_device} {cores}, {approx}{per_core_gib} GiB per core",
        placeable_devices=placeable,
    )


PROFILES: dict[tuple[str, int | None], HardwareProfile] = {
    # trn2.48xlarge: 16 Trainium2 devices of 96 GiB on a 2D torus.
    ("trn2", 2): _neuron_profile("trn2", "trn2.48xlarge", 16, "Trainium2", 96, 2, _TORUS_DEVICES),
    ("trn2", 1): _neuron_profile("trn2", "trn2.48xlarge", 16, "Trainium2", 96, 1, _TORUS_DEVICES),
    # trn3.48xlarge: 16 Trainium3 devices of 144 GiB, all-to-all through NeuronSwitch (any
    # device count is connected).
    ("trn3", 2): _neuron_profile("trn3", "trn3.48xlarge", 16, "Trainium3", 144, 2, None),
    ("trn3", 1): _neuron_profile("trn3", "trn3.48xlarge", 16, "Trainium3", 144, 1, None),
    ("trn1", None): _neuron_profile(
        "trn1", "trn1.32xlarge", 16, "Trainium1", 32, None, _TORUS_DEVICES
    ),
    # inf2.48xlarge: 12 Inferentia2 devices on a ring (any count is connected).
    ("inf2", None): _neuron_profile("inf2", "inf2.48xlarge", 12, "Inferentia2", 32, None, None),
}
"""Every Neuron profile sizing knows (the local cpu and cuda ones are read from the machine)."""

LNC_DEFAULT_BY_FAMILY: dict[str, int] = {
    "trn2": 2,
    "trn2u": 2,
    "trn2p": 2,
    "trn2eu": 2,
    "trn3": 2,
    "trn1": 1,
    "trn1n": 1,
    "inf2": 1,
}
"""The Logical NeuronCore size the Neuron runtime uses on an instance family when neither
NEURON_LOGICAL_NC_CONFIG nor the node's configuration sets it: 2 on Trainium2 and Trainium3;
Trainium1 and Inferentia2 have no LNC setting, i.e. 1 (docs/hardware.md). run.py, which runs
without this package, keeps a copy that tests/runner/test_trainium.py holds equal to this one."""

MAX_CORES = max(profile.cores_per_instance for profile in PROFILES.values())
"""The most cores one test can use on any profile (trn2 at LNC=1: 128)."""

LNC_CHOICES: dict[str, tuple[int, ...]] = {
    kind: tuple(sorted(other for family, other in PROFILES if family == kind and other))
    for kind, lnc in PROFILES
    if lnc is not None
}
"""The LNC settings an instance kind offers (trn2: 1 and 2); kinds without one are absent."""

DEFAULT_LNC = {kind: LNC_DEFAULT_BY_FAMILY[kind] for kind, lnc in PROFILES if lnc is not None}
"""The LNC sizing assumes for a profile with logical cores (trn2: 2) when a test sets none."""

TORCHNEURON_FAMILIES = ("trn2", "trn2u", "trn2p", "trn2eu", "trn3")
"""EC2 instance families TorchNeuron (``torch.compile(backend="neuron")``) runs on: it supports
Trainium2 and Trainium3 only (TorchNeuron release notes; docs/trainium.md, "Instances")."""
NEURON_FAMILIES_WITHOUT_TORCHNEURON = ("trn1", "trn1n", "inf1", "inf2")
"""Neuron instance families whose only PyTorch path is the XLA-based torch-neuronx (2.9 and
older), which run.py refuses: a test there could only fail, so it is not run."""


INSTANCE_DEVICES: dict[str, dict[str, int]] = {
    "trn2": {
        "trn2.3xlarge": 1,
        "trn2.48xlarge": 16,
        "trn2u.48xlarge": 16,
        "trn2p.48xlarge": 16,
        "trn2eu.48xlarge": 16,
    },
    "trn3": {"trn3.48xlarge": 16},
}
"""The EC2 instance types of each TorchNeuron profile and their Neuron devices: trn2.3xlarge has
one Trainium2 device, trn2.48xlarge sixteen; the Neuron driver names trn2u.48xlarge,
trn2p.48xlarge and trn2eu.48xlarge as Trainium2 servers of an UltraServer (docs/hardware.md).
A test that names no instance type is placed on any of its profile's types whose devices hold
it, and sized for what one instance holds."""


def instance_devices(instance_type: str) -> int | None:
    """How many Neuron devices ``instance_type`` has (None: not a type listed here)."""
    name = instance_type.strip().lower()
    return next((types[name] for types in INSTANCE_DEVICES.values() if name in types), None)


def instance_max_cores(instance_type: str, profile: HardwareProfile) -> int | None:
    """The cores of ``profile``'s kind one ``instance_type`` has (its devices times the
    profile's cores per device); None for a type not listed here."""
    devices = instance_devices(instance_type)
    return None if devices is None else devices * profile.cores_per_device


def instance_types_holding(kind: str, devices: int) -> list[str]:
    """The instance types of profile ``kind`` with at least ``devices`` devices, in the table's
    order (empty for a kind without a list)."""
    return [name for name, count in INSTANCE_DEVICES.get(kind, {}).items() if count >= devices]


def instance_family(instance: str) -> str:
    """The family of an EC2 instance type (``trn1.32xlarge`` -> ``trn1``); a profile kind
    (``trn2``, ``inf2``) is its own family."""
    return instance.strip().lower().split(".", 1)[0]


def torchneuron_refusal(instance: str) -> str | None:
    """Why a TorchNeuron test cannot run on ``instance`` (an instance type or profile kind), as
    a sentence; None when TorchNeuron supports it."""
    family = instance_family(instance)
    if family in TORCHNEURON_FAMILIES:
        return None
    if family in NEURON_FAMILIES_WITHOUT_TORCHNEURON:
        return (
            f"{instance} is a {family} instance, and TorchNeuron (the neuron backend, "
            "torch.compile(backend='neuron')) supports Trn2 and Trn3 only; its PyTorch path is "
            "the XLA-based torch-neuronx, which model-support does not test. Test it on trn2 "
            "(or trn3) instead."
        )
    return (
        f"{instance} is not a Trainium instance type ({', '.join(TORCHNEURON_FAMILIES)}), so "
        "the neuron backend has no NeuronCores there; pick a trn2 or trn3 instance type, or "
        "the cpu profile."
    )


def _host_memory_bytes() -> int:
    """Physical memory of this host (POSIX sysconf)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def local_profile(instance: Literal["cpu", "cuda"]) -> HardwareProfile:
    """The profile of this machine: its host memory (``cpu``) or its GPUs (``cuda``).

    Raises ValueError for ``cuda`` when torch sees no GPU: sizing for a GPU that is not there
    would be a guess.
    """
    if instance == "cpu":
        return HardwareProfile(
            name="cpu",
            instance="cpu",
            lnc=None,
            cores_per_device=1,
            cores_per_instance=1,
            bytes_per_core=_host_memory_bytes(),
            runtime_reserve_bytes=2 * GiB,  # Python, torch and the tokenizer live here too
            workspace_fraction=_WORKSPACE,
            description="this host's CPU and physical memory",
        )
    import torch  # only the cuda profile needs torch

    if not torch.cuda.is_available():
        raise ValueError(
            "the 'cuda' profile needs a visible GPU and torch sees none; "
            "size for 'cpu' or a Trainium profile instead"
        )
    count = torch.cuda.device_count()
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    return HardwareProfile(
        name="cuda",
        instance="cuda",
        lnc=None,
        cores_per_device=1,
        cores_per_instance=count,
        bytes_per_core=memory,
        runtime_reserve_bytes=1 * GiB,  # CUDA context and allocator slack
        workspace_fraction=_WORKSPACE,
        description=f"{count} local GPU(s), {memory / GiB:.1f} GiB each",
    )


def get_profile(instance: str = "trn2", lnc: int | None = None) -> HardwareProfile:
    """Look up a profile by instance kind and logical-core setting.

    ``lnc`` only applies to trn2 and trn3 (1 or 2; None means the default, 2). Raises
    ValueError with the accepted values for anything else.
    """
    if instance not in INSTANCE_KINDS:
        raise ValueError(
            f"unknown instance kind {instance!r}; choose one of {', '.join(INSTANCE_KINDS)}"
        )
    if instance in ("cpu", "cuda"):
        if lnc not in (None, 1):
            raise ValueError(
                f"--lnc applies only to trn2 and trn3; {instance!r} has no logical cores"
            )
        return local_profile(instance)  # type: ignore[arg-type]
    if instance in LNC_CHOICES:
        key_lnc = DEFAULT_LNC[instance] if lnc is None else lnc
        if key_lnc not in LNC_CHOICES[instance]:
            choices = " or ".join(f"LNC={value}" for value in LNC_CHOICES[instance])
            raise ValueError(f"{instance} supports {choices}, not {lnc}")
        return PROFILES[(instance, key_lnc)]
    if lnc not in (None, 1):
        raise ValueError(f"--lnc applies only to trn2 and trn3; {instance} cores are not grouped")
    return PROFILES[(instance, None)]
