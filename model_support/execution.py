"""Local execution of a rendered run.py: a subprocess here, as a Job's container runs it there.

The CLI runs run.py as a subprocess; the operator runs the same file as a Job's container
command. Both turn the document into a record with :func:`model_support.records.record_from_document`,
so a record means the same thing wherever it ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from model_support.config import RunConfig
from model_support.records import (
    PROGRESS_MARKER,
    RESULT_MARKER,
    ResultDocument,
    RunRecord,
    failure_document,
    record_from_document,
)
from model_support.script import render_script
from model_support.stop_signals import on_stop_signals
from model_support.vocabulary import Result


class RunCancelled(RuntimeError):
    """The run was stopped through its cancel event before it finished; it has no result."""


@dataclass(frozen=True)
class StageEvent:
    """A progress line from run.py: a stage started or ended."""

    stage: str
    status: str
    seconds: float | None = None
    detail: str | None = None


def _python_for_runner() -> str:
    return os.environ.get("MODEL_SUPPORT_PYTHON", sys.executable)


@dataclass(frozen=True)
class Ended:
    """How a run.py process ended (:func:`run_python`)."""

    returncode: int | None
    seconds: float
    timed_out: bool = False  # past its deadline: stopped by SIGKILL
    cancelled: bool = False  # ``cancel`` was set: stopped by SIGKILL
    stopped: bool = False  # a stop signal reached this process and was passed on (SIGTERM)


def run_python(
    script: str,
    cwd: Path,
    on_line: Callable[[bytes], None],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    timeout_grace_s: float | None = None,
    cancel: threading.Event | None = None,
    pass_on_stop_signals: bool = False,
    stop_grace_s: float = 20.0,
    python: str | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> Ended:
    """Run ``python script`` in ``cwd``, in a session of its own; the one way run.py is run,
    here (the CLI, the demo, ``reproduce``) and in a pod (``runner_pod``).

    Every line it prints (stdout and stderr merged, as bytes) goes to ``on_line`` from a reader
    thread that drains the pipe to its end whatever the callback does (its first exception is
    re-raised once the run is over), so a chatty child never blocks on a full pipe. It ends
    when the process does, past ``timeout_s``, or when ``cancel`` is set (SIGKILL to its whole
    process group; past ``timeout_s`` with ``timeout_grace_s``, SIGTERM first and SIGKILL only
    once the grace ran out, as the kubelet stops a container). With ``pass_on_stop_signals`` (a
    pod's main thread), SIGTERM and SIGINT are passed on to the group as SIGTERM and the run is
    given ``stop_grace_s`` before SIGKILL. On every way out, an exception included, the process
    group is killed: run.py kills its own workers, but a run stopped from outside cannot, and no
    worker may outlive its run. ``python``: the interpreter (default this one, or
    $MODEL_SUPPORT_PYTHON), e.g. a bisect step's own environment.
    """
    return run_command(
        [python or _python_for_runner(), script],
        cwd,
        on_line,
        env=env,
        timeout_s=timeout_s,
        timeout_grace_s=timeout_grace_s,
        cancel=cancel,
        pass_on_stop_signals=pass_on_stop_signals,
        stop_grace_s=stop_grace_s,
        stop_requested=stop_requested,
    )


def run_command(
    argv: list[str],
    cwd: Path,
    on_line: Callable[[bytes], None],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    timeout_grace_s: float | None = None,
    cancel: threading.Event | None = None,
    pass_on_stop_signals: bool = False,
    stop_grace_s: float = 20.0,
    stop_requested: Callable[[], bool] | None = None,
) -> Ended:
    """Run ``argv`` as :func:`run_python` runs run.py (its own session, output to ``on_line``,
    stop signals passed on, the group killed on every way out). ``stop_requested``: whether a
    stop signal already reached the caller's own handler (it is passed on as soon as this
    function's handler is in place, so none is lost in between)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    failures: list[BaseException] = []

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if failures:
                continue  # keep draining: the child must never block on a full pipe
            try:
                on_line(raw)
            except BaseException as exc:  # handed to the caller once the run is over
                failures.append(exc)

    reader = threading.Thread(target=pump, name="run-output", daemon=True)
    reader.start()
    stopped = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopped.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    try:
        with on_stop_signals(stop) if pass_on_stop_signals else contextlib.nullcontext():
            if stop_requested is not None and stop_requested():
                # Asked before this handler was in place (the caller's own handler noted it).
                stop(signal.SIGTERM, None)
            timed_out, cancelled = _wait(
                proc, timeout_s, cancel, stopped, stop_grace_s, timeout_grace_s
            )
    finally:
        _kill_group(proc)
        reader.join(timeout=30)
    if failures:
        raise failures[0]
    return Ended(proc.returncode, time.monotonic() - t0, timed_out, cancelled, stopped.is_set())


def run_script(
    run_py: str,
    config: RunConfig,
    *,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    on_stage: Callable[[StageEvent], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    python: str | None = None,
) -> ResultDocument:
    """Run a rendered run.py as ``python3 run.py`` in a fresh directory; return its result document.

    A run past ``timeout_s`` is killed (its whole process group, so sharded workers go too) and
    gives TIMEOUT; what else it left becomes the document by :func:`runpath.document_for_end`
    (a malformed or missing document is an ERROR that says so).
    Setting ``cancel`` stops the run the same way and raises RunCancelled (nothing to record).
    On every way out, an exception included (Ctrl-C, a signal turned into one), the process
    group is killed and the directory removed before this returns or raises.
    """
    from model_support.runpath import RunEnd, document_for_end, oom_kills, read_result

    started = datetime.now(UTC)
    t0 = time.monotonic()
    kills_before = oom_kills()
    # A fresh directory each time: no result file of an earlier run can be mistaken for this one's.
    with tempfile.TemporaryDirectory(prefix="model-support-run-") as tmp:
        directory = Path(tmp)
        (directory / "run.py").write_text(run_py, encoding="utf-8")
        output = RunOutput(on_stage, on_output)
        ended = run_python(
            "run.py",
            directory,
            output.feed_bytes,
            env=env,
            timeout_s=timeout_s,
            cancel=cancel,
            python=python,
        )
        output.raise_callback_error()
        timed_out, cancelled = ended.timed_out, ended.cancelled
        if cancelled:
            raise RunCancelled(f"run.py was stopped on request after {time.monotonic() - t0:.1f} s")
        elapsed = time.monotonic() - t0
        last_stage = output.last_stage
        if timed_out:
            return failure_document(
                config,
                Result.TIMEOUT,
                error_class=None,
                error=f"run.py did not finish within {timeout_s:g} s (last stage: {last_stage or 'none'})",
                started_at=started,
                stage=last_stage,
                total_s=elapsed,
            )
        kills_after = oom_kills()
        end = RunEnd(
            returncode=ended.returncode,
            seconds=elapsed,
            tail=list(output.tail),
            last_stage=last_stage,
            oom_killed=(
                None if kills_before is None or kills_after is None else kills_after > kills_before
            ),
            started_at=started,
        )
        found = read_result(directory / config.result_path, output.result_line)
        document = document_for_end(config, found, end, final_word=True)
        assert document is not None  # the final word always gives one
        return document


def _wait(
    proc: subprocess.Popen[bytes],
    timeout_s: float | None,
    cancel: threading.Event | None,
    stopped: threading.Event,
    stop_grace_s: float,
    timeout_grace_s: float | None = None,
) -> tuple[bool, bool]:
    """Wait for run.py to end, the deadline (and its grace, if any) to pass, ``cancel``, or the
    grace after a stop signal to run out; (timed out, cancelled)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    grace_ends: float | None = None
    timeout_grace_ends: float | None = None
    while proc.poll() is None:
        if cancel is not None and cancel.is_set():
            return False, True
        if deadline is not None and time.monotonic() > deadline:
            if timeout_grace_s is None:
                return True, False
            if timeout_grace_ends is None:  # asked to stop first, as the kubelet would
                timeout_grace_ends = time.monotonic() + timeout_grace_s
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            elif time.monotonic() > timeout_grace_ends:
                return True, False  # the group is killed on the way out
        if stopped.is_set():
            grace_ends = grace_ends or time.monotonic() + stop_grace_s
            if time.monotonic() > grace_ends:
                return False, False  # the group is killed on the way out
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
    return timeout_grace_ends is not None, False


class RunOutput:
    """run.py's merged stdout and stderr as it streams in: progress, a bounded tail, the result.

    :meth:`pump` reads until the pipe closes, whatever the child prints: a progress line that
    is not a valid event (a model or library printing the marker) is kept as ordinary output,
    and only the last :data:`TAIL_LINES` ordinary lines are kept, so a chatty run can neither
    stop the reader (which would block run.py on a full pipe) nor fill the memory.
    """

    TAIL_LINES = 200

    def __init__(
        self,
        on_stage: Callable[[StageEvent], None] | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> None:
        self.on_stage = on_stage
        self.on_output = on_output
        self.tail: deque[str] = deque(maxlen=self.TAIL_LINES)
        self.last_stage: str | None = None
        self.result_line: str | None = None
        self._callback_error: BaseException | None = None

    def pump(self, stream: Iterable[str]) -> None:
        """Read ``stream`` to its end (the reader thread's body)."""
        for raw in stream:
            self.feed(raw.rstrip("\n"))

    def feed_bytes(self, raw: bytes) -> None:
        """Take one line as the process printed it (invalid UTF-8 is replaced, not fatal)."""
        self.feed(raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def feed(self, line: str) -> None:
        """Take one line of output."""
        if line.startswith(RESULT_MARKER):
            self.result_line = line  # the last one wins, as in parse_result_line
            return
        event = parse_stage_event(line) if line.startswith(PROGRESS_MARKER) else None
        if event is not None:
            self.last_stage = event.stage
            self._call(self.on_stage, event)
            return
        self.tail.append(line)
        self._call(self.on_output, line)

    def _call(self, callback: Callable[[Any], None] | None, value: object) -> None:
        if callback is None or self._callback_error is not None:
            return
        try:
            callback(value)
        except BaseException as exc:  # kept for the caller: the reader must go on draining
            self._callback_error = exc

    def raise_callback_error(self) -> None:
        """Re-raise what a callback raised (after the run ended), if anything."""
        if self._callback_error is not None:
            raise self._callback_error


def parse_stage_event(line: str) -> StageEvent | None:
    """The progress event of a ``MODEL_SUPPORT_STAGE`` line; None when it is not a valid one."""
    try:
        data = json.loads(line[len(PROGRESS_MARKER) :])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    stage, status = data.get("stage"), data.get("status")
    seconds, detail = data.get("seconds"), data.get("detail")
    if not isinstance(stage, str) or not isinstance(status, str):
        return None
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)):
        return None
    if detail is not None and not isinstance(detail, str):
        return None
    return StageEvent(stage=stage, status=status, seconds=seconds, detail=detail)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def run_local(
    config: RunConfig,
    *,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    source: str = "cli",
    labels: dict[str, str] | None = None,
    on_stage: Callable[[StageEvent], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> RunRecord:
    """Render run.py for ``config``, run it here, and return the run record (not yet stored)."""
    run_py = render_script(config)
    document = run_script(
        run_py,
        config,
        timeout_s=timeout_s,
        env=env,
        on_stage=on_stage,
        on_output=on_output,
        cancel=cancel,
    )
    return record_from_document(document, run_py, source=source, labels=labels)


class BackgroundRun:
    """``run_local`` in a thread, so the caller can work (size, open the store) meanwhile.

    The CLI uses it to start a one-core run while sizing is still deciding: sizing imports
    transformers to read the model's parallel plan, which costs seconds that run.py spends
    importing the same libraries. Most models fit one core; when the plan differs (more cores,
    or an exclusion) the run is cancelled before it records anything, and whatever it fetched
    into the Hub cache is what the real run needs.
    """

    def __init__(self, config: RunConfig, **kwargs: object) -> None:
        self.config = config
        self._cancel = threading.Event()
        self._outcome: RunRecord | BaseException | None = None
        # Not a daemon: were the caller to exit without cancel(), the interpreter still waits
        # for the run (which then ends, kills its process group and removes its folder).
        self._thread = threading.Thread(
            target=self._run, args=(kwargs,), name="background-run", daemon=False
        )
        self._thread.start()

    def _run(self, kwargs: dict[str, object]) -> None:
        try:
            self._outcome = run_local(self.config, cancel=self._cancel, **kwargs)  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the caller by result()
            self._outcome = exc

    def result(self) -> RunRecord:
        """Wait for the run and return its record (re-raising what it raised)."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """Stop the run (its whole process group) and wait until it is gone."""
        self._cancel.set()
        self._thread.join()
