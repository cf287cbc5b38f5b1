"""Pull and push on real storage: only complete entries travel, corrupt ones are never loaded."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fsspec
import pytest
from cache_support import inductor_cache, neff_cache, shared_object, write
from waiting import wait_until

from model_support.compile_cache import (
    CompilerMismatch,
    installed_compiler_cache,
    list_target,
    prune,
    pull,
    pull_for_run,
    push,
    push_for_run,
)
from model_support.compile_cache.layouts import is_entry_path
from model_support.compile_cache.trust import UNVOUCHED_LEDGER, TrustPolicy

INDUCTOR_ENTRIES = {
    "fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy",
    "aotautograd/ayfajmyv6brtctsdvjm3/ncgjjajt5kodryvx",
    "43/c43daxhgfnuvzfpo76ohnavy.py",
    "3g/c3g2mqobe6g24e353lemr6cp.cpp",
    "3g/c3g2mqobe6g24e353lemr6cp.so",
}
PREFIX = "inductor-torch-2.13.0+cpu"

WRITERS_TRUSTED = TrustPolicy(trust_unsigned=True)
"""These tests are about moving entries; whose entries to trust is tests/compile_cache/test_trust.py's."""


def stored(uri: str) -> dict[str, bytes]:
    """Every object under a target URI: name relative to the URI -> bytes."""
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(root):
        return {}
    return {p[len(root.rstrip("/")) + 1 :]: fs.cat_file(p) for p in fs.find(root)}


