"""Concurrent writers into one results store, then materialize: throughput, completeness, speed.

Usage: python benchmarks/store_concurrency.py [--writers 16] [--records 6250] [--root DIR] [--reuse]

Each writer process adds ``--records`` records of distinct models (16 x 6,250 = 100,000). Then:
a full materialize (no index yet: every record is read), and adding one record at a time to
the full store (an incremental materialize: only the new record is read and only its matrix
file rewritten). Checks that every record is in the matrix, and prints figures and targets:
full materialize of 100,000 records <= 10 s, one added record <= 1 s.

``--reuse`` keeps the records already under ``--root`` (from an earlier run) and skips writing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from model_support.records import ResultDocument, RunRecord, Stack, Timings, new_run_id
from model_support.store import DATA_DIR, INDEX_DIR, ResultsStore
from model_support.vocabulary import Result

STACK = Stack(
    torch="2.13.0", transformers="5.24.0", torch_neuronx="2.13.0.1", neuronx_cc="2.28.7631.0"
)
FULL_TARGET_S = 10.0
ADD_TARGET_S = 1.0


def _record(model: str, i: int) -> RunRecord:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    return RunRecord(
        run_id=new_run_id(),
        run_py="# run.py\n",
        document=ResultDocument(
            model=model,
            task="text-generation",
            backend="neuron",
            compile_backend="neuron",
            result=Result.PASS,
            stack=STACK,
            timings=Timings(wall_time_s=10.0 + i),
            finished_at=start + timedelta(seconds=i),
        ),
    )


def _writer(
    root: str, writer: int, count: int, barrier: multiprocessing.synchronize.Barrier
) -> None:
    store = ResultsStore(root)
    records = [_record(f"org/model-{writer:02d}-{i:04d}", i) for i in range(count)]
    barrier.wait()
    for record in records:
        store.add(record)


def _write(root: str, writers: int, per_writer: int) -> float:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(writers + 1)
    workers = [
        context.Process(target=_writer, args=(root, w, per_writer, barrier)) for w in range(writers)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        raise SystemExit(f"{len(failed)} writer(s) failed: exit codes {failed}")
    return time.perf_counter() - began


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (materialize's helpers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _timed(action: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``action()``."""
    wall, cpu = time.perf_counter(), _cpu()
    action()
    return time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    """Run the benchmark and print a line per phase, then the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--records", type=int, default=6250, help="records per writer")
    parser.add_argument("--root", default=None, help="store folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="keep the records under --root")
    parser.add_argument("--adds", type=int, default=5, help="single-record additions to time")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="store-bench-")
    store = ResultsStore(root)
    if args.reuse and any(True for _ in Path(root, "records").iterdir()):
        print(f"store: {root} (reusing its records)")
    else:
        expected = args.writers * args.records
        wrote = _write(root, args.writers, args.records)
        print(f"store: {root}")
        print(
            f"add:          {expected} records by {args.writers} processes in {wrote:.2f} s "
            f"({expected / wrote:.0f}/s)"
        )
    for derived in (DATA_DIR, INDEX_DIR):  # start from the records alone
        shutil.rmtree(Path(root, derived), ignore_errors=True)
    stored = sum(1 for _ in Path(root, "records").iterdir())

    full_wall, full_cpu = _timed(store.materialize)
    rows = len(store.matrix(columns=["model_id"]))
    print(
        f"materialize:  {rows} rows from {stored} records (full) in {full_wall:.2f} s (cpu {full_cpu:.2f} s)"
    )

    adds = []
    for i in range(args.adds):
        store.add(_record(f"org/added-{time.time_ns()}-{i}", i))
        adds.append(_timed(store.materialize))
    add_wall = statistics.median(w for w, _ in adds)
    add_cpu = statistics.median(c for _, c in adds)
    print(
        f"add one:      materialize after adding 1 record to {stored + args.adds - 1}: median "
        f"{add_wall:.2f} s (cpu {add_cpu:.2f} s) over {args.adds}"
    )
    idle_wall, _ = _timed(store.materialize)
    print(f"no change:    materialize with nothing new: {idle_wall:.2f} s")
    rows = len(store.matrix(columns=["model_id"]))
    if rows != stored + args.adds:
        raise SystemExit(f"lost records: {stored + args.adds} stored, matrix rows {rows}")
    print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        f"targets: full <= {FULL_TARGET_S:g} s -> {'met' if full_wall <= FULL_TARGET_S else 'NOT met'} "
        f"(ratio {full_wall / FULL_TARGET_S:.2f}); one added record <= {ADD_TARGET_S:g} s -> "
        f"{'met' if add_wall <= ADD_TARGET_S else 'NOT met'} (ratio {add_wall / ADD_TARGET_S:.2f})"
    )


if __name__ == "__main__":
    main()
