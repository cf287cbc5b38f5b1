"""`model-support acceptance`, the first hour on a node as one command: here on CPU end to end
(the device parts n/a), and its judgement of what a Trainium node's runs must show."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.cli import app
from model_support.cli.commands_acceptance import CacheListing, expectations
from model_support.doctor import DoctorReport
from model_support.neuron_node import DeviceFacts, NeuronDevice, PreflightCheck
from model_support.records import Compilation, ResultDocument


@pytest.mark.slow
def test_the_first_hour_runs_here_end_to_end_with_the_device_parts_not_applicable(
    tmp_path: Path,
) -> None:
    (tiny,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    archive = tmp_path / "bug" / "first-hour.tar.gz"
    result = CliRunner().invoke(
        app,
        [
            "acceptance",
            str(tiny.require_path()),
            "--out",
            str(archive),
            "--compile-backend",
            "aot_eager",
            "--max-new-tokens",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    status = {e["name"]: e["status"] for e in report["expectations"]}
    assert status["both runs pass"] == "ok" and status["the timed call compiled nothing"] == "ok"
    for device_part in (
        "doctor",
        "smoke test",
        "one compiled graph per step, no CPU fallback",
        "NEFF cache entries in a layout the transfers read",
        "device facts",
    ):
        assert status[device_part] == "n/a", device_part
    assert status["second run hits the compile cache"] == "n/a"  # aot_eager has no cache
    with tarfile.open(archive) as tar:
        names = sorted(Path(n).name for n in tar.getnames())
        assert names == [
            "cache-listing.json",
            "doctor.json",
            "run-1.json",
            "run-1.log",
            "run-2.json",
            "run-2.log",
            "summary.json",
        ]
        member = tar.extractfile("model-support-acceptance/run-2.json")
        assert member is not None
        document = ResultDocument.model_validate_json(member.read())
        doctor = json.loads(tar.extractfile("model-support-acceptance/doctor.json").read())  # type: ignore[union-attr]
    assert document.result.value == "PASS" and document.compilation.graphs is not None
    assert "device_facts" in doctor and {c["name"] for c in doctor["checks"]} >= {"smoke test"}
    assert "Hub" not in {c["name"] for c in doctor["checks"]}  # a local checkpoint needs no Hub
    assert report["runs"][0]["compilation"]["timed_call_graphs"] == 0


def _neuron_run(**compilation: object) -> ResultDocument:
    figures = {
        "graphs": 2,
        "graph_breaks": 0,
        "whole_graph": True,
        "timed_call_graphs": 0,
        "cache": "neff",
        "fallback_execution": "disabled: TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1, set by run.py",
        **compilation,
    }
    return ResultDocument(
        model="Qwen/Qwen3-0.6B",
        task="text-generation",
        result="PASS",
        backend="neuron",
        compilation=Compilation.model_validate(figures),
    )


NODE = DoctorReport(
    [
        PreflightCheck("device files", True, "/dev/neuron0"),
        PreflightCheck("smoke test", True, "ok"),
    ],
    DeviceFacts(
        "neuron-ls", device_name="Trainium2", devices=[NeuronDevice(0, 4, [0, 1, 2, 3], 2)]
    ),
)
COLD = _neuron_run(cache_misses=2, cache_hits=0, cache_hit=False)
WARM = _neuron_run(cache_misses=0, cache_hits=2, cache_hit=True)
LISTING = CacheListing("/var/cache/neff", "neff", entries=3, by_layout={"sharded": 3}, files=3)


def _judged(runs: list[ResultDocument], listing: CacheListing = LISTING) -> dict[str, str]:
    return {e.name: e.status for e in expectations(NODE, runs, listing)}


def test_a_node_that_does_what_the_first_hour_expects_passes_every_expectation() -> None:
    assert set(_judged([COLD, WARM]).values()) == {"ok"}


def test_a_second_run_that_compiles_again_fails_the_cache_expectation() -> None:
    assert _judged([COLD, COLD])["second run hits the compile cache"] == "FAILED"


def test_neffs_in_a_layout_the_transfers_do_not_read_fail_their_expectation() -> None:
    stray = CacheListing("/var/cache/neff", "neff", entries=3, by_layout={"sharded": 3}, files=5)
    assert _judged([COLD, WARM], stray)["NEFF cache entries in a layout the transfers read"] == (
        "FAILED"
    )


def test_a_cpu_fallback_inside_a_graph_fails_the_whole_graph_expectation() -> None:
    fell_back = _neuron_run(
        cache_misses=0,
        cache_hits=2,
        cache_hit=True,
        fallback_ops=["compiled graph 1: aten::_unique2 falling back to CPU"],
    )
    judged = _judged([COLD, fell_back])
    assert judged["one compiled graph per step, no CPU fallback"] == "FAILED"
