"""Matrix file size: Parquet bytes per row, as the store writes them and as it wrote them before.

Run: python benchmarks/matrix_size.py [--rows 1000 100000]. Every row is a realistic, distinct
test: its own model, revision (a 40-hex commit), dtype, cores and prompts, so its run.py is the
real rendered one (about 160 KB, unique in its config block); its verification holds the
per-position figures of 3 prompts x 32 tokens drawn at random (what run.py writes; drawn once
for a pool of VERIFICATIONS rows, more than a row group holds, so no page or dictionary sees
one twice), its packages a realistic environment. The rows go through ``record_to_row`` once (the template) and
differ where tests differ. Rows are written in row groups as the store writes them, streamed, so
100,000 rows of 190 KB need no 19 GB table; each codec writes the same rows:

- before: pyarrow's defaults (snappy, 1 MiB pages), what the store wrote first;
- zstd everywhere: zstd level 3 for every column, pages as large as a row group (the store's
  second encoding, which made the viewer's list reads slower);
- after: ``dataset.matrix_write_options`` (zstd for run_py and the verification JSON, snappy
  for the rest, pages as large as a row group).

Target: under 5 KB per row. Prints bytes per row of each, after / before, and the share of
run_py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from model_support.config import RunConfig
from model_support.dataset import (
    MATRIX_ROW_GROUP_BYTES,
    MATRIX_SCHEMA,
    matrix_row_group_rows,
    matrix_write_options,
    record_to_row,
)
from model_support.records import ResultDocument, RunRecord, Stack, Timings, Verification
from model_support.script import render_script

TARGET_BYTES_PER_ROW = 5 * 1024
PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n"]
RESULTS = ["PASS", "PASS", "PASS", "FAIL", "ERROR", "TIMEOUT", "EXCLUDED"]
DTYPES = ["bfloat16", "bfloat16", "float16", "float32"]
VERIFICATIONS = 1_000
BEFORE, EVERYWHERE, AFTER = "before (snappy)", "zstd everywhere", "after (per column)"


def verification(rng: random.Random, prompts: int = 3, tokens: int = 32) -> dict[str, Any]:
    """What run.py's verdict records for a text-generation run: per-position figures (6
    significant digits), per-prompt statistics and the headline ratios, all drawn at random."""

    def figure() -> float:
        return float(f"{rng.lognormvariate(-3, 1.5):.6g}")

    positions = []
    for p in range(prompts):
        for t in range(tokens):
            token = rng.randrange(32_000)
            reference = token if rng.random() < 0.95 else rng.randrange(32_000)
            positions.append(
                {
                    "prompt": p,
                    "position": t,
                    "token": token,
                    "reference_token": reference,
                    # the reference's preference for its argmax over the token: 0 when they agree
                    "margin": 0.0 if reference == token else round(rng.expovariate(0.5), 6),
                    "baseline_deviation": round(figure(), 6),
                    "device_deviation": round(figure(), 6),
                    "baseline_kl": figure(),
                    "device_kl": figure(),
                    "router_tie": False,
                    "excused": False,
                    "verdict": "match",
                }
            )
    statistics = []
    for p in range(prompts):
        stats: dict[str, Any] = {"prompt": p, "router_ties": 0}
        for check in ("median", "q90", "peak", "kl"):
            stats[f"{check}_device"] = figure()
            stats[f"{check}_baseline"] = figure()
            stats[f"{check}_ratio"] = round(rng.uniform(0.5, 2.5), 6)
        statistics.append(stats)
    return {
        "passed": True,
        "exact": True,
        "method": "tokens",
        "failed_checks": [],
        "error_ratio": round(rng.uniform(0.5, 2.0), 6),
        "q90_ratio": round(rng.uniform(0.5, 2.0), 6),
        "peak_ratio": round(rng.uniform(0.5, 2.0), 6),
        "kl_ratio": round(rng.uniform(0.5, 2.0), 6),
        "mismatches": 0,
        "near_ties": 0,
        "bad_tokens": 0,
        "prompt_statistics": statistics,
        "positions": positions,
    }


@functools.cache
def template_row() -> dict[str, Any]:
    """One matrix row of a complete text-generation PASS, as record_to_row makes it."""
    packages = [f"package-{i}=={i % 7}.{i % 13}.{i % 5}" for i in range(96)]
    document = ResultDocument(
        model="org/model",
        task="text-generation",
        backend="neuron",
        compile_backend="neuron",
        result="PASS",
        timings=Timings(wall_time_s=100.0, load_s=20.0, first_generate_s=80.0),
        stack=Stack(torch="2.14.0", transformers="5.24.0", neuronx_cc="2.28.7631.0"),
        packages=packages,
        verification=Verification.model_validate(verification(random.Random(0))),
        prompts=PROMPTS,
        text=["a generated text of some length " * 3] * 3,
    )
    return record_to_row(RunRecord(run_id="bench", run_py="", document=document))


@functools.cache
def verification_pool() -> tuple[str, ...]:
    """VERIFICATIONS distinct verification documents as JSON (drawing them is slow)."""
    rng = random.Random(2)
    return tuple(json.dumps(verification(rng)) for _ in range(VERIFICATIONS))


def rows(count: int, seed: int = 1) -> list[dict[str, Any]]:
    """``count`` distinct rows (see the module's docstring)."""
    rng = random.Random(seed)
    template = template_row()
    verifications = verification_pool()
    start = datetime(2026, 11, 1, tzinfo=UTC)
    out = []
    for i in range(count):
        model = f"org{i % 700}/model-{i}"
        revision = f"{rng.getrandbits(160):040x}"
        cores = rng.choice([1, 1, 1, 2, 4, 8, 16])
        config = RunConfig(
            model=model,
            revision=revision,
            dtype=rng.choice(DTYPES),  # type: ignore[arg-type]
            cores=cores,
            parallelism="none" if cores == 1 else "tensor",  # type: ignore[arg-type]
            prompts=[*PROMPTS[:2], f"{PROMPTS[2]}# case {i}"],
        )
        row = dict(template)
        started = start + timedelta(seconds=37 * i)
        row.update(
            model_id=model,
            model_path=model,
            revision=revision,
            resolved_revision=revision,
            run_id=f"{started:%Y%m%dT%H%M%S%fZ}-{rng.getrandbits(48):012x}",
            result=RESULTS[i % len(RESULTS)],
            neuron_cores=cores,
            dtype=config.dtype,
            wall_time_s=rng.uniform(20, 3000),
            compile_time_s=rng.uniform(10, 2000),
            load_time_s=rng.uniform(5, 600),
            steady_generate_s=rng.uniform(0.1, 10),
            decode_tokens_per_s=rng.uniform(5, 500),
            peak_device_memory_bytes=rng.randrange(2**28, 2**36),
            error_ratio=round(rng.uniform(0.5, 2.0), 6),
            verification_json=verifications[(seed + i) % len(verifications)],
            prompts=config.prompts,
            run_py=render_script(config),
            started_at=started,
            finished_at=started + timedelta(seconds=rng.uniform(20, 3000)),
            recorded_at=started + timedelta(seconds=3100),
        )
        out.append(row)
    return out


def measure(count: int) -> tuple[dict[str, int], dict[str, float]]:
    """Write ``count`` rows with each codec, streamed in row groups into byte-counting streams
    (100,000 rows in snappy are ~8 GB): each file's bytes, its run_py column's bytes and the
    text's own bytes; and the seconds each codec spent writing."""
    writers_options = {
        BEFORE: {},
        EVERYWHERE: {
            "compression": "zstd",
            "compression_level": 3,
            "data_page_size": MATRIX_ROW_GROUP_BYTES,
        },
        AFTER: matrix_write_options(MATRIX_SCHEMA),
    }
    streams = {name: pa.MockOutputStream() for name in writers_options}
    footers: dict[str, list[pq.FileMetaData]] = {name: [] for name in writers_options}
    writers = {
        name: pq.ParquetWriter(
            streams[name], MATRIX_SCHEMA, metadata_collector=footers[name], **options
        )
        for name, options in writers_options.items()
    }
    write_s = dict.fromkeys(writers_options, 0.0)
    group_rows = None
    done = 0
    run_py_bytes = 0
    while done < count:
        chunk = rows(min(count - done, group_rows or 64), seed=done + 1)
        table = pa.Table.from_pylist(chunk, schema=MATRIX_SCHEMA)
        group_rows = group_rows or matrix_row_group_rows(table)
        run_py_bytes += sum(len(row["run_py"]) for row in chunk)
        for name, writer in writers.items():
            start = time.perf_counter()
            writer.write_table(table, row_group_size=len(chunk))
            write_s[name] += time.perf_counter() - start
        done += len(chunk)
    for writer in writers.values():
        writer.close()
    sizes = {name: stream.size() for name, stream in streams.items()}
    sizes["run_py text"] = run_py_bytes
    column = MATRIX_SCHEMA.get_field_index("run_py")  # a flat column: its leaf's index too
    for name, (metadata,) in footers.items():
        assert metadata.schema.column(column).path == "run_py"
        sizes[f"{name} run_py column"] = sum(
            metadata.row_group(g).column(column).total_compressed_size
            for g in range(metadata.num_row_groups)
        )
    return sizes, write_s


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000])
    args = parser.parse_args()
    print(f"load average before (1, 5, 15 min): {load()} on {os.cpu_count()} CPUs", flush=True)
    for count in args.rows:
        start = time.perf_counter()
        sizes, write_s = measure(count)
        before, after = sizes[BEFORE], sizes[AFTER]
        print(f"{count:,} rows (built and written in {time.perf_counter() - start:.0f} s)")
        print(f"  run.py text per row          {sizes['run_py text'] / count / 1024:9.1f} KB")
        for name in (BEFORE, EVERYWHERE, AFTER):
            size = sizes[name]
            share = sizes[f"{name} run_py column"] / size
            print(
                f"  {name:<28} {size / count / 1024:9.2f} KB per row, {size / 2**20:9.1f} MiB "
                f"(run_py {share:.0%} of it), written in {write_s[name]:.1f} s"
            )
        verdict = "ok" if after / count < TARGET_BYTES_PER_ROW else "OVER"
        print(
            f"  after / before {after / before:.3f}; target < "
            f"{TARGET_BYTES_PER_ROW / 1024:.0f} KB per row: {verdict}",
            flush=True,
        )
        print(f"  load average (1, 5, 15 min): {load()}", flush=True)


if __name__ == "__main__":
    main()
