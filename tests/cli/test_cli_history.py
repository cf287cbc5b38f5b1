"""`model-support history`, `regressions` and `sweep --estimate` on a real store (and the Hub
stand-in for sizing): what a user reads, and the clear errors of bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from factories import NEURON_STACK, T0, make_record
from hubserver import HubServer, Repo
from test_history import CC_NEW, CC_OLD, on_compiler
from typer.testing import CliRunner

from model_support.checkpoints import (
    LLAMA_3_1_405B_CONFIG,
    build_header_only_checkpoint,
    llama_tensors,
)
from model_support.cli import app
from model_support.pricing import DEFAULT_PRICES
from model_support.store import ResultsStore
from model_support.vocabulary import Result

runner = CliRunner()


@pytest.fixture
def results(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A store with a regression, a fix and a flip between two neuronx-cc versions."""
    store = ResultsStore(tmp_path / "results")
    runs = {
        "old-a": on_compiler(make_record("org/a", finished=T0), CC_OLD),
        "old-b": on_compiler(make_record("org/b", Result.ERROR, finished=T0), CC_OLD),
        "new-a": on_compiler(make_record("org/a", Result.ERROR, finished=T0 + timedelta(days=1)), CC_NEW),
        "new-b": on_compiler(make_record("org/b", finished=T0 + timedelta(days=1)), CC_NEW),
        "new-b-again": on_compiler(make_record("org/b", Result.ERROR, finished=T0 + timedelta(days=2)), CC_NEW),
        "new-b-third": on_compiler(make_record("org/b", finished=T0 + timedelta(days=3)), CC_NEW),
    }  # fmt: skip
    for record in runs.values():
        store.add(record)
    store.materialize()
    return str(tmp_path / "results"), {name: r.run_id for name, r in runs.items()}


def test_history_lists_every_run_with_flips_cost_and_reproduce(
    results: tuple[str, dict[str, str]],
) -> None:
    location, ids = results
    shown = runner.invoke(app, ["history", "org/b", "--results", location])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    for name in ("old-b", "new-b", "new-b-again", "new-b-third"):
        assert f"model-support reproduce {ids[name]}" in text
    assert "PASS -> ERROR/compile" in text and "ERROR/compile -> PASS" in text
    assert f"neuronx-cc {CC_OLD}" in text and f"neuronx-cc {CC_NEW}" in text
    listed = json.loads(
        runner.invoke(app, ["history", "org/b", "--results", location, "--json"]).stdout
    )
    assert [r["run_id"] for r in listed] == [
        ids["old-b"], ids["new-b"], ids["new-b-again"], ids["new-b-third"],
    ]  # fmt: skip
    trn2 = DEFAULT_PRICES.price_of("trn2.48xlarge")
    assert trn2 is not None
    assert listed[1]["cost_usd"] == pytest.approx(120 / 3600 * trn2.usd_per_hour / 64)
    assert listed[1]["core_seconds"] == pytest.approx(120.0)
    missing = runner.invoke(app, ["history", "org/none", "--results", location])
    assert missing.exit_code == 1 and "no runs of 'org/none'" in missing.output


