"""The runner container's entry point: ``python3 run.py`` unchanged, then the result made durable.

    python3 -m model_support.runner_pod --run-id RUN_ID [--deliver-to STORE_URI]
        [--result-file result.json] [--termination-log /dev/termination-log]
        [--push-cache DIR TARGET]

The operator makes this the runner container's command (an argv list: no shell, so no spec value
can become a command). In order:

1. run ``python3 run.py`` in the working directory, its output passed through to the container
   log as it comes;
2. deliver the result document to the results store's delivery area under the run id
   (:mod:`model_support.delivery`), retried with backoff, so the result outlives the pod;
3. write a compact copy of the document as the termination message (4 KiB, kept in the pod's
   status) and print the document again as the log's last line: the operator's fallbacks;
4. run the after-run hooks (the NEFF cache push), whose output and failures never touch the
   result;
5. exit with run.py's own status.

What is delivered is what run.py wrote. When run.py wrote nothing the runner says why, in a
document of its own (exit status and output tail), except in two cases where nothing true can be
said from inside the container: the pod was asked to stop (SIGTERM: a disruption or the Job's
deadline, which the Job and the operator handle), or run.py was killed by SIGKILL (most often the
kernel's OOM killer, which only the container's ``OOMKilled`` reason can confirm). Then nothing
is delivered and the exit status tells the rest.

Only fsspec and pydantic are imported (plus s3fs/huggingface_hub for those stores): the runner
image needs the model_support package, not the operator's or viewer's dependencies.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from model_support.delivery import DeliveryArea, DeliveryError
from model_support.records import RESULT_MARKER, ResultDocument
from model_support.vocabulary import ErrorClass, Result

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a container's termination message."""
OUTPUT_TAIL_LINES = 40
DELIVERY_DEADLINE_S = 300.0
CACHE_PUSH_TIMEOUT_S = 3600.0
_STOP_GRACE_S = 20.0

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
class CachePush:
    """After-run hook: push the local NEFF compile cache to its target (``hf buckets sync``).

    Runs after the result is delivered, so a slow or failing upload can neither delay nor lose
    the result; its failure is reported in the log and changes nothing else.
    """

    source: str
    target: str

    def argv(self) -> list[str]:
        """The command, as an argument list (no shell)."""
        return ["hf", "buckets", "sync", self.source, self.target]

    def run(self, out: IO[str]) -> None:
        """Run the push; report (never raise) what went wrong."""
        try:
            done = subprocess.run(
                self.argv(), stdout=sys.stderr, stderr=sys.stderr, timeout=CACHE_PUSH_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"model-support: NEFF cache push to {self.target} failed: {exc}", file=out)
            return
        if done.returncode != 0:
            print(
                f"model-support: NEFF cache push to {self.target} failed "
                f"(hf exited {done.returncode})",
                file=out,
            )


AfterRunHook = CachePush
"""What may run after the result is safe (one kind today; each is a typed step, never a shell)."""


@dataclass(frozen=True)
class Outcome:
    """How run.py ended, as the runner saw it."""

    returncode: int
    stopped: bool  # the runner was asked to stop (SIGTERM / SIGINT) and passed it on
    tail: list[str]
    seconds: float


def run_script(script: str, cwd: Path, out: IO[bytes]) -> Outcome:
    """Run ``python3 script`` in ``cwd``, copying its output to ``out``; pass SIGTERM on."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, script],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: a stop reaches every worker
    )
    stopped = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        stopped.set()
        _signal_group(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            tail.append(line.decode("utf-8", errors="replace").rstrip("\n"))
        try:
            proc.wait(timeout=_STOP_GRACE_S if stopped.is_set() else None)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return Outcome(proc.returncode, stopped.is_set(), list(tail), time.monotonic() - started)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, sig)


def _runner_document(
    script_path: Path, result: Result, error_class: ErrorClass, error: str, seconds: float
) -> ResultDocument:
    """A document for a run.py that wrote none: identity from run.py's own config block."""
    from model_support.records import failure_document
    from model_support.script import read_config

    config = read_config(script_path.read_text(encoding="utf-8"))
    return failure_document(config, result, error_class=error_class, error=error, total_s=seconds)


