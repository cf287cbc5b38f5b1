"""Confirming a regression here: the newer stack's run.py, run again in this environment until
the confirmation policy has its agreeing runs (or the runs disagree: the model is flaky).

A re-run confirms only when it runs on the same stack as the run it repeats: this machine must
have the row's compiler and library versions (and, for a Neuron row, Neuron devices). Each
re-run is recorded in the store like any run (labelled with the run it confirms), so the next
comparison counts it; the operator confirms a sweep's regressions the same way, as new tests.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from model_support.dataset import matrix_key
from model_support.history import Change, Confirmation, Report
from model_support.records import RunRecord, record_from_document

if TYPE_CHECKING:
    from model_support.store import ResultsStore

CONFIRMS_LABEL = "confirms"
"""The label of a re-run: the run id whose result it repeats."""


class CannotConfirmHere(RuntimeError):
    """This machine is not the row's stack: a re-run here would test something else."""


@dataclass(frozen=True)
class Rerun:
    """One re-run made to confirm a change, and whether it agreed."""

    change: Change
    record: RunRecord
    agrees: bool


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_same_stack(record: RunRecord) -> None:
    """Raise :class:`CannotConfirmHere` (saying what differs) unless this environment is the
    stack ``record`` ran on: its compiler and library versions, and its device."""
    key = matrix_key(record)
    stack = record.document.stack
    here = {"torch": _installed("torch"), "transformers": _installed("transformers")}
    wanted = {"torch": stack.torch, "transformers": stack.transformers}
    if key.compiler == "neuronx-cc":
        here["neuronx-cc"] = _installed("neuronx-cc")
        wanted["neuronx-cc"] = stack.neuronx_cc
        if importlib.util.find_spec("torch_neuronx") is None:
            raise CannotConfirmHere(
                f"run {record.run_id} ran on Neuron ({key.compiler} {key.compiler_version}); "
                "this machine has no torch-neuronx: confirm it on a Trainium machine with that "
                "stack, or let the operator's sweep re-run it"
            )
    differ = [
        f"{name} {wanted[name]} (here {here[name] or 'not installed'})"
        for name in wanted
        if wanted[name] is not None and here[name] != wanted[name]
    ]
    if differ:
        raise CannotConfirmHere(
            f"run {record.run_id} ran on another stack than this machine's: "
            + ", ".join(differ)
            + "; a re-run here would test another stack: confirm it where that stack is "
            "installed (or on the operator)"
        )


def confirm_here(
    store: ResultsStore,
    report: Report,
    confirmation: Confirmation,
    *,
    timeout_s: float,
    on_rerun: Callable[[Rerun], None] | None = None,
) -> list[Rerun]:
    """Re-run each unconfirmed worse result of ``report`` here, recording each re-run in
    ``store``, until ``confirmation.runs_needed`` runs agree or one disagrees (flaky); the
    store is materialized after. Raises :class:`CannotConfirmHere` before running anything
    when a row's stack is not this machine's."""
    from model_support.execution import run_script
    from model_support.script import read_config

    pending = [c for c in report.unconfirmed if c.kind == "regression"]
    originals = {c.after_run_id: store.get(c.after_run_id) for c in pending}
    for record in originals.values():
        check_same_stack(record)
    reruns: list[Rerun] = []
    for change in pending:
        original = originals[change.after_run_id]
        config = read_config(original.run_py)
        for _ in range(confirmation.runs_needed - change.runs_after):
            document = run_script(original.run_py, config, timeout_s=timeout_s)
            record = record_from_document(
                document,
                original.run_py,
                source=original.source,
                labels={**original.labels, CONFIRMS_LABEL: original.run_id},
            ).model_copy(update={"model_id": original.model_id})
            if matrix_key(record) != matrix_key(original):
                raise CannotConfirmHere(
                    f"the re-run of {original.run_id} ran on another stack "
                    f"({matrix_key(record)}) than the run it repeats ({matrix_key(original)}); "
                    "it was not recorded"
                )
            store.add(record)
            # Runs agree on their result (PASS, FAIL, ERROR...), as the history judges flakiness.
            agrees = record.document.result == original.document.result
            rerun = Rerun(change=change, record=record, agrees=agrees)
            reruns.append(rerun)
            if on_rerun is not None:
                on_rerun(rerun)
            if not agrees:
                break  # the runs disagree: flaky, whatever more runs would say
    if reruns:
        store.materialize()
    return reruns