def test_regressions_print_markdown_and_json_and_exit_3_when_there_are_any(
    results: tuple[str, dict[str, str]],
) -> None:
    location, ids = results
    shown = runner.invoke(app, ["regressions", "--results", location])
    # One ERROR run is not yet a regression: unconfirmed, exit 0, and said so.
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert text.startswith(f"# Regressions: neuronx-cc {CC_OLD}")
    assert "## Unconfirmed (not reported as regressions yet)" in text
    assert "1 of 3 agreeing runs on the newer stack: 2 more re-run(s)" in text
    # The reproduce command names the store, so it runs from anywhere the store is reachable.
    store_root = str(Path(location).resolve())
    assert f"`model-support reproduce {ids['new-a']} --results {store_root}`" in text
    # org/b ran PASS, ERROR, PASS on the newer stack: flaky, with its runs, never a fix.
    assert "## Flaky (runs on one stack disagree)" in text
    assert f"PASS `{ids['new-b']}`, ERROR/compile `{ids['new-b-again']}`" in text
    report = json.loads(runner.invoke(app, ["regressions", "--results", location, "--json"]).stdout)
    assert report["regressions"] == [] and report["fixes"] == []
    assert [(c["model"], c["kind"]) for c in report["unconfirmed"]] == [("org/a", "regression")]
    assert [(f["model"], [r["run_id"] for r in f["runs"]]) for f in report["flaky"]] == [
        ("org/b", [ids["new-b"], ids["new-b-again"], ids["new-b-third"]])
    ]
    # The bug body: each side's stack and the error's first lines.
    after = report["unconfirmed"][0]["after_evidence"]
    assert after["error_class"] == "compile"
    assert after["error_lines"] == ["neuronx-cc exited with status 70"]
    assert after["stack"]["compiler"] == f"neuronx-cc {CC_NEW}"
    assert after["container"].startswith(f"model-support reproduce {ids['new-a']} --results ")
    assert "--device=/dev/neuron0" in after["container"]
    # With no re-run asked for, one run is enough: a regression, exit 3 (for CI).
    eager = runner.invoke(app, ["regressions", "--results", location, "--reruns", "0", "--json"])
    assert eager.exit_code == 3, eager.output
    assert [c["model"] for c in json.loads(eager.stdout)["regressions"]] == ["org/a"]
    # Backwards: org/a's ERROR -> PASS is a fix; org/b stays flaky, never a regression.
    back = runner.invoke(
        app, ["regressions", "--results", location, "--from", CC_NEW, "--to", CC_OLD, "--json"]
    )
    backwards = json.loads(back.stdout)
    assert backwards["regressions"] == [] and backwards["unconfirmed"] == []
    assert [c["model"] for c in backwards["fixes"]] == ["org/a"]


def test_confirm_refuses_a_stack_this_machine_does_not_have(
    results: tuple[str, dict[str, str]],
) -> None:
    """--confirm re-runs here only what ran on this machine's stack (these rows ran on Neuron)."""
    location, ids = results
    refused = runner.invoke(app, ["regressions", "--results", location, "--confirm"])
    assert refused.exit_code == 2, refused.output
    text = " ".join(refused.output.split())
    assert f"run {ids['new-a']} ran on Neuron (neuronx-cc {CC_NEW})" in text
    assert "this machine has no torch-neuronx" in text


