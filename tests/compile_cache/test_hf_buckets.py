"""hf://buckets targets through the real huggingface_hub client, against the Hub stand-in.

The stand-in (tests/hub_storage.py) serves the bucket routes the client lists, reads, batches
and deletes with, and the Xet storage service's upload routes (xorbs, shards), so pushes go
through the real hf_xet uploader. Broken objects are placed in the bucket directly.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cache_support import inductor_cache, neff_cache, write
from hub_storage import HubStorage
from hubserver import HubServer

from model_support.compile_cache import (
    CompilerMismatch,
    list_target,
    prune,
    pull,
    push,
    push_for_run,
)
from model_support.compile_cache.errors import TargetUnavailable
from model_support.compile_cache.trust import UNVOUCHED_LEDGER, TrustPolicy

BUCKET = "team/compile-cache"
PREFIX = "inductor-torch-2.13.0+cpu"

WRITERS_TRUSTED = TrustPolicy(trust_unsigned=True)
"""These tests are about moving entries; whose entries to trust is tests/compile_cache/test_trust.py's."""


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    storage = HubStorage()
    storage.bucket(BUCKET)
    with HubServer(storage=storage) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def place(hub: HubServer, path: str, data: bytes, declared: bytes | None = None) -> str:
    """Put an entry object in the bucket as a push names it (hash and size of ``declared``)."""
    assert hub.storage is not None
    named = declared if declared is not None else data
    name = f"cache/{PREFIX}/{path}@{hashlib.sha256(named).hexdigest()}-{len(named)}"
    hub.storage.put_bucket_file(BUCKET, name, data)
    return name


def test_pull_from_a_bucket_verifies_each_entry_and_skips_broken_ones(
    hub: HubServer, tmp_path: Path
) -> None:
    place(hub, "fxgraph/ab/fabc/entry1", b"graph bytes" * 10)
    place(hub, "43/c43wrapper.py", b"print('hi')\n")
    place(
        hub, "3g/c3g.cpp", b"int f();", declared=b"int g();"
    )  # corrupt: bytes do not match the name
    place(hub, "9q/c9q.py", b"cut", declared=b"cut short by a killed upload")
    assert hub.storage is not None
    hub.storage.put_bucket_file(
        BUCKET, f"cache/{PREFIX}/locks/c43.lock@{'0' * 64}-0", b""
    )  # never an entry

    local = tmp_path / "inductor"
    report = pull(
        f"hf://buckets/{BUCKET}/cache", compiler=inductor_cache(local), policy=WRITERS_TRUSTED
    )
    assert report.error is None
    assert report.entries == 2
    assert (local / "43" / "c43wrapper.py").read_bytes() == b"print('hi')\n"
    assert (local / "fxgraph/ab/fabc/entry1").read_bytes() == b"graph bytes" * 10
    reasons = {s.path.split("@")[0]: s.reason for s in report.skipped}
    assert "corrupt" in reasons["3g/c3g.cpp"] and "truncated" in reasons["9q/c9q.py"]
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    # Nothing broken, no leftovers; and the pull's record of what it took unsigned.
    assert files == [UNVOUCHED_LEDGER, "43/c43wrapper.py", "fxgraph/ab/fabc/entry1"]
    # every read went through the bucket API and the resolve endpoint, nothing else
    paths = {r["path"] for r in hub.requests}
    assert f"/api/buckets/{BUCKET}/tree/cache/{PREFIX}" in paths
    assert (
        f"/buckets/{BUCKET}/resolve/cache/{PREFIX}/43/c43wrapper.py@"
        + hashlib.sha256(b"print('hi')\n").hexdigest()
        + "-12"
        in paths
    )


def test_a_public_style_mirror_in_a_bucket_is_pulled_as_unverified_neff_entries(
    hub: HubServer, tmp_path: Path
) -> None:
    """The public NEFF bucket's layout: plain files under neuronxcc-<version>/, as synced."""
    assert hub.storage is not None
    key = "3f/a2/3fa2" + "0" * 28 + ".neff"
    hub.storage.put_bucket_file(BUCKET, f"neuronxcc-2.28.7631.0/{key}", b"a neff")
    hub.storage.put_bucket_file(BUCKET, "neuronxcc-2.28.7631.0/3f/a2/.tmp.xyz", b"half")
    hub.storage.put_bucket_file(
        BUCKET, "neuronxcc-2.27.0.0/b7/01/b701" + "1" * 28 + ".neff", b"old"
    )
    local = tmp_path / "neff"
    report = pull(f"hf://buckets/{BUCKET}/neuronxcc-2.28.7631.0", compiler=neff_cache(local))
    assert (report.entries, report.unverified) == (1, 1)
    assert (local / key).read_bytes() == b"a neff"
    with pytest.raises(CompilerMismatch):
        pull(f"hf://buckets/{BUCKET}/neuronxcc-2.27.0.0", compiler=neff_cache(local))
    listing = list_target(f"hf://buckets/{BUCKET}", compiler=neff_cache(local), all_prefixes=True)
    assert [(x.prefix, x.entries, x.installed) for x in listing] == [
        ("neuronxcc-2.27.0.0", 1, False),
        ("neuronxcc-2.28.7631.0", 1, True),
    ]


