"""Dataset repositories (with commits) and storage buckets for the local Hub stand-in.

Plugged into :class:`hubserver.HubServer` (``HubServer(storage=HubStorage())``) and reached
through the real ``huggingface_hub`` client. The routes are those huggingface_hub 2.4 calls
(read from its source: ``hf_api.py``, ``_commit_api.py``, ``hf_file_system.py``):

Dataset repositories -- what ``create_commit``, ``HfFileSystem`` (``hf://datasets/...``, so
pandas and pyarrow) and ``datasets.load_dataset`` use:

* ``POST /api/repos/create`` (``create_repo``: 409 when it exists);
* ``GET /api/datasets/<id>[/revision/<rev>]`` (``dataset_info`` / ``repo_info``: sha, siblings,
  cardData from the README's YAML);
* ``GET /api/datasets/<id>/tree/<rev>[/<path>]`` (``list_repo_tree``, recursive or not, with
  folders) and ``POST /api/datasets/<id>/paths-info/<rev>`` (form ``paths``);
* ``HEAD``/``GET /datasets/<id>/resolve/<rev>/<path>`` (downloads, ranges: 206);
* ``POST /api/validate-yaml`` (``create_commit`` checks a README's metadata first);
* ``POST /api/datasets/<id>/preupload/<rev>``: ``lfs`` for ``*.parquet`` and the other
  suffixes the Hub's default ``.gitattributes`` stores in LFS, ``regular`` otherwise, with the
  oid of the file the revision already has (sha256 / git blob sha1), so unchanged files are
  left out of a commit by the client itself;
* ``POST /api/datasets/<id>/commit/<rev>`` (ndjson): ``file`` (base64), ``lfsFile`` (an object
  uploaded through Xet, found by its sha256), ``deletedFile``, ``deletedFolder``; a
  ``parentCommit`` that is not the branch head is refused with 412, as the Hub does, and the
  commit is applied whole or not at all.

Storage buckets -- what ``HfFileSystem`` (``hf://buckets/...``), ``list_bucket_tree`` and
``batch_bucket_files`` use:

* ``POST /api/buckets/<ns>/<name>`` (create), ``GET /api/buckets/<id>`` (info);
* ``GET /api/buckets/<id>/tree[/<prefix>]`` (recursive or not), ``POST .../paths-info``;
* ``HEAD``/``GET /buckets/<id>/resolve/<path>`` (plain HTTP bytes, ranges);
* ``POST /api/buckets/<id>/batch`` (ndjson): ``addFile``/``copyFile`` by xet hash, ``deleteFile``.

Xet, the storage service uploads go through (hf_xet, in Rust, speaks it; the protocol is
published at huggingface.co/docs/xet), as far as uploads need it:

* ``GET /api/{buckets/<id>,datasets/<id>}/xet-write-token[/<rev>]`` -> access token, expiry
  and the service URL (this server, under ``/xet-cas``);
* ``GET /xet-cas/v1/chunks/<ns>/<hash>`` (global deduplication): 404, so everything is sent;
* ``POST /xet-cas/v1/xorbs/default/<hash>``: the xorb's chunks are decoded (8-byte headers;
  none, LZ4 or byte-grouped LZ4) and kept;
* ``POST /xet-cas/v1/shards``: each file of the shard's file info section is rebuilt from its
  terms (xorb, chunk range), so buckets and LFS commits can name it by xet hash or sha256;
* not served: ``xorb-grants`` and ``v2/shards`` (404: hf_xet 1.8 falls back to direct xorb
  uploads and ``v1/shards``), and the reconstruction API (``/v1/reconstructions/<hash>``) that
  hf_xet's own downloads use. Listings therefore carry no xet hash for repository files, and
  every read in the tests is a plain HTTP GET of ``resolve``, which the real Hub also serves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml


def git_blob_sha(content: bytes) -> str:
    """The oid git gives a blob (what the Hub reports for a regular file)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Commit:
    oid: str
    parent: str | None
    files: dict[str, bytes]
    summary: str
    date: str


