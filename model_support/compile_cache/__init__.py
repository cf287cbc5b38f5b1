"""Compile caches: NEFF (TorchNeuron) or inductor caches pulled and pushed per compiler version.

A test's wall time on Trainium is mostly compilation; a cache shared between runs (and
machines) is what makes the second run of a model cheap. This package moves the compiler's
on-disk cache to and from a target (a local folder or PVC, ``s3://``, ``hf://buckets/``):

* :mod:`.compilers` -- which compiler is installed, its target prefix and its local folder;
* :mod:`.layouts` -- what a complete entry of each compiler's cache is;
* :mod:`.target` -- target URIs, object names (path + SHA-256 + size), the stores;
* :mod:`.transfer` -- pull, push, list, prune, each returning a typed report.

Around a test (``model-support run --compile-cache``, the operator's runner pod) the cache is
pulled before run.py and pushed after it, whatever run.py's outcome, through
:func:`pull_for_run` / :func:`push_for_run`, which never raise for a cache failure: it is
recorded beside the result (:func:`attach`) and the result itself is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from model_support.compile_cache.compilers import (
    CompilerCache,
    describe_prefix,
    installed_compiler_cache,
)
from model_support.compile_cache.errors import (
    BadCacheTarget,
    CacheDisabled,
    CompileCacheError,
    CompilerMismatch,
    LocalCacheError,
    TargetUnavailable,
    UnreadableLayout,
)
from model_support.compile_cache.target import ResolvedTarget, open_target, redact
from model_support.compile_cache.transfer import (
    PrefixListing,
    PruneReport,
    SkippedEntry,
    TransferReport,
    exit_now_if_left_behind,
    guarded,
    list_target,
    prune,
    pull,
    push,
    transfers_left_behind,
)
from model_support.compile_cache.trust import SigningKey, TrustPolicy, UntrustedCache
from model_support.records import CompileCacheFigures, ResultDocument


def check_target(
    target: str, backend: str | None = None, storage_options: dict[str, Any] | None = None
) -> ResolvedTarget:
    """Validate a target for the installed compiler before anything runs.

    Raises :class:`CompileCacheError` (:class:`CompilerMismatch`, :class:`BadCacheTarget`,
    :class:`CacheDisabled`) for what the user must fix; nothing is read or written.
    """
    return open_target(target, installed_compiler_cache(backend), storage_options)


def _compiler_or_none(backend: str | None) -> CompilerCache | None:
    try:
        return installed_compiler_cache(backend)
    except CompileCacheError:
        return None


RUN_TRANSFER_DEADLINE_S = 1800.0
"""How long a test waits for a pull or push before giving it up (recorded as its error)."""


def pull_for_run(
    target: str,
    backend: str | None = None,
    storage_options: dict[str, Any] | None = None,
    deadline_s: float | None = RUN_TRANSFER_DEADLINE_S,
    policy: TrustPolicy | None = None,
    max_bytes: int | None = None,
) -> TransferReport:
    """Pull before a test: never raises for a cache failure (it is the report's ``error``).
    ``policy``: what the pull trusts (default: the environment's trusted keys, see :mod:`.trust`);
    ``max_bytes``: the most it may add (a volume's limit), besides the disk's free space."""
    compiler = _compiler_or_none(backend)

    def run() -> TransferReport:
        return pull(
            target,
            compiler=compiler or installed_compiler_cache(backend),
            storage_options=storage_options,
            policy=policy,
            max_bytes=max_bytes,
        )

    return guarded(run, "pull", target, compiler, deadline_s)


def push_for_run(
    target: str,
    backend: str | None = None,
    storage_options: dict[str, Any] | None = None,
    deadline_s: float | None = RUN_TRANSFER_DEADLINE_S,
    signing_key: SigningKey | None = None,
    unvouched: Iterable[str] = (),
) -> TransferReport:
    """Push after a test, whatever its outcome: never raises for a cache failure. With
    ``signing_key`` the push writes a signed manifest of what it vouches for: never what the
    run's pull took unvouched (``unvouched``: its report's ``unvouched_names``)."""
    compiler = _compiler_or_none(backend)

    def run() -> TransferReport:
        return push(
            target,
            compiler=compiler or installed_compiler_cache(backend),
            storage_options=storage_options,
            signing_key=signing_key,
            unvouched=tuple(unvouched),
        )

    return guarded(run, "push", target, compiler, deadline_s)


def attach(
    document: ResultDocument,
    pull_report: TransferReport | None,
    push_report: TransferReport | None,
) -> ResultDocument:
    """The document with the cache figures beside the result (the result is not changed)."""
    # The push's target when there is one: it then holds every entry the run used (pulled
    # entries are local entries too), so it is where a reproduction should pull from.
    reports = [r for r in (push_report, pull_report) if r is not None]
    if not reports:
        return document
    figures = CompileCacheFigures(
        target=reports[0].target,
        prefix=next((r.prefix for r in reports if r.prefix), ""),
        pull=pull_report.figures() if pull_report else None,
        push=push_report.figures() if push_report else None,
    )
    return document.model_copy(update={"compile_cache": figures})


def pull_command(target_root: str, prefix: str) -> str:
    """The exact command that pulls ``prefix`` of ``target_root`` (for a reproduce section)."""
    import shlex

    where = f"{redact(target_root).rstrip('/')}/{prefix}"
    return f"model-support cache pull {shlex.quote(where)}"


__all__ = [
    "BadCacheTarget",
    "CacheDisabled",
    "CompileCacheError",
    "CompilerCache",
    "CompilerMismatch",
    "LocalCacheError",
    "PrefixListing",
    "PruneReport",
    "SigningKey",
    "SkippedEntry",
    "TargetUnavailable",
    "TransferReport",
    "TrustPolicy",
    "UnreadableLayout",
    "UntrustedCache",
    "attach",
    "check_target",
    "describe_prefix",
    "exit_now_if_left_behind",
    "guarded",
    "installed_compiler_cache",
    "list_target",
    "prune",
    "pull",
    "pull_command",
    "pull_for_run",
    "push",
    "push_for_run",
    "transfers_left_behind",
]
