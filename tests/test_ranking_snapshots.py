"""Ranking snapshots: what a sweep ranked, kept with the dataset (rankings/snapshots/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from factories import make_record

from model_support.ranking_snapshots import RankingSnapshot
from model_support.store import ResultsStore, StoreError

T0 = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)


def snapshot(
    models: list[str], taken_at: datetime = T0, task: str | None = "text-generation"
) -> RankingSnapshot:
    return RankingSnapshot(
        taken_at=taken_at,
        kind="hub",
        source="hub:trending/text-generation/top3",
        models=models,
        task=task,
        sort="trending_score",
        limit=3,
        sweep="ml/nightly",
        epoch=0,
        run_key="k1",
        stack={"image": "reg.example/r:2.28", "profile": "trn2"},
    )


def test_snapshots_are_kept_in_order_beside_the_dataset(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    store.add(make_record())
    first = snapshot(["a/x", "b/y", "c/z"])
    later = snapshot(["b/y", "a/x", "d/w"], T0 + timedelta(hours=24))
    other_task = snapshot(["v/l"], T0 + timedelta(hours=25), task="image-text-to-text")
    paths = [store.add_ranking_snapshot(s) for s in (later, first, other_task)]
    assert all(Path(p).parent == tmp_path / "results" / "rankings" / "snapshots" for p in paths)
    # Oldest first whatever the order of writing; the ranked order of ids is kept as it was.
    assert store.ranking_snapshots() == [first, later, other_task]
    assert store.latest_ranking_snapshot("text-generation") == later
    assert store.latest_ranking_snapshot() == other_task
    assert store.latest_ranking_snapshot("image-text-to-text") == other_task
    # The same snapshot twice is one file; the dataset is untouched by snapshots.
    store.add_ranking_snapshot(first)
    assert len(store.ranking_snapshots()) == 3
    store.materialize()
    assert len(pd.read_parquet(tmp_path / "results" / "data")) == 1


def test_no_snapshot_is_none_and_a_malformed_one_is_a_clear_error(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    store.add(make_record())
    assert store.latest_ranking_snapshot() is None and store.ranking_snapshots() == []
    store.add_ranking_snapshot(snapshot(["a/x"]))
    bad = tmp_path / "results" / "rankings" / "snapshots" / "20261201T000000000000Z-bad.json"
    bad.write_text('{"kind": "hub"}')
    with pytest.raises(StoreError, match=r"ranking snapshot .*bad\.json is malformed"):
        store.ranking_snapshots()
