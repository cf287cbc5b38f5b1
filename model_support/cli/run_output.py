"""A run's record and the results matrix as the command line prints them (``run``, ``results``
and ``demo`` print the same way)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from model_support.cli.common import fail, out, reading_store
from model_support.records import RunRecord
from model_support.vocabulary import Result

if TYPE_CHECKING:
    from model_support.pricing import PriceTable

RESULT_STYLE = {
    Result.PASS: "bold green",
    Result.FAIL: "bold red",
    Result.ERROR: "bold yellow",
    Result.TIMEOUT: "bold magenta",
    Result.EXCLUDED: "dim",
    Result.UNVERIFIED: "bold blue",
}


def cost_summary(record: RunRecord, prices: PriceTable) -> dict[str, object]:
    """What the record says about cost, as the matrix columns say it (held_s, core_seconds,
    compile_share), with its price: the instance priced, its region, the core-hour rate and
    where that rate comes from (null where the table has none: a run off Neuron is never
    priced as Trainium core-hours)."""
    from model_support.dataset import (
        NEURON_COMPILER,
        core_seconds,
        held_seconds,
        matrix_key,
        record_held_cores,
    )

    doc = record.document
    held = held_seconds(doc)
    used = core_seconds(doc, record_held_cores(record))
    compile_s = doc.timings.compile_s
    share = (
        min(max(compile_s / held, 0.0), 1.0)
        if held is not None and compile_s is not None and held > 0
        else None
    )
    neuron = matrix_key(record).compiler == NEURON_COMPILER
    price = prices.price_of(doc.stack.instance_type, neuron)
    rate = None if price is None else price.core_hour_usd(doc.stack.lnc)
    return {
        "held_s": held,
        "core_seconds": used,
        "compile_share": share,
        "cost_usd": None if rate is None or used is None else used / 3600 * rate,
        "price": None
        if price is None
        else {
            "instance_type": price.instance_type,
            "region": price.region,
            "lnc": doc.stack.lnc,
            "core_hour_usd": rate,
            "source": price.source,
            "as_of": price.as_of,
            "assumed": doc.stack.instance_type is None,
        },
    }


def summary(record: RunRecord, prices: PriceTable | None = None) -> dict[str, object]:
    """The machine-readable summary of a run printed by ``run --json`` (its cost priced with
    ``prices``, default the table of docs/pricing.md or $MODEL_SUPPORT_PRICES)."""
    from model_support.pricing import load_prices

    doc = record.document
    return {
        "run_id": record.run_id,
        "model": doc.model,
        "model_id": record.model_id,
        "task": doc.task,
        "result": doc.result.value,
        "error_class": doc.error_class.value if doc.error_class else None,
        "error": doc.error,
        "backend": doc.backend,
        "compile_backend": doc.compile_backend,
        "cores": doc.cores,
        "parallelism": doc.parallelism.value,
        "parameters": doc.parameters,
        "parameters_per_core": doc.parameters_per_core,
        "wall_time_s": doc.timings.wall_time_s,
        "compile_time_s": doc.timings.compile_s,
        "decode_tokens_per_s": doc.timings.decode_tokens_per_s,
        "peak_device_memory_bytes": doc.memory.peak_device_memory_bytes,
        "verification": doc.verification.model_dump(exclude={"positions"}),
        "text": doc.text,
        "judge": doc.judge,
        "compile_cache": doc.compile_cache.model_dump() if doc.compile_cache else None,
        **cost_summary(record, prices or load_prices()),
    }


def _figure(value: float | None, digits: int) -> str:
    """A figure a run may leave out (a task without a token verdict, a stage that never ran)."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_record(record: RunRecord) -> None:
    """A human summary of one run."""
    doc = record.document
    style = RESULT_STYLE.get(doc.result, "")
    head = f"[{style}]{doc.result.value}[/]"
    if doc.error_class:
        head += f" ({doc.error_class.value})"
    setup = escape(f"{doc.task} · {doc.backend} · {doc.compile_backend} · {doc.cores} core(s)")
    out.print(f"{head}  {escape(record.model_id)}  [dim]{setup}[/]")
    t, m, v = doc.timings, doc.memory, doc.verification
    if t.wall_time_s is not None:
        out.print(
            f"  wall {t.wall_time_s:.2f} s (load {_figure(t.load_s, 2)} s, first generate "
            f"{_figure(t.first_generate_s, 2)} s, steady {_figure(t.steady_generate_s, 3)} s), "
            f"decode {t.decode_tokens_per_s or 0:.1f} tok/s"
        )
    if m.peak_device_memory_bytes:
        out.print(
            f"  peak device memory {m.peak_device_memory_bytes / 2**20:.1f} MiB ({m.device_memory_source})"
        )
    if v.passed is not None:
        out.print(
            f"  verification: exact={v.exact} mismatches={v.mismatches} near-ties={v.near_ties} "
            f"bad={v.bad_tokens} error ratio={_figure(v.error_ratio, 2)}"
        )
    if v.reason:
        out.print(f"  [red]{escape(v.reason)}[/]")
    if v.first_divergence is not None:
        out.print(f"  where: {escape(v.first_divergence.summary())}")
    if doc.error:
        out.print(f"  [yellow]{escape(doc.error.splitlines()[0][:400])}[/]")
    for text in doc.text[:3]:
        out.print(f"  [dim]»[/] {escape(repr(text[:120]))}")


