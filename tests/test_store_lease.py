"""The materialize lock on S3 (moto's server: the real protocol, conditional requests included)
and the repair of matrix rows that went missing, on S3 and on a local folder."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from factories import make_record
from test_store import NEURON_FILE

import model_support.store as store_module
import model_support.store_lease as lease_module
from model_support.store import ResultsStore
from model_support.store_lease import LeaseLost

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_uri(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket on moto's server; this process's S3 clients talk to it."""
    import s3fs

    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"lease-{uuid.uuid4().hex[:12]}"
    client().create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/results"
    s3fs.S3FileSystem.clear_instance_cache()


def client() -> object:
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def lock_key(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, f"{prefix}/index/lock.json"


def hold_in_turns(uri: str, holders: int, hold_s: float) -> list[tuple[float, float]]:
    """``holders`` threads take the materialize lock at once, each keeping it ``hold_s``;
    the (entered, left) times of each."""
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(holders)

    def hold() -> None:
        try:
            store = ResultsStore(uri)
            start.wait()
            with store._exclusive() as still_held:
                entered = time.monotonic()
                time.sleep(hold_s)
                still_held()
                spans.append((entered, time.monotonic()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=hold) for _ in range(holders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    return sorted(spans)


def assert_one_at_a_time(spans: list[tuple[float, float]]) -> None:
    for (_, left), (entered, _) in itertools.pairwise(spans):
        assert entered >= left, f"two holders at once: {spans}"


def test_a_holder_that_outlives_its_lease_keeps_the_lock(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A materialize longer than the lease is never joined by a second one: the lease is renewed."""
    monkeypatch.setattr(lease_module, "LEASE_S", 3.0)
    spans = hold_in_turns(s3_uri, holders=2, hold_s=7.5)  # two and a half leases each
    assert len(spans) == 2
    assert_one_at_a_time(spans)


def test_waiters_that_find_a_dead_holders_lock_take_it_over_one_at_a_time(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock nobody renews is taken over by exactly one waiter (a write conditional on the
    version they all saw); the others wait their turn."""
    monkeypatch.setattr(lease_module, "LEASE_S", 3.0)
    monkeypatch.setattr(store_module, "LOCK_WAIT_S", 60.0)  # a lock never taken over fails
    bucket, key = lock_key(s3_uri)
    client().put_object(Bucket=bucket, Key=key, Body=b'{"owner": "a materializer that died"}')  # type: ignore[attr-defined]
    spans = hold_in_turns(s3_uri, holders=6, hold_s=0.3)
    assert len(spans) == 6
    assert_one_at_a_time(spans)
    listed = client().list_objects_v2(Bucket=bucket, Prefix=key)  # type: ignore[attr-defined]
    assert listed["KeyCount"] == 0  # the last holder released it


HOLD_AND_WAIT = """
import sys, time
from model_support.store import ResultsStore
with ResultsStore(sys.argv[1])._exclusive():
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_killed_materializers_lock_is_taken_over_after_one_lease(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL leaves the lock file behind; the next materialize goes ahead once it has seen
    the file unchanged for one lease, not after the dead holder's declared expiry."""
    monkeypatch.setattr(lease_module, "LEASE_S", 2.0)
    monkeypatch.setattr(store_module, "LOCK_WAIT_S", 20.0)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, s3_uri], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(30)
        store = ResultsStore(s3_uri)
        started = time.monotonic()
        store.add_and_materialize(make_record("org/after-the-crash"))
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait(30)
    assert list(store.matrix(columns=["model_id"]).model_id) == ["org/after-the-crash"]
    assert waited < 15.0, f"waited {waited:.1f} s for a dead holder's lock"


def test_a_holder_whose_lock_was_taken_over_stops_and_leaves_the_new_lock_alone(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lease_module, "LEASE_S", 2.0)
    store = ResultsStore(s3_uri)
    bucket, key = lock_key(s3_uri)
    with pytest.raises(LeaseLost, match="materialize again"), store._exclusive() as still_held:
        # Another materializer took the lock over (as after a long partition of this one).
        client().put_object(Bucket=bucket, Key=key, Body=b'{"owner": "the new holder"}')  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the next renewal finds out
            still_held()
            time.sleep(0.05)
    body = client().get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[attr-defined]
    assert body == b'{"owner": "the new holder"}'  # released conditionally: not deleted


def test_a_lock_taken_over_after_the_last_renewal_is_not_released_by_the_old_holder(
    s3_uri: str,
) -> None:
    """A take-over between the holder's last renewal and its release (no beat saw it): the
    release is a delete conditional on the holder's own version, so the new lock stays."""
    store = ResultsStore(s3_uri)
    bucket, key = lock_key(s3_uri)
    with store._exclusive():  # released well within the first renewal (LEASE_S / 6 = 5 s)
        client().put_object(Bucket=bucket, Key=key, Body=b'{"owner": "the new holder"}')  # type: ignore[attr-defined]
    body = client().get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[attr-defined]
    assert body == b'{"owner": "the new holder"}'


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> ResultsStore:
    if request.param == "local":
        return ResultsStore(str(tmp_path / "results"))
    return ResultsStore(request.getfixturevalue("s3_uri"))


def test_materialize_puts_back_rows_missing_from_the_matrix(any_store: ResultsStore) -> None:
    """The index holds a record whose row a matrix file lacks (an older file written over the
    newer one): the next materialize rebuilds that file from its records."""
    store = any_store
    store.add_and_materialize(make_record("org/first"))
    path = f"{store.root}/data/{NEURON_FILE}"
    older = store.fs.cat_file(path)
    store.add_and_materialize(make_record("org/second"))
    store.fs.pipe_file(path, older)  # the row of org/second is gone; its record is not
    store.materialize()
    assert sorted(store.matrix(columns=["model_id"]).model_id) == ["org/first", "org/second"]
