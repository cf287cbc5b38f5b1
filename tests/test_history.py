"""History, regressions between stacks and cost per test, from the store's records.

Records go through the real store (add + materialize); what is asserted is what a user reads:
every run kept (a re-run on the same stack a new row, never a replaced one), flips on one
stack named as such, the comparison of two stacks, and what each run cost.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from factories import CPU_STACK, NEURON_STACK, T0, make_record
from markdown_it import MarkdownIt

from model_support.history import (
    Change,
    Confirmation,
    Report,
    StackNotFound,
    Thresholds,
    default_pair,
    find_stack,
    model_history,
    read_history,
    read_stack_runs,
    read_stacks,
    regressions,
    render_markdown,
    stacks,
)
from model_support.pricing import (
    DEFAULT_PRICES,
    PriceTableError,
    load_prices,
    prices_from_mapping,
)
from model_support.records import (
    CacheTransferFigures,
    CompileCacheFigures,
    FirstDivergence,
    RunRecord,
)
from model_support.store import ResultsStore
from model_support.vocabulary import DivergencePhase, LocalizationStatus, Result, VerdictCheck

CC_OLD = "2.27.1000.0"
CC_NEW = "2.28.7631.0"


def on_compiler(
    record: RunRecord,
    version: str,
    *,
    decode: float | None = None,
    compile_s: float | None = None,
    memory: int | None = None,
    revision: str | None = None,
) -> RunRecord:
    """``record`` as run with neuronx-cc ``version`` (and other figures where given)."""
    doc = record.document
    timings = doc.timings.model_copy(
        update={
            k: v
            for k, v in (("decode_tokens_per_s", decode), ("compile_s", compile_s))
            if v is not None
        }
    )
    memory_figures = (
        doc.memory
        if memory is None
        else doc.memory.model_copy(update={"peak_device_memory_bytes": memory})
    )
    update = {
        "stack": doc.stack.model_copy(update={"neuronx_cc": version}),
        "timings": timings,
        "memory": memory_figures,
    }
    if revision is not None:
        update["resolved_revision"] = revision
    return record.model_copy(update={"document": doc.model_copy(update=update)})


def failed(
    record: RunRecord, checks: list[VerdictCheck], where: FirstDivergence | None = None
) -> RunRecord:
    doc = record.document
    verification = doc.verification.model_copy(
        update={"passed": False, "failed_checks": checks, "first_divergence": where}
    )
    return record.model_copy(
        update={
            "document": doc.model_copy(update={"result": Result.FAIL, "verification": verification})
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    return ResultsStore(tmp_path / "results")


def test_a_rerun_on_the_same_stack_is_kept_and_shown_as_a_flip(store: ResultsStore) -> None:
    first = on_compiler(make_record("org/flaky", finished=T0), CC_NEW, revision="a" * 40)
    second = on_compiler(
        make_record("org/flaky", Result.ERROR, finished=T0 + timedelta(hours=1)),
        CC_NEW,
        revision="b" * 40,
    )
    third = on_compiler(
        make_record("org/flaky", finished=T0 + timedelta(hours=2)), CC_NEW, revision="b" * 40
    )
    for record in (third, first, second):  # stored out of order
        store.add(record)
    store.materialize()
    # The matrix holds the latest run of the stack; the history holds all three.
    assert list(store.matrix().run_id) == [third.run_id]
    runs = model_history(read_history(store, "org/flaky"), "org/flaky", None, DEFAULT_PRICES)
    assert list(runs.run_id) == [first.run_id, second.run_id, third.run_id]
    assert list(runs.result) == ["PASS", "ERROR", "PASS"]
    flips = list(runs.flip)
    assert pd.isna(flips[0])
    assert flips[1] == f"PASS -> ERROR/compile; revision {'a' * 12} -> {'b' * 12}"
    assert flips[2] == "ERROR/compile -> PASS"
    assert set(runs.stack_label) == {f"neuronx-cc {CC_NEW} · transformers 5.24.0"}


def test_the_history_is_what_a_rebuild_from_the_records_gives(store: ResultsStore) -> None:
    records = [
        on_compiler(make_record(f"org/m{i % 3}", finished=T0 + timedelta(minutes=i)), CC_NEW)
        for i in range(7)
    ]
    for record in records[:4]:
        store.add(record)
    store.materialize()
    for record in records[4:]:
        store.add(record)
    store.materialize()
    # One record removed from the store (moved out): its run leaves the history.
    gone = Path(store.record_path(records[1].run_id))
    gone.rename(gone.parent.parent / "moved-out.json")
    store.materialize()
    incremental = Path(store.history_path()).read_bytes()
    store.materialize(rebuild=True)
    assert Path(store.history_path()).read_bytes() == incremental
    assert set(store.history(columns=["run_id"]).run_id) == {
        r.run_id for r in records if r is not records[1]
    }
    # A lost history is rebuilt from the records by the next materialize.
    Path(store.history_path()).unlink()
    store.add(on_compiler(make_record("org/m9", finished=T0 + timedelta(hours=1)), CC_NEW))
    store.materialize()
    assert len(store.history()) == 7


def test_core_seconds_and_cost_come_from_the_runs_own_timestamps(store: ResultsStore) -> None:
    record = make_record("org/big", cores=4)  # started 120 s before it finished
    doc = record.document
    cache = CompileCacheFigures(
        target="s3://cache",
        prefix=f"neuronxcc-{CC_NEW}",
        pull=CacheTransferFigures(entries=3, bytes=10, seconds=6.0),
        push=CacheTransferFigures(entries=1, bytes=5, seconds=4.0),
    )
    record = record.model_copy(update={"document": doc.model_copy(update={"compile_cache": cache})})
    excluded = make_record("org/huge", Result.EXCLUDED)
    store.add(record)
    store.add(excluded)
    store.materialize()
    rows = store.history().set_index("model_id")
    assert rows.loc["org/big", "held_s"] == pytest.approx(130.0)  # 120 s + pull + push
    assert rows.loc["org/big", "core_seconds"] == pytest.approx(520.0)
    assert rows.loc["org/big", "compile_share"] == pytest.approx(93.75 / 130.0)
    assert rows.loc["org/huge", "core_seconds"] == 0.0  # never ran, held nothing
    runs = model_history(store.history(), "org/big", None, DEFAULT_PRICES)
    # trn2.48xlarge: its hourly price over its 64 logical cores (LNC=2), for 520 core-seconds.
    trn2 = DEFAULT_PRICES.price_of("trn2.48xlarge")
    assert trn2 is not None
    assert runs.cost_usd.iloc[0] == pytest.approx(520 / 3600 * trn2.usd_per_hour / 64)
    # A site's own price replaces the default one; an unknown instance has no cost.
    mine = prices_from_mapping(
        {
            "prices": [
                {
                    "instance_type": "trn2.48xlarge",
                    "region": "us-east-1",
                    "usd_per_hour": 64.0,
                    "cores": 64,
                    "source": "our contract",
                    "as_of": "2026-12-01",
                }
            ]
        }
    )
    assert model_history(store.history(), "org/big", None, mine).cost_usd.iloc[0] == (
        pytest.approx(520 / 3600)
    )
    cpu = store.history().assign(instance_type=None)
    assert pd.isna(model_history(cpu, "org/big", None, DEFAULT_PRICES).cost_usd.iloc[0])


def test_a_bad_price_table_is_refused_with_the_field_named(tmp_path: Path) -> None:
    table = tmp_path / "prices.yaml"
    table.write_text("prices:\n  - instance_type: trn1.32xlarge\n    region: us-east-1\n")
    with pytest.raises(PriceTableError, match=r"prices\.0\.usd_per_hour: Field required"):
        load_prices(table)
    with pytest.raises(PriceTableError, match="cannot read the price table"):
        load_prices(tmp_path / "missing.yaml")
    table.write_text("region: eu-west-1\n")
    assert load_prices(table).price_of("trn1.32xlarge") is None  # no eu-west-1 price given


ACT_FN_AT_STEP_18 = FirstDivergence(
    status=LocalizationStatus.FOUND,
    module="model.layers.0.mlp.act_fn",
    kind="SiLUActivation",
    error_ratio=125.3,
    phase=DivergencePhase.DECODE,
    step=18,
)


def repeated(
    record: RunRecord, version: str, times: int, *, figures: list[dict[str, float]] | None = None
) -> list[RunRecord]:
    """``record`` run ``times`` times on neuronx-cc ``version``, an hour apart (each with its
    own run id and, where given, its own figures: decode, compile_s, memory)."""
    runs = []
    for n in range(times):
        doc = record.document
        finished = (doc.finished_at or T0) + timedelta(hours=n)
        again = record.model_copy(
            update={
                "run_id": f"{record.run_id}-{n}",
                "document": doc.model_copy(
                    update={
                        "finished_at": finished,
                        "started_at": finished - timedelta(seconds=120),
                    }
                ),
            }
        )
        runs.append(on_compiler(again, version, **((figures or [{}] * times)[n])))  # type: ignore[arg-type]
    return runs


def _two_stacks(store: ResultsStore, times: int = 3) -> dict[str, RunRecord]:
    """Six models on an older and a newer neuronx-cc, each run ``times`` times per stack (the
    slower one with figures that vary a little from run to run)."""
    old, new = T0, T0 + timedelta(days=7)
    pairs = {
        "org/regressed": (make_record("org/regressed", finished=old), make_record("org/regressed", Result.ERROR, finished=new)),
        "org/miscompiled": (make_record("org/miscompiled", finished=old), failed(make_record("org/miscompiled", finished=new), [VerdictCheck.TOKENS, VerdictCheck.KL], ACT_FN_AT_STEP_18)),
        "org/fixed": (make_record("org/fixed", Result.ERROR, finished=old), make_record("org/fixed", finished=new)),
        "org/slower": (make_record("org/slower", finished=old), make_record("org/slower", finished=new)),
        "org/steady": (make_record("org/steady", finished=old), make_record("org/steady", finished=new)),
        "org/new-only": (None, make_record("org/new-only", Result.ERROR, finished=new)),
    }  # fmt: skip
    base = [
        {"decode": 76.8 + d, "memory": 2_400_000_000 + m} for d, m in ((0, 0), (1.5, 10), (-1, 5))
    ]
    slow = [
        {"decode": 60.0 + d, "memory": 2_700_000_000 + m} for d, m in ((0, 0), (1, 10), (-0.5, 5))
    ]
    latest = {}
    for model, (before, after) in pairs.items():
        if before is not None:
            for run in repeated(before, CC_OLD, times, figures=base[:times]):
                store.add(run)
        figures = slow if model == "org/slower" else base
        runs = repeated(after, CC_NEW, times, figures=figures[:times])
        for run in runs:
            store.add(run)
        latest[model] = runs[-1]
    store.materialize()
    return latest


def test_regressions_between_the_two_newest_stacks(store: ResultsStore) -> None:
    after = _two_stacks(store)
    frame = read_history(store)
    known = stacks(frame)
    assert [i.stack.compiler_version for i in known] == [CC_OLD, CC_NEW]
    before_stack, after_stack = default_pair(known)
    report = regressions(frame, before_stack, after_stack, Thresholds(), DEFAULT_PRICES)
    assert report.compared == 5
    # A model tested on one stack only is not compared: counted and named, "not tested" before.
    assert report.not_tested_before == ["org/new-only · text-generation"]
    assert report.not_tested_after == []
    assert "0 not tested after, 1 not tested before" in render_markdown(report)
    found = {(c.model, c.kind, c.group) for c in report.regressions}
    assert found == {
        ("org/regressed", "regression", "ERROR compile"),
        ("org/miscompiled", "regression", "FAIL tokens, kl"),
        ("org/slower", "slower", "decode tokens/s dropped"),
        ("org/slower", "memory", "peak device memory grew"),
    }
    assert report.unconfirmed == [] and report.flaky == []
    assert [(c.model, c.group) for c in report.fixes] == [("org/fixed", "was ERROR compile")]
    # A FAIL says where it starts: its first diverging module, and the decode step.
    miscompiled = next(c for c in report.regressions if c.model == "org/miscompiled")
    assert miscompiled.detail == (
        "first diverging module, from decode step 18: model.layers.0.mlp.act_fn "
        "(SiLUActivation), error ratio 125"
    )
    regressed = next(c for c in report.regressions if c.model == "org/regressed")
    assert regressed.reproduce == f"model-support reproduce {after['org/regressed'].run_id}"
    assert (regressed.runs_before, regressed.runs_after) == (3, 3)
    assert regressed.cost_usd_after is not None and regressed.cost_usd_after > 0
    # A speed regression says how many samples it compared and the noise it assumed.
    slower = next(c for c in report.regressions if c.kind == "slower")
    assert slower.detail == (
        "decode 76.8 -> 60.0 tokens/s (-22%): medians of 3 and 3 PASS runs; noise assumed ±3% "
        "(the wider side's range over its median), threshold 10%"
    )
    # A looser bound, with its reason, lets the slowdown through; the reason is reported.
    loose = Thresholds().with_values("noisy host", decode_drop=0.5, memory_growth=0.5)
    relaxed = regressions(frame, before_stack, after_stack, loose, DEFAULT_PRICES)
    assert "org/slower" not in {c.model for c in relaxed.regressions}
    text = render_markdown(relaxed, "s3://bucket/results")
    assert "decode tokens/s dropped by more than 50%: noisy host" in text
    html = MarkdownIt("commonmark").enable("table").render(render_markdown(report))
    assert "<h3>ERROR compile (1)</h3>" in html and "<h3>FAIL tokens, kl (1)</h3>" in html
    assert f"<code>model-support reproduce {after['org/regressed'].run_id}</code>" in html
    assert "<td><code>org/regressed</code></td>" in html
    assert (
        "<td>first diverging module, from decode step 18: model.layers.0.mlp.act_fn "
        "(SiLUActivation), error ratio 125</td>" in html
    )
    assert "<h1>Regressions: neuronx-cc 2.27.1000.0 · transformers 5.24.0 -&gt; neuronx-cc" in html


def test_one_run_is_not_a_regression_until_re_runs_agree(store: ResultsStore) -> None:
    """A worse result seen once is unconfirmed (with what it needs); a speed drop from one
    sample a side is never a regression, however large."""
    _two_stacks(store, times=1)
    frame = read_history(store)
    pair = default_pair(stacks(frame))
    report = regressions(frame, *pair, Thresholds(), DEFAULT_PRICES)
    assert report.regressions == []
    pending = {(c.model, c.kind): c for c in report.unconfirmed}
    assert set(pending) == {
        ("org/regressed", "regression"), ("org/miscompiled", "regression"),
        ("org/slower", "slower"), ("org/slower", "memory"),
    }  # fmt: skip
    assert pending["org/regressed", "regression"].needs == (
        "1 of 3 agreeing runs on the newer stack: 2 more re-run(s) (model-support regressions "
        "--confirm)"
    )
    assert pending["org/slower", "slower"].needs == (
        "3 PASS runs a stack to compare (it has 1 and 1): one sample never makes a speed regression"
    )
    # Fewer re-runs asked for: one run is enough (the policy is the caller's).
    eager = regressions(
        frame, *pair, Thresholds(), DEFAULT_PRICES, confirmation=Confirmation(reruns=0)
    )
    assert {c.model for c in eager.regressions} == {"org/regressed", "org/miscompiled"}


def test_samples_within_their_own_spread_are_no_regression(store: ResultsStore) -> None:
    """Medians 12% apart are no slowdown when each side's own samples spread wider than that."""
    before = make_record("org/noisy", finished=T0)
    after = make_record("org/noisy", finished=T0 + timedelta(days=7))
    for run in repeated(before, CC_OLD, 3, figures=[{"decode": v} for v in (60.0, 80.0, 100.0)]):
        store.add(run)
    for run in repeated(after, CC_NEW, 3, figures=[{"decode": v} for v in (55.0, 70.0, 90.0)]):
        store.add(run)
    store.materialize()
    frame = read_history(store)
    report = regressions(frame, *default_pair(stacks(frame)), Thresholds(), DEFAULT_PRICES)
    assert report.regressions == [] and report.unconfirmed == []


