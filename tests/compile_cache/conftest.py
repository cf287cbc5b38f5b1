"""Fixtures for the compile cache: caches laid out as each compiler writes them, and targets
on real storage (a local folder, S3 through moto's server and s3fs)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cache_support import shared_object, write


@pytest.fixture
def inductor_dir(tmp_path: Path) -> Path:
    """An inductor cache as torch 2.13 lays it out: FX graph and AOT autograd pickles,
    generated code, a compiled kernel with its lock file, and the leftovers that are not
    entries (a write_atomic temporary file, an object file)."""
    root = tmp_path / "inductor"
    write(root, "fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy", b"fx-graph-pickle" * 100)
    write(root, "aotautograd/ayfajmyv6brtctsdvjm3/ncgjjajt5kodryvx", b"aot-entry" * 50)
    write(root, "43/c43daxhgfnuvzfpo76ohnavy.py", b"# wrapper\nprint('hi')\n")
    write(root, "3g/c3g2mqobe6g24e353lemr6cp.cpp", b'extern "C" int f(int x) { return x; }\n')
    shared_object(root / "3g" / "c3g2mqobe6g24e353lemr6cp.so")
    write(root, "locks/c3g2mqobe6g24e353lemr6cp.lock", b"")
    write(root, "fxgraph/kn/fkn2btr2vnbnjr5wfq/.1234.5678.tmp", b"half a pickle")
    write(root, "3g/c3g2mqobe6g24e353lemr6cp.o", b"\x7fELF object")
    return root


@pytest.fixture
def neff_dir(tmp_path: Path) -> Path:
    """A TorchNeuron NEFF cache: two entries, a miss marker, a write in progress, a lock."""
    root = tmp_path / "neff"
    write(root, "3f/a2/3fa2" + "0" * 28 + ".neff", os.urandom(4096))
    write(root, "b7/01/b701" + "1" * 28 + ".neff", os.urandom(10_000))
    write(root, "c0/ff/c0ff" + "2" * 28 + ".neff", b"")  # zero size: a miss
    write(root, "3f/a2/.tmp.Xy12ab", os.urandom(100))
    write(root, "locks/3fa2" + "0" * 28 + ".lock", b"")
    return root


@pytest.fixture
def s3_target(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A new, empty S3 bucket on moto's server, reached through s3fs."""
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"compile-cache-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    try:
        yield f"s3://{bucket}/team"
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
