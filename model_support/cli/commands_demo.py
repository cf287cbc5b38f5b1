"""`model-support demo`: build tiny checkpoints, test them here, and write a dataset that shows
every state the results can hold (PASS, FAIL, ERROR, EXCLUDED) over four compiler stacks, two
of them successive releases of a faulty compiler (a regression and a fix between them)."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from model_support.checkpoints import TASK_MODELS
from model_support.cli.common import plan_cores
from model_support.cli.run_output import print_record, print_results
from model_support.printable import DataConsole
from model_support.records import RunRecord
from model_support.stop_signals import on_stop_signals

if TYPE_CHECKING:
    from model_support.checkpoints import DemoModel
    from model_support.execution import StageEvent
    from model_support.store import ResultsStore

DEMO_NAMESPACE = "demo"
"""Demo checkpoints are named ``demo/<name>`` in results (their paths stay in ``model_path``)."""
DEMO_NAMES = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-llava"]
DEMO_NAMES += [model.name for model in TASK_MODELS]  # one per task family beyond text generation
OLDER_RELEASE = "model_support.faults:moe_crash_compiler"
"""A faulty compiler's release: crashes on mixture of experts (ERROR), dense models PASS."""
NEWER_RELEASE = "model_support.faults:dense_miscompiler"
"""Its next release: mixture of experts fixed (PASS), dense models miscompiled (FAIL)."""

# Progress goes to stderr one line at a time, also when it is not a terminal (CI logs, pipes);
# soft wrapping keeps each line whole instead of folding it at 80 columns.
progress = DataConsole(stderr=True, soft_wrap=True)


@dataclass(frozen=True)
class DemoRun:
    """One test of the demo: which checkpoint, with which compiler, and what it shows."""

    model: DemoModel
    compile_backend: str
    shows: str

    @property
    def model_id(self) -> str:
        return f"{DEMO_NAMESPACE}/{self.model.name}"

    @property
    def label(self) -> str:
        return f"{self.model_id} · {self.compile_backend}"


def plan_runs(models: dict[str, DemoModel], main: str, second: str | None) -> list[DemoRun]:
    """Every model on the main compiler; one on a second compiler; two on each of two releases
    of a faulty compiler, the older one first.

    The second compiler comes first: inductor compiles for about a minute on 2 cores, and the
    other runs fit beside it. The releases run last and in order, so the newer one is the
    newest stack: `model-support regressions` compares them by default.
    """
    runs = []
    if second:
        runs.append(DemoRun(models["tiny-llama"], second, "a second compiler, to compare"))
    runs += [DemoRun(models[name], main, "the main stack") for name in DEMO_NAMES]
    runs += [
        DemoRun(models["tiny-llama"], OLDER_RELEASE, "a faulty compiler's release: PASS"),
        DemoRun(models["tiny-qwen3-moe"], OLDER_RELEASE, "ERROR: the compiler crashes"),
        DemoRun(
            models["tiny-llama"], NEWER_RELEASE, "its next release: FAIL (a regression, caught)"
        ),
        DemoRun(models["tiny-qwen3-moe"], NEWER_RELEASE, "its next release: PASS (a fix)"),
    ]
    return runs


def _refuse(message: str) -> typer.Exit:
    """Say what was wrong with the command line (nothing has run) and exit 2."""
    DataConsole(stderr=True).print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(2)


