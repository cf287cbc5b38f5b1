"""`model-support history` and `model-support regressions`: every run of a model across stacks
and time, and what changed between two stacks (markdown for a bug report, or JSON)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from model_support.cli.common import (
    DEFAULT_RESULTS,
    fail,
    open_history,
    positive_seconds,
    reading_store,
)
from model_support.printable import DataConsole, printable
from model_support.vocabulary import CONFIRMING_RERUNS, MAX_CONFIRMING_RERUNS

if TYPE_CHECKING:
    from model_support.history import Confirmation, Report
    from model_support.store import ResultsStore


PRICES_HELP = (
    "Price table (YAML or JSON) over the default one (docs/pricing.md); default: "
    "$MODEL_SUPPORT_PRICES when set."
)


def _load_prices(path: str | None):  # type: ignore[no-untyped-def]
    from model_support.pricing import PriceTableError, load_prices

    try:
        return load_prices(path)
    except PriceTableError as exc:
        raise fail(str(exc)) from exc


def history(
    model: Annotated[str, typer.Argument(help="Model id as results name it (org/name).")],
    task: Annotated[str | None, typer.Option(help="Only runs of this task.")] = None,
    location: Annotated[
        str, typer.Option("--results", help="Results store location.")
    ] = DEFAULT_RESULTS,
    prices: Annotated[str | None, typer.Option("--prices", help=PRICES_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of runs.")] = False,
) -> None:
    """Every run of MODEL across stacks and time, oldest first: result, cores, wall and
    compile time, tok/s, peak memory, the verdict's figures, core-hours and cost, flips on
    the same stack, and the command that reproduces each run."""
    from model_support.history import model_history, read_history, reproduce_command

    store = open_history(location)
    table = _load_prices(prices)
    with reading_store(location):
        frame = read_history(store, model_id=model)
    runs = model_history(frame, model, task, table)
    if runs.empty:
        raise fail(
            f"no runs of {model!r}" + (f" ({task})" if task else "") + f" in {location!r}", 1
        )
    from model_support.evidence import shareable_uri

    uri = shareable_uri(store)
    runs = runs.assign(reproduce=[reproduce_command(r, uri) for r in runs["run_id"]])
    if as_json:
        typer.echo(runs.to_json(orient="records", date_format="iso"))
        return
    from model_support.history import money

    typer.echo(printable(f"{model}: {len(runs)} run(s), oldest first ({location})"))
    for row in runs.to_dict(orient="records"):
        finished = row["finished_at"] if _known(row["finished_at"]) else row["recorded_at"]
        result = str(row["result"]) + (
            f" {row['error_class']}" if isinstance(row["error_class"], str) else ""
        )
        figures = [
            f"{row['neuron_cores']} core(s)" if _known(row["neuron_cores"]) else None,
            _fig(row["wall_time_s"], "wall {:.1f} s"),
            _fig(row["compile_time_s"], "compile {:.1f} s"),
            _fig(row["decode_tokens_per_s"], "{:.1f} tok/s"),
            _fig(row["peak_device_memory_bytes"], "peak {:.2f} GiB", 2**-30),
            _fig(row["error_ratio"], "error ratio {:.2f}"),
            _fig(row["core_seconds"], "{:.3f} core-h", 1 / 3600),
            _fig(row["compile_share"], "{:.0f}% compiling", 100),
            money(row["cost_usd"] if _known(row["cost_usd"]) else None),
        ]
        line = "  ".join(
            [f"{finished:%Y-%m-%d %H:%M}" if _known(finished) else "(no time)", str(row["stack_label"]),
             str(row["task"]), result, *(f for f in figures if f)]
        )  # fmt: skip
        typer.echo(printable(line))
        if isinstance(row["flip"], str):
            typer.echo(printable(f"    changed on this stack: {row['flip']}"))
        typer.echo(printable(f"    {row['reproduce']}"))


def _known(value: object) -> bool:
    import pandas as pd

    return value is not None and not (pd.api.types.is_scalar(value) and pd.isna(value))


def _fig(value: object, pattern: str, scale: float = 1.0) -> str | None:
    return pattern.format(float(value) * scale) if _known(value) else None  # type: ignore[arg-type]


def regressions(
    before: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="The older stack: its label, 'compiler version', the compiler version or the "
            "compiler alone (default: the second newest stack).",
        ),
    ] = None,
    after: Annotated[
        str | None, typer.Option("--to", help="The newer stack (default: the newest).")
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    location: Annotated[
        str, typer.Option("--results", help="Results store location.")
    ] = DEFAULT_RESULTS,
    max_decode_drop: Annotated[
        float | None,
        typer.Option(min=0, help="Decode tok/s may drop by this fraction (default 0.10)."),
    ] = None,
    max_compile_growth: Annotated[
        float | None,
        typer.Option(min=0, help="Compile time may grow by this fraction (default 0.25)."),
    ] = None,
    max_memory_growth: Annotated[
        float | None,
        typer.Option(min=0, help="Peak device memory may grow by this fraction (default 0.05)."),
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option(help="Why the thresholds given here (required with any of them)."),
    ] = None,
    reruns: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_CONFIRMING_RERUNS,
            help="Re-runs a worse result needs on the newer stack, all agreeing, before it is "
            f"reported as a regression (default {CONFIRMING_RERUNS}).",
        ),
    ] = CONFIRMING_RERUNS,
    min_samples: Annotated[
        int,
        typer.Option(
            min=2,
            max=100,
            help="PASS runs each stack needs before speed, compile time or memory is compared "
            "(default 3).",
        ),
    ] = 3,
    confirm: Annotated[
        bool,
        typer.Option(
            "--confirm",
            help="Re-run each unconfirmed worse result here (its exact run.py, recorded in "
            "--results) until --reruns re-runs agree or one disagrees; this machine must have "
            "the newer stack.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            help="--confirm: seconds before a re-run is stopped.", callback=positive_seconds
        ),
    ] = 3600.0,
    prices: Annotated[str | None, typer.Option("--prices", help=PRICES_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What changed between two stacks, as a bug report: models whose result got worse
    (confirmed by re-runs that agree), whose decode tok/s dropped or compile time / peak
    memory grew (medians of repeated samples, past the threshold and each side's spread),
    models fixed, and models whose runs on one stack disagree (flaky), grouped by error class
    or failed check; per change its stacks, failed checks or error, first diverging module
    and reproduce commands. Markdown, or --json.

    Exit code 0 with no confirmed regression, 3 with confirmed regressions (for CI), 1 when
    there is nothing to compare (a store without a history yet, or no model with a result on
    both stacks), 2 on bad input (no results store at --results, one that cannot be read, bad
    options, --confirm on a machine without the newer stack)."""
    from model_support.evidence import attach, shareable_uri
    from model_support.history import (
        Confirmation,
        StackNotFound,
        Thresholds,
        default_pair,
        find_stack,
        read_stack_runs,
        read_stacks,
        render_json,
        render_markdown,
    )
    from model_support.history import regressions as compare

    given = [v for v in (max_decode_drop, max_compile_growth, max_memory_growth) if v is not None]
    if given and not reason:
        raise fail(
            "a threshold set here needs --reason saying why that value (it is printed with "
            "the report, beside each threshold)"
        )
    thresholds = Thresholds()
    if given:
        assert reason is not None
        thresholds = thresholds.with_values(
            reason,
            decode_drop=max_decode_drop,
            compile_growth=max_compile_growth,
            memory_growth=max_memory_growth,
        )
    store = open_history(location)
    table = _load_prices(prices)
    with reading_store(location):
        known = read_stacks(store)
    try:
        old, new = default_pair(known) if before is None or after is None else (None, None)
        old = find_stack(before, known) if before is not None else old
        new = find_stack(after, known) if after is not None else new
    except StackNotFound as exc:
        raise fail(str(exc)) from exc
    assert old is not None and new is not None
    if old == new:
        raise fail(f"--from and --to name the same stack ({old.label}): give two stacks")
    confirmation = Confirmation(reruns=reruns, min_samples=min_samples)
    uri = shareable_uri(store)

    def compared() -> Report:
        with reading_store(location):
            frame = read_stack_runs(store, [old, new])
        return compare(
            frame, old, new, thresholds, table, task=task, confirmation=confirmation, results=uri
        )

    report = compared()
    if report.compared == 0:
        raise fail(
            f"nothing to compare: no model{f' of task {task!r}' if task else ''} has a result "
            f"on both {old.label} and {new.label} in {location!r}; run the same models on both "
            "stacks (`model-support history MODEL` lists a model's runs)",
            1,
        )
    if confirm and any(c.kind == "regression" for c in report.unconfirmed):
        confirm_here_or_fail(store, report, confirmation, timeout)
        report = compared()
    with reading_store(location):
        attach(report, store, uri)
    typer.echo(
        render_json(report) if as_json else printable(render_markdown(report, uri)), nl=False
    )
    if report.regressions:
        raise typer.Exit(EXIT_REGRESSIONS)


