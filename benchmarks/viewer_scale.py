"""Viewer at scale: a 100k-row matrix, server-side time to load the page and to filter it.

Run: python benchmarks/viewer_scale.py [--rows 100000]. Builds the dataset in a temporary
directory with the real matrix schema (dataset.MATRIX_SCHEMA; rows as record_to_row makes
them), then times the viewer's own reading and query functions and a full AppTest page run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from model_support.dataset import MATRIX_SCHEMA, record_to_row
from model_support.records import ResultDocument, RunRecord, Stack, Timings
from model_support.store import MATRIX_KEY_METADATA
from model_support.viewer import queries
from model_support.viewer.data import list_stack_files, read_columns

RESULTS = ["PASS", "PASS", "PASS", "FAIL", "ERROR", "TIMEOUT", "EXCLUDED"]


def build(root: Path, rows: int) -> None:
    """One matrix file of ``rows`` rows (a real record's row, varied per model)."""
    template = record_to_row(
        RunRecord(
            run_id="bench",
            run_py="print('run')\n" * 200,
            document=ResultDocument(
                model="org/model",
                task="text-generation",
                backend="neuron",
                compile_backend="neuron",
                result="PASS",
                timings=Timings(wall_time_s=100.0),
                stack=Stack(torch="2.13.0", transformers="5.24.0", neuronx_cc="2.28.7631.0"),
                packages=[f"package{i}==1.0" for i in range(150)],
            ),
        )
    )
    columns = {name: [template[name]] * rows for name in MATRIX_SCHEMA.names}
    columns["model_id"] = [f"org{i % 500}/model-{i}" for i in range(rows)]
    columns["run_id"] = [f"run-{i}" for i in range(rows)]
    columns["result"] = [RESULTS[i % len(RESULTS)] for i in range(rows)]
    columns["error"] = [
        None if RESULTS[i % 7] == "PASS" else f"neuronx-cc failed at 0x{i:x} in /tmp/{i}/g.hlo"
        for i in range(rows)
    ]
    columns["wall_time_s"] = [float(i % 900) for i in range(rows)]
    table = pa.table(columns, schema=MATRIX_SCHEMA)
    key = {
        "compiler": "neuronx-cc",
        "compiler_version": "2.28.7631.0",
        "library": "transformers",
        "library_version": "5.24.0",
    }
    import json

    (root / "data").mkdir(parents=True)
    pq.write_table(
        table.replace_schema_metadata({MATRIX_KEY_METADATA: json.dumps(key).encode()}),
        root / "data" / "big.parquet",
    )


def timed(label: str, fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    print(f"{label:<45} {1000 * (time.perf_counter() - start):8.1f} ms")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        timed(f"build {args.rows:,}-row matrix", lambda: build(root, args.rows))
        uri = str(root)
        files = timed("list matrix files", lambda: list_stack_files(uri))
        paths = [f.path for f in files]
        frame = timed("read list columns", lambda: read_columns(uri, paths, queries.LIST_COLUMNS))
        timed("search 'model-12'", lambda: queries.search(frame, "model-12"))
        timed("results table", lambda: queries.results_table(frame))
        timed(
            "one model's details (pushdown filter)",
            lambda: read_columns(uri, paths, queries.DETAIL_COLUMNS, model_id="org7/model-7"),
        )
        triage_frame = timed(
            "read triage columns", lambda: read_columns(uri, paths, queries.TRIAGE_COLUMNS)
        )
        timed("triage", lambda: queries.triage(triage_frame))

        from streamlit.testing.v1 import AppTest

        os.environ["MODEL_SUPPORT_RESULTS"] = uri
        os.environ["MODEL_SUPPORT_HUB_ENDPOINT"] = "http://127.0.0.1:9"
        app = str(Path(__file__).resolve().parents[1] / "viewer" / "app.py")
        at = AppTest.from_file(app, default_timeout=120)
        at.query_params["view"] = "all"
        timed("page: first load (All results, cold cache)", at.run)
        timed("page: rerun (warm cache)", at.run)
        timed("page: search 'model-12'", lambda: at.text_input(key="q").input("model-12").run())
        print(f"rows shown after search: {len(at.dataframe[0].value):,}")


if __name__ == "__main__":
    main()
