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
* ``POST /api/datasets/<id>/preupload/<rev>``: every file is answered ``regular`` with the oid
  (git blob sha1) of the file the revision already has, so unchanged files are left out of a
  commit by the client itself. ``lfs`` is never asked for: the client would then upload the
  bytes through Xet (hf_xet), whose storage protocol this stand-in does not serve;
* ``POST /api/datasets/<id>/commit/<rev>`` (ndjson): ``file`` (base64), ``deletedFile``,
  ``deletedFolder``; a ``parentCommit`` that is not the branch head is refused with 412, as
  the Hub does, and the commit is applied whole or not at all.

Storage buckets -- what ``HfFileSystem`` (``hf://buckets/...``), ``list_bucket_tree`` and
``batch_bucket_files`` use:

* ``POST /api/buckets/<ns>/<name>`` (create), ``GET /api/buckets/<id>`` (info);
* ``GET /api/buckets/<id>/tree[/<prefix>]`` (recursive or not), ``POST .../paths-info``;
* ``HEAD``/``GET /buckets/<id>/resolve/<path>`` (plain HTTP bytes, ranges);
* ``POST /api/buckets/<id>/batch`` (ndjson): ``deleteFile``, and ``addFile``/``copyFile`` of
  content the stand-in already holds (by its xet hash);
* ``GET /api/buckets/<id>/xet-write-token``: answered 501. Uploading new bytes to a bucket goes
  through Xet: hf_xet (Rust) chunks the file, uploads xorbs and a binary shard to the CAS
  server named in the token, and the Hub then serves the file from Xet. That content-addressed
  storage service is not served here, so a push to ``hf://buckets`` fails at this point (as
  against an unreachable Xet service), and tests place bucket objects directly
  (:meth:`HubStorage.put_bucket_file`), as an upload would have left them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
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

    @property
    def xet_hash(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class Bucket:
    bucket_id: str
    files: dict[str, BucketFile] = field(default_factory=dict)
    created_at: str = field(default_factory=_now)


class HubStorage:
    """Dataset repositories and buckets held in memory; the routes that serve them."""

    def __init__(self) -> None:
        self.datasets: dict[str, DatasetRepo] = {}
        self.buckets: dict[str, Bucket] = {}
        self.commit_requests = 0
        self.lock = threading.Lock()
        self.before_commit: list[Any] = []  # callables run (once each) as a commit arrives

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

    def put_bucket_file(self, bucket_id: str, path: str, content: bytes) -> None:
        """Store a bucket file as a finished upload leaves it."""
        stamp = _now()
        self.bucket(bucket_id).files[path] = BucketFile(content, stamp, stamp)

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
        entry = {"path": item["path"], "uploadMode": "regular", "shouldIgnore": False}
        if existing is not None:
            entry["oid"] = git_blob_sha(existing)
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
                return reply.error(
                    400, "BadRequest", "LFS/Xet files are not served by this stand-in"
                )
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
    operations = [json.loads(line) for line in reply.body().splitlines() if line.strip()]
    for op in operations:
        if op["type"] == "deleteFile":
            bucket.files.pop(op["path"], None)
        elif op["xetHash"] in known:
            storage.put_bucket_file(bucket.bucket_id, op["path"], known[op["xetHash"]])
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
    reply.error(
        501,
        "NotImplemented",
        "Xet storage (the content-addressed service bucket uploads go through) is not served by the local Hub stand-in",
    )


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
    (re.compile(rf"^/api/buckets/{_BUCKET}/tree(?:/(?P<prefix>.*))?$"), "GET", _bucket_tree),
    (re.compile(rf"^/api/buckets/{_BUCKET}/paths-info$"), "POST", _bucket_paths_info),
    (re.compile(rf"^/api/buckets/{_BUCKET}/batch$"), "POST", _bucket_batch),
    (re.compile(rf"^/api/buckets/{_BUCKET}$"), "POST", _bucket_create),
    (re.compile(rf"^/api/buckets/{_BUCKET}$"), "GET", _bucket_info),
    (re.compile(rf"^/buckets/{_BUCKET}/resolve/(?P<path>.+)$"), "GET", _bucket_resolve),
]