RESULT_COLUMNS = [
    "model_id",
    "task",
    "result",
    "error_class",
    "neuron_cores",
    "parallelism",
    "compiler",
    "compiler_version",
    "library_version",
    "wall_time_s",
    "decode_tokens_per_s",
    "peak_device_memory_bytes",
    "run_id",
]


def print_results(
    location: str,
    *,
    model: str | None = None,
    result: Result | None = None,
    compiler_version: str | None = None,
    library_version: str | None = None,
    as_json: bool = False,
) -> None:
    """The results matrix at ``location`` (latest result per model and task, per stack) as a
    table, or JSON rows, filtered by the options given; exit 2 where there are no results."""
    from model_support.store import ResultsStore

    with reading_store(location):
        store = ResultsStore(location)
        files = store.matrix_files()
        if not files:
            raise fail(
                f"no results at {location!r}: first run `model-support run MODEL --results "
                f"{location}`"
            )
        frame = store.matrix(columns=RESULT_COLUMNS)
    if model:
        frame = frame[frame["model_id"].str.contains(model, case=False, regex=False)]
    if result:
        frame = frame[frame["result"] == result.value]
    if compiler_version:
        frame = frame[frame["compiler_version"] == compiler_version]
    if library_version:
        frame = frame[frame["library_version"] == library_version]
    frame = frame.sort_values(["model_id", "task"])
    if as_json:
        print(frame.to_json(orient="records", date_format="iso"))
        return
    table = Table(title=escape(f"model-support results ({len(frame)} rows) — {location}"))
    for column in (
        "model",
        "task",
        "result",
        "cores",
        "parallelism",
        "compiler",
        "transformers",
        "wall s",
        "tok/s",
        "peak MiB",
    ):
        table.add_column(column, overflow="fold")
    for row in frame.itertuples(index=False):
        style = RESULT_STYLE.get(Result(row.result), "")
        result_text = f"[{style}]{row.result}[/]" + (
            f" [dim]{escape(row.error_class)}[/]" if isinstance(row.error_class, str) else ""
        )
        table.add_row(
            escape(row.model_id),
            escape(row.task),
            result_text,
            _fmt(row.neuron_cores, "{:.0f}"),
            escape(_text(row.parallelism)),
            escape(
                " ".join(_text(v) for v in (row.compiler, row.compiler_version) if not _missing(v))
            ),
            escape(_text(row.library_version)),
            _fmt(row.wall_time_s, "{:.2f}"),
            _fmt(row.decode_tokens_per_s, "{:.0f}"),
            _fmt(
                None
                if _missing(row.peak_device_memory_bytes)
                else row.peak_device_memory_bytes / 2**20,
                "{:.0f}",
            ),
        )
    out.print(table)


def _missing(value: object) -> bool:
    """None, NaN, or pandas' NA: a value the matrix does not have."""
    import pandas as pd  # loaded already by the matrix read that produced ``value``

    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _text(value: object) -> str:
    """A cell: the value as text, blank when missing (never "None", "nan" or "<NA>")."""
    return "" if _missing(value) else str(value)


def _fmt(value: object, pattern: str) -> str:
    return "" if _missing(value) else pattern.format(value)
