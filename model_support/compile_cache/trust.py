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
    target, so host-side (inductor) entries may be pulled without a signature.
    """

    trusted_keys: tuple[str, ...] = ()
    trust_unsigned: bool = False

    def __post_init__(self) -> None:
        for key in self.trusted_keys:
            parse_public_key(key)

    @property
    def requires_signatures(self) -> bool:
        """Whether only signed entries are taken."""
        return bool(self.trusted_keys)

    @classmethod
    def from_env(cls, trust_unsigned: bool = False, extra_keys: Iterable[str] = ()) -> TrustPolicy:
        """The keys of ``MODEL_SUPPORT_CACHE_TRUSTED_KEYS`` plus ``extra_keys``."""
        keys = [k for k in os.environ.get(TRUSTED_KEYS_ENV, "").split(",") if k.strip()]
        return cls(tuple(k.strip() for k in [*keys, *extra_keys]), trust_unsigned)


def writable_only_by_me(folder: Path) -> bool:
    """Whether a local cache folder (and every folder above it) can be written only by this
    user: then its entries are this user's own, however they were made."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    current = folder.resolve()
    for part in [current, *current.parents]:
        try:
            info = part.stat()
        except FileNotFoundError:
            continue  # created by the first push, under a parent checked below
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return False  # others may replace what is inside
        if part == current and uid is not None and info.st_uid != uid:
            return False
    return True
