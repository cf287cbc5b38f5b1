"""The delivery area of a results store: where a runner pod leaves its result document.

A result must never depend on a pod log surviving (a node removed after the Job ended, a log
rotated, thousands of lines printed after the result). So the runner pod itself writes its
document to durable storage, keyed by the run id the operator gave it, before anything else
happens; the operator reads it from there and only falls back to the log and the termination
message when nothing was delivered.

Layout, beside the records of the same store (see :mod:`model_support.store`)::

    deliveries/<run_id>.json   the result document one runner delivered (JSON, as run.py wrote it)

A delivery is not a record: it is what a pod *said*. The operator checks it against what the
test asked for, builds the record from it, and removes the delivery once the record is stored.
A retried pod of the same run (same run id, after a disruption) overwrites its predecessor's
delivery, which is right: only the last pod of a run finishes it.

This module imports only fsspec, so the runner image needs nothing heavier to deliver.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

DELIVERIES_DIR = "deliveries"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
MAX_DOCUMENT_BYTES = 64 * 2**20
"""A delivered document larger than this is refused by the reader (run.py's are ~100 KiB)."""


class DeliveryError(OSError):
    """The delivery area could not be written or read (the store is unreachable or refuses)."""


def _check(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} cannot name a delivery: use 1-200 characters from "
            "[A-Za-z0-9._-], starting with a letter or digit"
        )
    return run_id


class DeliveryArea:
    """``deliveries/`` under one results store URI (a local path or any fsspec URL)."""

    def __init__(
        self, store_uri: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.store_uri = os.fspath(store_uri)
        fs, root = url_to_fs(self.store_uri, **(storage_options or {}))
        self.fs: AbstractFileSystem = fs
        self.root = "/".join([root.rstrip("/") or "", DELIVERIES_DIR])
        self._local = isinstance(fs, LocalFileSystem)

    def path(self, run_id: str) -> str:
        """Where the document of ``run_id`` is (or will be) delivered, as a full URI."""
        path = f"{self.root}/{_check(run_id)}.json"
        return path if self._local else self.fs.unstrip_protocol(path)

    def put(self, run_id: str, document: bytes) -> str:
        """Deliver ``document`` for ``run_id`` (atomically, replacing an earlier delivery)."""
        path = f"{self.root}/{_check(run_id)}.json"
        try:
            if self._local:
                self.fs.makedirs(self.root, exist_ok=True)
                temp = f"{self.root}/.{run_id}.{uuid.uuid4().hex}.tmp"
                with open(temp, "wb") as handle:
                    handle.write(document)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, path)
            else:
                self.fs.pipe_file(path, document)  # one PUT: atomic on object stores
        except Exception as exc:  # fsspec backends raise their own types; classify them all
            raise DeliveryError(f"could not deliver to {self.path(run_id)}: {exc}") from exc
        return self.path(run_id)

    def get(self, run_id: str) -> bytes | None:
        """The delivered document of ``run_id``; None when nothing was delivered.

        Raises :class:`DeliveryError` when the store cannot be read (that is not "nothing
        delivered": the caller must retry, not conclude).
        """
        path = f"{self.root}/{_check(run_id)}.json"
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise DeliveryError(f"could not read {self.path(run_id)}: {exc}") from exc
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ValueError(
                f"{self.path(run_id)} holds {len(data)} bytes, more than any result document "
                f"({MAX_DOCUMENT_BYTES} at most); it was not written by a runner"
            )
        return bytes(data)

    def remove(self, run_id: str) -> None:
        """Forget the delivery of ``run_id`` (after its record is stored); missing is fine."""
        path = f"{self.root}/{_check(run_id)}.json"
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise DeliveryError(f"could not remove {self.path(run_id)}: {exc}") from exc

    def run_ids(self) -> list[str]:
        """Run ids with a delivery waiting (for housekeeping and tests)."""
        try:
            paths = self.fs.glob(f"{self.root}/*.json")
        except FileNotFoundError:
            return []
        return sorted(str(p).rsplit("/", 1)[-1].removesuffix(".json") for p in paths)
