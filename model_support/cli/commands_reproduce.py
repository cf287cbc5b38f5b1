"""`model-support reproduce`: a row's exact run.py, what to install, where to run it; --run reruns
it here and sets the new result beside the stored one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from model_support.cli.common import DEFAULT_RESULTS, fail, find_row, positive_seconds
from model_support.printable import DataConsole
from model_support.vocabulary import Result

if TYPE_CHECKING:
    pass

console = DataConsole(stderr=True)
out = DataConsole(highlight=False, soft_wrap=True)

EXIT_DISAGREE = 4
"""--run: the rerun's result or tokens differ from the stored row's."""


def reproduce(
    what: Annotated[str, typer.Argument(metavar="RUN_ID|MODEL", help="A run id, or a model id.")],
    location: Annotated[
        str, typer.Option("--results", help="Results store or dataset location.")
    ] = DEFAULT_RESULTS,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Folder to write run.py and requirements.txt to."),
    ] = None,
    rerun: Annotated[
        bool,
        typer.Option("--run", help="Run it here and print the new result beside the stored one."),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(help="--run: seconds before it is stopped.", callback=positive_seconds),
    ] = 3600.0,
    profile: Annotated[
        str | None,
        typer.Option(
            help="--run of an EXCLUDED row: the profile to size it for (default: the row's "
            "Neuron instance family, else this machine's backend)."
        ),
    ] = None,
) -> None:
    """Write a row's exact run.py and the packages it needs; print where and how to run it.
    --run runs it here and sets the new result beside the stored one; an EXCLUDED row (nothing
    ran) is sized again instead, its reason set beside the stored one."""
    from model_support.reproduce import NotReproducible, recipe
    from model_support.store import ResultsStore, StoreError

    try:
        store = ResultsStore(location)
    except StoreError as exc:
        raise fail(str(exc)) from exc
    row = find_row(store, what)
    try:
        plan = recipe(row)
    except NotReproducible as exc:
        raise fail(str(exc)) from exc
    folder = output or Path(f"reproduce-{plan.run_id}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run.py").write_text(plan.run_py, encoding="utf-8")
        (folder / "requirements.txt").write_text(plan.requirements_text(), encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write to {str(folder)!r}: {exc.strerror or exc}") from exc
    show_recipe(row, plan, folder)
    if rerun:
        if row.get("result") == Result.EXCLUDED.value:
            agree = recheck_sizing(row, plan.run_py, profile)
        else:
            agree = run_here(row, plan.run_py, folder, timeout)
        if not agree:
            raise typer.Exit(EXIT_DISAGREE)


def recheck_sizing(row: dict[str, Any], run_py: str, profile: str | None) -> bool:
    """An EXCLUDED row ran nothing: its check is sizing, done again here for the profile it
    was sized for (the row's Neuron instance family, else this machine's backend), and set
    beside the stored reason; True when sizing still excludes it for the same reason."""
    from model_support import hardware
    from model_support.cli.common import default_instance
    from model_support.hub import is_unreachable, unreachable_message
    from model_support.runpath import prepare
    from model_support.script import read_config

    config = read_config(run_py)
    instance = row.get("instance_type")
    family = hardware.instance_family(instance) if instance else None
    chosen = profile or (
        family if family in hardware.INSTANCE_KINDS else default_instance(config.backend)
    )
    console.print(f"[cyan]sizing it again for the {escape(chosen)} profile …[/]")
    try:
        prepared = prepare(
            config,
            profile=chosen,
            lnc=row.get("lnc"),
            max_cores=max(16, config.cores),
            token=os.environ.get("HF_TOKEN"),
        )
    except ValueError as exc:
        raise fail(f"cannot size {config.model!r} again: {exc}") from exc
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise fail(unreachable_message(config.model, exc)) from exc
    stored = row.get("exclusion_reason")
    table = Table(title=f"stored {row.get('run_id')} beside sizing it again here")
    for column in ("", "stored", "now"):
        table.add_column(column)
    if prepared.exclusion is not None:
        now_reason = prepared.exclusion.reason.value
        now_text = prepared.exclusion.message
    else:
        now_reason = None
        now_text = f"runs on {prepared.config.cores} core(s), {prepared.config.parallelism.value}"
    table.add_row("result", "EXCLUDED", "EXCLUDED" if now_reason else "would run")
    table.add_row("reason", escape(_cell(stored)), escape(_cell(now_reason)))
    table.add_row("why", escape(_cell(row.get("error"))), escape(now_text))
    out.print(table)
    if now_reason == stored:
        out.print(f"[bold green]they agree[/]: sizing still excludes it ({escape(str(stored))})")
        return True
    out.print(
        "[bold red]they differ[/]: "
        + escape(
            f"stored {stored}, now {now_reason or 'it would run'} (the model, its metadata or "
            "sizing changed since)"
        )
    )
    return False


def show_recipe(row: dict[str, Any], plan: Any, folder: Path) -> None:
    """What was written, the image and machine, and the commands."""
    out.print(
        f"[bold]{escape(plan.model_id)}[/] run {escape(plan.run_id)}: "
        f"{escape(str(row.get('result')))} ({escape(str(row.get('task')))})"
    )
    out.print(f"  wrote {escape(str(folder / 'run.py'))} (the exact run.py that ran)")
    out.print(
        f"  wrote {escape(str(folder / 'requirements.txt'))} "
        f"({len(plan.requirements)} pinned packages on top of the image)"
    )
    out.print(f"  image: {escape(plan.image)}")
    out.print(f"         [dim]{escape(plan.image_note)}[/]")
    machine = plan.instance or "any machine of the row's backend"
    lnc = f", LNC={plan.lnc} (NEURON_LOGICAL_NC_CONFIG)" if plan.lnc else ""
    out.print(f"  machine: {escape(machine)}, {plan.cores} core(s){escape(lnc)}")
    for note in plan.notes:
        out.print(f"  [yellow]note:[/] {escape(note)}")
    out.print("  commands:")
    for command in plan.commands(str(folder)):
        out.print(f"    {escape(command)}")


def run_here(row: dict[str, Any], run_py: str, folder: Path, timeout: float) -> bool:
    """Run run.py here (this Python, its packages), print the comparison; True if they agree."""
    from model_support.execution import run_script
    from model_support.reproduce import compare
    from model_support.script import read_config

    console.print("[cyan]running run.py here …[/]")
    document = run_script(run_py, read_config(run_py), timeout_s=timeout)
    (folder / "result.json").write_text(document.model_dump_json(indent=2), encoding="utf-8")
    comparison = compare(row, document)
    table = Table(title=f"stored {row.get('run_id')} beside the rerun here")
    for column in ("", "stored", "rerun"):
        table.add_column(column)
    for what, stored, new in comparison.figures:
        table.add_row(escape(what), escape(_cell(stored)), escape(_cell(new)))
    out.print(table)
    if comparison.agree:
        out.print("[bold green]they agree[/]: same result" + (" and tokens" if any(
            name == "tokens" for name, _, _ in comparison.figures) else ""))  # fmt: skip
    else:
        out.print("[bold red]they differ[/]: " + escape("; ".join(comparison.reasons)))
    out.print(f"  the rerun's document: {escape(str(folder / 'result.json'))}")
    return comparison.agree


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def register(app: typer.Typer) -> None:
    """Add reproduce to the command line."""
    app.command()(reproduce)