def test_a_model_whose_runs_disagree_on_one_stack_is_flaky_never_a_regression_or_a_fix(
    store: ResultsStore,
) -> None:
    """A same-stack FAIL -> PASS re-run is not dropped: the model is flaky, with its runs."""
    store.add(on_compiler(make_record("org/wobbly", finished=T0), CC_OLD))
    first = failed(make_record("org/wobbly", finished=T0 + timedelta(days=1)), [VerdictCheck.KL])
    second = make_record("org/wobbly", finished=T0 + timedelta(days=2))
    for record in (first, second):
        store.add(on_compiler(record, CC_NEW))
    old_fail = on_compiler(make_record("org/other", Result.ERROR, finished=T0), CC_OLD)
    old_pass = on_compiler(make_record("org/other", finished=T0 + timedelta(hours=1)), CC_OLD)
    new_pass = on_compiler(make_record("org/other", finished=T0 + timedelta(days=1)), CC_NEW)
    for record in (old_fail, old_pass, new_pass):
        store.add(record)
    store.materialize()
    frame = read_history(store)
    report = regressions(frame, *default_pair(stacks(frame)), Thresholds(), DEFAULT_PRICES)
    assert report.regressions == report.fixes == report.unconfirmed == []
    assert [(f.model, f.stack.split(" · ")[0], f.outcomes) for f in report.flaky] == [
        ("org/other", f"neuronx-cc {CC_OLD}", "ERROR/compile, PASS"),
        ("org/wobbly", f"neuronx-cc {CC_NEW}", "FAIL, PASS"),
    ]
    assert [r.run_id for r in report.flaky[1].runs] == [first.run_id, second.run_id]
    text = render_markdown(report)
    assert "## Flaky (runs on one stack disagree)" in text and f"`{first.run_id}`" in text
    # A new Hub revision starts afresh: its runs are not judged against the old weights'.
    moved = on_compiler(
        make_record("org/wobbly", finished=T0 + timedelta(days=3)), CC_NEW, revision="c" * 40
    )
    store.add(moved)
    store.materialize()
    frame = read_history(store)
    report = regressions(frame, *default_pair(stacks(frame)), Thresholds(), DEFAULT_PRICES)
    assert "org/wobbly" not in {f.model for f in report.flaky}


