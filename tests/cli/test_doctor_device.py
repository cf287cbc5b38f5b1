"""`model-support doctor` proves the device, not just the files: its device-side checks on CPU.

What the doctor reads from outside Python is stood in for where it reads it: ``neuron-ls`` and
``dpkg-query`` are executables on PATH printing what the real tools print (the neuron-ls user
guide's JSON), the driver's sysfs is a folder in its documented layout, and TorchNeuron is a
``torch_neuronx`` package on the smoke test's PYTHONPATH that fails the way the runtime does
(its message on the console). Sources: docs/trainium.md, "Node preflight".
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest
from hubserver import HubServer, Repo
from typer.testing import CliRunner

from model_support.cli import app
from model_support.doctor import run_preflight
from model_support.neuron_node import (
    device_facts_check,
    installed_runtime_version,
    read_device_facts,
    read_sysfs,
    runtime_driver_check,
)
from model_support.neuron_releases import DEFAULT_RELEASE
from model_support.runner import run as runner

# neuron-ls -j on a trn2 host at LNC 2 (the neuron-ls user guide's example, two devices shown):
# another process runs on device 0.
NEURON_LS = [
    {
        "neuron_device": 0,
        "bdf": "cc:00.0",
        "connected_to": [12, 3, 4, 1],
        "nc_count": 4,
        "logical_neuroncore_config": 2,
        "memory_size": 103079215104,
        "neuroncore_ids": [0, 1, 2, 3],
        "neuron_processes": [
            {
                "pid": 113985,
                "command": "neuron-bench exec --run-as-cc-neff --...",
                "neuron_runtime_version": "2.0.0",
            }
        ],
    },
    {
        "neuron_device": 1,
        "bdf": "b5:00.0",
        "connected_to": [13, 0, 5, 2],
        "nc_count": 4,
        "logical_neuroncore_config": 2,
        "memory_size": 103079215104,
        "neuroncore_ids": [4, 5, 6, 7],
        "neuron_processes": [],
    },
]


def _tool(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def neuron_ls(tmp_path: Path) -> Path:
    listing = tmp_path / "neuron-ls.json"
    listing.write_text(json.dumps(NEURON_LS, indent=4))
    return _tool(tmp_path / "bin", "neuron-ls", f'[ "$1" = --json-output ] && cat "{listing}"\n')


def test_neuron_ls_gives_the_devices_their_cores_lnc_and_processes(neuron_ls: Path) -> None:
    facts = read_device_facts(str(neuron_ls), sysfs_root="/nonexistent")
    assert facts.source == "neuron-ls"
    assert [(d.index, d.cores, d.core_ids, d.lnc) for d in facts.devices] == [
        (0, 4, [0, 1, 2, 3], 2),
        (1, 4, [4, 5, 6, 7], 2),
    ]
    assert facts.devices[0].processes[0].pid == 113985


def test_a_device_another_process_uses_fails_naming_the_process(neuron_ls: Path) -> None:
    facts = read_device_facts(str(neuron_ls), sysfs_root="/nonexistent")
    busy = device_facts_check(facts, [0, 1], own_pid=os.getpid())
    assert not busy.ok and "neuron0 by pid 113985 (neuron-bench exec" in busy.detail
    assert busy.fix and "stop that process" in busy.fix
    free = device_facts_check(facts, [4, 5, 6, 7], own_pid=os.getpid())
    assert free.ok and "neuron1: 4 cores (4-7), LNC 2" in free.detail


def test_cores_counted_at_another_lnc_than_the_nodes_are_caught(neuron_ls: Path) -> None:
    """A pod sized for LNC 1 given cores 8-11 on a node at LNC 2 (whose two devices here hold
    cores 0-7): no device holds them."""
    facts = read_device_facts(str(neuron_ls), sysfs_root="/nonexistent")
    check = device_facts_check(facts, [8, 9, 10, 11], own_pid=None)
    assert not check.ok and "cores 8-11 that no device here holds" in check.detail
    assert check.fix and "LNC" in check.fix


def test_without_neuron_ls_the_drivers_sysfs_describes_the_devices(tmp_path: Path) -> None:
    for index in (0, 1):
        device = tmp_path / f"neuron{index}"
        (device / "info" / "architecture").mkdir(parents=True)
        (device / "core_count").write_text("8\n")
        (device / "info" / "architecture" / "device_name").write_text("Trainium2\n")
        (device / "info" / "architecture" / "instance_type").write_text("Trn2\n")
    facts = read_device_facts(neuron_ls="", sysfs_root=str(tmp_path))
    assert (facts.source, facts.device_name, facts.instance_type) == ("sysfs", "Trainium2", "Trn2")
    assert [(d.index, d.cores) for d in facts.devices] == [(0, 8), (1, 8)]
    assert "neuron-ls is not installed" in (facts.problem or "")
    assert device_facts_check(facts, None).ok
    nothing = read_sysfs(str(tmp_path / "none"))
    assert not device_facts_check(nothing, None).applicable


def test_the_doctor_reports_the_device_facts_it_read(
    neuron_ls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{neuron_ls.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-1")
    with HubServer([Repo("org/open", files={"config.json": b"{}"})]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = CliRunner().invoke(app, ["doctor", "--json", "--smoke-timeout", "60"])
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["device_facts"]["source"] == "neuron-ls"
    assert [d["core_ids"] for d in report["device_facts"]["devices"]] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    assert checks["device facts"]["status"] == "FAILED"  # pid 113985 holds neuron0
    # The devices are there, so the smoke test runs: here TorchNeuron is missing.
    assert checks["smoke test"]["status"] == "FAILED" and checks["smoke test"]["fix"]
    assert result.exit_code == 1


# --------------------------------------------------------------------------- smoke test


def _torch_neuronx(tmp_path: Path, body: str) -> dict[str, str]:
    package = tmp_path / "site" / "torch_neuronx"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(body))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package.parent), env.get("PYTHONPATH")]))
    return env


def test_a_runtime_that_cannot_start_fails_the_smoke_test_with_its_own_words(
    tmp_path: Path,
) -> None:
    env = _torch_neuronx(
        tmp_path,
        """
        import os
        os.write(2, b"2021-Aug-11 19:18:21.0661 24616:24616 ERROR   NRT:nrt_init      "
                 b"This runtime requires Neuron Driver version 2.31 or greater. "
                 b"Please upgrade aws-neuron-dkms package.\\n")
        raise RuntimeError("nrt_init failed")
        """,
    )
    check = runner.smoke_check("neuron", timeout_s=120, env=env)
    assert not check.ok
    assert "This runtime requires Neuron Driver version 2.31 or greater" in check.detail
    assert "(infrastructure)" in check.detail
    assert check.fix and "aws-neuronx-dkms" in check.fix


def test_a_runtime_that_hangs_fails_the_smoke_test_within_its_timeout(tmp_path: Path) -> None:
    env = _torch_neuronx(tmp_path, "import time\ntime.sleep(600)\n")
    check = runner.smoke_check("neuron", timeout_s=3, env=env)
    assert not check.ok and "did not finish within 3 s" in check.detail
    assert check.fix and "neuron-ls" in check.fix


def test_a_device_that_runs_a_first_operation_passes_the_smoke_test() -> None:
    check = runner.smoke_check("cpu", timeout_s=120)
    assert check.ok and "sum(2 * ones(4)) = 8" in check.detail


def test_a_preflight_that_ends_without_its_report_fails_naming_what_it_wrote(
    tmp_path: Path,
) -> None:
    """run.py's preflight is a process of its own: one that dies (here an interpreter that
    cannot start) is a failed check quoting its last words, never a doctor that crashes."""
    python = _tool(tmp_path, "python3", 'echo "Illegal instruction (core dumped)" >&2\nexit 132\n')
    preflight = run_preflight("auto", 5, python=str(python))
    [check] = preflight.node
    assert (check.name, check.status) == ("node preflight", "FAILED")
    assert "ended (exit 132) without a report" in check.detail
    assert "Illegal instruction (core dumped)" in check.detail and check.fix
    assert not preflight.smoke.applicable


# --------------------------------------------------------------------------- version pairing


def test_the_hosts_driver_must_be_the_runtimes_releases_or_newer(tmp_path: Path) -> None:
    release = DEFAULT_RELEASE
    dpkg = _tool(
        tmp_path,
        "dpkg-query",
        f'[ "$3" = aws-neuronx-runtime-lib ] && printf "{release.runtime}-8d2c46a2f" || exit 1\n',
    )
    runtime = installed_runtime_version(str(dpkg))
    assert runtime == f"{release.runtime}-8d2c46a2f"
    old = runtime_driver_check(runtime, "2.24.7.0")
    assert not old.ok and f"ships driver {release.driver}" in old.detail
    assert old.fix and f"aws-neuronx-dkms to {release.driver} or newer" in old.fix
    assert runtime_driver_check(runtime, release.driver).ok
    assert runtime_driver_check(runtime, "2.40.1.0").ok
    assert not runtime_driver_check(runtime, None).ok  # no driver loaded at all
    assert not runtime_driver_check(None, None).applicable  # no runtime in this image


def test_torch_must_be_the_one_torch_neuronx_requires() -> None:
    versions = {
        "torch": "2.13.0+cpu",
        "torch-neuronx": "2.14.3.0.1234",
        "neuronx-cc": "2.28.7631.0",
    }
    wrong = runner.check_versions(versions, "2.31.7.0", "torch==2.14.*")
    assert (
        not wrong.ok and "requires torch==2.14.*, but torch 2.13.0+cpu is installed" in wrong.detail
    )
    assert wrong.fix and "torch==2.14.*" in wrong.fix
    right = runner.check_versions({**versions, "torch": "2.14.0+cpu"}, "2.31.7.0", "torch==2.14.*")
    assert right.ok


def test_fallback_execution_turned_on_in_the_environment_is_named() -> None:
    on = runner.check_fallback_setting({"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "0"})
    assert not on.ok and on.fix and "unset TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION" in on.fix
    assert runner.check_fallback_setting({}).ok


def test_the_cores_check_says_which_cores_a_sharded_run_takes() -> None:
    """Without NEURON_RT_VISIBLE_CORES a sharded run takes its own devices' cores (run.py's
    neuron_core_env), not cores 0..n-1: devices 4 and 5 at LNC 2 hold cores 16-23."""
    check = runner.check_cores_and_lnc({}, None, "trn2.48xlarge", [4, 5])
    assert check.ok and "a sharded run takes the cores of its devices (16-23)" in check.detail
