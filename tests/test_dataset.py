"""The matrix schema, record -> row conversion, file naming and the dataset card."""

from __future__ import annotations

import io
import json
import pathlib
import re
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from factories import CPU_STACK, NEURON_STACK, T0, make_record

from model_support.dataset import (
    COLUMNS,
    MATRIX_COLUMNS,
    MATRIX_SCHEMA,
    MatrixKey,
    column_table,
    matrix_file_stem,
    matrix_key,
    record_to_row,
    records_to_table,
)
from model_support.records import ResultDocument, RunRecord, Stack, Timings, Verification
from model_support.vocabulary import ExclusionReason, Result

FINISHED = T0
# torch as its CPU wheel names itself: the compiler version a CPU row shows
CPU_WHEEL_STACK = CPU_STACK.model_copy(update={"torch": "2.13.0+cpu"})


def record(
    backend: str | None = "neuron",
    compile_backend: str | None = "neuron",
    stack: Stack = NEURON_STACK,
    result: Result = Result.PASS,
    **document: object,
) -> RunRecord:
    """This file's record: a two-core tensor-parallel run of Llama-3.2-1B that a sweep's
    operator recorded; ``document`` replaces fields of its result document."""
    return make_record(
        "meta-llama/Llama-3.2-1B",
        result,
        stack=stack,
        cores=2,
        run_id="20261102T090000000000Z-abcdef123456",
        run_py="print('hi')\n",
        source="operator",
        labels={"sweep": "top-100"},
        document={
            "backend": backend,
            "compile_backend": compile_backend,
            "started_at": None,
            "timings": Timings(
                load_s=4.0, compile_s=80.0, wall_time_s=90.0, decode_tokens_per_s=55.5
            ),
            "text": ["first answer", "second answer"],
            "prompts": ["one", "two"],
            "verification": Verification(
                passed=True,
                exact=False,
                error_ratio=0.9,
                mismatches=1,
                near_ties=1,
                bad_tokens=0,
                first_mismatch=12,
                parameters={"max_error_ratio": 3.0},
            ),
            "packages": ["torch==2.13.0", "transformers==5.24.0"],
            **document,
        },
    )


def test_schema_is_derived_from_the_one_column_list() -> None:
    assert MATRIX_SCHEMA.names == [c.name for c in COLUMNS] == list(MATRIX_COLUMNS)
    assert len(set(MATRIX_COLUMNS)) == len(MATRIX_COLUMNS)
    required = {
        "model_id": pa.string(),
        "neuronx_cc": pa.string(),
        "neuron_cores": pa.int64(),
        "wall_time_s": pa.float64(),
        "peak_device_memory_bytes": pa.int64(),
        "verified_exact": pa.bool_(),
        "packages": pa.list_(pa.string()),
        "finished_at": pa.timestamp("us", tz="UTC"),
    }
    for name, data_type in required.items():
        assert MATRIX_SCHEMA.field(name).type == data_type, name
    for name in (
        "revision",
        "resolved_revision",
        "backend",
        "compiler",
        "compiler_version",
        "library",
        "library_version",
        "torch",
        "torch_neuronx",
        "parallelism",
        "dtype",
        "compile_backend",
        "result",
        "error_class",
        "error",
        "exclusion_reason",
        "compile_time_s",
        "load_time_s",
        "first_generate_s",
        "steady_generate_s",
        "decode_tokens_per_s",
        "host_peak_rss_bytes",
        "error_ratio",
        "mismatches",
        "near_ties",
        "bad_tokens",
        "first_mismatch",
        "verification_reason",
        "verification_json",
        "text",
        "stack",
        "run_py",
        "run_id",
        "source",
        "started_at",
        "recorded_at",
    ):
        assert name in MATRIX_COLUMNS, name