def test_regressions_refuse_unexplained_thresholds_and_unknown_stacks(
    results: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    location, _ = results
    bare = runner.invoke(app, ["regressions", "--results", location, "--max-decode-drop", "0.3"])
    assert bare.exit_code == 2
    assert "needs --reason" in bare.output
    explained = runner.invoke(
        app,
        [
            "regressions",
            "--results",
            location,
            "--max-decode-drop",
            "0.3",
            "--reason",
            "shared host",
        ],
    )
    assert "decode tokens/s dropped by more than 30%: shared host" in explained.stdout
    unknown = runner.invoke(app, ["regressions", "--results", location, "--from", "9.9"])
    assert unknown.exit_code == 2
    assert "no stack is named '9.9'" in unknown.output and CC_OLD in unknown.output
    empty = runner.invoke(app, ["regressions", "--results", str(tmp_path / "none")])
    assert empty.exit_code == 2 and "no results at" in empty.output  # a wrong --results
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices: 3\n")
    bad = runner.invoke(app, ["regressions", "--results", location, "--prices", str(prices)])
    assert bad.exit_code == 2 and "prices" in bad.output


def test_regressions_with_nothing_to_compare_exit_1_and_say_why(
    results: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Never an empty success: a store without data, or stacks that share no model, is exit 1
    with what to do (a CI gate must not pass on a comparison of nothing)."""
    location, _ = results
    other_task = runner.invoke(
        app, ["regressions", "--results", location, "--task", "image-classification"]
    )
    assert other_task.exit_code == 1, other_task.output
    text = " ".join(other_task.output.split())
    assert "nothing to compare: no model of task 'image-classification' has a result" in text
    assert f"neuronx-cc {CC_OLD}" in text and "## Regressions" not in text
    disjoint = ResultsStore(tmp_path / "disjoint")
    disjoint.add(on_compiler(make_record("org/a", finished=T0), CC_OLD))
    disjoint.add(on_compiler(make_record("org/b", finished=T0 + timedelta(days=1)), CC_NEW))
    unmaterialized = runner.invoke(app, ["regressions", "--results", str(tmp_path / "disjoint")])
    assert unmaterialized.exit_code == 1, unmaterialized.output
    text = " ".join(unmaterialized.output.split())
    assert "hold 2 record(s) but no history yet" in text
    # The command to run comes out whole, never wrapped inside its path, so it copies as is.
    command = f"model-support dataset materialize --results {tmp_path / 'disjoint'}"
    assert command in unmaterialized.output
    disjoint.materialize()
    nothing_shared = runner.invoke(app, ["regressions", "--results", str(tmp_path / "disjoint")])
    assert nothing_shared.exit_code == 1, nothing_shared.output
    assert "nothing to compare: no model has a result on both" in " ".join(
        nothing_shared.output.split()
    )


@pytest.fixture
def hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_llama_path: Path
) -> Iterator[HubServer]:
    huge = build_header_only_checkpoint(
        tmp_path / "ckpt", "huge", LLAMA_3_1_405B_CONFIG, llama_tensors(LLAMA_3_1_405B_CONFIG)
    )
    repos = [
        Repo.from_dir("org/tiny", tiny_llama_path, downloads=900),
        Repo.from_dir("org/huge", huge, downloads=800),
        Repo.from_dir("org/fresh", tiny_llama_path, downloads=700),
    ]
    with HubServer(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_a_sweep_estimate_sizes_each_model_and_prices_past_runs(
    hub: HubServer, tmp_path: Path
) -> None:
    store = ResultsStore(tmp_path / "results")
    for minutes in (10, 20, 30):  # org/tiny held its core 10, 20, 30 minutes: median 20
        record = make_record("org/tiny", finished=T0 + timedelta(days=minutes))
        doc = record.document
        started = doc.finished_at - timedelta(minutes=minutes)  # type: ignore[operator]
        store.add(
            record.model_copy(update={"document": doc.model_copy(update={"started_at": started})})
        )
    store.materialize()
    shown = runner.invoke(
        app,
        ["sweep", "nightly", "--limit", "5", "--profile", "trn1", "--estimate", "--results",
         str(tmp_path / "results")],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "apiVersion" not in text  # nothing to apply: only the estimate
    assert "org/tiny" in text and "its 3 past run(s)" in text
    assert "excluded: never run (too-large)" in text
    # org/fresh: no run of its own, but org/tiny ran on as many cores (1): its median.
    assert "1 past run(s) on as many cores" not in text and "3 past run(s) on as many cores" in text
    # 2 models x 1 core x 1/3 h at trn1.32xlarge's $21.50 / 32 cores per core-hour.
    expected = 2 * (20 / 60) * 21.50 / 32
    assert f"expected: {2 * 20 / 60:.2f} core-hours, cost ${expected:,.4f}" in text
    fresh = runner.invoke(
        app,
        ["sweep", "nightly", "--limit", "5", "--profile", "trn1", "--estimate", "--results",
         str(tmp_path / "empty")],
    )  # fmt: skip
    assert fresh.exit_code == 0, fresh.output
    assert "the default" in fresh.stdout and "0.25 h on up to 1 core(s)" in fresh.stdout


def test_a_store_without_a_history_says_how_to_build_it(
    results: tuple[str, dict[str, str]],
) -> None:
    location, ids = results
    (Path(location) / "history" / "runs.parquet").unlink()  # a store from before histories
    missing = runner.invoke(app, ["regressions", "--results", location])
    assert missing.exit_code == 1
    assert "model-support dataset materialize" in " ".join(missing.output.split())
    built = runner.invoke(app, ["dataset", "materialize", "--results", location])
    assert built.exit_code == 0, built.output
    listed = json.loads(
        runner.invoke(app, ["history", "org/a", "--results", location, "--json"]).stdout
    )
    assert [r["run_id"] for r in listed] == [ids["old-a"], ids["new-a"]]


def test_report_shows_a_release_at_a_glance(results: tuple[str, dict[str, str]]) -> None:
    location, ids = results
    store = ResultsStore(location)
    store.add(on_compiler(make_record("org/gone", finished=T0), CC_OLD))  # not re-tested
    store.add(
        on_compiler(
            make_record(
                "org/big", Result.EXCLUDED, stack=NEURON_STACK, recorded=T0 + timedelta(days=1)
            ),
            CC_NEW,
        )
    )
    store.materialize()
    shown = runner.invoke(app, ["report", "--results", location])
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert text.startswith(f"# Release: neuronx-cc {CC_NEW} · transformers 5.24.0")
    assert f"Against neuronx-cc {CC_OLD} · transformers 5.24.0" in text
    # tested, PASS, FAIL, ERROR, TIMEOUT, EXCLUDED, UNVERIFIED, regressions, fixes,
    # unconfirmed, flaky, not re-tested, then the core-hours and the cost.
    assert "| 3 | 1 | 0 | 1 | 0 | 1 | 0 | 0 | 0 | 1 | 1 | 1 |" in text
    assert "- org/gone · text-generation" in text
    assert f"ERROR/compile `{ids['new-b-again']}`" in text
    report = json.loads(
        runner.invoke(app, ["report", CC_NEW, "--results", location, "--json"]).stdout
    )
    assert report["results"] == {"PASS": 1, "ERROR": 1, "EXCLUDED": 1}
    assert report["not_retested"] == ["org/gone · text-generation"]
    assert [f["model"] for f in report["flaky"]] == ["org/b"]
    assert [c["model"] for c in report["unconfirmed"]] == ["org/a"]
    trn2 = DEFAULT_PRICES.price_of("trn2.48xlarge")
    assert trn2 is not None
    # Every run on the release held its cores (re-runs too): 4 runs of 120 s on one core.
    assert report["core_seconds"] == pytest.approx(4 * 120.0)
    assert report["cost_usd"] == pytest.approx(4 * 120 / 3600 * trn2.usd_per_hour / 64)
    oldest = runner.invoke(app, ["report", CC_OLD, "--results", location, "--json"])
    assert json.loads(oldest.stdout)["previous"] is None
    unknown = runner.invoke(app, ["report", "9.9", "--results", location])
    assert unknown.exit_code == 2 and "no stack is named '9.9'" in unknown.output


def test_an_estimate_of_listed_models_needs_no_hub_and_a_relative_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_llama_path: Path
) -> None:
    """--model lists the models (local checkpoints here: nothing reaches the Hub, whose
    endpoint answers nothing), --results may be relative, and a CPU profile's hours are
    estimated from CPU runs only and never priced as Trainium core-hours."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.chdir(tmp_path)
    huge = build_header_only_checkpoint(
        tmp_path / "ckpt", "huge", LLAMA_3_1_405B_CONFIG, llama_tensors(LLAMA_3_1_405B_CONFIG)
    )
    store = ResultsStore("results")
    tiny = str(tiny_llama_path)
    for hours, neuron in ((1, False), (5, True)):  # a CPU run of 1 h, a Neuron run of 5 h
        record = make_record(tiny, neuron=neuron, finished=T0 + timedelta(days=hours))
        doc = record.document
        started = doc.finished_at - timedelta(hours=hours)  # type: ignore[operator]
        store.add(
            record.model_copy(update={"document": doc.model_copy(update={"started_at": started})})
        )
    store.materialize()
    prices = tmp_path / "prices.yaml"
    prices.write_text("default_instance_type: trn1.32xlarge\n")
    shown = runner.invoke(
        app,
        ["sweep", "local", "--estimate", "--profile", "cpu", "--model", tiny, "--model",
         str(huge), "--results", "results", "--prices", str(prices)],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "estimate: 2 models on cpu, past runs from results" in text
    assert f"{tiny} text-generation 1 core(s) 1.00 h each (its 1 past run(s))" in text
    assert "excluded: never run" in text
    assert "cost —" in text and "runs off Neuron: its core-hours are not priced" in text
    # On a Neuron profile the Neuron run counts, and the sweep is priced.
    neuron = runner.invoke(
        app,
        ["sweep", "local", "--estimate", "--profile", "trn1", "--model", tiny, "--results",
         "results"],
    )  # fmt: skip
    assert neuron.exit_code == 0, neuron.output
    text = " ".join(neuron.stdout.split())
    assert "5.00 h each (its 1 past run(s))" in text
    assert f"cost ${5 * 21.50 / 32:,.2f}" in text
