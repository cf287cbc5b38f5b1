"""Where a compile cache is kept: a target URI, its compiler prefix, and how objects move.

A target is any fsspec URI (a local or PVC path, ``s3://bucket/key``, ``memory://``) or a
Hugging Face storage bucket ``hf://buckets/<namespace>/<name>[/<path>]``. Under its root each
compiler version has its own prefix (see :mod:`.compilers`); under the prefix, each entry of
the local cache is one object named by the entry's path, its content hash and its size::

    <root>/<prefix>/<entry path>@<sha256>-<size>
    e.g. s3://team/neff-cache/neuronxcc-2.28.7631.0/3f/a2/3fa2....neff@9b1c...-1048576

The name is the entry's manifest: a reader knows, before and after downloading, exactly which
bytes are the whole entry, so a truncated or corrupt object is detected and never loaded, and
no separate index has to be kept consistent. Because names are content addressed, two pushers
of the same entry write the same name with the same bytes (any interleaving leaves one valid
object), and two pushers with different bytes for one entry (a nondeterministic compile) leave
two valid versions, of which a pull takes the newest.

A target may also hold *plain* entries at their local paths (``<prefix>/3f/a2/<k>.neff``): the
layout of a mirror made with ``hf buckets sync``, such as the public TorchNeuron cache bucket.
They can be pulled, but carry no hash to verify, so they are counted as unverified.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from model_support.compile_cache.compilers import PREFIX_PATTERN, CompilerCache
from model_support.compile_cache.errors import BadCacheTarget, LocalCacheError, TargetUnavailable
from model_support.storage_errors import is_store_error

_VERIFIED_NAME = re.compile(r"^(?P<path>.+)@(?P<sha256>[0-9a-f]{64})-(?P<size>[0-9]{1,15})$")
_BUCKET = re.compile(r"^hf://buckets/(?P<id>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:/(?P<path>.*))?$")
_COPY_CHUNK = 1 << 20


def object_name(path: str, sha256: str, size: int) -> str:
    """The target object name of a verified entry."""
    return f"{path}@{sha256}-{size}"


@dataclass(frozen=True)
class StoredObject:
    """One object under a target's prefix: its name (relative to the prefix) and what the
    target says about it."""

    name: str
    size: int
    modified: datetime | None


@dataclass(frozen=True)
class RemoteEntry:
    """An entry as a target holds it: verified (hash and size in its name) or plain."""

    path: str  # the entry's path in the local cache
    object: StoredObject
    sha256: str | None  # None: a plain entry (no hash to check)
    size: int  # the size the entry must have (the declared one, or the stored one when plain)

    @property
    def verified(self) -> bool:
        """Whether the entry carries a hash that a pull checks."""
        return self.sha256 is not None

    @property
    def truncated(self) -> bool:
        """The stored object's size differs from the declared one: it can never verify."""
        return self.object.size != self.size


def parse_object(obj: StoredObject) -> RemoteEntry:
    """What an object under a prefix says it is (the caller checks the path's layout)."""
    match = _VERIFIED_NAME.fullmatch(obj.name)
    if match is None:
        return RemoteEntry(obj.name, obj, None, obj.size)
    return RemoteEntry(match["path"], obj, match["sha256"], int(match["size"]))


def redact(uri: str) -> str:
    """A URI without credentials, fit for records and logs (``scheme://user:pw@host`` -> host)."""
    return re.sub(r"^([a-z0-9+.-]+://)[^/@]*@", r"\1", uri)


