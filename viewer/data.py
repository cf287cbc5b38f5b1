"""Reading what the viewer shows: the matrix files (only the columns a view needs) and the
curated list of selected models kept with the dataset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from model_support.dataset import MATRIX_COLUMNS, MATRIX_SCHEMA
from model_support.store import ResultsStore


class ViewerDataError(Exception):
    """The dataset (or its selected list) is not readable as the viewer expects; says what to fix."""


@dataclass(frozen=True)
class StackFile:
    """One matrix file: the versions it holds, its path, and a fingerprint that changes with it."""

    compiler: str | None
    compiler_version: str | None
    library: str
    library_version: str | None
    path: str
    fingerprint: str

    @property
    def compiler_label(self) -> str:
        """E.g. ``neuronx-cc 2.28.7631.0``."""
        return f"{self.compiler or 'unknown'} {self.compiler_version or 'unknown'}"

    @property
    def library_label(self) -> str:
        """E.g. ``transformers 5.24.0``."""
        return f"{self.library} {self.library_version or 'unknown'}"


def list_stack_files(results_uri: str) -> list[StackFile]:
    """The matrix files under ``results_uri``, each with a fingerprint (mtime/etag + size)."""
    store = ResultsStore(results_uri)
    files = []
    for matrix_file in store.matrix_files():
        info = store.fs.info(matrix_file.path)
        stamp = next(
            (
                str(info[k])
                for k in ("mtime", "LastModified", "last_commit", "ETag", "etag", "created")
                if info.get(k)
            ),
            "",
        )
        files.append(
            StackFile(
                compiler=matrix_file.compiler,
                compiler_version=matrix_file.compiler_version,
                library=matrix_file.library,
                library_version=matrix_file.library_version,
                path=matrix_file.path,
                fingerprint=f"{stamp}:{info.get('size')}",
            )
        )
    return files


@dataclass(frozen=True)
class UnreadableFile:
    """A Parquet file under the dataset's data/ that could not be read, and why."""

    path: str
    reason: str


def unlisted_data_files(results_uri: str, listed: Sequence[StackFile]) -> list[UnreadableFile]:
    """Parquet files under data/ that are not among the matrix files ``listed`` (the store
    leaves out a file it cannot read as a matrix file: a truncated upload, another tool's)."""
    store = ResultsStore(results_uri)
    data_dir = store.fs._strip_protocol(f"{store.root}/data")
    if not store.fs.isdir(data_dir):
        return []
    known = {store.fs._strip_protocol(f.path) for f in listed}
    return [
        UnreadableFile(path=path, reason="not readable as a matrix file")
        for path in sorted(store.fs.glob(f"{data_dir}/*.parquet"))
        if store.fs._strip_protocol(path) not in known
    ]


def read_columns_reporting(
    results_uri: str,
    paths: Sequence[str],
    columns: Sequence[str],
    model_id: str | None = None,
) -> tuple[pd.DataFrame, list[UnreadableFile]]:
    """Like :func:`read_columns`, but a file that cannot be read is left out and returned with
    its reason, so one bad file never hides the others' rows."""
    wanted = [c for c in columns if c in MATRIX_COLUMNS]
    schema = pa.schema([MATRIX_SCHEMA.field(c) for c in wanted])
    store = ResultsStore(results_uri)
    tables, unreadable = [], []
    for path in paths:
        try:
            tables.append(_read_file(store.fs, store.fs._strip_protocol(path), schema, model_id))
        except (OSError, pa.ArrowException) as exc:
            unreadable.append(UnreadableFile(path=path, reason=f"{type(exc).__name__}: {exc}"))
    if not tables:
        return schema.empty_table().to_pandas(), unreadable
    return pa.concat_tables(tables).to_pandas(), unreadable


def read_columns(
    results_uri: str,
    paths: Sequence[str],
    columns: Sequence[str],
    model_id: str | None = None,
) -> pd.DataFrame:
    """Read only ``columns`` of the given matrix files (optionally one model's rows).

    Each file is read on its own (pyarrow's ParquetFile: a few times less overhead than a
    dataset scan). For one model only the row groups whose ``model_id`` statistics can hold it
    are decoded: the store writes rows sorted by model id in row groups of a few MiB, so a
    model's details cost one row group, not the file. A column a file lacks (an older dataset)
    reads as nulls of the matrix schema's type.
    """
    wanted = [c for c in columns if c in MATRIX_COLUMNS]
    schema = pa.schema([MATRIX_SCHEMA.field(c) for c in wanted])
    if not paths:
        return schema.empty_table().to_pandas()
    store = ResultsStore(results_uri)
    tables = [
        _read_file(store.fs, store.fs._strip_protocol(path), schema, model_id) for path in paths
    ]
    return pa.concat_tables(tables).to_pandas()


def _read_file(
    fs: AbstractFileSystem, path: str, schema: pa.Schema, model_id: str | None
) -> pa.Table:
    with contextlib.ExitStack() as stack:
        local = isinstance(fs, LocalFileSystem)
        parquet = pq.ParquetFile(path if local else stack.enter_context(fs.open(path, "rb")))
        have = set(parquet.schema_arrow.names)
        present = [name for name in schema.names if name in have]
        if model_id is None:
            table = parquet.read(columns=present)
        else:
            groups = _row_groups_holding(parquet.metadata, model_id)
            table = parquet.read_row_groups(groups, columns=sorted({*present, "model_id"}))
            table = table.filter(pc.equal(table["model_id"], model_id))
    return pa.table(
        [
            table[name].cast(field.type)
            if name in have
            else pa.nulls(table.num_rows, type=field.type)
            for name, field in zip(schema.names, schema, strict=True)
        ],
        schema=schema,
    )


def _row_groups_holding(metadata: pq.FileMetaData, model_id: str) -> list[int]:
    """Row groups whose model_id range (min..max statistics) can contain ``model_id``."""
    paths = [metadata.schema.column(j).path for j in range(metadata.num_columns)]
    index = paths.index("model_id")
    groups = []
    for i in range(metadata.num_row_groups):
        stats = metadata.row_group(i).column(index).statistics
        if stats is None or not stats.has_min_max or stats.min <= model_id <= stats.max:
            groups.append(i)
    return groups
