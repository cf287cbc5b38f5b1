"""`model-support dataset publish`: the results dataset to a Hub dataset repository, one commit."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.markup import escape

from model_support.printable import DataConsole

console = DataConsole(stderr=True)

dataset_app = typer.Typer(
    name="dataset",
    help="Publish the results dataset (matrix, card, selected list); bring its matrix and "
    "history up to date.",
    no_args_is_help=True,
)


@dataset_app.command("publish")
def publish_command(
    repo: Annotated[str, typer.Argument(help="The dataset repository: hf://datasets/ORG/NAME.")],
    results: Annotated[
        str, typer.Option(help="Results store location (path or fsspec URI).")
    ] = "results",
    message: Annotated[str | None, typer.Option(help="Commit message.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Materialize the matrix, then commit the Parquet files, the card and the selected list at once."""
    from huggingface_hub.errors import HfHubHTTPError

    from model_support.hub import is_unreachable
    from model_support.publish import PublishError, publish

    endpoint = os.environ.get("HF_ENDPOINT")
    try:
        report = publish(
            results, repo, endpoint=endpoint, token=os.environ.get("HF_TOKEN"), message=message
        )
    except PublishError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    except HfHubHTTPError as exc:
        console.print(
            f"[bold red]error:[/] {escape(f'the Hub refused the publish to {repo}: {exc}')}"
        )
        raise typer.Exit(1) from exc
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        where = endpoint or "https://huggingface.co"
        console.print(
            "[bold red]error:[/] "
            + escape(f"could not reach the Hub at {where} to publish {repo}: {exc}")
        )
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps(report.__dict__))
        return
    if report.commit is None:
        console.print(
            escape(f"{report.repo_id} already holds this dataset (head {report.head[:12]})")
            + ": nothing to commit"
        )
    else:
        console.print(
            escape(
                f"published {len(report.files)} files to {report.repo_id} in commit "
                f"{report.commit[:12]}"
            )
            + (f", removed {len(report.deleted)} stale" if report.deleted else "")
            + (
                f" ({report.attempts - 1} concurrent commit(s) retried)"
                if report.attempts > 1
                else ""
            )
        )


@dataset_app.command("materialize")
def materialize_command(
    results: Annotated[
        str, typer.Option(help="Results store location (path or fsspec URI).")
    ] = "results",
    rebuild: Annotated[
        bool, typer.Option(help="Rebuild every derived file from the records.")
    ] = False,
) -> None:
    """Bring the matrix, the dataset card and the history up to date with the records (what
    every recorded run does; needed only for a store written before a derived file existed)."""
    from model_support.cli.common import reading_store
    from model_support.store import ResultsStore

    with reading_store(results):
        paths = ResultsStore(results).materialize(rebuild=rebuild)
    console.print(f"materialized {len(paths) - 1} matrix file(s) and the history", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `dataset` command group."""
    app.add_typer(dataset_app)
