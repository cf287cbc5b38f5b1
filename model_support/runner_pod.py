"""The runner container's entry point: ``python3 run.py`` unchanged, then the result made durable.

    python3 -m model_support.runner_pod --run-id RUN_ID [--deliver-to SLOT_DIR | --deliver-url-env VAR]
        [--timeout SECONDS] [--neuron-devices PATTERN] [--result-file result.json]
        [--termination-log /dev/termination-log]
        [--compile-cache TARGET] [--pull-report FILE --pull-source URI]
        [--cache-backend auto|neuron|cuda|cpu] [--cache-deadline SECONDS]

The operator makes this the runner container's command (an argv list: no shell, so no spec value
can become a command). In order:

1. read the init step's compile cache pull report (``model-support cache pull --report``), before
   run.py can touch the working directory;
2. run ``python3 run.py`` in the working directory, its output passed through to the container
   log as it comes, for at most ``--timeout`` seconds counted from the moment run.py starts
   (the test's ``timeoutSeconds``: time the pod spent waiting for a node, pulling its image or
   in init steps is never the model's); past it the runner stops run.py and says TIMEOUT;
3. deliver the result document (with the pull's figures) to this attempt's delivery slot
   (:mod:`model_support.delivery`: a folder mounted from the results volume, or an upload URL
   the operator signed for one key), retried with backoff, so the result outlives the pod, and
   write a compact copy as the termination message;
4. push the compile cache to its target whatever run.py's outcome, within a deadline; then
   deliver again, the same document with both transfers' figures beside the result (the
   slot keeps the last delivery), and rewrite the termination message;
5. print the document as the log's last line (the operator's last fallback) and exit with
   run.py's own status (124 after a timeout; 143, the status the runner Job's pod failure
   policy ignores, only when the pod itself was asked to stop).

The runner is the container's PID 1, and the kernel drops the signals PID 1 has no handler
for: it handles SIGTERM and SIGINT for its whole life, so a stop outside run.py's run (a Kueue
preemption, a deleted pod) is never left to the kubelet's SIGKILL after the grace period (exit
137, which the Job's pod failure policy would take for the runner's own verdict). Before run.py
starts it exits 143 at once. After run.py ended, run.py's verdict stands: the termination
message already holds it (it is written before the first delivery), the delivery gets
``STOPPED_DELIVERY_DEADLINE_S`` more, the compile cache push is left out, and the runner exits
with run.py's status.

Delivering before the push means a push that hangs, fails, or is cut short by the Job's
deadline or a disruption can neither lose the result nor delay it: the worst it costs is the
push's figures. The push is bounded (``--cache-deadline``); a stop signal during it ends it at
once (the result is already delivered, so the pod then finishes normally). A cache failure is
recorded in the document's ``compile_cache`` and never changes the result or the exit status.

What is delivered is what run.py wrote. When run.py wrote nothing the runner says why, in a
document of its own (exit status and output tail), except in two cases where nothing true can be
said from inside the container: the pod was asked to stop (SIGTERM: a disruption or the Job's
deadline, which the Job and the operator handle), or run.py was killed by SIGKILL (most often the
kernel's OOM killer, which only the container's ``OOMKilled`` reason can confirm). Then nothing
is delivered and the exit status tells the rest (after a SIGKILL the cache is still pushed: what
compiled before it is worth keeping).

The runner holds no credentials to the results store, only its attempt's slot. An upload URL
comes in an environment variable (from a Secret), which the runner takes out of the
environment run.py inherits, and the runner makes itself non-dumpable first, so that code in
run.py (the model's, extra packages', a pulled cache's) cannot read it from ``/proc``.

Only fsspec and pydantic are imported (plus s3fs/huggingface_hub for those stores): the runner
image needs the model_support package, not the operator's or viewer's dependencies.
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from model_support.delivery import DeliveryError, deliver_to_folder, deliver_to_url
from model_support.records import RESULT_MARKER, ResultDocument
from model_support.script import BEGIN, END, RUN_CONFIG_ENV, RUN_SHA256_ENV
from model_support.stop_signals import STOPPED_EXIT, on_stop_signals
from model_support.vocabulary import ErrorClass, Result

if TYPE_CHECKING:
    from model_support.compile_cache import SigningKey, TransferReport

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a container's termination message."""
OUTPUT_TAIL_LINES = 40
DELIVERY_DEADLINE_S = 300.0
CACHE_DEADLINE_S = 1800.0
"""How long the compile cache push may take after run.py (the same as ``RUN_TRANSFER_DEADLINE_S``)."""
STOPPED_DELIVERY_DEADLINE_S = 10.0
"""Delivery retries after a stop signal: the kubelet's grace period is short, and the result
was delivered once already."""
_STOP_GRACE_S = 20.0
TIMEOUT_EXIT = 124
"""The runner's status when run.py ran past the test's timeout (as coreutils ``timeout``)."""

