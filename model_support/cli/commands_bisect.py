"""`model-support bisect`: which package change broke a model, down to its first bad version."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from model_support.cli.common import (
    DEFAULT_RESULTS,
    fail,
    find_row,
    open_history,
    open_store,
    positive_seconds,
    reading_store,
)
from model_support.printable import DataConsole, printable

if TYPE_CHECKING:
    from model_support.bisect import Plan
    from model_support.store import ResultsStore

err = DataConsole(stderr=True, soft_wrap=True, highlight=False)

SIDE_HELP = (
    "its label, 'compiler version', the compiler version, the compiler alone, or a run id of "
    "the model"
)


def steps_location(results: str) -> str:
    """Where a bisect's steps are recorded by default: ``bisect/`` under the results store."""
    from model_support.bisect import STEPS_FOLDER

    if "://" in results:
        return results.rstrip("/") + "/" + STEPS_FOLDER
    return os.path.join(results, STEPS_FOLDER)


def default_workdir() -> Path:
    """Where the steps' environments are kept (``$MODEL_SUPPORT_CACHE``'s parent's, or
    ~/.cache/model-support/bisect-envs)."""
    from model_support.checkpoints import default_cache_dir

    return default_cache_dir().parent / "bisect-envs"


def side_row(
    store: ResultsStore, model: str, task: str | None, side: str, what: str
) -> dict[str, Any]:
    """The row of ``model`` that ``what`` names: its latest run on that stack, or that run."""
    from model_support.history import StackNotFound, find_stack, latest_per_slot, read_history
    from model_support.history import stacks as order_stacks

    with reading_store(store.uri):
        runs = read_history(store, model_id=model)
    if task is not None:
        runs = runs[runs["task"] == task]
    if runs.empty:
        raise fail(f"no runs of {model!r}{f' ({task})' if task else ''} in {store.uri!r}", 1)
    if what in set(runs["run_id"]):
        run_id = what
    else:
        try:
            stack = find_stack(what, order_stacks(runs))
        except StackNotFound as exc:
            raise fail(f"--{side}: {exc}") from exc
        latest = latest_per_slot(runs[stack.matches(runs)])
        if len(latest) > 1:
            tasks = ", ".join(sorted(latest["task"]))
            raise fail(
                f"{model!r} has runs of several tasks on {stack.label} ({tasks}): give --task"
            )
        run_id = str(latest["run_id"].iloc[0])

    return find_row(store, run_id)


def build_plan(good: dict[str, Any], bad: dict[str, Any], index: Any, say: Any = None) -> Plan:
    """The plan from the two rows: their packages' differences, each one's versions between."""
    from model_support.bisect import (
        BisectError,
        Plan,
        Side,
        Suspect,
        differences,
        pins_of,
        versions_between,
    )

    for row, which in ((good, "good"), (bad, "bad")):
        if not row.get("packages"):
            raise BisectError(
                f"the {which} row ({row['run_id']}, {row.get('result')}) recorded no packages "
                "(nothing ran, or it was recorded before packages were kept): give rows that ran"
            )
        if not row.get("run_py"):
            raise BisectError(f"the {which} row ({row['run_id']}) stores no run.py")
    if good["task"] != bad["task"]:
        raise BisectError(f"the rows test different tasks ({good['task']}, {bad['task']})")
    good_pins, bad_pins = pins_of(good["packages"]), pins_of(bad["packages"])
    changed, added, removed = differences(good_pins, bad_pins)
    suspects = []
    for name, low, high in changed:
        if say is not None:
            say(f"listing the versions of {name} between {low} and {high} ({index.describe()})")
        suspects.append(
            Suspect(
                name=name, good=low, bad=high, versions=versions_between(name, low, high, index)
            )
        )

    def side(row: dict[str, Any], pins: dict[str, str]) -> Side:
        stack = (
            " ".join(str(row.get(k)) for k in ("compiler", "compiler_version") if row.get(k))
            or "(unknown stack)"
        )
        return Side(
            run_id=str(row["run_id"]), stack=stack, result=str(row["result"]), packages=pins
        )

    return Plan(
        model_id=str(bad["model_id"]),
        task=str(bad["task"]),
        run_py=str(bad["run_py"]),
        good=side(good, good_pins),
        bad=side(bad, bad_pins),
        suspects=suspects,
        added=added,
        removed=removed,
    )


