"""A shared compile cache is not a way in: readers take what a trusted pusher signed.

An attacker who can write to a target pushes a crafted entry (here: a pickle that would create
a file when loaded). A reader that trusts a key takes only what a manifest signed by that key
lists; without keys, host-side (inductor) entries are taken only from a folder only the reader
can write, or when the reader says it trusts the target's writers.
"""

from __future__ import annotations

import json
import os
import pickle
import uuid
from pathlib import Path

import pytest
from cache_support import inductor_cache, neff_cache, write
from typer.testing import CliRunner

from model_support.cli import app
from model_support.compile_cache import (
    SigningKey,
    TargetUnavailable,
    TransferReport,
    TrustPolicy,
    UntrustedCache,
    guarded,
    pull,
    push,
)
from model_support.compile_cache.target import object_name
from model_support.compile_cache.transfer import sha256_file
from model_support.compile_cache.trust import TRUSTED_KEYS_ENV, UNVOUCHED_LEDGER

PREFIX = "inductor-torch-2.13.0+cpu"
POISON = "fxgraph/aa/faaaaaaaaaaaaaaaaaaaaa/poisoned"


class _Plant:
    """What a crafted pickle does when a victim loads it: create a file of its choosing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (os.makedirs, (self.path, 0o755))


def plant_poison(target: str, tmp_path: Path) -> Path:
    """The attacker's push: a crafted entry with a valid name (its own hash), no signature."""
    crafted = tmp_path / "attacker" / POISON
    write(tmp_path / "attacker", POISON, pickle.dumps(_Plant(str(tmp_path / "pwned"))))
    push(target, compiler=inductor_cache(tmp_path / "attacker"))
    assert crafted.is_file()
    return crafted


