"""The results store: immutable run records, and the matrix materialized from them.

Layout under the root URI (any fsspec URL: a local path, ``memory://``, ``s3://``, ``hf://``)::

    records/<run_id>.json   one RunRecord each; created once, never overwritten
    data/<stem>.parquet     the matrix: one file per (compiler version, library version) pair
    README.md               the dataset card, regenerated with the matrix

Writers only ever create new record files with unique names, so any number of processes can
add records at once. The matrix and card are derived: :meth:`ResultsStore.materialize` rebuilds
them from the records, idempotently, and can be rerun at any time.

Every write is atomic. Locally a file is written in full to a hidden temporary file in the same
directory, then renamed over the target (``os.replace``) or, for records, hard-linked to its name
(which fails if the name exists). On object stores a single PUT is atomic. Readers (pandas,
pyarrow, the ``datasets`` library) skip the hidden ``.``-prefixed temporary files.
"""

from __future__ import annotations

import io
import json
import os
import re
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from model_support.dataset import (
    MATRIX_COLUMNS,
    MATRIX_SCHEMA,
    CardFile,
    MatrixKey,
    has_versions,
    matrix_file_stem,
    matrix_key,
    recency,
    record_to_row,
    render_card,
    rows_to_table,
    writer_stack,
)
from model_support.records import RunRecord, Stack
from model_support.vocabulary import Result

RECORDS_DIR = "records"
DATA_DIR = "data"
CARD_NAME = "README.md"
MATRIX_KEY_METADATA = b"model_support.matrix_key"
"""Parquet key-value metadata naming the file's (compiler, version, library, version)."""

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_READ_BATCH = 256  # records fetched per fs.cat call (concurrent on object stores)


class StoreError(Exception):
    """Something in the results store is not as this code wrote it."""


class RecordExists(StoreError, FileExistsError):
    """A record with this run id is already stored; records are never overwritten."""


class RecordNotFound(StoreError, LookupError):
    """No record with this run id is stored."""


class CorruptRecord(StoreError, ValueError):
    """A file under records/ is not a valid RunRecord."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"corrupt run record {path}: {reason}. Records are written atomically by "
            "ResultsStore.add, so this file was changed by something else: restore it from a "
            "backup or move it out of records/ (the matrix is rebuilt from the records that remain)."
        )


class CorruptRecordWarning(UserWarning):
    """Issued by ``records(strict=False)`` for each corrupt record it leaves out."""


@dataclass(frozen=True)
class MatrixFile:
    """One Parquet file of the matrix and the (compiler, library) versions it holds."""

    compiler: str | None
    compiler_version: str | None
    library: str
    library_version: str | None
    path: str


_NULLABLE_DTYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow -> pandas keeping integers integers and booleans booleans where values are missing."""
    return table.to_pandas(types_mapper=_NULLABLE_DTYPES.get)


def _check_run_id(run_id: str) -> None:
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} cannot name a record file: use 1-200 characters from "
            "[A-Za-z0-9._-], starting with a letter or digit (model_support.records.new_run_id makes one)"
        )