def test_neuron_row() -> None:
    rec = record()
    row = record_to_row(rec)
    assert list(row) == list(MATRIX_COLUMNS)
    assert (row["compiler"], row["compiler_version"], row["neuronx_cc"]) == (
        "neuronx-cc",
        "2.28.7631.0",
        "2.28.7631.0",
    )
    assert (row["library"], row["library_version"], row["torch_neuronx"]) == (
        "transformers",
        "5.24.0",
        "2.13.0.1",
    )
    assert (row["neuron_cores"], row["parallelism"], row["result"]) == (2, "tensor", "PASS")
    assert (row["compile_time_s"], row["load_time_s"], row["first_generate_s"]) == (80.0, 4.0, None)
    assert row["text"] == "first answer" and row["texts"] == ["first answer", "second answer"]
    assert Verification.model_validate_json(row["verification_json"]) == rec.document.verification
    assert Stack.model_validate_json(row["stack"]) == NEURON_STACK
    assert json.loads(row["labels"]) == {"sweep": "top-100"}
    assert (row["source"], row["run_py"], row["instance_type"]) == (
        "operator",
        "print('hi')\n",
        "trn2.48xlarge",
    )
    # the row the store writes (a column at a time) is this row, in the schema exactly
    table = records_to_table([rec], [matrix_key(rec)])
    assert table.schema.equals(MATRIX_SCHEMA)
    assert table.to_pylist() == [row]


def test_the_row_says_whether_the_pulled_cache_matched_the_compiler() -> None:
    from model_support.records import CacheTransferFigures, CompileCacheFigures

    def cache(matched: bool | None) -> CompileCacheFigures:
        return CompileCacheFigures(
            target="hf://buckets/aws-neuron/torch-neuronx-neff-cache",
            prefix="neuronxcc-2.28.7631.0",
            pull=CacheTransferFigures(prefix_matched=matched, entries=0),
        )

    cold = record_to_row(record(compile_cache=cache(False)))
    assert (cold["compile_cache_prefix"], cold["compile_cache_prefix_matched"]) == (
        "neuronxcc-2.28.7631.0",
        False,
    )
    assert record_to_row(record(compile_cache=cache(True)))["compile_cache_prefix_matched"]
    assert record_to_row(record())["compile_cache_prefix_matched"] is None  # no cache pulled


def test_the_row_says_which_compiler_flags_decided_the_float32_policy() -> None:
    flags = "--auto-cast=matmult --auto-cast-type=tf32"
    rec = make_record(stack=NEURON_STACK.model_copy(update={"compiler_flags": flags}))
    assert record_to_row(rec)["compiler_flags"] == flags
    assert record_to_row(make_record())["compiler_flags"] is None  # unset: neuronx-cc's defaults


def test_the_row_says_whether_the_timed_call_recompiled() -> None:
    from model_support.records import Compilation

    row = record_to_row(record(compilation=Compilation(graphs=9, timed_call_graphs=7)))
    assert (row["compiled_graphs"], row["timed_call_graphs"]) == (9, 7)
    assert record_to_row(record())["timed_call_graphs"] is None  # not measured


def test_cpu_and_custom_backend_placement() -> None:
    cpu = record_to_row(record(backend="cpu", compile_backend=None, stack=CPU_WHEEL_STACK))
    assert (cpu["compiler"], cpu["compiler_version"], cpu["neuronx_cc"]) == (
        "inductor",
        "2.13.0+cpu",
        None,
    )
    custom = record_to_row(
        record(backend="cpu", compile_backend="my_backends.fancy:compile", stack=CPU_WHEEL_STACK)
    )
    assert (custom["compiler"], custom["compiler_version"]) == (
        "my_backends.fancy:compile",
        "2.13.0+cpu",
    )
    # a CPU run on a machine that also has neuronx-cc installed is not a Trainium result
    mixed = record_to_row(record(backend="cpu", compile_backend="aot_eager", stack=NEURON_STACK))
    assert (mixed["compiler"], mixed["neuronx_cc"]) == ("aot_eager", None)
    # nothing recorded about where it ran (an infrastructure ERROR before run.py started)
    unknown = matrix_key(
        record(backend=None, compile_backend=None, stack=Stack(), result=Result.ERROR)
    )
    assert unknown == MatrixKey(None, None, "transformers", None)
    assert matrix_file_stem(unknown) == "unknown-unknown__transformers-unknown"


