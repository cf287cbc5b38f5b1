"""`model-support sweep`: a Hub ranking as ModelSupportTest manifests, for GitOps to apply."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from model_support.cli.commands_run import console, fail
from model_support.vocabulary import Task


def sweep(
    name: Annotated[
        str, typer.Argument(help="Sweep name (a DNS label); every test carries it as a label.")
    ],
    task: Annotated[Task, typer.Option(help="Hub pipeline task to rank.")] = Task.TEXT_GENERATION,
    sort: Annotated[str, typer.Option(help="Ranking: downloads or trending_score.")] = "downloads",
    limit: Annotated[int, typer.Option(help="How many top models.", min=1, max=1000)] = 50,
    profile: Annotated[
        str, typer.Option(help="Instance profile of every test (trn2, trn1, inf2, cpu).")
    ] = "trn2",
    max_cores: Annotated[int, typer.Option(help="Most cores sizing may choose per test.")] = 16,
    namespace: Annotated[str | None, typer.Option(help="Namespace of the resources.")] = None,
    token_secret: Annotated[
        str | None, typer.Option(help="Secret holding a Hub token (key 'token'), for gated models.")
    ] = None,
    compile_cache_source: Annotated[
        str | None,
        typer.Option(
            help="Compile cache to pull from (hf://buckets/..., s3://... or a path on the operator's cache volume)."
        ),
    ] = None,
    compile_cache_target: Annotated[
        str | None, typer.Option(help="Compile cache to push to after each run (same forms).")
    ] = None,
    results: Annotated[
        str | None, typer.Option(help="Results store of these tests (default: the operator's).")
    ] = None,
    queue_name: Annotated[str | None, typer.Option("--queue", help="Kueue queue name.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """Print one ModelSupportTest per model of a Hub ranking (multi-document YAML)."""
    import yaml

    from model_support.operator.spec import SpecError
    from model_support.operator.sweep import SweepOptions, sweep_manifests
    from model_support.rankings import RANKING_SORTS, RankingError, fetch_ranking

    if sort not in RANKING_SORTS:
        raise fail(f"--sort {sort!r}: use one of {', '.join(RANKING_SORTS)}")
    options = SweepOptions(
        name=name,
        profile=profile,
        namespace=namespace,
        token_secret=token_secret,
        compile_cache_source=compile_cache_source,
        compile_cache_target=compile_cache_target,
        results=results,
        queue_name=queue_name,
        max_cores=max_cores,
    )
    try:
        ranking = fetch_ranking(
            task.value,
            sort,
            limit=limit,
            endpoint=os.environ.get("HF_ENDPOINT"),
            token=os.environ.get("HF_TOKEN"),
        )
        manifests = sweep_manifests(ranking, options)
    except RankingError as exc:
        raise fail(str(exc)) from exc
    except (SpecError, ValueError) as exc:
        raise fail(str(exc)) from exc
    text = yaml.safe_dump_all(manifests, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        console.print(f"wrote {len(manifests)} tests of sweep {name!r} to {output}")


def register(app: typer.Typer) -> None:
    """Add sweep to the command line."""
    app.command()(sweep)
