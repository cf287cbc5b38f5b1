"""One path from a test to its record, whoever started it (CLI, demo, operator, render).

    config -> pin the revision -> size (or exclude) -> run.py -> document -> record

Before run.py: :func:`pin_revision` turns a Hub model's revision (a branch, a tag, or none)
into the commit it names now, so the stored run.py loads exactly the weights that were tested
whenever it is run again; :func:`prepare` pins and sizes (``sizing.size_run``). The CLI, the
demo, ``model-support render`` and the operator's planning call these; a test sizing excludes
is recorded by :func:`excluded_record`, with the run.py that would have run.

After run.py: :func:`document_for_run` is the one policy for what a run left, wherever it ran
(``execution.run_script`` here, ``runner_pod`` in a pod, the operator reading a finished Job):

1. what the run's end proves whatever the run wrote stands first (a Job's deadline, the runner
   container's OOM kill, a runner that never started: a pod's document cannot undo them);
2. then each place a document may be, in the order of trust the caller gives (here what
   :func:`read_result` found: the result file, else the marked output line; for a finished Job
   the delivery, what Kubernetes says of a Job that ended for the cluster's reasons, the log,
   the termination message): the first valid document is the run's; one that does not
   validate is noted and the next place is read; a place that cannot be read now (a store or
   API outage) decides nothing yet;
3. none valid: the end says what it proves (:meth:`End.without_document`): an ERROR of the
   class it proves (out of memory only where the kernel's own report says so: the memory
   cgroup's OOM kill count here, the container's ``OOMKilled`` in a cluster), one that says a
   document was malformed, or nothing where whoever reads is not the last to see the run.

:func:`read_result` reads the places of a local run; :func:`document_for_end` applies the
policy to them with a process's end (:class:`RunEnd`).
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import ValidationError

from model_support.config import RunConfig
from model_support.models import is_local_path, weights_digest
from model_support.records import ResultDocument, RunRecord, failure_document, record_from_document
from model_support.script import render_script

if TYPE_CHECKING:
    from model_support.sizing import Exclusion, Plan
from model_support.vocabulary import ErrorClass, ExclusionReason, Parallelism, Result

COMMIT = re.compile(r"[0-9a-f]{40}")
"""A Hub commit: 40 lowercase hex digits."""


class RevisionNotFound(ValueError):
    """The model has no such revision on the Hub."""


class ModelNotOnHub(ValueError):
    """No such model on the Hub (or it is private and the token cannot see it)."""


@dataclass(frozen=True)
class Pinned:
    """A config whose revision is pinned where it can be; ``note`` says why not otherwise."""

    config: RunConfig
    note: str | None = None


def is_pinned(config: RunConfig) -> bool:
    """A local checkpoint, or a Hub model at a commit."""
    return Path(config.model).is_dir() or bool(
        config.revision and COMMIT.fullmatch(config.revision)
    )


def pin_revision(config: RunConfig, *, token: str | None, endpoint: str | None = None) -> Pinned:
    """``config`` with its Hub revision resolved to the commit it names now.

    Local checkpoints and commits are kept (without a Hub request). A gated repository the
    token cannot open keeps its revision, with a note (sizing then excludes it: no weights can
    be read). Raises RevisionNotFound, ModelNotOnHub, or the transport error of a Hub that does
    not answer (``hub.is_unreachable``), which the caller retries or reports.
    """
    if is_pinned(config):
        return Pinned(config)
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from model_support.hub import hand_over_model_info, hub_api

    api = hub_api(endpoint, token)
    try:
        info = api.model_info(config.model, revision=config.revision)
    except GatedRepoError:
        return Pinned(config, f"{config.model} is gated and the token given cannot open it")
    except RevisionNotFoundError as exc:
        raise RevisionNotFound(
            f"{config.model!r} has no revision {config.revision!r} on the Hub"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotOnHub(
            f"{config.model!r} is not on the Hub (or is private): check the id, or set a token "
            "that can read it"
        ) from exc
    if not info.sha or not COMMIT.fullmatch(info.sha):
        return Pinned(config, f"the Hub named no commit for {config.model}@{config.revision}")
    hand_over_model_info(api, config.model, token, info)  # sizing reads this commit next
    return Pinned(config.model_copy(update={"revision": info.sha}))


@dataclass(frozen=True)
class Prepared:
    """A test ready to render: pinned, and sized (its plan), or excluded (why not)."""

    config: RunConfig  # the revision pinned; the planned cores and parallelism when it runs
    plan: Plan | None  # sizing's plan (None when excluded)
    exclusion: Exclusion | None  # sizing's reason not to run it
    revision_note: str | None = None  # why the revision is not a commit (see Pinned)


def prepare(
    config: RunConfig,
    *,
    profile: str,
    max_cores: int,
    lnc: int | None = None,
    cores: int | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    instance_type: str | None = None,
) -> Prepared:
    """Pin the revision, then size the test (``sizing.size_run``, the one sizing entry point):
    the config to render, or the exclusion to record. ``cores`` fixes the core count (with
    ``config.parallelism``): sizing then only says what it would refuse anyway.

    Raises what pin_revision and size_run raise (RevisionNotFound, ModelNotOnHub,
    sizing.MetadataError, a transport error): the CLI reports them, the operator classifies them.
    """
    from model_support.sizing import Exclusion, size_run

    pinned = pin_revision(config, token=token, endpoint=endpoint)
    config = pinned.config
    sized = size_run(
        config,
        profile=profile,
        lnc=lnc,
        max_cores=max_cores,
        cores=cores,
        token=token,
        endpoint=endpoint,
        instance_type=instance_type,
    )
    if isinstance(sized, Exclusion):
        return Prepared(config, None, sized, pinned.note)
    planned = config.model_copy(update={"cores": sized.cores, "parallelism": sized.parallelism})
    return Prepared(planned, sized, None, pinned.note)


def excluded_record(
    config: RunConfig,
    reason: ExclusionReason,
    message: str,
    *,
    source: str = "cli",
    labels: dict[str, str] | None = None,
    needed: tuple[int, Parallelism] | None = None,
) -> RunRecord:
    """A record for a model deliberately not run; holds the run.py that would have run.

    ``needed``: the cores (and split) sizing says a too-large model would need; the record's
    cores and its run.py then say so, so the script runs where that many cores exist.
    """
    now = datetime.now(UTC)
    if needed is not None:
        cores, parallelism = needed
        config = RunConfig.model_validate(
            {**config.model_dump(), "cores": cores, "parallelism": parallelism}
        )
    document = failure_document(
        config, Result.EXCLUDED, error_class=None, error=message, started_at=now
    )
    if is_local_path(config.model):
        document.weights_sha256 = weights_digest(config.model)
    record = record_from_document(document, render_script(config), source=source, labels=labels)
    return record.model_copy(update={"exclusion_reason": reason})


# ---- after run.py: what it left -> the document to record


@dataclass(frozen=True)
class Malformed:
    """run.py left a result document that does not validate."""

    where: str  # "result file" or "result line"
    problem: str


@dataclass(frozen=True)
class RunEnd:
    """How run.py's process ended, as whoever ran it saw it."""

    returncode: int | None
    seconds: float
    tail: list[str] = field(default_factory=list)  # the last lines of its output
    last_stage: str | None = None
    stopped: bool = False  # stopped from outside (a signal passed on to it), not by itself
    oom_killed: bool | None = None  # the kernel's own report (None: nothing here can tell)
    started_at: datetime | None = None


