"""A small local stand-in for the Hugging Face Hub HTTP API, for tests.

Tests reach it through the real ``huggingface_hub`` client (``HfApi(endpoint=server.url)``), so
the client's own requests, headers and error parsing are exercised. The routes are the ones
huggingface_hub 2.4 calls (read from its source):

* ``GET /api/models/<id>`` and ``GET /api/models/<id>/revision/<rev>`` -- ``model_info``
  (``expand[]`` selects fields, as on the Hub).
* ``GET /api/models`` -- ``list_models``: ``sort`` (downloads, likes, trendingScore, createdAt,
  lastModified; descending), ``pipeline_tag``, ``author``, ``search``, ``filter`` (tags),
  ``gated``, ``limit``, ``expand[]``; pages of ``page_size`` linked by a ``Link: <...>;
  rel="next"`` header like the Hub's.
* ``HEAD``/``GET /<id>/resolve/<rev>/<path>`` -- ``file_exists`` / ``get_hf_file_metadata`` (HEAD,
  needs ``X-Repo-Commit`` and ``ETag``), ``hf_hub_download`` (HEAD then GET) and
  ``parse_safetensors_file_metadata`` (GET with ``Range: bytes=0-100000``, answered 206).

Errors carry the Hub's ``X-Error-Code`` header, which the client turns into typed exceptions:
``RepoNotFound`` (401, also for private repos without access, as the Hub does),
``RevisionNotFound`` (404), ``EntryNotFound`` (404), ``GatedRepo`` (401 without a token, 403 with
a token that has no access).

Every request is logged in ``server.requests`` (method, path, Range header, whether a token was
sent -- never the token itself) so tests can assert, for example, that no weights were fetched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from hub_storage import HubStorage

SORT_KEYS = {
    "downloads": "downloads",
    "likes": "likes",
    "trendingScore": "trendingScore",
    "createdAt": "createdAt",
    "lastModified": "lastModified",
}
# Fields the Hub returns from /api/models when no expand[] is given.
DEFAULT_LIST_FIELDS = (
    "id", "likes", "trendingScore", "private", "downloads", "tags", "pipeline_tag",
    "library_name", "createdAt", "modelId",
)  # fmt: skip


_DIGESTS: dict[tuple[str, int], tuple[bytes, bytes]] = {}
_DIGESTS_LOCK = threading.Lock()


def _content_digest(content: bytes, algorithm: str = "sha1") -> bytes:
    """A digest of a file's bytes (sha1 for commit shas, sha256 for LFS ETags), computed once
    per bytes object: a listing of a thousand repos names every repo's sha on every page, and
    a sweep reads every repo's weights. The object is kept with its digest, so its id is never
    reused while cached."""
    key = (algorithm, id(content))
    with _DIGESTS_LOCK:
        known = _DIGESTS.get(key)
    if known is not None and known[0] is content:
        return known[1]
    digest = hashlib.new(algorithm, content).digest()
    with _DIGESTS_LOCK:
        _DIGESTS[key] = (content, digest)
    return digest


@dataclass
class Repo:
    """One model repository: files per revision plus the listing fields the Hub reports.

    ``revisions`` maps a revision name ("main", a tag, a branch) to its files; each revision
    gets a stable 40-hex commit sha, by which it can also be requested. ``gated`` is False,
    "auto" or "manual"; ``access`` holds the tokens allowed to read a gated or private repo.
    """

    repo_id: str
    files: dict[str, bytes] = field(default_factory=dict)
    revisions: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: bool | str = False
    private: bool = False
    access: set[str] = field(default_factory=set)
    pipeline_tag: str | None = "text-generation"
    library_name: str | None = "transformers"
    tags: list[str] = field(default_factory=list)
    downloads: int = 0
    likes: int = 0
    trending_score: int = 0
    created_at: str = "2025-01-01T00:00:00.000Z"
    last_modified: str = "2025-01-01T00:00:00.000Z"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.files and "main" not in self.revisions:
            self.revisions["main"] = self.files
        self.revisions.setdefault("main", {})

    @classmethod
    def from_dir(cls, repo_id: str, directory: str | Path, **kwargs: Any) -> Repo:
        """A repo whose main revision holds every file under ``directory``."""
        root = Path(directory)
        files = {
            p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
        }
        return cls(repo_id, files=files, **kwargs)

    def sha(self, revision: str) -> str:
        """The commit sha of a named revision (stable, derived from the name and files)."""
        digest = hashlib.sha1(f"{self.repo_id}@{revision}".encode())
        for name in sorted(self.revisions[revision]):
            digest.update(name.encode() + _content_digest(self.revisions[revision][name]))
        return digest.hexdigest()

    def resolve(self, revision: str | None) -> str | None:
        """The revision name for a name or a commit sha; None if unknown."""
        revision = revision or "main"
        if revision in self.revisions:
            return revision
        return next((name for name in self.revisions if self.sha(name) == revision), None)

    def safetensors_parameters(self, revision: str = "main") -> dict[str, int] | None:
        """Parameter count per dtype from the safetensors headers, as the Hub's ``safetensors``."""
        counts: dict[str, int] = {}
        found = False
        for name, content in self.revisions[revision].items():
            if not name.endswith(".safetensors") or len(content) < 8:
                continue
            found = True
            (length,) = struct.unpack("<Q", content[:8])
            header = json.loads(content[8 : 8 + length])
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                n = 1
                for dim in entry["shape"]:
                    n *= dim
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + n
        return counts if found else None

    def info(self, revision: str = "main") -> dict[str, Any]:
        """The full JSON the Hub returns from /api/models/<id>."""
        files = self.revisions[revision]
        data: dict[str, Any] = {
            "_id": hashlib.sha1(self.repo_id.encode()).hexdigest()[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0] if "/" in self.repo_id else None,
            "sha": self.sha(revision),
            "private": self.private,
            "gated": self.gated,
            "disabled": False,
            "downloads": self.downloads,
            "likes": self.likes,
            "trendingScore": self.trending_score,
            "tags": list(self.tags),
            "pipeline_tag": self.pipeline_tag,
            "library_name": self.library_name,
            "createdAt": self.created_at,
            "lastModified": self.last_modified,
            "siblings": [{"rfilename": name} for name in sorted(files)],
        }
        if "config.json" in files:
            try:
                data["config"] = json.loads(files["config.json"])
            except json.JSONDecodeError:
                data["config"] = None  # as the Hub does for a config it cannot parse
        params = self.safetensors_parameters(revision)
        if params is not None:
            data["safetensors"] = {"parameters": params, "total": sum(params.values())}
        data.update(self.extra)
        return data


