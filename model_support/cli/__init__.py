"""The `model-support` command line (typer + rich). Each command group lives in its own module."""

from __future__ import annotations

import typer

from model_support.cli import (
    commands_acceptance,
    commands_bisect,
    commands_cache,
    commands_dataset,
    commands_demo,
    commands_doctor,
    commands_history,
    commands_operator,
    commands_render,
    commands_reproduce,
    commands_run,
    commands_size,
    commands_sweep,
    commands_viewer,
)

app = typer.Typer(
    name="model-support",
    help="Test Hugging Face models on AWS Trainium (TorchNeuron), size them, record and browse results.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

for _module in (
    commands_run,
    commands_size,
    commands_demo,
    commands_viewer,
    commands_operator,
    commands_render,
    commands_reproduce,
    commands_sweep,
    commands_cache,
    commands_dataset,
    commands_history,
    commands_bisect,
    commands_doctor,
    commands_acceptance,
):
    _module.register(app)
