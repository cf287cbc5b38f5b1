"""Model references: telling a Hub model id from a local checkpoint, with clear errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

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
    if not _HUB_ID.fullmatch(text) or "--" in text or ".." in text:
        raise BadModelReference(
            f"{text!r} is not a valid Hub model id: expected 'org/name' with letters, digits, '-', '_' or '.'"
        )
    return ModelRef(text, is_local=False)


# --- how results name a model ---------------------------------------------------------------

LOCAL_NAMESPACE = "local"
"""Namespace of a local checkpoint's id in results: ``local/<folder name>``."""
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._-]+")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def is_local_path(model: str) -> bool:
    """Whether a tested model is a checkpoint path (absolute, as resolve_model makes it), not a Hub id."""
    return PurePosixPath(model).is_absolute() or PureWindowsPath(model).is_absolute()


def readable_model_id(model: str, namespace: str = LOCAL_NAMESPACE) -> str:
    """How results name ``model``: a Hub id as it is; a checkpoint path as ``<namespace>/<folder>``.

    A path is specific to one machine and unreadable in a table; the folder name is what people
    call the checkpoint, and it stays the same when the folder moves. The path itself is kept
    beside it (the matrix's ``model_path``; the document's ``model``).
    """
    if not is_local_path(model):
        return model
    folder = PureWindowsPath(model).name if "\\" in model else PurePosixPath(model).name
    return f"{namespace}/{_UNSAFE_ID.sub('-', folder).strip('-.') or 'checkpoint'}"


def check_model_id(model_id: str) -> str:
    """``model_id`` if it can name a model in results (``namespace/name``, Hub-id characters)."""
    if not _MODEL_ID.fullmatch(model_id) or "--" in model_id or ".." in model_id:
        raise BadModelReference(
            f"{model_id!r} cannot name a model in results: use 'namespace/name' with letters, "
            "digits, '-', '_' or '.', e.g. 'local/my-checkpoint'"
        )
    return model_id


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""Files that hold a checkpoint's weights (run.py keeps the same list; a test holds them equal)."""


def weights_digest(folder: str) -> str | None:
    """sha256 of a local checkpoint's weights: over each weight file's path (relative to
    ``folder``, sorted) and its content's sha256, so a row names exactly the weights it tested.
    None when the folder holds no weight file or cannot be read. run.py computes the same for
    the runs it makes (it cannot import this package); this one serves records made without
    running it (EXCLUDED)."""
    import hashlib
    import os

    entries = []
    try:
        for root, _, names in os.walk(folder):
            for name in names:
                if name.endswith(WEIGHT_SUFFIXES):
                    path = os.path.join(root, name)
                    digest = hashlib.sha256()
                    with open(path, "rb") as handle:
                        for block in iter(lambda: handle.read(1 << 20), b""):
                            digest.update(block)
                    entries.append(f"{os.path.relpath(path, folder)}\0{digest.hexdigest()}\n")
    except OSError:
        return None
    if not entries:
        return None
    return hashlib.sha256("".join(sorted(entries)).encode()).hexdigest()
