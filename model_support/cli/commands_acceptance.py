"""`model-support acceptance`: the first hour on a node, as one command and one archive.

It runs the doctor (with its device smoke test), tests a small text model twice against one
fresh compile cache (the first run compiles cold, the second must hit the cache), lists the cache
TorchNeuron (or inductor, off Trainium) wrote, and judges what a first hour must show: both runs
pass, the timed call compiled nothing, on Trainium the forward ran as one compiled graph per step
and every NEFF is in a layout the cache transfers read. Everything goes into one ``.tar.gz`` to
attach to a bug: the doctor's report and device facts, both result documents (their compilation
blocks), both runs' output, the cache listing and the summary. On a machine without a Neuron
device the device parts say "n/a" and the rest runs as it would on the node.

Exit codes: 0 nothing failed, 1 something failed (the summary says what), 2 bad input.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.table import Table
from rich.text import Text

from model_support.compile_cache.layouts import neff_layout, scan
from model_support.config import RunConfig
from model_support.doctor import SMOKE_TIMEOUT_S, DoctorReport, all_checks
from model_support.execution import run_local
from model_support.models import resolve_model
from model_support.printable import DataConsole
from model_support.records import ResultDocument
from model_support.vocabulary import Backend, Result

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
"""A small text model the checklist's runs use (docs/trainium.md)."""
LISTED_PATHS = 200
EXIT_FAILED = 1


@dataclass
class Expectation:
    """One thing the first hour must show, and whether it did (ok, FAILED, n/a)."""

    name: str
    status: str
    detail: str


@dataclass
class CacheListing:
    """What the compile cache folder holds after both runs."""

    folder: str
    kind: str  # neff or inductor
    entries: int = 0
    by_layout: dict[str, int] = field(default_factory=dict)
    files: int = 0  # every .neff file (neff) or every file (inductor), entries or not
    paths: list[str] = field(default_factory=list)


def cache_listing(kind: str, folder: Path) -> CacheListing:
    """The complete entries of the cache at ``folder`` by layout, as the transfers read them,
    and how many files there are at all (``find <folder> -name '*.neff'`` on Trainium)."""
    entries, _ = scan("neff" if kind == "neff" else "inductor", folder)
    listing = CacheListing(str(folder), kind, entries=len(entries))
    for entry in entries:
        layout = (neff_layout(entry.path) or "other") if kind == "neff" else "inductor"
        listing.by_layout[layout] = listing.by_layout.get(layout, 0) + 1
    if folder.is_dir():
        files = [
            path.relative_to(folder).as_posix()
            for path in sorted(folder.rglob("*"))
            if path.is_file() and (kind != "neff" or path.name.endswith(".neff"))
        ]
        listing.files = len(files)
        listing.paths = files[:LISTED_PATHS]
    return listing


