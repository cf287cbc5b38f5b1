"""Verification fidelity of the tasks beyond text generation: faults FAIL, benign runs PASS.

For every tiny checkpoint of a task family (model_support/tasks.py), its declared fault cases
run through run.py's own task scenario
(``scenario_for(task)``: load, inputs, compile, call, collect, score, judge) with compile
backends from model_support.faults that change one place of the captured graph the way a
compiler bug would: noise in one layer, a zeroed attention head, one input of the batch wrong,
the encoder or the decoder of an encoder-decoder, the vocabulary's tail, and for text-to-image
the wrong timestep, a stale denoising step, noise in the denoiser's middle block. Benign runs
change the arithmetic the way a correct compiler may: eager and aot_eager graphs, inductor (one
case per task), bfloat16 and float32, TF32 or bfloat16 matmul operands under the matching
float32 precision.

Each fixture loads once per dtype; Dynamo captures its graphs once and every case recompiles
them with its own backend; the reference and baseline are scored once per dtype and precision
(per token sequence for the generating tasks). Each checkpoint's test writes its confusion
table to test-artifacts/ (printed at the end of the session) and asserts 0 false PASS, 0 false
FAIL.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from faultbench import SwitchableBackend, environment

from model_support.checkpoints import DemoModel, build_demo_models, default_cache_dir
from model_support.config import RunConfig
from model_support.records import Verification
from model_support.runner import run as runner
from model_support.tasks import (
    CHECKPOINTS,
    FAULTS,
    DemoCheckpoint,
    FaultCase,
    family_of_checkpoint,
)
from model_support.vocabulary import Result

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PASS, FAIL = Result.PASS, Result.FAIL
CHECKPOINTS_WITH_FAULTS = [checkpoint for checkpoint in CHECKPOINTS if checkpoint.faults]


def _expected(case: FaultCase) -> Result | None:
    return None if case.expect is None else Result(case.expect)


@dataclass(frozen=True)
class Row:
    task: str
    model: str
    case: FaultCase
    result: Result
    verification: Verification

    @property
    def outcome(self) -> str:
        if self.case.expect is None:
            return "reported"
        if self.result == _expected(self.case):
            return "ok"
        return "FALSE PASS" if self.result == Result.PASS else "FALSE FAIL"


def _scored_from(device_output: Any) -> bytes:
    """What the reference is scored from besides the fixed inputs: the device's tokens (teacher
    forced), the denoiser's inputs at every step (text-to-image), or nothing."""
    if device_output.tokens is not None:
        return bytes(device_output.tokens.numpy().tobytes())
    if isinstance(device_output.task_data, dict) and "calls" in device_output.task_data:
        digest = hashlib.sha256()
        for args, kwargs, _ in device_output.task_data["calls"]:
            for value in [*args, *kwargs.values()]:
                if isinstance(value, torch.Tensor):
                    digest.update(value.float().numpy().tobytes())
        return digest.digest()
    return b""


def _fixture(name: str) -> DemoModel:
    (model,) = build_demo_models(default_cache_dir(), [name])
    return model


class TaskBench:
    """One fixture of one task, loaded once per dtype, judged case after case through its
    scenario in run.py; the reference and baseline are scored once per distinct output key."""

    def __init__(self, demo: DemoModel, task: str | None = None) -> None:
        self.demo = demo
        self.task = task or demo.task.value
        self.scenario = runner.scenario_for(self.task)
        self.path = str(demo.require_path())
        self.loaded: dict[str, tuple[Any, SwitchableBackend]] = {}
        self.capturing: str | None = None
        self.scored: dict[tuple[str, str, bytes], Any] = {}

    def config(self, dtype: str, precision: str) -> dict[str, Any]:
        run_config = RunConfig(
            model=self.path,
            task=self.task,  # type: ignore[arg-type]
            dtype=dtype,  # type: ignore[arg-type]
            verification={"float32_precision": precision},  # type: ignore[arg-type]
        )
        return run_config.model_dump(mode="json")

    def _model(self, dtype: str) -> tuple[Any, SwitchableBackend]:
        if dtype not in self.loaded:
            config = self.config(dtype, "auto")
            cpu = torch.device("cpu")
            processor, model = self.scenario.load(config, dtype, cpu)
            inputs = self.scenario.inputs(config, processor, cpu, dtype)
            loaded = runner.LoadedModel(
                processor, model, inputs, self.scenario.pad_token_id(processor)
            )
            switch = SwitchableBackend()
            self.scenario.compile(model, switch)
            self.loaded[dtype] = (loaded, switch)
        return self.loaded[dtype]

    def run(self, case: FaultCase) -> tuple[Result, Verification, str]:
        """Run the case's compiled model through the scenario and judge it; what faults printed."""
        import torch._dynamo

        loaded, switch = self._model(case.dtype)
        if self.capturing != case.dtype:
            # Dynamo bounds the captures per code object and transformers' wrappers are shared
            # between models: start afresh for each variant (the cases come grouped by dtype).
            torch._dynamo.reset()
            for _, other in self.loaded.values():
                other.graphs.clear()
            self.capturing = case.dtype
        config = self.config(case.dtype, case.precision)
        if case.backend.startswith(FAULTS):
            from model_support import faults

            backend = getattr(faults, case.backend.removeprefix(FAULTS))
        else:
            backend = torch._dynamo.lookup_backend(case.backend)
        printed = io.StringIO()
        with environment(dict(case.env)), contextlib.redirect_stderr(printed), torch.no_grad():
            switch.switch(backend)
            out = self.scenario.call(config, loaded)
        assert switch.graphs, "Dynamo captured no graph: the case ran eager"
        device_output = self.scenario.collect(config, loaded, out)
        precision = (
            runner.float32_precision(config["verification"], "cpu")
            if case.dtype == "float32"
            else None
        )
        key = (case.dtype, precision or "ieee", _scored_from(device_output))
        if key not in self.scored:
            self.scored[key] = self.scenario.score(
                config, loaded.processor, device_output, case.dtype, key[1]
            )
        verdict = self.scenario.judge(
            config,
            device_output,
            self.scored[key],
            runner.precision_label(case.dtype, key[1]),
        )
        verdict["float32_precision"] = precision
        # What run.py would write must be a valid record (no field the records do not know).
        assert set(verdict) <= set(Verification.model_fields), set(verdict) - set(
            Verification.model_fields
        )
        verification = Verification.model_validate(verdict)
        return (PASS if verification.passed else FAIL), verification, printed.getvalue()

    def rows(self, cases: list[FaultCase]) -> list[Row]:
        rows = []
        for case in cases:
            result, verification, printed = self.run(case)
            if case.backend.startswith(FAULTS):
                name = case.backend.removeprefix(FAULTS)
                # A fault that never landed would make its row meaningless.
                assert f"[fault] {name}: applied" in printed, (case.label, printed[-2000:])
            rows.append(Row(self.task, self.demo.name, case, result, verification))
        return rows


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _metric_cells(v: Verification) -> str:
    return ", ".join(
        f"{m.check} {_ratio(m.median_ratio)}/{_ratio(m.peak_ratio)}" for m in v.metrics
    ) or (f"median {_ratio(v.error_ratio)} q90 {_ratio(v.q90_ratio)} "
          f"peak {_ratio(v.peak_ratio)} kl {_ratio(v.kl_ratio)}")  # fmt: skip


