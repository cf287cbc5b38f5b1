"""`model-support run`, `script` and `results`: test a model here, show its run.py, list results."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape

from model_support.cli import run_cache
from model_support.cli.common import (
    DEFAULT_RESULTS,
    console,
    fail,
    open_store,
    plan_cores,
    positive_seconds,
    unreachable_hub,
)
from model_support.cli.run_output import print_record, print_results, summary
from model_support.config import COMPILE_BACKEND_PATTERN, RunConfig, VerificationConfig
from model_support.execution import StageEvent
from model_support.hardware import INSTANCE_KINDS
from model_support.models import BadModelReference, resolve_model
from model_support.records import RunRecord
from model_support.stop_signals import on_stop_signals
from model_support.vocabulary import (
    Backend,
    LocalizeMode,
    Parallelism,
    Result,
    Task,
)

if TYPE_CHECKING:
    from model_support.store import ResultsStore


ModelArg = Annotated[
    str, typer.Argument(help="Hub model id (org/name) or a local checkpoint directory.")
]
BackendOpt = Annotated[
    Backend, typer.Option(help="Device backend; auto = neuron, else cuda, else cpu.")
]
DtypeOpt = Annotated[str, typer.Option(help="Run dtype: bfloat16, float16 or float32.")]
TaskOpt = Annotated[Task, typer.Option(help="Hub pipeline task.")]
RevisionOpt = Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")]
CompileOpt = Annotated[
    str | None,
    typer.Option(
        "--compile-backend",
        help="torch.compile backend name or module:function (default: neuron / inductor).",
    ),
]
CoresOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Cores to shard over (default: sized from the model's metadata)."),
]
ParallelismOpt = Annotated[
    Parallelism | None,
    typer.Option(help="With --cores > 1: tensor or expert (default: from sizing)."),
]
InstanceOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Hardware profile for sizing ({', '.join(INSTANCE_KINDS)}; default: from the "
        "backend)."
    ),
]
LncOpt = Annotated[
    int | None, typer.Option(help="Logical NeuronCore config for sizing (trn2: 1 or 2).")
]
MaxCoresOpt = Annotated[int, typer.Option(min=1, help="Most cores sizing may choose.")]
LocalizeOpt = Annotated[
    LocalizeMode,
    typer.Option(
        help="When to search the first module whose compiled output diverges: on a FAIL, "
        "always, or never."
    ),
]
TokensOpt = Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens to generate.")]
RemoteOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow code from the model's repository.")
]


def pinned_or_exit(config: RunConfig) -> RunConfig:
    """``config`` with its Hub revision (a branch, a tag, or none) resolved to its commit by
    :func:`model_support.runpath.pin_revision`, or exit 2 saying why it cannot be.

    The stored run.py then names exactly the weights that were tested, and reruns of it load
    the same ones. A gated repository without access is left for sizing, which records it as
    EXCLUDED (gated-without-token).
    """
    from model_support.runpath import ModelNotOnHub, RevisionNotFound, is_pinned, pin_revision

    if is_pinned(config):
        return config  # before importing the Hub client: run.py starts only after this
    from model_support.hub import is_unreachable

    try:
        return pin_revision(
            config, token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT")
        ).config
    except (RevisionNotFound, ModelNotOnHub) as exc:
        raise fail(str(exc)) from exc
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise unreachable_hub(config.model, exc) from exc


def build_config(
    model: str,
    *,
    backend: Backend,
    dtype: str,
    task: Task,
    revision: str | None,
    compile_backend: str | None,
    cores: int | None,
    parallelism: Parallelism | None,
    max_new_tokens: int,
    trust_remote_code: bool,
    judge_model: Path | None = None,
    localize: LocalizeMode = LocalizeMode.ON_FAIL,
) -> RunConfig:
    """Validate the command line into a RunConfig (Hub revision pinned), or exit clearly."""
    try:
        ref = resolve_model(model)
    except BadModelReference as exc:
        raise fail(str(exc)) from exc
    if compile_backend is not None and ":" in compile_backend:
        module, _, function = compile_backend.partition(":")
        if not module or not function:
            raise fail(f"--compile-backend {compile_backend!r}: expected module:function")
    if compile_backend is not None and not re.fullmatch(COMPILE_BACKEND_PATTERN, compile_backend):
        raise fail(
            f"--compile-backend {compile_backend!r}: expected a backend name or module:function "
            "(letters, digits, '_' and '.'; what a ModelSupportTest accepts)"
        )
    if judge_model is not None and not (judge_model / "config.json").is_file():
        raise fail(
            f"--judge-model {str(judge_model)!r} is not a checkpoint directory (no config.json)"
        )
    n_cores = cores or 1
    if parallelism is None:
        parallelism = Parallelism.TENSOR if n_cores > 1 else Parallelism.NONE
    try:
        config = RunConfig(
            model=ref.value,
            revision=None if ref.is_local else revision,
            task=task,
            backend=backend,
            compile_backend=compile_backend,
            dtype=dtype,  # type: ignore[arg-type]
            max_new_tokens=max_new_tokens,
            trust_remote_code=trust_remote_code,
            judge_model=str(judge_model.resolve()) if judge_model else None,
            cores=n_cores,
            parallelism=parallelism,
            verification=VerificationConfig(localize=localize),
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise fail(f"invalid test parameters: {problems}") from exc
    return pinned_or_exit(config)


class StageProgress:
    """Prints run.py's stages as they happen; can hold them back, then replay or drop them."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self._lock = threading.Lock()
        self._held: list[StageEvent] | None = None

    def hold(self) -> None:
        """Buffer events from now on (the run may still be cancelled)."""
        with self._lock:
            self._held = []

    def release(self) -> None:
        """Print what was held and print events directly again."""
        with self._lock:
            held, self._held = self._held or [], None
            for event in held:
                self._print(event)

    def discard(self) -> None:
        """Drop what was held (the run was cancelled) and print directly again."""
        with self._lock:
            self._held = None

    def show(self, event: StageEvent) -> None:
        """The on_stage callback."""
        with self._lock:
            if self._held is not None:
                self._held.append(event)
            else:
                self._print(event)

    def _print(self, event: StageEvent) -> None:
        if self.quiet:
            return
        if event.status == "start":
            console.print(f"[cyan]→ {event.stage}[/]")
        elif event.status == "done":
            console.print(f"[green]✓ {event.stage}[/] [dim]{event.seconds:.2f} s[/]")
        else:
            console.print(f"[red]✗ {event.stage}[/] [dim]{escape(str(event.detail))}[/]")