def test_file_names_are_flat_safe_and_distinct() -> None:
    neuron = matrix_key(record())
    assert matrix_file_stem(neuron) == "neuronx-cc-2.28.7631.0__transformers-5.24.0"
    keys = [
        MatrixKey("my_backends.fancy:compile", "2.13.0+cpu", "transformers", "5.24.0"),
        MatrixKey("my_backends.fancy/compile", "2.13.0+cpu", "transformers", "5.24.0"),
        MatrixKey("inductor", "2.13.0+cpu", "transformers", "5.24.0"),
        MatrixKey("inductor", "2.13.0_cpu", "transformers", "5.24.0"),
        MatrixKey("a-b", "c", "transformers", "5.24.0"),
    ]
    stems = [matrix_file_stem(k) for k in keys]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", s) for s in stems), stems
    assert "=" not in "".join(stems) and "/" not in "".join(stems)
    assert len(set(stems)) == len(stems)
    # keys that only collide after joining are told apart when asked to
    a, b = MatrixKey("a-b", "c", "transformers", "5"), MatrixKey("a", "b-c", "transformers", "5")
    assert matrix_file_stem(a) == matrix_file_stem(b)
    assert matrix_file_stem(a, disambiguate=True) != matrix_file_stem(b, disambiguate=True)


def test_timestamps_are_utc() -> None:
    naive = record(
        finished_at=datetime(2026, 11, 2, 9, 0),
        started_at=datetime(2026, 11, 2, 10, 0, tzinfo=timezone(timedelta(hours=2))),
    )
    row = record_to_row(naive)
    assert row["finished_at"] == FINISHED and row["finished_at"].tzinfo == UTC
    assert row["started_at"] == datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def test_null_only_columns_keep_their_types_on_disk() -> None:
    excluded = record(
        backend=None,
        compile_backend=None,
        result=Result.EXCLUDED,
        timings={},
        verification={},
        text=[],
        finished_at=None,
    ).model_copy(update={"exclusion_reason": ExclusionReason.TOO_LARGE})
    buffer = io.BytesIO()
    pq.write_table(records_to_table([excluded], [matrix_key(excluded)]), buffer)
    buffer.seek(0)
    table = pq.read_table(buffer)
    assert table.schema.equals(MATRIX_SCHEMA)
    assert table.column("wall_time_s").null_count == 1
    assert table.column("verified_exact").type == pa.bool_()
    assert table.column("exclusion_reason").to_pylist() == ["too-large"]


def test_card_column_table_comes_from_the_column_list() -> None:
    table = column_table()
    for column in COLUMNS:
        assert f"| `{column.name}` | {column.type} |" in table
        assert column.description.replace("|", "\\|") in table
    assert len(table.splitlines()) == len(COLUMNS) + 2


def test_a_fail_row_says_which_checks_failed_it_with_every_ratio() -> None:
    verification = Verification(
        passed=False,
        exact=True,
        failed_checks=["peak", "kl"],
        error_ratio=1.2,
        q90_ratio=1.1,
        peak_ratio=15.9,
        kl_ratio=12.5,
        router_ties=2,
        float32_precision="bf16",
        mismatches=0,
        near_ties=0,
        bad_tokens=0,
        reason="peak: prompt 1's largest logit error 1.9 is 15.9x the baseline's 0.12 (bound 4x)",
        parameters={"max_peak_ratio": 4.0, "max_kl_ratio": 10.0},
    )
    failed = record(result=Result.FAIL, dtype="float32", verification=verification)
    row = record_to_row(failed)
    assert row["failed_checks"] == ["peak", "kl"]
    assert (row["error_ratio"], row["q90_ratio"], row["peak_ratio"], row["kl_ratio"]) == (
        1.2,
        1.1,
        15.9,
        12.5,
    )
    assert (row["router_ties"], row["float32_precision"]) == (2, "bf16")
    table = records_to_table([failed], [matrix_key(failed)])
    assert table.schema.field("failed_checks").type == pa.list_(pa.string())
    # A PASS has no failed check; an older record without the new figures reads as nulls.
    old = record_to_row(record())
    assert old["failed_checks"] == [] and old["peak_ratio"] is None
    assert old["float32_precision"] is None


