"""Reading what the viewer shows: the matrix files (only the columns a view needs) and the
curated list of selected models kept with the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import pyarrow.parquet as pq

from model_support.dataset import MATRIX_COLUMNS
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


def read_columns(
    results_uri: str,
    paths: Sequence[str],
    columns: Sequence[str],
    model_id: str | None = None,
) -> pd.DataFrame:
    """Read only ``columns`` of the given matrix files (optionally one model's rows).

    Columns the matrix does not have (e.g. ``parameters`` in an older dataset) are left out
    rather than failing, so a view can check for them.
    """
    present = [c for c in columns if c in MATRIX_COLUMNS]
    if not paths:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in present})
    store = ResultsStore(results_uri)
    stripped = [store.fs._strip_protocol(p) for p in paths]
    filters = [("model_id", "==", model_id)] if model_id is not None else None
    table = pq.read_table(stripped, filesystem=store.fs, columns=present, filters=filters)
    return table.to_pandas()