def entries_of(root: Path) -> dict[str, bytes]:
    """The cache's files, less its locks and the pull's record of unvouched entries."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.parts[len(root.parts)] != "locks" and p.name != UNVOUCHED_LEDGER
    }


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "target")
    return str(request.getfixturevalue("s3_target"))


def test_push_sends_complete_entries_named_by_hash_and_size(
    inductor_dir: Path, target: str
) -> None:
    report = push(target, compiler=inductor_cache(inductor_dir))
    assert report.error is None
    assert (report.entries, report.present) == (5, 0)
    objects = stored(f"{target}/{PREFIX}")
    assert len(objects) == 5
    for name, data in objects.items():
        path, _, tail = name.rpartition("@")
        digest, size = tail.split("-")
        assert path in INDUCTOR_ENTRIES
        assert digest == hashlib.sha256(data).hexdigest()
        assert int(size) == len(data) == (inductor_dir / path).stat().st_size
    # the temporary file, the lock and the object file never travel
    assert not [n for n in objects if ".tmp" in n or "locks/" in n or ".o@" in n]
    assert report.bytes == sum(len(d) for d in objects.values())


def test_neff_push_skips_temporary_files_locks_and_miss_markers(
    neff_dir: Path, target: str
) -> None:
    report = push(target, compiler=neff_cache(neff_dir))
    names = {n.rpartition("@")[0] for n in stored(f"{target}/neuronxcc-2.28.7631.0")}
    assert names == {"3f/a2/3fa2" + "0" * 28 + ".neff", "b7/01/b701" + "1" * 28 + ".neff"}
    assert [s.path for s in report.skipped] == ["c0/ff/c0ff" + "2" * 28 + ".neff"]
    assert "empty" in report.skipped[0].reason


def test_pushes_are_incremental(inductor_dir: Path, target: str) -> None:
    compiler = inductor_cache(inductor_dir)
    push(target, compiler=compiler)
    again = push(target, compiler=compiler)
    assert (again.entries, again.bytes, again.present) == (0, 0, 5)
    write(inductor_dir, "fxgraph/zz/fzznew/entry1", b"a new graph")
    third = push(target, compiler=compiler)
    assert (third.entries, third.present) == (1, 5)
    assert third.bytes == len(b"a new graph")


def test_pull_restores_every_entry_byte_for_byte(
    inductor_dir: Path, target: str, tmp_path: Path
) -> None:
    push(target, compiler=inductor_cache(inductor_dir))
    fresh = tmp_path / "fresh"
    report = pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED)
    assert report.error is None and not report.skipped
    assert (report.entries, report.unverified) == (5, 0)
    original = entries_of(inductor_dir)
    assert entries_of(fresh) == {p: original[p] for p in INDUCTOR_ENTRIES}
    # a second pull finds everything in place and moves nothing
    again = pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED)
    assert (again.entries, again.present) == (0, 5)


def test_corrupt_and_truncated_entries_are_skipped_reported_and_never_loaded(
    inductor_dir: Path, target: str, tmp_path: Path
) -> None:
    push(target, compiler=inductor_cache(inductor_dir))
    fs, root = fsspec.core.url_to_fs(f"{target}/{PREFIX}")
    names = {p.rpartition("@")[0][len(root) + 1 :]: p for p in fs.find(root)}
    graph = names["fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy"]
    kernel = names["3g/c3g2mqobe6g24e353lemr6cp.so"]
    data = fs.cat_file(graph)
    fs.pipe_file(graph, data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    fs.pipe_file(kernel, fs.cat_file(kernel)[:1000])  # an upload cut short

    fresh = tmp_path / "fresh"
    report = pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED)
    reasons = {s.path.rpartition("@")[0]: s.reason for s in report.skipped}
    assert reasons.keys() == {
        "fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy",
        "3g/c3g2mqobe6g24e353lemr6cp.so",
    }
    assert "corrupt" in reasons["fxgraph/kn/fkn2btr2vnbnjr5wfq/xo7xmdndgb7o7ptcpgy"]
    assert "truncated" in reasons["3g/c3g2mqobe6g24e353lemr6cp.so"]
    assert report.entries == 3
    assert set(entries_of(fresh)) == INDUCTOR_ENTRIES - set(reasons)  # nothing half-written
    assert not list(fresh.rglob(".tmp*"))
    listing = list_target(target, compiler=inductor_cache(fresh))[0]
    assert len(listing.truncated) == 1  # visible without reading contents


def test_a_pull_falls_back_to_an_older_version_when_the_newest_is_corrupt(
    inductor_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    push(str(target), compiler=inductor_cache(inductor_dir))
    entry = "43/c43daxhgfnuvzfpo76ohnavy.py"
    good = next((target / PREFIX).glob(entry + "@*"))
    bad_bytes = b"# another compile\n"
    digest = hashlib.sha256(bad_bytes).hexdigest()
    newer = good.with_name(f"c43daxhgfnuvzfpo76ohnavy.py@{digest}-{len(bad_bytes)}")
    newer.write_bytes(b"# ANOTHER COMPILE\n")  # right size, wrong bytes, and the newest
    os.utime(good, (1_000_000, 1_000_000))

    fresh = tmp_path / "fresh"
    report = pull(str(target), compiler=inductor_cache(fresh))
    assert (fresh / entry).read_bytes() == good.read_bytes()
    assert [s.path for s in report.skipped] == [newer.relative_to(target / PREFIX).as_posix()]


def test_two_pushers_of_the_same_entries_at_once_leave_one_valid_entry_each(
    inductor_dir: Path, target: str, tmp_path: Path
) -> None:
    start = threading.Barrier(2)
    reports = []

    def pusher() -> None:
        start.wait()
        reports.append(push(target, compiler=inductor_cache(inductor_dir)))

    threads = [threading.Thread(target=pusher) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.error is None for r in reports)
    assert sum(r.entries for r in reports) >= 5  # both may send: content addressing makes it safe
    objects = stored(f"{target}/{PREFIX}")
    assert len(objects) == 5  # one object per entry
    fresh = tmp_path / "fresh"
    assert pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED).skipped == []
    assert set(entries_of(fresh)) == INDUCTOR_ENTRIES


def test_pushers_that_compiled_different_bytes_leave_two_valid_versions_and_prune_keeps_one(
    tmp_path: Path, target: str
) -> None:
    key = "ab/cd/abcd" + "9" * 28 + ".neff"
    first, second = tmp_path / "one", tmp_path / "two"
    write(first, key, b"neff from machine one")
    write(second, key, b"neff from machine two, longer")
    push(target, compiler=neff_cache(first))
    push(target, compiler=neff_cache(second))  # present already: not sent again
    assert len(stored(f"{target}/neuronxcc-2.28.7631.0")) == 1
    # two pushers that listed before either wrote, as in a race: both versions are stored
    fs, root = fsspec.core.url_to_fs(f"{target}/neuronxcc-2.28.7631.0")
    data = b"neff from machine two, longer"
    fs.pipe_file(f"{root}/{key}@{hashlib.sha256(data).hexdigest()}-{len(data)}", data)
    listing = list_target(target, compiler=neff_cache(tmp_path / "x"))[0]
    assert (listing.entries, listing.versions) == (1, 2)
    pulled = pull(target, compiler=neff_cache(tmp_path / "three"))
    assert pulled.entries == 1 and not pulled.skipped
    assert (tmp_path / "three" / key).read_bytes() in {b"neff from machine one", data}

    later = datetime.now(UTC) + timedelta(days=1)
    pruned = prune(target, compiler=neff_cache(tmp_path / "x"), now=lambda: later)
    assert [r.reason for r in pruned.removed] == ["superseded by a newer version of the same entry"]
    assert len(stored(f"{target}/neuronxcc-2.28.7631.0")) == 1


def test_a_kernel_being_compiled_or_cut_short_is_not_pushed(
    inductor_dir: Path, target: str
) -> None:
    partial = shared_object(inductor_dir / "9q" / "c9qpartial.so")
    partial.write_bytes(partial.read_bytes()[:2000])  # the linker was killed
    busy = shared_object(inductor_dir / "7x" / "c7xbusy.main.so")
    lock = write(inductor_dir, "locks/c7xbusy.lock", b"")
    with lock.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a compiler is still writing it
        report = push(target, compiler=inductor_cache(inductor_dir))
    reasons = {s.path: s.reason for s in report.skipped}
    assert "truncated ELF" in reasons["9q/c9qpartial.so"]
    assert "being compiled" in reasons["7x/c7xbusy.main.so"]
    assert report.entries == 5
    # once the compiler is done, the next push takes it
    assert push(target, compiler=inductor_cache(inductor_dir)).entries == 1
    assert busy.exists()


def test_plain_mirror_entries_are_pulled_as_unverified(tmp_path: Path) -> None:
    """A mirror made by `hf buckets sync` (the public NEFF bucket's layout) can be pulled."""
    mirror = tmp_path / "mirror" / "neuronxcc-2.28.7631.0"
    key = "3f/a2/3fa2" + "0" * 28 + ".neff"
    write(mirror, key, b"a neff")
    write(mirror, "3f/a2/.tmp.abc123", b"half")
    write(mirror, "README.md", b"not an entry")
    local = tmp_path / "neff"
    report = pull(str(tmp_path / "mirror"), compiler=neff_cache(local))
    assert (report.entries, report.unverified) == (1, 1)
    assert entries_of(local) == {key: b"a neff"}


def test_a_zero_size_miss_marker_is_replaced_by_the_pulled_entry(
    neff_dir: Path, tmp_path: Path
) -> None:
    miss = "c0/ff/c0ff" + "2" * 28 + ".neff"
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere, miss, b"compiled elsewhere")
    push(str(tmp_path / "target"), compiler=neff_cache(elsewhere))
    report = pull(str(tmp_path / "target"), compiler=neff_cache(neff_dir))
    assert report.entries == 1
    assert (neff_dir / miss).read_bytes() == b"compiled elsewhere"


