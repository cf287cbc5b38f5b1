"""`model-support sweep`: a Hub ranking as ModelSupportTest manifests, for GitOps to apply."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from model_support.cli.common import console, fail
from model_support.printable import printable
from model_support.vocabulary import Task

if TYPE_CHECKING:
    from model_support.rankings import Ranking


def sweep(
    name: Annotated[
        str, typer.Argument(help="Sweep name (a DNS label); every test carries it as a label.")
    ],
    task: Annotated[Task, typer.Option(help="Hub pipeline task to rank.")] = Task.TEXT_GENERATION,
    sort: Annotated[
        str, typer.Option(help="Ranking: downloads, trending_score or likes.")
    ] = "downloads",
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
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Test these models (repeat) instead of a Hub ranking: nothing is fetched "
            "from the Hub to rank them (with --estimate, a local checkpoint folder is sized "
            "from its own files).",
        ),
    ] = None,
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate",
            help="Print instead the cores each model would take and the sweep's expected "
            "core-hours and cost (from past runs in --results, else a stated default).",
        ),
    ] = False,
    prices: Annotated[
        str | None,
        typer.Option(
            "--prices", help="Price table over the default one (docs/pricing.md), for --estimate."
        ),
    ] = None,
) -> None:
    """Print one ModelSupportTest per model of a Hub ranking (or of --model), multi-document
    YAML sorted by name, for clusters without the ModelSupportSweep CRD; with --estimate, what
    it would cost (past runs read from --results, which may be any folder or URI). A model
    whose test the API server would refuse (an id the CRD's pattern refuses) is skipped with a
    line saying why; the others are written."""
    import yaml

    from model_support.operator.spec import SpecError
    from model_support.operator.sweep import SweepOptions, sweep_manifests
    from model_support.rankings import RANKING_SORTS, RankingError, fetch_ranking

    if sort not in RANKING_SORTS:
        raise fail(f"--sort {sort!r}: use one of {', '.join(RANKING_SORTS)}")
    if output is not None and not estimate:
        check_output(output, f"{name}.yaml")
    if estimate and models:
        print_estimate(
            [(model, task.value) for model in dict.fromkeys(models)],
            profile=profile,
            max_cores=max_cores,
            results=results or "results",
            prices=prices,
        )
        return
    options = SweepOptions(
        name=name,
        profile=profile,
        namespace=namespace,
        token_secret=token_secret,
        compile_cache_source=compile_cache_source,
        compile_cache_target=compile_cache_target,
        # With --estimate, --results is where past runs are read here (a relative folder is
        # fine); only the manifests' store must be one the cluster can name.
        results=None if estimate else results,
        queue_name=queue_name,
        max_cores=max_cores,
    )
    try:
        ranking = (
            listed_ranking(models, task.value)
            if models
            else fetch_ranking(
                task.value,
                sort,
                limit=limit,
                endpoint=os.environ.get("HF_ENDPOINT"),
                token=os.environ.get("HF_TOKEN"),
            )
        )
        flat = sweep_manifests(ranking, options)
    except RankingError as exc:
        raise fail(str(exc)) from exc
    except (SpecError, ValueError) as exc:
        raise fail(str(exc)) from exc
    for skipped in flat.skipped:
        console.print(
            escape(
                f"skipped {skipped.model}: the API server would refuse its test ({skipped.reason})"
            ),
            style="yellow",
        )
    tested = {m["spec"]["model"] for m in flat.manifests}
    if estimate:
        print_estimate(
            [(m.model_id, task.value) for m in ranking.models if m.model_id in tested],
            profile=profile,
            max_cores=max_cores,
            results=results or "results",
            prices=prices,
        )
        return
    manifests = flat.manifests
    text = yaml.safe_dump_all(manifests, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        write_output(output, text)
        console.print(
            escape(
                f"wrote {len(manifests)} tests of sweep {name!r} to {output}"
                + (f" ({len(flat.skipped)} model(s) skipped)" if flat.skipped else "")
            )
        )


def listed_ranking(models: list[str], task: str) -> Ranking:
    """The models given on the command line as a ranking, in the order given (each once)."""
    from datetime import UTC, datetime

    from model_support.rankings import RankedModel, Ranking

    unique = list(dict.fromkeys(models))
    return Ranking(
        task=task,
        sort="downloads",
        endpoint="(the command line's --model list)",
        fetched_at=datetime.now(UTC),
        models=[RankedModel(rank=n, model_id=m) for n, m in enumerate(unique, 1)],
    )


def check_output(output: Path, example: str) -> None:
    """Refuse an --output that could not be written (a folder, or a folder that is missing)
    before anything is fetched."""
    if output.is_dir():
        raise fail(
            f"--output {output}: that is a folder; give a file in it, e.g. {output / example}"
        )
    folder = output.parent
    if not folder.is_dir():
        state = "is a file" if folder.exists() else "does not exist"
        raise fail(
            f"--output {output}: its folder {folder} {state}; give a file in an existing folder"
        )


def write_output(output: Path, text: str) -> None:
    """Write ``text`` to ``output`` whole or not at all: a failed write leaves what was there."""
    temp: str | None = None
    try:
        handle, temp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        # The mode a plain write would give: the file's own, or the default under the umask.
        umask = os.umask(0)
        os.umask(umask)
        mode = output.stat().st_mode & 0o777 if output.exists() else 0o666 & ~umask
        os.chmod(temp, mode)
        os.replace(temp, output)
        temp = None
    except OSError as exc:
        raise fail(
            f"cannot write --output {output}: {exc.strerror or exc}; nothing was written"
        ) from exc
    finally:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def print_estimate(
    models: list[tuple[str, str]], *, profile: str, max_cores: int, results: str, prices: str | None
) -> None:
    """Size every model and print the sweep's expected core-hours and cost (nothing applied)."""
    from model_support.estimate import DEFAULT_HOURS_BY_CORES, Sizing, estimate_sweep
    from model_support.history import money
    from model_support.hub import is_unreachable, unreachable_message
    from model_support.operator.spec import PROFILES
    from model_support.pricing import PriceTableError, load_prices
    from model_support.sizing import Plan, size_model
    from model_support.store import ResultsStore, StoreError

    try:
        table = load_prices(prices)
    except PriceTableError as exc:
        raise fail(str(exc)) from exc
    try:
        history = ResultsStore(results).history(
            columns=["model_id", "task", "neuron_cores", "held_s", "compiler"]
        )
    except (StoreError, OSError) as exc:
        raise fail(f"the past runs in {results!r} could not be read: {exc}") from exc
    neuron = PROFILES[profile].neuron if profile in PROFILES else True

    def size(model: str, task: str) -> Sizing:
        try:
            planned = size_model(
                model, profile=profile, max_cores=max_cores, task=task,
                token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"),
            )  # fmt: skip
        except ValueError as exc:
            return Sizing(None, f"cannot be sized: {exc}")
        except Exception as exc:
            if is_unreachable(exc):
                raise fail(unreachable_message(model, exc)) from exc
            raise
        if isinstance(planned, Plan):
            return Sizing(planned.cores)
        return Sizing(None, planned.reason.value)

    instance = PROFILES[profile].instance_type if profile in PROFILES else None
    from model_support.models import is_local_path, readable_model_id

    def id_of(model: str) -> str:
        return readable_model_id(model) if is_local_path(model) else model

    result = estimate_sweep(models, size, history, table, instance, neuron=neuron, id_of=id_of)
    typer.echo(printable(f"estimate: {len(models)} models on {profile}, past runs from {results}"))
    basis = {
        "model": "its {n} past run(s)",
        "cores": "{n} past run(s) on as many cores",
        "default": "the default",
        "excluded": "excluded: never run",
    }
    for m in result.models:
        cores = "-" if m.cores is None else f"{m.cores} core(s)"
        why = basis[m.basis].format(n=m.past_runs) + (f" ({m.excluded})" if m.excluded else "")
        typer.echo(
            printable(
                f"  {m.model}  {m.task}  {cores}  {m.hours:.2f} h each ({why})  "
                f"{m.core_hours:.2f} core-h  {money(m.cost_usd)}"
            )
        )
    rate = (
        f"{money(result.core_hour_usd)} per core-hour of {instance}"
        if result.core_hour_usd is not None
        else f"no price for {instance or 'this profile'} in the price table"
        if neuron
        else f"the {profile} profile runs off Neuron: its core-hours are not priced as Trainium's"
    )
    typer.echo(
        f"expected: {result.core_hours:.2f} core-hours, cost {money(result.cost_usd)} ({rate}); "
        f"the default where no past run exists: "
        + ", ".join(f"{h:g} h on up to {c} core(s)" for c, h in DEFAULT_HOURS_BY_CORES.items())
        + ", 2 h above"
    )


def register(app: typer.Typer) -> None:
    """Add sweep to the command line."""
    app.command()(sweep)
