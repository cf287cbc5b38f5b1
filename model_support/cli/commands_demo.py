"""`model-support demo`: build the tiny demo checkpoints, test each here, show the results."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from model_support.cli.commands_run import console, print_record, results

if TYPE_CHECKING:
    from model_support.checkpoints import DemoModel


def demo(
    location: Annotated[str, typer.Option("--results", help="Results store location.")] = "results",
    models_dir: Annotated[
        Path | None,
        typer.Option(
            "--models-dir", help="Where the demo checkpoints are built (default: the cache)."
        ),
    ] = None,
    compile_backend: Annotated[
        str | None,
        typer.Option("--compile-backend", help="torch.compile backend (default: inductor on CPU)."),
    ] = "aot_eager",
    timeout: Annotated[float, typer.Option(help="Seconds per model before TIMEOUT.")] = 900.0,
) -> None:
    """Build tiny Llama, Qwen3, Qwen3-MoE and Llava checkpoints and one per other task family
    (embeddings, seq2seq, speech, classification, text-to-image), test each, print the table."""
    from model_support.checkpoints import TASK_MODELS, build_demo_models, default_cache_dir
    from model_support.config import RunConfig
    from model_support.execution import run_local
    from model_support.store import ResultsStore

    store = ResultsStore(location)
    dest = models_dir or default_cache_dir()
    names = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-llava"]
    # One model of each task family beyond text generation (issue 13).
    names += [model.name for model in TASK_MODELS]
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the status line says what is happening
    with console.status(f"building demo checkpoints in {dest} (first time: about a minute)"):
        models = build_demo_models(dest, names)
    for model in models:
        config = RunConfig(
            model=str(model.require_path()), task=model.task, compile_backend=compile_backend
        )
        with console.status(f"testing {model.name} ({model.description})"):
            record = run_local(
                config, timeout_s=timeout, source="demo", labels={"demo": model.name}
            )
        store.add(record)
        print_record(record)
    store.materialize()
    write_selection(location, models)
    results(
        location=location,
        model=None,
        result=None,
        compiler_version=None,
        library_version=None,
        as_json=False,
    )


def write_selection(location: str, models: list[DemoModel]) -> None:
    """List the demo models as the dataset's selected models, unless a list is already kept there."""
    from model_support.selection import SelectedEntry, SelectedList, load_selected, save_selected

    existing, _ = load_selected(location)
    if existing is None:
        entries = [SelectedEntry(model=str(m.require_path()), task=m.task) for m in models]
        save_selected(location, SelectedList(models=entries))


def register(app: typer.Typer) -> None:
    """Add demo to the command line."""
    app.command()(demo)
