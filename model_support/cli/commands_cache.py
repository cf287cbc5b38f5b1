"""`model-support cache pull|push|ls|prune`: the compile cache of the installed compiler.

The target is the cache's root (a local or PVC path, ``s3://bucket/prefix``,
``hf://buckets/<namespace>/<name>``); the compiler prefix under it (``neuronxcc-<version>`` or
``inductor-torch-<version>``) comes from the installed stack. A target that already ends in a
prefix is accepted when it is the installed compiler's, and refused otherwise.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from model_support.cli.common import console, fail
from model_support.printable import DataConsole
from model_support.vocabulary import Backend

if TYPE_CHECKING:  # imported where used: every command's start (`run` included) would pay for it
    from model_support.compile_cache import SigningKey, TrustPolicy
    from model_support.compile_cache.transfer import TransferReport

cache_app = typer.Typer(
    name="cache",
    help="Pull, push, list and prune the compile cache (NEFF on Trainium, inductor elsewhere).",
    no_args_is_help=True,
)

TargetArg = Annotated[
    str,
    typer.Argument(
        help="Cache root: a path, s3://bucket/prefix or hf://buckets/NS/NAME "
        "(the compiler prefix is added from the installed stack)."
    ),
]
BackendOpt = Annotated[
    Backend,
    typer.Option(
        help="Whose cache: auto = neuron where torch-neuronx is installed, else inductor."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")]
ReportOpt = Annotated[
    Path | None, typer.Option("--report", help="Also write the report (JSON) to this file.")
]
KeepGoingOpt = Annotated[
    bool,
    typer.Option(
        "--keep-going",
        help="A failed transfer is written to the report and exits 0 (a pod's init step: the "
        "test then runs without the cache, and the failure is recorded with its result).",
    ),
]
TrustedKeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-key",
        help="Take only entries a manifest signed by this key lists (ed25519:<base64>, as "
        "`cache keygen` prints it; repeatable; also MODEL_SUPPORT_CACHE_TRUSTED_KEYS).",
    ),
]
TrustUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--trust-unsigned",
        help="Trust everyone who can write the target: pull host-side (inductor) entries "
        "without a signature. Whoever can push there can then run code here.",
    ),
]
SharedUserOpt = Annotated[
    bool,
    typer.Option(
        "--shared-user",
        help="This user is shared with code others control (runner pods of every namespace "
        "run as one uid): a folder only this user can write is not taken as its own.",
    ),
]
SigningKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--signing-key",
        help="Sign what is pushed with this Ed25519 key (PEM; also "
        "MODEL_SUPPORT_CACHE_SIGNING_KEY): readers that trust its public key take the entries.",
    ),
]
DeadlineOpt = Annotated[
    float | None,
    typer.Option(
        "--deadline",
        min=1,
        help="Give the transfer up after this many seconds (a stalled store's clients retry for "
        "minutes): an error in the report, like any other failure.",
    ),
]


@dataclass(frozen=True)
class Trust:
    """What a transfer trusts (pull) or vouches for (push), from the command line."""

    trusted_keys: tuple[str, ...] = ()
    trust_unsigned: bool = False
    signing_key: Path | None = None
    shared_user: bool = False


def _trust_objects(trust: Trust) -> tuple[TrustPolicy, SigningKey | None]:
    """The policy and key of ``trust``; a malformed key is the user's to fix (exit 2)."""
    from model_support.compile_cache import SigningKey, TrustPolicy, UntrustedCache
    from model_support.compile_cache.trust import SIGNING_KEY_ENV

    try:
        policy = TrustPolicy.from_env(
            trust.trust_unsigned, trust.trusted_keys, own_folders=not trust.shared_user
        )
        path = trust.signing_key or os.environ.get(SIGNING_KEY_ENV) or None
        key = SigningKey.load(path) if path else None
    except UntrustedCache as exc:
        raise fail(str(exc), 2) from exc
    return policy, key