def test_the_markdown_shows_data_as_data() -> None:
    report = Report(
        before="a|b",
        after="*new* <b>",
        compared=1,
        thresholds=Thresholds(),
        regressions=[
            Change(
                kind="regression", group="ERROR `compile` | x", model="org/m|`x`",
                task="text-generation", before="PASS", after="ERROR/compile",
                detail="[link](http://x) &amp;", before_run_id="r1", after_run_id="r2",
                reproduce="model-support reproduce r2",
            )
        ],
    )  # fmt: skip
    html = MarkdownIt("commonmark").enable("table").render(render_markdown(report))
    assert "<h1>Regressions: a|b -&gt; *new* &lt;b&gt;</h1>" in html
    assert "<h3>ERROR `compile` | x (1)</h3>" in html
    assert "<td><code>org/m|`x`</code></td>" in html
    assert "<td>[link](http://x) &amp;amp;</td>" in html


def test_compile_time_is_compared_only_between_runs_that_met_the_cache_alike(
    store: ResultsStore,
) -> None:
    def cached(record: RunRecord) -> RunRecord:
        hit = record.document.compilation.model_copy(update={"cache_hit": True})
        document = record.document.model_copy(update={"compilation": hit})
        return record.model_copy(update={"document": document})

    cold_old = repeated(
        make_record("org/m", finished=T0),
        CC_OLD,
        3,
        figures=[{"compile_s": s} for s in (10.0, 10.5, 9.8)],
    )
    warm_new = repeated(
        make_record("org/m", finished=T0 + timedelta(days=1)),
        CC_NEW,
        3,
        figures=[{"compile_s": 100.0}] * 3,
    )
    for record in cold_old + [cached(r) for r in warm_new]:
        store.add(record)
    store.materialize()
    frame = read_history(store)
    pair = default_pair(stacks(frame))
    # Cold compiles on one stack, cache hits on the other: nothing to compare.
    report = regressions(frame, *pair, Thresholds(), DEFAULT_PRICES)
    assert report.regressions == report.unconfirmed == []
    cold_new = repeated(
        make_record("org/m", finished=T0 + timedelta(days=2)),
        CC_NEW,
        3,
        figures=[{"compile_s": s} for s in (100.0, 98.0, 103.0)],
    )
    for record in cold_new:
        store.add(record)
    store.materialize()
    frame = read_history(store)
    (change,) = regressions(frame, *pair, Thresholds(), DEFAULT_PRICES).regressions
    assert change.kind == "compile-time"
    assert change.detail is not None and change.detail.startswith("compile 10.0 -> 100.0 s (+900%)")
    assert change.detail.endswith("; cold compiles")