@dataclass
class DatasetRepo:
    """A dataset repository: a ``main`` branch of commits, each a whole snapshot of files."""

    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    head: str = ""

    def __post_init__(self) -> None:
        if not self.head:
            self._append({}, "initial commit", None)

    def _append(self, files: dict[str, bytes], summary: str, parent: str | None) -> Commit:
        digest = hashlib.sha1(f"{self.repo_id}:{parent}:{summary}:{len(self.commits)}".encode())
        for name in sorted(files):
            digest.update(name.encode() + git_blob_sha(files[name]).encode())
        commit = Commit(digest.hexdigest(), parent, dict(files), summary, _now())
        self.commits[commit.oid] = commit
        self.head = commit.oid
        return commit

    def snapshot(self, revision: str | None) -> Commit | None:
        """The commit a revision names: main (or none), or a commit oid."""
        if revision in (None, "main"):
            return self.commits[self.head]
        return self.commits.get(revision or "")


@dataclass
class BucketFile:
    content: bytes
    mtime: str
    uploaded_at: str
    xet_hash: str = ""  # the hash Xet gave the upload; placed files get their sha256

    def __post_init__(self) -> None:
        self.xet_hash = self.xet_hash or hashlib.sha256(self.content).hexdigest()


@dataclass
class Bucket:
    bucket_id: str
    files: dict[str, BucketFile] = field(default_factory=dict)
    created_at: str = field(default_factory=_now)


