"""The one-run summary `model-support run` prints: a FAIL says where it starts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from model_support.cli.run_output import print_record
from model_support.records import (
    FirstDivergence,
    ResultDocument,
    RunRecord,
    Verification,
    new_run_id,
)
from model_support.vocabulary import DivergencePhase, LocalizationStatus, Result


def _failed(where: FirstDivergence) -> RunRecord:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    document = ResultDocument(
        model="org/m",
        task="text-generation",
        result=Result.FAIL,
        verification=Verification(
            passed=False, error_ratio=8.6, reason="3 bad tokens", first_divergence=where
        ),
        started_at=now,
        finished_at=now,
    )
    return RunRecord(
        run_id=new_run_id(now), document=document, run_py="", source="cli", recorded_at=now
    )


def test_a_fail_summary_names_its_first_diverging_module(
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = FirstDivergence(
        status=LocalizationStatus.FOUND,
        module="model.layers.1.mlp.down_proj",
        kind="Linear",
        error_ratio=402.176,
        seconds=7.2,
    )
    print_record(_failed(where))
    out = capsys.readouterr().out
    assert (
        "where: first diverging module: model.layers.1.mlp.down_proj (Linear), error ratio 402 "
        "(7.2 s)" in " ".join(out.split())
    )


def test_a_fail_summary_says_the_decode_step_its_module_was_found_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = FirstDivergence(
        status=LocalizationStatus.FOUND,
        module="model.layers.0.mlp.act_fn",
        kind="SiLUActivation",
        error_ratio=125.2,
        phase=DivergencePhase.DECODE,
        step=18,
    )
    print_record(_failed(where))
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "where: first diverging module, from decode step 18: model.layers.0.mlp.act_fn "
        "(SiLUActivation), error ratio 125" in out
    )


def test_a_search_that_stopped_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    where = FirstDivergence(
        status=LocalizationStatus.NOT_SUPPORTED,
        reason="localization runs on one core; this run was sharded [red]",
    )
    print_record(_failed(where))
    out = " ".join(capsys.readouterr().out.split())
    # The reason is data: printed literally, never read as Rich markup.
    assert (
        "where: no first diverging module (not_supported): localization runs on one core; " in out
    )
    assert "this run was sharded [red]" in out


def test_a_summary_without_some_figures_prints_them_as_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verdict without an error ratio (an embeddings or classification verdict) and a run
    whose stages left some timings unset are summarised, not a crash."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    document = ResultDocument(
        model="org/embedder",
        task="sentence-similarity",
        result=Result.PASS,
        verification=Verification(passed=True),
        timings={"wall_time_s": 3.5},
        started_at=now,
        finished_at=now,
    )
    record = RunRecord(
        run_id=new_run_id(now), document=document, run_py="", source="cli", recorded_at=now
    )
    print_record(record)
    out = " ".join(capsys.readouterr().out.split())
    assert "error ratio=n/a" in out
    assert "wall 3.50 s (load n/a s" in out


def test_the_json_summary_carries_what_the_record_says_about_cost() -> None:
    """`run --json` is what scripts read: held seconds, core-seconds, compile share and the
    price used (a Neuron run), and no price at all for a CPU run, even with a default
    Trainium instance in the table."""
    from factories import make_record

    from model_support.cli.run_output import summary
    from model_support.pricing import DEFAULT_PRICES, prices_from_mapping

    neuron = summary(make_record(cores=4), DEFAULT_PRICES)  # 120 s on 4 cores of a trn2
    trn2 = DEFAULT_PRICES.price_of("trn2.48xlarge")
    assert trn2 is not None
    assert (neuron["held_s"], neuron["core_seconds"]) == (120.0, 480.0)
    assert neuron["compile_share"] == pytest.approx(93.75 / 120)
    assert neuron["price"] == {
        "instance_type": "trn2.48xlarge", "region": "us-east-1", "lnc": None,
        "core_hour_usd": trn2.usd_per_hour / 64, "source": trn2.source, "as_of": trn2.as_of,
        "assumed": False,
    }  # fmt: skip
    assert neuron["cost_usd"] == pytest.approx(480 / 3600 * trn2.usd_per_hour / 64)
    assumed = prices_from_mapping({"default_instance_type": "trn1.32xlarge"})
    cpu = summary(make_record(neuron=False), assumed)
    assert cpu["core_seconds"] == 120.0
    assert cpu["price"] is None and cpu["cost_usd"] is None
