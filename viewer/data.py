"""Reading what the viewer shows: the matrix files (only the columns a view needs) and the
curated list of selected models kept with the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.dataset import MATRIX_COLUMNS
from model_support.store import ResultsStore
from model_support.vocabulary import Task

SELECTED_NAMES = ("selected.yaml", "selected.yml", "selected.json")
"""Where the curated list lives, relative to the results root (first one found wins)."""


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


class SelectedEntry(BaseModel):
    """A curated model: tested as part of the selected list, or left out on purpose (``reason``)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, description="Hub model id (org/name).")
    task: Task = Task.TEXT_GENERATION
    reason: str | None = Field(
        None, description="Why the model is deliberately left out; None = tested."
    )


class SelectedList(BaseModel):
    """The curated list kept with the dataset (``<results>/selected.yaml`` or ``.json``)."""

    model_config = ConfigDict(extra="forbid")

    models: list[SelectedEntry] = Field(default_factory=list)

    def rows(self) -> list[tuple[str, str, str | None]]:
        """(model, task, reason) per entry, for queries.selected_table."""
        return [(e.model, e.task.value, e.reason) for e in self.models]


def load_selected(results_uri: str) -> tuple[SelectedList | None, str]:
    """The selected list and where it was read; (None, where it was looked for) when absent.

    Raises ViewerDataError when the file exists but is malformed.
    """
    store = ResultsStore(results_uri)
    candidates = [f"{store.root.rstrip('/')}/{name}" for name in SELECTED_NAMES]
    for path in candidates:
        if not store.fs.exists(path):
            continue
        text = store.fs.cat_file(path).decode()
        try:
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ViewerDataError(
                f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}"
            ) from exc
        if isinstance(data, list):  # a bare list of entries is accepted too
            data = {"models": data}
        try:
            return SelectedList.model_validate(data or {}), path
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ViewerDataError(
                f"{path} is not a valid selected list: {where}: {first['msg']}. Expected "
                "`models:` followed by entries of `model: org/name`, `task: text-generation` and, "
                "for a model left out on purpose, `reason: ...`"
            ) from exc
    return None, " or ".join(SELECTED_NAMES) + f" under {results_uri}"