def xet_hex(raw: bytes) -> str:
    """A 32-byte Xet hash as the API writes it: each 8-byte group little-endian, in order."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def _ungroup4(data: bytes) -> bytes:
    """Undo Xet's byte grouping (bytes i, i+4, i+8, ... stored together, for i in 0..3)."""
    n = len(data)
    sizes = [(n - i + 3) // 4 for i in range(4)]
    groups, start = [], 0
    for size in sizes:
        groups.append(data[start : start + size])
        start += size
    out = bytearray(n)
    for i, group in enumerate(groups):
        out[i::4] = group
    return bytes(out)


def parse_xorb(blob: bytes) -> list[bytes]:
    """The chunks of a serialized xorb: 8-byte headers (version, compressed size (3 bytes),
    compression, uncompressed size (3 bytes)), each followed by its compressed bytes."""
    import lz4.frame

    chunks, offset = [], 0
    while offset + 8 <= len(blob):
        version = blob[offset]
        compressed = int.from_bytes(blob[offset + 1 : offset + 4], "little")
        scheme = blob[offset + 4]
        size = int.from_bytes(blob[offset + 5 : offset + 8], "little")
        if version != 0 or scheme > 2 or offset + 8 + compressed > len(blob):
            break  # the footer (hashes and boundaries) follows the chunks
        data = blob[offset + 8 : offset + 8 + compressed]
        if scheme == 1:
            data = lz4.frame.decompress(data)
        elif scheme == 2:
            data = _ungroup4(lz4.frame.decompress(data))
        if len(data) != size:
            raise ValueError(f"xorb chunk of {len(data)} bytes, header says {size}")
        chunks.append(data)
        offset += 8 + compressed
    return chunks


def parse_shard_files(shard: bytes) -> dict[str, list[tuple[str, int, int]]]:
    """File hash -> its terms (xorb hash, first chunk, end chunk) from a shard's file info
    section: after the 48-byte header, per file a 48-byte header (hash, flags, entry count),
    its 48-byte entries, then verification entries and a metadata entry when flagged; a
    header whose hash is all 0xFF ends the section."""
    files: dict[str, list[tuple[str, int, int]]] = {}
    offset = 48
    while offset + 48 <= len(shard):
        file_hash = shard[offset : offset + 32]
        if file_hash == b"\xff" * 32:
            break
        flags, count = struct.unpack_from("<II", shard, offset + 32)
        offset += 48
        terms = []
        for _ in range(count):
            xorb = shard[offset : offset + 32]
            _flags, _bytes, start, end = struct.unpack_from("<IIII", shard, offset + 32)
            terms.append((xet_hex(xorb), start, end))
            offset += 48
        offset += 48 * count * bool(flags & (1 << 31)) + 48 * bool(flags & (1 << 30))
        files[xet_hex(file_hash)] = terms
    return files


@dataclass
class XetStore:
    """What uploads through the Xet protocol leave: xorbs (their chunks) and files (rebuilt from
    the shards' file info, so they can be served over plain HTTP)."""

    xorbs: dict[str, list[bytes]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # by xet hash (buckets name them so)
    by_sha256: dict[str, bytes] = field(default_factory=dict)  # by sha256 (LFS pointers do)

    def add_shard(self, shard: bytes) -> None:
        for file_hash, terms in parse_shard_files(shard).items():
            content = b"".join(b"".join(self.xorbs[xorb][start:end]) for xorb, start, end in terms)
            self.files[file_hash] = content
            self.by_sha256[hashlib.sha256(content).hexdigest()] = content


class HubStorage:
    """Dataset repositories and buckets held in memory; the routes that serve them."""

    def __init__(self) -> None:
        self.datasets: dict[str, DatasetRepo] = {}
        self.buckets: dict[str, Bucket] = {}
        self.xet = XetStore()
        self.commit_requests = 0
        self.lock = threading.Lock()
        self.before_commit: list[Any] = []  # callables run (once each) as a commit arrives
        self.xet_refused = False  # write tokens are refused (a Hub token without write access)

    # ---- for tests
    def dataset(self, repo_id: str) -> DatasetRepo:
        """The repository (created empty if absent)."""
        with self.lock:
            return self.datasets.setdefault(repo_id, DatasetRepo(repo_id))

    def commit_files(
        self, repo_id: str, files: dict[str, bytes], summary: str = "test commit"
    ) -> str:
        """Commit on main as another writer would (returns the new head)."""
        repo = self.dataset(repo_id)
        with self.lock:
            merged = {**repo.commits[repo.head].files, **files}
            return repo._append(merged, summary, repo.head).oid

    def bucket(self, bucket_id: str) -> Bucket:
        with self.lock:
            return self.buckets.setdefault(bucket_id, Bucket(bucket_id))

    def put_bucket_file(
        self, bucket_id: str, path: str, content: bytes, xet_hash: str = ""
    ) -> None:
        """Store a bucket file as a finished upload leaves it."""
        stamp = _now()
        self.bucket(bucket_id).files[path] = BucketFile(content, stamp, stamp, xet_hash)

    # ---- routing
    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> bool:
        """Answer the request if it is one of ours; False to let the server route it."""
        parts = urlsplit(handler.path)
        path = parts.path
        query = parse_qs(parts.query)
        for pattern, route_method, route in _ROUTES:
            if route_method != method and not (route_method == "GET" and method == "HEAD"):
                continue
            match = pattern.match(path)
            if match:
                route(self, _Reply(handler, head=method == "HEAD"), match, query)
                return True
        return False


class _Reply:
    """Writing one answer (the request it answers is ``handler``)."""

    def __init__(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        self.handler = handler
        self.head = head

    @property
    def base(self) -> str:
        """This server's URL, as the client reached it (links the Hub returns point back to it)."""
        return f"http://{self.handler.headers.get('Host', '127.0.0.1')}"

    def body(self) -> bytes:
        length = int(self.handler.headers.get("Content-Length") or 0)
        return self.handler.rfile.read(length) if length else b""

    def send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        self.handler.send_response(status)
        for key, value in (headers or {}).items():
            self.handler.send_header(key, value)
        self.handler.send_header("Content-Length", str(len(body) if length is None else length))
        self.handler.end_headers()
        if not self.head:
            self.handler.wfile.write(body)

    def json(self, data: Any, status: int = 200) -> None:
        self.send(status, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def error(self, status: int, code: str, message: str) -> None:
        headers = {
            "X-Error-Code": code,
            "X-Error-Message": message,
            "Content-Type": "application/json",
        }
        self.send(status, json.dumps({"error": message}).encode(), headers)

    def file(self, content: bytes, headers: dict[str, str]) -> None:
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if self.head:
            return self.send(200, b"", headers, length=len(content))
        wanted = self.handler.headers.get("Range")
        if wanted:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
            if match is None or int(match[1]) >= max(len(content), 1):
                return self.send(416, b"", {**headers, "Content-Range": f"bytes */{len(content)}"})
            start = int(match[1])
            end = min(int(match[2]) if match[2] else len(content) - 1, len(content) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
            return self.send(206, content[start : end + 1], headers)
        self.send(200, content, headers)


# ---- dataset routes ----------------------------------------------------------------------


def _repo(storage: HubStorage, reply: _Reply, repo_id: str) -> DatasetRepo | None:
    repo = storage.datasets.get(repo_id)
    if repo is None:
        reply.error(404, "RepoNotFound", f"Repository {repo_id} not found")
    return repo


def _snapshot(
    storage: HubStorage, reply: _Reply, repo_id: str, revision: str | None
) -> Commit | None:
    repo = _repo(storage, reply, repo_id)
    if repo is None:
        return None
    commit = repo.snapshot(unquote(revision) if revision else None)
    if commit is None:
        reply.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    return commit


def _card_data(files: dict[str, bytes]) -> dict[str, Any] | None:
    readme = files.get("README.md")
    if readme is None:
        return None
    match = re.match(r"^---\n(.*?)\n---\n", readme.decode("utf-8", errors="replace"), re.S)
    return yaml.safe_load(match.group(1)) if match else None


def _create_repo(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    payload = json.loads(reply.body() or b"{}")
    if payload.get("type") != "dataset":
        return reply.error(400, "BadRequest", "this stand-in creates dataset repositories only")
    repo_id = (
        f"{payload['organization']}/{payload['name']}"
        if payload.get("organization")
        else payload["name"]
    )
    with storage.lock:
        if repo_id in storage.datasets:  # the Hub's 409 names the existing repository too
            message = "You already created this dataset repo"
            body = json.dumps(
                {"error": message, "url": f"{reply.base}/datasets/{repo_id}"}
            ).encode()
            headers = {
                "X-Error-Code": "RepoExists",
                "X-Error-Message": message,
                "Content-Type": "application/json",
            }
            return reply.send(409, body, headers)
        storage.datasets[repo_id] = DatasetRepo(repo_id)
    reply.json({"url": f"{reply.base}/datasets/{repo_id}", "name": repo_id})


def _info(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    commit = _snapshot(storage, reply, unquote(match["repo"]), match["rev"])
    if commit is None:
        return
    repo_id = unquote(match["repo"])
    reply.json(
        {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "cardData": _card_data(commit.files),
            "siblings": [{"rfilename": name} for name in sorted(commit.files)],
        }
    )


LFS_SUFFIXES = (".parquet", ".arrow", ".safetensors", ".bin")
"""Paths stored through LFS/Xet, as the Hub's default .gitattributes has them."""


def _file_entry(path: str, content: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "file",
        "path": path,
        "size": len(content),
        "oid": git_blob_sha(content),
    }
    if path.endswith(LFS_SUFFIXES):
        entry["lfs"] = {
            "oid": hashlib.sha256(content).hexdigest(),
            "size": len(content),
            "pointerSize": 134,
        }
    return entry


def _entries(files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, Any]] | None:
    prefix = folder.strip("/") + "/" if folder.strip("/") else ""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(files):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        parts = rest.split("/")
        for depth in range(1, len(parts)):  # folders on the way
            if not recursive and depth > 1:
                break
            path = prefix + "/".join(parts[:depth])
            out.setdefault(
                path,
                {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()},
            )
        if recursive or len(parts) == 1:
            out[name] = {
                "type": "file",
                "path": name,
                "size": len(files[name]),
                "oid": git_blob_sha(files[name]),
            }
    if prefix and not out:
        return None
    return list(out.values())


def _tree(
    storage: HubStorage, reply: _Reply, match: re.Match[str], query: dict[str, list[str]]
) -> None:
    commit = _snapshot(storage, reply, unquote(match["repo"]), match["rev"])
    if commit is None:
        return
    recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
    entries = _entries(commit.files, unquote(match["path"] or ""), recursive)
    if entries is None:
        return reply.error(404, "EntryNotFound", f"{match['path']} does not exist")
    reply.json(entries)


def _paths_info(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    commit = _snapshot(storage, reply, unquote(match["repo"]), match["rev"])
    if commit is None:
        return
    form = parse_qs(reply.body().decode())
    found = []
    for path in form.get("paths", []):
        path = path.strip("/")
        if path in commit.files:
            content = commit.files[path]
            found.append(
                {"type": "file", "path": path, "size": len(content), "oid": git_blob_sha(content)}
            )
        elif any(name.startswith(path + "/") for name in commit.files):
            found.append(
                {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()}
            )
    reply.json(found)


def _resolve(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    commit = _snapshot(storage, reply, unquote(match["repo"]), match["rev"])
    if commit is None:
        return
    content = commit.files.get(unquote(match["file"]))
    if content is None:
        return reply.error(404, "EntryNotFound", "Entry not found")
    reply.file(content, {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_sha(content)}"'})


def _validate_yaml(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    payload = json.loads(reply.body() or b"{}")
    try:
        _card_data({"README.md": str(payload.get("content", "")).encode()})
    except yaml.YAMLError as exc:
        return reply.json(
            {"errors": [{"message": f"invalid YAML: {exc}"}], "warnings": []}, status=400
        )
    reply.json({"errors": [], "warnings": []})


def _preupload(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    commit = _snapshot(storage, reply, unquote(match["repo"]), match["rev"])
    if commit is None:
        return
    files = json.loads(reply.body())["files"]
    answer = []
    for item in files:
        existing = commit.files.get(item["path"])
        lfs = item["path"].endswith(LFS_SUFFIXES) and item["size"] > 0
        entry = {
            "path": item["path"],
            "uploadMode": "lfs" if lfs else "regular",
            "shouldIgnore": False,
        }
        if existing is not None:
            entry["oid"] = hashlib.sha256(existing).hexdigest() if lfs else git_blob_sha(existing)
        answer.append(entry)
    reply.json({"files": answer, "commitOid": commit.oid})


def _commit(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    repo_id, revision = unquote(match["repo"]), unquote(match["rev"])
    lines = [json.loads(line) for line in reply.body().splitlines() if line.strip()]
    with storage.lock:
        storage.commit_requests += 1
        hooks, storage.before_commit = storage.before_commit, []
    for hook in hooks:
        hook()
    with storage.lock:
        repo = storage.datasets.get(repo_id)
        if repo is None:
            return reply.error(404, "RepoNotFound", f"Repository {repo_id} not found")
        if revision != "main":
            return reply.error(400, "BadRequest", "this stand-in commits to main only")
        header = next((item["value"] for item in lines if item["key"] == "header"), {})
        parent = header.get("parentCommit")
        if parent is not None and parent != repo.head:
            return reply.error(
                412,
                "PreconditionFailed",
                f"A commit has happened since. Please refresh and try again. (parent {parent} is not the head {repo.head})",
            )
        files = dict(repo.commits[repo.head].files)
        for item in lines:
            key, value = item["key"], item.get("value", {})
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if value["path"] not in files:
                    return reply.error(404, "EntryNotFound", "A file with this name doesn't exist")
                del files[value["path"]]
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {n: c for n, c in files.items() if not n.startswith(folder)}
            elif key == "lfsFile":
                content = storage.xet.by_sha256.get(value["oid"])
                if content is None:
                    message = f"{value['path']}: no uploaded object with sha256 {value['oid']}"
                    return reply.error(422, "LfsObjectMissing", message)
                files[value["path"]] = content
        commit = repo._append(files, header.get("summary", ""), repo.head)
    reply.json(
        {
            "success": True,
            "commitOid": commit.oid,
            "commitUrl": f"{reply.base}/datasets/{repo_id}/commit/{commit.oid}",
        }
    )


# ---- bucket routes -----------------------------------------------------------------------


def _bucket_entry(path: str, file: BucketFile) -> dict[str, Any]:
    return {
        "type": "file",
        "path": path,
        "size": len(file.content),
        "xetHash": file.xet_hash,
        "mtime": file.mtime,
        "uploadedAt": file.uploaded_at,
    }


def _bucket(storage: HubStorage, reply: _Reply, bucket_id: str) -> Bucket | None:
    bucket = storage.buckets.get(bucket_id)
    if bucket is None:
        reply.error(404, "BucketNotFound", f"Bucket {bucket_id} not found")
    return bucket


def _bucket_create(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    bucket_id = unquote(match["bucket"])
    with storage.lock:
        if bucket_id in storage.buckets:
            return reply.error(409, "BucketExists", "You already created this bucket")
        storage.buckets[bucket_id] = Bucket(bucket_id)
    reply.json({"url": f"{reply.base}/buckets/{bucket_id}"})


def _bucket_info(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    bucket = _bucket(storage, reply, unquote(match["bucket"]))
    if bucket is None:
        return
    reply.json(
        {
            "id": bucket.bucket_id,
            "private": False,
            "createdAt": bucket.created_at,
            "size": sum(len(f.content) for f in bucket.files.values()),
            "totalFiles": len(bucket.files),
        }
    )


def _bucket_tree(
    storage: HubStorage, reply: _Reply, match: re.Match[str], query: dict[str, list[str]]
) -> None:
    bucket = _bucket(storage, reply, unquote(match["bucket"]))
    if bucket is None:
        return
    prefix = unquote(match["prefix"] or "").strip("/")
    recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
    base = prefix + "/" if prefix else ""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(bucket.files):
        if prefix and path != prefix and not path.startswith(base):
            continue
        rest = path[len(base) :] if path != prefix else path
        if recursive or "/" not in rest:
            out[path] = _bucket_entry(path, bucket.files[path])
        else:
            folder = base + rest.split("/", 1)[0]
            out.setdefault(
                folder,
                {"type": "directory", "path": folder, "uploadedAt": bucket.files[path].uploaded_at},
            )
    reply.json(list(out.values()))


def _bucket_paths_info(
    storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any
) -> None:
    bucket = _bucket(storage, reply, unquote(match["bucket"]))
    if bucket is None:
        return
    paths = json.loads(reply.body())["paths"]
    reply.json([_bucket_entry(p, bucket.files[p]) for p in paths if p in bucket.files])


def _bucket_batch(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    bucket = _bucket(storage, reply, unquote(match["bucket"]))
    if bucket is None:
        return
    failed = []
    known = {f.xet_hash: f.content for b in storage.buckets.values() for f in b.files.values()}
    known.update(storage.xet.files)
    operations = [json.loads(line) for line in reply.body().splitlines() if line.strip()]
    for op in operations:
        if op["type"] == "deleteFile":
            bucket.files.pop(op["path"], None)
        elif op["xetHash"] in known:
            storage.put_bucket_file(
                bucket.bucket_id, op["path"], known[op["xetHash"]], op["xetHash"]
            )
        else:
            failed.append(
                {"path": op["path"], "error": "content not stored here (Xet is not served)"}
            )
    reply.json({"failed": failed}, status=422 if failed and len(failed) == len(operations) else 200)


def _bucket_resolve(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    bucket = _bucket(storage, reply, unquote(match["bucket"]))
    if bucket is None:
        return
    file = bucket.files.get(unquote(match["path"]))
    if file is None:
        return reply.error(404, "EntryNotFound", "Entry not found")
    reply.file(file.content, {"ETag": f'"{file.xet_hash}"'})


def _xet_token(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    """A token for the Xet storage service, which this server also plays (under /xet-cas)."""
    if storage.xet_refused:
        return reply.error(403, "Forbidden", "this token has no write access to the bucket")
    reply.json(
        {
            "accessToken": "stand-in-xet-token",
            "exp": int(time.time()) + 3600,
            "casUrl": f"{reply.base}/xet-cas",
        }
    )


def _xet_chunk(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    reply.error(404, "NotFound", "no global deduplication here")  # the client uploads everything


def _xet_xorb(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    chunks = parse_xorb(reply.body())
    with storage.lock:
        inserted = match["hash"] not in storage.xet.xorbs
        storage.xet.xorbs[match["hash"]] = chunks
    reply.json({"was_inserted": inserted})


def _xet_shard(storage: HubStorage, reply: _Reply, match: re.Match[str], query: Any) -> None:
    shard = reply.body()
    with storage.lock:
        storage.xet.add_shard(shard)
    reply.json({"result": 1})


_DATASET = r"(?P<repo>[^/]+/[^/]+)"
_BUCKET = r"(?P<bucket>[^/]+/[^/]+)"
_ROUTES: list[tuple[re.Pattern[str], str, Any]] = [
    (re.compile(r"^/api/repos/create$"), "POST", _create_repo),
    (re.compile(r"^/api/validate-yaml$"), "POST", _validate_yaml),
    (
        re.compile(rf"^/api/datasets/{_DATASET}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$"),
        "GET",
        _tree,
    ),
    (re.compile(rf"^/api/datasets/{_DATASET}/paths-info/(?P<rev>[^/]+)$"), "POST", _paths_info),
    (re.compile(rf"^/api/datasets/{_DATASET}/preupload/(?P<rev>[^/]+)$"), "POST", _preupload),
    (re.compile(rf"^/api/datasets/{_DATASET}/commit/(?P<rev>[^/]+)$"), "POST", _commit),
    (re.compile(rf"^/api/datasets/{_DATASET}(?:/revision/(?P<rev>[^/]+))?$"), "GET", _info),
    (re.compile(rf"^/datasets/{_DATASET}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$"), "GET", _resolve),
    (re.compile(rf"^/api/buckets/{_BUCKET}/xet-(?:write|read)-token$"), "GET", _xet_token),
    (re.compile(rf"^/api/datasets/{_DATASET}/xet-(?:write|read)-token/[^/]+$"), "GET", _xet_token),
    (re.compile(rf"^/api/buckets/{_BUCKET}/tree(?:/(?P<prefix>.*))?$"), "GET", _bucket_tree),
    (re.compile(rf"^/api/buckets/{_BUCKET}/paths-info$"), "POST", _bucket_paths_info),
    (re.compile(rf"^/api/buckets/{_BUCKET}/batch$"), "POST", _bucket_batch),
    (re.compile(rf"^/api/buckets/{_BUCKET}$"), "POST", _bucket_create),
    (re.compile(rf"^/api/buckets/{_BUCKET}$"), "GET", _bucket_info),
    (re.compile(rf"^/buckets/{_BUCKET}/resolve/(?P<path>.+)$"), "GET", _bucket_resolve),
    (re.compile(r"^/xet-cas/v1/chunks/[^/]+/[0-9a-f]{64}$"), "GET", _xet_chunk),
    (re.compile(r"^/xet-cas/v1/xorbs/default/(?P<hash>[0-9a-f]{64})$"), "POST", _xet_xorb),
    (re.compile(r"^/xet-cas/v1/shards$"), "POST", _xet_shard),
]