def test_stacks_are_named_by_label_version_or_compiler_and_ambiguity_is_refused(
    store: ResultsStore,
) -> None:
    store.add(on_compiler(make_record("org/a"), CC_OLD))
    store.add(make_record("org/a", neuron=False))
    store.add(
        make_record(
            "org/b", neuron=False, stack=CPU_STACK.model_copy(update={"transformers": "5.25.0"})
        )
    )
    store.materialize()
    known = stacks(read_history(store))
    assert find_stack(CC_OLD, known).compiler_version == CC_OLD
    assert find_stack("inductor 2.13.0/5.25.0", known).library_version == "5.25.0"
    with pytest.raises(StackNotFound, match="'inductor' names 2 stacks"):
        find_stack("inductor", known)
    with pytest.raises(
        StackNotFound, match=r"no stack is named 'nope'; the stacks are: .*neuronx-cc"
    ):
        find_stack("nope", known)
    assert NEURON_STACK.neuronx_cc == CC_NEW


def test_the_history_file_holds_one_model_per_row_group_range(store: ResultsStore) -> None:
    for i in range(30):
        store.add(
            on_compiler(make_record(f"org/m{i:02d}", finished=T0 + timedelta(seconds=i)), CC_NEW)
        )
    store.materialize()
    metadata = pq.ParquetFile(store.history_path()).metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    one = read_history(store, "org/m07")
    assert list(one.model_id) == ["org/m07"]


