"""The materialize lock of a results store on an object store: a lease file, renewed while held.

Object stores have no ``flock``. A materializer holds the store by owning ``index/lock.json``:

- it creates the file only if none exists (S3: ``PutObject`` with ``If-None-Match: *``);
- while it works, a heartbeat thread rewrites the file every :data:`RENEW_S`, each write
  conditional on the version it wrote last (``If-Match: <ETag>``), so a lease never runs out
  under a live holder however long the materialize takes;
- a waiter that sees the same version of the file for :data:`LEASE_S` of its own clock takes
  the holder for dead (killed, partitioned) and takes the lock over with a write conditional on
  that very version: of several waiters only one succeeds, and a holder that renewed meanwhile
  keeps it. No clocks are compared between machines;
- it releases the lock with a delete conditional on its own version (``DeleteObject`` with
  ``If-Match``), so it never removes a lock another writer took over.

A holder counts its lease from when it SENT its last successful write (the version a waiter
sees cannot be older) and, once 3/4 of :data:`LEASE_S` passed without a renewal, counts the lock
as lost and stops before its next write (:meth:`Lease.check`): a waiter takes over only after
seeing one version for a full :data:`LEASE_S`.

S3 (and S3-compatible stores that implement conditional writes) get exactly this. Other fsspec
filesystems have no conditional write: there the version is the file's content, and the
take-over and release check it and then write, which is safe from a dead holder and from a
renewing one but not from two waiters taking over at the same instant; ``memory://`` lives in
one process, where that does not arise in practice.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from fsspec import AbstractFileSystem

LEASE_S = 30.0
"""A lock file unchanged for this long belongs to a materializer that died."""
RENEW_S = LEASE_S / 6
"""How often a holder rewrites its lock file."""


class LeaseLost(Exception):
    """The holder could not renew its lease in time: another materializer may hold the store."""


class _Conflict(Exception):
    """A conditional write or delete found another version than the one it was conditional on."""


def _is_precondition_failure(exc: BaseException) -> bool:
    """Whether an s3fs error is S3's 412 PreconditionFailed or 409 ConditionalRequestConflict."""
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


class _S3Files:
    """The lock file through S3's conditional requests; a version is the object's ETag."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(path)

    def create(self, body: bytes) -> str:
        """Write the file if none exists; its version. FileExistsError if one does."""
        try:
            reply = self.fs.call_s3(
                "put_object", Bucket=self.bucket, Key=self.key, Body=body, IfNoneMatch="*"
            )
        except OSError as exc:
            if _is_precondition_failure(exc):  # 409: a concurrent create won
                raise FileExistsError(self.key) from exc
            raise
        return str(reply["ETag"])

    def read(self) -> tuple[bytes, str]:
        """The file's content and version, read in one request. FileNotFoundError if none."""
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str]:
            reply = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            try:
                body = await reply["Body"].read()
            finally:
                reply["Body"].close()
            return body, str(reply["ETag"])

        result: tuple[bytes, str] = sync(self.fs.loop, get)
        return result

    def replace(self, version: str, body: bytes) -> str:
        """Overwrite the file if it is still at ``version``; its new version. _Conflict if not."""
        with self._conditionally():
            reply = self.fs.call_s3(
                "put_object", Bucket=self.bucket, Key=self.key, Body=body, IfMatch=version
            )
        return str(reply["ETag"])

    def delete(self, version: str) -> None:
        """Delete the file if it is still at ``version``; _Conflict if it is not."""
        with self._conditionally():
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=version)

    @contextlib.contextmanager
    def _conditionally(self) -> Iterator[None]:
        """A conditional request whose precondition failed (or whose file is gone) is
        _Conflict; any other failure is the store's and propagates."""
        try:
            yield
        except FileNotFoundError as exc:
            raise _Conflict(self.key) from exc
        except OSError as exc:
            if _is_precondition_failure(exc):
                raise _Conflict(self.key) from exc
            raise


