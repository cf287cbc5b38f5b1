"""Model references: telling a Hub model id from a local checkpoint, with clear errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Hub ids: "name" (legacy, un-namespaced) or "org/name"; letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(
    r"^(?:[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?/)?[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?$"
)


class BadModelReference(ValueError):
    """The model argument is neither an existing checkpoint directory nor a valid Hub id."""


@dataclass(frozen=True)
class ModelRef:
    """A model to test: a Hub id or a local directory (absolute, so run.py finds it anywhere)."""

    value: str
    is_local: bool


def resolve_model(model: str) -> ModelRef:
    """Classify ``model`` as a local checkpoint directory or a Hub id, or raise BadModelReference."""
    text = model.strip()
    if not text:
        raise BadModelReference(
            "the model is empty: give a Hub id like 'org/name' or a checkpoint directory"
        )
    path = Path(text).expanduser()
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or path.exists()
    if looks_like_path:
        if not path.exists():
            raise BadModelReference(f"no such checkpoint directory: {text!r} (check the path)")
        if not path.is_dir():
            raise BadModelReference(
                f"{text!r} is a file; give the checkpoint directory that holds config.json"
            )
        if not (path / "config.json").is_file():
            raise BadModelReference(
                f"{text!r} has no config.json: give a directory written by save_pretrained"
            )
        return ModelRef(str(path.resolve()), is_local=True)
    if not _HUB_ID.match(text) or "--" in text or ".." in text:
        raise BadModelReference(
            f"{text!r} is not a valid Hub model id: expected 'org/name' with letters, digits, '-', '_' or '.'"
        )
    return ModelRef(text, is_local=False)
