"""The compile cache around `model-support run --compile-cache URI`: checked and pulled before
run.py, pushed after its record is stored (as a runner pod does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.markup import escape

from model_support.cli.common import console, fail
from model_support.records import RunRecord
from model_support.vocabulary import Backend, Result

if TYPE_CHECKING:
    from model_support.compile_cache.transfer import TransferReport


@dataclass(frozen=True)
class RunCache:
    """The compile cache of one `run`: its target, and what was pulled before run.py."""

    target: str
    backend: str
    pulled: TransferReport


def before_run(
    target: str | None, backend: Backend, quiet: bool, untrusted: list[str] | None = None
) -> RunCache | None:
    """Check the target (a wrong one is the user's to fix: exit 2, nothing runs), then pull.

    A run that executes code nobody reviewed (``untrusted``: the options that make it so) never
    pushes: whoever pushes to a cache runs code in everyone who pulls from it. A pull that
    fails is recorded, not raised: the test runs without the cache.
    """
    if target is None:
        return None
    if untrusted:
        raise fail(
            f"--compile-cache {target} pushes what this run compiles, and {' and '.join(untrusted)} "
            "runs code nobody reviewed here: whoever pushes to a compile cache runs code in "
            "everyone who pulls from it. Pull first with `model-support cache pull`, and push "
            "only from runs of reviewed code",
            2,
        )
    from model_support.compile_cache import CompileCacheError, check_target, pull_for_run

    try:
        check_target(target, backend.value)
    except CompileCacheError as exc:
        raise fail(f"--compile-cache {target}: {exc}", 2) from exc
    pulled = pull_for_run(target, backend.value)
    if not quiet:
        console.print(
            f"[{'yellow' if pulled.error else 'dim'}]compile cache: {escape(pulled.summary())}[/]"
        )
    return RunCache(target, backend.value, pulled)


def with_pull(cache: RunCache | None, record: RunRecord) -> RunRecord:
    """The record with the pull's figures beside its result, as it is stored (before the push)."""
    if cache is None or record.document.result == Result.EXCLUDED:
        return record  # nothing ran, nothing was pulled for it
    from model_support.compile_cache import attach

    return record.model_copy(update={"document": attach(record.document, cache.pulled, None)})


def after_run(cache: RunCache | None, record: RunRecord) -> RunRecord:
    """Push after run.py, whatever its outcome, once its record is stored.

    The push runs after the record is saved (as in a runner pod), so a stalled, failed or
    stopped push never costs a finished test; the stored record (immutable) carries the pull's
    figures, and the record returned here, which is printed, both transfers'. A stop signal
    (SIGINT / SIGTERM) during the push gives the push up at once: :class:`PushStopped`.
    """
    if cache is None or record.document.result == Result.EXCLUDED:
        return record  # nothing ran, nothing was compiled
    from model_support.compile_cache import attach, push_for_run
    from model_support.stop_signals import on_stop_signals

    def stop(signum: int, _frame: object) -> None:
        raise PushStopped(signum)

    with on_stop_signals(stop):
        pushed = push_for_run(cache.target, cache.backend)
    style = "yellow" if pushed.error else "dim"
    console.print(f"[{style}]compile cache: {escape(pushed.summary())}[/]")
    document = attach(record.document, cache.pulled, pushed)
    return record.model_copy(update={"document": document})


class PushStopped(BaseException):
    """SIGINT or SIGTERM arrived during the compile cache push after a run (its record stored)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