def test_card_says_what_a_pass_guarantees_and_which_check_fails_a_run() -> None:
    from model_support.dataset import render_card
    from model_support.vocabulary import PASS_BLIND_SPOTS, PASS_GUARANTEES, VerdictCheck

    card = render_card([])
    section = card.split("## The verdict: what a PASS guarantees", 1)[1].split("\n## ", 1)[0]
    for text in (*PASS_GUARANTEES, *PASS_BLIND_SPOTS):
        assert text in section
    for check in VerdictCheck:
        assert f"- `{check.value}`" in section
    assert "`failed_checks`" in section
    assert "neuron `ieee`, cuda `tf32`, cpu `ieee`" in section
    assert "(default bound 4x)" in section  # the peak bound, from VerificationConfig


def test_the_verification_docs_state_the_same_guarantees_as_the_card() -> None:
    from pathlib import Path

    from model_support.vocabulary import PASS_BLIND_SPOTS, PASS_GUARANTEES

    docs = (Path(__file__).resolve().parents[1] / "docs" / "verification.md").read_text()
    for text in (*PASS_GUARANTEES, *PASS_BLIND_SPOTS):
        assert f"- {text}" in docs


def test_card_says_how_every_task_is_verified() -> None:
    from model_support.dataset import render_card
    from model_support.vocabulary import Task

    section = render_card([]).split("### Other tasks", 1)[1].split("\n## ", 1)[0]
    for task in Task:
        assert f"- `{task.value}`:" in section
    for check in ("cosine", "norm", "ranking", "top1", "denoiser", "latents"):
        assert f"`{check}`" in section


@pytest.fixture(scope="module")
def harness_matrix(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[pathlib.Path, list[dict[str, object]]]:
    """A matrix file of 200 rows as the store writes it, each with its own whole run.py (the
    same harness but for its config block), and the rows written."""
    from model_support.config import RunConfig
    from model_support.dataset import MATRIX_SCHEMA, record_to_row, write_matrix
    from model_support.script import render_script

    rows = []
    for i in range(200):
        config = RunConfig(
            model=f"org{i % 7}/model-{i}", revision=f"{i:040x}", max_new_tokens=8 + i
        )
        document = ResultDocument(model=config.model, task="text-generation", result=Result.PASS)
        rows.append(
            record_to_row(
                RunRecord(run_id=f"run-{i}", run_py=render_script(config), document=document)
            )
        )
    table = pa.Table.from_pylist(rows, schema=MATRIX_SCHEMA)
    path = tmp_path_factory.mktemp("matrix") / "matrix.parquet"
    write_matrix(table, str(path))
    return path, rows


def test_matrix_files_store_the_repeated_run_py_almost_for_free(
    harness_matrix: tuple[pathlib.Path, list[dict[str, object]]],
) -> None:
    """Every row keeps its whole run.py (~120 KB, the same harness but for its config block);
    matrix files are written so the repetition costs next to nothing (snappy took ~55 KB a
    row), and they still read back exactly."""
    path, rows = harness_matrix
    assert path.stat().st_size / len(rows) < 5 * 1024
    assert pq.read_table(path).column("run_py").to_pylist() == [r["run_py"] for r in rows]


def test_only_the_long_texts_pay_zstd_the_viewers_list_columns_stay_snappy(
    harness_matrix: tuple[pathlib.Path, list[dict[str, object]]],
) -> None:
    """Only the long texts pay zstd's slower decoding: the columns the viewer's results list and
    triage read are snappy in every row group, as they were before run.py was compressed across
    rows, and no column is left uncompressed (a per-column codec missing a nested column's
    Parquet path, e.g. ``packages.list.element``, would write it raw)."""
    from model_support.viewer.queries import LIST_COLUMNS, TRIAGE_COLUMNS

    path, _ = harness_matrix
    metadata = pq.ParquetFile(path).metadata
    codecs: dict[str, set[str]] = {}
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            # A list column's chunks are its leaf (``failed_checks.list.element``): by column.
            name = chunk.path_in_schema.split(".")[0]
            codecs.setdefault(name, set()).add(chunk.compression)
    assert codecs["run_py"] == {"ZSTD"}
    assert codecs["verification_json"] == {"ZSTD"}
    read_by_lists = {*LIST_COLUMNS, *TRIAGE_COLUMNS}
    assert {name: codecs[name] for name in read_by_lists} == {
        name: {"SNAPPY"} for name in read_by_lists
    }
    assert not [name for name, used in codecs.items() if "UNCOMPRESSED" in used]