class Stopped(BaseException):
    """SIGINT or SIGTERM reached the command: unwind (stopping run.py) and exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Stopped` in the main thread while the body runs.

    Every cleanup then runs as the exception unwinds: run.py's whole process group is killed
    and its temporary folder removed (run.py runs in a session of its own, so a terminal's
    Ctrl-C reaches only this process, which must stop it).
    """

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    with on_stop_signals(stop):
        yield


def given_cores_exclusion(
    config: RunConfig, instance: str | None, lnc: int | None
) -> RunRecord | None:
    """With --cores (no choice of cores), what sizing would refuse anyway: an unsupported task or
    architecture (a CTC speech model, an image encoder tagged feature-extraction), a model
    without safetensors weights, a gated one without a token. Sizing decides at the given
    cores, so both paths record the same EXCLUDED row with the same message; a size that does
    not fit is only a note there (the user chose the cores)."""
    planned = plan_cores(config, instance, lnc, max(config.cores, 1), cores=config.cores)
    return planned if isinstance(planned, RunRecord) else None


def save_record(store: ResultsStore, record: RunRecord, results: str) -> bool:
    """Store ``record`` and bring the matrix up to date; True when the record is stored.

    A record that cannot be stored is kept as a file on this machine (the current folder, or
    the temporary folder when that is not writable), and the error says where; a stored record
    whose matrix update failed is folded in by the next materialize.
    """
    try:
        store.add(record)
    except Exception as exc:  # whatever the store's failure, the result is kept and said where
        kept = keep_unsaved(record)
        console.print(
            "[bold red]error:[/] "
            + escape(
                f"could not record the result in {results} ({exc}). The record is kept in "
                f"{kept}: copy it to {results}/records/ when the store is back; the next run "
                "there adds it to the matrix"
            )
        )
        return False
    try:
        store.materialize()
    except Exception as exc:  # the record is stored: the next materialize folds it in
        console.print(
            "[bold yellow]warning:[/] "
            + escape(
                f"recorded {record.run_id} in {results}, but the matrix could not be updated "
                f"({exc}); the next run with --results {results} updates it"
            )
        )
    return True


def keep_unsaved(record: RunRecord) -> Path:
    """Write ``record`` as a local file (current folder, else the temporary folder); its path."""
    name = f"model-support-unsaved-{record.run_id}.json"
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        path = folder / name
        try:
            path.write_text(record.to_json(), encoding="utf-8")
        except OSError:
            continue
        return path
    raise OSError(f"could not write {name} in the current or the temporary folder")


