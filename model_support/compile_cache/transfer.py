"""Pull, push, list and prune a compile cache target; each transfer returns a typed report."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from model_support.compile_cache import layouts
from model_support.compile_cache.compilers import CompilerCache, installed_compiler_cache
from model_support.compile_cache.errors import (
    BadCacheTarget,
    CompileCacheError,
    LocalCacheError,
    TargetUnavailable,
    UnreadableLayout,
)
from model_support.compile_cache.target import (
    LocalTarget,
    RemoteEntry,
    ResolvedTarget,
    StoredObject,
    local_failure,
    object_name,
    open_target,
    parse_object,
)
from model_support.compile_cache.trust import (
    MANIFEST_LIMIT_BYTES,
    SIGNATURES_DIR,
    PrivateFolder,
    SigningKey,
    TrustPolicy,
    UnreadableLedger,
    record_unvouched,
    unvouched_names,
    verified_entries,
)
from model_support.records import CacheTransferFigures
from model_support.storage_errors import is_store_error

TRANSFER_THREADS = 8
"""Objects moved at once (each is one request; object stores answer them in parallel)."""
UPLOAD_BATCH = 256
"""Objects per upload call (one batch call per chunk on buckets)."""
PULL_HEADROOM_BYTES = 1 << 30
"""Free space a pull leaves on the local disk (the compiler writes there too)."""
ORPHAN_GRACE = timedelta(hours=1)
"""prune leaves objects younger than this alone: they may belong to a push in progress."""
_HASH_CHUNK = 1 << 20


class SkippedEntry(BaseModel):
    """An entry a transfer left out, and why."""

    model_config = ConfigDict(extra="forbid")

    path: str
    reason: str


class TransferReport(BaseModel):
    """What one pull or push did. Written as JSON by an init step, read back by the runner."""

    model_config = ConfigDict(extra="forbid")

    direction: Literal["pull", "push"]
    target: str = Field(..., description="The cache root URI (credentials removed).")
    prefix: str
    local_dir: str
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    present: int = Field(0, description="Entries already on the receiving side (not moved).")
    unverified: int = 0
    skipped: list[SkippedEntry] = Field(default_factory=list)
    error: str | None = None
    prefix_matched: bool | None = Field(
        None,
        description="Pull: the target held entries under this compiler's prefix (either "
        "spelling of neuronx-cc's version); false: none, so every graph compiles cold. "
        "Null for a push or a pull that failed before listing.",
    )
    other_prefixes: list[str] = Field(
        default_factory=list,
        description="Pull without a match: the compiler prefixes the target does hold.",
    )
    unvouched_names: list[str] = Field(
        default_factory=list,
        description="Pull: the entries it placed that nobody vouched for (taken without a "
        "valid signature from a target others can write), as object names; a signing push "
        "never vouches for them, nor, when they are host-side, for anything compiled beside "
        "them.",
    )

    def figures(self) -> CacheTransferFigures:
        """The counts a result records (the dataset's columns come from these)."""
        return CacheTransferFigures(
            prefix_matched=self.prefix_matched,
            entries=self.entries,
            bytes=self.bytes,
            seconds=round(self.seconds, 3),
            skipped=len(self.skipped),
            unverified=self.unverified,
            error=self.error,
        )

    def summary(self) -> str:
        """One line for people."""
        verb = "pulled" if self.direction == "pull" else "pushed"
        # Where on this machine: a pull into a folder the compiler does not read is a cold
        # compile later, so the line says which variable chose it.
        variable = (
            "TORCH_NEURONX_NEFF_CACHE_DIR"
            if self.prefix.startswith("neuronxcc-")
            else "TORCHINDUCTOR_CACHE_DIR"
        )
        here = f"{'into' if self.direction == 'pull' else 'from'} {self.local_dir} ({variable})"
        text = (
            f"{verb} {self.entries} entries ({_size(self.bytes)}) in {self.seconds:.1f} s "
            f"{'from' if self.direction == 'pull' else 'to'} {self.target}/{self.prefix} "
            f"{here}; {self.present} already there"
        )
        if self.unverified:
            text += f", {self.unverified} unverified (plain mirror entries)"
        if self.skipped:
            text += f", {len(self.skipped)} skipped"
        if self.prefix_matched is False:
            held = ", ".join(self.other_prefixes) or "none"
            text += (
                f"; NO ENTRIES under {self.prefix}: every graph compiles cold (prefixes the "
                f"target holds: {held})"
            )
        if self.error:
            text += f"; FAILED: {self.error}"
        return text

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the report as JSON (atomically: a reader sees the old file or the new one)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.tmp")
        temp.write_text(self.model_dump_json(indent=1), encoding="utf-8")
        os.replace(temp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TransferReport:
        """Read a report written by :meth:`save`."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def sha256_file(file: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class _Session:
    """One operation's view: the compiler, its local folder, the target."""

    compiler: CompilerCache
    target: ResolvedTarget
    started: float = field(default_factory=time.monotonic)

    def report(self, direction: Literal["pull", "push"]) -> TransferReport:
        return TransferReport(
            direction=direction,
            target=self.target.uri,
            prefix=self.target.prefix,
            local_dir=str(self.compiler.local_dir),
        )


def _session(
    target: str,
    compiler: CompilerCache | None,
    storage_options: dict[str, Any] | None,
) -> _Session:
    compiler = compiler or installed_compiler_cache()
    resolved = open_target(target, compiler, storage_options)
    resolved.target.check()
    return _Session(compiler, resolved)


def _matching_prefix(session: _Session) -> tuple[ResolvedTarget, list[StoredObject]]:
    """The target with the prefix spelling that holds this compiler's entries, and its objects.

    A root URI gets the canonical prefix (neuronx-cc's public version); when nothing is there,
    the same compiler's other spelling (the version with its build hash, as Neuron's own
    caches name folders) is looked at too, so either spelling in a target is found.
    """
    resolved = session.target
    objects = resolved.target.objects(resolved.prefix)
    if objects or resolved.prefix_named:
        return resolved, objects
    for spelling in session.compiler.accepted_prefixes:
        if spelling == resolved.prefix:
            continue
        found = resolved.target.objects(spelling)
        if found:
            return replace(resolved, prefix=spelling), found
    return resolved, objects


def _by_path(kind: str, objects: list[StoredObject]) -> tuple[dict[str, list[RemoteEntry]], int]:
    """The target's entries grouped by local path, newest first; and how many objects are not
    entries of this cache at all."""
    grouped: dict[str, list[RemoteEntry]] = defaultdict(list)
    foreign = 0
    for obj in objects:
        entry = parse_object(obj)
        if not layouts.is_entry_path(kind, entry.path):  # type: ignore[arg-type]
            foreign += 1
            continue
        grouped[entry.path].append(entry)
    epoch = datetime.min.replace(tzinfo=UTC)
    for versions in grouped.values():
        # Verified before plain; then the newest; then by name, so every puller picks the same.
        versions.sort(
            key=lambda e: (e.verified, e.object.modified or epoch, e.object.name), reverse=True
        )
    return grouped, foreign


def pull(
    target: str,
    *,
    compiler: CompilerCache | None = None,
    storage_options: dict[str, Any] | None = None,
    threads: int = TRANSFER_THREADS,
    policy: TrustPolicy | None = None,
    max_bytes: int | None = None,
) -> TransferReport:
    """Fetch the target's entries for the installed compiler that the local cache lacks.

    A pull adds at most its byte budget to the local disk: the disk's free space less
    :data:`PULL_HEADROOM_BYTES` (the compiler needs room too), and at most ``max_bytes`` (a
    volume's limit less what it holds); entries past it are skipped (``local disk: over the
    pull's byte budget``), smallest paths first as listed.

    Only entries the trust ``policy`` accepts are considered (see :mod:`.trust`; default: the
    trusted keys of the environment): with trusted keys, those a manifest signed by one of
    them lists; without, NEFF entries, and host-side (inductor) entries only from a local
    folder only this user can write or when the policy trusts unsigned entries. Each entry is
    downloaded to a temporary file beside its place, checked (size, and the SHA-256 its name
    declares), and only then renamed into place; an entry that fails is skipped and reported,
    and the next newest version of it (if any) is tried. Raises :class:`CompileCacheError`
    when the target cannot be used at all.
    """
    policy = policy if policy is not None else TrustPolicy.from_env()
    session = _session(target, compiler, storage_options)
    kind, root = session.compiler.kind, session.compiler.local_dir
    session.target, objects = _matching_prefix(session)
    report = session.report("pull")
    grouped, _ = _by_path(kind, objects)
    if not grouped:
        paths = [parse_object(o).path for o in objects]
        problem = layouts.layout_problem(
            kind,
            [path for path in paths if not path.startswith(f"{SIGNATURES_DIR}/")],
            session.target.prefix_uri,
        )
        if problem:
            raise UnreadableLayout(problem)
    report.prefix_matched = bool(grouped)
    if not grouped:
        held = session.target.target.prefixes()
        report.other_prefixes = [p for p in held if p != session.target.prefix]
        if not objects and not held:
            _refuse_what_is_no_cache(session.target)
    verdict = functools.cache(_trust_verdicts(session, objects, policy))  # one look per name
    for path in list(grouped):
        kept = [e for e in grouped[path] if verdict(e.object.name) in (VOUCHED, UNVOUCHED)]
        report.skipped.extend(
            SkippedEntry(path=e.object.name, reason=verdict(e.object.name))
            for e in grouped[path]
            if e not in kept
        )
        if kept:
            grouped[path] = kept
        else:
            del grouped[path]
    wanted = []
    for path, versions in sorted(grouped.items()):
        if layouts.needs(kind, root, path):
            wanted.append((path, versions))
        else:
            report.present += 1
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise local_failure(root, "create", exc) from exc
    names = set(grouped)
    wanted, over = _within_budget(wanted, _budget(root, max_bytes))
    report.skipped.extend(over)

    def fetch(
        item: tuple[str, list[RemoteEntry]],
    ) -> tuple[RemoteEntry | None, bool, str | None, list[SkippedEntry]]:
        _path, versions = item
        problems: list[SkippedEntry] = []
        for entry in versions:
            problem, placed, digest = _fetch_one(session, entry, names)
            if problem is None:
                return entry, placed, digest, problems
            problems.append(SkippedEntry(path=entry.object.name, reason=problem))
        return None, False, None, problems

    pool = ThreadPoolExecutor(max_workers=max(1, threads))
    try:
        futures = [pool.submit(fetch, item) for item in wanted]
        for future in futures:
            try:
                fetched, placed, digest, problems = future.result()
            except CancelledError:
                continue
            except (TargetUnavailable, LocalCacheError) as exc:
                # Entries placed so far are whole, stay and are counted; the rest is not
                # attempted.
                if report.error is None:
                    report.error = f"{exc.label}: {exc}"
                    for pending in futures:
                        pending.cancel()
                continue
            report.skipped.extend(problems)
            if fetched is not None and placed:
                report.entries += 1
                report.bytes += fetched.size
                report.unverified += not fetched.verified
                if verdict(fetched.object.name) == UNVOUCHED and digest is not None:
                    report.unvouched_names.append(object_name(fetched.path, digest, fetched.size))
            elif fetched is not None:
                report.present += 1  # the compiler wrote it meanwhile; its own copy is kept
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _remember_unvouched(root, report.unvouched_names)
    report.seconds = time.monotonic() - session.started
    return report


def _remember_unvouched(root: Path, names: list[str]) -> None:
    """Keep beside the local cache what a pull placed that nobody vouched for."""
    try:
        record_unvouched(root, names)
    except OSError as exc:
        raise local_failure(root, "record the unvouched entries of", exc) from exc


def _refuse_what_is_no_cache(resolved: ResolvedTarget) -> None:
    """A pull from a root that holds things, none of them a compiler's folder, is a mistake
    (``file:///etc``, a volume's root above the caches): refused, nothing taken."""
    found = resolved.target.children(limit=4)
    if not found:
        return  # empty or missing: a cache nothing was pushed to yet
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    raise BadCacheTarget(
        f"{resolved.uri} is not a compile cache: it holds {shown} and no compiler folder "
        "(neuronxcc-<version> or inductor-torch-<version>); give the root a push wrote to"
    )


def _budget(root: Path, max_bytes: int | None) -> int:
    """How many bytes a pull into ``root`` may add: free space less the headroom, and at
    most ``max_bytes``."""
    try:
        free = shutil.disk_usage(root).free
    except OSError as exc:
        raise local_failure(root, "measure the free space of", exc) from exc
    budget = max(0, free - PULL_HEADROOM_BYTES)
    return budget if max_bytes is None else min(budget, max(0, max_bytes))


def _within_budget(
    wanted: list[tuple[str, list[RemoteEntry]]], budget: int
) -> tuple[list[tuple[str, list[RemoteEntry]]], list[SkippedEntry]]:
    """The entries whose largest version fits in ``budget`` together, and the others
    (skipped: the local disk's limit, not the target's fault)."""
    kept: list[tuple[str, list[RemoteEntry]]] = []
    over: list[SkippedEntry] = []
    used = 0
    for path, versions in wanted:
        size = max(e.size for e in versions)
        if used + size > budget:
            over.append(
                SkippedEntry(
                    path=versions[0].object.name,
                    reason=f"local disk: over the pull's byte budget ({budget} bytes: free "
                    "space less headroom, or the volume's limit)",
                )
            )
            continue
        used += size
        kept.append((path, versions))
    return kept, over


VOUCHED = "vouched"
"""A pull's verdict on an entry: signed by a trusted key, or in a folder only this user can write."""
UNVOUCHED = "unvouched"
"""A pull's verdict on an entry taken on the policy's word alone: a NEFF without trusted keys,
or any entry with ``trust_unsigned``."""


def _trust_verdicts(
    session: _Session, objects: list[StoredObject], policy: TrustPolicy
) -> Callable[[str], str]:
    """The trust policy's verdict on each object name: :data:`VOUCHED`, :data:`UNVOUCHED`, or
    why the pull does not take it."""
    if policy.requires_signatures:
        signed: set[str] = set()
        for obj in objects:
            if not obj.name.startswith(SIGNATURES_DIR + "/") or obj.size > MANIFEST_LIMIT_BYTES:
                continue
            data = _read_small(session, obj)
            listed = (
                verified_entries(data, session.target.prefix, policy.trusted_keys) if data else None
            )
            signed |= listed or set()
        unsigned = "unsigned: no manifest signed by a trusted key lists it"
        return lambda name: VOUCHED if name in signed else unsigned
    # Unsigned entries are taken on the policy's word for NEFFs and with trust_unsigned; an
    # inductor entry otherwise only when only this user can have written it.
    fallback = UNVOUCHED if session.compiler.kind == "neff" or policy.trust_unsigned else None
    backing = session.target.target
    if isinstance(backing, LocalTarget) and policy.own_folders:
        private = PrivateFolder(Path(backing.root))
        prefix = session.target.prefix

        def local(name: str) -> str:
            problem = private.entry_problem(f"{prefix}/{name}")
            if problem is None:
                return VOUCHED
            return fallback or _others_can_write(problem)

        return local
    return lambda name: fallback or _others_can_write("the target is not a local folder")


def _others_can_write(why: str) -> str:
    return (
        f"host-side cache (pickles, shared objects) others can write ({why}), without a "
        "signature: give the target's trusted keys (--trusted-key) or trust its writers "
        "explicitly (--trust-unsigned)"
    )


def _read_small(session: _Session, obj: StoredObject) -> bytes | None:
    """One manifest's bytes (None when it vanished since it was listed)."""
    try:
        temp = layouts.temp_file(session.compiler.local_dir, "signatures.json")
    except OSError as exc:
        raise local_failure(session.compiler.local_dir, "create", exc) from exc
    try:
        session.target.target.download(session.target.prefix, obj.name, temp)
        return temp.read_bytes()[: MANIFEST_LIMIT_BYTES + 1]
    except FileNotFoundError:
        return None
    except CompileCacheError:
        raise
    except OSError as exc:
        raise local_failure(temp, "read", exc) from exc
    finally:
        temp.unlink(missing_ok=True)


def _fetch_one(
    session: _Session, entry: RemoteEntry, names: set[str]
) -> tuple[str | None, bool, str | None]:
    """Download, verify and place one entry: (why it was not taken or None, whether it was
    placed: False when a compiler wrote the same entry meanwhile, the SHA-256 of its bytes).
    ``names``: every entry path the target holds (to tell whose fault a path collision is).
    Raises :class:`LocalCacheError` when the local disk fails (full, quota, permissions) and
    :class:`TargetUnavailable` when the target does."""
    kind, root = session.compiler.kind, session.compiler.local_dir
    if entry.size == 0:
        return "empty object (never an entry)", False, None
    if entry.truncated:
        return f"truncated: {entry.object.size} bytes stored, {entry.size} declared", False, None
    try:
        temp = layouts.temp_file(root, entry.path)
    except (NotADirectoryError, FileExistsError):
        return _collision(root, entry.path, names), False, None
    except OSError as exc:
        raise local_failure(root / entry.path, "create a folder for", exc) from exc
    try:
        try:
            session.target.target.download(session.target.prefix, entry.object.name, temp)
        except FileNotFoundError:
            return "removed from the target since it was listed", False, None
        size = temp.stat().st_size
        if size != entry.size:
            return f"truncated: {size} bytes read, {entry.size} expected", False, None
        digest = sha256_file(temp)  # a plain entry's too: what was placed is known by its bytes
        if entry.sha256 is not None and digest != entry.sha256:
            return "corrupt: its bytes do not match the SHA-256 in its name", False, None
        if kind == "inductor" and entry.path.endswith(".so"):
            problem = layouts.elf_problem(temp, size)
            if problem:
                return problem, False, None
        if (root / entry.path).is_dir():
            return _collision(root, entry.path, names), False, None
        return None, layouts.place(kind, root, entry.path, temp), digest
    except CompileCacheError:
        raise
    except OSError as exc:
        raise local_failure(root / entry.path, "place", exc) from exc
    finally:
        temp.unlink(missing_ok=True)


def _collision(root: Path, path: str, names: set[str]) -> str:
    """Why ``path`` cannot be placed where a file stands in for one of its folders (or a
    folder for it): the target's fault when it names both, else the local cache's."""
    parts = path.split("/")
    folders = {"/".join(parts[:i]) for i in range(1, len(parts))}
    clash = sorted(folders & names) or sorted(n for n in names if n.startswith(path + "/"))[:1]
    if clash:
        return (
            f"target: it names both {clash[0]!r} and {path!r}, a file and a folder of the same "
            "name; only one can be placed"
        )
    return (
        f"local disk: a file or folder of the local cache at {root} stands where {path!r} "
        "needs the other (remove it)"
    )


def push(
    target: str,
    *,
    compiler: CompilerCache | None = None,
    storage_options: dict[str, Any] | None = None,
    signing_key: SigningKey | None = None,
    unvouched: Iterable[str] = (),
) -> TransferReport:
    """Upload the local cache's complete entries that the target does not have yet.

    Incomplete local entries (being written, empty, a half-linked kernel) are skipped and
    reported. Entries already in the target, in any verified version, are not sent again.
    With ``signing_key`` (a trusted pusher's), a signed manifest is written last, listing the
    entries this push vouches for: what was compiled here, or pulled under a valid signature
    (or from a folder only this user writes). Entries a pull took unvouched (recorded beside
    the local cache, and ``unvouched``: object names, e.g. a pod's pull report) are neither
    uploaded nor listed; and when such an entry is host-side (an inductor pickle or shared
    object, which ran in the process that compiled the rest) nothing is. Raises
    :class:`CompileCacheError` when the target cannot be used at all.
    """
    session = _session(target, compiler, storage_options)
    report = session.report("push")
    kind, root = session.compiler.kind, session.compiler.local_dir
    local, skipped = layouts.scan(kind, root)
    report.skipped.extend(SkippedEntry(path=s.path, reason=s.reason) for s in skipped)
    not_vouched, tainted = _not_vouched(kind, root, unvouched) if signing_key else (set(), None)
    grouped, _ = _by_path(kind, session.target.target.objects(session.target.prefix))
    have = {
        p
        for p, versions in grouped.items()
        if any(e.verified and not e.truncated for e in versions)
    }
    todo: list[tuple[layouts.LocalEntry, str]] = []
    vouched: list[str] = []  # what the signed manifest lists, by its bytes
    stored = {e.object.name for versions in grouped.values() for e in versions}
    for entry in local:
        if entry.path in have and signing_key is None:
            report.present += 1
            continue
        digest = sha256_file(entry.file)
        if entry.file.stat().st_size != entry.size:  # rewritten while hashing: next push
            report.skipped.append(SkippedEntry(path=entry.path, reason="changed while being read"))
            continue
        name = object_name(entry.path, digest, entry.size)
        if tainted is not None or name in not_vouched:
            reason = tainted or (
                "pulled without a valid signature: a signing push neither uploads nor vouches "
                "for it"
            )
            report.skipped.append(SkippedEntry(path=entry.path, reason=reason))
            continue
        vouched.append(name)
        if name in stored:  # these very bytes are there (a signed pull needs these bytes)
            report.present += 1
        else:
            todo.append((entry, name))
    try:
        for start in range(0, len(todo), UPLOAD_BATCH):
            chunk = todo[start : start + UPLOAD_BATCH]
            session.target.target.upload(session.target.prefix, [(e.file, n) for e, n in chunk])
            report.entries += len(chunk)
            report.bytes += sum(e.size for e, _ in chunk)
        if signing_key is not None and vouched:
            _upload_manifest(session, signing_key, vouched)
    except TargetUnavailable as exc:
        # Objects appear whole or not at all: what was sent is valid, the rest goes next time.
        report.error = f"{exc.label}: {exc}"
    report.seconds = time.monotonic() - session.started
    return report


def _not_vouched(kind: str, root: Path, unvouched: Iterable[str]) -> tuple[set[str], str | None]:
    """What a signing push must not vouch for: the local cache's unvouched entries (its record
    and ``unvouched``), and why nothing at all can be vouched for (None: the rest can)."""
    try:
        names = unvouched_names(root) | set(unvouched)
    except UnreadableLedger as exc:
        return set(), f"not vouched for: {exc}; where each entry came from is unknown"
    if kind == "inductor" and names:
        return names, (
            f"not vouched for: {len(names)} host-side entries here were pulled without a valid "
            "signature, and what ran beside them may have written the rest; pull only signed "
            "entries (--trusted-key) into a fresh local cache to sign again"
        )
    return names, None


def _upload_manifest(session: _Session, key: SigningKey, names: list[str]) -> None:
    """Write the signed manifest last: it names only objects already stored whole."""
    name, data = key.sign_manifest(session.target.prefix, names)
    local = layouts.temp_file(session.compiler.local_dir, "signatures.json")
    try:
        local.write_bytes(data)
        session.target.target.upload(session.target.prefix, [(local, name)])
    finally:
        local.unlink(missing_ok=True)


class PrefixListing(BaseModel):
    """What a target holds for one compiler prefix."""

    model_config = ConfigDict(extra="forbid")

    prefix: str
    installed: bool = Field(..., description="The prefix of the compiler installed here.")
    entries: int = 0
    versions: int = Field(
        0, description="Stored objects that are entries (several per entry when pushers disagreed)."
    )
    bytes: int = 0
    unverified: int = 0
    truncated: list[str] = Field(default_factory=list)
    foreign: int = Field(0, description="Objects that are not entries of this cache.")


def list_target(
    target: str,
    *,
    compiler: CompilerCache | None = None,
    storage_options: dict[str, Any] | None = None,
    all_prefixes: bool = False,
) -> list[PrefixListing]:
    """What the target holds: the installed compiler's prefix (or, with ``all_prefixes``, every
    compiler prefix present). Sizes are checked against the names, contents are not read."""
    session = _session(target, compiler, storage_options)
    backing = session.target.target
    prefixes = backing.prefixes() if all_prefixes else []
    if session.target.prefix not in prefixes:
        prefixes.append(session.target.prefix)
    listings = []
    for prefix in sorted(prefixes):
        kind = "neff" if prefix.startswith("neuronxcc-") else "inductor"
        grouped, foreign = _by_path(kind, backing.objects(prefix))
        listing = PrefixListing(
            prefix=prefix, installed=prefix == session.target.prefix, foreign=foreign
        )
        for versions in grouped.values():
            good = [e for e in versions if not e.truncated and e.size > 0]
            listing.versions += len(versions)
            listing.truncated += [e.object.name for e in versions if e.truncated or e.size == 0]
            if good:
                listing.entries += 1
                listing.bytes += good[0].size
                listing.unverified += not good[0].verified
        listings.append(listing)
    return listings


class PruneReport(BaseModel):
    """What prune removed (or, dry, would remove) from one prefix."""

    model_config = ConfigDict(extra="forbid")

    target: str
    prefix: str
    dry_run: bool
    removed: list[SkippedEntry] = Field(default_factory=list)
    kept: int = 0


def prune(
    target: str,
    *,
    compiler: CompilerCache | None = None,
    storage_options: dict[str, Any] | None = None,
    older_than: timedelta | None = None,
    verify: bool = False,
    dry_run: bool = False,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> PruneReport:
    """Remove from the installed compiler's prefix what no pull should ever take.

    * truncated or empty objects (their stored size differs from the one their name declares);
    * with ``verify``, objects whose bytes do not match their hash (each one is read);
    * superseded versions of an entry (older duplicates left by concurrent pushers): only a
      newer version whose bytes match its hash supersedes, so a corrupt one never costs a
      valid one;
    * with ``older_than``, entries stored longer ago than that.

    Objects younger than :data:`ORPHAN_GRACE` are never removed as broken: a push may be
    writing them. Plain (unhashed) entries are left alone.
    """
    session = _session(target, compiler, storage_options)
    backing, prefix = session.target.target, session.target.prefix
    report = PruneReport(target=session.target.uri, prefix=prefix, dry_run=dry_run)
    grouped, _ = _by_path(session.compiler.kind, backing.objects(prefix))
    moment = now()

    def settled(entry: RemoteEntry) -> bool:
        return entry.object.modified is None or moment - entry.object.modified > ORPHAN_GRACE

    doomed: list[SkippedEntry] = []
    corrupt = "corrupt: bytes do not match its hash"
    for versions in grouped.values():
        # The newest version that stays; it makes older ones superfluous only once its bytes
        # are known to match its name (a newer corrupt version must not cost a valid one).
        keeper: RemoteEntry | None = None
        keeper_checked = False
        for entry in versions:
            if not entry.verified:
                report.kept += 1
                continue
            reason = None
            if (entry.truncated or entry.size == 0) and settled(entry):
                reason = "truncated or empty"
            elif verify and settled(entry) and not _matches(session, entry):
                reason = corrupt
            elif keeper is not None and not keeper_checked:
                keeper_checked = True
                if not _matches(session, keeper):
                    if settled(keeper):
                        doomed.append(SkippedEntry(path=keeper.object.name, reason=corrupt))
                        report.kept -= 1
                    keeper = None
            if reason is None and keeper is not None:
                reason = "superseded by a newer version of the same entry"
            elif (
                reason is None
                and older_than is not None
                and entry.object.modified is not None
                and moment - entry.object.modified > older_than
            ):
                reason = f"older than {older_than}"
            if reason is None:
                if keeper is None and not entry.truncated:
                    # With verify, a settled entry's bytes were checked above; a young one's
                    # were not (it may be a push in progress): check it before it supersedes.
                    keeper, keeper_checked = entry, verify and settled(entry)
                report.kept += 1
            else:
                doomed.append(SkippedEntry(path=entry.object.name, reason=reason))
    report.removed = doomed
    if not dry_run:
        backing.delete(prefix, [d.path for d in doomed])
    return report


def _matches(session: _Session, entry: RemoteEntry) -> bool:
    temp = layouts.temp_file(session.compiler.local_dir, entry.path)
    try:
        session.target.target.download(session.target.prefix, entry.object.name, temp)
        return sha256_file(temp) == entry.sha256
    finally:
        temp.unlink(missing_ok=True)


def guarded(
    operation: Callable[[], TransferReport],
    direction: Literal["pull", "push"],
    target: str,
    compiler: CompilerCache | None,
    deadline_s: float | None = None,
) -> TransferReport:
    """Run a pull or push for a test: a failure becomes the report's ``error`` (class: message)
    instead of an exception, so the test's own result is never changed by the cache.

    With ``deadline_s`` the transfer runs in a background thread and is given up after that
    long (the Hub's clients retry an unavailable store for minutes): the report then says so,
    and the thread is left to finish or die with the process. Objects and entries appear whole
    or not at all, so an abandoned transfer leaves nothing half-written behind.
    """
    started = time.monotonic()

    def failed(error: str) -> TransferReport:
        return TransferReport(
            direction=direction,
            target=_safe_uri(target),
            prefix=compiler.prefix if compiler else "",
            local_dir=str(compiler.local_dir) if compiler else "",
            seconds=time.monotonic() - started,
            error=error,
        )

    outcome: list[TransferReport | BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(operation())
        except BaseException as exc:  # handed to the caller below
            outcome.append(exc)

    if deadline_s is None:
        attempt()
    else:
        worker = threading.Thread(target=attempt, name=f"compile-cache-{direction}", daemon=True)
        with _LEFT_BEHIND_LOCK:
            _TRANSFER_THREADS.add(worker)
        worker.start()
        worker.join(deadline_s)
        if not outcome:
            return failed(
                f"deadline: the {direction} did not finish within {deadline_s:g} s and was "
                "left behind (the store is slow or unavailable)"
            )
    result = outcome[0]
    if isinstance(result, TransferReport):
        return result
    if isinstance(result, CompileCacheError) or is_store_error(result):
        label = getattr(result, "label", None) or "target-unavailable"
        return failed(f"{label}: {result}")
    if isinstance(result, Exception):  # a fault of ours: reported, never the test's outcome
        return failed(f"unexpected: {type(result).__name__}: {result}")
    raise result  # KeyboardInterrupt, SystemExit and the like stop the caller


_TRANSFER_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_LEFT_BEHIND_LOCK = threading.Lock()


def transfers_left_behind() -> list[str]:
    """Names of the transfers :func:`guarded` gave up on that are still running."""
    with _LEFT_BEHIND_LOCK:
        return sorted(t.name for t in _TRANSFER_THREADS if t.is_alive())


def left_behind_notice(left: list[str]) -> str:
    """The line that says which given-up transfers the process leaves behind at its exit."""
    return f"model-support: leaving {', '.join(left)} behind (past its deadline); exiting now"


def exit_now_if_left_behind(code: int, *, announce: bool = True) -> None:
    """End the process with ``code`` at once when a given-up transfer is still running.

    A normal interpreter exit waits for the worker pools of a hung transfer (concurrent.futures
    joins its threads at exit, a stalled store's client retries for minutes), which would hold
    a pod's container, and the node, long after its result was delivered. Output is flushed
    first; nothing else is left to clean up (objects and entries appear whole or not at all).
    """
    left = transfers_left_behind()
    if not left:
        return
    if announce:
        print(left_behind_notice(left), file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _safe_uri(uri: str) -> str:
    from model_support.compile_cache.target import redact

    return redact(uri)
