"""Who a compile cache's readers trust: signed manifests, and the rule for host-side pickles.

Whoever can write to a compile cache target can run code in everyone who pulls from it:
inductor's entries hold pickles and shared objects that the pulling process loads, and NEFF
entries are programs loaded onto the devices of every later test. An entry's name carries the
SHA-256 of its bytes (see :mod:`.target`), which proves it arrived whole, not who wrote it.

So a trusted pusher signs what it pushed: after its upload it writes a *manifest*, the list of
verified object names it vouches for, signed with an Ed25519 key that only trusted pushers
hold (an admin's machine, a CI job, the runner pods of a namespace reserved for trusted
tests). A reader given the matching public keys takes only entries that a manifest signed by
one of them lists; everything else (unsigned entries, a forged manifest, a manifest for another
compiler prefix) is skipped and reported. The runner pod of an untrusted test never holds a
signing key, so it cannot impersonate a trusted pusher.

Without trusted keys, a pull takes NEFF entries unsigned (the public TorchNeuron cache bucket is
an unsigned mirror) but never host-side (inductor) entries from a target someone else can write:
they are pulled unsigned only from a local folder that only this user can write, or when the
caller says explicitly that it trusts the target's writers (``trust_unsigned``).

Manifests live beside the entries, under the compiler prefix::

    <root>/<prefix>/signatures/<UTC time>-<random>.json
    {"body": "<canonical JSON: version, prefix, entries, created>", "key": "ed25519:<base64>",
     "signature": "<base64>"}
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from model_support.compile_cache.errors import CompileCacheError

SIGNATURES_DIR = "signatures"
"""The folder under a compiler prefix that holds signed manifests (never an entry)."""
MANIFEST_LIMIT_BYTES = 64 * 2**20
"""A manifest larger than this is not read (a million entries take about 100 MB... less: names
are ~110 bytes; the limit is generous and bounds what a hostile writer makes a reader load)."""
KEY_PREFIX = "ed25519:"
SIGNING_KEY_ENV = "MODEL_SUPPORT_CACHE_SIGNING_KEY"
"""A file holding the Ed25519 private key pushes sign with (PEM, PKCS#8)."""
TRUSTED_KEYS_ENV = "MODEL_SUPPORT_CACHE_TRUSTED_KEYS"
"""Public keys (``ed25519:<base64>``, comma-separated) whose manifests pulls trust."""


class UntrustedCache(CompileCacheError, ValueError):
    """A key or manifest is malformed, or a pull was refused by the trust rules."""

    label = "untrusted"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of ``ed25519:<base64>``; raises :class:`UntrustedCache` otherwise."""
    value = text.strip()
    if not value.startswith(KEY_PREFIX):
        raise UntrustedCache(
            f"{value[:40]!r} is not a compile cache key: expected ed25519:<base64> "
            "(as `model-support cache keygen` prints it)"
        )
    try:
        raw = base64.b64decode(value[len(KEY_PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UntrustedCache(f"{value[:40]!r}: the key is not valid base64") from exc
    if len(raw) != 32:
        raise UntrustedCache(f"{value[:40]!r}: an Ed25519 public key has 32 bytes, not {len(raw)}")
    return raw


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key that signs manifests (held only by trusted pushers)."""

    pem: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> SigningKey:
        """A new random key."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cls(pem)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """The key in a PEM file; raises :class:`UntrustedCache` when it is not one."""
        try:
            pem = Path(path).read_bytes()
        except OSError as exc:
            raise UntrustedCache(f"cannot read the signing key {path}: {exc}") from exc
        key = cls(pem)
        key._private()  # refuse a malformed file now, not after an upload
        return key

    def _private(self):  # type: ignore[no-untyped-def]
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        try:
            key = serialization.load_pem_private_key(self.pem, password=None)
        except (ValueError, TypeError) as exc:
            raise UntrustedCache(f"the signing key is not a PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise UntrustedCache("the signing key is not an Ed25519 key")
        return key

    def public_key(self) -> str:
        """The matching public key as readers are given it: ``ed25519:<base64>``."""
        from cryptography.hazmat.primitives import serialization

        raw = (
            self._private()
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )
        return KEY_PREFIX + _b64(raw)

    def sign_manifest(self, prefix: str, names: Iterable[str]) -> tuple[str, bytes]:
        """A signed manifest vouching for ``names`` under ``prefix``: (object name, bytes)."""
        created = datetime.now(UTC)
        body = json.dumps(
            {
                "version": 1,
                "prefix": prefix,
                "entries": sorted(set(names)),
                "created": created.isoformat(),
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        signature = self._private().sign(body.encode())
        document = {"body": body, "key": self.public_key(), "signature": _b64(signature)}
        name = f"{SIGNATURES_DIR}/{created:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}.json"
        return name, json.dumps(document).encode()


def verified_entries(data: bytes, prefix: str, trusted: Iterable[str]) -> set[str] | None:
    """The names a manifest vouches for, when it is signed by one of the ``trusted`` public
    keys for this ``prefix``; None when it is not (malformed, unknown key, bad signature)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        document = json.loads(data)
        body_text, key_text, signature = (
            document["body"],
            document["key"],
            base64.b64decode(document["signature"], validate=True),
        )
        if key_text not in set(trusted):
            return None
        Ed25519PublicKey.from_public_bytes(parse_public_key(key_text)).verify(
            signature, body_text.encode()
        )
        body = json.loads(body_text)
    except (ValueError, KeyError, TypeError, binascii.Error, InvalidSignature, UntrustedCache):
        return None
    if body.get("version") != 1 or body.get("prefix") != prefix:
        return None  # signed for another compiler's prefix: not a statement about this one
    entries = body.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        return None
    return set(entries)


@dataclass(frozen=True)
class TrustPolicy:
    """What a pull accepts.

    ``trusted_keys``: entries must be listed by a manifest signed by one of these (when given,
    for every kind of cache). ``trust_unsigned``: the caller trusts everyone who can write the
    target, so host-side (inductor) entries may be pulled without a signature. ``own_folders``:
    a local folder only this user can write holds this user's own entries; False where the
    user is shared with code others control (runner pods of every namespace run as one uid).
    """

    trusted_keys: tuple[str, ...] = ()
    trust_unsigned: bool = False
    own_folders: bool = True

    def __post_init__(self) -> None:
        for key in self.trusted_keys:
            parse_public_key(key)
        if self.trusted_keys and self.trust_unsigned:
            raise UntrustedCache(
                "trusted keys (--trusted-key, MODEL_SUPPORT_CACHE_TRUSTED_KEYS) and "
                "--trust-unsigned contradict each other: keys take only what they signed, "
                "--trust-unsigned takes unsigned entries too; give one of them"
            )

    @property
    def requires_signatures(self) -> bool:
        """Whether only signed entries are taken."""
        return bool(self.trusted_keys)

    @classmethod
    def from_env(
        cls, trust_unsigned: bool = False, extra_keys: Iterable[str] = (), own_folders: bool = True
    ) -> TrustPolicy:
        """The keys of ``MODEL_SUPPORT_CACHE_TRUSTED_KEYS`` plus ``extra_keys``."""
        keys = [k for k in os.environ.get(TRUSTED_KEYS_ENV, "").split(",") if k.strip()]
        return cls(tuple(k.strip() for k in [*keys, *extra_keys]), trust_unsigned, own_folders)


class PrivateFolder:
    """Whether what lies under a local folder can have been written by this user alone.

    A folder whose every file and folder on the way (its parents included) only this user can
    change holds this user's own entries, however they were made. Checked per entry, from the
    target's root down to the file: a folder others can write (a world-writable prefix below a
    private root, say) lets them plant a file there, and a file or folder another user owns is
    theirs. Above the root, a parent others can write is fine only with the sticky bit (``/tmp``:
    nobody may rename what is not theirs), and a parent must belong to this user or to root.
    """

    def __init__(self, root: Path, uid: int | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.uid = uid if uid is not None else (os.geteuid() if hasattr(os, "geteuid") else -1)
        self._folders: dict[Path, str | None] = {}

    def _owned(self, path: Path, info: os.stat_result, parent: bool) -> str | None:
        """Why ``path`` is not this user's alone (None: it is)."""
        mode = info.st_mode
        if parent:
            if info.st_uid not in (self.uid, 0):
                return f"{path} belongs to uid {info.st_uid}, who can replace what is inside"
            if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
                return f"{path} can be written by others (mode {stat.S_IMODE(mode):o})"
            return None
        if info.st_uid != self.uid:
            return f"{path} belongs to uid {info.st_uid}, not to this user ({self.uid})"
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} can be written by others (mode {stat.S_IMODE(mode):o})"
        return None

    def _folder(self, path: Path, parent: bool, inside: bool) -> str | None:
        """Why the folder ``path`` is not this user's alone. ``inside``: under the root, where a
        link is never followed (above it, and the root itself, a link is the admin's: a mount
        point)."""
        if path not in self._folders:
            try:
                info = path.lstat() if inside else path.stat()
            except FileNotFoundError:
                problem = None  # made by the first push, under a folder checked too
            except OSError as exc:
                problem = f"{path} cannot be checked: {exc.strerror or exc}"
            else:
                if stat.S_ISLNK(info.st_mode):
                    problem = f"{path} is a symbolic link"
                elif not stat.S_ISDIR(info.st_mode):
                    problem = f"{path} is not a folder"
                else:
                    problem = self._owned(path, info, parent)
            self._folders[path] = problem
        return self._folders[path]

    def root_problem(self) -> str | None:
        """Why the root (or a folder above it) is not this user's alone; None: it is."""
        for parent in reversed(self.root.parents):
            problem = self._folder(parent, parent=True, inside=False)
            if problem:
                return problem
        return self._folder(self.root, parent=False, inside=False)

    def entry_problem(self, relative: str) -> str | None:
        """Why the file ``relative`` (to the root) may be someone else's; None: only this
        user can have written it (nor could anyone else have replaced it since)."""
        problem = self.root_problem()
        if problem:
            return problem
        current = self.root
        parts = relative.split("/")
        for part in parts[:-1]:
            current = current / part
            problem = self._folder(current, parent=False, inside=True)
            if problem:
                return problem
        file = current / parts[-1]
        try:
            info = file.lstat()
        except OSError as exc:
            return f"{file} cannot be checked: {exc.strerror or exc}"
        if not stat.S_ISREG(info.st_mode):
            return f"{file} is not a regular file"
        return self._owned(file, info, parent=False)


UNVOUCHED_LEDGER = ".model-support-unvouched.json"
"""In a local cache folder: the entries pulls placed there that nobody vouched for (pulled
without a valid signature, from a target others can write), as object names
(``<path>@<sha256>-<size>``). A signing push never vouches for them. A dot file: neither
compiler reads it, and it is never an entry."""
_LEDGER_LIMIT_BYTES = 64 * 2**20


class UnreadableLedger(UntrustedCache):
    """The local cache's record of unvouched entries cannot be read: nothing in it is vouched
    for."""


def unvouched_names(local_dir: Path) -> set[str]:
    """The object names pulls placed in ``local_dir`` without anyone vouching for them.
    Raises :class:`UnreadableLedger` when the record exists but cannot be read (a signing
    push then vouches for nothing)."""
    ledger = local_dir / UNVOUCHED_LEDGER
    try:
        with ledger.open("rb") as handle:
            data = handle.read(_LEDGER_LIMIT_BYTES + 1)
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise UnreadableLedger(f"cannot read {ledger}: {exc.strerror or exc}") from exc
    try:
        if len(data) > _LEDGER_LIMIT_BYTES:
            raise ValueError(f"larger than {_LEDGER_LIMIT_BYTES} bytes")
        names = json.loads(data)["unvouched"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("its unvouched entries are not a list of names")
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableLedger(f"{ledger} is not a record of pulled entries: {exc}") from exc
    return set(names)


def record_unvouched(local_dir: Path, names: Iterable[str]) -> None:
    """Add ``names`` to ``local_dir``'s record of unvouched entries (atomically). An unreadable
    record is replaced by one holding every name it could have held: none are lost, since a
    signing push treats an unreadable record as vouching for nothing, and this one stays so."""
    added = set(names)
    if not added:
        return
    try:
        known = unvouched_names(local_dir)
    except UnreadableLedger:
        return  # left as it is: it already makes every entry here unvouched
    ledger = local_dir / UNVOUCHED_LEDGER
    temp = local_dir / f"{UNVOUCHED_LEDGER}.{uuid.uuid4().hex}.tmp"
    temp.write_text(json.dumps({"unvouched": sorted(known | added)}), encoding="utf-8")
    os.replace(temp, ledger)