def _transfer(
    direction: str,
    target: str,
    backend: Backend,
    as_json: bool,
    report_file: Path | None,
    keep_going: bool,
    deadline: float | None,
    trust: Trust = Trust(),
    max_bytes: int | None = None,
) -> None:
    from model_support.compile_cache import (
        CompileCacheError,
        LocalCacheError,
        TargetUnavailable,
        check_target,
        exit_now_if_left_behind,
        guarded,
        installed_compiler_cache,
        pull,
        pull_for_run,
        push,
        push_for_run,
    )

    if deadline is not None and not math.isfinite(deadline):
        raise fail(f"--deadline {deadline:g}: give a finite number of seconds (or none)", 2)
    if report_file is not None and (report_file.is_dir() or not report_file.name):
        raise fail(f"--report {report_file}: that is a folder; give a file to write", 2)
    policy, signing_key = _trust_objects(trust)
    if keep_going:
        # A pod's init step: whatever goes wrong (the store, the URI, a disabled or mismatched
        # compiler cache) is the report's error, and the test runs without the cache.
        if direction == "pull":
            report = pull_for_run(
                target, backend.value, deadline_s=deadline, policy=policy, max_bytes=max_bytes
            )
        else:
            report = push_for_run(
                target, backend.value, deadline_s=deadline, signing_key=signing_key
            )
    else:
        try:
            check_target(target, backend.value)  # a wrong URI or prefix: exit 2, nothing read
            compiler = installed_compiler_cache(backend.value)

            def run() -> TransferReport:
                if direction == "pull":
                    return pull(target, compiler=compiler, policy=policy, max_bytes=max_bytes)
                return push(target, compiler=compiler, signing_key=signing_key)

            report = (
                run() if deadline is None else guarded(run, direction, target, compiler, deadline)  # type: ignore[arg-type]
            )
        except (TargetUnavailable, LocalCacheError) as exc:
            raise fail(str(exc), 1) from exc
        except CompileCacheError as exc:
            raise fail(str(exc), 2) from exc
    if report_file is not None:
        report.save(report_file)
    if as_json:
        print(report.model_dump_json())
    else:
        style = "red" if report.error else "green"
        console.print(f"[{style}]{escape(report.summary())}[/]")
        for skipped in report.skipped[:20]:
            console.print(f"  [yellow]skipped[/] {escape(skipped.path)}: {escape(skipped.reason)}")
        if len(report.skipped) > 20:
            console.print(f"  … and {len(report.skipped) - 20} more (--json lists them all)")
    code = 1 if report.error and not keep_going else 0
    exit_now_if_left_behind(code)  # a transfer given up at its deadline must not hold the exit
    if code:
        raise typer.Exit(code)


@cache_app.command("pull")
def pull_command(
    target: TargetArg,
    backend: BackendOpt = Backend.AUTO,
    as_json: JsonOpt = False,
    report: ReportOpt = None,
    keep_going: KeepGoingOpt = False,
    deadline: DeadlineOpt = None,
    trusted_key: TrustedKeyOpt = None,
    trust_unsigned: TrustUnsignedOpt = False,
    shared_user: SharedUserOpt = False,
    max_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-bytes",
            min=0,
            help="Add at most this many bytes to the local cache (its volume's limit); the "
            "disk's free space less 1 GiB of headroom bounds every pull anyway.",
        ),
    ] = None,
) -> None:
    """Fetch the installed compiler's entries the local cache lacks (each one verified).

    With trusted keys, only entries a manifest signed by one of them lists. Without, NEFF
    entries, and host-side (inductor) entries only from a folder only you can write, or with
    --trust-unsigned.
    """
    trust = Trust(tuple(trusted_key or ()), trust_unsigned, shared_user=shared_user)
    _transfer("pull", target, backend, as_json, report, keep_going, deadline, trust, max_bytes)