RUNNER_MESSAGE_PREFIX = "model-support runner:"
"""How the runner's own termination message starts when run.py left no document."""
STOPPED_MESSAGE = (
    f"{RUNNER_MESSAGE_PREFIX} run.py was stopped by a signal from outside (a disruption or "
    "the Job's deadline); it wrote no result document."
)
KILLED_MESSAGE = (
    f"{RUNNER_MESSAGE_PREFIX} run.py was killed by SIGKILL (the container's OOMKilled reason "
    "says whether memory ran out); it wrote no result document."
)

_COMPACT_VERIFICATION = (
    "passed",
    "exact",
    "error_ratio",
    "device_error",
    "baseline_error",
    "mismatches",
    "near_ties",
    "bad_tokens",
    "first_mismatch",
    "reason",
)


@dataclass(frozen=True)
class Outcome:
    """How run.py ended, as the runner saw it."""

    returncode: int
    stopped: bool  # the runner was asked to stop (SIGTERM / SIGINT) and passed it on
    tail: list[str]
    seconds: float
    timed_out: bool = False  # run.py ran past the timeout and the runner stopped it


def run_script(
    script: str,
    cwd: Path,
    out: IO[bytes],
    timeout_s: float | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> Outcome:
    """Run ``python3 script`` in ``cwd`` (:func:`model_support.execution.run_python`, as the
    CLI runs it), copying its output to ``out`` as it comes; SIGTERM is passed on, and once it
    ran ``timeout_s`` seconds it is stopped (SIGTERM, SIGKILL after the grace period)."""
    from model_support.execution import run_python

    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)

    def copy(line: bytes) -> None:
        out.write(line)
        out.flush()
        tail.append(line.decode("utf-8", errors="replace").rstrip("\r\n"))

    ended = run_python(
        script,
        cwd,
        copy,
        timeout_s=timeout_s,
        timeout_grace_s=_STOP_GRACE_S,  # as the kubelet would: SIGTERM, then SIGKILL
        pass_on_stop_signals=True,
        stop_grace_s=_STOP_GRACE_S,
        stop_requested=stop_requested,
    )
    returncode = ended.returncode if ended.returncode is not None else -signal.SIGKILL
    return Outcome(
        returncode,
        ended.stopped,
        list(tail),
        ended.seconds,
        timed_out=ended.timed_out and not ended.stopped,
    )


def _runner_document(
    script_path: Path,
    result: Result,
    error_class: ErrorClass | None,
    error: str,
    seconds: float,
    identity: str | None = None,
) -> ResultDocument:
    """A document for a run.py that did not run or wrote none: identity from run.py's own
    config block (or from ``identity``, a text holding it)."""
    from model_support.records import failure_document
    from model_support.script import read_config

    text = identity if identity is not None else script_path.read_text(encoding="utf-8")
    config = read_config(text)
    return failure_document(config, result, error_class=error_class, error=error, total_s=seconds)


@dataclass(frozen=True)
class Refused:
    """run.py could not be written as the operator asked: what was wrong, and a text holding the
    test's config block (for the document's identity)."""

    problem: str
    identity: str


