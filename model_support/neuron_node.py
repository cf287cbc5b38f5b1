"""What a Neuron node is and whether its devices run: the doctor's device-side checks.

* :func:`read_device_facts`: the node's devices as ``neuron-ls --json-output`` reports them
  (each device's cores, their ids, the LNC, memory and the processes using it), else as the
  driver's sysfs shows them (``/sys/devices/virtual/neuron_device/neuron<N>``: ``core_count``,
  ``info/architecture/{device_name,instance_type}``);
* :func:`smoke_check`: run.py's device smoke test (a tensor onto the device, one op,
  synchronize) in a process of its own, with a timeout, quoting the runtime's own console lines
  when it fails;
* :func:`runtime_driver_check`: the image's runtime library against the host's driver, by the
  releases table (:mod:`model_support.neuron_releases`).

Each check is a :class:`model_support.runner.run.PreflightCheck` with the fix for a failure.
Sources of every fact: docs/trainium.md ("Node preflight").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_support.neuron_releases import release_of_runtime, version_key

if TYPE_CHECKING:
    from model_support.runner.run import PreflightCheck

SYSFS_ROOT = "/sys/devices/virtual/neuron_device"
NEURON_LS_TIMEOUT_S = 10.0
SMOKE_TIMEOUT_S = 30.0
"""How long the smoke test may take: starting the runtime takes seconds; a runtime that hangs
must not keep the doctor past its minute."""
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"


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
    from model_support.runner.run import PreflightCheck, format_cores

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
    from model_support.runner.run import PreflightCheck

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


SMOKE_CODE = (
    "import sys\nfrom model_support.runner import run\nsys.exit(run.smoke_main(sys.argv[1]))"
)


def smoke_check(
    requested: str = "neuron",
    timeout_s: float = SMOKE_TIMEOUT_S,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
) -> PreflightCheck:
    """run.py's device smoke test (:func:`model_support.runner.run.smoke_main`) in a process
    of its own, given ``timeout_s``: the runtime may hang or abort the process."""
    from model_support.runner import run as runner

    name = "smoke test"
    try:
        done = subprocess.run(
            [python, "-c", SMOKE_CODE, requested],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        written = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        console = runner.runtime_lines(written.splitlines())
        return runner.PreflightCheck(
            name,
            False,
            f"a tensor onto the {requested} device, one op and a synchronize did not finish "
            f"within {timeout_s:.0f} s" + _quoted(console),
            fix=runner.fix_for("\n".join(console))
            or "the runtime hung at its first operation: see neuron-ls for processes holding "
            "the cores and dmesg for driver errors; reboot the instance if it recurs",
        )
    console = runner.runtime_lines(done.stderr.splitlines())
    report = next(
        (
            json.loads(line[len(runner.SMOKE_MARKER) :])
            for line in reversed(done.stdout.splitlines())
            if line.startswith(runner.SMOKE_MARKER)
        ),
        None,
    )
    if report is None:
        return runner.PreflightCheck(
            name,
            False,
            f"the smoke test's process ended (exit {done.returncode}) without a report"
            + _quoted(console or done.stderr.strip().splitlines()[-5:]),
            fix=runner.fix_for(done.stderr)
            or "the runtime killed the process: see the lines above, dmesg and neuron-ls",
        )
    if report.get("ok"):
        seconds = report.get("seconds")
        return runner.PreflightCheck(
            name,
            True,
            f"{report.get('device')} ({report.get('device_name') or 'name unknown'}): "
            f"sum(2 * ones(4)) = 8 in {seconds:.2f} s",
        )
    error = str(report.get("error") or "failed")
    return runner.PreflightCheck(
        name,
        False,
        f"{error} ({report.get('error_class')})" + _quoted(console),
        fix=runner.fix_for("\n".join([error, *console]))
        or report.get("fix")
        or "read the runtime's lines above; check the driver (lsmod | grep neuron), the devices "
        "given to this container (/dev/neuron*) and neuron-ls",
    )


def _quoted(lines: list[str]) -> str:
    return ("; the runtime wrote: " + " | ".join(lines)) if lines else ""