class Target:
    """The objects of one target root, through fsspec; subclasses change how they move."""

    read_options: ClassVar[dict[str, Any]] = {}
    """Extra options of the file system's ``open`` when an object is read."""

    def __init__(self, uri: str, fs: AbstractFileSystem, root: str) -> None:
        self.uri = uri.rstrip("/") or uri
        self.fs = fs
        self.root = root.rstrip("/")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.uri)!r})"

    def _full(self, prefix: str, name: str = "") -> str:
        return "/".join(p for p in (self.root, prefix, name) if p)

    def check(self) -> None:
        """Raise :class:`TargetUnavailable` when the target's store (its bucket) does not exist.

        A missing folder under it is an empty cache (the first push creates it); a missing
        bucket is a mistake to report, not a cache to treat as empty.
        """
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.ls(bucket, detail=False)  # unlike exists(), says why it cannot see it
        except FileNotFoundError as exc:
            raise TargetUnavailable(
                f"the compile cache target {redact(self.uri)} is in a bucket that does not exist "
                f"or cannot be seen with these credentials ({bucket}); create it or fix the URI"
            ) from exc
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "open", exc) from exc

    def prefixes(self) -> list[str]:
        """The compiler prefixes present under the root."""
        try:
            names = self.fs.ls(self.root, detail=False) if self.fs.exists(self.root) else []
        except FileNotFoundError:
            return []
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "list", exc) from exc
        found = {str(n).rstrip("/").rsplit("/", 1)[-1] for n in names}
        return sorted(p for p in found if PREFIX_PATTERN.fullmatch(p))

    def children(self, limit: int) -> list[str]:
        """Up to ``limit`` names directly under the root (empty when it is missing)."""
        try:
            names = self.fs.ls(self.root, detail=False) if self.fs.exists(self.root) else []
        except FileNotFoundError:
            return []
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "list", exc) from exc
        return sorted(str(n).rstrip("/").rsplit("/", 1)[-1] for n in names)[:limit]

    def objects(self, prefix: str) -> list[StoredObject]:
        """Every object under ``prefix`` (recursively)."""
        base = self._full(prefix)
        try:
            if not self.fs.exists(base):
                return []
            found: dict[str, dict[str, Any]] = self.fs.find(base, detail=True)  # type: ignore[assignment]
        except FileNotFoundError:
            return []
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "list", exc) from exc
        objects = []
        for full, info in found.items():
            if info.get("type", "file") != "file":
                continue
            name = self.fs._strip_protocol(full)[len(self.fs._strip_protocol(base)) :].lstrip("/")
            objects.append(StoredObject(name, int(info.get("size") or 0), _modified(info)))
        return sorted(objects, key=lambda o: o.name)

    def download(self, prefix: str, name: str, destination: Path) -> None:
        """Copy one object to ``destination`` (a new local file)."""
        try:
            with self.fs.open(self._full(prefix, name), "rb", **self.read_options) as source:
                copy_to_local(source, destination)
        except (FileNotFoundError, LocalCacheError):
            raise  # removed since it was listed (the caller tries another version); our disk
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "read", exc) from exc

    def upload(self, prefix: str, items: list[tuple[Path, str]]) -> None:
        """Store each local file under its object name; each object appears whole or not at all."""
        try:
            for local, name in items:
                self.fs.put_file(str(local), self._full(prefix, name))
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "write", exc) from exc

    def delete(self, prefix: str, names: Iterable[str]) -> None:
        """Remove objects (missing ones are fine)."""
        paths = [self._full(prefix, n) for n in names]
        if not paths:
            return
        try:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "delete", exc) from exc