def test_another_compilers_prefix_is_refused_for_pull_and_push(
    inductor_dir: Path, tmp_path: Path
) -> None:
    other = str(tmp_path / "target" / "inductor-torch-2.12.0")
    for operation in (pull, push):
        with pytest.raises(CompilerMismatch, match=r"torch \(inductor\) 2\.12\.0.*2\.13\.0\+cpu"):
            operation(other, compiler=inductor_cache(inductor_dir))
    assert not (tmp_path / "target").exists()
    # the installed compiler's own prefix, spelled out, is the same target as its root
    same = str(tmp_path / "target" / PREFIX)
    assert push(same, compiler=inductor_cache(inductor_dir)).entries == 5
    assert sorted(os.listdir(tmp_path / "target")) == [PREFIX]


def test_an_installed_compiler_with_a_build_hash_finds_the_public_prefix(tmp_path: Path) -> None:
    """pip reports neuronx-cc with a build hash (2.20.2831.0+8bfecb25); a target written for its
    public version, as the docs and CRD examples spell it, is the same compiler's cache."""
    mirror = tmp_path / "mirror" / "neuronxcc-2.24.8799.0"
    key = "3f/a2/3fa2" + "0" * 28 + ".neff"
    write(mirror, key, b"a neff")
    # a folder spelled as Neuron's own caches spell it, with the build hash
    legacy = tmp_path / "legacy" / "neuronxcc-2.24.8799.0+6f62ff7c"
    old_key = "b7/01/b701" + "1" * 28 + ".neff"
    write(legacy, old_key, b"an older neff")
    version = "2.24.8799.0+6f62ff7c"
    assert neff_cache(tmp_path, version=version).prefix == "neuronxcc-2.24.8799.0"
    expected = {
        "mirror": {key: b"a neff"},
        "mirror/neuronxcc-2.24.8799.0": {key: b"a neff"},
        "legacy/neuronxcc-2.24.8799.0+6f62ff7c": {old_key: b"an older neff"},
    }
    for n, (named, entries) in enumerate(expected.items()):
        installed = neff_cache(tmp_path / f"neff{n}", version=version)
        assert pull(str(tmp_path / named), compiler=installed).entries == 1
        assert entries_of(tmp_path / f"neff{n}") == entries
    installed = neff_cache(tmp_path / "neff", version=version)
    with pytest.raises(CompilerMismatch, match=r"neuronx-cc 2\.24\.8799\.1"):
        pull(str(tmp_path / "mirror" / "neuronxcc-2.24.8799.1"), compiler=installed)


