"""The `model-support` command line (typer + rich). Each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="model-support",
    help="Test Hugging Face models on AWS Trainium (TorchNeuron), size them, record and browse results.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# Command modules register themselves on `app` when imported.
from model_support.cli import commands_run  # noqa: E402,F401
from model_support.cli import commands_demo  # noqa: E402,F401
from model_support.cli import commands_viewer  # noqa: E402

commands_viewer.register(app)
from model_support.cli import commands_size  # noqa: E402

commands_size.register(app)