class LocalTarget(Target):
    """A local folder or mounted volume: writes go to a temporary name and are renamed.

    Nothing under the root is reached through a symbolic link: a link planted in a shared
    folder (a prefix pointing at ``~/.ssh``) would make a pull copy what it points at into the
    cache, and a later push publish it.
    """

    def _inside(self, path: str) -> Path:
        """``path`` under the root, when no folder or file on the way is a symbolic link."""
        full = Path(path)
        root = Path(self.root)
        try:
            relative = full.relative_to(root)
        except ValueError as exc:
            raise BadCacheTarget(f"{path} is outside the compile cache {self.uri}") from exc
        current = root
        for part in relative.parts:
            current = current / part
            if current.is_symlink():
                raise TargetUnavailable(
                    f"{current} in the compile cache {self.uri} is a symbolic link; a cache "
                    "target never follows links (remove it)"
                )
        return full

    def objects(self, prefix: str) -> list[StoredObject]:
        # Our own temporary files (a push in progress) are not objects yet; links are never
        # followed, and neither are the folders they name.
        base = self._inside(self._full(prefix))
        if not base.is_dir():
            return []
        objects = []
        for directory, dirs, files in os.walk(base, followlinks=False):
            dirs[:] = [d for d in dirs if not (Path(directory) / d).is_symlink()]
            for file in files:
                path = Path(directory) / file
                if file.startswith(".") or path.is_symlink():
                    continue
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue  # a FIFO or device is never an object
                objects.append(
                    StoredObject(
                        path.relative_to(base).as_posix(), info.st_size, moment(info.st_mtime)
                    )
                )
        return sorted(objects, key=lambda o: o.name)

    def download(self, prefix: str, name: str, destination: Path) -> None:
        source = self._inside(self._full(prefix, name))
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise unavailable(self.uri, "read", exc) from exc
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise TargetUnavailable(f"{source} in {self.uri} is not a regular file")
            try:
                copy_to_local(handle, destination)
            except LocalCacheError:
                raise
            except OSError as exc:
                raise unavailable(self.uri, "read", exc) from exc

    def upload(self, prefix: str, items: list[tuple[Path, str]]) -> None:
        try:
            for local, name in items:
                final = self._inside(self._full(prefix, name))
                final.parent.mkdir(parents=True, exist_ok=True)
                self._inside(str(final.parent))  # created, or there already: never a link
                temp = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
                try:
                    shutil.copyfile(local, temp)
                    os.replace(temp, final)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        temp.unlink()
        except OSError as exc:
            raise unavailable(self.uri, "write", exc) from exc

    def children(self, limit: int) -> list[str]:
        # Lazily: a folder holding millions of files is listed no further than needed.
        try:
            with os.scandir(self.root) as found:
                return sorted(entry.name for _, entry in zip(range(limit), found, strict=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise unavailable(self.uri, "list", exc) from exc

    def check(self) -> None:
        if Path(self.root).exists() and not Path(self.root).is_dir():
            raise BadCacheTarget(
                f"the compile cache target {self.uri} is a file, not a folder: give a folder "
                "(it is created by the first push)"
            )

    def delete(self, prefix: str, names: Iterable[str]) -> None:
        for name in names:
            self._inside(self._full(prefix, name))
        super().delete(prefix, names)


class HfBucketTarget(Target):
    """A Hugging Face storage bucket: one ``batch_bucket_files`` call uploads many objects
    (through Xet), reads stream over HTTP through ``HfFileSystem``."""

    # block_size=0: one streamed GET instead of ranged block reads.
    read_options: ClassVar[dict[str, Any]] = {"block_size": 0}

    def __init__(
        self, uri: str, fs: AbstractFileSystem, root: str, bucket_id: str, path: str
    ) -> None:
        super().__init__(uri, fs, root)
        self.bucket_id = bucket_id
        self.path_in_bucket = path.strip("/")

    def check(self) -> None:
        from huggingface_hub.errors import BucketNotFoundError

        try:
            self.fs._api.bucket_info(self.bucket_id)  # type: ignore[attr-defined]
        except BucketNotFoundError as exc:
            raise TargetUnavailable(
                f"the compile cache target {self.uri} names bucket {self.bucket_id}, which does "
                "not exist or is not visible with this token (HF_TOKEN); create it with "
                f"`hf buckets create {self.bucket_id}` or fix the URI"
            ) from exc
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "open", exc) from exc

    def upload(self, prefix: str, items: list[tuple[Path, str]]) -> None:
        if not items:
            return
        in_bucket = "/".join(p for p in (self.path_in_bucket, prefix) if p)
        try:
            self.fs._api.batch_bucket_files(  # type: ignore[attr-defined]
                self.bucket_id, add=[(str(local), f"{in_bucket}/{name}") for local, name in items]
            )
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "write", exc) from exc
        finally:
            self.fs.invalidate_cache(self._full(prefix))

    def delete(self, prefix: str, names: Iterable[str]) -> None:
        in_bucket = "/".join(p for p in (self.path_in_bucket, prefix) if p)
        paths = [f"{in_bucket}/{n}" for n in names]
        if not paths:
            return
        try:
            self.fs._api.batch_bucket_files(self.bucket_id, delete=paths)  # type: ignore[attr-defined]
        except Exception as exc:
            if not is_store_error(exc):
                raise
            raise unavailable(self.uri, "delete", exc) from exc
        finally:
            self.fs.invalidate_cache(self._full(prefix))


def unavailable(uri: str, action: str, exc: BaseException) -> TargetUnavailable:
    """The error for a target that did not answer as asked, naming it and the cause."""
    return TargetUnavailable(
        f"could not {action} the compile cache at {redact(uri)}: {type(exc).__name__}: {exc}"
    )


def _modified(info: dict[str, Any]) -> datetime | None:
    for key in ("mtime", "LastModified", "uploaded_at", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float):
            return moment(value)
    return None


