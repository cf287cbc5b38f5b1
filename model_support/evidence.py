"""What a bug report says of a run: its stack, where it failed, the first lines of its error,
and how to run it again on another machine.

A regression report (:mod:`model_support.history`) compares the store's history, which holds
a few columns of every run; the details of the few runs that changed are read here from the
matrix (the latest run of each model per stack is its row there) or, for a run the matrix no
longer holds, from its record.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from model_support.history import Change, Evidence, Report, divergence_line
from model_support.vocabulary import Result

if TYPE_CHECKING:
    from model_support.store import ResultsStore

EVIDENCE_COLUMNS = [
    "run_id", "result", "error_class", "error", "failed_checks", "verification_json",
    "first_divergence", "first_divergence_kind", "first_divergence_phase",
    "first_divergence_step", "first_divergence_ratio", "compiler",
    "compiler_version", "library", "library_version", "torch", "torch_neuronx", "instance_type",
    "lnc", "neuron_cores", "backend", "labels", "stack",
]  # fmt: skip
"""The matrix columns a bug report reads of a run."""

ERROR_LINES = 6
"""How many lines of an ERROR's message a report shows (the compiler's first words)."""

CHECK_FIGURES: dict[str, tuple[str, str, str]] = {
    "median": ("error_ratio", "max_error_ratio", "median logit error ratio"),
    "q90": ("q90_ratio", "max_q90_ratio", "90th percentile logit error ratio"),
    "peak": ("peak_ratio", "max_peak_ratio", "peak logit error ratio"),
    "kl": ("kl_ratio", "max_kl_ratio", "KL divergence ratio"),
}
"""A token verdict's checks: the figure each one judges, its bound, and the figure's name."""


def shareable_uri(store: ResultsStore) -> str:
    """The store as a reproduce command on another machine names it: its URI (``s3://``,
    ``hf://``), or for a local store its absolute path (only this machine has it: copy or
    publish the store to reproduce elsewhere)."""
    from fsspec.implementations.local import LocalFileSystem

    return store.root if isinstance(store.fs, LocalFileSystem) else store.uri


def read_runs(store: ResultsStore, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The details of ``run_ids`` by run id: their matrix rows, else their records."""
    from model_support.dataset import record_to_row
    from model_support.reproduce import plain_row
    from model_support.store import RecordNotFound

    wanted = sorted(set(run_ids))
    if not wanted:
        return {}
    frame = store.matrix(columns=EVIDENCE_COLUMNS, filters=[("run_id", "in", wanted)])
    found = {str(row["run_id"]): plain_row(row) for row in frame.to_dict(orient="records")}
    for run_id in wanted:
        if run_id not in found:
            try:
                row = record_to_row(store.get(run_id))
            except RecordNotFound:
                continue  # a published dataset keeps rows only: nothing more to say of it
            found[run_id] = {column: row[column] for column in EVIDENCE_COLUMNS}
    return found


def _stack(row: Mapping[str, Any]) -> dict[str, str]:
    parts = {
        "compiler": " ".join(
            str(v) for v in (row.get("compiler"), row.get("compiler_version")) if v
        ),
        "library": " ".join(str(v) for v in (row.get("library"), row.get("library_version")) if v),
        "torch": row.get("torch"),
        "torch-neuronx": row.get("torch_neuronx"),
        "instance": row.get("instance_type"),
        "lnc": None if row.get("lnc") is None else str(row.get("lnc")),
    }
    return {k: str(v) for k, v in parts.items() if v}