def write_script(program_dir: Path, script_path: Path) -> Path | Refused:
    """Write run.py (``script_path``) from the program ConfigMap's head and tail in
    ``program_dir`` around the test's config block (``$MODEL_SUPPORT_RUN_CONFIG``); it must hash
    to ``$MODEL_SUPPORT_RUN_SHA256``, the run.py the operator rendered and records, else nothing
    is written and the runner refuses the test (a program ConfigMap changed by hand, or a runner
    image from another operator's release). The two variables leave the environment run.py
    inherits."""
    block = os.environ.pop(RUN_CONFIG_ENV, None)
    expected = os.environ.pop(RUN_SHA256_ENV, None)
    if block is None or expected is None:
        missing = [n for n, v in ((RUN_CONFIG_ENV, block), (RUN_SHA256_ENV, expected)) if v is None]
        raise SystemExit(f"model-support: --program needs {' and '.join(missing)} set")
    head = (program_dir / "head").read_text(encoding="utf-8")
    tail = (program_dir / "tail").read_text(encoding="utf-8")
    text = head + block + tail
    found = hashlib.sha256(text.encode()).hexdigest()
    if found != expected:
        return Refused(
            f"the run.py made from {program_dir} and this test's config block has sha256 "
            f"{found}, not {expected}, the run.py the operator rendered for it: the program "
            "ConfigMap was changed, or this runner image is not of the operator's release. "
            "Nothing ran.",
            f"{BEGIN}\n{block}\n{END}",
        )
    script_path.write_text(text, encoding="utf-8")
    return script_path


def document_for(
    outcome: Outcome, result_file: Path, script_path: Path, timeout_s: float | None = None
) -> ResultDocument | None:
    """The document to deliver for ``outcome``; None when nothing true can be said (see module):
    a run.py stopped at the test's timeout is TIMEOUT, the rest is
    :func:`model_support.runpath.document_for_end`, with the Job's outcome as the final word."""
    from model_support.runpath import Malformed, RunEnd, document_for_end, read_result
    from model_support.script import read_config

    found = read_result(result_file, None)  # the marked log line is the operator's to read
    if isinstance(found, ResultDocument):
        return found
    if outcome.timed_out and not isinstance(found, Malformed):
        tail = "\n".join(outcome.tail[-30:])
        return _runner_document(
            script_path,
            Result.TIMEOUT,
            None,
            f"run.py ran past the test's timeout of {timeout_s or outcome.seconds:g} s (counted "
            f"from the moment run.py started) and was stopped. Output tail:\n{tail}",
            outcome.seconds,
        )
    end = RunEnd(
        returncode=outcome.returncode,
        seconds=outcome.seconds,
        tail=outcome.tail,
        stopped=outcome.stopped,
    )
    config = read_config(script_path.read_text(encoding="utf-8"))  # identity from its config
    return document_for_end(config, found, end, final_word=False)