class _PlainFiles:
    """The lock file on a filesystem without conditional writes; a version is its content."""

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path

    def create(self, body: bytes) -> str:
        self.fs.pipe_file(self.path, body, mode="create")
        return body.decode()

    def read(self) -> tuple[bytes, str]:
        body = self.fs.cat_file(self.path)
        return body, body.decode(errors="replace")

    def replace(self, version: str, body: bytes) -> str:
        self._expect(version)
        self.fs.pipe_file(self.path, body)
        return body.decode()

    def delete(self, version: str) -> None:
        self._expect(version)
        self.fs.rm_file(self.path)

    def _expect(self, version: str) -> None:
        """_Conflict unless the file is still at ``version`` (its content)."""
        try:
            current = self.fs.cat_file(self.path).decode(errors="replace")
        except FileNotFoundError as exc:
            raise _Conflict(self.path) from exc
        if current != version:
            raise _Conflict(self.path)


def _files(fs: AbstractFileSystem, path: str) -> _S3Files | _PlainFiles:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & {"s3", "s3a"} and hasattr(fs, "call_s3"):
        return _S3Files(fs, path)
    return _PlainFiles(fs, path)


class Lease:
    """One materializer's hold on ``path`` (see the module); use :meth:`held`."""

    def __init__(self, fs: AbstractFileSystem, path: str, lease_s: float | None = None) -> None:
        self.lease_s = LEASE_S if lease_s is None else lease_s
        self.renew_s = self.lease_s / 6
        self._files = _files(fs, path)
        self._owner = uuid.uuid4().hex
        self._renewals = 0
        self._version = ""
        self._renewed_at = 0.0  # time.monotonic() when the last successful write was sent
        self._lost: BaseException | None = None
        self._stop = threading.Event()

    def _body(self) -> bytes:
        self._renewals += 1
        # The count makes every renewal a new version (an ETag is a digest of the content).
        return json.dumps(
            {"owner": self._owner, "renewal": self._renewals, "lease_s": self.lease_s}
        ).encode()

    def _acquire(self, wait: Callable[[], None]) -> None:
        seen: tuple[str, float] | None = None  # a version of the file, and when we first saw it
        while True:
            try:
                sent = time.monotonic()
                self._version = self._files.create(self._body())
                self._renewed_at = sent
                return
            except FileExistsError:
                pass
            try:
                _, version = self._files.read()
            except FileNotFoundError:
                continue  # released meanwhile
            now = time.monotonic()
            if seen is None or seen[0] != version:
                seen = (version, now)  # the holder renewed (or a new one took it): it is alive
            elif now - seen[1] >= self.lease_s:
                try:  # unchanged for a whole lease: its holder died; take it over
                    self._version = self._files.replace(version, self._body())
                    self._renewed_at = now
                    return
                except _Conflict:
                    seen = None  # another waiter took it over, or the holder came back
                    continue
            wait()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                sent = time.monotonic()
                self._version = self._files.replace(self._version, self._body())
                self._renewed_at = sent
            except _Conflict as exc:
                self._lost = exc  # taken over: this holder's writes must stop
                return
            except OSError:
                # A transient store error: try again at the next beat; check() counts the time.
                continue

    def check(self) -> None:
        """Raise :class:`LeaseLost` if this holder may no longer hold the lock."""
        late = time.monotonic() - self._renewed_at > self.lease_s * 0.75
        if self._lost is not None or late:
            raise LeaseLost(
                "the materialize lock could not be renewed in time (the store was unreachable "
                "or another materializer took it over); nothing more is written: materialize again"
            ) from self._lost

    @contextlib.contextmanager
    def held(self, wait: Callable[[], None]) -> Iterator[Lease]:
        """Acquire (calling ``wait`` between tries; it raises to give up), renew while inside,
        release on the way out."""
        self._acquire(wait)
        beat = threading.Thread(target=self._heartbeat, name="materialize-lease", daemon=True)
        beat.start()
        try:
            yield self
        finally:
            self._stop.set()
            beat.join()
            if self._lost is None:
                with contextlib.suppress(_Conflict):  # taken over meanwhile: not ours to delete
                    self._files.delete(self._version)


__all__ = ["LEASE_S", "RENEW_S", "Lease", "LeaseLost"]
