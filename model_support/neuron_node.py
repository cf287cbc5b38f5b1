"""What a Neuron node is and whether its devices run: the doctor's device-side checks.

* :func:`instance_type` and :func:`effective_lnc`: the node's EC2 instance type and the Logical
  NeuronCore size its runtime uses, read as run.py reads them (run.py keeps its own copy: it
  runs without this package; tests/runner/test_trainium.py holds the two equal);
* :func:`read_device_facts`: the node's devices as ``neuron-ls --json-output`` reports them
  (each device's cores, their ids, the LNC, memory and the processes using it), else as the
  driver's sysfs shows them (``/sys/devices/virtual/neuron_device/neuron<N>``: ``core_count``,
  ``info/architecture/{device_name,instance_type}``);
* :func:`runtime_driver_check`: the image's runtime library against the host's driver, by the
  releases table (:mod:`model_support.neuron_releases`).

Each check is a :class:`PreflightCheck` with the fix for a failure, as run.py's own node checks
are (``model-support doctor`` reads those from run.py's output: :mod:`model_support.doctor`).
Sources of every fact: docs/trainium.md ("Node preflight").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from model_support.hardware import LNC_DEFAULT_BY_FAMILY
from model_support.neuron_releases import release_of_runtime, version_key

SYSFS_ROOT = "/sys/devices/virtual/neuron_device"
NEURON_LS_TIMEOUT_S = 10.0
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"
LNC_CONFIG_FILE = "/opt/aws/neuron/logical_nc_config"
"""A node's LNC, written by its launch template (EKS); run.py reads the same file."""
DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"
"""Where EC2 reports the instance type (e.g. ``trn2.48xlarge``) to the machine."""


@dataclass(frozen=True)
class PreflightCheck:
    """One preflight check: its name, whether the node passes it, what was found, and (for a
    failure) what to do. ``applicable`` False: the check has nothing to check here (no Neuron
    device on this machine), which is neither a pass nor a failure. run.py reports its own
    checks with these fields (its ``PreflightCheck``)."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    applicable: bool = True

    @property
    def status(self) -> str:
        """ok, FAILED or n/a."""
        if not self.applicable:
            return "n/a"
        return "ok" if self.ok else "FAILED"


class LncError(ValueError):
    """The node sets a Logical NeuronCore size the runtime does not support."""


def instance_type(environ: Mapping[str, str] | None = None) -> str | None:
    """The EC2 instance type where the environment (MODEL_SUPPORT_INSTANCE_TYPE, INSTANCE_TYPE)
    or DMI tells it; None elsewhere."""
    environ = os.environ if environ is None else environ
    for var in ("MODEL_SUPPORT_INSTANCE_TYPE", "INSTANCE_TYPE"):
        if environ.get(var):
            return environ[var]
    name = _read(Path(DMI_PRODUCT_NAME))
    return name if name and "." in name else None  # EC2 reports e.g. "trn2.48xlarge"


def effective_lnc(
    environ: Mapping[str, str], config_file_text: str | None, instance: str | None
) -> tuple[int | None, str | None]:
    """The Logical NeuronCore size the runtime uses, and where that figure came from.

    The runtime reads NEURON_LOGICAL_NC_CONFIG; on EKS a node's launch template writes it to
    /opt/aws/neuron/logical_nc_config; otherwise the instance's default applies (2 on Trn2 and
    Trn3; Trn1 and Inf2 have no LNC setting, i.e. 1). Only 1 and 2 are valid (LncError).
    """

    def checked(value: str, source: str) -> tuple[int, str]:
        if value.strip() not in ("1", "2"):
            raise LncError(
                f"{source} sets the logical NeuronCore size to {value.strip()!r}; only 1 and 2 "
                "are supported"
            )
        return int(value), source

    if (environ.get("NEURON_LOGICAL_NC_CONFIG") or "").strip():
        return checked(environ["NEURON_LOGICAL_NC_CONFIG"], "NEURON_LOGICAL_NC_CONFIG")
    for line in (config_file_text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "NEURON_LOGICAL_NC_CONFIG" and value.strip():
            return checked(value, LNC_CONFIG_FILE)
    family = (instance or "").split(".")[0]
    if family in LNC_DEFAULT_BY_FAMILY:
        return LNC_DEFAULT_BY_FAMILY[family], f"default for {family}"
    return None, None


def lnc_config_text() -> str | None:
    """The node's LNC file (:data:`LNC_CONFIG_FILE`), None where it is absent or unreadable."""
    with contextlib.suppress(OSError):
        return Path(LNC_CONFIG_FILE).read_text()
    return None