def test_an_s3_store_keeps_its_history_and_compares_its_stacks(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history lives beside the matrix on an object store too (moto's S3 server)."""
    import uuid

    import s3fs

    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"history-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    store = ResultsStore(f"s3://{bucket}/results")
    store.add(on_compiler(make_record("org/a", finished=T0), CC_OLD))
    store.materialize()
    store.add(
        on_compiler(make_record("org/a", Result.ERROR, finished=T0 + timedelta(days=1)), CC_NEW)
    )
    store.materialize()
    assert store.history_path() == f"s3://{bucket}/results/history/runs.parquet"
    known = read_stacks(store)
    report = regressions(
        read_stack_runs(store, [k.stack for k in known]),
        known[0].stack,
        known[1].stack,
        Thresholds(),
        DEFAULT_PRICES,
        confirmation=Confirmation(reruns=0),
    )
    assert [(c.model, c.after) for c in report.regressions] == [("org/a", "ERROR/compile")]


def test_a_cpu_run_is_never_priced_as_trainium_core_hours(store: ResultsStore) -> None:
    """A table's default instance prices a Neuron run that names no instance, never a CPU run."""
    neuron = make_record("org/n", stack=NEURON_STACK.model_copy(update={"instance_type": None}))
    cpu = make_record("org/c", neuron=False)
    for record in (neuron, cpu):
        store.add(record)
    store.materialize()
    assumed = prices_from_mapping({"default_instance_type": "trn1.32xlarge"})
    costs = {
        model: model_history(store.history(), model, None, assumed).cost_usd.iloc[0]
        for model in ("org/n", "org/c")
    }
    assert costs["org/n"] == pytest.approx(120 / 3600 * 21.50 / 32)
    assert pd.isna(costs["org/c"])


def test_a_bug_reports_evidence_says_where_the_fail_starts() -> None:
    """The bug body's line for a FAIL (read from the matrix row) says the decode step, as the
    change's detail and the record's summary do; an older row without a phase keeps the old
    wording."""
    from model_support.evidence import first_divergence

    row = {
        "first_divergence": "model.layers.0.mlp.act_fn",
        "first_divergence_kind": "SiLUActivation",
        "first_divergence_phase": "decode",
        "first_divergence_step": 18,
        "first_divergence_ratio": 125.3,
    }
    assert first_divergence(row) == (
        "first diverging module, from decode step 18: model.layers.0.mlp.act_fn "
        "(SiLUActivation), error ratio 125"
    )
    older = {**row, "first_divergence_phase": None, "first_divergence_step": None}
    assert first_divergence(older) == (
        "first diverging module: model.layers.0.mlp.act_fn (SiLUActivation), error ratio 125"
    )
    assert first_divergence({"first_divergence": None}) is None