def moment(timestamp: float) -> datetime | None:
    """A stored object's modification time; None (unknown) when it is no date at all (a
    file system that keeps 64-bit times holds mtimes past year 9999, or NaN from a store)."""
    try:
        return datetime.fromtimestamp(timestamp, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return None


_DISK_FULL = {
    errno.ENOSPC: "the local disk is full",
    errno.EDQUOT: "the local disk quota is used up",
    errno.EFBIG: "the file is over this process's file size limit",
}


def local_failure(path: Path, action: str, exc: OSError) -> LocalCacheError:
    """The error for this machine's side of a transfer: what failed on which local path."""
    why = _DISK_FULL.get(exc.errno or 0) or f"{type(exc).__name__}: {exc.strerror or exc}"
    return LocalCacheError(
        f"could not {action} {path} in the local compile cache: {why} (this machine's disk is "
        "at fault, not the target)"
    )


def copy_to_local(source: BinaryIO, destination: Path) -> None:
    """Copy ``source`` into the new local file ``destination``: a failure to write it is a
    :class:`LocalCacheError`; what reading ``source`` raises is left to the caller."""
    try:
        out = destination.open("wb", buffering=0)  # unbuffered: nothing left to fail at close
    except OSError as exc:
        raise local_failure(destination, "create", exc) from exc
    with out:
        while chunk := source.read(_COPY_CHUNK):
            view = memoryview(chunk)
            while view:
                try:
                    written = out.write(view)
                except OSError as exc:
                    raise local_failure(destination, "write", exc) from exc
                if not written:  # a regular file takes at least one byte or raises
                    raise local_failure(destination, "write", OSError(errno.EIO, "nothing written"))
                view = view[written:]


@dataclass(frozen=True)
class ResolvedTarget:
    """A target URI split into its root and the installed compiler's prefix."""

    target: Target
    prefix: str
    prefix_named: bool = False
    """The URI named the prefix itself (one spelling, kept); else it was derived from the
    installed compiler, and a pull may find the entries under its other spelling."""

    @property
    def uri(self) -> str:
        """The root URI (without credentials)."""
        return redact(self.target.uri)

    @property
    def prefix_uri(self) -> str:
        """Where this compiler's entries are: root URI + prefix."""
        return f"{self.uri}/{self.prefix}"


def open_target(
    uri: str, compiler: CompilerCache, storage_options: dict[str, Any] | None = None
) -> ResolvedTarget:
    """Open ``uri`` for ``compiler``'s cache.

    ``uri`` is the cache's root; it may end with the installed compiler's prefix (as a copied
    ``hf buckets`` path does), but naming another compiler's prefix is refused
    (:class:`CompilerMismatch`), for pulls and pushes alike.
    """
    text = os.fspath(uri).strip()
    if not text:
        raise BadCacheTarget("the compile cache target is empty: give a path or a URI")
    scheme, separator, rest = text.partition("://")
    if separator and not rest.strip("/"):
        raise BadCacheTarget(
            f"{scheme}:// names no bucket: give {scheme}://bucket/prefix (or a local path)"
        )
    root_uri = text.rstrip("/") or text
    last = root_uri.rsplit("/", 1)[-1]
    prefix = compiler.prefix
    if PREFIX_PATTERN.fullmatch(last):
        compiler.check_prefix(last, redact(root_uri))
        root_uri = root_uri[: -len(last)].rstrip("/")
        prefix = last  # the spelling named: a folder made under neuronx-cc's +hash spelling
        return ResolvedTarget(_target(root_uri, storage_options or {}), prefix, prefix_named=True)
    return ResolvedTarget(_target(root_uri, storage_options or {}), prefix)


def _target(uri: str, storage_options: dict[str, Any]) -> Target:
    if uri.startswith("hf://"):
        bucket = _BUCKET.fullmatch(uri)
        if bucket is None:
            raise BadCacheTarget(
                f"{uri} is not a Hugging Face storage bucket: compile caches live in buckets, "
                "hf://buckets/<namespace>/<name>[/<path>] (model and dataset repositories are "
                "versioned with commits, which suits neither thousands of small entries nor "
                "concurrent pushers)"
            )
        from huggingface_hub import HfFileSystem

        options = {"endpoint": os.environ.get("HF_ENDPOINT"), **storage_options}
        fs = HfFileSystem(**{k: v for k, v in options.items() if v is not None})
        root = f"buckets/{bucket['id']}" + (
            f"/{bucket['path'].strip('/')}" if bucket["path"] else ""
        )
        return HfBucketTarget(uri, fs, root.rstrip("/"), bucket["id"], bucket["path"] or "")
    try:
        fs, root = url_to_fs(uri, **storage_options)
    except (ValueError, ImportError) as exc:
        raise BadCacheTarget(
            f"cannot open compile cache target {redact(uri)}: {exc} (use a local path, "
            "s3://bucket/prefix with s3fs installed, or hf://buckets/<namespace>/<name>)"
        ) from exc
    if isinstance(fs, LocalFileSystem):
        # The root as given, made absolute: a link in the path above it is the admin's
        # (a mount point), a link under it is never followed.
        return LocalTarget(uri, fs, os.path.abspath(root))
    return Target(uri, fs, root)