def test_a_root_holding_the_build_hash_spelling_is_found_and_the_prefix_recorded(
    tmp_path: Path,
) -> None:
    """A cache root given without a prefix (as the docs and CRD examples give it) whose entries
    sit under neuronx-cc's +hash spelling is the installed compiler's cache: pulled, and the
    report (and so the row) says which spelling was used and that it matched."""
    version = "2.24.8799.0+6f62ff7c"
    key = "b7/01/b701" + "1" * 28 + ".neff"
    write(tmp_path / "root" / f"neuronxcc-{version}", key, b"a neff")
    report = pull(str(tmp_path / "root"), compiler=neff_cache(tmp_path / "neff", version=version))
    assert (report.entries, report.prefix, report.prefix_matched) == (
        1,
        f"neuronxcc-{version}",
        True,
    )
    assert entries_of(tmp_path / "neff") == {key: b"a neff"}
    figures = report.figures()
    assert figures.prefix_matched is True


def test_a_pull_that_finds_nothing_for_the_installed_compiler_says_it_compiles_cold(
    tmp_path: Path,
) -> None:
    """Another compiler's entries in the root are never pulled; the report says none matched
    (the row's compile_cache_prefix_matched is false) and which prefixes the root holds."""
    write(tmp_path / "root" / "neuronxcc-2.24.8799.0", "3f/a2/3fa2" + "0" * 28 + ".neff", b"x")
    installed = neff_cache(tmp_path / "neff", version="2.28.7631.0")
    report = pull(str(tmp_path / "root"), compiler=installed)
    assert report.error is None and report.entries == 0
    assert (report.prefix, report.prefix_matched) == ("neuronxcc-2.28.7631.0", False)
    assert report.other_prefixes == ["neuronxcc-2.24.8799.0"]
    assert "NO ENTRIES under neuronxcc-2.28.7631.0: every graph compiles cold" in report.summary()
    assert "neuronxcc-2.24.8799.0" in report.summary()
    assert report.figures().prefix_matched is False


def test_a_pull_says_which_local_folder_it_filled_and_which_variable_chose_it(
    tmp_path: Path,
) -> None:
    """The runner image reads /var/cache/neff (TORCH_NEURONX_NEFF_CACHE_DIR), not TorchNeuron's
    default /tmp/neff_cache: a person syncing by hand must see where entries went."""
    mirror = tmp_path / "mirror" / "neuronxcc-2.28.7631.0"
    write(mirror, "3f/a2/3fa2" + "0" * 28 + ".neff", b"a neff")
    report = pull(str(tmp_path / "mirror"), compiler=neff_cache(tmp_path / "var-cache-neff"))
    line = report.summary()
    assert f"into {tmp_path / 'var-cache-neff'} (TORCH_NEURONX_NEFF_CACHE_DIR)" in line, line