def _status(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def expectations(
    doctor: DoctorReport, runs: list[ResultDocument], listing: CacheListing
) -> list[Expectation]:
    """What the first hour must show, judged from the doctor's report, the two runs' documents
    (the first cold, the second on the same cache) and the cache listing."""
    first, second = runs
    neuron = first.backend == Backend.NEURON
    found: list[Expectation] = []
    checks = {c.name: c for c in doctor.checks}
    if neuron or any(c.applicable and c.name == "smoke test" for c in doctor.checks):
        failed = [c.name for c in doctor.checks if c.applicable and not c.ok]
        found.append(
            Expectation(
                "doctor",
                _status(not failed),
                f"failed: {', '.join(failed)} (doctor.json)" if failed else "every check passed",
            )
        )
    else:
        found.append(
            Expectation(
                "doctor",
                "n/a",
                "no Neuron device here: the node checks do not apply (doctor.json has them)",
            )
        )
    smoke = checks.get("smoke test")
    found.append(
        Expectation(
            "smoke test",
            smoke.status if smoke else "n/a",
            smoke.detail if smoke else "not run",
        )
    )
    results = [d.result for d in runs]
    found.append(
        Expectation(
            "both runs pass",
            _status(all(r == Result.PASS for r in results)),
            "; ".join(
                f"run {n}: {d.result.value}"
                + (f" {d.error_class.value}" if d.error_class else "")
                + (f" ({d.error_reason.value})" if d.error_reason else "")
                + (f": {(d.error or '').splitlines()[0][:200]}" if d.error else "")
                for n, d in enumerate(runs, 1)
            ),
        )
    )
    c1, c2 = first.compilation, second.compilation
    if c1.cache is None or c2.cache_hit is None:
        cache_detail = f"{first.compile_backend or 'the compile backend'} consults no compile cache"
        found.append(Expectation("first run compiles cold", "n/a", cache_detail))
        found.append(Expectation("second run hits the compile cache", "n/a", cache_detail))
    else:
        found.append(
            Expectation(
                "first run compiles cold",
                _status((c1.cache_misses or 0) > 0 and (c1.cache_misses or 0) == (c1.graphs or 0)),
                f"{c1.graphs} graph(s), {c1.cache_misses} miss(es), {c1.cache_hits} hit(s) "
                f"in the {c1.cache} cache",
            )
        )
        found.append(
            Expectation(
                "second run hits the compile cache",
                _status(c2.cache_hit is True),
                f"{c2.graphs} graph(s), {c2.cache_hits} hit(s), {c2.cache_misses} miss(es); "
                f"compile {first.timings.first_generate_s or 0:.1f} s then "
                f"{second.timings.first_generate_s or 0:.1f} s",
            )
        )
    timed = [d.compilation.timed_call_graphs for d in runs]
    found.append(
        Expectation(
            "the timed call compiled nothing",
            "n/a" if None in timed else _status(timed == [0, 0]),
            f"graphs compiled during the timed call: {timed}",
        )
    )
    if neuron:
        whole = [
            d.compilation.whole_graph is True
            and d.compilation.graph_breaks == 0
            and not any(f.startswith("compiled graph") for f in d.compilation.fallback_ops)
            for d in runs
        ]
        found.append(
            Expectation(
                "one compiled graph per step, no CPU fallback",
                _status(all(whole)),
                "; ".join(
                    f"run {n}: whole_graph {d.compilation.whole_graph}, "
                    f"{d.compilation.graph_breaks} break(s), fallbacks "
                    f"{d.compilation.fallback_ops or 'none'}, "
                    f"{d.compilation.fallback_execution}"
                    for n, d in enumerate(runs, 1)
                ),
            )
        )
        unread = listing.files - listing.entries
        found.append(
            Expectation(
                "NEFF cache entries in a layout the transfers read",
                _status(listing.entries >= (c1.graphs or 0) and unread == 0),
                f"{listing.files} .neff file(s), {listing.entries} entries "
                f"{listing.by_layout}; run 1 compiled {c1.graphs} graph(s)"
                + (f"; {unread} file(s) in no layout read (cache-listing.json)" if unread else ""),
            )
        )
    else:
        for name in (
            "one compiled graph per step, no CPU fallback",
            "NEFF cache entries in a layout the transfers read",
        ):
            found.append(
                Expectation(name, "n/a", f"ran on {first.backend}, not on a Neuron device")
            )
    facts = doctor.facts
    found.append(
        Expectation(
            "device facts",
            "ok" if facts.devices else "n/a",
            f"{len(facts.devices)} device(s) by {facts.source}"
            + (f": {facts.device_name}" if facts.device_name else "")
            if facts.devices
            else f"no Neuron device ({facts.problem})",
        )
    )
    return found


def summary(
    found: list[Expectation], runs: list[ResultDocument], doctor: DoctorReport
) -> dict[str, Any]:
    """The archive's summary.json: the verdicts, each run's compilation block and stack."""
    return {
        "ok": not any(e.status == "FAILED" for e in found),
        "expectations": [asdict(e) for e in found],
        "runs": [
            {
                "result": d.result.value,
                "error_class": d.error_class.value if d.error_class else None,
                "error_reason": d.error_reason.value if d.error_reason else None,
                "backend": d.backend,
                "compile_backend": d.compile_backend,
                "compilation": d.compilation.model_dump(mode="json"),
                "timings": d.timings.model_dump(mode="json"),
                "stack": {
                    key: getattr(d.stack, key)
                    for key in (
                        "torch",
                        "torch_neuronx",
                        "neuronx_cc",
                        "instance_type",
                        "device_name",
                        "lnc",
                        "lnc_source",
                        "compiler_flags",
                    )
                },
            }
            for d in runs
        ],
        "device_facts": doctor.facts.as_dict(),
    }


def bundle(folder: Path, archive: Path) -> Path:
    """``folder``'s files as one ``.tar.gz`` at ``archive`` (its parent made if needed)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                tar.add(path, arcname=f"model-support-acceptance/{path.name}")
    return archive


def _writer(log: TextIO) -> Callable[[str], None]:
    """What writes a run's output lines to ``log``."""

    def write(line: str) -> None:
        log.write(line + "\n")

    return write


def _table(found: list[Expectation]) -> Table:
    table = Table(title="model-support acceptance", show_header=True)
    table.add_column("expectation")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    styles = {"ok": "green", "FAILED": "bold red", "n/a": "dim"}
    for item in found:
        table.add_row(
            Text(item.name), Text(item.status, style=styles[item.status]), Text(item.detail)
        )
    return table


def register(app: typer.Typer) -> None:
    """Add the ``acceptance`` command to ``app``."""

    @app.command("acceptance")
    def acceptance(
        model: Annotated[
            str, typer.Argument(help="A small text model: Hub id or local checkpoint folder.")
        ] = DEFAULT_MODEL,
        out: Annotated[Path, typer.Option("--out", help="The archive to write (.tar.gz).")] = Path(
            "model-support-acceptance.tar.gz"
        ),
        backend: Annotated[Backend, typer.Option(help="Device backend of the runs.")] = (
            Backend.AUTO
        ),
        dtype: Annotated[str, typer.Option(help="dtype of the runs.")] = "bfloat16",
        compile_backend: Annotated[
            str | None,
            typer.Option(
                help="torch.compile backend (default: neuron on Trainium, else inductor)."
            ),
        ] = None,
        max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens per prompt.")] = 32,
        timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per run.")] = 3600.0,
        smoke_timeout: Annotated[
            float, typer.Option("--smoke-timeout", min=1.0, help="Seconds for the smoke test.")
        ] = SMOKE_TIMEOUT_S,
        as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = (
            False
        ),
    ) -> None:
        """The first hour on a node: doctor, smoke test, a small text model twice (the second
        must hit the compile cache), the cache listing, the compilation blocks and the device
        facts, bundled into one archive. Exit 1 when an expectation failed."""
        try:
            ref = resolve_model(model)
            config = RunConfig(
                model=ref.value,
                backend=backend,
                dtype=dtype,  # type: ignore[arg-type]
                compile_backend=compile_backend,
                max_new_tokens=max_new_tokens,
            )
        except ValueError as exc:
            DataConsole(stderr=True).print(Text(f"error: {exc}", style="bold red"))
            raise typer.Exit(2) from None
        local = ref.is_local
        with tempfile.TemporaryDirectory(prefix="model-support-acceptance-") as scratch:
            work, cache = Path(scratch) / "bundle", Path(scratch) / "compile-cache"
            work.mkdir()
            doctor = all_checks(
                None, None, None if local else ref.value, smoke_timeout, hub=not local
            )
            (work / "doctor.json").write_text(json.dumps(doctor.as_dict(), indent=2))
            # One fresh cache folder for both runs, whichever compiler fills it.
            env = {
                **os.environ,
                "TORCH_NEURONX_NEFF_CACHE_DIR": str(cache),
                "TORCHINDUCTOR_CACHE_DIR": str(cache),
            }
            runs: list[ResultDocument] = []
            for n in (1, 2):
                with (work / f"run-{n}.log").open("w") as log:
                    record = run_local(
                        config,
                        timeout_s=timeout,
                        env=env,
                        source="acceptance",
                        on_output=_writer(log),
                    )
                (work / f"run-{n}.json").write_text(record.document.model_dump_json(indent=2))
                runs.append(record.document)
            kind = "neff" if runs[0].backend == Backend.NEURON else "inductor"
            listing = cache_listing(kind, cache)
            (work / "cache-listing.json").write_text(json.dumps(asdict(listing), indent=2))
            found = expectations(doctor, runs, listing)
            report = summary(found, runs, doctor)
            (work / "summary.json").write_text(json.dumps(report, indent=2))
            archive = bundle(work, out)
        if as_json:
            print(json.dumps({**report, "archive": str(archive)}))
        else:
            DataConsole().print(_table(found))
            DataConsole().print(Text(f"archive: {archive}"))
        if not report["ok"]:
            raise typer.Exit(EXIT_FAILED)