def demo(
    location: Annotated[str, typer.Option("--results", help="Results store location.")] = "results",
    models_dir: Annotated[
        Path | None,
        typer.Option(
            "--models-dir", help="Where the demo checkpoints are built (default: the cache)."
        ),
    ] = None,
    compile_backend: Annotated[
        str,
        typer.Option("--compile-backend", help="The main stack's torch.compile backend."),
    ] = "aot_eager",
    second_backend: Annotated[
        str | None,
        typer.Option(
            "--second-backend",
            help="A second compiler for one model, to compare stacks (default: inductor, or "
            "aot_eager when inductor is the main one; '' for none).",
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            min=1, help="Tests (and checkpoint builds) run at once (default: 2, or 1 on one CPU)."
        ),
    ] = min(2, os.cpu_count() or 1),
    timeout: Annotated[float, typer.Option(help="Seconds per model before TIMEOUT.")] = 900.0,
) -> None:
    """Build tiny Llama, Qwen3, Qwen3-MoE and Llava checkpoints, one per other task family
    (embeddings, seq2seq, speech, classification, text-to-image) and a header-only 405B one,
    test them on four compiler stacks (two releases of a deliberately faulty one, with a
    regression and a fix between them), and print the results table."""
    from model_support.checkpoints import default_cache_dir
    from model_support.store import ResultsStore

    if not (math.isfinite(timeout) and timeout > 0):
        raise _refuse(f"--timeout {timeout:g}: give a positive number of seconds")
    if "://" not in location and Path(location).exists() and not Path(location).is_dir():
        raise _refuse(f"--results {location}: that is a file; give a folder (or a store URI)")
    started = time.monotonic()
    store = ResultsStore(location)
    dest = models_dir or default_cache_dir()
    models, oversized = build_checkpoints(dest, jobs)
    if second_backend is None:
        second_backend = "aot_eager" if compile_backend == "inductor" else "inductor"
    second = second_backend if second_backend and second_backend != compile_backend else None
    runs = plan_runs(models, compile_backend, second)

    say(f"testing the demo models: {len(runs)} runs, {jobs} at a time")
    cancel = threading.Event()
    # Tiny models: more than one intra-op thread per run only adds contention.
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with stopped_by_signals(), ThreadPoolExecutor(jobs, thread_name_prefix="demo") as pool:
        try:
            futures = [pool.submit(run_one, run, timeout, env, cancel) for run in runs]
            excluded = size_oversized(oversized, compile_backend)  # while the runs start
            store.add(excluded)
            print_record(excluded)
            for future in as_completed(futures):
                record = future.result()
                store.add(record)
                print_record(record)
        except BaseException:
            # Ctrl-C, SIGTERM or a failure: start no more runs, stop the running ones (their
            # whole process groups) now.
            pool.shutdown(wait=False, cancel_futures=True)
            cancel.set()
            raise
    store.materialize()
    confirm_regressions(store, timeout)
    write_selection(location, [models[name] for name in DEMO_NAMES], excluded.model_id)
    print_results(location)
    say(
        f"demo done in {time.monotonic() - started:.0f} s; browse it: model-support viewer "
        f"--results {location}; the faulty compiler's next release at a glance: model-support "
        f"report --results {location}; what it changed: model-support regressions --results "
        f"{location}"
    )


def confirm_regressions(store: ResultsStore, timeout: float) -> None:
    """Re-run what got worse between the faulty compiler's two releases until the default
    confirmation policy holds (as `regressions --confirm` does), so the demo's regression is
    a confirmed one, as a release team would report it."""
    from model_support.confirm import Rerun, confirm_here
    from model_support.history import (
        Confirmation,
        Thresholds,
        find_stack,
        read_stack_runs,
        read_stacks,
        regressions,
    )
    from model_support.pricing import DEFAULT_PRICES

    known = read_stacks(store)
    older, newer = find_stack(OLDER_RELEASE, known), find_stack(NEWER_RELEASE, known)
    policy = Confirmation()
    report = regressions(
        read_stack_runs(store, [older, newer]), older, newer, Thresholds(), DEFAULT_PRICES,
        confirmation=policy,
    )  # fmt: skip
    pending = [c for c in report.unconfirmed if c.kind == "regression"]
    if not pending:
        return
    say(
        f"confirming {len(pending)} regression(s) of the next release: {policy.reruns} re-run(s) "
        "each, as `model-support regressions --confirm` does"
    )

    def show(rerun: Rerun) -> None:
        agrees = "agrees" if rerun.agrees else "disagrees (flaky)"
        say(f"re-ran {rerun.change.model}: {rerun.record.document.result.value}, {agrees}")

    confirm_here(store, report, policy, timeout_s=timeout, on_rerun=show)


def say(text: str) -> None:
    """One progress line on stderr."""
    progress.print(f"[bold]demo:[/] {escape(text)}", highlight=False)