def run(
    model: ModelArg,
    backend: BackendOpt = Backend.AUTO,
    dtype: DtypeOpt = "bfloat16",
    task: TaskOpt = Task.TEXT_GENERATION,
    revision: RevisionOpt = None,
    compile_backend: CompileOpt = None,
    cores: CoresOpt = None,
    parallelism: ParallelismOpt = None,
    max_new_tokens: TokensOpt = 32,
    trust_remote_code: RemoteOpt = False,
    localize: LocalizeOpt = LocalizeMode.ON_FAIL,
    judge_model: Annotated[
        Path | None,
        typer.Option(
            help="Local judge model directory: records whether the text is fluent English."
        ),
    ] = None,
    results: Annotated[
        str, typer.Option(help="Results store location (path or fsspec URI).")
    ] = DEFAULT_RESULTS,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Add a results store to an existing folder that holds other files "
            "(none of them is changed).",
        ),
    ] = False,
    compile_cache: Annotated[
        str | None,
        typer.Option(
            help="Compile cache root (path, s3://, hf://buckets/): pulled before, pushed after; "
            "the compiler prefix comes from the installed stack."
        ),
    ] = None,
    instance: InstanceOpt = None,
    lnc: LncOpt = None,
    max_cores: MaxCoresOpt = 16,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds before the run is stopped (TIMEOUT).", callback=positive_seconds
        ),
    ] = 3600.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (the run summary).")
    ] = False,
    model_id: Annotated[
        str | None,
        typer.Option(
            "--model-id",
            help="Name a local checkpoint in results (namespace/name; default local/<folder>).",
        ),
    ] = None,
) -> None:
    """Test one model here: load, compile, generate, verify; record the result."""
    from model_support.pricing import PriceTableError, load_prices

    try:
        prices = load_prices()  # $MODEL_SUPPORT_PRICES: refused before anything runs
    except PriceTableError as exc:
        raise fail(str(exc)) from exc
    name_record = record_namer(model, model_id)
    config = build_config(
        model,
        backend=backend,
        dtype=dtype,
        task=task,
        revision=revision,
        compile_backend=compile_backend,
        cores=cores,
        parallelism=parallelism,
        max_new_tokens=max_new_tokens,
        trust_remote_code=trust_remote_code,
        judge_model=judge_model,
        localize=localize,
    )
    untrusted = ["--trust-remote-code"] if trust_remote_code else []
    if compile_backend is not None and ":" in compile_backend:
        untrusted.append(f"--compile-backend {compile_backend}")
    cache = run_cache.before_run(compile_cache, config.backend, as_json, untrusted)
    try:
        with stopped_by_signals():
            store, record = _test(
                config, results, force, cores, instance, lnc, max_cores, timeout, as_json
            )
            record = name_record(run_cache.with_pull(cache, record))
            # Saved before the push: a stalled or stopped push never costs the result.
            stored = save_record(store, record, results)
    except Stopped as stop:
        console.print(
            f"[bold yellow]stopped ({stop}):[/] run.py and its workers were stopped; nothing "
            "was recorded"
        )
        raise typer.Exit(128 + stop.signum) from None
    try:
        record = run_cache.after_run(cache, record)
    except run_cache.PushStopped as stop:
        console.print(
            f"[bold yellow]stopped ({signal.Signals(stop.signum).name}):[/] the compile cache "
            f"push was given up; the result was {'recorded' if stored else 'kept'} before it"
        )
        raise typer.Exit(128 + stop.signum) from None
    if as_json:
        print(json.dumps(summary(record, prices)))
    else:
        print_record(record)
        if stored:
            console.print(f"[dim]recorded {escape(record.run_id)} in {escape(results)}[/]")
    if not stored:
        raise typer.Exit(1)
    if record.exclusion_reason is not None:
        raise typer.Exit(3)
    if record.document.result in (Result.ERROR, Result.TIMEOUT):
        raise typer.Exit(1)


def record_namer(model: str, model_id: str | None) -> Callable[[RunRecord], RunRecord]:
    """What gives a record of ``model`` the id chosen with --model-id (checked before anything
    runs or reaches the Hub)."""
    from model_support.models import check_model_id

    if model_id is None:
        return lambda record: record
    try:
        check_model_id(model_id)
    except BadModelReference as exc:
        raise fail(f"--model-id: {exc}") from exc
    try:
        local = resolve_model(model).is_local
    except BadModelReference as exc:
        raise fail(str(exc)) from exc
    if not local:
        raise fail(f"--model-id names local checkpoints; {model!r} is named by its Hub id")
    return lambda record: record.model_copy(update={"model_id": model_id})