def format_cores(cores: list[int]) -> str:
    """Core indices as NEURON_RT_VISIBLE_CORES writes them: ``0-3,8-11``."""
    parts: list[str] = []
    for core in cores:
        if parts and "-" not in parts[-1] and int(parts[-1]) == core - 1:
            parts[-1] = f"{parts[-1]}-{core}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == core - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{core}"
        else:
            parts.append(str(core))
    return ",".join(parts) or "none"


@dataclass
class NeuronProcess:
    """A process using a device (neuron-ls's PID, COMMAND and RUNTIME VERSION)."""

    pid: int
    command: str
    runtime_version: str | None = None


@dataclass
class NeuronDevice:
    """One device as neuron-ls or sysfs shows it."""

    index: int
    cores: int | None = None
    core_ids: list[int] = field(default_factory=list)
    lnc: int | None = None
    memory_bytes: int | None = None
    processes: list[NeuronProcess] = field(default_factory=list)


@dataclass
class DeviceFacts:
    """What the node's devices are, and where that was read."""

    source: str  # "neuron-ls", "sysfs" or "none"
    instance_type: str | None = None
    device_name: str | None = None
    devices: list[NeuronDevice] = field(default_factory=list)
    problem: str | None = None  # why the preferred source could not be read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: object) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def parse_neuron_ls(text: str) -> DeviceFacts:
    """neuron-ls --json-output's answer: a list of devices (neuron-ls user guide: neuron_device,
    nc_count, neuroncore_ids, logical_neuroncore_config, memory_size, neuron_processes with pid,
    command and neuron_runtime_version); an object holding such a list is read too."""
    data = json.loads(text)
    instance = None
    if isinstance(data, dict):
        instance = data.get("instance_type") or data.get("instance-type")
        listed = next((v for v in data.values() if isinstance(v, list)), [])
    else:
        listed = data
    devices = []
    for entry in listed:
        if not isinstance(entry, dict) or _int(entry.get("neuron_device")) is None:
            continue
        processes = [
            NeuronProcess(
                pid=_int(p.get("pid")) or 0,
                command=str(p.get("command") or ""),
                runtime_version=p.get("neuron_runtime_version"),
            )
            for p in entry.get("neuron_processes") or []
            if isinstance(p, dict)
        ]
        devices.append(
            NeuronDevice(
                index=_int(entry["neuron_device"]) or 0,
                cores=_int(entry.get("nc_count")),
                core_ids=[i for i in map(_int, entry.get("neuroncore_ids") or []) if i is not None],
                lnc=_int(entry.get("logical_neuroncore_config")),
                memory_bytes=_int(entry.get("memory_size")),
                processes=processes,
            )
        )
    return DeviceFacts("neuron-ls", instance_type=instance, devices=devices)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def read_sysfs(root: str = SYSFS_ROOT) -> DeviceFacts:
    """The devices the driver publishes in sysfs (Neuron sysfs user guide): each one's
    ``core_count`` and its ``info/architecture`` (device name, instance type)."""
    base = Path(root)
    devices, names, instances = [], set(), set()
    for folder in sorted(base.glob("neuron[0-9]*"), key=lambda p: int(p.name[6:] or 0)):
        index = _int(folder.name[len("neuron") :])
        if index is None:
            continue
        devices.append(NeuronDevice(index=index, cores=_int(_read(folder / "core_count"))))
        architecture = folder / "info" / "architecture"
        names.add(_read(architecture / "device_name"))
        instances.add(_read(architecture / "instance_type"))
    if not devices:
        return DeviceFacts("none", problem=f"no device in {root}")
    return DeviceFacts(
        "sysfs",
        instance_type=next(iter(instances - {None}), None),
        device_name=next(iter(names - {None}), None),
        devices=devices,
    )


def read_device_facts(
    neuron_ls: str | None = None,
    sysfs_root: str = SYSFS_ROOT,
    timeout_s: float = NEURON_LS_TIMEOUT_S,
) -> DeviceFacts:
    """neuron-ls's JSON where the tool is installed and answers, else sysfs (with why)."""
    tool = neuron_ls if neuron_ls is not None else shutil.which("neuron-ls")
    problem = "neuron-ls is not installed (aws-neuronx-tools)"
    if tool:
        try:
            done = subprocess.run(
                [tool, "--json-output"], capture_output=True, text=True, timeout=timeout_s
            )
            if done.returncode == 0:
                facts = parse_neuron_ls(done.stdout)
                if facts.devices:
                    sysfs = read_sysfs(sysfs_root)
                    facts.device_name = facts.device_name or sysfs.device_name
                    facts.instance_type = facts.instance_type or sysfs.instance_type
                    return facts
                problem = "neuron-ls found no device"
            else:
                problem = f"neuron-ls exited {done.returncode}: {done.stderr.strip()[:300]}"
        except subprocess.TimeoutExpired:
            problem = f"neuron-ls did not answer within {timeout_s:.0f} s"
        except (OSError, ValueError) as exc:
            problem = f"neuron-ls could not be read: {exc}"
    facts = read_sysfs(sysfs_root)
    facts.problem = problem if facts.problem is None else f"{problem}; {facts.problem}"
    return facts


