"""What the command modules share: the consoles, how a command fails, opening the results
store, and sizing a run.

Each ``commands_*`` module is one command (or group) and imports from here, never from another
command module (tests/test_layers.py holds that).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from model_support.config import RunConfig
from model_support.printable import DataConsole
from model_support.records import RunRecord
from model_support.runpath import excluded_record
from model_support.vocabulary import Backend

if TYPE_CHECKING:
    from model_support.store import ResultsStore

console = DataConsole(stderr=True)


# Piped output (CI logs, `| less`) gets a wide table rather than 80 folded columns.
out = DataConsole(width=None if sys.stdout.isatty() else 160)


DEFAULT_RESULTS = "results"


def positive_seconds(value: float) -> float:
    """A typer callback: a time limit must be a finite number of seconds above zero."""
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(
            f"{value!r} is not a time limit: give a number of seconds greater than 0"
        )
    return value


NOT_DURABLE = {
    "memory": "memory:// keeps results only inside this command's process, so they are lost "
    "when it exits",
    "http": "http:// locations are read-only",
    "https": "https:// locations are read-only",
}


def open_store(location: str, *, allow_other_files: bool = False) -> ResultsStore:
    """The results store at ``location``, checked before anything runs: it must be durable,
    writable, and either new, empty or a results store already. Exits 2 with what to do."""
    from model_support.store import NotAResultsStore, ResultsStore, StoreError

    protocol = location.split("://", 1)[0].lower() if "://" in location else "file"
    if protocol in NOT_DURABLE:
        raise fail(
            f"--results {location!r}: {NOT_DURABLE[protocol]}; give a folder or a durable, "
            "writable URI (s3://bucket/path, hf://datasets/org/name)"
        )
    try:
        store = ResultsStore(location)
        store.check_location(allow_other_files=allow_other_files)
        store.check_writable()
    except NotAResultsStore as exc:
        raise fail(f"{exc} (pass --force to add a results store beside them)") from exc
    except StoreError as exc:
        raise fail(str(exc)) from exc
    return store


def default_instance(backend: Backend) -> str:
    """The sizing profile for a backend: trn2 where torch_neuronx imports, else cuda, else cpu."""
    if backend == Backend.NEURON:
        return "trn2"
    if backend in (Backend.CUDA, Backend.CPU):
        return backend.value
    if importlib.util.find_spec("torch_neuronx") is not None:
        return "trn2"
    if not torch_has_gpu_build():
        return "cpu"  # a CPU-only torch never sees a GPU: no need to import it (seconds of CPU)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_has_gpu_build() -> bool:
    """Whether the installed torch was built for CUDA or ROCm, read from its ``torch/version.py``
    (``cuda`` / ``hip``) without importing torch, which costs seconds of CPU that run.py,
    started beside sizing, needs for the same import. True when that cannot be told."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return True  # no torch here: let the import below say so
    version_file = Path(spec.origin).with_name("version.py")
    build = importlib.util.spec_from_file_location("_model_support_torch_build", version_file)
    if build is None or build.loader is None:
        return True
    module = importlib.util.module_from_spec(build)
    try:
        build.loader.exec_module(module)
    except (OSError, SyntaxError, ImportError):
        return True
    return bool(getattr(module, "cuda", True) or getattr(module, "hip", True))


def plan_cores(
    config: RunConfig,
    instance: str | None,
    lnc: int | None,
    max_cores: int,
    cores: int | None = None,
) -> RunConfig | RunRecord:
    """Size the model: the config with the planned cores, or an EXCLUDED record (not yet stored).
    With ``cores`` (given by the user) sizing decides at those cores."""
    from model_support.hub import is_unreachable
    from model_support.runpath import prepare

    try:
        # The same path as the operator's (runpath.prepare), fed from the same config.
        prepared = prepare(
            config,
            profile=instance or default_instance(config.backend),
            lnc=lnc,
            max_cores=max_cores,
            cores=cores,
            token=os.environ.get("HF_TOKEN"),
        )
    except ValueError as exc:
        raise fail(f"cannot size {config.model!r}: {exc}") from exc
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise unreachable_hub(config.model, exc) from exc
    if prepared.exclusion is not None:
        exclusion = prepared.exclusion
        return excluded_record(
            prepared.config, exclusion.reason, exclusion.message, needed=exclusion.needed_split
        )
    return prepared.config