def read_result(path: Path, result_line: str | None) -> ResultDocument | Malformed | None:
    """The document run.py left: its result file, else its marked stdout line (None: neither)."""
    from model_support.records import parse_result_line

    if path.is_file():
        try:
            return ResultDocument.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            return Malformed("result file", _problem(exc))
    if result_line is None:
        return None
    try:
        return parse_result_line(result_line)
    except (ValueError, ValidationError) as exc:  # not JSON, or not a document
        return Malformed("result line", _problem(exc))


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return f"{exc.error_count()} error(s): {exc.errors()[0]['msg']}"
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


@dataclass(frozen=True)
class Unavailable:
    """What the run left cannot be read now (a store or API outage): nothing is decided yet."""

    reason: str


Found = ResultDocument | Malformed | Unavailable | None
"""What one place holds: a valid document, one that does not validate, nothing readable yet, or
nothing at all."""

Source = TypeVar("Source")


class End(Protocol):
    """How a run ended, as whoever reads what it left saw it (a process, a Job)."""

    def standing(self, config: RunConfig) -> ResultDocument | None:
        """The document the end proves whatever the run wrote (None: what it wrote decides)."""
        ...

    def without_document(
        self, config: RunConfig, malformed: list[Malformed]
    ) -> ResultDocument | Unavailable | None:
        """The document when the run left no valid one (``malformed``: those that did not
        validate, in order); None when this end cannot tell (whoever reads is not the last to
        see the run); Unavailable when it cannot tell yet."""
        ...


