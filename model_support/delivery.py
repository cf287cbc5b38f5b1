"""Where a runner pod leaves its result document: one unguessable slot per attempt.

A result must never depend on a pod log surviving (a node removed after the Job ended, a log
rotated, thousands of lines printed after the result). So the runner pod itself writes its
document to durable storage before anything else happens; the operator reads it from there and
only falls back to the log and the termination message when nothing was delivered.

A runner pod runs code the project does not control (the model's own code, extra packages, a
compile backend, a pulled compile cache). So it is given the means to write *one* object, its
own attempt's slot, and nothing else: never credentials to the results store. The slot's name
is derived from the run id with a key only the operator holds (an HMAC), so knowing a run id
(records and statuses show them) does not tell where its document goes. Per store kind:

* ``s3://``: the operator signs a PUT URL for the slot's one key (``delivery_url``) and hands it
  to the pod in a Secret; the pod holds no AWS credentials for the store.
* a path on the shared results volume (a PVC): the operator creates the slot's folder and the
  pod mounts only that folder (a ``subPath``), never the store.
* anything else (``hf://`` ...): no delivery; the operator reads the log and the termination
  message.

Layout, beside the records of the same store (see :mod:`model_support.store`)::

    deliveries/<run_id>.<token>/result.json   what one runner delivered (JSON, as run.py wrote it)

A delivery is not a record: it is what a pod *said* about its own attempt. The operator checks
it against what the test asked for and what Kubernetes says happened, builds the record from
it, and removes the slot once the record is stored. The runner delivers twice (before and
after its compile cache push); the second replaces the first.

This module imports only the standard library and fsspec, so the runner image needs nothing
heavier to deliver.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

log = logging.getLogger(__name__)

DELIVERIES_DIR = "deliveries"
RESULT_NAME = "result.json"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SLOT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.[0-9a-f]{32}")
MAX_DOCUMENT_BYTES = 64 * 2**20
"""A delivered document larger than this is refused unread (run.py's are ~100 KiB)."""
DELIVERY_KEY_ENV = "MODEL_SUPPORT_DELIVERY_KEY"
"""The operator's environment variable holding the slot key (the chart fills it from a Secret)."""
MIN_KEY_BYTES = 16
REMOVED_DIR = ".removed"
"""Under ``deliveries/``: local slots set aside for removal, emptied a bounded amount at a time
(a dot name: never a slot)."""
REMOVAL_BUDGET = 5000
"""Names one :meth:`DeliveryArea.purge` removes at most: removing a slot never takes
unbounded time, whatever a runner pod left in it (the rest goes on the next call)."""
REMOVAL_SECONDS = 5.0
"""... and about how long it may take (a network file system answers each removal slowly)."""
SWEEP_LIMIT = 1000
"""Slots :meth:`DeliveryArea.remove_recorded` looks at per call."""
SLOT_MODE = 0o777
"""A local slot's folder mode: the runner's uid is the pod's, not the operator's, and only the
runner's pod mounts the folder (the store's other folders are never mounted in a pod)."""


class DeliveryError(OSError):
    """A delivery could not be written or read (the store is unreachable or refuses)."""


def _check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r} cannot name a delivery: use 1-200 characters from "
            "[A-Za-z0-9._-], starting with a letter or digit"
        )
    return run_id


def _check_slot(slot: str) -> str:
    if not _SLOT.fullmatch(slot):
        raise ValueError(f"{slot!r} is not a delivery slot (<run id>.<32 hex digits>)")
    return slot


def delivery_key(environ: dict[str, str] | None = None) -> tuple[bytes, bool]:
    """The operator's slot key from ``MODEL_SUPPORT_DELIVERY_KEY``, and whether it was set.

    Unset: a random key for this process (slots of runs started by an earlier operator process
    cannot be found then; those runs fall back to the log and termination message). A key
    shorter than 16 bytes is refused: a guessable key makes every slot guessable.
    """
    value = (os.environ if environ is None else environ).get(DELIVERY_KEY_ENV, "")
    if not value:
        return secrets.token_bytes(32), False
    key = value.encode()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{DELIVERY_KEY_ENV} holds {len(key)} bytes; use at least {MIN_KEY_BYTES} random "
            "bytes (the chart generates 48)"
        )
    return key, True


