"""What a sweep would cost before it runs: the cores each model takes (sizing) and the core-hours
and dollars expected from past runs of the same models.

The expected time a test holds its cores comes, in order of preference, from the model's own
past runs of the task (median ``held_s`` in the store's history), from past runs of any model
on the same number of cores (median), or from :data:`DEFAULT_HOURS_BY_CORES`, a stated
assumption printed with the estimate. An excluded model costs nothing: it is never run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from model_support.pricing import PriceTable

DEFAULT_HOURS_BY_CORES: dict[int, float] = {1: 0.25, 2: 0.5, 4: 0.75, 8: 1.0, 16: 1.5}
"""Assumed hours a test holds its cores when no past run says better, by the cores it takes
(more cores: a larger model, longer to load and compile); above 16 cores, 2 hours."""

Basis = Literal["model", "cores", "default", "excluded"]


def default_hours(cores: int) -> float:
    """:data:`DEFAULT_HOURS_BY_CORES` for ``cores`` (the next larger entry; 2 h above 16)."""
    for bound in sorted(DEFAULT_HOURS_BY_CORES):
        if cores <= bound:
            return DEFAULT_HOURS_BY_CORES[bound]
    return 2.0


@dataclass(frozen=True)
class Sizing:
    """What sizing said of one model: its cores, or why it is excluded."""

    cores: int | None
    excluded: str | None = None


@dataclass(frozen=True)
class ModelEstimate:
    """One model of a sweep: its cores, the hours it is expected to hold them and why."""

    model: str
    task: str
    cores: int | None
    excluded: str | None
    hours: float
    basis: Basis
    past_runs: int
    core_hours: float
    cost_usd: float | None


@dataclass(frozen=True)
class SweepEstimate:
    """Every model's estimate and the sweep's totals."""

    models: tuple[ModelEstimate, ...]
    instance_type: str | None
    core_hour_usd: float | None

    @property
    def core_hours(self) -> float:
        return sum(m.core_hours for m in self.models)

    @property
    def cost_usd(self) -> float | None:
        return None if self.core_hour_usd is None else self.core_hours * self.core_hour_usd


def estimate_sweep(
    models: Sequence[tuple[str, str]],
    size: Callable[[str, str], Sizing],
    history: pd.DataFrame,
    prices: PriceTable,
    instance_type: str | None,
    lnc: int | None = None,
    neuron: bool = True,
    id_of: Callable[[str], str] = str,
) -> SweepEstimate:
    """Estimate a sweep of ``models`` ((model id, task) pairs) sized by ``size``, from the
    store's ``history`` (columns model_id, task, neuron_cores, held_s and, when given,
    compiler), priced per core-hour of ``instance_type`` by ``prices``.

    ``neuron``: whether the sweep runs on Neuron; past runs count only when they ran on the
    same side (a CPU run's hours say nothing of a Trainium run's), and a sweep off Neuron is
    never priced as the table's default (Trainium) instance. ``id_of``: the id results name a
    model by (a local checkpoint's folder is ``local/<name>`` there)."""
    rate = prices.core_hour_usd(instance_type, lnc, neuron)
    if "compiler" in history.columns and not history.empty:
        on_neuron = history["compiler"].astype("object") == "neuronx-cc"
        history = history[on_neuron if neuron else ~on_neuron]
    runs = history.dropna(subset=["held_s"]) if not history.empty else history
    runs = runs[runs["held_s"] > 0] if not runs.empty else runs
    by_model = (
        runs.groupby(["model_id", "task"])["held_s"].agg(["median", "size"])
        if not runs.empty
        else pd.DataFrame(columns=["median", "size"])
    )
    by_cores = (
        runs.groupby("neuron_cores")["held_s"].agg(["median", "size"])
        if not runs.empty
        else pd.DataFrame(columns=["median", "size"])
    )
    estimates = []
    for model, task in models:
        sizing = size(model, task)
        if sizing.cores is None:
            estimates.append(
                ModelEstimate(model, task, None, sizing.excluded, 0.0, "excluded", 0, 0.0, 0.0)
            )
            continue
        cores = sizing.cores
        if (id_of(model), task) in by_model.index:
            median, count = by_model.loc[(id_of(model), task)]
            hours, basis, past = float(median) / 3600, "model", int(count)
        elif cores in by_cores.index:
            median, count = by_cores.loc[cores]
            hours, basis, past = float(median) / 3600, "cores", int(count)
        else:
            hours, basis, past = default_hours(cores), "default", 0
        core_hours = hours * cores
        estimates.append(
            ModelEstimate(
                model=model,
                task=task,
                cores=cores,
                excluded=None,
                hours=hours,
                basis=basis,  # type: ignore[arg-type]
                past_runs=past,
                core_hours=core_hours,
                cost_usd=None if rate is None else core_hours * rate,
            )
        )
    return SweepEstimate(tuple(estimates), instance_type, rate)
