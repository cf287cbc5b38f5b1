"""What a complete entry is in each compiler's on-disk cache, and how one is written in place.

**TorchNeuron's NEFF cache** (``TORCH_NEURONX_NEFF_CACHE_DIR``): TorchNeuron's sources have
two writers, each with its own layout, and an entry is one file of either:

* the C++ writer's ``<k[0:2]>/<k[2:4]>/<k>.neff``, ``k`` 32 hex digits;
* the Python writer's ``<k>/<k>.neff``, ``k`` a SHA-256 (64 hex digits), its key covering the
  compiler version and the LNC.

TorchNeuron writes an entry to a ``.tmp.XXXXXX`` file in the same folder and renames it into
place, so a file under its final name is whole; a zero-size file is how TorchNeuron marks a
miss. Its locks live elsewhere (``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR``). Anything else in the
folder is not an entry, and a target holding only such files is in a layout this module does
not read (:func:`layout_problem`), for example the PyTorch/XLA cache of optimum-neuron.

**Inductor's caches** (``TORCHINDUCTOR_CACHE_DIR``, read from torch 2.13's
``torch/_inductor/codecache.py``): every file is keyed by a hash, so each file is an entry:

* ``fxgraph/<h[1:3]>/<key>/<sha>`` compiled FX graphs and ``aotautograd/<key>/<sha>`` AOT
  autograd entries: pickles written by ``write_atomic`` (a ``.<pid>.<tid>.tmp`` file renamed
  into place; readers skip dot files), named by the hash of their bytes;
* ``<h[1:3]>/<hash>.{py,cpp,h,...}`` generated code, also written by ``write_atomic``;
* ``<h[1:3]>/<hash>[.main].so`` compiled kernels, which the C++ compiler writes in place (not
  atomically) while holding ``locks/<hash>.lock`` (``filelock``, an ``flock``): a kernel is
  complete when no process holds its lock and its ELF section header table (the linker's last
  write) lies within the file;
* ``locks/`` itself, dot files, ``.o`` intermediates and empty files are never entries.

A missing file is a miss for both compilers, never an error, so a pull may leave out any entry.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from model_support.compile_cache.compilers import CacheKind

_NEFF_ENTRY = re.compile(
    r"^(?P<a>[0-9a-fA-F]{2})/(?P<b>[0-9a-fA-F]{2})/(?P<key>[0-9a-fA-F]{32})\.neff$"
)
_NEFF_SHA_ENTRY = re.compile(r"^(?P<key>[0-9a-fA-F]{64})/(?P=key)\.neff$")
NEFF_LAYOUTS = {
    "sharded": "<k[0:2]>/<k[2:4]>/<k>.neff, k 32 hex digits (TorchNeuron's C++ cache writer)",
    "sha256": "<sha256>/<sha256>.neff (TorchNeuron's Python cache writer)",
}
"""The NEFF cache layouts this module reads, by name, as a message names them."""
_XLA_MODULE = re.compile(r"(?:^|/)MODULE_[0-9A-Za-z]+\+[0-9A-Za-z]+/")
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")
_MAX_DEPTH = 6
_INDUCTOR_EXCLUDED_TOP = {"locks", "signatures"}  # signatures: manifests (see .trust)
_INDUCTOR_EXCLUDED_SUFFIXES = (".o", ".lock")
TEMP_PREFIX = ".tmp.model-support."
"""Temporary files of a pull: dot files, which both TorchNeuron and inductor skip."""


@dataclass(frozen=True)
class LocalEntry:
    """A complete entry of the local cache."""

    path: str  # relative to the cache folder, "/"-separated
    file: Path
    size: int


@dataclass(frozen=True)
class Skipped:
    """An entry left out of a transfer, and why."""

    path: str
    reason: str


def safe_relative_path(path: str) -> bool:
    """A relative path of plain names: no ``..``, no absolute path, no dot files, short."""
    parts = path.split("/")
    return 0 < len(parts) <= _MAX_DEPTH and all(_COMPONENT.fullmatch(p) for p in parts)


def is_entry_path(kind: CacheKind, path: str) -> bool:
    """Whether ``path`` (relative, "/"-separated) may name an entry of a ``kind`` cache.

    Applied to every path a target offers before anything is written locally, so a target can
    never make a pull write outside the cache or plant a file the compiler would not have made.
    """
    if not safe_relative_path(path):
        return False
    if kind == "neff":
        return neff_layout(path) is not None
    top = path.split("/", 1)[0]
    return (
        "/" in path
        and top not in _INDUCTOR_EXCLUDED_TOP
        and not path.endswith(_INDUCTOR_EXCLUDED_SUFFIXES)
    )


def neff_layout(path: str) -> str | None:
    """Which of TorchNeuron's cache layouts ``path`` is an entry of (a key of NEFF_LAYOUTS);
    None when it is in neither."""
    match = _NEFF_ENTRY.fullmatch(path)
    if match is not None and match["key"].lower().startswith((match["a"] + match["b"]).lower()):
        return "sharded"
    if _NEFF_SHA_ENTRY.fullmatch(path) is not None:
        return "sha256"
    return None


def layout_problem(kind: CacheKind, paths: list[str], where: str) -> str | None:
    """Why the files at ``where`` cannot seed this cache: they are there but none is an entry
    of a layout this module reads (None when some are, or when there are none at all)."""
    if not paths or any(is_entry_path(kind, path) for path in paths):
        return None
    sample = ", ".join(sorted(paths)[:3])
    if kind != "neff":
        return f"{where} holds {len(paths)} file(s) but no inductor cache entry (e.g. {sample})"
    known = "; ".join(NEFF_LAYOUTS.values())
    xla = (
        " Their MODULE_<hash>+<hash>/ folders are the PyTorch/XLA compile cache's layout "
        "(torch-neuronx 2.9 and earlier, optimum-neuron's cache), whose NEFFs TorchNeuron "
        "does not load."
        if any(_XLA_MODULE.search(path) for path in paths)
        else ""
    )
    return (
        f"{where} holds {len(paths)} file(s) in no layout TorchNeuron's NEFF cache uses (e.g. "
        f"{sample}).{xla} Read are: {known}."
    )


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            file = Path(directory) / name
            yield file.relative_to(root).as_posix(), file


def scan(kind: CacheKind, root: Path) -> tuple[list[LocalEntry], list[Skipped]]:
    """The complete entries of the local cache under ``root``, and what was left out (and why).

    Temporary files, locks and files that are not entries of this cache are not reported (they
    are not candidates); incomplete candidates are.
    """
    entries: list[LocalEntry] = []
    skipped: list[Skipped] = []
    if not root.is_dir():
        return entries, skipped
    for path, file in _walk(root):
        if file.name.startswith(".") or file.is_symlink() or not is_entry_path(kind, path):
            continue
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            continue  # removed since it was listed
        if size == 0:
            skipped.append(Skipped(path, "empty file (a miss marker or an interrupted write)"))
            continue
        if kind == "inductor" and file.suffix == ".so":
            problem = _kernel_problem(root, file, size)
            if problem:
                skipped.append(Skipped(path, problem))
                continue
        entries.append(LocalEntry(path, file, size))
    return entries, skipped


def _kernel_problem(root: Path, file: Path, size: int) -> str | None:
    """Why a compiled inductor kernel is not complete yet; None when it is."""
    lock = root / "locks" / f"{file.name.split('.', 1)[0]}.lock"
    if lock_held(lock):
        return "being compiled (its lock is held)"
    return elf_problem(file, size)


def lock_held(lock: Path) -> bool:
    """Whether another process holds the ``flock`` on ``lock`` (filelock's Unix lock)."""
    try:
        # Never wait on what is not a regular file (opening a FIFO blocks until a writer comes),
        # nor follow a link out of the cache.
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return True  # a link, not a lock: treat its kernel as incomplete
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True  # not a lock file: its kernel is not known to be complete
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def elf_problem(file: Path, size: int) -> str | None:
    """Why ``file`` is not a whole ELF shared object; None when its headers say it is whole."""
    with file.open("rb") as handle:
        header = handle.read(64)
    if len(header) < 52 or header[:4] != b"\x7fELF":
        return "not an ELF file (truncated or overwritten)"
    elf_class, data = header[4], header[5]
    order = "<" if data == 1 else ">"
    if elf_class == 2 and len(header) >= 64:
        (shoff,) = struct.unpack_from(order + "Q", header, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", header, 0x3A)
    elif elf_class == 1:
        (shoff,) = struct.unpack_from(order + "I", header, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", header, 0x2E)
    else:
        return "not an ELF file (unknown class)"
    if shoff + shentsize * shnum > size:
        return f"truncated ELF file ({size} bytes, its section headers end at {shoff + shentsize * shnum})"
    return None


def needs(kind: CacheKind, root: Path, path: str) -> bool:
    """Whether a pull should fetch ``path``: absent locally (or, for NEFF, a zero-size miss)."""
    try:
        size = (root / path).stat().st_size
    except (FileNotFoundError, NotADirectoryError):  # a file in its way: the fetch says so
        return True
    return kind == "neff" and size == 0


def temp_file(root: Path, path: str) -> Path:
    """A temporary file beside ``root/path`` (same folder, so the final rename is atomic)."""
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"


def place(kind: CacheKind, root: Path, path: str, temp: Path) -> bool:
    """Move a verified ``temp`` file to ``root/path``; False (and ``temp`` removed) when a
    complete entry appeared there meanwhile (the local one is kept)."""
    target = root / path
    try:
        if kind == "neff" and target.exists() and target.stat().st_size == 0:
            os.replace(temp, target)  # a miss marker is replaced by the entry
            return True
        os.link(temp, target)  # atomic, and never replaces what a compiler wrote meanwhile
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