def build_checkpoints(dest: Path, workers: int) -> tuple[dict[str, DemoModel], Path]:
    """The demo checkpoints (built or reused) and the header-only 405B one.

    Missing ones are built ``workers`` at a time, each in a process of its own training on one
    thread (a line as each is done); a stop signal ends the builders with the demo.
    """
    from model_support.checkpoints import (
        LLAMA_3_1_405B_CONFIG,
        OVERSIZED_DEMO_NAME,
        build_demo_models,
        build_header_only_checkpoint,
        checkpoint_dir,
        is_up_to_date,
        llama_tensors,
    )
    from model_support.checkpoints import demo_model as catalogue_entry

    entries = [catalogue_entry(name) for name in DEMO_NAMES]
    missing = [e.name for e in entries if not is_up_to_date(e, checkpoint_dir(dest, e))]
    if missing:
        workers = max(1, min(workers, len(missing)))
        say(
            f"building {len(missing)} checkpoints in {dest}, {workers} at a time (each trained "
            "briefly: 10 to 90 s)"
        )
        context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
        with stopped_by_signals(), context.Pool(workers) as pool:
            try:
                for name, seconds in pool.imap_unordered(
                    build_in_worker, [(dest, n) for n in missing]
                ):
                    say(f"built {name} in {seconds:.0f} s")
            except BaseException:
                pool.terminate()  # a stop signal or a failed build: no builder outlives the demo
                raise
    models = {model.name: model for model in build_demo_models(dest, DEMO_NAMES)}
    oversized = build_header_only_checkpoint(
        dest, OVERSIZED_DEMO_NAME, LLAMA_3_1_405B_CONFIG, llama_tensors(LLAMA_3_1_405B_CONFIG)
    )
    say(f"checkpoints ready in {dest}")
    return models, oversized


def build_in_worker(job: tuple[Path, str]) -> tuple[str, float]:
    """Build one demo checkpoint (in a worker process); its name and the seconds it took."""
    from transformers.utils import logging as transformers_logging

    from model_support.checkpoints import build_demo_models

    transformers_logging.disable_progress_bar()  # the demo's lines say what is happening
    dest, name = job
    start = time.monotonic()
    build_demo_models(dest, [name])
    return name, time.monotonic() - start


def size_oversized(path: Path, compile_backend: str) -> RunRecord:
    """Size the header-only 405B checkpoint for this machine: an EXCLUDED (too-large) record."""
    from model_support.config import RunConfig
    from model_support.models import readable_model_id

    config = RunConfig(model=str(path), compile_backend=compile_backend)
    say(f"sizing {path.name} (safetensors headers only: 405B parameters)")
    planned = plan_cores(config, None, None, max_cores=16)
    if not isinstance(planned, RunRecord):
        raise RuntimeError(f"{path} should not fit this machine, yet sizing planned {planned}")
    model_id = readable_model_id(str(path), namespace=DEMO_NAMESPACE)
    return planned.model_copy(
        update={"model_id": model_id, "source": "demo", "labels": {"demo": path.name}}
    )


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT) and SIGTERM stop the demo and so its runs."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    with on_stop_signals(stop):
        yield


def run_one(
    run: DemoRun, timeout: float, env: dict[str, str], cancel: threading.Event
) -> RunRecord:
    """One demo test through ``model-support run``'s machinery (sized, then run.py), named
    ``demo/<name>``."""
    from model_support.config import RunConfig
    from model_support.execution import run_local

    config = RunConfig(
        model=str(run.model.require_path()),
        task=run.model.task,
        compile_backend=run.compile_backend,
    )
    planned = plan_cores(config, None, None, max_cores=16)
    labels = {"demo": run.model.name}
    if isinstance(planned, RunRecord):  # sizing refused it: recorded, not run
        return planned.model_copy(
            update={"model_id": run.model_id, "source": "demo", "labels": labels}
        )

    def show(event: StageEvent) -> None:
        if event.status == "start":
            progress.print(f"  {escape(run.label)}: {event.stage} …", highlight=False)
        elif event.status == "done":
            progress.print(
                f"  {run.label}: {event.stage} done in {event.seconds or 0:.1f} s", highlight=False
            )
        else:
            progress.print(f"  {escape(run.label)}: {event.stage} failed", highlight=False)

    say(f"testing {run.label} ({run.shows})")
    record = run_local(
        planned,
        timeout_s=timeout,
        env=env,
        source="demo",
        labels=labels,
        on_stage=show,
        cancel=cancel,
    )
    return record.model_copy(update={"model_id": run.model_id})


def write_selection(location: str, models: list[DemoModel], oversized_id: str) -> None:
    """List the demo models as the dataset's selected models, unless a list is already kept there."""
    from model_support.selection import SelectedEntry, SelectedList, load_selected, save_selected

    existing, _ = load_selected(location)
    if existing is None:
        entries = [SelectedEntry(model=f"{DEMO_NAMESPACE}/{m.name}", task=m.task) for m in models]
        entries.append(SelectedEntry(model=oversized_id))
        save_selected(location, SelectedList(models=entries))


def register(app: typer.Typer) -> None:
    """Add demo to the command line."""
    app.command()(demo)