def test_the_prefix_and_folder_come_from_the_installed_stack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    compiler = installed_compiler_cache("cpu")
    assert compiler.prefix == f"inductor-torch-{torch.__version__}"
    assert compiler.local_dir == tmp_path / "ind"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert installed_compiler_cache("cpu").local_dir == Path(default_cache_dir())


def test_paths_a_target_offers_are_checked_before_anything_is_written() -> None:
    assert is_entry_path("neff", "3f/a2/3fa2" + "0" * 28 + ".neff")
    for bad in (
        "../3f/a2/3fa2" + "0" * 28 + ".neff",
        "3f/a3/3fa2" + "0" * 28 + ".neff",  # folder does not match the key
        "3f/a2/3fa2.neff",
        "/etc/passwd",
    ):
        assert not is_entry_path("neff", bad)
    assert is_entry_path("inductor", "fxgraph/kn/fkn2/xo7x")
    for bad in (
        "locks/x.lock",
        "3g/.1.2.tmp",
        "../../home/x.py",
        "3g/c3g.o",
        "toplevel.py",
        "a//b",
    ):
        assert not is_entry_path("inductor", bad)


def test_pull_and_push_for_a_run_record_an_unreachable_target_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch, inductor_dir: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    try:
        for operation in (pull_for_run, push_for_run):
            report = operation("s3://nowhere/cache", backend="cpu")
            assert report.error is not None and report.error.startswith("target-unavailable: ")
            assert "s3://nowhere/cache" in report.error
            assert report.entries == 0
            assert report.figures().error == report.error
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_prune_removes_truncated_and_expired_entries_but_not_a_push_in_progress(
    inductor_dir: Path, target: str
) -> None:
    compiler = inductor_cache(inductor_dir)
    push(target, compiler=compiler)
    fs, root = fsspec.core.url_to_fs(f"{target}/{PREFIX}")
    victim = next(p for p in fs.find(root) if ".py@" in p)
    fs.pipe_file(victim, b"short")
    fresh = prune(target, compiler=compiler)  # just written: may be a push in progress
    assert fresh.removed == []
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    dry = prune(target, compiler=compiler, now=lambda: tomorrow, dry_run=True)
    assert [r.reason for r in dry.removed] == ["truncated or empty"]
    assert len(stored(f"{target}/{PREFIX}")) == 5
    done = prune(target, compiler=compiler, now=lambda: tomorrow)
    assert len(done.removed) == 1 and len(stored(f"{target}/{PREFIX}")) == 4
    expired = prune(target, compiler=compiler, now=lambda: tomorrow, older_than=timedelta(hours=2))
    assert len(expired.removed) == 4 and stored(f"{target}/{PREFIX}") == {}


@pytest.mark.parametrize("verify", [False, True], ids=["listing", "verify"])
def test_prune_never_lets_a_newer_corrupt_version_cost_a_valid_one(
    tmp_path: Path, verify: bool
) -> None:
    """A corrupt version (bytes that do not match the hash its name declares) stored after a
    valid one: only verified bytes make older versions superfluous, so the valid one stays,
    and the corrupt one goes once it is too old to be a push in progress."""
    target, key = str(tmp_path / "target"), "ab/cd/abcd" + "7" * 28 + ".neff"
    good = b"the neff the compiler wrote"
    write(tmp_path / "built", key, good)
    push(target, compiler=neff_cache(tmp_path / "built"))
    prefix = Path(target) / "neuronxcc-2.28.7631.0"
    (valid,) = prefix.rglob("*.neff@*")
    claimed = hashlib.sha256(b"another neff of equal size!").hexdigest()
    corrupt = valid.with_name(f"{key.rpartition('/')[2]}@{claimed}-{len(good)}")
    corrupt.write_bytes(b"X" * len(good))
    now = datetime.now(UTC)
    for path, age in ((valid, timedelta(days=2)), (corrupt, timedelta(minutes=5))):
        os.utime(path, ((now - age).timestamp(),) * 2)
    compiler = neff_cache(tmp_path / "x")

    young = prune(target, compiler=compiler, verify=verify, now=lambda: now)
    assert young.removed == [] and young.kept == 2  # the newer one may be a push in progress

    later = now + timedelta(days=1)
    settled = prune(target, compiler=compiler, verify=verify, now=lambda: later)
    assert [(r.path, r.reason) for r in settled.removed] == [
        (corrupt.relative_to(prefix).as_posix(), "corrupt: bytes do not match its hash")
    ]
    assert sorted(p.name for p in prefix.rglob("*.neff@*")) == [valid.name]
    pulled = pull(target, compiler=neff_cache(tmp_path / "fresh"))
    assert pulled.entries == 1 and (tmp_path / "fresh" / key).read_bytes() == good