def bisect(
    model: Annotated[str, typer.Argument(help="Model id as results name it (org/name).")],
    good: Annotated[str, typer.Option("--good", help=f"The stack it passed on: {SIDE_HELP}.")],
    bad: Annotated[str, typer.Option("--bad", help=f"The stack it broke on: {SIDE_HELP}.")],
    task: Annotated[str | None, typer.Option(help="The task (when the model has several).")] = None,
    location: Annotated[
        str, typer.Option("--results", help="Results store holding both rows.")
    ] = DEFAULT_RESULTS,
    steps: Annotated[
        str | None,
        typer.Option(
            "--steps", help="Results store the steps are recorded in (default: RESULTS/bisect)."
        ),
    ] = None,
    index_url: Annotated[
        str | None, typer.Option(help="Package index to list and install versions from.")
    ] = None,
    extra_index_url: Annotated[
        list[str] | None, typer.Option(help="More package indexes (repeat).")
    ] = None,
    find_links: Annotated[
        list[str] | None, typer.Option(help="Folders or pages of wheels (repeat).")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where the steps' environments are made (default: the cache)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds before a step is stopped.", callback=positive_seconds)
    ] = 3600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the bisect as JSON.")] = False,
) -> None:
    """Find which package change broke MODEL between a good and a bad row, down to its first
    bad version: each package whose recorded version differs is tried alone at its bad version
    (the others at the good side), then each that breaks the model alone is bisected over the
    versions its package index lists (pip's) between the two. Each step runs here in a virtual
    environment of its own and is recorded in --steps; steps already recorded are reused.

    Exit code 0 with a first bad version found, 1 when no package breaks it alone, 2 on bad
    input (unknown stacks, rows without packages, an index that lists nothing)."""
    from model_support.bisect import (
        BISECT_SOURCE,
        BisectError,
        LocalSteps,
        PackageIndex,
        Request,
        Step,
        held_packages,
        render_bisect,
        run_bisect,
        stored_runs,
    )
    from model_support.evidence import shareable_uri

    store = open_history(location)
    good_row = side_row(store, model, task, "good", good)
    bad_row = side_row(store, model, task, "bad", bad)
    if good_row["run_id"] == bad_row["run_id"]:
        raise fail(f"--good and --bad name the same run ({good_row['run_id']}): give two")
    if bad_row.get("backend") == "neuron":
        import importlib.util

        if importlib.util.find_spec("torch_neuronx") is None:
            raise fail(
                f"run {bad_row['run_id']} ran on Neuron and this machine has no torch-neuronx: "
                "bisect it on a Trainium machine with the row's stack, where each step runs "
                "(docs/release-day.md)"
            )
    index = PackageIndex(
        index_url=index_url,
        extra_index_urls=tuple(extra_index_url or ()),
        find_links=tuple(find_links or ()),
    )
    say = None if as_json else (lambda text: err.print(escape(text)))
    try:
        plan = build_plan(good_row, bad_row, index, say)
    except BisectError as exc:
        raise fail(str(exc)) from exc
    steps_uri = steps or steps_location(location)
    steps_store = open_store(steps_uri)
    runner = LocalSteps(
        workdir=workdir or default_workdir(),
        index=index,
        timeout_s=timeout,
        held=held_packages(plan.good.packages, [s.name for s in plan.suspects]),
    )
    if runner.held and say is not None:
        say(
            "held at the good row's versions in every step (this environment has others): "
            + ", ".join(f"{n}=={v}" for n, v in sorted(runner.held.items()))
        )
    runner.workdir.mkdir(parents=True, exist_ok=True)
    label = f"{plan.good.run_id}..{plan.bad.run_id}"

    def run_step(request: Request, number: int) -> Any:
        if say is not None:
            say(f"step {number}: {request.purpose}: running {request.package}=={request.version}")
        return runner.run(plan, request, {BISECT_SOURCE: label, "package": request.package,
                                          "version": request.version})  # fmt: skip

    def record(made: Any) -> None:
        steps_store.add(made)

    def show(step: Step) -> None:
        if say is not None:
            how = "reused run" if step.reused else "run"
            say(
                f"  {step.package}=={step.version} ({_others(step, plan)}): {step.result} -> "
                f"{step.verdict} ({how} {step.run_id})"
            )

    def known() -> list[Any]:
        return [*stored_runs(store, plan.model_id, plan.task),
                *stored_runs(steps_store, plan.model_id, plan.task)]  # fmt: skip

    try:
        report = run_bisect(
            plan, run_step, known, record, steps_store=shareable_uri(steps_store), on_step=show
        )
    except BisectError as exc:
        raise fail(str(exc)) from exc
    finally:
        steps_store.materialize()
    if as_json:
        typer.echo(report.model_dump_json(indent=1))
    else:
        typer.echo(printable(render_bisect(report)), nl=False)
    if not report.conclusion.culprits:
        raise typer.Exit(1)


def _others(step: Any, plan: Plan) -> str:
    held = [f"{n}=={v}" for n, v in sorted(step.pins.items()) if n != step.package]
    return "others at the good side: " + (", ".join(held) if held else "none") if held else "alone"


def register(app: typer.Typer) -> None:
    """Add bisect to the command line."""
    app.command()(bisect)
