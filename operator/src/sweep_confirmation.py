"""A sweep's regressions, confirmed by re-runs before they count.

One run decides nothing: a test whose result got worse than the previous run key's (the
baseline) is run again ``spec.confirm.reruns`` times, each re-run a ModelSupportTest of its own
(the same spec, named after the first test with ``-r1``, ``-r2`` ..., see
``sweep_manifests.rerun_name``), so that each is its own recorded run and the first is never
replaced. A test's lifecycle ends at Completed (a new generation would start a clean status
and take the first result's place), which is why a re-run is a new test and not a new attempt.

The verdict, per model of the current run key, is the same as ``model-support regressions``
gives a stack's runs (``model_support/confirm.py``): runs agree when their results are equal;

* every re-run finished and agreeing: a **regression** (counted, listed, told);
* a finished re-run that disagrees: the model is **flaky**, with its runs, never a regression
  or a fix (whatever the other re-runs say);
* otherwise it is **confirming**: its missing re-runs are created as slots free.

Pure: the reconciler reads the tests and makes the API calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from model_support.operator.sweep_status import SweepBaseline, SweepFlaky, SweepRegression
from model_support.vocabulary import is_regression

INVALID = "Invalid"
"""What a re-run that ended without a result (its phase Invalid) counts as."""


@dataclass(frozen=True)
class Run:
    """One test of a model under the current run key, as far as it got."""

    done: bool
    result: str | None
    """Its result (:data:`INVALID` for an Invalid test; None while not done)."""
    run_id: str | None


@dataclass
class Judged:
    """The current run's worse results, judged by their re-runs."""

    regressions: list[SweepRegression] = field(default_factory=list)
    flaky: list[SweepFlaky] = field(default_factory=list)
    missing: dict[str, list[int]] = field(default_factory=dict)
    """Model -> the numbers (from 1) of the re-runs it still needs under this run key: no test
    of this key yet (never made, or made under an earlier key)."""
    confirming: list[str] = field(default_factory=list)
    """Models whose worse result waits for re-runs (missing or unfinished)."""


def judge(
    baseline: SweepBaseline | None,
    first: Mapping[str, Run],
    reruns: Mapping[str, Sequence[Run | None]],
    wanted: int,
) -> Judged:
    """Judge each model whose ``first`` run (finished, under the current run key) is worse
    than ``baseline``; ``reruns[model][n - 1]`` is its re-run ``n`` under the current key (None:
    no such test yet); ``wanted`` re-runs confirm one."""
    judged = Judged()
    if baseline is None:
        return judged
    for model in sorted(first):
        run = first[model]
        before = baseline.results.get(model)
        if not run.done or not is_regression(before, run.result):
            continue
        assert before is not None and run.result is not None  # a regression has both
        again = list(reruns.get(model) or [])[:wanted]
        again += [None] * (wanted - len(again))
        finished = [r for r in again if r is not None and r.done]
        runs = [run, *finished]
        ids = [r.run_id or "" for r in runs]
        if any(r.result != run.result for r in finished):
            judged.flaky.append(
                SweepFlaky(
                    model=model, before=before, results=[str(r.result) for r in runs], runs=ids
                )
            )
        elif len(finished) == wanted:
            judged.regressions.append(
                SweepRegression(model=model, before=before, after=run.result, runs=ids)
            )
        else:
            judged.confirming.append(model)
            gaps = [n for n, r in enumerate(again, 1) if r is None]
            if gaps:
                judged.missing[model] = gaps
    return judged


__all__ = ["INVALID", "Judged", "Run", "judge"]