def unreachable_hub(model: str, exc: BaseException) -> typer.Exit:
    """The error for a Hub that does not answer, naming the endpoint tried."""
    from model_support.hub import unreachable_message

    return fail(unreachable_message(model, exc))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a clear error and return the exit to raise."""
    # Never hard-wrapped: a path or command in the message must copy whole.
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def reading_store(location: str, code: int = 2) -> Iterator[None]:
    """Say in one line, and exit ``code``, when the results store at ``location`` cannot be
    read: what the store refused (:class:`StoreError`), or the storage itself failing (no
    credentials, access denied, its endpoint down). Anything else surfaces as itself."""
    from model_support.storage_errors import access_failure_reason, is_store_error
    from model_support.store import StoreError

    try:
        yield
    except StoreError as exc:
        raise fail(str(exc), code) from exc
    except Exception as exc:
        if not is_store_error(exc):
            raise
        raise fail(
            f"could not read the results store {location!r}: {access_failure_reason(exc)}", code
        ) from exc


def open_history(location: str) -> ResultsStore:
    """The store at ``location``, refused when it holds no history to read: exit 2 for no
    results at all (a wrong location is bad input, as for `results`), 1 for a store whose
    history was never built (materialize builds it)."""
    from model_support.store import ResultsStore

    with reading_store(location):
        store = ResultsStore(location)
        if not store.fs.exists(store.history_path()):
            if store.matrix_files():
                raise fail(
                    f"the results at {location!r} have no history yet (stored before histories "
                    f"were kept): run `model-support dataset materialize --results {location}` "
                    "or any new test to build it",
                    1,
                )
            records = store.record_count()
            if records:
                raise fail(
                    f"the results at {location!r} hold {records} record(s) but no history yet "
                    f"(never materialized): run `model-support dataset materialize --results "
                    f"{location}` to build it",
                    1,
                )
            raise fail(
                f"no results at {location!r}: give the results store with --results, or first "
                f"run `model-support run MODEL --results {location}`"
            )
    return store


ROW_COLUMNS = [
    "run_id",
    "model_id",
    "model_path",
    "task",
    "backend",
    "compile_backend",
    "result",
    "error_class",
    "error",
    "exclusion_reason",
    "neuron_cores",
    "lnc",
    "instance_type",
    "stack",
    "packages",
    "run_py",
    "verification_json",
    "recorded_at",
]


def find_row(store: ResultsStore, what: str) -> dict[str, Any]:
    """The row to reproduce: the run ``what`` (its record, or its matrix row), else the one
    matrix row of the model ``what``. Exits 2 naming the choices when the model has several."""
    from model_support.dataset import record_to_row
    from model_support.store import RecordNotFound, StoreError

    try:
        return record_to_row(store.get(what))
    except (RecordNotFound, ValueError):
        pass  # not a run id of a stored record: a published dataset holds rows only
    except StoreError as exc:
        raise fail(str(exc)) from exc
    try:
        frame = store.matrix(columns=ROW_COLUMNS)
    except StoreError as exc:
        raise fail(str(exc)) from exc
    matches = frame[(frame["run_id"] == what) | (frame["model_id"] == what)]
    if matches.empty:
        raise fail(
            f"{what!r} is neither a run id nor a model id of {store.uri}: "
            f"`model-support results --results {store.uri}` lists them",
            1,
        )
    if len(matches) > 1:
        choices = "; ".join(
            f"{row.run_id} ({row.task}, {row.compile_backend}, {row.result})"
            for row in matches.itertuples(index=False)
        )
        raise fail(f"{what!r} has {len(matches)} rows: name one by its run id: {choices}")
    from model_support.reproduce import plain_row

    return plain_row(matches.iloc[0].to_dict())