def document_for(outcome: Outcome, result_file: Path, script_path: Path) -> ResultDocument | None:
    """The document to deliver for ``outcome``; None when nothing true can be said (see module)."""
    tail = "\n".join(outcome.tail[-30:])
    if result_file.is_file():
        try:
            return ResultDocument.model_validate_json(result_file.read_bytes())
        except ValidationError as exc:
            return _runner_document(
                script_path,
                Result.ERROR,
                ErrorClass.RUNTIME,
                f"run.py wrote a malformed result document ({exc.error_count()} error(s): "
                f"{exc.errors()[0]['msg']}). Output tail:\n{tail}",
                outcome.seconds,
            )
    if outcome.stopped or outcome.returncode == -signal.SIGKILL:
        return None
    if outcome.returncode < 0:
        name = signal.Signals(-outcome.returncode).name
        why = f"run.py died of signal {name} without a result document"
    else:
        why = f"run.py exited with status {outcome.returncode} without a result document"
    return _runner_document(
        script_path,
        Result.ERROR,
        ErrorClass.RUNTIME,
        f"{why}. Output tail:\n{tail}",
        outcome.seconds,
    )


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


def deliver(
    area: DeliveryArea,
    run_id: str,
    payload: bytes,
    *,
    deadline_s: float = DELIVERY_DEADLINE_S,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Deliver with exponential backoff (1 s, 2 s, ... 30 s) until ``deadline_s``; the last
    error is raised when the store never answered."""
    give_up = time.monotonic() + deadline_s
    delay = 1.0
    while True:
        try:
            return area.put(run_id, payload)
        except DeliveryError as exc:
            if time.monotonic() + delay > give_up:
                raise
            print(f"model-support: {exc}; retrying in {delay:g} s", file=sys.stderr, flush=True)
            sleep(delay)
            delay = min(delay * 2, 30.0)


def _write_termination_message(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        print(f"model-support: could not write {path}: {exc}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run run.py, make its result durable, run the hooks; return run.py's exit status."""
    parser = argparse.ArgumentParser(prog="python3 -m model_support.runner_pod")
    parser.add_argument("--run-id", required=True, help="The run id the operator gave this run.")
    parser.add_argument(
        "--deliver-to", help="Results store URI whose deliveries/ gets the document."
    )
    parser.add_argument("--script", default="run.py")
    parser.add_argument("--result-file", default="result.json", help="run.py's result_path.")
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    parser.add_argument("--delivery-deadline", type=float, default=DELIVERY_DEADLINE_S)
    parser.add_argument(
        "--push-cache", nargs=2, metavar=("DIR", "TARGET"), help="Push DIR to TARGET afterwards."
    )
    args = parser.parse_args(argv)
    area = DeliveryArea(args.deliver_to) if args.deliver_to else None  # validates the URI first
    if area is not None:
        area.path(args.run_id)  # and the run id, before anything runs

    cwd = Path.cwd()
    script_path = cwd / args.script
    outcome = run_script(args.script, cwd, sys.stdout.buffer)
    sys.stdout.flush()
    exit_code = outcome.returncode if outcome.returncode >= 0 else 128 - outcome.returncode
    document = document_for(outcome, cwd / args.result_file, script_path)

    if document is None:
        message = STOPPED_MESSAGE if outcome.stopped else KILLED_MESSAGE
        print(message, file=sys.stderr, flush=True)
        _write_termination_message(args.termination_log, message)
        return exit_code

    finished = document.model_copy(
        update={"finished_at": document.finished_at or datetime.now(UTC)}
    )
    payload = finished.model_dump_json().encode()
    if area is not None:
        try:
            where = deliver(area, args.run_id, payload, deadline_s=args.delivery_deadline)
            print(f"model-support: result delivered to {where}", file=sys.stderr, flush=True)
        except DeliveryError as exc:
            print(
                f"model-support: result NOT delivered ({exc}); the operator falls back to the "
                "log and the termination message",
                file=sys.stderr,
                flush=True,
            )
    _write_termination_message(args.termination_log, compact_document(finished))
    hooks: list[AfterRunHook] = [CachePush(*args.push_cache)] if args.push_cache else []
    for hook in hooks:
        hook.run(sys.stderr)
    # The whole document is the log's last line too, whatever the hooks printed before it.
    print(RESULT_MARKER + payload.decode(), flush=True)
    if exit_code == 0 and document.result not in (Result.PASS, Result.FAIL):
        exit_code = 1
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