def compact_document(document: ResultDocument, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The document as one marked line of at most ``limit`` bytes (for the termination message).

    Keeps the verdict, the figures and the stack; drops tokens, texts, per-position details and
    the package list, and shortens the error until it fits. It carries no marker of its own
    (documents refuse unknown fields): a record built from it says where its document came from
    in its ``document_source`` label.
    """
    data = document.model_dump(
        mode="json",
        exclude={"tokens", "text", "traceback", "packages", "judge", "prompts", "verification"},
    )
    data["verification"] = {
        k: v
        for k, v in document.verification.model_dump(mode="json").items()
        if k in _COMPACT_VERIFICATION and v is not None
    }
    for transfer in (data.get("compile_cache") or {}).values():
        if isinstance(transfer, dict) and transfer.get("error"):
            transfer["error"] = transfer["error"][:200]  # the full text is in the delivery
    error = data.get("error") or ""
    for keep_stack in (True, False):
        if not keep_stack:
            data.pop("stack", None)
        for room in (2000, 1000, 400, 100, 0):
            data["error"] = (error[:room] + ("…" if len(error) > room else "")) if error else None
            line = RESULT_MARKER + json.dumps(data, separators=(",", ":"), default=str)
            if len(line.encode()) <= limit:
                return line
    minimal = {k: data.get(k) for k in ("schema_version", "model", "task", "result", "error_class")}
    return RESULT_MARKER + json.dumps(minimal, separators=(",", ":"))


Destination = Callable[[bytes], str]
"""Delivers one document to this attempt's slot; returns where it went; raises DeliveryError."""


class StopRequest:
    """When the pod was asked to stop (SIGTERM / SIGINT), as the runner's own handler noted it.

    Installed for the runner's whole life: as the container's PID 1 the runner would otherwise
    drop a stop signal that arrives outside run.py's run (before it, or while the result is
    delivered) and be killed with SIGKILL after the grace period (exit 137, which the Job's
    pod failure policy takes for the runner's verdict)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.at is None:
            self.at = time.monotonic()
            print(
                f"model-support: asked to stop ({signal.Signals(signum).name})",
                file=sys.stderr,
                flush=True,
            )

    @property
    def asked(self) -> bool:
        """Whether a stop signal arrived."""
        return self.at is not None


def deliver(
    destination: Destination,
    payload: bytes,
    *,
    deadline_s: float = DELIVERY_DEADLINE_S,
    stop: StopRequest | None = None,
) -> str:
    """Deliver with exponential backoff (1 s, 2 s, ... 30 s) until ``deadline_s``; the last
    error is raised when the store never answered. Once ``stop`` says the pod was asked to
    stop, the retries end :data:`STOPPED_DELIVERY_DEADLINE_S` after that (the kubelet's grace
    period is short; the termination message already holds the result)."""
    give_up = time.monotonic() + deadline_s
    delay = 1.0

    def deadline() -> float:
        if stop is not None and stop.at is not None:
            return min(give_up, stop.at + STOPPED_DELIVERY_DEADLINE_S)
        return give_up

    while True:
        try:
            return destination(payload)
        except DeliveryError as exc:
            if time.monotonic() + delay > deadline():
                raise
            print(f"model-support: {exc}; retrying in {delay:g} s", file=sys.stderr, flush=True)
            waited_until = time.monotonic() + delay
            while time.monotonic() < min(waited_until, deadline()):
                time.sleep(min(0.25, max(0.0, waited_until - time.monotonic())))
            if time.monotonic() >= deadline():
                raise
            delay = min(delay * 2, 30.0)


def destination_from(folder: str | None, url_env: str | None) -> Destination | None:
    """The attempt's slot from the command line: a mounted folder, or an upload URL read (and
    removed) from the environment variable ``url_env``. The URL is a credential: it is taken
    out of the environment run.py inherits and the process is made non-dumpable, so code in
    run.py cannot read it from this process's ``/proc`` entries."""
    if folder is not None:
        if not os.path.isdir(folder):
            raise SystemExit(
                f"model-support: --deliver-to {folder} is not a folder (the slot mount)"
            )
        return lambda payload: deliver_to_folder(folder, payload)
    if url_env is None:
        return None
    url = os.environ.pop(url_env, "")
    if not url:
        print(
            f"model-support: {url_env} is not set (the operator could not sign this attempt's "
            "upload URL); the result goes to the log and the termination message only",
            file=sys.stderr,
            flush=True,
        )
        return None
    _not_dumpable()
    return lambda payload: deliver_to_url(url, payload)


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/environ and /proc/<pid>/mem of this process are
    then root's, not readable by run.py's processes (same uid, dumpable again after exec)."""
    import ctypes

    pr_set_dumpable = 4
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:  # not Linux: say so, keep going
        print(f"model-support: could not make the runner non-dumpable: {exc}", file=sys.stderr)


def _write_termination_message(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        print(f"model-support: could not write {path}: {exc}", file=sys.stderr, flush=True)


# ---- the compile cache around run.py -------------------------------------------------------


def load_pull_report(path: Path, source: str | None) -> TransferReport:
    """The init step's pull report; a missing or unreadable one is a failed pull, said so."""
    from model_support.compile_cache import TransferReport, redact

    try:
        return TransferReport.load(path)
    except FileNotFoundError:
        error = f"no-report: the init step left no pull report at {path}"
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not a report
        error = f"bad-report: the init step's pull report {path} is unreadable: {_first_line(exc)}"
    return TransferReport(
        direction="pull", target=redact(source or ""), prefix="", local_dir="", error=error
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def _signing_key(target: str) -> SigningKey | None:
    """The key the push signs with, when the operator gave this pod one (a trusted test in a
    namespace allowed to push to a shared target); a broken key signs nothing, said so."""
    from model_support.compile_cache import SigningKey, UntrustedCache
    from model_support.compile_cache.trust import SIGNING_KEY_ENV

    path = os.environ.get(SIGNING_KEY_ENV)
    if not path:
        return None
    try:
        return SigningKey.load(path)
    except UntrustedCache as exc:
        print(f"model-support: not signing the push to {target}: {exc}", file=sys.stderr)
        return None


class _StopPush(Exception):
    """A stop signal arrived while the cache was being pushed."""


def push_cache(
    target: str, backend: str, deadline_s: float, pulled: TransferReport | None = None
) -> TransferReport:
    """Push the compile cache after run.py: within ``deadline_s``, and at once given up on a
    stop signal (SIGTERM / SIGINT). Never raises for a cache failure: it is the report's error.
    A signing push never vouches for what the init step's pull (``pulled``, read before run.py
    ran) took unvouched."""
    from model_support.compile_cache import TransferReport, push_for_run, redact

    def stop(signum: int, _frame: Any) -> None:
        raise _StopPush(signal.Signals(signum).name)

    started = time.monotonic()
    try:
        with on_stop_signals(stop):
            return push_for_run(
                target,
                backend,
                deadline_s=deadline_s,
                signing_key=_signing_key(target),
                unvouched=pulled.unvouched_names if pulled is not None else (),
            )
    except _StopPush as exc:
        return TransferReport(
            direction="push",
            target=redact(target),
            prefix="",
            local_dir="",
            seconds=time.monotonic() - started,
            error=f"stopped: the pod was asked to stop ({exc}) during the push, which was "
            "left behind (the result was delivered before it)",
        )


def _with_cache(
    document: ResultDocument, pulled: TransferReport | None, pushed: TransferReport | None
) -> ResultDocument:
    if pulled is None and pushed is None:
        return document
    from model_support.compile_cache import attach

    return attach(document, pulled, pushed)


# ---- delivery ---------------------------------------------------------------------------


def _deliver_document(
    destination: Destination | None,
    document: ResultDocument,
    deadline_s: float,
    what: str,
    stop: StopRequest | None = None,
) -> None:
    """Deliver ``document`` (when there is a slot to deliver to); say how it went."""
    if destination is None:
        return
    try:
        where = deliver(
            destination, document.model_dump_json().encode(), deadline_s=deadline_s, stop=stop
        )
        print(f"model-support: {what} delivered to {where}", file=sys.stderr, flush=True)
    except DeliveryError as exc:
        print(
            f"model-support: {what} NOT delivered ({exc}); the operator falls back to the "
            "log and the termination message",
            file=sys.stderr,
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run run.py, make its result durable, push the compile cache; return run.py's status."""
    parser = argparse.ArgumentParser(prog="python3 -m model_support.runner_pod")
    parser.add_argument("--run-id", required=True, help="The run id the operator gave this run.")
    slot = parser.add_mutually_exclusive_group()
    slot.add_argument(
        "--deliver-to",
        metavar="SLOT_DIR",
        help="This attempt's delivery slot, mounted as a folder.",
    )
    slot.add_argument(
        "--deliver-url-env",
        metavar="VAR",
        help="Environment variable holding this attempt's signed upload URL.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="Seconds run.py may run, counted from its start (the test's timeoutSeconds).",
    )
    parser.add_argument(
        "--neuron-devices",
        metavar="PATTERN",
        help="Neuron device files the run needs (e.g. /dev/neuron*), checked before anything.",
    )
    parser.add_argument("--script", default="run.py")
    parser.add_argument(
        "--program",
        metavar="DIR",
        type=Path,
        help=f"Write --script first: DIR's head and tail around ${RUN_CONFIG_ENV}, which must "
        f"hash to ${RUN_SHA256_ENV} (the operator's program ConfigMap, mounted).",
    )
    parser.add_argument("--result-file", default="result.json", help="run.py's result_path.")
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    parser.add_argument("--delivery-deadline", type=float, default=DELIVERY_DEADLINE_S)
    parser.add_argument(
        "--compile-cache",
        metavar="TARGET",
        help="Compile cache root to push to after run.py (path, s3://, hf://buckets/).",
    )
    parser.add_argument(
        "--pull-report", type=Path, help="The init step's `model-support cache pull --report`."
    )
    parser.add_argument(
        "--pull-source", help="What the init step pulled from (named when its report is missing)."
    )
    parser.add_argument(
        "--cache-backend",
        default="auto",
        choices=["auto", "neuron", "cuda", "cpu"],
        help="run.py's backend: whose compile cache is pushed (auto: neuron where installed).",
    )
    parser.add_argument(
        "--cache-deadline",
        type=float,
        default=CACHE_DEADLINE_S,
        help="Seconds the push may take before it is given up (recorded as its error).",
    )
    args = parser.parse_args(argv)
    # The runner is the container's PID 1: without a handler of its own it would drop a stop
    # signal that arrives outside run.py's run (see StopRequest).
    stop = StopRequest()
    with on_stop_signals(stop):
        return _run(args, stop)


def _run(args: argparse.Namespace, stop: StopRequest) -> int:
    """The runner's work (see the module), with ``stop`` noting a stop signal."""
    destination = destination_from(args.deliver_to, args.deliver_url_env)  # before run.py
    if args.neuron_devices:
        problem = device_problem(args.neuron_devices)
        if problem is not None:
            return _refuse(destination, args, problem, stop)
    # Read before run.py runs: what the init step wrote, not what run.py may leave in /work.
    pulled = load_pull_report(args.pull_report, args.pull_source) if args.pull_report else None
    if pulled is not None:
        print(f"model-support: compile cache {pulled.summary()}", file=sys.stderr, flush=True)

    cwd = Path.cwd()
    script_path = cwd / args.script
    if args.program is not None:
        written = write_script(args.program, script_path)
        if isinstance(written, Refused):
            return _refuse(destination, args, written.problem, stop, written.identity)
    if stop.asked:  # asked before run.py started: nothing ran, nothing to say
        print(STOPPED_MESSAGE, file=sys.stderr, flush=True)
        _write_termination_message(args.termination_log, STOPPED_MESSAGE)
        return STOPPED_EXIT
    outcome = run_script(
        args.script, cwd, sys.stdout.buffer, timeout_s=args.timeout,
        stop_requested=lambda: stop.asked,
    )  # fmt: skip
    sys.stdout.flush()
    exit_code = _exit_status(outcome)
    document = document_for(outcome, cwd / args.result_file, script_path, args.timeout)

    if document is None:
        message = STOPPED_MESSAGE if outcome.stopped else KILLED_MESSAGE
        print(message, file=sys.stderr, flush=True)
        _write_termination_message(args.termination_log, message)
        if args.compile_cache and not outcome.stopped and not stop.asked:
            # Killed (most often out of memory): what compiled before is still worth keeping.
            pushed = push_cache(args.compile_cache, args.cache_backend, args.cache_deadline, pulled)
            print(f"model-support: compile cache {pushed.summary()}", file=sys.stderr, flush=True)
            _announce_left_behind()
        return exit_code

    finished = document.model_copy(
        update={"finished_at": document.finished_at or datetime.now(UTC)}
    )
    # First the result (with the pull's figures): nothing after this point can lose it. The
    # termination message first of all: a pod killed while it delivers still says its result.
    delivered = _with_cache(finished, pulled, None)
    _write_termination_message(args.termination_log, compact_document(delivered))
    _deliver_document(destination, delivered, args.delivery_deadline, "result", stop)

    if args.compile_cache and finished.result != Result.EXCLUDED and not stop.asked:
        pushed = push_cache(args.compile_cache, args.cache_backend, args.cache_deadline, pulled)
        print(f"model-support: compile cache {pushed.summary()}", file=sys.stderr, flush=True)
        stopped = pushed.error is not None and pushed.error.startswith("stopped:")
        delivered = _with_cache(finished, pulled, pushed)
        _deliver_document(
            destination,
            delivered,
            STOPPED_DELIVERY_DEADLINE_S if stopped else args.delivery_deadline,
            "result with the compile cache figures",
            stop,
        )
        _write_termination_message(args.termination_log, compact_document(delivered))
    elif stop.asked:
        # Asked to stop after run.py ended (a preemption during the delivery): run.py's
        # verdict stands, delivered (or in the termination message); the push is left out.
        print("model-support: the compile cache push is left out (the pod is stopping)",
              file=sys.stderr, flush=True)  # fmt: skip
    _announce_left_behind()  # before the document: it stays the log's last line
    # The whole document is the log's last line too, whatever was printed before it.
    print(RESULT_MARKER + delivered.model_dump_json(), flush=True)
    if exit_code == 0 and document.result not in (Result.PASS, Result.FAIL):
        exit_code = 1
    return exit_code


NODE_NAME_ENV = "NODE_NAME"
"""The node the pod runs on (the Job sets it from the downward API's spec.nodeName)."""


def device_problem(pattern: str) -> str | None:
    """Why this pod cannot use its Neuron devices (``pattern``, e.g. ``/dev/neuron*``), or None.

    Checked before anything else runs: a node whose devices the pod's user cannot open would
    otherwise surface as the model's runtime error, deep inside the first compile.
    """
    node = os.environ.get(NODE_NAME_ENV) or "(unknown node)"
    devices = sorted(glob.glob(pattern))
    if not devices:
        return (
            f"no Neuron device matching {pattern} is visible in the pod on node {node}: the "
            "device plugin or DRA driver did not give the pod its devices (check the node's "
            "Neuron driver and the pod's aws.amazon.com/neuroncore request or resource claim)"
        )
    refused = []
    for device in devices:
        try:
            os.close(os.open(device, os.O_RDWR))
        except PermissionError:
            refused.append(device)
        except OSError:
            continue  # busy or not a device this user may probe: the runtime says more
    if not refused:
        return None
    stat = os.stat(refused[0])
    return (
        f"the Neuron devices {', '.join(refused)} on node {node} cannot be opened by the pod's "
        f"user (uid {os.getuid()}, groups {sorted(os.getgroups())}; {refused[0]} is owned by "
        f"{stat.st_uid}:{stat.st_gid}, mode {oct(stat.st_mode & 0o777)}): let the container "
        "runtime give devices the pod's user (containerd: device_ownership_from_security_context "
        "= true), or add the devices' group to runner pods (operator setting "
        "runnerSupplementalGroups)"
    )


def _exit_status(outcome: Outcome) -> int:
    """The runner's exit status for how run.py ended (see :data:`STOPPED_EXIT`)."""
    if outcome.timed_out:
        return TIMEOUT_EXIT
    if outcome.stopped:
        return STOPPED_EXIT
    code = outcome.returncode if outcome.returncode >= 0 else 128 - outcome.returncode
    return 1 if code == STOPPED_EXIT else code


def _refuse(
    destination: Destination | None,
    args: argparse.Namespace,
    problem: str,
    stop: StopRequest | None = None,
    identity: str | None = None,
) -> int:
    """Deliver ERROR/infrastructure for a pod that cannot run the test at all (its node's
    fault, never the model's): run.py does not start. ``identity``: a text holding the test's
    config block, when run.py itself could not be written. Returns the exit status (1)."""
    document = _runner_document(
        Path.cwd() / args.script,
        Result.ERROR,
        ErrorClass.INFRASTRUCTURE,
        problem,
        0.0,
        identity,
    )
    print(f"model-support: {problem}", file=sys.stderr, flush=True)
    _write_termination_message(args.termination_log, compact_document(document))
    _deliver_document(destination, document, args.delivery_deadline, "result", stop)
    print(RESULT_MARKER + document.model_dump_json(), flush=True)
    return 1


def _announce_left_behind() -> None:
    if "model_support.compile_cache" in sys.modules:
        from model_support.compile_cache.transfer import left_behind_notice, transfers_left_behind

        left = transfers_left_behind()
        if left:
            print(left_behind_notice(left), file=sys.stderr, flush=True)


def _exit(code: int) -> None:
    """Exit with ``code``; at once when a compile cache transfer was left behind at its
    deadline (an interpreter exit would wait for its stalled threads, holding the pod)."""
    if "model_support.compile_cache" in sys.modules:
        from model_support.compile_cache import exit_now_if_left_behind

        exit_now_if_left_behind(code, announce=False)  # main() said so already
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