@pytest.fixture(params=["s3", "group-writable folder"])
def shared_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A target others can write: a bucket, or a folder shared with a group."""
    if request.param == "s3":
        return str(request.getfixturevalue("s3_target"))
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o775)
    return str(folder)


def load_the_poison_if_taken(root: Path) -> None:
    """What inductor does with an FX graph entry it finds in its cache: unpickle it."""
    if (root / POISON).is_file():
        pickle.loads((root / POISON).read_bytes())  # the point of the test


def test_an_unsigned_host_side_entry_from_a_shared_target_is_never_taken(
    shared_target: str, tmp_path: Path, inductor_dir: Path
) -> None:
    plant_poison(shared_target, tmp_path)
    victim = tmp_path / "victim"
    report = pull(shared_target, compiler=inductor_cache(victim), policy=TrustPolicy())
    assert report.entries == 0 and not victim.joinpath("fxgraph").exists()
    assert any("unsigned" in s.reason or "signature" in s.reason for s in report.skipped)
    load_the_poison_if_taken(victim)
    assert not (tmp_path / "pwned").exists()


def test_entries_signed_by_a_trusted_key_are_taken_and_nothing_else(
    shared_target: str, tmp_path: Path, inductor_dir: Path
) -> None:
    key = SigningKey.generate()
    pushed = push(shared_target, compiler=inductor_cache(inductor_dir), signing_key=key)
    assert pushed.error is None and pushed.entries == 5
    plant_poison(shared_target, tmp_path)  # written after, by someone without the key
    victim = tmp_path / "victim"
    policy = TrustPolicy((key.public_key(),))
    report = pull(shared_target, compiler=inductor_cache(victim), policy=policy)
    assert report.entries == 5 and report.error is None
    assert not (victim / POISON).exists()
    assert [s.reason for s in report.skipped] == [
        "unsigned: no manifest signed by a trusted key lists it"
    ]
    load_the_poison_if_taken(victim)
    assert not (tmp_path / "pwned").exists()
    # Another key's manifests are not this reader's: nothing is taken.
    other = TrustPolicy((SigningKey.generate().public_key(),))
    assert pull(shared_target, compiler=inductor_cache(tmp_path / "v2"), policy=other).entries == 0


def test_a_forged_or_misdirected_manifest_vouches_for_nothing(tmp_path: Path) -> None:
    trusted, attacker = SigningKey.generate(), SigningKey.generate()
    target = tmp_path / "target"
    crafted = plant_poison(str(target), tmp_path)
    name = object_name(POISON, sha256_file(crafted), crafted.stat().st_size)
    forged: list[bytes] = []
    # 1. the attacker's own signature, presented as the trusted key's
    _, data = attacker.sign_manifest(PREFIX, [name])
    document = json.loads(data)
    document["key"] = trusted.public_key()
    forged.append(json.dumps(document).encode())
    # 2. a trusted manifest whose body was edited to list the crafted entry
    _, data = trusted.sign_manifest(PREFIX, ["fxgraph/aa/other@" + "0" * 64 + "-1"])
    document = json.loads(data)
    document["body"] = document["body"].replace("fxgraph/aa/other@" + "0" * 64 + "-1", name)
    forged.append(json.dumps(document).encode())
    # 3. a real trusted manifest, for another compiler's prefix
    forged.append(trusted.sign_manifest("inductor-torch-2.12.0+cpu", [name])[1])
    for index, manifest in enumerate(forged):
        write(target / PREFIX, f"signatures/forged-{index}.json", manifest)
    report = pull(
        str(target),
        compiler=inductor_cache(tmp_path / "victim"),
        policy=TrustPolicy((trusted.public_key(),)),
    )
    assert report.entries == 0


def test_own_folders_and_explicit_trust_take_unsigned_entries(
    tmp_path: Path, inductor_dir: Path, s3_target: str
) -> None:
    mine = tmp_path / "mine"
    push(str(mine), compiler=inductor_cache(inductor_dir))
    assert (
        pull(str(mine), compiler=inductor_cache(tmp_path / "a"), policy=TrustPolicy()).entries == 5
    )
    push(s3_target, compiler=inductor_cache(inductor_dir))
    trusting = TrustPolicy(trust_unsigned=True)
    assert pull(s3_target, compiler=inductor_cache(tmp_path / "b"), policy=trusting).entries == 5


def test_neff_entries_need_a_signature_only_when_keys_are_given(
    s3_target: str, tmp_path: Path, neff_dir: Path
) -> None:
    push(s3_target, compiler=neff_cache(neff_dir))
    unsigned = pull(s3_target, compiler=neff_cache(tmp_path / "a"), policy=TrustPolicy())
    assert unsigned.entries == 2  # the public NEFF cache is an unsigned mirror
    keyed = TrustPolicy((SigningKey.generate().public_key(),))
    assert pull(s3_target, compiler=neff_cache(tmp_path / "b"), policy=keyed).entries == 0


def test_a_malformed_key_is_refused_before_anything_moves() -> None:
    with pytest.raises(UntrustedCache, match="ed25519:<base64>"):
        TrustPolicy(("not-a-key",))
    with pytest.raises(UntrustedCache, match="32 bytes"):
        TrustPolicy(("ed25519:AAAA",))


def test_the_cli_signs_with_keygen_keys_and_pulls_only_what_they_signed(
    tmp_path: Path, inductor_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    key_file = tmp_path / "signing.pem"
    made = runner.invoke(app, ["cache", "keygen", str(key_file)])
    assert made.exit_code == 0, made.output
    public = made.stdout.strip()
    assert public.startswith("ed25519:") and oct(key_file.stat().st_mode & 0o777) == "0o600"
    again = runner.invoke(app, ["cache", "keygen", str(key_file)])
    assert again.exit_code == 2 and "never overwritten" in again.output

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    shared.chmod(0o775)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    pushed = runner.invoke(
        app, ["cache", "push", str(shared), "--backend", "cpu", "--signing-key", str(key_file)]
    )
    assert pushed.exit_code == 0, pushed.output
    plant_poison(str(shared), tmp_path)

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "victim"))
    refused = runner.invoke(app, ["cache", "pull", str(shared), "--backend", "cpu", "--json"])
    assert refused.exit_code == 0 and json.loads(refused.stdout)["entries"] == 0
    monkeypatch.setenv(TRUSTED_KEYS_ENV, public)
    pulled = runner.invoke(app, ["cache", "pull", str(shared), "--backend", "cpu", "--json"])
    assert pulled.exit_code == 0, pulled.output
    assert json.loads(pulled.stdout)["entries"] == 5
    assert not (tmp_path / "victim" / POISON).exists()


def test_run_never_pushes_what_unreviewed_code_compiled(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    result = CliRunner().invoke(
        app,
        [
            "run", str(tiny_llama_path), "--backend", "cpu", "--trust-remote-code",
            "--compile-cache", str(tmp_path / "cache"), "--results", str(tmp_path / "r"),
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--trust-remote-code runs code nobody reviewed" in " ".join(result.output.split())
    assert not (tmp_path / "cache").exists() and not (tmp_path / "r").exists()


# ---- local and PVC targets never follow links ----------------------------------------------


def _pull_report(target: str, local: Path) -> TransferReport:
    """A pull as a test's init step makes it: a failure is the report's error."""
    compiler = inductor_cache(local)
    return guarded(
        lambda: pull(target, compiler=compiler, policy=TrustPolicy(trust_unsigned=True)),
        "pull",
        target,
        compiler,
    )


def test_a_symlinked_prefix_pulls_nothing_from_where_it_points(
    tmp_path: Path, inductor_dir: Path
) -> None:
    secrets = tmp_path / "home" / ".ssh"
    write(secrets, "keys/id_ed25519", b"-----BEGIN OPENSSH PRIVATE KEY-----")
    target = tmp_path / "shared"
    target.mkdir()
    (target / PREFIX).symlink_to(secrets)
    victim = tmp_path / "victim"
    report = _pull_report(str(target), victim)
    assert report.entries == 0 and "symbolic link" in (report.error or "")
    assert not any(victim.rglob("id_ed25519")) and not any(inductor_dir.rglob("id_ed25519"))
    # A push never writes through it either.
    with pytest.raises(TargetUnavailable, match="symbolic link"):
        push(str(target), compiler=inductor_cache(inductor_dir))
    assert not (secrets / "fxgraph").exists()


def test_a_symlinked_entry_inside_a_target_is_never_an_object(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    write(tmp_path / "secret", "id", b"private")
    name = "fxgraph/aa/faaaaaaaaaaaaaaaaaaaaa/entry"
    link = target / PREFIX / name
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "secret" / "id")
    victim = tmp_path / "victim"
    report = pull(
        str(target), compiler=inductor_cache(victim), policy=TrustPolicy(trust_unsigned=True)
    )
    assert report.entries == 0 and not (victim / name).exists()


def test_a_fifo_for_a_lock_file_does_not_hang_a_push(tmp_path: Path) -> None:
    from cache_support import shared_object

    local = tmp_path / "inductor"
    shared_object(local / "3g" / "c3g2mqobe6g24e353lemr6cp.so")
    (local / "locks").mkdir()
    os.mkfifo(local / "locks" / "c3g2mqobe6g24e353lemr6cp.lock")
    report = push(str(tmp_path / "target"), compiler=inductor_cache(local))  # used to hang here
    assert report.error is None and report.entries == 0
    assert [s.reason for s in report.skipped] == ["being compiled (its lock is held)"]


def test_a_plain_file_is_not_a_cache_target(tmp_path: Path) -> None:
    file = tmp_path / "cache"
    file.write_text("not a folder")
    result = CliRunner().invoke(app, ["cache", "pull", str(file), "--backend", "cpu"])
    assert result.exit_code == 2
    assert "is a file, not a folder" in " ".join(result.output.split())


# ---- a private folder is private all the way down; a signature is not laundered -----------


def test_a_world_writable_folder_below_a_private_root_is_not_the_readers_own(
    tmp_path: Path, inductor_dir: Path
) -> None:
    """The root and its parents are this user's alone, but a prefix folder below it is
    world-writable (or a file in it is someone else's): what lies there may have been planted."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    push(str(mine), compiler=inductor_cache(inductor_dir))
    open_folder = mine / PREFIX / "fxgraph" / "aa"
    open_folder.mkdir(parents=True)
    open_folder.chmod(0o777)  # anyone may add a file here
    plant_poison(str(mine), tmp_path)
    victim = tmp_path / "victim"
    report = pull(str(mine), compiler=inductor_cache(victim), policy=TrustPolicy())
    assert report.entries == 5 and not (victim / POISON).exists()
    [refused] = [s for s in report.skipped if s.path.startswith(POISON)]
    assert "can be written by others (mode 777)" in refused.reason
    load_the_poison_if_taken(victim)
    assert not (tmp_path / "pwned").exists()

    # A file another user owns, in folders that are otherwise private, is theirs.
    open_folder.chmod(0o700)
    [planted] = (mine / PREFIX).glob(POISON + "@*")
    os.chown(planted, 4242, 4242)
    report = pull(str(mine), compiler=inductor_cache(tmp_path / "v2"), policy=TrustPolicy())
    assert not (tmp_path / "v2" / POISON).exists()
    assert any("belongs to uid 4242" in s.reason for s in report.skipped)


def _reader_takes(target: Path, key: SigningKey, tmp_path: Path, kind: str = "inductor") -> set:
    """What a reader holding ``key`` pulls from ``target``: the entries' paths."""
    local = tmp_path / f"reader-{uuid.uuid4().hex[:6]}"
    compiler = inductor_cache(local) if kind == "inductor" else neff_cache(local)
    pull(str(target), compiler=compiler, policy=TrustPolicy((key.public_key(),)))
    return {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()} - {
        UNVOUCHED_LEDGER
    }


def test_a_signing_push_never_vouches_for_what_its_pull_took_unsigned(
    tmp_path: Path, neff_dir: Path
) -> None:
    """NEFFs pulled unsigned (no keys: the public cache's rule) stay out of a signed push; a
    NEFF compiled here afterwards is signed."""
    key = SigningKey.generate()
    mirror, shared = tmp_path / "mirror", tmp_path / "shared"
    mirror.mkdir(mode=0o775)
    mirror.chmod(0o775)  # others can write it: its NEFFs are taken, on nobody's signature
    push(str(mirror), compiler=neff_cache(neff_dir))
    local = tmp_path / "pusher"
    pulled = pull(str(mirror), compiler=neff_cache(local), policy=TrustPolicy())
    assert pulled.entries == 2 and len(pulled.unvouched_names) == 2
    compiled = write(local, "d1/e5/d1e5" + "3" * 28 + ".neff", os.urandom(2048))  # this run's
    pushed = push(str(shared), compiler=neff_cache(local), signing_key=key)
    assert pushed.entries == 1 and pushed.error is None
    assert sum("pulled without a valid signature" in s.reason for s in pushed.skipped) == 2
    assert _reader_takes(shared, key, tmp_path, "neff") == {compiled.relative_to(local).as_posix()}


def test_a_pods_pull_report_keeps_unsigned_entries_out_of_its_signed_push(
    tmp_path: Path, neff_dir: Path
) -> None:
    """In a runner pod the pull's record beside the cache is within reach of run.py: the push
    also takes the names from the pull report the runner read before run.py started."""
    key = SigningKey.generate()
    mirror = tmp_path / "mirror"
    push(str(mirror), compiler=neff_cache(neff_dir))
    local = tmp_path / "pod-cache"
    mirror.chmod(0o775)
    report = pull(str(mirror), compiler=neff_cache(local), policy=TrustPolicy())
    (local / UNVOUCHED_LEDGER).unlink()  # what code in the pod may do
    shared = tmp_path / "shared"
    pushed = push(
        str(shared), compiler=neff_cache(local), signing_key=key, unvouched=report.unvouched_names
    )
    assert pushed.entries == 0 and _reader_takes(shared, key, tmp_path, "neff") == set()


def test_nothing_is_signed_beside_host_side_entries_pulled_unsigned(
    tmp_path: Path, inductor_dir: Path
) -> None:
    """An unsigned pickle pulled (--trust-unsigned) ran in the process that compiled the rest:
    a signing push vouches for none of it."""
    key = SigningKey.generate()
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)  # a folder its group shares
    plant_poison(str(team), tmp_path)
    local = tmp_path / "pusher"
    trusting = TrustPolicy(trust_unsigned=True)
    assert pull(str(team), compiler=inductor_cache(local), policy=trusting).entries == 1
    write(local, "fxgraph/kn/fkn2btr2vnbnjr5wfq/compiledhere", b"this run's graph")
    shared = tmp_path / "shared"
    pushed = push(str(shared), compiler=inductor_cache(local), signing_key=key)
    assert pushed.entries == 0
    assert all("pulled without a valid signature" in s.reason for s in pushed.skipped)
    assert _reader_takes(shared, key, tmp_path) == set()
    # A damaged record of what was pulled vouches for nothing either.
    (local / UNVOUCHED_LEDGER).write_text("{not json")
    pushed = push(str(tmp_path / "shared2"), compiler=inductor_cache(local), signing_key=key)
    assert (
        pushed.entries == 0 and "where each entry came from is unknown" in pushed.skipped[0].reason
    )


# ---- nonsense on the command line is refused with one line -----------------------------------


def test_pulling_from_a_folder_that_holds_no_compile_cache_is_refused() -> None:
    result = CliRunner().invoke(app, ["cache", "pull", "file:///etc", "--backend", "cpu"])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()  # one line: what is wrong, what to give
    assert "file:///etc is not a compile cache" in line and "no compiler folder" in line


def test_trusted_keys_and_trust_unsigned_together_are_refused(tmp_path: Path) -> None:
    key = SigningKey.generate().public_key()
    result = CliRunner().invoke(
        app,
        ["cache", "pull", str(tmp_path / "c"), "--backend", "cpu",
         "--trusted-key", key, "--trust-unsigned", "--keep-going"],
    )  # fmt: skip
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert "contradict each other" in line and "give one of them" in line
