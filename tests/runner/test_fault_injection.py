"""Verification fidelity: injected faults must FAIL, benign compilations must PASS.

Custom compile backends (model_support.faults) corrupt one place of the captured graph, the way a
compiler bug would: noise of a few sizes on one layer's output, a zeroed attention head, two
experts' routing swapped. Benign runs use plain bf16 graphs (eager, aot_eager) and inductor. The
suite writes a confusion table (false PASS / false FAIL) to test-artifacts/ and the terminal.

"Meaningful" faults (which must FAIL): noise >= 20% of the layer output's std, a zeroed head,
swapped experts. Smaller noise (1%, 5%) is reported, not asserted: at that size a bf16 model's own
rounding is of the same order, and no verdict can tell them apart reliably.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from model_support.checkpoints import DemoModel
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.records import ResultDocument
from model_support.vocabulary import Result

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FAULTS = "model_support.faults:"


@dataclass(frozen=True)
class Case:
    backend: str
    expect: Result | None  # None: reported only (sub-threshold fault)

    @property
    def label(self) -> str:
        return self.backend.removeprefix(FAULTS)


BENIGN = [
    Case("aot_eager", Result.PASS),
    Case(FAULTS + "benign", Result.PASS),
    Case("inductor", Result.PASS),
]
FAULTY = [
    Case(FAULTS + "noise_1pct", None),
    Case(FAULTS + "noise_5pct", None),
    Case(FAULTS + "noise_20pct", Result.FAIL),
    Case(FAULTS + "noise_100pct", Result.FAIL),
    Case(FAULTS + "zero_head", Result.FAIL),
]
MOE_ONLY = [Case(FAULTS + "swap_experts", Result.FAIL)]


def _row(model: str, case: Case, doc: ResultDocument) -> str:
    v = doc.verification
    if case.expect is None:
        outcome = "reported"
    elif doc.result == case.expect:
        outcome = "ok"
    else:
        outcome = "FALSE PASS" if doc.result == Result.PASS else "FALSE FAIL"
    ratio = f"{v.error_ratio:.2f}" if v.error_ratio is not None else "-"
    return (
        f"| {model} | {case.label} | {case.expect or 'any'} | {doc.result} | {ratio} | "
        f"{v.mismatches} | {v.near_ties} | {v.bad_tokens} | {outcome} |"
    )


def _suite(demo: DemoModel, cases: list[Case]) -> list[tuple[Case, ResultDocument]]:
    runs = []
    for case in cases:
        config = RunConfig(model=str(demo.require_path()), compile_backend=case.backend)
        runs.append((case, run_local(config, timeout_s=900).document))
    header = [
        f"## {demo.name}",
        "| model | backend | expected | result | error ratio | mismatches | near-ties | bad tokens | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [_row(demo.name, case, doc) for case, doc in runs]
    false_pass = sum("FALSE PASS" in r for r in rows)
    false_fail = sum("FALSE FAIL" in r for r in rows)
    table = "\n".join(
        [*header, *rows, "", f"false PASS: {false_pass}   false FAIL: {false_fail}", ""]
    )
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"fault-injection-{demo.name}.md").write_text(table)
    print("\n" + table)
    return runs


def _assert_verdicts(runs: list[tuple[Case, ResultDocument]]) -> None:
    for case, doc in runs:
        assert doc.error_class is None, (case.label, doc.error)
        if case.expect is Result.PASS:
            assert doc.result == Result.PASS, (case.label, doc.verification.reason)
        elif case.expect is Result.FAIL:
            assert doc.result == Result.FAIL, (
                case.label,
                doc.verification.model_dump(exclude={"positions"}),
            )
            assert doc.verification.reason  # a FAIL always says where and by how much


def test_dense_model_faults_fail_and_benign_runs_pass(demo_models: dict[str, DemoModel]) -> None:
    _assert_verdicts(_suite(demo_models["tiny-llama"], BENIGN + FAULTY))


def test_moe_model_faults_fail_and_benign_runs_pass(demo_models: dict[str, DemoModel]) -> None:
    _assert_verdicts(_suite(demo_models["tiny-qwen3-moe"], BENIGN + FAULTY + MOE_ONLY))