def failed_check_figures(row: Mapping[str, Any]) -> list[str]:
    """A FAIL's failed checks, each with its figure and the bound it passed (``median: median
    logit error ratio 5.21 > 3``); a check without a figure is named alone."""
    listed = row.get("failed_checks")
    checks = [str(c) for c in listed] if listed is not None else []  # a list, or numpy's array
    if not checks:
        return []
    verification = json.loads(row.get("verification_json") or "{}")
    bounds = verification.get("parameters") or {}
    metrics = {m.get("check"): m for m in verification.get("metrics") or []}
    described = []
    for check in checks:
        if check in CHECK_FIGURES:
            figure, bound, name = CHECK_FIGURES[check]
            value, limit = verification.get(figure), bounds.get(bound)
            if value is not None:
                text = f"{check}: {name} {value:.3g}"
                described.append(text + (f" > {limit:g}" if limit is not None else ""))
                continue
        elif check == "tokens" and verification.get("bad_tokens") is not None:
            first = verification.get("first_mismatch")
            described.append(
                f"tokens: {verification['bad_tokens']} token(s) beyond the dtype's noise"
                + (f", the first at position {first}" if first is not None else "")
            )
            continue
        elif check in metrics:
            m = metrics[check]
            if m.get("median_ratio") is not None and m.get("median_bound") is not None:
                described.append(
                    f"{check}: {m.get('what') or check} median ratio {m['median_ratio']:.3g} "
                    f"> {m['median_bound']:g}"
                )
                continue
        described.append(check)
    return described


def first_divergence(row: Mapping[str, Any]) -> str | None:
    """Where a FAIL starts: the first diverging module, where it was found (the prefill, a
    decode step), its class and its error ratio (see history.divergence_line)."""
    return divergence_line(row)


def error_lines(row: Mapping[str, Any], limit: int = ERROR_LINES) -> list[str]:
    """The first non-empty lines of an ERROR's message (the compiler's own words first)."""
    text = row.get("error") or ""
    lines = [line.rstrip() for line in str(text).splitlines() if line.strip()]
    return lines[:limit]


def is_neuron(row: Mapping[str, Any]) -> bool:
    """Whether a row ran on the neuron backend."""
    return row.get("backend") == "neuron" or row.get("compiler") == "neuronx-cc"


def container_command(row: Mapping[str, Any], results: str) -> str:
    """A Neuron row's reproduction on another Trainium machine: ``model-support reproduce``
    writes its run.py and requirements, then ``docker run`` runs them in the row's own runner
    image (its TorchNeuron base when none was recorded) with the devices its cores need and its
    LNC. The store's credentials are the caller's environment, never written here."""
    from model_support.reproduce import base_image, json_object, neuron_docker_flags

    run_id = str(row["run_id"])
    stack = json_object(row.get("stack"))
    image, _ = base_image(True, stack, json_object(row.get("labels")).get("image"))
    cores = int(row.get("neuron_cores") or 1)
    lnc = None if row.get("lnc") is None else int(row["lnc"])
    flags = " ".join(neuron_docker_flags(cores, row.get("instance_type"), lnc))
    folder = shlex.quote(f"reproduce-{run_id}")
    return (
        f"model-support reproduce {shlex.quote(run_id)} --results {shlex.quote(results)} "
        f"-o {folder} && cd {folder} && docker run --rm -it {flags} "
        f'-v "$PWD":/work -w /work {shlex.quote(image)} '
        "sh -c 'python3 -m pip install -r requirements.txt && python3 run.py'"
    )


def evidence(row: Mapping[str, Any], results: str) -> Evidence:
    """What a bug report says of one run (see the module docstring)."""
    result = row.get("result")
    return Evidence(
        stack=_stack(row),
        failed_checks=failed_check_figures(row) if result == Result.FAIL.value else [],
        first_divergence=first_divergence(row) if result == Result.FAIL.value else None,
        error_class=row.get("error_class") if result == Result.ERROR.value else None,
        error_lines=error_lines(row)
        if result in (Result.ERROR.value, Result.TIMEOUT.value)
        else [],
        container=container_command(row, results) if is_neuron(row) else None,
    )


def attach(report: Report, store: ResultsStore, results: str) -> Report:
    """``report`` with each change's evidence read from ``store`` (``results``: the store's
    URI as another machine names it)."""
    attach_changes([*report.regressions, *report.fixes, *report.unconfirmed], store, results)
    return report


def attach_changes(changes: Sequence[Change], store: ResultsStore, results: str) -> None:
    """Each of ``changes`` given its evidence, read from ``store``."""
    rows = read_runs(store, [c.before_run_id for c in changes] + [c.after_run_id for c in changes])
    for change in changes:
        before, after = rows.get(change.before_run_id), rows.get(change.after_run_id)
        change.before_evidence = None if before is None else evidence(before, results)
        change.after_evidence = None if after is None else evidence(after, results)