@cache_app.command("push")
def push_command(
    target: TargetArg,
    backend: BackendOpt = Backend.AUTO,
    as_json: JsonOpt = False,
    report: ReportOpt = None,
    keep_going: KeepGoingOpt = False,
    deadline: DeadlineOpt = None,
    signing_key: SigningKeyOpt = None,
) -> None:
    """Upload the local cache's complete entries that the target does not have yet (and, with
    a signing key, a signed manifest of them)."""
    trust = Trust(signing_key=signing_key)
    _transfer("push", target, backend, as_json, report, keep_going, deadline, trust)


@cache_app.command("keygen")
def keygen_command(
    key_file: Annotated[
        Path, typer.Argument(help="Where to write the new private key (PEM, mode 0600).")
    ],
) -> None:
    """Make a signing key for trusted pushers; print its public key (give it to readers)."""
    from model_support.compile_cache import SigningKey

    if key_file.exists():
        raise fail(f"{key_file} exists; keys are never overwritten: choose another file", 2)
    key = SigningKey.generate()
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise fail(f"cannot write {key_file}: {exc.strerror}", 2) from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.pem)
    print(key.public_key())


@cache_app.command("ls")
def ls_command(
    target: TargetArg,
    backend: BackendOpt = Backend.AUTO,
    all_prefixes: Annotated[
        bool, typer.Option("--all", help="Every compiler prefix in the target, not only ours.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """What the target holds per compiler prefix (sizes checked against names, not read)."""
    from model_support.compile_cache import (
        CompileCacheError,
        TargetUnavailable,
        installed_compiler_cache,
        list_target,
    )

    try:
        listings = list_target(
            target, compiler=installed_compiler_cache(backend.value), all_prefixes=all_prefixes
        )
    except TargetUnavailable as exc:
        raise fail(str(exc), 1) from exc
    except CompileCacheError as exc:
        raise fail(str(exc), 2) from exc
    if as_json:
        print(json.dumps([listing.model_dump() for listing in listings]))
        return
    table = Table(title=escape(f"compile cache — {target}"))
    for column in ("prefix", "entries", "size", "versions", "unverified", "truncated", "other"):
        table.add_column(column, justify="left" if column == "prefix" else "right")
    for listing in listings:
        table.add_row(
            escape(listing.prefix) + (" [green](installed)[/]" if listing.installed else ""),
            str(listing.entries),
            f"{listing.bytes / 2**20:.1f} MiB",
            str(listing.versions),
            str(listing.unverified),
            str(len(listing.truncated)),
            str(listing.foreign),
        )
    DataConsole().print(table)


@cache_app.command("prune")
def prune_command(
    target: TargetArg,
    backend: BackendOpt = Backend.AUTO,
    older_than: Annotated[
        float | None, typer.Option(help="Also remove entries stored more than this many days ago.")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Read every object and remove those whose bytes do not match their hash.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove truncated, corrupt (--verify), superseded and expired (--older-than) entries."""
    from model_support.compile_cache import (
        CompileCacheError,
        TargetUnavailable,
        installed_compiler_cache,
        prune,
    )

    if older_than is not None and not (math.isfinite(older_than) and older_than > 0):
        raise fail(f"--older-than {older_than:g}: give a positive number of days", 2)
    try:
        report = prune(
            target,
            compiler=installed_compiler_cache(backend.value),
            older_than=timedelta(days=older_than) if older_than is not None else None,
            verify=verify,
            dry_run=dry_run,
        )
    except TargetUnavailable as exc:
        raise fail(str(exc), 1) from exc
    except CompileCacheError as exc:
        raise fail(str(exc), 2) from exc
    if as_json:
        print(report.model_dump_json())
        return
    verb = "would remove" if dry_run else "removed"
    console.print(
        escape(
            f"{verb} {len(report.removed)} objects from {report.target}/{report.prefix}; "
            f"kept {report.kept}"
        )
    )
    for removed in report.removed[:50]:
        console.print(f"  {escape(removed.path)}: {escape(removed.reason)}")


def register(app: typer.Typer) -> None:
    """Add the `cache` command group."""
    app.add_typer(cache_app)
