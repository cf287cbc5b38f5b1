"""run.py's Trainium path, tested on CPU: no Neuron library can be installed here.

What is tested is our logic: which backend is chosen, which NeuronCore each worker gets, which
LNC is in effect, where peak memory is read from, how compilation is counted and how Neuron's
documented error messages are classified. Where TorchNeuron itself would be needed, a small fake
stands in for it the way the real one presents itself (a ``torch_neuronx`` module, the
``torch.neuron`` device module and a ``neuron`` torch.compile backend); the sources of every fact
and message are in docs/trainium.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import os
import re
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo.backends.registry as dynamo_registry
from hypothesis import given
from hypothesis import strategies as st

from model_support import hardware, neuron_node
from model_support.config import RunConfig
from model_support.records import Compilation, ResultDocument, Stack
from model_support.runner import run as runner

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- fakes


def _fake_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    return module


@pytest.fixture
def xla_era_torch_neuronx(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-neuronx 2.9 and earlier: imports, but registers no neuron device or compile backend."""
    monkeypatch.setitem(sys.modules, "torch_neuronx", _fake_module("torch_neuronx"))
    monkeypatch.delattr(torch, "neuron", raising=False)


class FakeNeuronDevice:
    """What ``torch.neuron`` offers (torch_neuronx's device module), recording calls."""

    def __init__(self, peak: int | None = 123, stats: dict | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        if peak is not None:
            self.max_memory_allocated = self._record("max_memory_allocated", peak)
        if stats is not None:
            self.memory_stats = self._record("memory_stats", stats)

    def _record(self, name: str, value: Any) -> Callable[..., Any]:
        def call(device: Any = None) -> Any:
            self.calls.append((name, device))
            return value

        return call

    def synchronize(self, device: Any = None) -> None:
        self.calls.append(("synchronize", device))


@pytest.fixture
def native_torch_neuronx(monkeypatch: pytest.MonkeyPatch) -> FakeNeuronDevice:
    """TorchNeuron: torch.neuron exists and "neuron" is a registered torch.compile backend."""
    device = FakeNeuronDevice()
    monkeypatch.setitem(sys.modules, "torch_neuronx", _fake_module("torch_neuronx"))
    monkeypatch.setattr(torch, "neuron", device, raising=False)

    def neuron_backend(gm: Any, example_inputs: Any) -> Any:
        return gm.forward

    neuron_backend._tags = ()  # type: ignore[attr-defined]
    monkeypatch.setitem(dynamo_registry._BACKENDS, "neuron", None)
    monkeypatch.setitem(dynamo_registry._COMPILER_FNS, "neuron", neuron_backend)
    return device


@pytest.fixture
def clean_neuron_env() -> Iterator[None]:
    """No Neuron runtime variables at the start; whatever run.py sets is undone afterwards."""
    keys = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_LOGICAL_NC_CONFIG")
    saved = {key: os.environ.pop(key, None) for key in keys}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# --------------------------------------------------------------------------- base image


def test_the_image_errors_name_the_runner_s_base() -> None:
    """run.py's errors name the base to build on; tests/test_neuron_releases.py holds it equal
    to the Dockerfile's and the releases table's."""
    problem = runner.native_neuron_problem(False, [], "2.9.0")
    assert problem is not None and runner.TORCHNEURON_BASE_IMAGE in problem


# --------------------------------------------------------------------------- backend selection


def test_native_backend_decision() -> None:
    assert runner.native_neuron_problem(True, ["inductor", "neuron"], "2.14.3.0") is None
    both = runner.native_neuron_problem(False, ["inductor"], "2.9.0.2.15.32035")
    assert both and "2.9.0.2.15.32035" in both
    assert 'torch.neuron device module or the "neuron" torch.compile backend' in both
    assert runner.TORCHNEURON_BASE_IMAGE in both and "PyTorch/XLA" in both
    no_backend = runner.native_neuron_problem(True, ["inductor"], "2.14.3.0")
    assert no_backend and '"neuron" torch.compile backend' in no_backend
    no_module = runner.native_neuron_problem(False, ["neuron"], None)
    assert no_module and "torch.neuron device module" in no_module


def test_without_torch_neuronx_auto_runs_on_cpu() -> None:
    assert runner.select_backend("auto").name == "cpu"  # this machine: no torch_neuronx, no CUDA


def test_an_xla_era_torch_neuronx_is_an_infrastructure_error(xla_era_torch_neuronx: None) -> None:
    with pytest.raises(runner.InfrastructureError, match="PyTorch/XLA") as raised:
        runner.select_backend("auto")
    assert runner.TORCHNEURON_BASE_IMAGE in str(raised.value)
    assert runner.classify("setup", raised.value) == "infrastructure"


def test_torchneuron_is_chosen(native_torch_neuronx: FakeNeuronDevice) -> None:
    assert runner.select_backend("auto").name == "neuron"
    assert runner.select_backend("neuron").name == "neuron"
    assert runner.select_backend("cpu").name == "cpu"  # a forced backend still wins


def test_a_torch_neuronx_that_fails_to_import_is_an_infrastructure_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "torch_neuronx"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('libnrt.so.1: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    with pytest.raises(runner.InfrastructureError, match=re.escape("libnrt.so.1")):
        runner.select_backend("auto")


def _config(**kwargs: Any) -> dict:
    return RunConfig(model="org/model", **kwargs).model_dump(mode="json")


def test_an_xla_era_run_records_the_error_and_the_image(
    xla_era_torch_neuronx: None, clean_neuron_env: None
) -> None:
    doc = runner.execute(runner.RunContext(_config()))
    assert os.environ["NEURON_RT_NUM_CORES"] == "1"  # narrowed to one core before the import
    assert (doc["result"], doc["error_class"], doc["stage"]) == ("ERROR", "infrastructure", "setup")
    assert runner.TORCHNEURON_BASE_IMAGE in doc["error"]
    ResultDocument.model_validate(doc)  # the record stays valid


def test_too_few_cores_fail_a_sharded_worker_before_the_runtime_starts(
    native_torch_neuronx: FakeNeuronDevice,
    clean_neuron_env: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "8-9")
    ctx = runner.RunContext(_config(cores=4, parallelism="tensor"), rank=0, world_size=4)
    doc = runner.execute(ctx)
    assert (doc["error_class"], doc["stage"]) == ("infrastructure", "setup")
    assert "4 workers need 4 NeuronCores" in doc["error"] and "'8-9'" in doc["error"]
    assert doc["backend"] is None  # failed before choosing the backend: nothing was started


# --------------------------------------------------------------------------- one core per worker


def test_visible_cores_forms() -> None:
    assert runner.parse_visible_cores("3") == [3]
    assert runner.parse_visible_cores("0-3") == [0, 1, 2, 3]
    assert runner.parse_visible_cores("3,4,5") == [3, 4, 5]
    assert runner.parse_visible_cores("3-5,6") == [3, 4, 5, 6]
    assert runner.parse_visible_cores(" 8 - 9 , 12 ") == [8, 9, 12]


@pytest.mark.parametrize("spec", ["", "a", "0-", "-3", "5-3", "1,,2", "0-3,2", "1.5"])
def test_malformed_visible_cores_are_refused_clearly(spec: str) -> None:
    with pytest.raises(runner.InfrastructureError, match="NEURON_RT_VISIBLE_CORES"):
        runner.parse_visible_cores(spec)


@st.composite
def _core_ranges(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A NEURON_RT_VISIBLE_CORES value of ascending, disjoint ranges and single cores."""
    cores: list[int] = []
    parts: list[str] = []
    start = draw(st.integers(0, 8))
    for _ in range(draw(st.integers(1, 5))):
        length = draw(st.integers(1, 6))
        parts.append(str(start) if length == 1 else f"{start}-{start + length - 1}")
        cores.extend(range(start, start + length))
        start += length + draw(st.integers(0, 3))
    return ",".join(parts), cores


@given(_core_ranges())
def test_parsing_expands_every_range(case: tuple[str, list[int]]) -> None:
    spec, cores = case
    assert runner.parse_visible_cores(spec) == cores


@given(_core_ranges(), st.data())
def test_each_rank_gets_its_own_visible_core(
    case: tuple[str, list[int]], data: st.DataObject
) -> None:
    spec, cores = case
    world_size = data.draw(st.integers(1, len(cores)))
    envs = [
        runner.neuron_core_env(
            {"NEURON_RT_VISIBLE_CORES": spec, "NEURON_RT_NUM_CORES": "64"}, r, world_size
        )
        for r in range(world_size)
    ]
    assigned = [env["NEURON_RT_VISIBLE_CORES"] for env in envs]
    assert assigned == [str(core) for core in cores[:world_size]]  # rank r: the r-th core
    assert all(env["NEURON_RT_NUM_CORES"] is None for env in envs)  # a stale count is unset


@given(_core_ranges(), st.integers(1, 3))
def test_fewer_visible_cores_than_ranks_fail_clearly(
    case: tuple[str, list[int]], extra: int
) -> None:
    spec, cores = case
    world_size = len(cores) + extra
    with pytest.raises(runner.InfrastructureError, match=f"need {world_size} NeuronCores"):
        runner.neuron_core_env({"NEURON_RT_VISIBLE_CORES": spec}, 0, world_size)


def test_a_bare_host_defaults_to_one_free_core_or_the_first_cores() -> None:
    assert runner.neuron_core_env({}, 0, 1) == {"NEURON_RT_NUM_CORES": "1"}
    assert runner.neuron_core_env({"NEURON_RT_NUM_CORES": "8"}, 0, 1) == {
        "NEURON_RT_NUM_CORES": "1"
    }
    # A whole trn2.48xlarge at LNC=2: its 16 devices, 4 logical cores each; the first four.
    host = runner.NeuronDevices(tuple(range(16)), 4, "trn2.48xlarge")
    assigned = [runner.neuron_core_env({}, r, 4, host)["NEURON_RT_VISIBLE_CORES"] for r in range(4)]
    assert assigned == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("indices", "instance", "lnc", "world_size", "expected"),
    [
        # A DRA claim of devices 4..7 on a trn2.48xlarge at LNC=2: cores 16..31, not 0..n-1.
        ((4, 5, 6, 7), "trn2.48xlarge", 2, 16, list(range(16, 32))),
        ((4, 5, 6, 7), "trn2.48xlarge", 2, 8, list(range(16, 24))),
        # The same devices at LNC=1: eight physical cores each.
        ((4, 5, 6, 7), "trn2.48xlarge", 1, 4, [32, 33, 34, 35]),
        # One trn3 device (Trainium3: eight NeuronCore-v4), LNC=2.
        ((9,), "trn3.48xlarge", 2, 2, [36, 37]),
        # Devices need not be contiguous.
        ((2, 12), "trn2.48xlarge", 2, 8, [8, 9, 10, 11, 48, 49, 50, 51]),
    ],
)
def test_without_visible_cores_a_sharded_run_takes_the_cores_of_its_own_devices(
    indices: tuple[int, ...], instance: str, lnc: int, world_size: int, expected: list[int]
) -> None:
    devices = runner.NeuronDevices(
        indices, runner.PHYSICAL_CORES_PER_DEVICE["trn2"] // lnc, instance
    )
    assigned = [
        runner.neuron_core_env({}, rank, world_size, devices)["NEURON_RT_VISIBLE_CORES"]
        for rank in range(world_size)
    ]
    assert assigned == [str(core) for core in expected]


def test_neuron_devices_reads_the_device_files_and_the_cores_per_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("neuron7", "neuron4", "neuron_monitor", "neuronx", "null"):
        (tmp_path / name).touch()
    monkeypatch.setattr(runner, "NEURON_DEVICE_DIR", str(tmp_path))
    assert runner.neuron_devices(2, "trn2.48xlarge") == runner.NeuronDevices(
        (4, 7), 4, "trn2.48xlarge"
    )
    assert runner.neuron_devices(1, "trn3.48xlarge").cores_per_device == 8
    assert runner.neuron_devices(1, "trn1.32xlarge").cores_per_device == 2
    assert runner.neuron_devices(2, None).cores_per_device is None
    assert runner.neuron_devices(None, "trn2.48xlarge").cores_per_device is None


@pytest.mark.parametrize(
    ("devices", "why"),
    [
        (None, "no /dev/neuron\\* is present"),
        (runner.NeuronDevices((), 4, "trn2.48xlarge"), "no /dev/neuron\\* is present"),
        (runner.NeuronDevices((0, 1), None, "m7i.large"), "cores per device are unknown.*m7i"),
        (runner.NeuronDevices((3,), 4, "trn2.48xlarge"), r"\(neuron3; 4 cores each\) makes only 4"),
    ],
)
def test_cores_that_cannot_be_known_stop_the_run_as_infrastructure(
    devices: object, why: str
) -> None:
    with pytest.raises(runner.InfrastructureError, match=why):
        runner.neuron_core_env({}, 0, 8, devices)  # type: ignore[arg-type]
    # A single-core run needs no such knowledge: the runtime picks a free core of its devices.
    assert runner.neuron_core_env({}, 0, 1, devices) == {"NEURON_RT_NUM_CORES": "1"}  # type: ignore[arg-type]


def test_a_single_core_pod_keeps_its_allocated_core() -> None:
    assert runner.neuron_core_env({"NEURON_RT_VISIBLE_CORES": "37"}, 0, 1) == {
        "NEURON_RT_VISIBLE_CORES": "37",
        "NEURON_RT_NUM_CORES": None,
    }


def test_apply_env_sets_and_unsets(monkeypatch: pytest.MonkeyPatch, clean_neuron_env: None) -> None:
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "4")
    runner.apply_env({"NEURON_RT_VISIBLE_CORES": "5", "NEURON_RT_NUM_CORES": None})
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "5" and "NEURON_RT_NUM_CORES" not in os.environ


# --------------------------------------------------------------------------- LNC


@pytest.mark.parametrize(
    ("environ", "config_file", "instance", "expected"),
    [
        (
            {"NEURON_LOGICAL_NC_CONFIG": "1"},
            "NEURON_LOGICAL_NC_CONFIG=2",
            "trn2.48xlarge",
            (1, "NEURON_LOGICAL_NC_CONFIG"),
        ),
        ({}, "NEURON_LOGICAL_NC_CONFIG=1\n", "trn2.48xlarge", (1, runner.LNC_CONFIG_FILE)),
        ({}, None, "trn2.48xlarge", (2, "default for trn2")),
        # the UltraServer member (Trn2 architecture page): Trainium2 too, so LNC 2 by default
        ({}, None, "trn2u.48xlarge", (2, "default for trn2u")),
        ({}, None, "trn1.32xlarge", (1, "default for trn1")),
        ({}, None, None, (None, None)),
        ({"NEURON_LOGICAL_NC_CONFIG": " "}, "", "inf2.xlarge", (1, "default for inf2")),
    ],
)
def test_effective_lnc(
    environ: dict, config_file: str | None, instance: str | None, expected: tuple
) -> None:
    assert runner.effective_lnc(environ, config_file, instance) == expected
    # The package reads the LNC as run.py does (the compile cache keys NEFFs by it before
    # run.py starts); run.py keeps its own copy of the rule, as it runs without the package.
    assert neuron_node.effective_lnc(environ, config_file, instance) == expected


def test_a_neuron_run_records_the_compiler_flags_its_float32_policy_came_from(
    monkeypatch: pytest.MonkeyPatch, clean_neuron_env: None
) -> None:
    """The row holds NEURON_CC_FLAGS beside the LNC: a float32 run judged against TF32 says why."""
    flags = "--auto-cast=matmult --auto-cast-type=tf32"
    monkeypatch.setenv("NEURON_CC_FLAGS", f"  {flags} ")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    settings = runner.BACKENDS["neuron"].runtime_settings()
    assert settings == {"lnc": 1, "lnc_source": "NEURON_LOGICAL_NC_CONFIG", "compiler_flags": flags}
    policy = {"float32_precision": "auto"}
    assert runner.float32_precision(policy, "neuron", settings["compiler_flags"]) == "tf32"
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert runner.BACKENDS["neuron"].runtime_settings()["compiler_flags"] is None
    assert "compiler_flags" not in runner.BACKENDS["cpu"].runtime_settings()


def test_run_py_assumes_the_lnc_defaults_sizing_assumes() -> None:
    """run.py keeps its own copy of the runtime's LNC defaults (it runs without the package): a
    copy that differed would size a test for one LNC and run it at another."""
    assert runner.LNC_DEFAULT_BY_FAMILY == hardware.LNC_DEFAULT_BY_FAMILY
    assert runner.PHYSICAL_CORES_PER_DEVICE == hardware.PHYSICAL_CORES_PER_DEVICE
    for family, lnc in hardware.LNC_DEFAULT_BY_FAMILY.items():
        found = runner.effective_lnc({}, None, f"{family}.48xlarge")
        assert found == (lnc, f"default for {family}")
    assert hardware.get_profile("trn2").lnc == hardware.LNC_DEFAULT_BY_FAMILY["trn2"]


def test_an_unsupported_lnc_is_an_infrastructure_error() -> None:
    with pytest.raises(runner.InfrastructureError, match="only 1 and 2"):
        runner.effective_lnc({"NEURON_LOGICAL_NC_CONFIG": "4"}, None, "trn2.48xlarge")
    with pytest.raises(neuron_node.LncError, match="only 1 and 2"):
        neuron_node.effective_lnc({}, "NEURON_LOGICAL_NC_CONFIG=4\n", "trn2.48xlarge")


@given(st.lists(st.integers(0, 127), unique=True, min_size=1).map(sorted))
def test_the_package_formats_core_lists_as_run_py_does(cores: list[int]) -> None:
    """The doctor's device facts name cores as run.py's checks do (run.py keeps its own copy),
    as NEURON_RT_VISIBLE_CORES reads them."""
    text = neuron_node.format_cores(cores)
    assert text == runner.format_cores(cores)
    assert runner.parse_visible_cores(text) == cores
    assert neuron_node.format_cores([]) == runner.format_cores([]) == "none"


# --------------------------------------------------------------------------- memory


def test_memory_stats_peaks_nested_and_flat() -> None:
    nested = {"allocated_bytes": {"current": 10, "peak": 90}, "num_ooms": 0}
    assert runner.peak_from_stats(nested) == 90  # TorchNeuron's memory_stats()
    assert runner.peak_from_stats({"allocated_bytes": {"all": {"peak": 70}}}) == 70
    assert runner.peak_from_stats({"allocated_bytes.all.peak": 50}) == 50  # torch.accelerator
    assert runner.peak_from_stats({}) is None
    assert runner.peak_from_stats({"reserved_bytes": {"peak": 3}}) is None


def test_peak_memory_sources_in_order() -> None:
    accelerator = types.SimpleNamespace(
        max_memory_allocated=lambda index: 200,
        memory_stats=lambda index: {"allocated_bytes.all.peak": 400},
    )
    neuron = FakeNeuronDevice(peak=100, stats={"allocated_bytes": {"peak": 300}})

    def first(neuron_module: Any, accelerator_memory: Any) -> tuple[int | None, str | None]:
        return runner.first_peak(runner.neuron_peak_sources(neuron_module, accelerator_memory, 3))

    assert first(neuron, accelerator) == (100, "torch.neuron.max_memory_allocated")
    assert neuron.calls == [("max_memory_allocated", 3)]  # this rank's device, and nothing else
    assert first(
        FakeNeuronDevice(peak=None, stats={"allocated_bytes": {"peak": 300}}), accelerator
    ) == (
        200,
        "torch.accelerator.memory.max_memory_allocated",
    )
    nested_only = FakeNeuronDevice(peak=None, stats={"allocated_bytes": {"peak": 300}})
    assert first(nested_only, None) == (
        300,
        'torch.neuron.memory_stats()["allocated_bytes"]["peak"]',
    )
    flat_only = types.SimpleNamespace(memory_stats=lambda index: {"allocated_bytes.all.peak": 400})
    assert first(None, flat_only) == (
        400,
        'torch.accelerator.memory.memory_stats()["allocated_bytes.all.peak"]',
    )
    assert first(None, None) == (None, None)


def test_an_unreadable_stat_falls_through_to_the_next_source() -> None:
    empty_stats = FakeNeuronDevice(peak=None, stats={})
    accelerator = types.SimpleNamespace(memory_stats=lambda index: {"allocated_bytes.all.peak": 5})
    assert runner.first_peak(runner.neuron_peak_sources(empty_stats, accelerator, None)) == (
        5,
        'torch.accelerator.memory.memory_stats()["allocated_bytes.all.peak"]',
    )


def test_neuron_peak_is_read_after_synchronizing(native_torch_neuronx: FakeNeuronDevice) -> None:
    peak, source = runner.BACKENDS["neuron"].peak_memory(torch.device("cpu", 2))
    assert (peak, source) == (123, "torch.neuron.max_memory_allocated")
    # The Neuron allocator is asynchronous: synchronize before any reading.
    assert [name for name, _ in native_torch_neuronx.calls] == [
        "synchronize",
        "max_memory_allocated",
    ]
    assert native_torch_neuronx.calls[1] == ("max_memory_allocated", 2)


def test_the_device_name_comes_from_get_device_properties(
    native_torch_neuronx: FakeNeuronDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def properties(device: Any = None) -> types.SimpleNamespace:
        seen.append(device)
        return types.SimpleNamespace(name="Trainium2", total_memory=24 * 2**30)

    monkeypatch.setattr(native_torch_neuronx, "get_device_properties", properties, raising=False)
    assert runner.BACKENDS["neuron"].device_name("neuron:1") == "Trainium2" and seen == ["neuron:1"]
    assert runner.BACKENDS["cpu"].device_name(None)  # the processor elsewhere


# --------------------------------------------------------------------------- compilation


def _counts(**kwargs: Any) -> Any:
    values = dict(
        graphs=0,
        graph_breaks=0,
        fx_cache_hits=0,
        fx_cache_misses=0,
        neuron_graphs=None,
        neff_entries=None,
    )
    values.update(kwargs)
    return runner.CompileCounts(**values)


def test_a_cold_inductor_compile() -> None:
    earlier = {"Unsupported: print": 1}  # a break of an earlier call: not this run's
    summary = runner.compilation_summary(
        _counts(graphs=5, graph_breaks=1, graph_break_reasons=earlier),
        _counts(
            graphs=7,
            graph_breaks=2,
            fx_cache_misses=2,
            graph_break_reasons={**earlier, "Unsupported:  data-dependent\n branch": 1},
        ),
    )
    assert summary == {
        "graphs": 2,
        "graph_breaks": 1,
        "cache_hits": 0,
        "cache_misses": 2,
        "cache_hit": False,
        "cache": "inductor-fx-graph",
        "source": "torch._dynamo.utils.counters",
        "cache_per_graph": False,  # no ledger given: process-wide counters
        "cache_entries_outside_graphs": None,
        "timed_call_graphs": None,
        "recompiles": None,
        "recompile_reasons": [],
        "graph_break_reasons": ["Unsupported: data-dependent branch"],  # this run's, one line
        "whole_graph": None,
        "fallback_execution": None,
        "fallback_ops": [],
        "compiler_args": [],
    }


def test_a_warm_inductor_compile_is_a_cache_hit() -> None:
    summary = runner.compilation_summary(_counts(), _counts(graphs=2, fx_cache_hits=2))
    assert (summary["cache_hit"], summary["cache_hits"], summary["cache_misses"]) == (True, 2, 0)


def test_a_backend_without_a_cache_records_no_cache_verdict() -> None:
    summary = runner.compilation_summary(_counts(), _counts(graphs=2))  # e.g. aot_eager
    assert summary["graphs"] == 2 and summary["cache_hit"] is None and summary["cache"] is None


def test_neuron_counts_graphs_by_torchneuron_and_misses_by_new_neffs() -> None:
    before = _counts(graphs=1, neuron_graphs=4, neff_entries=10)
    cold = runner.compilation_summary(before, _counts(graphs=3, neuron_graphs=6, neff_entries=12))
    assert (cold["graphs"], cold["cache_misses"], cold["cache_hits"], cold["cache_hit"]) == (
        2,
        2,
        0,
        False,
    )
    assert (cold["source"], cold["cache"]) == ("torch.neuron.get_dynamo_metrics", "neff")
    warm = runner.compilation_summary(before, _counts(graphs=3, neuron_graphs=6, neff_entries=10))
    assert (warm["cache_hits"], warm["cache_misses"], warm["cache_hit"]) == (2, 0, True)


def test_neff_cache_entries_count_only_complete_files(tmp_path: Path) -> None:
    key = "0123456789abcdef0123456789abcdef"
    shard = tmp_path / key[:2] / key[2:4]
    shard.mkdir(parents=True)
    (shard / f"{key}.neff").write_bytes(b"neff")
    (shard / f"{key[::-1]}.neff").write_bytes(b"")  # zero size reads as a miss
    (shard / ".tmp.AbC123").write_bytes(b"half")  # a write under way
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{key}.lock").write_bytes(b"")
    assert runner.count_neff_entries(str(tmp_path)) == 1
    assert runner.neff_cache_dir({}) == "/tmp/neff_cache"
    assert (
        runner.neff_cache_dir({"TORCH_NEURONX_NEFF_CACHE_DIR": "/var/cache/neff"})
        == "/var/cache/neff"
    )
    assert runner.neff_cache_dir({"TORCH_NEURONX_NEFF_DISABLE_CACHE": "1"}) is None


def test_dynamo_counts_a_graph_break_and_the_shapes(tmp_path: Path) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x)
        torch._dynamo.graph_break()
        return torch.cos(y)

    before = runner.read_compile_counts(runner.BACKENDS["cpu"])
    compiled = torch.compile(forward, backend="aot_eager", dynamic=False)
    compiled(torch.ones(3))
    compiled(torch.ones(5))  # a new shape: static shapes compile again
    summary = runner.compilation_summary(before, runner.read_compile_counts(runner.BACKENDS["cpu"]))
    assert summary["graphs"] == 4 and summary["graph_breaks"] >= 1
    assert summary["cache_hit"] is None  # aot_eager consults no cache


def _neff_writing_compiler(cache: Path) -> Callable[..., Any]:
    """A stand-in for TorchNeuron's compile on CPU: each graph's NEFF is looked up in the
    persistent cache (<k[0:2]>/<k[2:4]>/<k>.neff, keyed by the graph) and written only when
    absent, at the graph's first call, as a backend that compiles lazily would."""

    def compile_graph(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        key = hashlib.sha256(graph_module.code.encode()).hexdigest()[:32]
        neff = cache / key[:2] / key[2:4] / f"{key}.neff"

        def call(*args: Any) -> Any:
            if not neff.exists():
                neff.parent.mkdir(parents=True, exist_ok=True)
                neff.write_bytes(b"a compiled graph")
            return graph_module(*args)

        return call

    return compile_graph


def _eager_op_caching(cache: Path) -> None:
    """What TorchNeuron does for an eager op inside generate(): a new NEFF cache entry."""
    key = uuid.uuid4().hex
    (cache / key[:2] / key[2:4]).mkdir(parents=True, exist_ok=True)
    (cache / key[:2] / key[2:4] / f"{key}.neff").write_bytes(b"an eager op")


def test_neff_misses_are_counted_per_compiled_graph_not_per_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager ops write NEFF entries too: counting new files would call a warm run cold. Per
    compiled graph, a cold run misses every graph and a warm one hits every graph; the eager
    entries are counted apart."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    neuron = runner.BACKENDS["neuron"]

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) * 2
        _eager_op_caching(tmp_path)  # not traceable: a graph break, run eagerly
        return torch.cos(y) + 1

    def run_once() -> dict[str, Any]:
        torch._dynamo.reset()
        ledger = runner.GraphLedger(neuron.cache_probe)
        before = _counts(neff_entries=runner.count_neff_entries(str(tmp_path)))
        compiled = torch.compile(
            forward, backend=ledger.wrap(_neff_writing_compiler(tmp_path)), dynamic=False
        )
        compiled(torch.ones(4))
        after = _counts(
            graphs=len(ledger.graphs), neff_entries=runner.count_neff_entries(str(tmp_path))
        )
        # Counted the old way (new files), the eager op's entry would be a miss.
        assert runner.compilation_summary(before, after)["cache_misses"] == (
            after.neff_entries - before.neff_entries
        )
        return runner.compilation_summary(before, after, ledger.graphs)

    cold = run_once()
    assert (cold["graphs"], cold["cache_misses"], cold["cache_hits"]) == (2, 2, 0)
    assert (cold["cache_per_graph"], cold["cache_entries_outside_graphs"]) == (True, 1)
    assert cold["cache_hit"] is False and cold["cache"] == "neff"
    warm = run_once()
    assert (warm["cache_misses"], warm["cache_hits"], warm["cache_hit"]) == (0, 2, True)
    assert warm["cache_entries_outside_graphs"] == 1  # the eager op wrote again: not a miss


def test_inductor_hits_and_misses_are_counted_per_compiled_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cpu = runner.BACKENDS["cpu"]

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 3

    outcomes = []
    for _ in range(2):  # a fresh process's view: dynamo forgets, the FX graph cache does not
        torch._dynamo.reset()
        ledger = runner.GraphLedger(cpu.cache_probe)
        torch.compile(forward, backend=ledger.wrap("inductor"), dynamic=False)(torch.ones(8))
        outcomes.append([g.outcome for g in ledger.graphs])
    assert outcomes == [["miss"], ["hit"]]


def test_the_ledger_counts_graphs_compiled_by_a_later_call() -> None:
    """The recompile check: a second call with the same shapes compiles nothing; a new shape
    (static shapes) compiles again, and the ledger sees it on any backend."""
    torch._dynamo.reset()
    ledger = runner.GraphLedger(runner.BACKENDS["cpu"].cache_probe)
    compiled = torch.compile(lambda x: x * 2 + 1, backend=ledger.wrap("aot_eager"), dynamic=False)
    compiled(torch.ones(3))
    first = len(ledger.graphs)
    compiled(torch.ones(3))
    assert first == 1 and len(ledger.graphs) == first  # the second call did not recompile
    compiled(torch.ones(5))
    assert len(ledger.graphs) == 2
    assert [g.outcome for g in ledger.graphs] == [None, None]  # aot_eager consults no cache


def test_the_document_declares_every_new_field() -> None:
    assert set(runner.compilation_summary(_counts(), _counts())) == set(Compilation.model_fields)
    assert set(runner.collect_stack(runner.BACKENDS["cpu"])) <= set(Stack.model_fields)
    assert (
        "compilation" in runner.new_document(_config())
        and "compilation" in ResultDocument.model_fields
    )


# --------------------------------------------------------------------------- error classes


NEURON_MESSAGES = [
    # Neuron Runtime OOM report (neuron-runtime/explore/device-memory.rst)
    (
        "generate",
        "RuntimeError: Failed to allocate 4.000GB (alignment: none, usage: tensors) on ND 0:NC 4",
        "out-of-memory",
    ),
    # Neuron Runtime, insufficient memory at model load (neuron-runtime/nrt-troubleshoot.rst)
    (
        "compile",
        "kernel: [12345] neuron:mc_alloc: device mempool [0:0] total 1073741568 occupied 960539030 needed 1272 available 768",
        "out-of-memory",
    ),
    # neuronx-cc NCC_EOOM001 / NCC_EOOM002 (compiler/error-codes)
    (
        "compile",
        "NCC_EOOM001: The combined memory needed for the model's activation tensors exceeds the high-bandwidth memory limit.",
        "out-of-memory",
    ),
    (
        "compile",
        "[NCC_EOOM002] The combined memory needed for the model tensors exceeds the high-bandwidth memory limit.",
        "out-of-memory",
    ),
    # neuronx-cc XCG815 (compile log published with a Neuron cache entry)
    (
        "compile",
        "[XCG815] Estimated peak HBM usage (17.282846) exceeds 16GB. Neff won't be able to load on chip",
        "out-of-memory",
    ),
    # neuronx-cc errors that are the model's (compiler/error-codes)
    ("compile", "NCC_EUOC002: An unsupported operator was used.", "compile"),
    (
        "compile",
        "NCC_EMOD025: Dynamic shape is not supported. The Neuron compiler requires all tensor dimensions to be statically sized.",
        "compile",
    ),
    (
        "generate",
        "NCC_EVRF004: Complex data types are not supported on the Neuron device.",
        "compile",
    ),
    (
        "compile",
        "Failed compilation with ['neuronx-cc', 'compile', '--target=trn2', '--framework=XLA']",
        "compile",
    ),
    # neuronx-cc NCC_EARG001: LNC not supported by the target, the node's configuration
    (
        "compile",
        "NCC_EARG001: Unsupported Logical Neuron Core (LNC) configuration.",
        "infrastructure",
    ),
    # Neuron Runtime: cores held by another process (neuron-runtime/nrt-troubleshoot.rst)
    (
        "setup",
        "NRT:nrt_allocate_neuron_cores NeuronCore(s) not available - Requested:nc1-nc1 Available:0",
        "infrastructure",
    ),
    # Neuron Runtime hardware errors (neuron-runtime/nrt-troubleshoot.rst)
    (
        "generate",
        "(FATAL-RT-UNDEFINED-STATE) [ND 0][NC 0] Uncorrectable memory error is detected, metadata: 0x16.",
        "infrastructure",
    ),
    (
        "generate",
        "(FATAL-RT-UNDEFINED-STATE) Uncorrectable HBM memory error is detected. Execution results may be invalid.",
        "infrastructure",
    ),
    ("generate", "[MLA 0][NC 0] DMA TX engine 0 is in an abort state", "infrastructure"),
    # Neuron Runtime status codes (neuron-runtime/api/nrt_status.rst, nrt_status.h): the
    # framework surfaces the status name or its description
    ("generate", "RuntimeError: nrt_execute failed with NRT_EXEC_NC_BUSY (1005)", "infrastructure"),
    (
        "generate",
        "RuntimeError: the neuron core is locked (in use) by another model/process",
        "infrastructure",
    ),
    ("compile", "RuntimeError: nrt_load failed: NRT_LOAD_NOT_ENOUGH_NC", "infrastructure"),
    (
        "compile",
        "RuntimeError: Failed to allocate enough NCs for loading a NEFF",
        "infrastructure",
    ),
    ("generate", "RuntimeError: execution failed: NRT_EXEC_HW_ERR_HBM_UE (1201)", "infrastructure"),
    (
        "generate",
        "RuntimeError: execution failed: NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE (1205)",
        "infrastructure",
    ),
    ("generate", "RuntimeError: execution failed: NRT_EXEC_HW_ERR_DMA_ABORT", "infrastructure"),
    (
        "generate",
        "RuntimeError: A DMA engine encountered an unrecoverable error.",
        "infrastructure",
    ),
    # the runtime's hardware-error log line (neuron-runtime/nrt-troubleshoot.rst)
    (
        "generate",
        "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322 nd-id=0 nc-id=0 "
        "action=TERMINATE_INSTANCE",
        "infrastructure",
    ),
    # TorchNeuron's allocator on a runtime allocation failure (quoted by a review of its source;
    # not in a public page: docs/trainium.md lists it as unconfirmed)
    (
        "generate",
        "RuntimeError: NRT allocation failed for 2147483648 bytes on neuron:0 (OOM)",
        "out-of-memory",
    ),
    # TorchNeuron's process group: more than one core visible to a worker
    (
        "setup",
        "AssertionError: Attempted to have more than one device per process in distributed setup",
        "infrastructure",
    ),
]


@pytest.mark.parametrize(("stage", "message", "expected"), NEURON_MESSAGES)
def test_documented_neuron_messages_are_classified(stage: str, message: str, expected: str) -> None:
    assert runner.classify(stage, RuntimeError(message)) == expected


@pytest.mark.parametrize("stage", ["compile", "generate"])
def test_a_message_that_only_names_a_neff_file_is_not_a_compile_error(stage: str) -> None:
    """A NEFF is the compiled program; a failure that mentions one (reading a cached file,
    loading a finished executable) is not the compiler's."""
    error = PermissionError("[Errno 13] Permission denied: '/var/cache/neff/3f/a2/3fa2.neff'")
    assert runner.classify(stage, error) == "runtime"


def test_the_error_classes_used_are_in_the_vocabulary() -> None:
    assert {expected for _, _, expected in NEURON_MESSAGES} <= set(runner.ERROR_CLASSES)


# --------------------------------------------------------------------------- node preflight


def _facts(**changes: Any) -> runner.NodeFacts:
    """A trn2 node that passes every check; each test breaks one thing."""
    healthy = runner.NodeFacts(
        device_files={"/dev/neuron0": None, "/dev/neuron1": None},
        versions={"torch": "2.14.0", "torch-neuronx": "2.14.3.0", "neuronx-cc": "2.28.7631.0+ab12"},
        driver_version="2.26.5.0",
        environ={"NEURON_RT_VISIBLE_CORES": "4-5"},
        lnc_file_text=None,
        instance="trn2.48xlarge",
        cache_dir_problem=None,
    )
    return dataclasses.replace(healthy, **changes)


def _failed(facts: runner.NodeFacts) -> dict[str, str]:
    return {c.name: c.detail for c in runner.node_checks(facts, uid=1000) if not c.ok}


def test_a_healthy_node_passes_every_check() -> None:
    checks = runner.node_checks(_facts(), uid=1000)
    assert [c.name for c in checks] == [
        "device files",
        "versions",
        "cores and LNC",
        "compile cache folder",
    ]
    assert all(c.ok for c in checks)
    details = " ".join(c.detail for c in checks)
    assert "NEURON_RT_VISIBLE_CORES=4-5 (2 cores)" in details
    assert "LNC 2 (default for trn2)" in details
    assert "neuron driver 2.26.5.0" in details


@pytest.mark.parametrize(
    ("changes", "check", "says"),
    [
        ({"device_files": {}}, "device files", "no /dev/neuron* device"),
        (
            {"device_files": {"/dev/neuron0": None, "/dev/neuron1": "permission denied"}},
            "device files",
            "/dev/neuron1 cannot be used by uid 1000: permission denied (1 of 2 devices)",
        ),
        (
            {"versions": {"torch": "2.14.0", "torch-neuronx": None, "neuronx-cc": "2.28.7631.0"}},
            "versions",
            "torch-neuronx missing",
        ),
        (
            {"versions": {"torch": "2.9.0", "torch-neuronx": "2.9.0.2.11", "neuronx-cc": "2.26.1"}},
            "versions",
            "PyTorch/XLA library",
        ),
        (
            {"environ": {"NEURON_RT_VISIBLE_CORES": "5-4"}},
            "cores and LNC",
            "descending range",
        ),
        (
            {"environ": {"NEURON_LOGICAL_NC_CONFIG": "4"}},
            "cores and LNC",
            "only 1 and 2 are supported",
        ),
        ({"instance": None}, "cores and LNC", "logical NeuronCore size is unknown"),
        (
            {"cache_dir_problem": "/var/cache is not writable by uid 1000"},
            "compile cache folder",
            "/tmp/neff_cache: /var/cache is not writable",
        ),
    ],
)
def test_each_preflight_check_names_what_is_wrong(changes: dict, check: str, says: str) -> None:
    failed = _failed(_facts(**changes))
    assert list(failed) == [check]
    assert says in failed[check]


def test_the_torchneuron_check_refuses_a_failed_import_and_the_xla_library() -> None:
    assert not runner.check_torchneuron("ImportError: libnrt.so.1", False, [], None).ok
    xla = runner.check_torchneuron(None, False, ["inductor"], "2.9.0.2.11")
    assert not xla.ok and "PyTorch/XLA" in xla.detail
    assert runner.check_torchneuron(None, True, ["inductor", "neuron"], "2.14.3.0").ok


def test_the_facts_of_this_machine_fail_the_device_check(tmp_path: Path) -> None:
    """This CPU machine has no Neuron device; the folder checks read the real filesystem."""
    facts = runner.node_facts()
    assert facts.device_files == {}
    assert runner.writable_dir_problem(str(tmp_path / "new" / "cache")) is None
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.getuid() != 0:  # root writes anywhere
        assert "not writable" in (runner.writable_dir_problem(str(locked / "cache")) or "")
    (tmp_path / "file").write_text("x")
    assert "is not a folder" in (runner.writable_dir_problem(str(tmp_path / "file" / "c")) or "")


def test_a_node_that_fails_preflight_is_an_infrastructure_error_naming_the_check(
    native_torch_neuronx: FakeNeuronDevice, clean_neuron_env: None
) -> None:
    """TorchNeuron imports here (a fake) but the machine has no Neuron device: the run stops in
    setup before any model is loaded, and the record says which check failed."""
    doc = runner.execute(runner.RunContext(_config()))
    assert (doc["result"], doc["error_class"], doc["stage"]) == ("ERROR", "infrastructure", "setup")
    assert "node preflight check 'device files' failed" in doc["error"]
    assert native_torch_neuronx.calls == []  # nothing was allocated on the device
    ResultDocument.model_validate(doc)


# --------------------------------------------------------------------------- runtime device memory


def _sysfs(root: Path, usage: dict[tuple[int, int, str], int]) -> Path:
    """The driver's sysfs as the Neuron sysfs user guide lays it out: a counter folder per
    category with total (current use), present (last change) and peak."""
    for (device, core, category), total in usage.items():
        counter = (
            (root / f"neuron{device}" / f"neuron_core{core}" / "stats" / "memory_usage")
            / "device_mem"
            / category
        )
        counter.mkdir(parents=True, exist_ok=True)
        (counter / "total").write_text(f"{total}\n")
        (counter / "present").write_text("4096\n")
        (counter / "peak").write_text(f"{total * 2}\n")
    for device in {d for d, _, _ in usage}:
        (root / f"neuron{device}" / "core_count").write_text("8\n")
        (root / f"neuron{device}" / "stats" / "hardware").mkdir(parents=True, exist_ok=True)
    return root


def test_the_runtimes_device_memory_is_read_per_category_over_every_core(tmp_path: Path) -> None:
    root = _sysfs(
        tmp_path / "neuron_device",
        {
            (0, 0, "model_code"): 96 * 2**20,
            (0, 1, "model_code"): 96 * 2**20,
            (0, 0, "tensors"): 3 * 2**30,
            (1, 0, "dma_rings"): 2**20,
        },
    )
    assert runner.read_runtime_device_memory(str(root)) == {
        "dma_rings": 2**20,
        "model_code": 192 * 2**20,
        "tensors": 3 * 2**30,
    }
    assert runner.read_runtime_device_memory(str(tmp_path / "absent")) == {}


def test_the_run_records_what_the_runtime_added_beyond_the_allocator(tmp_path: Path) -> None:
    root = tmp_path / "neuron_device"
    _sysfs(root, {(0, 0, "runtime_memory"): 2**20, (0, 1, "tensors"): 5 * 2**20})
    before = runner.read_runtime_device_memory(str(root))  # another run already holds these
    _sysfs(
        root,
        {
            (0, 0, "runtime_memory"): 2**20,
            (0, 1, "tensors"): 5 * 2**20,
            (0, 2, "model_code"): 96 * 2**20,
            (0, 2, "model_shared_scratchpad"): 64 * 2**20,
            (0, 2, "tensors"): 2**30,
        },
    )
    total, categories = runner.runtime_memory_growth(
        before, runner.read_runtime_device_memory(str(root))
    )
    assert categories == {
        "model_code": 96 * 2**20,
        "model_shared_scratchpad": 64 * 2**20,
        "tensors": 2**30,
    }
    assert total == 2**30 + 160 * 2**20
    assert runner.runtime_memory_growth(None, {"tensors": 1}) == (None, None)
    assert runner.runtime_memory_growth({}, {}) == (None, None)  # no sysfs: not a Neuron machine
