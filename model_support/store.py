"""The results store: immutable run records, and the matrix materialized from them.

Layout under the root URI (any fsspec URL: a local path, ``s3://``, ``hf://``; ``memory://``
lives only as long as its process)::

    records/<run_id>.json        one RunRecord each; created once, never overwritten
    data/<stem>.parquet          the matrix: one file per (compiler version, library version) pair
    README.md                    the dataset card, regenerated with the matrix
    index/materialized.txt       which records the matrix holds: run id -> matrix key
    history/runs.parquet         every run (not only the latest per stack), a few columns each
    index/.lock                  (local stores) held while a materialize runs
    rankings/snapshots/*.json    what sweeps ranked (time, source, model ids), one file each

Writers only ever create new record files with unique names, so any number of processes can
add records at once. The matrix, card, index and history are derived: the matrix holds the
latest run of each model per stack, the history every run (a re-run on the same stack is a new
row, never a replaced one). :meth:`ResultsStore.materialize`
folds the records the index does not hold yet into the matrix files they belong to, rewriting
only those (adding one record to a store of 100,000 rewrites one file); records that
disappeared, a missing matrix file or an index made for another matrix format make it rebuild
the files concerned from their records, and ``rebuild=True`` rebuilds everything. Losing the
matrix, the card or the index loses nothing.

Materializers exclude each other (``flock`` on ``index/.lock`` locally, a lease file elsewhere)
and list the records only once they hold the lock, so the last materialize always reflects
every record written before it started. The index is written last: a materialize that dies
part way leaves records the index does not hold, and the next one folds them in again (folding
a record twice changes nothing).

Every write is atomic. Locally a file is written in full to a hidden temporary file in the same
directory, then renamed over the target (``os.replace``) or, for records, hard-linked to its name
(which fails if the name exists). On object stores a single PUT is atomic. Readers (pandas,
pyarrow, the ``datasets`` library) skip the hidden ``.``-prefixed temporary files.

Paths are never pattern-matched: a root such as ``res[1]`` or ``res*`` is a name like any other.
Materialize deletes only matrix files it wrote itself (marked with ``model_support.matrix_key``
Parquet metadata); anything else under ``data/`` is left alone.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import gc
import hashlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from model_support.dataset import (
    HISTORY_SCHEMA,
    MATRIX_COLUMNS,
    MATRIX_FORMAT_VERSION,
    MATRIX_SCHEMA,
    CardFile,
    MatrixKey,
    has_versions,
    matrix_file_stem,
    matrix_key,
    recency,
    records_to_table,
    render_card,
    write_matrix,
    writer_stack,
)
from model_support.ranking_snapshots import RankingSnapshot
from model_support.records import RunRecord, Stack
from model_support.store_lease import Lease
from model_support.vocabulary import Result

if TYPE_CHECKING:
    import pandas as pd

RECORDS_DIR = "records"
DATA_DIR = "data"
INDEX_DIR = "index"
INDEX_NAME = "materialized.txt"
CARD_NAME = "README.md"
HISTORY_DIR = "history"
HISTORY_NAME = "runs.parquet"
HISTORY_ROW_GROUP = 8192
"""Rows per row group of the history: sorted by model id, one model's runs decode one group."""
SNAPSHOTS_DIR = "rankings/snapshots"
MATRIX_KEY_METADATA = b"model_support.matrix_key"
"""Parquet key-value metadata naming the file's (compiler, version, library, version); it also
marks the file as written by :meth:`ResultsStore.materialize`, the only files it ever deletes."""

PARALLEL_FROM = 20_000
"""A materialize that reads at least this many records spreads the work over processes."""
MAX_WORKERS = 4
"""At most this many processes read and parse records at once."""
LOCK_WAIT_S = 600.0
"""Longest a materialize waits for another one to finish."""

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_READ_BATCH = 256  # records fetched per request batch (concurrent on object stores)


def matrix_format() -> str:
    """Fingerprint of what matrix files hold: the schema and :data:`MATRIX_FORMAT_VERSION`."""
    text = f"{MATRIX_FORMAT_VERSION}\n{MATRIX_SCHEMA}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key_json(key: MatrixKey) -> str:
    return json.dumps(key.__dict__, sort_keys=True)


def _key_from_json(text: str) -> MatrixKey:
    return MatrixKey(**json.loads(text))


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

    def __reduce__(self) -> tuple[type[CorruptRecord], tuple[str, str]]:
        # Raised in a worker process of a parallel materialize, it is re-raised in the parent.
        return (CorruptRecord, (self.path, self.reason))


class StoreLocationError(StoreError, ValueError):
    """The results location cannot be opened: an unknown protocol, or its filesystem is not installed."""


class StoreNotWritable(StoreError, OSError):
    """The results location cannot be written (permissions, credentials, unreachable, read-only)."""


class NotAResultsStore(StoreError, ValueError):
    """The location is an existing folder holding other files, and not a results store."""


