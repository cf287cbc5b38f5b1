"""Publishing the results dataset to a Hugging Face dataset repository, one commit at a time.

``publish(results, "hf://datasets/ORG/NAME")`` materializes the matrix from the records, then
makes the repository hold exactly the matrix files (``data/*.parquet``), the dataset card
(``README.md``, whose YAML ``configs:`` lets ``datasets.load_dataset`` load it) and the selected
list, in ONE commit: readers see the old dataset or the new one, never half of each. Records are
not published one by one (thousands of tiny commits); a publish after many runs is one commit.

The commit names its parent (``parent_commit``): when another publisher committed in between,
the Hub refuses it with 412 and the publish starts over from the new head (operations are
recomputed, so a matrix file the other publisher removed is not deleted twice), with backoff.
A publish that changes nothing makes no commit.

Every attempt reads the head first, then materializes and reads the store again, so a retry
publishes what the store holds now. The commit carries ``snapshot.json``: how many records the
snapshot holds and when the newest of them was recorded. A publish whose snapshot is older than
the head's (another publisher read the store later, or published another store) is refused
rather than committed over it; a store with records never publishes an empty matrix.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError

from model_support.selection import SELECTED_NAMES
from model_support.store import CARD_NAME, DATA_DIR, RECORDS_DIR, ResultsStore

_DATASET_URI = re.compile(r"^hf://datasets/(?P<id>[A-Za-z0-9][\w.-]*/[\w.-]+?)/?$")
CONFLICT = 412
"""HTTP status of a commit whose parent is no longer the branch head."""
SNAPSHOT_NAME = "snapshot.json"
"""The published file that says how recent the published snapshot is."""


class PublishError(Exception):
    """The dataset could not be published; the message says why and what to do."""


@dataclass(frozen=True)
class PublishReport:
    """What one publish did."""

    repo_id: str
    commit: str | None  # the new commit; None when nothing changed
    head: str  # the repository's head afterwards
    files: list[str] = field(default_factory=list)  # what the dataset is made of
    deleted: list[str] = field(default_factory=list)  # stale files removed by the commit
    attempts: int = 1  # 1 + the conflicts retried


def parse_dataset_uri(uri: str) -> str:
    """``hf://datasets/ORG/NAME`` -> ``ORG/NAME``; anything else is refused clearly."""
    match = _DATASET_URI.fullmatch(uri.strip())
    if match is None:
        raise PublishError(
            f"{uri!r} is not a dataset repository URI: give hf://datasets/ORG/NAME (the results "
            "are published as a dataset, one commit per publish)"
        )
    return match["id"]


