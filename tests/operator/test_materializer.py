"""A store's matrix kept current as records arrive (operator/src/recording.py, Materializer):
the first record is folded at once, and a burst is folded in passes paced by their own length,
so rewriting the matrix never takes the whole of the operator's time."""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import pandas as pd
import pytest
from factories import make_record

from model_support.operator.recording import REST_PER_BUSY, Materializer
from model_support.store import ResultsStore

RUN_PY = "# run.py\n" + "x = 1\n" * 20_000  # run.py-sized, so a pass is not free


def passes(caplog: pytest.LogCaptureFixture) -> list[tuple[float, float, float]]:
    """Each materialize pass as its debug line tells it: (ended at, took, rest after)."""
    return [
        (r.created, float(r.args[1]), float(r.args[2]))  # type: ignore[index]
        for r in caplog.records
        if r.name == "model_support.operator.recording" and r.msg.startswith("materialized")
    ]


def test_a_burst_of_records_is_folded_in_paced_passes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="model_support.operator.recording")
    store = ResultsStore(str(tmp_path / "results"))
    materializer = Materializer(store, publish=False)
    models = [f"org/model-{i:03d}" for i in range(60)]

    store.add(make_record(models[0], run_py=RUN_PY))
    asked = time.time()
    materializer.request()
    for model in models[1:]:  # arriving while the first passes run, as a sweep's do
        store.add(make_record(model, run_py=RUN_PY))
        materializer.request()
    assert materializer.idle.wait(timeout=300), "the materializer never went idle"

    held = pd.read_parquet(tmp_path / "results" / "data")
    assert sorted(held["model_id"]) == models, "the matrix lacks records of the burst"
    seen = passes(caplog)
    assert len(seen) >= 2, f"the burst made {len(seen)} pass(es): not a burst"
    first_end, first_took, _ = seen[0]
    assert first_end - first_took - asked < 1.0, "the first record waited for its pass"
    for (end, took, rest), (next_end, next_took, _) in itertools.pairwise(seen):
        assert rest == pytest.approx(REST_PER_BUSY * took)
        started_after = (next_end - next_took) - end
        # logging stamps a record a little after the clock read: a small allowance.
        assert started_after >= rest - 0.01, (
            f"a pass of {took:.3f} s was followed by the next after {started_after:.3f} s, "
            f"not after its rest of {rest:.3f} s: back to back, the matrix takes the CPU"
        )
    assert seen[-1][2] == 0.0, "the last pass, with nothing pending, rests for nothing"
