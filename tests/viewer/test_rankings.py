"""Hub rankings through the real huggingface_hub client against a local stand-in Hub."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from model_support.rankings import (
    Ranking,
    RankingError,
    fetch_ranking,
    format_age,
    get_ranking,
    load_snapshot,
    snapshot_path,
)


def test_fetch_orders_by_trending_score_and_filters_by_task(hub: str) -> None:
    ranking = fetch_ranking("text-generation", "trending_score", limit=3, endpoint=hub)
    assert [m.model_id for m in ranking.models] == [
        "brand/new-model",
        "deepseek-ai/DeepSeek-V3",
        "Qwen/Qwen3-1.7B",
    ]
    assert [m.rank for m in ranking.models] == [1, 2, 3]
    assert ranking.models[1].parameters == 671_000_000_000
    assert ranking.models[0].parameters is None


def test_fetch_by_downloads_sends_the_hub_query(hub: str) -> None:
    ranking = fetch_ranking("image-text-to-text", "downloads", limit=10, endpoint=hub)
    assert [m.model_id for m in ranking.models] == ["some/vision-model", "llava-hf/llava-1.5-7b-hf"]
    llama = fetch_ranking("text-generation", "downloads", endpoint=hub).models
    assert next(m for m in llama if m.model_id == "meta-llama/Llama-3.2-1B").gated == "manual"


def test_fetch_by_likes_and_library(hub: str) -> None:
    """The sweeps' sorts and library filter go to the Hub's own query."""
    by_likes = fetch_ranking("text-generation", "likes", limit=50, endpoint=hub)
    likes = [m.likes or 0 for m in by_likes.models]
    assert likes == sorted(likes, reverse=True) and by_likes.sort == "likes"
    everything = fetch_ranking("text-generation", "downloads", limit=50, endpoint=hub)
    libraries = {m.library_name for m in everything.models}
    for library in libraries - {None}:
        only = fetch_ranking(
            "text-generation", "downloads", limit=50, endpoint=hub, library=library
        )
        assert only.models and {m.library_name for m in only.models} == {library}
    assert (
        fetch_ranking(
            "text-generation", "downloads", endpoint=hub, library="no-such-library"
        ).models
        == []
    )


def test_live_ranking_is_stored_with_the_dataset(hub: str, tmp_path: Path) -> None:
    result = get_ranking(str(tmp_path), "text-generation", "downloads", endpoint=hub)
    assert result.source == "live" and result.save_error is None
    stored = json.loads(
        Path(snapshot_path(str(tmp_path), "text-generation", "downloads")).read_text()
    )
    assert stored["models"][0]["model_id"] == "Qwen/Qwen3-0.6B"


def test_unreachable_hub_falls_back_to_the_snapshot(
    hub: str, dead_hub: str, tmp_path: Path
) -> None:
    get_ranking(str(tmp_path), "text-generation", "trending_score", endpoint=hub)
    result = get_ranking(str(tmp_path), "text-generation", "trending_score", endpoint=dead_hub)
    assert result.source == "snapshot"
    assert result.live_error is not None and "could not be reached" in result.live_error
    assert result.ranking is not None and result.ranking.models[0].model_id == "brand/new-model"


def test_unreachable_hub_and_no_snapshot_says_both(dead_hub: str, tmp_path: Path) -> None:
    result = get_ranking(str(tmp_path), "text-generation", "downloads", endpoint=dead_hub)
    assert result.source == "none" and result.ranking is None
    assert (
        result.snapshot_error is not None
        and "text-generation-downloads.json" in result.snapshot_error
    )


def test_malformed_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    path = Path(snapshot_path(str(tmp_path), "text-generation", "downloads"))
    path.parent.mkdir(parents=True)
    path.write_text('{"task": "text-generation"}')
    with pytest.raises(RankingError, match="malformed"):
        load_snapshot(str(tmp_path), "text-generation", "downloads")


def test_read_only_location_keeps_the_live_ranking(hub: str, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = get_ranking(str(blocker), "text-generation", "downloads", endpoint=hub)
    assert result.source == "live" and result.save_error is not None


def test_bad_arguments_are_refused(hub: str) -> None:
    with pytest.raises(RankingError, match="unknown ranking sort"):
        fetch_ranking("text-generation", "stars", endpoint=hub)  # type: ignore[arg-type]
    with pytest.raises(RankingError, match="at least 1"):
        fetch_ranking("text-generation", "downloads", limit=0, endpoint=hub)


def test_age_and_its_words() -> None:
    ranking = Ranking(
        task="t",
        sort="downloads",
        endpoint="e",
        fetched_at=datetime(2026, 1, 1, tzinfo=UTC),
        models=[],
    )
    assert ranking.age(datetime(2026, 1, 3, 1, tzinfo=UTC)) == timedelta(days=2, hours=1)
    assert format_age(timedelta(days=2, hours=1)) == "2 days"
    assert format_age(timedelta(minutes=1, seconds=5)) == "1 minute"
    assert format_age(timedelta(seconds=3)) == "3 seconds"
