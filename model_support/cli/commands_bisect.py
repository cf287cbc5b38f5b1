"""`model-support bisect`: which package change broke a model, down to its first bad version."""

from __future__ import annotations

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


def default_workdir() -> Path:
    """Where the steps' environments are kept (``$MODEL_SUPPORT_CACHE``'s parent's, or
    ~/.cache/model-support/bisect-envs)."""
    from model_support.checkpoints import default_cache_dir

    return default_cache_dir().parent / "bisect-envs"


def side_row(
    store: ResultsStore, model: str, task: str | None, side: str, what: str
) -> dict[str, Any]:
    """The row of ``model`` that ``what`` names: its latest run on that stack, or that run."""
    from model_support.bisect import BisectError, NoRuns, find_run

    try:
        with reading_store(store.uri):
            run_id = find_run(store, model, task, what, f"--{side}")
    except NoRuns as exc:
        raise fail(str(exc), 1) from exc
    except BisectError as exc:
        raise fail(str(exc)) from exc
    return find_row(store, run_id)


def bisect(
    model: Annotated[str, typer.Argument(help="Model id as results name it (org/name).")],
    good: Annotated[str, typer.Option("--good", help=f"The stack it passed on: {SIDE_HELP}.")],
    bad: Annotated[str, typer.Option("--bad", help=f"The stack it broke on: {SIDE_HELP}.")],
    task: Annotated[str | None, typer.Option(help="The task (when the model has several).")] = None,
    location: Annotated[
        str | None,
        typer.Option(
            "--results",
            help=f"Results store holding both rows (default {DEFAULT_RESULTS}; with --cluster "
            "the operator's).",
        ),
    ] = None,
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
    package: Annotated[
        list[str] | None,
        typer.Option(
            "--package",
            help="Only this package is a suspect (repeat; default every package that changed).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the bisect as JSON.")] = False,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="Run nothing here: write the ModelSupportBisect that has the operator run each "
            "step as a ModelSupportTest (kubectl apply -f it).",
        ),
    ] = False,
    name: Annotated[
        str | None,
        typer.Option(help="--cluster: the resource's name (default from the model and rows)."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="--cluster: the resource's namespace.")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="--cluster: write the manifest here (default stdout)."),
    ] = None,
) -> None:
    """Find which package change broke MODEL between a good and a bad row, down to its first
    bad version: each package whose recorded version differs is tried alone at its bad version
    (the others at the good side), then each that breaks the model alone is bisected over the
    versions its package index lists (pip's) between the two. Each step runs here in a virtual
    environment of its own and is recorded in --steps; steps already recorded are reused.

    With --cluster nothing runs here: the command writes a ModelSupportBisect, whose operator
    reads the rows from the results store and runs each step as a ModelSupportTest.

    Exit code 0 with a first bad version found, 1 when no package breaks it alone, 2 on bad
    input (unknown stacks, rows without packages, an index that lists nothing)."""
    if cluster:
        _write_manifest(
            model, good, bad, task=task, results=location, steps=steps, index_url=index_url,
            extra_index_urls=extra_index_url or [], find_links=find_links, workdir=workdir,
            timeout=timeout, packages=package or [], name=name, namespace=namespace,
            output=output,
        )  # fmt: skip
        return
    location = location or DEFAULT_RESULTS
    from model_support.bisect import (
        BISECT_SOURCE,
        BisectError,
        LocalSteps,
        PackageIndex,
        Request,
        Step,
        held_packages,
        plan_from_rows,
        render_bisect,
        report_for,
        run_bisect,
        steps_location,
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
        plan = plan_from_rows(good_row, bad_row, index, say, consider=package or ())
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

    in_results: list[Any] = []

    def known() -> list[Any]:
        in_results.extend(stored_runs(store, plan.model_id, plan.task))
        return [*in_results, *stored_runs(steps_store, plan.model_id, plan.task)]

    try:
        report = run_bisect(
            plan, run_step, known, record, steps_store=shareable_uri(steps_store), on_step=show
        )
        # A culprit's run reused from the results store is reproduced from there.
        elsewhere = {r.run_id: shareable_uri(store) for r in in_results}
        report = report_for(
            plan, report.steps, report.conclusion, report.steps_store, stored_in=elsewhere
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


def _write_manifest(
    model: str,
    good: str,
    bad: str,
    *,
    task: str | None,
    results: str | None,
    steps: str | None,
    index_url: str | None,
    extra_index_urls: list[str],
    find_links: list[str] | None,
    workdir: Path | None,
    timeout: float,
    packages: list[str],
    name: str | None,
    namespace: str | None,
    output: Path | None,
) -> None:
    """``bisect --cluster``: the ModelSupportBisect, checked as the operator checks it."""
    import hashlib
    import re

    import yaml

    from model_support.operator.bisect_spec import MAX_BISECT_NAME, parse_bisect
    from model_support.operator.resource import API_VERSION, BISECT_KIND
    from model_support.operator.spec import DNS_LABEL_PATTERN, SpecError

    if find_links or workdir is not None:
        raise fail(
            "--find-links and --workdir are for steps run here; with --cluster the operator "
            "installs each step from --index-url / --extra-index-url"
        )
    for given, option in ((results, "--results"), (steps, "--steps")):
        if given is not None and "://" not in given and not given.startswith("/"):
            raise fail(
                f"{option} {given!r} is a path on this machine: the operator reads the store "
                "by its URI (s3://...) or a path on its own volume; leave --results out to "
                "use the operator's store"
            )
    spec: dict[str, Any] = {"model": model, "good": good, "bad": bad}
    if task is not None:
        spec["task"] = task
    for key, value in (("results", results), ("steps", steps)):
        if value is not None:
            spec[key] = value
    if packages:
        spec["packages"] = packages
    index = {"indexUrl": index_url} if index_url else {}
    if extra_index_urls:
        index["extraIndexUrls"] = extra_index_urls  # type: ignore[assignment]
    if index:
        spec["index"] = index
    spec["timeoutSeconds"] = int(timeout)
    try:
        parse_bisect(spec)
    except SpecError as exc:
        raise fail(str(exc).replace("Fix the resource and apply it again.", "")) from exc
    if name is None:
        digest = hashlib.sha256(f"{model}\n{task}\n{good}\n{bad}".encode()).hexdigest()[:6]
        slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
        slug = slug[: MAX_BISECT_NAME - len("bisect--") - len(digest)].strip("-")
        name = f"bisect-{slug}-{digest}"
    if len(name) > MAX_BISECT_NAME or not re.fullmatch(DNS_LABEL_PATTERN, name):
        raise fail(
            f"--name {name!r}: a bisect's name is a DNS label (lowercase letters, digits, '-') "
            f"of at most {MAX_BISECT_NAME} characters"
        )
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    manifest = {"apiVersion": API_VERSION, "kind": BISECT_KIND, "metadata": metadata, "spec": spec}
    text = yaml.safe_dump(manifest, sort_keys=False, width=100)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        err.print(
            f"wrote {escape(str(output))}: kubectl apply -f {escape(str(output))}, then kubectl "
            f"get msb {escape(name)} -w"
        )


def _others(step: Any, plan: Plan) -> str:
    held = [f"{n}=={v}" for n, v in sorted(step.pins.items()) if n != step.package]
    return "others at the good side: " + (", ".join(held) if held else "none") if held else "alone"


def register(app: typer.Typer) -> None:
    """Add bisect to the command line."""
    app.command()(bisect)
