"""`model-support doctor`: can this node run tests? A preflight that takes under a minute.

The checks are :mod:`model_support.doctor`'s: the node's own (run.py's, the same the runner
runs first, with the fallback setting, TorchNeuron's import and a smoke test on the device: a
tensor, one op, synchronize, in a process of its own with a timeout), the runtime library
against the host's driver, the devices as neuron-ls (or sysfs) reports them and who uses them,
the compile cache target's prefix, the results store and the Hub. Every failure names its fix;
a check with nothing to check on this machine (no Neuron device) is "n/a".

Exit codes: 0 every check passed, 1 at least one failed (the node cannot run tests), 2 bad input.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from model_support.doctor import SMOKE_TIMEOUT_S, all_checks
from model_support.neuron_node import PreflightCheck
from model_support.printable import DataConsole

EXIT_FAILED = 1


_STYLES = {"ok": "green", "FAILED": "bold red", "n/a": "dim"}


def _table(checks: list[PreflightCheck]) -> Table:
    table = Table(title="model-support doctor", show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for check in checks:
        status = Text(check.status, style=_STYLES[check.status])
        fix = Text(check.fix or "" if not check.ok and check.applicable else "")
        table.add_row(Text(check.name), status, Text(check.detail), fix)  # data, never markup
    return table


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""

    @app.command("doctor")
    def doctor(
        results: Annotated[
            str | None, typer.Option("--results", help="Results store to check for writing.")
        ] = None,
        compile_cache: Annotated[
            str | None,
            typer.Option("--compile-cache", help="Compile cache target whose prefix to check."),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option("--model", help="A Hub model to check access to (gated needs HF_TOKEN)."),
        ] = None,
        json_output: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
        smoke_timeout: Annotated[
            float,
            typer.Option(
                "--smoke-timeout", min=1.0, help="Seconds the device smoke test may take."
            ),
        ] = SMOKE_TIMEOUT_S,
    ) -> None:
        """Check that this node can run Trainium tests: devices (a smoke test on them),
        versions and their pairing, cores and LNC, caches, the results store and the Hub.
        Exit 1 when any check fails; each failure names its fix."""
        report = all_checks(results, compile_cache, model, smoke_timeout)
        if json_output:
            print(json.dumps(report.as_dict()))
        else:
            DataConsole().print(_table(report.checks))
        if not report.ok:
            raise typer.Exit(EXIT_FAILED)
