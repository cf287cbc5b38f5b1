"""History and regressions at scale: 100,000 runs over 20 stacks.

Run: python benchmarks/history_scale.py [--models 4500] [--stacks 20] [--reruns 10000]
[--repeat 5]. Builds a store's history file (history/runs.parquet) in a temporary directory:
rows as the store makes them from records (dataset.records_to_table of real RunRecords, one
template varied per row), sorted and written by the store's own writer (store.history_bytes).
Then times, each the best of ``--repeat``:

- warm (in one process, the data read once): the comparison of the two newest stacks and one
  model's history, from reading the file to the answer;
- cold: `model-support regressions` and `model-support history` as new processes (imports
  included), what a user or a CI job waits for;
- the viewer: the History and Regressions views' first page on cold caches, and a rerun.

Targets: regressions and history under 1 s warm and 3 s cold; the viewer's views
within the targets of the existing ones (first page <= 0.3 s, a rerun well under it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from viewer_scale import best_ms, load  # the same timing and report helpers

from model_support.dataset import HISTORY_SCHEMA, MatrixKey, records_to_table
from model_support.records import Memory, ResultDocument, RunRecord, Stack, Timings
from model_support.store import HISTORY_DIR, HISTORY_NAME, _history_order, history_bytes

APP = str(Path(__file__).resolve().parents[1] / "viewer" / "app.py")
CLI = str(Path(sys.executable).with_name("model-support"))
TARGETS_MS = {"warm": 1000.0, "cold": 3000.0, "first page": 300.0}
RESULTS = ["PASS"] * 8 + ["FAIL", "ERROR"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def report(label: str, timing: float | tuple[float, float], target: str | None = None) -> None:
    ms, cpu = timing if isinstance(timing, tuple) else (timing, None)
    line = f"{label:<58} {ms:9.1f} ms" + (f" (CPU {cpu:7.1f} ms)" if cpu is not None else " " * 19)
    if target:
        limit = TARGETS_MS[target]
        line += f"   {ms / limit:5.2f}x of the {target} target ({limit:.0f} ms): "
        line += "ok" if ms <= limit else "OVER"
    print(line, flush=True)


def build(root: Path, models: int, stacks: int, reruns: int) -> int:
    """``models`` models on each of ``stacks`` neuronx-cc versions, plus ``reruns`` re-runs on
    the newest one; returns the number of runs."""
    template = RunRecord(
        run_id="template",
        run_py="# run.py\n",
        document=ResultDocument(
            model="org/model",
            task="text-generation",
            backend="neuron",
            compile_backend="neuron",
            cores=2,
            result="PASS",
            timings=Timings(wall_time_s=100.0, compile_s=80.0, decode_tokens_per_s=50.0),
            memory=Memory(peak_device_memory_bytes=3 * 2**30),
            stack=Stack(
                torch="2.13.0",
                transformers="5.24.0",
                neuronx_cc="2.28.0.0",
                instance_type="trn2.48xlarge",
            ),
            started_at=T0,
            finished_at=T0 + timedelta(minutes=5),
        ),
    )
    base = records_to_table(
        [template], [MatrixKey("neuronx-cc", "2.28.0.0", "transformers", "5.24.0")], HISTORY_SCHEMA
    )
    runs = models * stacks + reruns
    row = {name: base.column(name)[0].as_py() for name in HISTORY_SCHEMA.names}
    columns = {name: [row[name]] * runs for name in HISTORY_SCHEMA.names}
    model_of = [i % models for i in range(runs)]
    stack_of = [min(i // models, stacks - 1) for i in range(runs)]  # re-runs: the newest stack
    columns["model_id"] = [f"org{m % 300}/model-{m}" for m in model_of]
    columns["compiler_version"] = [f"2.{20 + s}.0.0" for s in stack_of]
    columns["run_id"] = [f"run-{i:07d}" for i in range(runs)]
    columns["result"] = [
        RESULTS[(m * 7 + s * 3 + i) % len(RESULTS)]
        for i, (m, s) in enumerate(zip(model_of, stack_of, strict=True))
    ]
    columns["error_class"] = [("compile" if r == "ERROR" else None) for r in columns["result"]]
    columns["failed_checks"] = [(["tokens"] if r == "FAIL" else []) for r in columns["result"]]
    columns["decode_tokens_per_s"] = [50.0 - (i % 11) for i in range(runs)]
    when = [T0 + timedelta(days=s, seconds=i) for i, s in enumerate(stack_of)]
    columns["started_at"] = when
    columns["finished_at"] = [w + timedelta(minutes=5) for w in when]
    columns["recorded_at"] = [w + timedelta(minutes=6) for w in when]
    table = _history_order(pa.table(columns, schema=HISTORY_SCHEMA))
    (root / HISTORY_DIR).mkdir(parents=True)
    (root / HISTORY_DIR / HISTORY_NAME).write_bytes(history_bytes(table))
    return runs


def cold(args: list[str]) -> tuple[float, float]:
    """A command as a new process: (wall, its CPU) in milliseconds, imports included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([CLI, *args], capture_output=True, text=True, check=False)
    elapsed = 1000 * (time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, 1000 * cpu


def time_page(view: str, params: dict[str, str], repeat: int) -> None:
    """A view's first page on cold caches (a new session), and a rerun, through AppTest."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    page = AppTest.from_file(APP, default_timeout=120)
    page.query_params.update(params)
    page.run()  # AppTest's own start: it scans installed packages for components
    assert not page.exception, page.exception

    def fresh_page() -> None:
        nonlocal page
        st.cache_data.clear()
        st.cache_resource.clear()
        scanned = getattr(page, "_bidi_component_manager", None)
        page = AppTest.from_file(APP, default_timeout=120)
        if scanned is not None:
            page._bidi_component_manager = scanned
        page.query_params.update(params)

    report(
        f"page: {view} first load (cold data cache)",
        best_ms(lambda: page.run(), repeat, before=fresh_page),
        "first page",
    )
    assert not page.exception, page.exception
    report(f"page: {view} rerun (warm cache)", best_ms(lambda: page.run(), repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=4500)
    parser.add_argument("--stacks", type=int, default=20)
    parser.add_argument("--reruns", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before (1, 5, 15 min): {load()} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        runs = build(root, args.models, args.stacks, args.reruns)
        size = (root / HISTORY_DIR / HISTORY_NAME).stat().st_size
        report(
            f"build a history of {runs:,} runs over {args.stacks} stacks ({size / 2**20:.1f} MiB)",
            1000 * (time.perf_counter() - start),
        )
        from model_support.history import (
            Thresholds,
            default_pair,
            model_history,
            read_history,
            read_stack_runs,
            read_stacks,
            regressions,
            render_markdown,
        )
        from model_support.pricing import DEFAULT_PRICES
        from model_support.store import ResultsStore

        store = ResultsStore(root)
        repeat = args.repeat
        found: list[int] = []

        def compare() -> None:
            pair = default_pair(read_stacks(store))
            frame = read_stack_runs(store, pair)
            report_ = regressions(frame, *pair, Thresholds(), DEFAULT_PRICES)
            render_markdown(report_)
            found[:] = [len(report_.regressions), len(report_.fixes), report_.compared]

        report(
            "regressions: read, order stacks, compare, markdown", best_ms(compare, repeat), "warm"
        )
        print(f"  regressions {found[0]:,}, fixes {found[1]:,}, compared {found[2]:,}")
        model = "org7/model-7"
        report(
            "history of one model: read (pushdown), flips, cost",
            best_ms(
                lambda: model_history(read_history(store, model), model, None, DEFAULT_PRICES),
                repeat,
            ),
            "warm",
        )
        report(
            "cold: model-support regressions --json",
            min(cold(["regressions", "--results", str(root), "--json"]) for _ in range(3)),
            "cold",
        )
        report(
            "cold: model-support history MODEL",
            min(cold(["history", model, "--results", str(root)]) for _ in range(3)),
            "cold",
        )

        os.environ["MODEL_SUPPORT_RESULTS"] = str(root)
        os.environ["MODEL_SUPPORT_HUB_ENDPOINT"] = "http://127.0.0.1:9"
        for view, params in (
            ("History", {"view": "history", "model": model}),
            ("Regressions", {"view": "regressions"}),
        ):
            time_page(view, params, repeat)
    print(f"load average after (1, 5, 15 min): {load()}")


if __name__ == "__main__":
    main()
