"""The curated list of selected models, kept with the dataset (``<results>/selected.yaml``).

Each entry names a model and its task; a model left out on purpose carries the reason. The
viewer's Selected view reads it; the demo writes one for its models.
"""

from __future__ import annotations

import json

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_support.store import ResultsStore
from model_support.vocabulary import Task

SELECTED_NAMES = ("selected.yaml", "selected.yml", "selected.json")
"""Where the curated list lives, relative to the results root (first one found wins)."""


class SelectionError(ValueError):
    """The selected list exists but is malformed; the message says what to fix."""


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

    Raises SelectionError when the file exists but is malformed.
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
            raise SelectionError(
                f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}"
            ) from exc
        if isinstance(data, list):  # a bare list of entries is accepted too
            data = {"models": data}
        try:
            return SelectedList.model_validate(data or {}), path
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise SelectionError(
                f"{path} is not a valid selected list: {where}: {first['msg']}. Expected "
                "`models:` followed by entries of `model: org/name`, `task: text-generation` and, "
                "for a model left out on purpose, `reason: ...`"
            ) from exc
    return None, " or ".join(SELECTED_NAMES) + f" under {results_uri}"


def save_selected(results_uri: str, selected: SelectedList) -> str:
    """Write ``selected.yaml`` at the results root (atomically, via the store's filesystem)."""
    store = ResultsStore(results_uri)
    path = f"{store.root.rstrip('/')}/{SELECTED_NAMES[0]}"
    text = yaml.safe_dump(selected.model_dump(mode="json", exclude_none=True), sort_keys=False)
    tmp = f"{path}.tmp"
    store.fs.makedirs(store.root, exist_ok=True)
    store.fs.pipe_file(tmp, text.encode())
    store.fs.mv(tmp, path)
    return path