def document_for_run(
    config: RunConfig,
    places: Iterable[tuple[Source, Callable[[], Found]]],
    end: End,
    *,
    ended_by: Source,
) -> tuple[ResultDocument, Source] | Unavailable | None:
    """The document to record for a run of ``config``, and where it came from (``ended_by``:
    the end itself): the policy of the module docstring. ``places`` are read lazily, in order,
    and only until one decides."""
    standing = end.standing(config)
    if standing is not None:
        return standing, ended_by
    malformed: list[Malformed] = []
    for source, read in places:
        found = read()
        if isinstance(found, Unavailable):
            return found
        if isinstance(found, ResultDocument):
            return found, source
        if isinstance(found, Malformed):
            malformed.append(found)
    document = end.without_document(config, malformed)
    if document is None or isinstance(document, Unavailable):
        return document
    return document, ended_by


def document_for_end(
    config: RunConfig,
    found: ResultDocument | Malformed | None,
    end: RunEnd,
    *,
    final_word: bool,
) -> ResultDocument | None:
    """The document to record for a run of ``config`` that left ``found`` and ended as ``end``
    (:func:`document_for_run` with a process's end):

    - a valid document is recorded as run.py wrote it;
    - a malformed one is an ERROR (runtime) that says what was wrong with it;
    - none: an ERROR whose class is what the end proves: out-of-memory only when the kernel
      reported an OOM kill (``end.oom_killed``), otherwise runtime, with the exit status or
      signal and the output's tail.

    ``final_word``: whoever calls this is the last to see the run (the CLI). Inside a pod it is
    not: a run stopped from outside, or killed by SIGKILL with no OOM report here, says nothing
    true on its own (the Job's outcome and the container's OOMKilled reason do): None then.
    """
    chosen = document_for_run(
        config, [("run.py", lambda: found)], _ProcessEnd(end, final_word), ended_by="end"
    )
    assert not isinstance(chosen, Unavailable)  # a process's end always tells, or says it cannot
    return None if chosen is None else chosen[0]


@dataclass(frozen=True)
class _ProcessEnd:
    """A run.py process's end, seen by the process that ran it (the CLI, the runner pod)."""

    end: RunEnd
    final_word: bool

    def standing(self, config: RunConfig) -> ResultDocument | None:
        return None  # a process that ran to its end: what run.py wrote decides

    def without_document(
        self, config: RunConfig, malformed: list[Malformed]
    ) -> ResultDocument | None:
        return _process_end_document(config, self.end, malformed, final_word=self.final_word)


def _process_end_document(
    config: RunConfig, end: RunEnd, malformed: list[Malformed], *, final_word: bool
) -> ResultDocument | None:
    tail = "\n".join(end.tail[-30:])
    if malformed:
        found = malformed[0]
        return _error(
            config,
            end,
            ErrorClass.RUNTIME,
            f"run.py wrote a malformed result document ({found.where}: {found.problem}). "
            f"Output tail:\n{tail}",
        )
    killed = end.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    if end.oom_killed and killed:
        return _error(
            config,
            end,
            ErrorClass.OUT_OF_MEMORY,
            "run.py was killed by the kernel's OOM killer (its memory cgroup counted the kill) "
            f"without a result document (last stage: {end.last_stage or 'none'})",
        )
    if not final_word and (end.stopped or killed):
        return None
    if killed:
        why = (
            "run.py was killed by SIGKILL without a result document; the kernel reported no "
            "OOM kill here"
            if end.oom_killed is False
            else "run.py was killed by SIGKILL without a result document (whether memory ran "
            "out cannot be told here: see the kernel log)"
        )
    elif end.returncode is not None and end.returncode < 0:
        why = (
            f"run.py died of signal {signal.Signals(-end.returncode).name} without a result "
            "document"
        )
    else:
        why = f"run.py exited with status {end.returncode} without a result document"
    return _error(
        config,
        end,
        ErrorClass.RUNTIME,
        f"{why} (last stage: {end.last_stage or 'none'}). Output tail:\n{tail}",
    )


def _error(config: RunConfig, end: RunEnd, error_class: ErrorClass, error: str) -> ResultDocument:
    return failure_document(
        config,
        Result.ERROR,
        error_class=error_class,
        error=error,
        started_at=end.started_at,
        stage=end.last_stage,
        total_s=end.seconds,
    )


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup
    (cgroup v2 ``memory.events``, v1 ``memory.oom_control``); None where it cannot be read.

    Read before and after a run: a rise while run.py was killed by SIGKILL is the kernel's own
    report that memory ran out.
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidates += [f"/sys/fs/cgroup{path.rstrip('/')}/memory.events"]
            candidates += ["/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1
            candidates += [f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control"]
            candidates += ["/sys/fs/cgroup/memory/memory.oom_control"]
    for candidate in candidates:
        with contextlib.suppress(OSError, ValueError):
            for entry in Path(candidate).read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None