def slot_for(run_id: str, key: bytes) -> str:
    """The delivery slot of ``run_id``: unguessable without ``key``, the same on every replay."""
    token = hmac.new(key, _check_run_id(run_id).encode(), hashlib.sha256).hexdigest()[:32]
    return f"{run_id}.{token}"


def slot_subpath(store_uri: str, volume_root: str, slot: str) -> str | None:
    """The slot's folder relative to the results volume's mount (a pod's ``subPath``), or None
    when ``store_uri`` is not a path on that volume."""
    store, root = os.path.normpath(store_uri), os.path.normpath(volume_root)
    if "://" in store_uri or "://" in volume_root:
        return None
    relative = os.path.relpath(store, root)
    if relative == ".":
        return f"{DELIVERIES_DIR}/{_check_slot(slot)}"
    if relative.startswith(".."):
        return None
    return f"{relative}/{DELIVERIES_DIR}/{_check_slot(slot)}"


class DeliveryArea:
    """``deliveries/`` under one results store URI, as the operator (who holds the store's
    credentials) sees it: prepares slots, signs upload URLs, reads and removes deliveries."""

    def __init__(
        self, store_uri: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.store_uri = os.fspath(store_uri)
        fs, root = url_to_fs(self.store_uri, **(storage_options or {}))
        self.fs: AbstractFileSystem = fs
        self.root = "/".join([root.rstrip("/") or "", DELIVERIES_DIR])
        self.local = isinstance(fs, LocalFileSystem)

    @property
    def signs_urls(self) -> bool:
        """Whether this store can hand a pod a URL that writes one key (S3's presigned PUT)."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        return any(p in ("s3", "s3a") for p in protocols)

    def _file(self, slot: str) -> str:
        return f"{self.root}/{_check_slot(slot)}/{RESULT_NAME}"

    def path(self, slot: str) -> str:
        """Where the document of ``slot`` is (or will be) delivered, as a full URI."""
        path = self._file(slot)
        return path if self.local else self.fs.unstrip_protocol(path)

    def prepare(self, slot: str) -> str:
        """Create a local slot's folder, writable by the runner's uid; returns it."""
        if not self.local:
            raise DeliveryError(f"{self.store_uri} is not a local store: it has no slot folders")
        folder = Path(f"{self.root}/{_check_slot(slot)}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if folder.is_symlink() or not folder.is_dir():
                raise DeliveryError(f"{folder} is not a plain folder; remove it")
            folder.chmod(SLOT_MODE)
        except DeliveryError:
            raise
        except OSError as exc:
            raise DeliveryError(f"could not prepare the delivery slot {folder}: {exc}") from exc
        return str(folder)

    def upload_url(self, slot: str, expires_s: int) -> str:
        """A URL that lets its holder PUT the slot's document, and nothing else, for
        ``expires_s`` seconds (S3: a presigned PUT, valid at most as long as the operator's
        own credentials are)."""
        if not self.signs_urls:
            raise DeliveryError(f"{self.store_uri} cannot sign upload URLs (only s3:// can)")
        options = dict(self.fs.storage_options)
        # Signature version 4: what every S3 region accepts (s3fs's default signs with v2).
        options["config_kwargs"] = {**options.get("config_kwargs", {}), "signature_version": "s3v4"}
        try:
            signer = type(self.fs)(**options)
            return str(signer.url(self._file(slot), expires=expires_s, client_method="put_object"))  # type: ignore[attr-defined]
        except Exception as exc:  # botocore's own types: classify them all
            raise DeliveryError(
                f"could not sign an upload URL for {self.path(slot)}: {exc}"
            ) from exc

    def get(self, slot: str) -> bytes | None:
        """The delivered document of ``slot``; None when nothing was delivered.

        Its size is checked before it is read: a slot holding more than any result document
        was not written by a runner and is refused unread. Raises :class:`DeliveryError` when
        the store cannot be read (that is not "nothing delivered": the caller must retry).
        """
        path = self._file(slot)
        if self.local:
            return self._get_local(slot, path)
        try:
            size = self.fs.size(path)
            if size is not None and size > MAX_DOCUMENT_BYTES:
                raise ValueError(self._too_large(slot, size))
            data = self.fs.cat_file(path, start=0, end=MAX_DOCUMENT_BYTES + 1)
        except FileNotFoundError:
            return None
        except ValueError:
            raise
        except Exception as exc:
            raise DeliveryError(f"could not read {self.path(slot)}: {exc}") from exc
        if len(data) > MAX_DOCUMENT_BYTES:  # it grew between the two requests
            raise ValueError(self._too_large(slot, len(data)))
        return bytes(data)

    def _get_local(self, slot: str, path: str) -> bytes | None:
        # The pod wrote this folder: never follow a link it left (it would read the operator's
        # own files), never open what is not a regular file (a FIFO would hang the read).
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"{path} is a symbolic link, not a delivered document") from exc
            raise DeliveryError(f"could not read {path}: {exc}") from exc
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{path} is not a regular file, not a delivered document")
            if info.st_size > MAX_DOCUMENT_BYTES:
                raise ValueError(self._too_large(slot, info.st_size))
            # read(n) sets aside n bytes at once: ask for what the file holds (and one more, to
            # see it grow), not for the largest document allowed.
            data = handle.read(info.st_size + 1)
            if len(data) > info.st_size:  # it grew since fstat: read on, up to the limit
                data += handle.read(MAX_DOCUMENT_BYTES + 1 - len(data))
        if len(data) > MAX_DOCUMENT_BYTES:  # it grew while it was read
            raise ValueError(self._too_large(slot, len(data)))
        return data

    def _too_large(self, slot: str, size: int) -> str:
        return (
            f"{self.path(slot)} holds {size} bytes, more than any result document "
            f"({MAX_DOCUMENT_BYTES} at most); it was not written by a runner"
        )

    def remove(self, slot: str) -> None:
        """Forget the delivery of ``slot`` (after its record is stored); missing is fine.

        A local slot was written by a runner pod, which may have left anything there (folders
        named like temporary files, links, sockets, deep trees, millions of files): it is set
        aside at once (one rename, whatever it holds) and emptied a bounded amount at a time
        (:meth:`purge`), so removing it never fails on what it holds nor takes unbounded time.
        Raises :class:`DeliveryError` only when the store itself refuses.
        """
        if not self.local:
            try:
                self.fs.rm_file(self._file(slot))
            except FileNotFoundError:
                pass
            except Exception as exc:
                raise DeliveryError(f"could not remove {self.path(slot)}: {exc}") from exc
            return
        folder = Path(f"{self.root}/{_check_slot(slot)}")
        aside = Path(self.root) / REMOVED_DIR
        try:
            aside.mkdir(exist_ok=True)
            os.rename(folder, aside / f"{slot}.{uuid.uuid4().hex}")
        except FileNotFoundError:
            pass  # nothing was prepared or delivered, or removed already
        except OSError as exc:
            raise DeliveryError(f"could not set {folder} aside for removal: {exc}") from exc
        self.purge()

    def purge(self, budget: int = REMOVAL_BUDGET, seconds: float = REMOVAL_SECONDS) -> int:
        """Remove up to ``budget`` names (within about ``seconds``) of the slots set aside for
        removal; what is left goes on the next call. Never follows a link, never opens what is
        not a folder, never recurses (a subfolder is moved up to the set-aside folder, so a
        deep tree costs no depth), and never raises for what a slot held: a name it cannot
        remove is left for the admin (said in the log). Returns how many names went."""
        if not self.local:
            return 0
        deadline = time.monotonic() + seconds
        try:
            top = os.open(
                Path(self.root) / REMOVED_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            )
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("cannot empty the removed delivery slots of %s: %s", self.root, exc)
            return 0
        removed = spent = 0
        try:
            with os.scandir(top) as listing:
                queue = [entry.name for _, entry in zip(range(budget), listing, strict=False)]
            while queue and spent < budget and time.monotonic() < deadline:
                name = queue.pop()
                gone, used, moved_up = _empty(top, name, budget - spent, deadline)
                removed += gone
                spent += used
                queue.extend(moved_up)
        finally:
            os.close(top)
        return removed

    def remove_recorded(self, recorded: Callable[[str], bool], limit: int = SWEEP_LIMIT) -> int:
        """Remove slots whose run is recorded already: a late write (an upload URL used again
        after the record, before it expired) or a slot a removal missed. At most ``limit``
        slots are looked at per call. Returns how many were removed."""
        removed = 0
        for slot in self._slot_names(limit):
            run_id = slot.rsplit(".", 1)[0]
            if recorded(run_id):
                self.remove(slot)
                removed += 1
        self.purge()
        return removed

    def _slot_names(self, limit: int) -> list[str]:
        """Up to ``limit`` slot names present under ``deliveries/``."""
        try:
            if self.local:
                with os.scandir(self.root) as listing:
                    names = [e.name for _, e in zip(range(limit), listing, strict=False)]
            else:
                names = [
                    str(p).rstrip("/").rsplit("/", 1)[-1]
                    for p in self.fs.ls(self.root, detail=False, refresh=True)
                ][:limit]
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise DeliveryError(
                f"could not list the delivery slots of {self.store_uri}: {exc}"
            ) from exc
        return [name for name in names if _SLOT.fullmatch(name)]

    def slots(self) -> list[str]:
        """Slots with a delivery waiting (for housekeeping and tests)."""
        try:
            paths = self.fs.glob(f"{self.root}/*/{RESULT_NAME}")
        except FileNotFoundError:
            return []
        return sorted(str(p).rsplit("/", 2)[-2] for p in paths)


def _empty(top: int, name: str, budget: int, deadline: float) -> tuple[int, int, list[str]]:
    """Remove ``name`` of the folder open as ``top``: a file or link at once; a folder by
    removing its files and moving its subfolders up into ``top`` (returned, to be emptied
    next), then itself once empty. Returns (names removed, operations spent, moved up)."""
    removed = spent = 0
    moved: list[str] = []
    try:
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=top)
            return 1, 1, moved
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    except FileNotFoundError:
        return 0, 1, moved
    except OSError as exc:
        log.warning("a removed delivery slot's %s stays: %s", name, exc)
        return 0, 1, moved
    finished = True
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                if spent >= budget or time.monotonic() >= deadline:
                    finished = False
                    break
                spent += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        up = f"{uuid.uuid4().hex}.up"
                        os.rename(entry.name, up, src_dir_fd=folder, dst_dir_fd=top)
                        moved.append(up)
                    else:
                        os.unlink(entry.name, dir_fd=folder)
                        removed += 1
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    finished = False
                    log.warning("a removed delivery slot's %s stays: %s", entry.name, exc)
    finally:
        os.close(folder)
    if finished:
        try:
            os.rmdir(name, dir_fd=top)
            removed += 1
        except FileNotFoundError:
            pass  # another remover (the watchdog's sweep beside a recording) got there first
        except OSError as exc:  # written meanwhile, or not ours to remove: the next call
            log.warning("a removed delivery slot's %s stays for now: %s", name, exc)
    return removed, spent + 1, moved


# ---- the runner's side: one destination, no store credentials --------------------------


def deliver_to_folder(folder: str | os.PathLike[str], document: bytes) -> str:
    """Write ``document`` as ``result.json`` in the slot folder mounted into the pod
    (atomically: a reader sees the previous delivery or this one, never half of one)."""
    target = Path(folder) / RESULT_NAME
    temp = Path(folder) / f".{uuid.uuid4().hex}.tmp"
    try:
        with open(temp, "wb") as handle:
            handle.write(document)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise DeliveryError(f"could not deliver to {target}: {exc}") from exc
    return str(target)


def deliver_to_url(url: str, document: bytes, timeout_s: float = 60.0) -> str:
    """PUT ``document`` to the upload URL the operator signed for this attempt; returns where
    it went (the URL without its signature, which is a credential)."""
    where = url.split("?", 1)[0]
    if not url.startswith(("https://", "http://")):
        raise DeliveryError("the delivery URL is not an http(s) URL")
    request = urllib.request.Request(url, data=document, method="PUT")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace")
        raise DeliveryError(
            f"the store refused the delivery to {where}: {exc.code} {detail}"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"could not deliver to {where}: {exc}") from exc
    if not 200 <= status < 300:
        raise DeliveryError(f"the store answered {status} to the delivery to {where}")
    return where