def _write_table(name: str, rows: list[Row]) -> str:
    lines = [
        f"## {name}",
        "| task | model | dtype | fp32 precision | case | expected | result | failed checks "
        "| ratios (median/peak per measure) | mismatches | near-ties | bad | verdict |",
        "| --- " * 13 + "|",
    ]
    for row in rows:
        v = row.verification
        lines.append(
            f"| {row.task} | {row.model} | {row.case.dtype} | {v.float32_precision or '-'} "
            f"| {row.case.label} | {row.case.expect or 'any'} | {row.result} "
            f"| {', '.join(c.value for c in v.failed_checks) or '-'} | {_metric_cells(v)} "
            f"| {v.mismatches if v.mismatches is not None else '-'} "
            f"| {v.near_ties if v.near_ties is not None else '-'} "
            f"| {v.bad_tokens if v.bad_tokens is not None else '-'} | {row.outcome} |"
        )
    benign = [r for r in rows if _expected(r.case) is PASS]
    faulty = [r for r in rows if _expected(r.case) is FAIL]

    def worst(rs: list[Row], pick: Any) -> str:
        return f"{pick(r.verification for r in rs):.2f}" if rs else "-"

    def largest(v: Verification) -> float:
        ratios = [r for m in v.metrics for r in (m.median_ratio, m.peak_ratio) if r is not None]
        ratios += [r for r in (v.error_ratio, v.q90_ratio, v.peak_ratio) if r is not None]
        return max(ratios, default=0.0)

    false_pass = sum(r.outcome == "FALSE PASS" for r in rows)
    false_fail = sum(r.outcome == "FALSE FAIL" for r in rows)
    table = "\n".join(
        [
            *lines,
            "",
            f"false PASS: {false_pass}   false FAIL: {false_fail}   cases: {len(rows)}",
            "largest ratio of a benign run: "
            + worst(benign, lambda vs: max(largest(v) for v in vs))
            + "; smallest largest-ratio of a fault: "
            + worst(faulty, lambda vs: min(largest(v) for v in vs)),
            "",
        ]
    )
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"fault-injection-{name}.md").write_text(table)
    print("\n" + table)
    return table


def _assert_verdicts(rows: list[Row]) -> None:
    for row in rows:
        v = row.verification
        if _expected(row.case) is PASS:
            assert row.result == Result.PASS, (row.task, row.case.label, v.reason)
            assert not v.failed_checks
        elif _expected(row.case) is FAIL:
            assert row.result == Result.FAIL, (
                row.task,
                row.case.label,
                v.model_dump(exclude={"positions", "prompt_statistics", "items"}),
            )
            # A FAIL names its checks and says where and by how much.
            assert v.failed_checks and v.reason
            for check in v.failed_checks:
                assert check.value in v.reason


@pytest.mark.parametrize("checkpoint", CHECKPOINTS_WITH_FAULTS, ids=lambda c: c.name)
def test_task_verdicts(checkpoint: DemoCheckpoint) -> None:
    """The checkpoint's declared cases, each task of them on one bench (the model loaded once
    per dtype): no false PASS, no false FAIL, every FAIL saying why."""
    demo = _fixture(checkpoint.name)
    method = family_of_checkpoint(checkpoint.name).method
    rows: list[Row] = []
    for task in dict.fromkeys(case.task or checkpoint.task for case in checkpoint.faults):
        cases = [case for case in checkpoint.faults if (case.task or checkpoint.task) is task]
        rows += TaskBench(demo, task.value).rows(cases)
    _write_table(checkpoint.name, rows)
    _assert_verdicts(rows)
    assert all(r.verification.method == method for r in rows)