def test_a_full_local_disk_is_the_pulls_error_and_blames_the_disk(
    inductor_dir: Path, tmp_path: Path
) -> None:
    """A write that the local disk refuses (here: over the process's file size limit, which
    fails a write the way a full disk does) ends the pull with an error that names this
    machine's disk, not the target; what was placed is whole."""
    import resource
    import signal

    target = str(tmp_path / "target")
    push(target, compiler=inductor_cache(inductor_dir))
    fresh = tmp_path / "fresh"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, limits[1]))
    try:
        report = pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED, threads=1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert report.error is not None and report.error.startswith("local-disk: "), report.error
    assert "file size limit" in report.error and "not the target" in report.error
    original = entries_of(inductor_dir)
    placed = entries_of(fresh)
    assert report.entries == len(placed) < len(INDUCTOR_ENTRIES)
    assert all(original[path] == data for path, data in placed.items())
    assert not [p for p in fresh.rglob("*") if p.name.startswith(".")]  # no temporary left


def test_a_name_that_is_both_a_file_and_a_folder_is_skipped_and_says_whose_fault(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target" / PREFIX
    for path, data in {"fxgraph/zz/fzz/x": b"a file", "fxgraph/zz/fzz/x/y": b"under it"}.items():
        write(target, f"{path}@{hashlib.sha256(data).hexdigest()}-{len(data)}", data)
    fresh = tmp_path / "fresh"
    write(fresh, "aotautograd/in/the/way", b"a local file")  # where the target has a folder
    data = b"an entry under a local file"
    write(target, f"aotautograd/in/the/way/z@{hashlib.sha256(data).hexdigest()}-{len(data)}", data)
    report = pull(str(tmp_path / "target"), compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED)
    assert report.error is None and report.entries == 1
    reasons = {s.path.partition("@")[0]: s.reason for s in report.skipped}
    assert reasons.pop("aotautograd/in/the/way/z").startswith("local disk: ")
    # Fetched concurrently: whichever of the two came first is placed, the other says why not.
    ((skipped, reason),) = reasons.items()
    placed = ({"fxgraph/zz/fzz/x", "fxgraph/zz/fzz/x/y"} - {skipped}).pop()
    assert (fresh / placed).read_bytes() in {b"a file", b"under it"}
    assert reason.startswith("target: it names both ") and "a file and a folder" in reason


def test_an_object_time_that_is_no_date_is_an_unknown_time(inductor_dir: Path) -> None:
    """A file system that keeps 64-bit times (tmpfs) holds an mtime past year 9999: listing,
    pulling and pruning the target still work, the object's time being unknown."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    assert shm.is_dir(), "this test needs a tmpfs at /dev/shm (64-bit file times)"
    root = Path(tempfile.mkdtemp(dir=shm))
    try:
        target = str(root / "target")
        push(target, compiler=inductor_cache(inductor_dir))
        far = next((root / "target" / PREFIX).rglob("*.py@*"))
        os.utime(far, (1e13, 1e13))
        assert far.stat().st_mtime == 1e13  # year 318857: no datetime
        assert list_target(target, compiler=inductor_cache(inductor_dir))[0].entries == 5
        fresh = root / "fresh"
        pulled = pull(target, compiler=inductor_cache(fresh), policy=WRITERS_TRUSTED)
        assert (pulled.error, pulled.entries) == (None, 5)
        pruned = prune(target, compiler=inductor_cache(fresh), verify=True)
        assert (pruned.removed, pruned.kept) == ([], 5)
    finally:
        shutil.rmtree(root)


def test_a_pull_adds_no_more_than_its_byte_budget(neff_dir: Path, tmp_path: Path) -> None:
    """Entries past the budget (a volume's limit) are skipped as the local disk's limit; what
    fits is placed whole; with no limit given, the disk's free space bounds the pull."""
    target = str(tmp_path / "target")
    push(target, compiler=neff_cache(neff_dir))  # two entries: 4096 and 10,000 bytes
    fresh = tmp_path / "fresh"
    report = pull(target, compiler=neff_cache(fresh), max_bytes=5000)
    assert (report.error, report.entries, report.bytes) == (None, 1, 4096)
    (over,) = report.skipped
    assert over.path.startswith("b7/01/b701") and over.reason.startswith(
        "local disk: over the pull's byte budget (5000 bytes"
    )
    assert sum(p.stat().st_size for p in fresh.rglob("*") if p.is_file()) == 4096
    rest = pull(target, compiler=neff_cache(fresh))
    assert (rest.error, rest.entries, rest.present, rest.skipped) == (None, 1, 1, [])


def test_a_missing_bucket_is_an_error_but_a_missing_folder_is_an_empty_cache(
    s3_target: str, inductor_dir: Path, tmp_path: Path
) -> None:
    from model_support.compile_cache import TargetUnavailable

    with pytest.raises(TargetUnavailable, match="bucket that does not exist"):
        pull(
            "s3://no-such-bucket-here/cache",
            compiler=inductor_cache(inductor_dir),
            policy=WRITERS_TRUSTED,
        )
    empty = pull(
        f"{s3_target}/not-pushed-yet",
        compiler=inductor_cache(tmp_path / "fresh"),
        policy=WRITERS_TRUSTED,
    )
    assert (empty.entries, empty.error) == (0, None)


def test_a_transfer_past_its_deadline_is_given_up_and_recorded(tmp_path: Path) -> None:
    from model_support.compile_cache import TransferReport, guarded, transfers_left_behind

    answered = threading.Event()

    def hangs() -> TransferReport:
        answered.wait(3)  # a store that does not answer (the Hub's clients retry for minutes)
        raise AssertionError("the caller stopped waiting long before")

    started = time.monotonic()
    report = guarded(hangs, "push", "s3://slow/cache", inductor_cache(tmp_path), deadline_s=0.2)
    assert time.monotonic() - started < 2
    assert report.error is not None and report.error.startswith("deadline: the push did not finish")
    assert report.prefix == PREFIX
    assert transfers_left_behind() == ["compile-cache-push"]
    # Let it end: a command that finds a transfer left behind exits at once (later tests
    # run the command line in this process).
    answered.set()
    wait_until(
        lambda: transfers_left_behind() == [], "the transfer left behind to end", 5, interval=0.01
    )


def test_the_figures_beside_a_result_name_where_the_run_pushed(
    inductor_dir: Path, tmp_path: Path
) -> None:
    """Pulled from a read-only source, pushed to the team's target: the record points at the
    target, which now holds every entry the run used; the result itself is untouched."""
    from model_support.compile_cache import attach
    from model_support.records import ResultDocument
    from model_support.vocabulary import Result

    source, team = str(tmp_path / "public"), str(tmp_path / "team")
    push(source, compiler=inductor_cache(inductor_dir))
    local = inductor_cache(tmp_path / "machine")
    pulled = pull(source, compiler=local, policy=WRITERS_TRUSTED)
    pushed = push(team, compiler=local)
    document = ResultDocument(model="org/m", task="text-generation", result=Result.PASS)
    recorded = attach(document, pulled, pushed)
    assert recorded.result == Result.PASS and document.compile_cache is None
    figures = recorded.compile_cache
    assert figures is not None and (figures.target, figures.prefix) == (team, PREFIX)
    assert figures.pull is not None and figures.push is not None
    assert figures.pull.entries == figures.push.entries == 5
    assert stored(f"{team}/{PREFIX}").keys() == stored(f"{source}/{PREFIX}").keys()