def prepare_recording() -> None:
    """Import what recording the result needs while run.py still runs, not after it.

    pyarrow builds the matrix's arrays through pandas when pandas is installed (it imports it
    on first use: 0.3 s or more); run.py spends seconds in its own imports meanwhile.
    """
    import pandas  # noqa: F401


def _test(
    config: RunConfig,
    results: str,
    force: bool,
    cores: int | None,
    instance: str | None,
    lnc: int | None,
    max_cores: int,
    timeout: float,
    as_json: bool,
) -> tuple[ResultsStore, RunRecord]:
    """Check the store, size (unless ``cores``) and run the test; the store and the record
    (EXCLUDED when the model is not run)."""
    from model_support.execution import BackgroundRun, run_local

    progress = StageProgress(quiet=as_json)
    # run.py starts at once (it spends seconds importing torch and transformers); checking the
    # results store, the weights and sizing overlap with that. Its progress is held back until
    # they agree, so a refused or cancelled run shows nothing.
    progress.hold()
    background = BackgroundRun(config, timeout_s=timeout, on_stage=progress.show)
    try:
        store = open_store(results, allow_other_files=force)
        planned: RunConfig | RunRecord
        if cores is None:
            planned = plan_cores(config, instance, lnc, max_cores)
        else:
            planned = given_cores_exclusion(config, instance, lnc) or config
        if planned == config:
            progress.release()
            prepare_recording()
            return store, background.result()
    finally:
        # Whatever happened (a refusal, sizing chose otherwise, an error, a signal), the
        # speculative run and its process group are gone before this goes on; after its own
        # end, a no-op.
        background.cancel()
    progress.discard()
    if isinstance(planned, RunRecord):
        return store, planned
    if not as_json:
        console.print(
            f"[cyan]sized: {planned.cores} cores, {planned.parallelism.value} parallel[/]"
        )
    return store, run_local(planned, timeout_s=timeout, on_stage=progress.show)


def script(
    model: ModelArg,
    backend: BackendOpt = Backend.AUTO,
    dtype: DtypeOpt = "bfloat16",
    task: TaskOpt = Task.TEXT_GENERATION,
    revision: RevisionOpt = None,
    compile_backend: CompileOpt = None,
    cores: CoresOpt = None,
    parallelism: ParallelismOpt = None,
    max_new_tokens: TokensOpt = 32,
    trust_remote_code: RemoteOpt = False,
    localize: LocalizeOpt = LocalizeMode.ON_FAIL,
    instance: InstanceOpt = None,
    lnc: LncOpt = None,
    max_cores: MaxCoresOpt = 16,
) -> None:
    """Print the run.py a test of MODEL would run, sized unless --cores (save it, `python3 run.py`)."""
    from model_support.script import render_script

    config = build_config(
        model,
        backend=backend,
        dtype=dtype,
        task=task,
        revision=revision,
        compile_backend=compile_backend,
        cores=cores,
        parallelism=parallelism,
        max_new_tokens=max_new_tokens,
        trust_remote_code=trust_remote_code,
        localize=localize,
    )
    if cores is None:
        planned = plan_cores(config, instance, lnc, max_cores)
        if isinstance(planned, RunRecord):
            reason = planned.exclusion_reason.value if planned.exclusion_reason else "excluded"
            raise fail(f"{model!r} would not be run ({reason}): {planned.document.error}", 3)
        config = planned
    sys.stdout.write(render_script(config))


def results(
    location: Annotated[
        str, typer.Option("--results", help="Results store location.")
    ] = DEFAULT_RESULTS,
    model: Annotated[
        str | None, typer.Option(help="Only models whose id contains this text.")
    ] = None,
    result: Annotated[Result | None, typer.Option(help="Only this result.")] = None,
    compiler_version: Annotated[
        str | None, typer.Option(help="Only this compiler version.")
    ] = None,
    library_version: Annotated[
        str | None, typer.Option(help="Only this transformers version.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of rows.")] = False,
) -> None:
    """Show the results matrix (latest result per model and task, per stack)."""
    print_results(
        location,
        model=model,
        result=result,
        compiler_version=compiler_version,
        library_version=library_version,
        as_json=as_json,
    )


def register(app: typer.Typer) -> None:
    """Add run, script and results to the command line."""
    app.command()(run)
    app.command()(script)
    app.command()(results)