class StoreBusy(StoreError, TimeoutError):
    """Another materialize held the store's lock for longer than :data:`LOCK_WAIT_S`."""


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


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow -> pandas keeping integers integers and booleans booleans where values are missing."""
    import pandas as pd  # only readers of the matrix pay for importing pandas, not writers

    nullable = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    return table.to_pandas(types_mapper=nullable.get)


def _check_run_id(run_id: str) -> None:
    if not _RUN_ID.fullmatch(run_id):
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
        self._storage_options = dict(storage_options or {})
        try:
            fs, root = url_to_fs(self.uri, **(storage_options or {}))
        except (ValueError, ImportError) as exc:  # unknown protocol / its package not installed
            raise StoreLocationError(
                f"cannot open the results location {self.uri!r}: {exc}. Give a folder, or a URI "
                "whose filesystem is installed (s3:// needs s3fs; hf:// huggingface_hub)"
            ) from exc
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

    # -- where the store is -----------------------------------------------------------------

    def check_location(self, allow_other_files: bool = False) -> None:
        """Refuse (:class:`NotAResultsStore`) a root that is a file, or an existing folder that
        holds other files and no ``records/`` folder, unless ``allow_other_files``.

        A new or empty folder, or an existing results store, is fine. Nothing is written.
        """
        try:
            if self.fs.isfile(self.root):
                raise NotAResultsStore(
                    f"results location {self.uri!r} is a file: give a folder (new, empty, or an "
                    "existing results store)"
                )
            self.fs.invalidate_cache(self.root)
            entries = self.fs.ls(self.root, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing there yet (or a parent is a file: check_writable says so)
        names = sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})
        if not names or RECORDS_DIR in names or allow_other_files:
            return
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise NotAResultsStore(
            f"results location {self.uri!r} already holds other files ({shown}) and is not a "
            f"results store (it has no {RECORDS_DIR}/ folder). Give a new or empty folder, or "
            f"ask explicitly to add a results store beside those files ({RECORDS_DIR}/, "
            f"{DATA_DIR}/, {INDEX_DIR}/ and {CARD_NAME} are written; no other file is touched)"
        )

    def check_writable(self) -> None:
        """Write and remove a probe file where records go, creating nothing that stays.

        Finds an unwritable or unreachable store before a test runs rather than after it;
        raises :class:`StoreNotWritable` with the cause.
        """
        try:
            if self._local:
                # The nearest folder that exists: the store itself, or where it would be created.
                folder = Path(self.root)
                while not folder.exists() and folder != folder.parent:
                    folder = folder.parent
                if (folder / RECORDS_DIR).is_dir():
                    folder = folder / RECORDS_DIR
                if not folder.is_dir():
                    raise NotADirectoryError(f"{folder} is a file, not a folder")
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".model-support-probe-"):
                    pass
            else:
                probe = self._path(RECORDS_DIR, f".model-support-probe-{uuid.uuid4().hex}")
                self.fs.pipe_file(probe, b"probe")
                self.fs.rm_file(probe)
        except Exception as exc:  # any failure to write is the one answer: not writable, and why
            raise StoreNotWritable(
                f"cannot write to the results store {self.uri!r} ({type(exc).__name__}: {exc}); "
                "check the location, its permissions or credentials, or choose another one"
            ) from exc

    # -- listing and reading, without pattern matching ----------------------------------------

    def _names(self, directory: str, suffix: str) -> list[str]:
        """Names of the visible files in ``directory`` ending in ``suffix``, sorted.

        Listed, never globbed: brackets or stars in the store's path are plain characters.
        """
        if self._local:
            try:
                with os.scandir(directory) as entries:
                    names = [
                        e.name
                        for e in entries
                        if e.name.endswith(suffix) and not e.name.startswith(".") and e.is_file()
                    ]
            except (FileNotFoundError, NotADirectoryError):
                return []
            return sorted(names)
        self.fs.invalidate_cache(directory)  # object-store listings are cached by fsspec
        try:
            entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "file" and name.endswith(suffix) and not name.startswith("."):
                found.append(name)
        return sorted(found)

    def _read_many(self, paths: Sequence[str]) -> list[bytes | Exception]:
        """The contents of ``paths`` (an exception in place of a file that could not be read)."""
        if self._local:
            return [_read_local(path) for path in paths]
        out: list[bytes | Exception] = []
        for start in range(0, len(paths), _READ_BATCH):
            batch = list(paths[start : start + _READ_BATCH])
            out += self.fs.cat_ranges(batch, 0, None, on_error="return")
        return out

    def _read_parquet(self, path: str, columns: list[str] | None = None) -> pa.Table:
        if self._local:  # a plain path is never globbed by pyarrow; mapped, it is read fastest
            return pq.read_table(path, columns=columns, memory_map=True)
        with self.fs.open(path, "rb") as handle:
            return pq.read_table(handle, columns=columns)

    def _is_matrix_file(self, path: str) -> bool:
        """Whether ``path`` is a matrix file this code wrote (it carries the matrix key)."""
        try:
            with self.fs.open(path, "rb") as handle:
                metadata = pq.read_schema(handle).metadata or {}
        except (OSError, pa.ArrowInvalid):
            return False  # unreadable or not Parquet: not ours to delete
        return MATRIX_KEY_METADATA in metadata

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
        ids = self._record_ids()
        for start in range(0, len(ids), _READ_BATCH):
            yield from self._read_records(ids[start : start + _READ_BATCH], strict)

    def record_count(self) -> int:
        """How many records the store holds (one listing; no record is read)."""
        return len(self._record_ids())

    def _record_ids(self) -> list[str]:
        return [n.removesuffix(".json") for n in self._names(self._path(RECORDS_DIR), ".json")]

    def _read_records(self, run_ids: Sequence[str], strict: bool) -> list[RunRecord]:
        """The records of ``run_ids`` that are still there, corrupt ones handled per ``strict``."""
        paths = [self._path(RECORDS_DIR, f"{run_id}.json") for run_id in run_ids]
        found = []
        for path, data in zip(paths, self._read_many(paths), strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # listed a moment ago, moved out since: no longer part of the store
            try:
                found.append(self._parse(path, data))
            except CorruptRecord as exc:
                if strict:
                    raise
                warnings.warn(str(exc), CorruptRecordWarning, stacklevel=3)
        return found

    def has(self, run_id: str) -> bool:
        """Whether ``run_id`` is recorded. Asks the store itself (one byte of the record), never
        a listing the file system may have cached from before the record was written."""
        _check_run_id(run_id)
        try:
            self.fs.cat_file(self._path(RECORDS_DIR, f"{run_id}.json"), start=0, end=1)
        except FileNotFoundError:
            return False
        return True

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

    @staticmethod
    def _stems(keys: Sequence[MatrixKey]) -> dict[MatrixKey, str]:
        stems = {key: matrix_file_stem(key) for key in keys}
        taken = Counter(stems.values())
        # Two keys whose sanitized names coincide both get a hash of their exact key.
        return {
            key: matrix_file_stem(key, disambiguate=taken[stem] > 1) for key, stem in stems.items()
        }

    def materialize(self, strict: bool = True, *, rebuild: bool = False) -> list[str]:
        """Bring the matrix files, the dataset card and the index up to date with the records.

        Records the index does not hold yet are folded into the matrix files they belong to;
        only those files are rewritten (and the card, when its counts change). A matrix file
        whose records disappeared or that is missing is rebuilt from its records; with
        ``rebuild`` (or without a usable index) every file is. The result is byte for byte what
        a rebuild from the records gives. Files whose bytes would not change are not rewritten;
        matrix files no longer produced are removed last, so a failure part way leaves every
        file either old or new, all readable. ``strict`` is passed to :meth:`records`.

        Returns the paths that make up the matrix afterwards (data files, then README.md).
        """
        with self._exclusive() as still_held, _no_cyclic_gc():
            return self._materialize(strict, rebuild, still_held)

    def _materialize(
        self, strict: bool, rebuild: bool, still_held: Callable[[], None]
    ) -> list[str]:
        listed = set(self._record_ids())  # listed under the lock: nothing written before is missed
        stored = None if rebuild else self._read_index()
        index = None if stored is None else stored.records
        digests_held = {} if stored is None else stored.digests
        folded = {} if index is None else {r: k for r, k in index.items() if r in listed}
        gone_keys = set() if index is None else {index[r] for r in index.keys() - listed}
        previous_keys = [] if index is None else sorted(map(_key_from_json, set(index.values())))

        additions, placed, added_history = self._fold(sorted(listed - folded.keys()), strict)
        members: dict[str, list[str]] = defaultdict(list)
        for run_id, key_text in folded.items():
            members[key_text].append(run_id)
        keys = sorted({*map(_key_from_json, members), *additions})
        stems = self._stems(keys)
        previous_stems = self._stems(previous_keys)
        data_dir = self._path(DATA_DIR)
        on_disk = set(self._names(data_dir, ".parquet"))

        tables: dict[MatrixKey, pa.Table] = {}
        kept: dict[MatrixKey, pa.Table] = {}  # untouched files: their run ids and results
        for key in keys:
            name = f"{stems[key]}.parquet"
            previous = previous_stems.get(key)
            changed = key in additions or _key_json(key) in gone_keys or previous != stems[key]
            if index is not None and not changed and name in on_disk:
                held_rows = self._held_rows(f"{data_dir}/{name}")
                if held_rows is not None and _rows_digest(held_rows) == digests_held.get(
                    _key_json(key)
                ):
                    kept[key] = held_rows
                    continue  # untouched and intact: its file stays as it is
                # Rows the index says it holds are missing (an older file written over it,
                # a lost write): rebuild it from its records.
                previous = None
            base = None
            if index is not None and _key_json(key) not in gone_keys and previous is not None:
                base = self._matrix_table(f"{data_dir}/{previous}.parquet")
            added = additions.pop(key, None)  # its rows live on in tables[key] alone
            if base is None:  # rebuild this file from every record it holds
                held = self._read_records(sorted(members.get(_key_json(key), [])), strict)
                parts = [_latest_table(held, key)] if held else []
                tables[key] = _combine([*parts, *([added] if added is not None else [])])
            else:
                tables[key] = base if added is None else _merge(base, added)

        card_files = []
        for key in keys:
            name = f"{stems[key]}.parquet"
            results = (tables[key] if key in tables else kept[key]).column("result")
            counts = Counter(str(v) for v in results.to_pylist())
            card_files.append(CardFile(key=key, path=f"{DATA_DIR}/{name}", results=dict(counts)))

        for key, table in sorted(tables.items(), key=lambda kv: stems[kv[0]]):
            metadata = {MATRIX_KEY_METADATA: _key_json(key).encode()}
            buffer = io.BytesIO()
            table = table.combine_chunks()
            write_matrix(table.replace_schema_metadata(metadata), buffer)
            path = f"{data_dir}/{stems[key]}.parquet"
            still_held()
            self._write_if_changed(
                path, buffer.getvalue(), exists=path.rsplit("/", 1)[-1] in on_disk
            )
        card_path = self._path(CARD_NAME)
        still_held()
        self._write_if_changed(
            card_path, render_card(card_files).encode(), exists=self.fs.exists(card_path)
        )
        produced = {f"{stems[key]}.parquet" for key in keys}
        for stale in sorted(on_disk - produced):
            if self._is_matrix_file(f"{data_dir}/{stale}"):
                still_held()
                self.fs.rm_file(f"{data_dir}/{stale}")
        gone = set() if index is None else index.keys() - listed
        still_held()
        self._write_history(index is not None, listed, gone, added_history, strict)
        folded.update(placed)
        digests = {_key_json(k): _rows_digest(t) for k, t in [*tables.items(), *kept.items()]}
        still_held()
        self._write_index(folded, digests)
        paths = [f"{data_dir}/{stems[key]}.parquet" for key in sorted(keys, key=lambda k: stems[k])]
        return [self._public(p) for p in [*paths, card_path]]

    def _held_rows(self, path: str) -> pa.Table | None:
        """The run ids and results of a matrix file; None when it cannot be read."""
        try:
            return self._read_parquet(path, columns=["run_id", "result"])
        except (OSError, pa.ArrowInvalid, KeyError):
            return None

    def _fold(
        self, run_ids: list[str], strict: bool
    ) -> tuple[dict[MatrixKey, pa.Table], dict[str, str], pa.Table]:
        """The records of ``run_ids``, as the latest row per (model, task) of each matrix file
        they belong to, where each record went (run id -> matrix key), and their history rows.

        Many records (a first or full materialize) are read and turned into rows by several
        processes at once, one contiguous share of the run ids each: parsing 100,000 records
        is CPU work that one core does in seconds. Their partial files are combined exactly as
        one process would have chosen (:func:`_combine`).
        """
        workers = min(os.cpu_count() or 1, MAX_WORKERS)
        if len(run_ids) < PARALLEL_FROM or workers < 2:
            return _fold_records(self._read_records(run_ids, strict))
        size = -(-len(run_ids) // workers)
        shares = [run_ids[i : i + size] for i in range(0, len(run_ids), size)]
        helpers = [
            _FoldHelper(self.uri, self._storage_options, share, strict) for share in shares[1:]
        ]
        try:
            parts = [_fold_records(self._read_records(shares[0], strict))]
            for helper in helpers:
                tables, placed, problems, history = helper.result()
                for problem in problems:
                    warnings.warn(problem, CorruptRecordWarning, stacklevel=4)
                parts.append((tables, placed, history))
        finally:
            for helper in helpers:
                helper.stop()
        merged: dict[MatrixKey, list[pa.Table]] = defaultdict(list)
        placed_all: dict[str, str] = {}
        for tables_part, placed_part, _ in parts:
            for key, table in tables_part.items():
                merged[key].append(table)
            placed_all.update(placed_part)
        history_all = _history_order(pa.concat_tables([part[2] for part in parts]))
        return {key: _combine(tables) for key, tables in merged.items()}, placed_all, history_all

    def _matrix_table(self, path: str) -> pa.Table | None:
        """A matrix file's rows, or None when it is missing, unreadable, not ours or outdated."""
        try:
            table = self._read_parquet(path)
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            return None
        if MATRIX_KEY_METADATA not in (table.schema.metadata or {}):
            return None
        if table.schema.names != MATRIX_SCHEMA.names:
            return None  # another format: rebuild
        try:
            # Exactly the written schema (Parquet reads lists back with other item names).
            return table.cast(MATRIX_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    # -- history --------------------------------------------------------------------------

    def history_path(self) -> str:
        """Where the history (every run, a few columns each) is: ``history/runs.parquet``."""
        return self._public(self._path(HISTORY_DIR, HISTORY_NAME))

    def _history_table(self) -> pa.Table | None:
        """The stored history, or None when it is missing, unreadable or of another format."""
        try:
            table = self._read_parquet(self._path(HISTORY_DIR, HISTORY_NAME))
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            return None
        if table.schema.names != HISTORY_SCHEMA.names:
            return None
        try:
            return table.cast(HISTORY_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    def _history_rows(self) -> int | None:
        """Rows of the stored history from its footer alone; None when it is missing,
        unreadable or of another format."""
        try:
            with self.fs.open(self._path(HISTORY_DIR, HISTORY_NAME), "rb") as handle:
                metadata = pq.read_metadata(handle)
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            return None
        if metadata.schema.to_arrow_schema().names != HISTORY_SCHEMA.names:
            return None
        return int(metadata.num_rows)

    def _write_history(
        self, incremental: bool, listed: set[str], gone: set[str], added: pa.Table, strict: bool
    ) -> None:
        """Bring ``history/runs.parquet`` up to date: the stored rows, less those of ``gone``
        records, plus ``added`` (the rows of the records folded now); rebuilt from every record
        when there is no usable stored history. Byte for byte what a rebuild gives."""
        path = self._path(HISTORY_DIR, HISTORY_NAME)
        added_ids = set(added.column("run_id").to_pylist())
        if incremental and not gone and not added_ids and self._history_rows() == len(listed):
            return  # nothing new, nothing gone: the file stays as it is
        base = self._history_table() if incremental else None
        if base is None and incremental:
            # The matrix is current but its history is missing or outdated: read every record.
            rest = sorted(listed - added_ids)
            records = self._read_records(rest, strict) if rest else []
            base = records_to_table(records, [matrix_key(r) for r in records], HISTORY_SCHEMA)
        if base is None:
            table = _history_order(added)
        else:
            dropped = gone | added_ids  # an added record may be in it already (a re-fold)
            if dropped:
                drop = pa.array(sorted(dropped), pa.string())
                base = base.filter(pc.invert(pc.is_in(base.column("run_id"), value_set=drop)))
            table = _insert_rows(base, _history_order(added))
        if table.num_rows != len(listed):
            # Rows of records the index never held (a materialize that died after writing the
            # history) and that are gone since: keep exactly the listed records.
            keep = pa.array(sorted(listed), pa.string())
            table = table.filter(pc.is_in(table.column("run_id"), value_set=keep))
        if self._local:
            os.makedirs(self._path(HISTORY_DIR), exist_ok=True)
        self._write_if_changed(path, history_bytes(table), exists=self.fs.exists(path))

    def history(self, columns: list[str] | None = None, filters: Any = None) -> pd.DataFrame:
        """Every run as one DataFrame (the columns of
        :data:`model_support.dataset.HISTORY_COLUMNS`, or ``columns`` of them), as of the
        last materialize; ``filters`` as for :meth:`matrix`."""
        return _to_pandas(self.history_table(columns, filters))

    def history_table(self, columns: list[str] | None = None, filters: Any = None) -> pa.Table:
        """:meth:`history` as an Arrow table."""
        if columns is not None:
            unknown = [c for c in columns if c not in HISTORY_SCHEMA.names]
            if unknown:
                raise ValueError(
                    f"unknown history column(s) {unknown}; the columns are {HISTORY_SCHEMA.names}"
                )
        path = self._path(HISTORY_DIR, HISTORY_NAME)
        if not self.fs.exists(path):
            empty = HISTORY_SCHEMA.empty_table()
            return empty.select(columns) if columns is not None else empty
        return pq.read_table(
            path, filesystem=self.fs, schema=HISTORY_SCHEMA, columns=columns, filters=filters
        )

    def _read_index(self) -> _Index | None:
        """Which records the matrix holds and a digest of each file's rows; None without a
        usable index (none yet, unreadable, or made for another matrix format): then all is
        rebuilt.

        The index is text: a JSON header (format, keys, a digest of each key's file's run ids),
        then one ``<run id>\t<key number>`` line per record (run ids hold no tabs or newlines),
        quick to read and write at 100,000 lines.
        """
        path = self._path(INDEX_DIR, INDEX_NAME)
        try:
            text = self.fs.cat_file(path).decode()
            header_line, _, body = text.partition("\n")
            header = json.loads(header_line)
            if header.get("format") != matrix_format():
                return None
            keys = {str(i): key for i, key in enumerate(header["keys"])}
            digests = dict(zip(header["keys"], header.get("digests", []), strict=False))
            index = {}
            for line in body.splitlines():
                run_id, _, number = line.partition("\t")
                index[run_id] = keys[number]
            return _Index(records=index, digests=digests)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            warnings.warn(
                f"the matrix index {self._public(path)} is unreadable ({exc}); rebuilding the "
                "matrix from the records",
                stacklevel=3,
            )
            return None

    def _write_index(self, folded: dict[str, str], digests: dict[str, str]) -> None:
        keys = sorted(set(folded.values()))
        number = {key: str(i) for i, key in enumerate(keys)}
        header = json.dumps(
            {"format": matrix_format(), "keys": keys, "digests": [digests[k] for k in keys]},
            sort_keys=True,
        )
        lines = [header, *(f"{r}\t{number[folded[r]]}" for r in sorted(folded))]
        self._replace(self._path(INDEX_DIR, INDEX_NAME), ("\n".join(lines) + "\n").encode())

    def _write_if_changed(self, path: str, data: bytes, exists: bool) -> None:
        if exists and self.fs.cat_file(path) == data:
            return  # idempotent: same records -> same bytes, nothing to write
        self._replace(path, data)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[Callable[[], None]]:
        """Hold the store's materialize lock (waiting up to :data:`LOCK_WAIT_S`); yields a
        check to call before each write, which raises once the lock may be lost."""
        deadline = time.monotonic() + LOCK_WAIT_S
        if self._local:
            directory = self._path(INDEX_DIR)
            os.makedirs(directory, exist_ok=True)
            # flock: the kernel releases it when the holder dies, so a crash never leaves it held.
            with open(f"{directory}/.lock", "a+b") as handle:
                while True:
                    try:
                        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        self._wait_or_give_up(deadline)
                try:
                    yield lambda: None  # the kernel holds a flock until released or death
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return
        lease = Lease(self.fs, self._path(INDEX_DIR, "lock.json"))
        with lease.held(lambda: self._wait_or_give_up(deadline)):
            yield lease.check

    def _wait_or_give_up(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise StoreBusy(
                f"another materialize of {self.uri} has held the store's lock for over "
                f"{LOCK_WAIT_S:g} s; if none is running, remove {self._public(self._path(INDEX_DIR))}"
                "/lock.json (object stores) and try again"
            )
        time.sleep(0.05)

    def matrix_files(self) -> list[MatrixFile]:
        """The matrix's Parquet files and the (compiler, library) versions each holds.

        Other Parquet files under ``data/`` (not written by :meth:`materialize`) are not part
        of the matrix and are left out.
        """
        files = []
        data_dir = self._path(DATA_DIR)
        for name in self._names(data_dir, ".parquet"):
            path = f"{data_dir}/{name}"
            try:
                with self.fs.open(path, "rb") as handle:
                    metadata = pq.read_schema(handle).metadata or {}
            except pa.ArrowInvalid:
                continue  # not Parquet at all: not a matrix file
            if MATRIX_KEY_METADATA not in metadata:
                continue
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
        data_dir = self._path(DATA_DIR)
        paths = [f"{data_dir}/{f.path.rsplit('/', 1)[-1]}" for f in self.matrix_files()]
        if not paths:
            empty = MATRIX_SCHEMA.empty_table()
            return _to_pandas(empty.select(columns) if columns is not None else empty)
        table = pq.read_table(
            paths, filesystem=self.fs, schema=MATRIX_SCHEMA, columns=columns, filters=filters
        )
        return _to_pandas(table)

    # -- ranking snapshots --------------------------------------------------------------------
    # What a sweep ranked, kept with the dataset (see model_support.ranking_snapshots). Created
    # once each, like records, and never folded into the matrix.

    def add_ranking_snapshot(self, snapshot: RankingSnapshot) -> str:
        """Store a ranking snapshot; returns its path (the same snapshot twice is one file)."""
        path = self._path(SNAPSHOTS_DIR, snapshot.file_name())
        # Its name holds its content hash: a file already there is this snapshot.
        with contextlib.suppress(FileExistsError):
            self._create(path, snapshot.model_dump_json(indent=1).encode())
        return self._public(path)

    def ranking_snapshots(self) -> list[RankingSnapshot]:
        """Every stored ranking snapshot, oldest first; an unreadable file raises StoreError."""
        directory = self._path(SNAPSHOTS_DIR)
        names = self._names(directory, ".json")
        snapshots = []
        for name, data in zip(
            names, self._read_many([f"{directory}/{n}" for n in names]), strict=True
        ):
            if isinstance(data, Exception):
                raise StoreError(f"ranking snapshot {name} could not be read: {data}") from data
            try:
                snapshots.append(RankingSnapshot.model_validate_json(data))
            except ValidationError as exc:
                raise StoreError(
                    f"ranking snapshot {self._public(f'{directory}/{name}')} is malformed "
                    f"({exc.error_count()} problems, first: {exc.errors()[0]['msg']})"
                ) from exc
        return snapshots

    def latest_ranking_snapshot(self, task: str | None = None) -> RankingSnapshot | None:
        """The newest ranking snapshot (of ``task``, when given; snapshots without a task count
        for every task); None when there is none."""
        for snapshot in reversed(self.ranking_snapshots()):
            if task is None or snapshot.task in (None, task):
                return snapshot
        return None


def _read_local(path: str) -> bytes | OSError:
    """A local file's bytes with plain system calls (no buffered file object: a full rebuild
    reads 100,000 records), or the error that prevented it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return exc
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing 100,000 records makes millions of objects and
    no cycles, and the collector's repeated passes over them cost a third of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class _Index:
    """What the index says: run id -> matrix key (JSON) of every record the matrix holds, and
    matrix key -> :func:`_rows_digest` of the file written for it."""

    records: dict[str, str]
    digests: dict[str, str]


def _rows_digest(table: pa.Table) -> str:
    """A digest of which records a matrix file's rows are (its run ids, in any order)."""
    run_ids = sorted(str(r) for r in table.column("run_id").to_pylist())
    return hashlib.sha256("\n".join(run_ids).encode()).hexdigest()


def _latest_table(records: Sequence[RunRecord], key: MatrixKey) -> pa.Table:
    """The matrix file of ``key``: the latest record per (model, task)."""
    latest: dict[tuple[str, str], RunRecord] = {}
    for record in records:
        slot = (record.model_id, record.document.task)
        current = latest.get(slot)
        if current is None or recency(record) > recency(current):
            latest[slot] = record
    winners = list(latest.values())
    return records_to_table(winners, [key] * len(winners))


def _fold_records(
    records: Sequence[RunRecord],
) -> tuple[dict[MatrixKey, pa.Table], dict[str, str], pa.Table]:
    """Records grouped by matrix key into "latest row per (model, task)" tables, where each
    record went (run id -> matrix key as JSON), and every record's history row.

    Every record's matrix row is made once: the history is a few of its columns, and each
    matrix file the latest rows of its key (no second pass over the records)."""
    keys = [matrix_key(record) for record in records]
    table = records_to_table(records, keys)  # every record's row, in MATRIX_ORDER
    order = sorted(
        range(len(records)),
        key=lambda i: (records[i].model_id, records[i].document.task, records[i].run_id),
    )  # = the table's row order
    rows_of: dict[MatrixKey, list[int]] = defaultdict(list)
    for position, i in enumerate(order):
        rows_of[keys[i]].append(position)
    placed = {record.run_id: _key_json(key) for record, key in zip(records, keys, strict=True)}
    # Records of one matrix file (a sweep's) are every row of the table, in order: no copy of
    # their run.py texts (a few hundred KiB each) is taken.
    tables = {
        key: _latest_rows(
            table if len(rows) == table.num_rows else table.take(pa.array(rows, pa.int64()))
        )
        for key, rows in rows_of.items()
    }
    return tables, placed, table.select(list(HISTORY_SCHEMA.names))


class _FoldHelper:
    """A helper process folding a share of the records (``python -m model_support.store_worker``).

    A plain subprocess rather than multiprocessing: it never re-imports the caller's main
    module (a script without a ``__main__`` guard would run again) and never forks a process
    that has threads. The share goes in on stdin as JSON (storage options stay out of the
    process list); the answer comes back on stdout as a JSON header line followed by each
    table's Arrow IPC bytes.
    """

    def __init__(
        self, uri: str, storage_options: dict[str, Any], run_ids: list[str], strict: bool
    ) -> None:
        request: dict[str, Any] = {
            "uri": uri,
            "storage_options": storage_options,
            "run_ids": run_ids,
            "strict": strict,
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "model_support.store_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._answer: tuple[bytes, bytes] | BaseException | None = None
        self._thread = threading.Thread(
            target=self._talk, args=(json.dumps(request).encode(),), daemon=True
        )
        self._thread.start()

    def _talk(self, request: bytes) -> None:
        try:
            self._answer = self._proc.communicate(request)
        except BaseException as exc:  # handed to the caller by result()
            self._answer = exc

    def result(self) -> tuple[dict[MatrixKey, pa.Table], dict[str, str], list[str], pa.Table]:
        """Wait for the helper: its tables, where each record went, its warnings, and its
        records' history rows."""
        self._thread.join()
        if isinstance(self._answer, BaseException):
            raise self._answer
        assert self._answer is not None
        out, err = self._answer
        header_line, _, body = out.partition(b"\n")
        try:
            header = json.loads(header_line)
        except ValueError:
            tail = err.decode(errors="replace")[-2000:]
            raise StoreError(
                f"a materialize helper process exited with status {self._proc.returncode} "
                f"without an answer:\n{tail}"
            ) from None
        if "corrupt" in header:
            raise CorruptRecord(*header["corrupt"])
        if "error" in header:
            raise StoreError(f"a materialize helper process failed: {header['error']}")
        tables = {}
        offset = 0
        for key_text, size in header["tables"]:
            tables[_key_from_json(key_text)] = _from_ipc(body[offset : offset + size])
            offset += size
        history = _from_ipc(body[offset : offset + header["history"]], HISTORY_SCHEMA)
        return tables, header["placed"], header["problems"], history

    def stop(self) -> None:
        """Make sure the helper is gone (after its answer, or when the caller gave up)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._thread.join(timeout=30)


def fold_share(request: dict[str, Any]) -> bytes:
    """The helper's side of :class:`_FoldHelper`: fold the share, answer in the protocol."""
    store = ResultsStore(request["uri"], request["storage_options"])
    try:
        with warnings.catch_warnings(record=True) as caught, _no_cyclic_gc():
            warnings.simplefilter("always", CorruptRecordWarning)
            tables, placed, history = _fold_records(
                store._read_records(request["run_ids"], request["strict"])
            )
    except CorruptRecord as exc:
        return json.dumps({"corrupt": [exc.path, exc.reason]}).encode() + b"\n"
    except StoreError as exc:
        return json.dumps({"error": str(exc)}).encode() + b"\n"
    problems = [str(w.message) for w in caught if issubclass(w.category, CorruptRecordWarning)]
    blobs = [(_key_json(key), _to_ipc(table)) for key, table in tables.items()]
    history_blob = _to_ipc(history)
    header = {
        "tables": [[key_text, len(blob)] for key_text, blob in blobs],
        "placed": placed,
        "problems": problems,
        "history": len(history_blob),
    }
    return json.dumps(header).encode() + b"\n" + b"".join(blob for _, blob in blobs) + history_blob


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _from_ipc(data: bytes, schema: pa.Schema = MATRIX_SCHEMA) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().cast(schema)


def _recencies(table: pa.Table) -> list[tuple[Any, str]]:
    """Each row's "latest" sort key, as :func:`model_support.dataset.recency` gives it for the
    record the row came from: (finished_at, else recorded_at; run_id)."""
    finished = table.column("finished_at").to_pylist()
    recorded = table.column("recorded_at").to_pylist()
    run_ids = table.column("run_id").to_pylist()
    return [(f or r, i) for f, r, i in zip(finished, recorded, run_ids, strict=True)]


def history_bytes(table: pa.Table) -> bytes:
    """The history file's bytes for ``table`` (rows in :func:`_history_order`): zstd, in row
    groups of :data:`HISTORY_ROW_GROUP` rows."""
    buffer = io.BytesIO()
    pq.write_table(
        table.combine_chunks(), buffer, row_group_size=HISTORY_ROW_GROUP, compression="zstd"
    )
    return buffer.getvalue()


def _history_keys(table: pa.Table) -> list[tuple[str, str, str]]:
    """Each row's (model, task, run id): the key :func:`_history_order` sorts by."""
    return list(
        zip(
            table.column("model_id").to_pylist(),
            table.column("task").to_pylist(),
            table.column("run_id").to_pylist(),
            strict=True,
        )
    )


def _insert_rows(base: pa.Table, added: pa.Table) -> pa.Table:
    """``added`` spliced into ``base`` (both in :func:`_history_order`): the same rows in the
    same order as sorting the two together, without sorting what is already in order."""
    if added.num_rows == 0:
        return base
    if added.num_rows > max(1000, base.num_rows // 10):
        return _history_order(pa.concat_tables([base, added]))  # many: one sort is cheaper
    order = _history_keys(base)
    new = _history_keys(added)
    pieces, start = [], 0
    for j, key in enumerate(new):
        position = bisect.bisect_left(order, key)
        pieces.append(base.slice(start, position - start))
        pieces.append(added.slice(j, 1))
        start = position
    pieces.append(base.slice(start))
    return pa.concat_tables(pieces)


def _history_order(table: pa.Table) -> pa.Table:
    """History rows in the matrix's row order (model, task, run id): any fold gives the same
    bytes."""
    if table.num_rows < 2:
        return table
    order = pc.sort_indices(
        table, sort_keys=[(name, "ascending") for name in ("model_id", "task", "run_id")]
    )
    return table.take(order)


def _slots(table: pa.Table) -> list[tuple[str, str]]:
    return list(
        zip(table.column("model_id").to_pylist(), table.column("task").to_pylist(), strict=True)
    )


def _combine(tables: Sequence[pa.Table]) -> pa.Table:
    """Tables of one matrix file (each already latest per slot) as one: per (model, task) the
    latest row of any of them, in the file's row order."""
    if len(tables) == 1:
        return tables[0]
    if not tables:
        return MATRIX_SCHEMA.empty_table()
    return _latest_rows(pa.concat_tables(tables))


def _latest_rows(table: pa.Table) -> pa.Table:
    """Per (model, task) the latest row of ``table`` (see :func:`_recencies`), in the file's
    row order, (model_id, task, run_id)."""
    slots = _slots(table)
    if len(set(slots)) == len(slots) and _in_file_order(table):
        return table.combine_chunks()  # one row per slot, already in order: nothing to choose
    best: dict[tuple[str, str], int] = {}
    when = _recencies(table)
    for i, slot in enumerate(slots):
        j = best.get(slot)
        if j is None or when[i] > when[j]:
            best[slot] = i
    # The file's row order, (model_id, task, run_id); when[i][1] is the row's run id.
    order = sorted(best.values(), key=lambda i: (*slots[i], when[i][1]))
    return table.take(pa.array(order, pa.int64())).combine_chunks()


def _in_file_order(table: pa.Table) -> bool:
    """Whether the rows are in the file's order, (model_id, task, run_id)."""
    keys = list(
        zip(
            table.column("model_id").to_pylist(),
            table.column("task").to_pylist(),
            table.column("run_id").to_pylist(),
            strict=True,
        )
    )
    return all(a <= b for a, b in itertools.pairwise(keys))


def _merge(base: pa.Table, added: pa.Table) -> pa.Table:
    """``base`` (a matrix file's rows) with ``added`` (new rows of the same file, latest per
    slot) folded in: per (model, task) the latest of the two, exactly as a rebuild would
    choose, the new rows spliced into place without re-sorting what is already in order."""
    if added.num_rows > max(1000, base.num_rows // 10):
        return _combine([base, added])  # many new rows: one sort is cheaper than splicing
    rows = {slot: i for i, slot in enumerate(_slots(base))}
    added_when = _recencies(added)
    replaced: set[int] = set()
    winners: list[int] = []
    for j, slot in enumerate(_slots(added)):
        i = rows.get(slot)
        if i is not None:
            there = (
                base.column("finished_at")[i].as_py() or base.column("recorded_at")[i].as_py(),
                base.column("run_id")[i].as_py(),
            )
            if there >= added_when[j]:
                continue  # the row already there is as recent (or the same record folded again)
            replaced.add(i)
        winners.append(j)
    if not winners:
        return base
    # Still in the file's row order; when every added row wins, no copy of them is taken.
    new = added if len(winners) == added.num_rows else added.take(pa.array(winners, pa.int64()))
    order = _history_keys(base)
    new_order = _history_keys(new)
    events = sorted(
        [(bisect.bisect_left(order, k), 0, j) for j, k in enumerate(new_order)]
        + [(i, 1, -1) for i in replaced]
    )
    pieces = []
    start = 0
    for position, kind, j in events:
        if position > start:
            pieces.append(base.slice(start, position - start))
            start = position
        if kind == 0:
            pieces.append(new.slice(j, 1))
        else:
            start = position + 1
    pieces.append(base.slice(start))
    # One chunk per column, as a rebuild gives: the same rows write the same bytes.
    return pa.concat_tables(pieces).combine_chunks()