class HubServer:
    """A threaded HTTP server answering Hub API routes from in-memory repos.

    Use as a context manager; ``url`` is the endpoint to give ``HfApi(endpoint=...)``.
    """

    def __init__(
        self,
        repos: list[Repo] | None = None,
        *,
        page_size: int = 1000,
        storage: HubStorage | None = None,
    ) -> None:
        self.repos: dict[str, Repo] = {}
        # Dataset repositories (commits) and storage buckets: tests/hub_storage.py.
        self.storage = storage
        self.page_size = page_size
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        for repo in repos or []:
            self.add(repo)
        self._server = _KeepAliveServer(("127.0.0.1", 0), _handler_for(self))
        # A short poll interval keeps shutdown (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        """The endpoint, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, repo: Repo) -> Repo:
        """Serve ``repo`` (replacing one with the same id)."""
        self.repos[repo.repo_id] = repo
        return repo

    def start(self) -> HubServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` (an outage, as the Hub has them)."""
        with self._lock:
            self._failures = [status] * count

    def take_failure(self) -> int | None:
        with self._lock:
            failures = getattr(self, "_failures", [])
            return failures.pop() if failures else None


class _KeepAliveServer(ThreadingHTTPServer):
    """A threaded server whose stop also ends its kept-alive connections: the Hub answers over
    HTTP/1.1 and its clients pool connections, so a stopped stand-in must not go on answering
    on a connection a client still holds (a test that stops the Hub means an outage)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End every open connection (its handler thread then sees end of file and exits)."""
        with self._open_lock:
            open_sockets = list(self._open)
        for sock in open_sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as error:
                # Closed by its client or its handler meanwhile: nothing left to end.
                if error.errno not in (errno.ENOTCONN, errno.EBADF):
                    raise


_RESOLVE = re.compile(r"^/(?P<repo>.+?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>.+?)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_INFO = re.compile(r"^/api/models/(?P<repo>.+?)(?:/revision/(?P<rev>[^/]+))?$")


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # The Hub keeps connections alive (HTTP/1.1) and huggingface_hub pools them; a stand-in
        # that closed every connection would bill each request a connect the real one does not.
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            return

        def send_response(self, code: int, message: str | None = None) -> None:
            super().send_response(code, message)
            if self.command == "POST":
                # Error routes answer a POST without reading its body; closing after it keeps
                # an unread body from being taken for the next request on the connection.
                self.send_header("Connection", "close")

        # ---- plumbing
        def _token(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

        def _send(
            self,
            status: int,
            body: bytes = b"",
            headers: dict[str, str] | None = None,
            *,
            head: bool = False,
            content_length: int | None = None,
        ) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header(
                "Content-Length", str(len(body) if content_length is None else content_length)
            )
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, *, head: bool = False) -> None:
            body = json.dumps({"error": message}).encode()
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            headers["Content-Type"] = "application/json"
            self._send(status, body, headers, head=head)

        def _json(self, data: Any, headers: dict[str, str] | None = None) -> None:
            self._send(
                200,
                json.dumps(data).encode(),
                {"Content-Type": "application/json", **(headers or {})},
            )

        def _access(self, repo: Repo | None, repo_id: str, *, head: bool, files: bool) -> bool:
            """Answer with the Hub's error when the caller may not read; True when it may."""
            token = self._token()
            if repo is None or (repo.private and token not in repo.access):
                self._error(401, "RepoNotFound", "Repository not found", head=head)
                return False
            if files and repo.gated and token not in repo.access:
                if token is None:
                    message = (
                        f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in."
                    )
                    self._error(401, "GatedRepo", message, head=head)
                else:
                    message = (
                        f"Access to model {repo_id} is restricted and you are not in the "
                        "authorized list. Visit the model page to ask for access."
                    )
                    self._error(403, "GatedRepo", message, head=head)
                return False
            return True

        # ---- routes
        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_POST(self) -> None:
            hub.log(
                {
                    "method": "POST",
                    "path": unquote(urlsplit(self.path).path),
                    "range": None,
                    "token_sent": self._token() is not None,
                }
            )
            if hub.storage is None or not hub.storage.handle(self, "POST"):
                self._error(404, "NotFound", f"no route for POST {urlsplit(self.path).path}")

        def _route(self, *, head: bool) -> None:
            failure = hub.take_failure()
            if failure is not None:
                self._error(failure, "ServiceUnavailable", "the Hub is having a bad day", head=head)
                return
            parts = urlsplit(self.path)
            path = parts.path
            hub.log(
                {
                    "method": "HEAD" if head else "GET",
                    "path": unquote(path),
                    "range": self.headers.get("Range"),
                    "token_sent": self._token() is not None,
                    "client_port": self.client_address[1],
                }
            )
            if hub.storage is not None and hub.storage.handle(self, "HEAD" if head else "GET"):
                return None
            if path == "/api/models":
                return self._list(parse_qs(parts.query))
            tree = _TREE.match(path)
            if tree and not head:
                return self._tree(
                    unquote(tree["repo"]), unquote(tree["rev"]), unquote(tree["path"] or "")
                )
            info = _INFO.match(path)
            if info and not head:
                return self._info(
                    unquote(info["repo"]),
                    unquote(info["rev"]) if info["rev"] else None,
                    parts.query,
                )
            resolve = _RESOLVE.match(path)
            if resolve:
                return self._resolve(
                    unquote(resolve["repo"]),
                    unquote(resolve["rev"]),
                    unquote(resolve["file"]),
                    head=head,
                )
            self._error(404, "NotFound", f"no route for {path}", head=head)

        def _tree(self, repo_id: str, revision: str, folder: str) -> None:
            """The files under ``folder`` (recursive listing); EntryNotFound for no such folder."""
            repo = hub.repos.get(repo_id)
            if not self._access(repo, repo_id, head=False, files=True):
                return
            assert repo is not None
            name = repo.resolve(revision)
            if name is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            prefix = folder.strip("/") + "/" if folder.strip("/") else ""
            entries = [
                {
                    "type": "file",
                    "path": path,
                    "size": len(content),
                    "oid": hashlib.sha1(content).hexdigest(),
                }
                for path, content in sorted(repo.revisions[name].items())
                if path.startswith(prefix)
            ]
            if prefix and not entries:
                return self._error(404, "EntryNotFound", f"{folder} does not exist on {revision}")
            self._json(entries)

        def _info(self, repo_id: str, revision: str | None, query: str) -> None:
            repo = hub.repos.get(repo_id)
            if not self._access(repo, repo_id, head=False, files=False):
                return
            assert repo is not None
            name = repo.resolve(revision)
            if name is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            data = repo.info(name)
            expand = parse_qs(query).get("expand[]") or parse_qs(query).get("expand")
            if expand:
                data = {k: v for k, v in data.items() if k in {*expand, "id", "_id"}}
            self._json(data)

        def _resolve(self, repo_id: str, revision: str, filename: str, *, head: bool) -> None:
            repo = hub.repos.get(repo_id)
            if not self._access(repo, repo_id, head=head, files=True):
                return
            assert repo is not None
            name = repo.resolve(revision)
            if name is None:
                return self._error(
                    404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head
                )
            content = repo.revisions[name].get(filename)
            sha = repo.sha(name)
            if content is None:
                self.send_response(404)
                for key, value in {
                    "X-Error-Code": "EntryNotFound",
                    "X-Error-Message": "Entry not found",
                    "X-Repo-Commit": sha,
                    "Content-Length": "0",
                }.items():
                    self.send_header(key, value)
                self.end_headers()
                return
            headers = {
                "X-Repo-Commit": sha,
                "ETag": f'"{_content_digest(content, "sha256").hex()}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if head:
                return self._send(200, b"", headers, head=True, content_length=len(content))
            byte_range = self.headers.get("Range")
            if byte_range:
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", byte_range.strip())
                if match is None or int(match[1]) >= len(content):
                    headers["Content-Range"] = f"bytes */{len(content)}"
                    return self._send(416, b"", headers)
                start = int(match[1])
                end = min(int(match[2]) if match[2] else len(content) - 1, len(content) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
                return self._send(206, content[start : end + 1], headers)
            self._send(200, content, headers)

        def _list(self, query: dict[str, list[str]]) -> None:
            def one(key: str) -> str | None:
                values = query.get(key)
                return values[0] if values else None

            repos = [r for r in hub.repos.values() if not r.private or self._token() in r.access]
            if tag := one("pipeline_tag"):
                repos = [r for r in repos if r.pipeline_tag == tag]
            if author := one("author"):
                repos = [r for r in repos if r.repo_id.startswith(f"{author}/")]
            if search := one("search"):
                repos = [r for r in repos if search.lower() in r.repo_id.lower()]
            for tag in query.get("filter", []):
                repos = [r for r in repos if tag in r.tags or tag == r.library_name]
            if (gated := one("gated")) is not None:
                repos = [r for r in repos if bool(r.gated) == (gated.lower() == "true")]
            infos = [r.info() for r in repos]
            if sort := one("sort"):
                if sort not in SORT_KEYS:
                    return self._error(400, "BadRequest", f"Invalid sort key: {sort}")
                infos.sort(key=lambda d: d[SORT_KEYS[sort]], reverse=True)
            limit = int(one("limit") or len(infos))
            infos = infos[:limit]
            expand = query.get("expand[]") or query.get("expand")
            keep = {*expand, "id", "_id"} if expand else set(DEFAULT_LIST_FIELDS)
            if one("config") == "True":
                keep.add("config")
            if one("full") == "True":
                keep |= {"sha", "siblings", "lastModified", "gated", "config"}
            infos = [{k: v for k, v in d.items() if k in keep} for d in infos]
            cursor = int(one("cursor") or 0)
            page = infos[cursor : cursor + hub.page_size]
            headers = {}
            if cursor + hub.page_size < len(infos):
                rest = {k: v for k, v in query.items() if k != "cursor"}
                rest["cursor"] = [str(cursor + hub.page_size)]
                next_url = f"{hub.url}/api/models?{urlencode(rest, doseq=True)}"
                headers["Link"] = f'<{next_url}>; rel="next"'
            self._json(page, headers)

    return Handler


def timestamp(days_ago: int = 0) -> str:
    """An ISO timestamp like the Hub's, ``days_ago`` before 2025-06-01 (for createdAt fields)."""
    base = datetime(2025, 6, 1, tzinfo=UTC).timestamp() - days_ago * 86400
    return datetime.fromtimestamp(base, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


__all__ = ["HubServer", "Repo", "quote", "timestamp"]
