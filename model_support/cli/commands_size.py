"""`model-support size`: the fewest cores a model needs, from its metadata only.

Exit codes: 0 a plan, 3 an exclusion (the reason code is printed), 2 bad input.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from model_support.config import Dtype
from model_support.hardware import INSTANCE_KINDS
from model_support.printable import DataConsole

if TYPE_CHECKING:  # imported when the command runs: every command line starts faster
    from model_support.sizing import Exclusion, MemoryBreakdown, Plan

EXIT_EXCLUDED = 3
EXIT_BAD_INPUT = 2


def _gib(n: int) -> str:
    return f"{n / 1024**3:,.2f} GiB"


def _breakdown(mem: MemoryBreakdown, title: str) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("per core")
    table.add_column("bytes", justify="right")
    table.add_column("GiB", justify="right")
    rows = [
        ("weights, split", mem.weights_sharded),
        ("weights, whole on every core", mem.weights_replicated),
        ("KV cache", mem.kv_cache),
        ("workspace", mem.workspace),
        ("runtime reserve", mem.runtime_reserve),
        ("total", mem.total),
        ("capacity", mem.capacity),
        ("headroom", mem.headroom),
    ]
    for label, value in rows:
        table.add_row(label, f"{value:,}", _gib(value))
    return table


def _print_plan(out: Console, plan: Plan) -> None:
    out.print(
        f"[bold green]{escape(plan.model)}[/]: {plan.cores} core(s) of {plan.profile}, "
        f"parallelism [bold]{plan.parallelism.value}[/], {plan.parameters:,} parameters in "
        f"{plan.dtype}, batch {plan.batch} x {plan.max_length} tokens"
    )
    out.print(_breakdown(plan.memory, f"memory per core at degree {plan.degree}"))
    for note in plan.notes:
        out.print(f"[yellow]note:[/] {escape(note)}")


def _print_exclusion(out: Console, exclusion: Exclusion) -> None:
    out.print(f"[bold yellow]{escape(exclusion.model)}: excluded ({exclusion.reason.value})[/]")
    out.print(escape(exclusion.message))
    if exclusion.closest is not None:
        out.print(_breakdown(exclusion.closest, f"closest: degree {exclusion.closest.degree}"))


def register(app: typer.Typer) -> None:
    """Add the ``size`` command to ``app``."""

    @app.command("size")
    def size(
        model: Annotated[
            str, typer.Argument(help="Hub model id (org/name) or a local checkpoint directory.")
        ],
        revision: Annotated[
            str | None, typer.Option(help="Hub revision (branch, tag or commit).")
        ] = None,
        instance: Annotated[
            str, typer.Option(help=f"Hardware profile: {', '.join(INSTANCE_KINDS)}.")
        ] = "trn2",
        lnc: Annotated[
            int | None, typer.Option(help="trn2 logical core size, 1 or 2 (default 2).")
        ] = None,
        max_cores: Annotated[int, typer.Option(min=1, help="Most cores one test may use.")] = 16,
        dtype: Annotated[
            str, typer.Option(help=f"Run dtype: {', '.join(get_args(Dtype))}.")
        ] = "bfloat16",
        token: Annotated[
            str | None,
            typer.Option(envvar="HF_TOKEN", help="Hub token for gated repos.", show_default=False),
        ] = None,
        trust_remote_code: Annotated[
            bool, typer.Option("--trust-remote-code", help="Allow code from the repository.")
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the plan or exclusion as one JSON object.")
        ] = False,
    ) -> None:
        """Size MODEL: the fewest cores it fits on, or why it is excluded."""
        from model_support.hub import is_unreachable, unreachable_message
        from model_support.sizing import Plan, size_model

        out = DataConsole()
        err = DataConsole(stderr=True)
        try:
            result = size_model(
                model,
                revision,
                profile=instance,
                lnc=lnc,
                max_cores=max_cores,
                dtype=dtype,
                token=token,
                trust_remote_code=trust_remote_code,
            )
        except ValueError as e:  # bad arguments, unknown model/revision, unreadable checkpoint
            err.print(f"[bold red]error:[/] {escape(str(e))}")
            raise typer.Exit(EXIT_BAD_INPUT) from e
        except Exception as e:
            if not is_unreachable(e):
                raise
            err.print(f"[bold red]error:[/] {escape(unreachable_message(model, e))}")
            raise typer.Exit(EXIT_BAD_INPUT) from e
        if as_json:
            typer.echo(json.dumps(result.model_dump(mode="json")))
        elif isinstance(result, Plan):
            _print_plan(out, result)
        else:
            _print_exclusion(out, result)
        if not isinstance(result, Plan):
            raise typer.Exit(EXIT_EXCLUDED)