@dataclass(frozen=True, order=True)
class Snapshot:
    """How recent a published snapshot of the store is: ordered by the time its newest record
    was recorded, then by how many records it holds."""

    newest_record: str  # ISO 8601 in UTC to the microsecond (so text order is time order)
    records: int

    def to_bytes(self) -> bytes:
        return (
            json.dumps({"newest_record": self.newest_record, "records": self.records}) + "\n"
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        held = json.loads(data)
        return cls(newest_record=str(held["newest_record"]), records=int(held["records"]))


def _snapshot(store: ResultsStore) -> Snapshot:
    """The snapshot the store's history (every record, as of the last materialize) makes."""
    recorded = store.history_table(columns=["recorded_at"]).column("recorded_at").to_pylist()
    newest = max((t for t in recorded if isinstance(t, datetime)), default=None)
    text = "" if newest is None else newest.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Snapshot(newest_record=text, records=len(recorded))


def _head_snapshot(api: HfApi, repo_id: str, head: str, remote: set[str]) -> Snapshot | None:
    """The snapshot the head holds; None when it holds none (never published, or by a version
    of this code that did not say)."""
    if SNAPSHOT_NAME not in remote:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = api.hf_hub_download(
            repo_id, SNAPSHOT_NAME, repo_type="dataset", revision=head, local_dir=folder
        )
        data = Path(path).read_bytes()
    try:
        return Snapshot.from_bytes(data)
    except (ValueError, KeyError, TypeError):
        return None  # not one this code wrote: nothing to compare with


def _local_files(store: ResultsStore) -> dict[str, bytes]:
    """The files that make up the published dataset, by path in the repository."""
    files: dict[str, bytes] = {}
    # Listed through the store, never globbed: a store path is a path, not a pattern (a glob
    # of res[1]/data/*.parquet published res1's files).
    for matrix_file in sorted(store.matrix_files(), key=lambda f: f.path):
        path = matrix_file.path
        files[f"{DATA_DIR}/{path.rsplit('/', 1)[-1]}"] = store.fs.cat_file(path)
    if not files:
        raise PublishError(
            f"the results at {store.root!r} hold records but no matrix after materialize: "
            "nothing is published (publishing nothing would delete the dataset's data); "
            "run `model-support dataset materialize` and check its error"
        )
    files[CARD_NAME] = store.fs.cat_file(f"{store.root.rstrip('/')}/{CARD_NAME}")
    for name in SELECTED_NAMES:
        path = f"{store.root.rstrip('/')}/{name}"
        if store.fs.exists(path):
            files[name] = store.fs.cat_file(path)
            break
    return files


def _managed(path: str) -> bool:
    """Whether a repository file is one a publish owns (and so may remove when stale)."""
    return (
        (path.startswith(f"{DATA_DIR}/") and path.endswith(".parquet"))
        or path in SELECTED_NAMES
        or path == SNAPSHOT_NAME
    )


def publish(
    results: str,
    repo_uri: str,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    message: str | None = None,
    max_attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
) -> PublishReport:
    """Materialize ``results`` and publish it to ``repo_uri`` in one commit (see the module)."""
    repo_id = parse_dataset_uri(repo_uri)
    store = ResultsStore(results)
    if not store.fs.exists(f"{store.root.rstrip('/')}/{RECORDS_DIR}"):
        raise PublishError(f"no results at {results!r}: nothing to publish (run some tests first)")
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
    delay = 1.0
    for attempt in range(1, max_attempts + 1):
        head = api.repo_info(repo_id, repo_type="dataset").sha
        assert head is not None  # the Hub always reports a branch head
        remote = set(api.list_repo_files(repo_id, repo_type="dataset", revision=head))
        # Read after the head: a head newer than this read was made from a store we cannot see.
        store.materialize()
        files = _local_files(store)
        snapshot = _snapshot(store)
        published = _head_snapshot(api, repo_id, head, remote)
        if published is not None and published > snapshot:
            raise PublishError(
                f"the dataset {repo_id} holds a newer snapshot ({published.records} records, "
                f"newest recorded {published.newest_record}) than the results at {results!r} "
                f"({snapshot.records} records, newest {snapshot.newest_record or 'none'}): "
                "nothing is published; publish from the store the newer snapshot came from"
            )
        files[SNAPSHOT_NAME] = snapshot.to_bytes()
        summary = message or (
            f"Publish the model-support results ({sum(p.startswith(DATA_DIR) for p in files)} "
            "matrix files)"
        )
        stale = sorted(p for p in remote if _managed(p) and p not in files)
        operations: list[CommitOperationAdd | CommitOperationDelete] = [
            CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)
            for path, data in files.items()
        ]
        operations += [CommitOperationDelete(path_in_repo=path) for path in stale]
        try:
            info = api.create_commit(
                repo_id,
                operations,  # type: ignore[arg-type]
                commit_message=summary,
                repo_type="dataset",
                parent_commit=head,
            )
        except HfHubHTTPError as exc:
            if exc.response.status_code != CONFLICT or attempt == max_attempts:
                raise
            sleep(delay * (1 + random.random()))  # another publisher got in first: start over
            delay = min(delay * 2, 30.0)
            continue
        changed = info.oid != head
        return PublishReport(
            repo_id=repo_id,
            commit=info.oid if changed else None,
            head=info.oid,
            files=sorted(files),
            deleted=stale if changed else [],
            attempts=attempt,
        )
    raise AssertionError("unreachable: the last attempt returns or raises")