def test_prune_deletes_broken_objects_from_the_bucket(hub: HubServer, tmp_path: Path) -> None:
    good = place(hub, "43/c43wrapper.py", b"print('hi')\n")
    place(hub, "9q/c9q.py", b"cut", declared=b"cut short by a killed upload")
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    report = prune(
        f"hf://buckets/{BUCKET}/cache",
        compiler=inductor_cache(tmp_path / "x"),
        now=lambda: tomorrow,
    )
    assert [r.reason for r in report.removed] == ["truncated or empty"]
    assert hub.storage is not None
    assert sorted(hub.storage.buckets[BUCKET].files) == [good]


def test_push_then_pull_through_a_bucket_round_trips_every_entry(
    hub: HubServer, tmp_path: Path
) -> None:
    """Uploads go through Xet (xorbs and a shard to the storage service, then the bucket batch)."""
    local = tmp_path / "inductor"
    write(local, "43/c43wrapper.py", b"print('hi')\n" * 500)
    write(local, "fxgraph/ab/fabc/entry1", os.urandom(300_000))
    write(local, "fxgraph/ab/fabc/.123.456.tmp", b"half a graph")
    report = push(f"hf://buckets/{BUCKET}/cache", compiler=inductor_cache(local))
    assert (report.entries, report.error) == (2, None)
    assert hub.storage is not None and hub.storage.xet.xorbs  # the bytes went through Xet
    stored = sorted(hub.storage.buckets[BUCKET].files)
    assert [name.split("@")[0] for name in stored] == [
        f"cache/{PREFIX}/43/c43wrapper.py",
        f"cache/{PREFIX}/fxgraph/ab/fabc/entry1",
    ]
    assert push(f"hf://buckets/{BUCKET}/cache", compiler=inductor_cache(local)).entries == 0
    fresh = tmp_path / "fresh"
    pulled = pull(
        f"hf://buckets/{BUCKET}/cache", compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED
    )
    assert (pulled.entries, pulled.skipped) == (2, [])
    for path in ("43/c43wrapper.py", "fxgraph/ab/fabc/entry1"):
        assert (fresh / path).read_bytes() == (local / path).read_bytes()


def test_two_pushers_to_a_bucket_at_once_leave_one_valid_object_per_entry(
    hub: HubServer, tmp_path: Path
) -> None:
    local = tmp_path / "neff"
    for i in range(3):
        write(local, f"3f/a{i}/3fa{i}" + "0" * 28 + ".neff", os.urandom(50_000))
    start = threading.Barrier(2)
    reports = []

    def pusher() -> None:
        start.wait()
        reports.append(push(f"hf://buckets/{BUCKET}", compiler=neff_cache(local)))

    threads = [threading.Thread(target=pusher) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.error for r in reports] == [None, None]
    assert hub.storage is not None
    assert len(hub.storage.buckets[BUCKET].files) == 3
    pulled = pull(f"hf://buckets/{BUCKET}", compiler=neff_cache(tmp_path / "fresh"))
    assert (pulled.entries, pulled.skipped) == (3, [])


def test_a_push_the_hub_refuses_is_recorded_not_raised(hub: HubServer, tmp_path: Path) -> None:
    assert hub.storage is not None
    hub.storage.xet_refused = True  # a token without write access
    local = tmp_path / "inductor"
    write(local, "43/c43wrapper.py", b"print('hi')\n")
    report = push(f"hf://buckets/{BUCKET}/cache", compiler=inductor_cache(local))
    assert report.entries == 0
    assert report.error is not None and report.error.startswith("target-unavailable: ")
    assert (
        "could not write the compile cache at hf://buckets/team/compile-cache/cache" in report.error
    )
    assert hub.storage.buckets[BUCKET].files == {}
    guarded = push_for_run(f"hf://buckets/{BUCKET}/cache", backend="cpu")
    assert guarded.error is not None and guarded.entries == 0


def test_a_bucket_that_does_not_exist_is_reported_as_unavailable(
    hub: HubServer, tmp_path: Path
) -> None:
    with pytest.raises(TargetUnavailable, match="hf://buckets/team/missing"):
        pull(
            "hf://buckets/team/missing",
            compiler=inductor_cache(tmp_path / "x"),
            policy=WRITERS_TRUSTED,
        )
