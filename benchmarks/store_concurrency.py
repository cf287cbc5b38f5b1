"""Concurrent writers into one results store, then one materialize: throughput and completeness.

Usage: python benchmarks/store_concurrency.py [--writers 16] [--records 50] [--root DIR]

Each writer process adds ``--records`` records of distinct models; the script then checks that
every record is stored and that the matrix holds one row per model, and prints timings.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from datetime import UTC, datetime, timedelta

from model_support.records import ResultDocument, RunRecord, Stack, Timings, new_run_id
from model_support.store import ResultsStore
from model_support.vocabulary import Result

STACK = Stack(
    torch="2.13.0", transformers="5.24.0", torch_neuronx="2.13.0.1", neuronx_cc="2.28.7631.0"
)


def _writer(
    root: str, writer: int, count: int, barrier: multiprocessing.synchronize.Barrier
) -> None:
    store = ResultsStore(root)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    records = [
        RunRecord(
            run_id=new_run_id(),
            run_py="# run.py\n",
            document=ResultDocument(
                model=f"org/model-{writer:02d}-{i:04d}",
                task="text-generation",
                backend="neuron",
                compile_backend="neuron",
                result=Result.PASS,
                stack=STACK,
                timings=Timings(wall_time_s=10.0 + i),
                finished_at=start + timedelta(seconds=i),
            ),
        )
        for i in range(count)
    ]
    barrier.wait()
    for record in records:
        store.add(record)


def main() -> None:
    """Run the benchmark and print a one-line summary per phase."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--records", type=int, default=50, help="records per writer")
    parser.add_argument("--root", default=None, help="store URI (default: a temporary directory)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="store-bench-")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(args.writers + 1)
    workers = [
        context.Process(target=_writer, args=(root, w, args.records, barrier))
        for w in range(args.writers)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    wrote = time.perf_counter() - began
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        raise SystemExit(f"{len(failed)} writer(s) failed: exit codes {failed}")
    store = ResultsStore(root)
    expected = args.writers * args.records
    began = time.perf_counter()
    stored = sum(1 for _ in store.records())
    listed = time.perf_counter() - began
    began = time.perf_counter()
    store.materialize()
    materialized = time.perf_counter() - began
    rows = len(store.matrix(columns=["model_id"]))
    print(f"store: {root}")
    print(
        f"add:         {expected} records by {args.writers} processes in {wrote:.2f} s ({expected / wrote:.0f}/s)"
    )
    print(f"records():   {stored} read in {listed:.2f} s")
    print(f"materialize: {rows} rows in {materialized:.2f} s")
    if stored != expected or rows != expected:
        raise SystemExit(f"lost records: expected {expected}, stored {stored}, matrix rows {rows}")


if __name__ == "__main__":
    main()