def confirm_here_or_fail(
    store: ResultsStore, report: Report, confirmation: Confirmation, timeout: float
) -> None:
    """Re-run the report's unconfirmed worse results here (printing each re-run), or exit 2
    saying why this machine cannot."""
    from rich.markup import escape

    from model_support.confirm import CannotConfirmHere, Rerun, confirm_here

    err = DataConsole(stderr=True, soft_wrap=True)

    def show(rerun: Rerun) -> None:
        c = rerun.change
        verdict = "agrees" if rerun.agrees else "disagrees: the model is flaky"
        err.print(
            escape(
                f"re-ran {c.model} ({c.task}) on {report.after}: "
                f"{rerun.record.document.result.value}, {verdict} (run {rerun.record.run_id})"
            )
        )

    try:
        confirm_here(store, report, confirmation, timeout_s=timeout, on_rerun=show)
    except CannotConfirmHere as exc:
        raise fail(str(exc)) from exc


EXIT_REGRESSIONS = 3
"""`regressions` exits with this when it found any (0 without), so CI can gate on it."""


def report(
    stack: Annotated[
        str | None,
        typer.Argument(
            help="The release: a stack's label, 'compiler version', the compiler version or the "
            "compiler alone (default: the newest stack)."
        ),
    ] = None,
    against: Annotated[
        str | None,
        typer.Option(help="The stack to compare it with (default: the one before it)."),
    ] = None,
    location: Annotated[
        str, typer.Option("--results", help="Results store location.")
    ] = DEFAULT_RESULTS,
    reruns: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_CONFIRMING_RERUNS,
            help=f"As for regressions (default {CONFIRMING_RERUNS}).",
        ),
    ] = CONFIRMING_RERUNS,
    min_samples: Annotated[
        int, typer.Option(min=2, max=100, help="As for regressions (default 3).")
    ] = 3,
    prices: Annotated[str | None, typer.Option("--prices", help=PRICES_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """A release at a glance: models tested, PASS, FAIL, ERROR, TIMEOUT, EXCLUDED, confirmed
    regressions, fixes, unconfirmed changes and flaky models against the stack before it, the
    models not re-tested (by name), and what its runs cost. Markdown, or --json.

    Exit code 0, 1 when the store has no history yet, 2 on bad input."""
    from model_support.evidence import shareable_uri
    from model_support.history import (
        Confirmation,
        StackNotFound,
        Thresholds,
        find_stack,
        previous_stack,
        read_stack_runs,
        read_stacks,
        release_report,
        render_release_markdown,
    )

    store = open_history(location)
    table = _load_prices(prices)
    with reading_store(location):
        known = read_stacks(store)
    if not known:
        raise fail(f"no runs in {location!r} to report on", 1)
    try:
        chosen = find_stack(stack, known) if stack is not None else known[-1].stack
        base = find_stack(against, known) if against is not None else previous_stack(chosen, known)
    except StackNotFound as exc:
        raise fail(str(exc)) from exc
    if base == chosen:
        raise fail(f"--against names the release itself ({chosen.label}): give another stack")
    with reading_store(location):
        frame = read_stack_runs(store, [s for s in (chosen, base) if s is not None])
    uri = shareable_uri(store)
    release = release_report(
        frame, chosen, base, Thresholds(), table,
        confirmation=Confirmation(reruns=reruns, min_samples=min_samples), results=uri,
    )  # fmt: skip
    if as_json:
        import json

        typer.echo(json.dumps(release.model_dump(mode="json"), indent=1))
    else:
        typer.echo(printable(render_release_markdown(release, uri)), nl=False)


def register(app: typer.Typer) -> None:
    """Add history, regressions and report to the command line."""
    app.command()(history)
    app.command()(regressions)
    app.command()(report)