class ResultsStore:
    """Run records plus the Parquet matrix and dataset card derived from them, under one URI."""

    def __init__(
        self,
        uri: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        fallback_stack: Stack | None = None,
    ) -> None:
        """Open (lazily) the store at ``uri``; nothing is created until something is written.

        ``storage_options`` are passed to the fsspec filesystem (credentials, endpoint, ...).
        ``fallback_stack`` is the stack given to EXCLUDED records that carry none (see
        :meth:`add`); by default, the versions installed in this process
        (:func:`model_support.dataset.writer_stack`). A writer that plans for another image
        (the operator) passes that image's versions.
        """
        self.uri = os.fspath(uri)
        self._fallback_stack = fallback_stack
        fs, root = url_to_fs(self.uri, **(storage_options or {}))
        self.fs: AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or "/"
        self._local = isinstance(fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"ResultsStore({self.uri!r})"

    # -- paths ------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def _public(self, path: str) -> str:
        """A path the caller can hand to fsspec/pandas: plain locally, with its protocol elsewhere."""
        return path if self._local else self.fs.unstrip_protocol(path)

    def record_path(self, run_id: str) -> str:
        """Where the record of ``run_id`` is (or would be) stored."""
        _check_run_id(run_id)
        return self._public(self._path(RECORDS_DIR, f"{run_id}.json"))

    # -- atomic writes ----------------------------------------------------------------------

    def _temp_path(self, path: str) -> str:
        directory, name = path.rsplit("/", 1)
        # Leading dot: pandas/pyarrow/datasets ignore it, and records() only lists *.json.
        return f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"

    def _write_local_temp(self, path: str, data: bytes) -> str:
        directory = path.rsplit("/", 1)[0]
        try:
            self.fs.makedirs(directory, exist_ok=True)
        except FileExistsError as exc:  # a file where the folder should be: not "record exists"
            raise StoreError(
                f"{directory} exists but is not a folder; the store cannot be written"
            ) from exc
        temp = self._temp_path(path)
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(
                handle.fileno()
            )  # the rename must never expose a file whose bytes are not on disk
        return temp

    def _create(self, path: str, data: bytes) -> None:
        """Write a new file atomically; raise FileExistsError if ``path`` exists."""
        if not self._local:
            # One PUT is atomic; mode="create" is a conditional put where the backend has one.
            self.fs.pipe_file(path, data, mode="create")
            return
        temp = self._write_local_temp(path, data)
        try:
            self.fs.link(temp, path)  # atomic, and fails if the name is taken: no overwrite race
        finally:
            self.fs.rm_file(temp)

    def _replace(self, path: str, data: bytes) -> None:
        """Write ``path`` atomically, replacing any previous version."""
        if not self._local:
            self.fs.pipe_file(path, data)
            return
        temp = self._write_local_temp(path, data)
        try:
            os.replace(temp, path)
        except BaseException:
            self.fs.rm_file(temp)
            raise

    # -- records ----------------------------------------------------------------------------

    def add(self, record: RunRecord) -> str:
        """Store a new record and return its path; raise :class:`RecordExists` if its id is taken.

        An EXCLUDED record with no versions in its stack (nothing ran) is stored with the
        fallback stack (by default the versions installed in this process, marked
        ``"origin": "writer"``), so it is filed in the matrix of the compiler and library it was
        planned against. Every other record is stored exactly as given.
        """
        _check_run_id(record.run_id)
        if record.document.result == Result.EXCLUDED and not has_versions(record.document.stack):
            stack = self._fallback_stack or writer_stack()
            document = record.document.model_copy(update={"stack": stack})
            record = record.model_copy(update={"document": document})
        path = self._path(RECORDS_DIR, f"{record.run_id}.json")
        try:
            self._create(path, record.to_json().encode())
        except FileExistsError as exc:
            raise RecordExists(
                f"record {record.run_id} already exists at {self._public(path)}; records are "
                "immutable: store a new run under a new run id (records.new_run_id)"
            ) from exc
        return self._public(path)

    def add_and_materialize(self, record: RunRecord) -> str:
        """:meth:`add` the record, then :meth:`materialize`; returns the record's path."""
        path = self.add(record)
        self.materialize()
        return path

    def _parse(self, path: str, data: bytes | Exception) -> RunRecord:
        if isinstance(data, Exception):
            raise StoreError(f"could not read run record {self._public(path)}: {data}") from data
        try:
            record = RunRecord.from_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            raise CorruptRecord(
                self._public(path), f"{where}: {first['msg']} ({exc.error_count()} error(s))"
            ) from exc
        expected = path.rsplit("/", 1)[-1].removesuffix(".json")
        if record.run_id != expected:
            raise CorruptRecord(
                self._public(path),
                f"its run_id is {record.run_id!r}, but the file is named for {expected!r}",
            )
        return record

    def records(self, strict: bool = True) -> Iterator[RunRecord]:
        """Every stored record, in run-id order.

        A corrupt record raises :class:`CorruptRecord` naming the file. With ``strict=False`` it
        is left out instead, with a :class:`CorruptRecordWarning` naming the file.
        """
        paths = sorted(self.fs.glob(self._path(RECORDS_DIR, "*.json")))
        for start in range(0, len(paths), _READ_BATCH):
            batch = paths[start : start + _READ_BATCH]
            contents = self.fs.cat(batch, on_error="return")
            for path in batch:
                if isinstance(contents[path], FileNotFoundError):
                    continue  # listed a moment ago, moved out since: no longer part of the store
                try:
                    yield self._parse(path, contents[path])
                except CorruptRecord as exc:
                    if strict:
                        raise
                    warnings.warn(str(exc), CorruptRecordWarning, stacklevel=2)

    def get(self, run_id: str) -> RunRecord:
        """The record of ``run_id``; raises :class:`RecordNotFound` if there is none."""
        _check_run_id(run_id)
        path = self._path(RECORDS_DIR, f"{run_id}.json")
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError as exc:
            raise RecordNotFound(
                f"no record {run_id!r} in {self._public(self._path(RECORDS_DIR))}"
            ) from exc
        return self._parse(path, data)

    # -- matrix -----------------------------------------------------------------------------

    def _latest(self, strict: bool) -> dict[MatrixKey, list[RunRecord]]:
        """The latest record per (model, task) within each matrix key."""
        latest: dict[tuple[MatrixKey, str, str], RunRecord] = {}
        for record in self.records(strict=strict):
            slot = (matrix_key(record), record.document.model, record.document.task)
            current = latest.get(slot)
            if current is None or recency(record) > recency(current):
                latest[slot] = record
        groups: dict[MatrixKey, list[RunRecord]] = defaultdict(list)
        for (key, _, _), record in latest.items():
            groups[key].append(record)
        return groups

    @staticmethod
    def _stems(keys: list[MatrixKey]) -> dict[MatrixKey, str]:
        stems = {key: matrix_file_stem(key) for key in keys}
        taken = Counter(stems.values())
        # Two keys whose sanitized names coincide both get a hash of their exact key.
        return {
            key: matrix_file_stem(key, disambiguate=taken[stem] > 1) for key, stem in stems.items()
        }

    def materialize(self, strict: bool = True) -> list[str]:
        """Rebuild the matrix files and the dataset card from the records.

        Returns the paths that make up the matrix afterwards (data files, then README.md).
        Files whose bytes would not change are not rewritten; files no longer produced are
        removed last, so a failure part way leaves every file either old or new, all readable.
        ``strict`` is passed to :meth:`records`.
        """
        groups = self._latest(strict)
        stems = self._stems(list(groups))
        data_dir = self._path(DATA_DIR)
        outputs: dict[str, bytes] = {}
        card_files: list[CardFile] = []
        for key in sorted(groups, key=lambda k: stems[k]):
            table = rows_to_table(record_to_row(r) for r in groups[key])
            metadata = {MATRIX_KEY_METADATA: json.dumps(key.__dict__, sort_keys=True).encode()}
            buffer = io.BytesIO()
            pq.write_table(table.replace_schema_metadata(metadata), buffer)
            name = f"{stems[key]}.parquet"
            outputs[f"{data_dir}/{name}"] = buffer.getvalue()
            counts = Counter(str(r.document.result.value) for r in groups[key])
            card_files.append(CardFile(key=key, path=f"{DATA_DIR}/{name}", results=dict(counts)))

        existing = set(self.fs.glob(f"{data_dir}/*.parquet"))
        for path, data in outputs.items():
            self._write_if_changed(path, data, exists=path in existing)
        card_path = self._path(CARD_NAME)
        self._write_if_changed(
            card_path, render_card(card_files).encode(), exists=self.fs.exists(card_path)
        )
        for stale in sorted(existing - set(outputs)):
            self.fs.rm_file(stale)
        return [self._public(p) for p in [*outputs, card_path]]

    def _write_if_changed(self, path: str, data: bytes, exists: bool) -> None:
        if exists and self.fs.cat_file(path) == data:
            return  # idempotent: same records -> same bytes, nothing to write
        self._replace(path, data)

    def matrix_files(self) -> list[MatrixFile]:
        """The matrix's Parquet files and the (compiler, library) versions each holds."""
        files = []
        for path in sorted(self.fs.glob(self._path(DATA_DIR, "*.parquet"))):
            with self.fs.open(path, "rb") as handle:
                metadata = pq.read_schema(handle).metadata or {}
            if MATRIX_KEY_METADATA not in metadata:
                raise StoreError(
                    f"{self._public(path)} was not written by ResultsStore.materialize (no "
                    f"{MATRIX_KEY_METADATA.decode()} metadata): remove it from {DATA_DIR}/ and materialize again"
                )
            key = json.loads(metadata[MATRIX_KEY_METADATA])
            files.append(MatrixFile(path=self._public(path), **key))
        return files

    def matrix(self, columns: list[str] | None = None, filters: Any = None) -> pd.DataFrame:
        """The matrix as one DataFrame (all files), read with the one matrix schema.

        Integer and boolean columns use pandas' nullable dtypes (``Int64``, ``boolean``), so a
        missing measurement stays missing instead of turning the column into floats.

        ``columns`` selects columns; ``filters`` is a pyarrow filter (DNF list of tuples such as
        ``[("result", "==", "PASS")]`` or a ``pyarrow.compute`` expression).
        """
        if columns is not None:
            unknown = [c for c in columns if c not in MATRIX_COLUMNS]
            if unknown:
                raise ValueError(
                    f"unknown matrix column(s) {unknown}; the columns are {list(MATRIX_COLUMNS)}"
                )
        paths = sorted(self.fs.glob(self._path(DATA_DIR, "*.parquet")))
        if not paths:
            empty = MATRIX_SCHEMA.empty_table()
            return _to_pandas(empty.select(columns) if columns is not None else empty)
        table = pq.read_table(
            paths, filesystem=self.fs, schema=MATRIX_SCHEMA, columns=columns, filters=filters
        )
        return _to_pandas(table)