def device_facts_check(
    facts: DeviceFacts, visible_cores: list[int] | None, own_pid: int | None = None
) -> PreflightCheck:
    """The node's devices: which this run would use, that their cores are the ones
    NEURON_RT_VISIBLE_CORES names, and that no other process holds them."""
    name = "device facts"
    if not facts.devices:
        return PreflightCheck(
            name, True, f"no Neuron device to describe ({facts.problem})", applicable=False
        )
    summary = (
        f"{len(facts.devices)} device(s) by {facts.source}"
        + (f", {facts.device_name}" if facts.device_name else "")
        + (f", instance {facts.instance_type}" if facts.instance_type else "")
        + "; "
        + "; ".join(
            f"neuron{d.index}: {d.cores if d.cores is not None else '?'} cores"
            + (f" ({format_cores(d.core_ids)})" if d.core_ids else "")
            + (f", LNC {d.lnc}" if d.lnc else "")
            for d in facts.devices
        )
    )
    known_ids = {core for d in facts.devices for core in d.core_ids}
    if visible_cores and known_ids and not set(visible_cores) <= known_ids:
        stray = sorted(set(visible_cores) - known_ids)
        return PreflightCheck(
            name,
            False,
            f"NEURON_RT_VISIBLE_CORES names cores {format_cores(stray)} that no device here "
            f"holds ({summary})",
            fix="the cores were counted at another LNC than the node's: run at the node's LNC "
            "(NEURON_LOGICAL_NC_CONFIG, a test's spec.lnc, or the chart's runner.defaultLnc / "
            "runner.lncNodeLabel) or give the pod cores of its own devices",
        )
    mine = [
        d
        for d in facts.devices
        if not visible_cores or not d.core_ids or set(d.core_ids) & set(visible_cores)
    ]
    busy = [(d, p) for d in mine for p in d.processes if own_pid is None or p.pid != own_pid]
    if busy:
        held = "; ".join(f"neuron{d.index} by pid {p.pid} ({p.command})" for d, p in busy)
        return PreflightCheck(
            name,
            False,
            f"devices this run would use are in use: {held} ({summary})",
            fix="stop that process (a NeuronCore serves one process at a time), or give this "
            "run free cores with NEURON_RT_VISIBLE_CORES",
        )
    return PreflightCheck(name, True, summary)


def installed_runtime_version(dpkg_query: str | None = None) -> str | None:
    """The runtime library's package version in this image (dpkg's aws-neuronx-runtime-lib);
    None where dpkg or the package is absent."""
    tool = dpkg_query if dpkg_query is not None else shutil.which("dpkg-query")
    if not tool:
        return None
    try:
        done = subprocess.run(
            [tool, "-W", "-f=${Version}", RUNTIME_PACKAGE],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def runtime_driver_check(runtime: str | None, driver: str | None) -> PreflightCheck:
    """The host's driver is at least the one the image's runtime was released with: "newer
    versions of the Runtime might rely on the functionality that is only provided by a newer
    driver" (nrt-troubleshoot), failing at start with "This runtime requires Neuron Driver
    version ...". The pairs are docs/neuron-releases.md's."""
    name = "runtime and driver"
    if runtime is None:
        return PreflightCheck(
            name,
            True,
            f"no Neuron runtime library installed here ({RUNTIME_PACKAGE}); driver "
            f"{driver or 'not loaded'}",
            applicable=False,
        )
    release = release_of_runtime(runtime)
    if release is None:
        return PreflightCheck(
            name,
            True,
            f"runtime {runtime}, driver {driver or 'unknown'}: this runtime is not in "
            "docs/neuron-releases.md, so the driver it needs is not known here",
        )
    if driver is None:
        return PreflightCheck(
            name,
            False,
            f"runtime {runtime} (Neuron SDK {release.sdk}) but no Neuron driver is loaded "
            "(/sys/module/neuron/version)",
            fix=f"install aws-neuronx-dkms {release.driver} or newer on the host and load it",
        )
    if version_key(driver) < version_key(release.driver):
        return PreflightCheck(
            name,
            False,
            f"runtime {runtime} is Neuron SDK {release.sdk}'s, which ships driver "
            f"{release.driver}; the host's driver is {driver}",
            fix=f"upgrade the host's aws-neuronx-dkms to {release.driver} or newer (then reload "
            "it: rmmod neuron && modprobe neuron, with no process using a device), or run an "
            "image of an older Neuron SDK",
        )
    return PreflightCheck(
        name, True, f"runtime {runtime} (Neuron SDK {release.sdk}), driver {driver}"
    )
