"""Hub rankings: the Hub's own lists of models per task, by trending score or downloads.

A ranking is fetched live with ``HfApi.list_models`` and, whenever that succeeds, stored with the
dataset as a snapshot (``<results>/rankings/<task>-<sort>.json``) so the viewer can still show the
last known ranking (and say how old it is) when the Hub cannot be reached.

These functions have no Streamlit dependency; the viewer wraps :func:`get_ranking` in
``st.cache_data`` with a TTL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import fsspec
from huggingface_hub import HfApi
from huggingface_hub.errors import HTTPError
from huggingface_hub.utils import get_session
from pydantic import BaseModel, Field, ValidationError

RankingSort = Literal["trending_score", "downloads", "likes"]
RANKING_SORTS: tuple[RankingSort, ...] = ("trending_score", "downloads", "likes")
DEFAULT_LIMIT = 50
PROBE_TIMEOUT_S = 5.0
"""How long the reachability probe waits. list_models itself retries for ~25 s on connection
errors, far too long for a page load, so an unreachable Hub is detected up front."""

_EXPAND = [
    "downloads",
    "likes",
    "trendingScore",
    "pipeline_tag",
    "gated",
    "library_name",
    "safetensors",
]


class RankingError(Exception):
    """A ranking could not be fetched or read; the message says what and what to do."""


class RankedModel(BaseModel):
    """One model of a Hub ranking, with what the Hub says about it."""

    rank: int = Field(..., ge=1)
    model_id: str
    pipeline_tag: str | None = None
    downloads: int | None = None
    likes: int | None = None
    trending_score: float | None = None
    gated: str | None = Field(
        None, description="'auto' or 'manual' for gated repositories, else None."
    )
    library_name: str | None = None
    parameters: int | None = Field(
        None, description="Total parameters from the safetensors metadata, when the Hub has it."
    )


class Ranking(BaseModel):
    """A ranking as fetched from the Hub at one moment."""

    task: str
    sort: RankingSort
    endpoint: str
    fetched_at: datetime
    models: list[RankedModel]

    def age(self, now: datetime | None = None) -> timedelta:
        """How long ago the ranking was fetched."""
        return (now or datetime.now(UTC)) - self.fetched_at


class RankingResult(BaseModel):
    """What the page shows: a ranking (live or stored), or why there is none."""

    task: str
    sort: RankingSort
    ranking: Ranking | None = None
    source: Literal["live", "snapshot", "none"] = "none"
    live_error: str | None = Field(
        None, description="Why the live fetch failed (source is then snapshot or none)."
    )
    snapshot_error: str | None = Field(None, description="Why no stored snapshot could be used.")
    save_error: str | None = Field(
        None, description="Why a live ranking could not be stored (e.g. read-only location)."
    )


def fetch_ranking(
    task: str,
    sort: RankingSort,
    *,
    limit: int = DEFAULT_LIMIT,
    endpoint: str | None = None,
    token: str | bool | None = None,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    library: str | None = None,
) -> Ranking:
    """Fetch the Hub's ranking of ``task`` models sorted by ``sort`` (descending), top ``limit``
    (only models of ``library``, e.g. transformers, when given).

    Raises RankingError when the Hub cannot be reached or answers with an error.
    """
    if sort not in RANKING_SORTS:
        raise RankingError(f"unknown ranking sort {sort!r}; use one of {', '.join(RANKING_SORTS)}")
    if limit < 1:
        raise RankingError(f"ranking limit must be at least 1, got {limit}")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        # Fail fast when the Hub is unreachable (see PROBE_TIMEOUT_S).
        probe = get_session().get(
            f"{api.endpoint}/api/models", params={"limit": 1}, timeout=probe_timeout_s
        )
        probe.raise_for_status()
        infos = list(
            api.list_models(
                sort=sort,
                pipeline_tag=task,
                filter=library,  # the Hub lists a model's library among its tags
                limit=limit,
                expand=list(_EXPAND),  # type: ignore[arg-type]
            )
        )
    except (HTTPError, OSError) as exc:
        raise RankingError(
            f"the Hub at {api.endpoint} could not be reached or refused the listing "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    models = []
    for rank, info in enumerate(infos, start=1):
        gated = info.gated if isinstance(info.gated, str) else None
        parameters = info.safetensors.total if info.safetensors is not None else None
        models.append(
            RankedModel(
                rank=rank,
                model_id=info.id,
                pipeline_tag=info.pipeline_tag,
                downloads=info.downloads,
                likes=info.likes,
                trending_score=info.trending_score,
                gated=gated,
                library_name=info.library_name,
                parameters=parameters,
            )
        )
    return Ranking(
        task=task, sort=sort, endpoint=api.endpoint, fetched_at=datetime.now(UTC), models=models
    )


def snapshot_path(results_uri: str, task: str, sort: RankingSort) -> str:
    """Where the last ranking of ``task`` by ``sort`` is stored with the dataset."""
    return f"{results_uri.rstrip('/')}/rankings/{task}-{sort}.json"


def save_snapshot(results_uri: str, ranking: Ranking) -> str:
    """Store ``ranking`` with the dataset; returns its path. Raises OSError when not writable."""
    path = snapshot_path(results_uri, ranking.task, ranking.sort)
    fs, fs_path = fsspec.core.url_to_fs(path)
    fs.makedirs(fs_path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(fs_path, "w") as handle:
        handle.write(ranking.model_dump_json(indent=1))
    return path


def load_snapshot(results_uri: str, task: str, sort: RankingSort) -> Ranking | None:
    """The stored ranking, or None when none was ever stored.

    Raises RankingError when the stored file is unreadable or malformed.
    """
    path = snapshot_path(results_uri, task, sort)
    fs, fs_path = fsspec.core.url_to_fs(path)
    try:
        if not fs.exists(fs_path):
            return None
        with fs.open(fs_path, "r") as handle:
            text = handle.read()
    except OSError as exc:
        raise RankingError(f"the stored ranking {path} could not be read ({exc})") from exc
    try:
        return Ranking.model_validate_json(text)
    except ValidationError as exc:
        raise RankingError(
            f"the stored ranking {path} is malformed ({exc.error_count()} problems, first: "
            f"{exc.errors()[0]['msg']}); delete it and fetch again while the Hub is reachable"
        ) from exc


def get_ranking(
    results_uri: str | None,
    task: str,
    sort: RankingSort,
    *,
    limit: int = DEFAULT_LIMIT,
    endpoint: str | None = None,
    token: str | bool | None = None,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    unreachable: str | None = None,
) -> RankingResult:
    """Live ranking if the Hub answers (stored as the new snapshot), else the stored snapshot.

    ``unreachable``: why the Hub already failed to answer (for another task of the same page);
    then only the snapshot is read, so a page of many tasks waits for one probe, not one each.
    Never raises for an unreachable Hub or a missing snapshot: the result says what happened.
    """
    result = RankingResult(task=task, sort=sort)
    try:
        if unreachable is not None:
            raise RankingError(unreachable)
        ranking = fetch_ranking(
            task, sort, limit=limit, endpoint=endpoint, token=token, probe_timeout_s=probe_timeout_s
        )
    except RankingError as exc:
        result.live_error = str(exc)
    else:
        result.ranking, result.source = ranking, "live"
        if results_uri:
            try:
                save_snapshot(results_uri, ranking)
            except (OSError, NotImplementedError) as exc:
                # A read-only dataset (e.g. someone else's hf:// dataset) is normal: keep going.
                result.save_error = f"{type(exc).__name__}: {exc}"
        return result
    if not results_uri:
        result.snapshot_error = "no results location is set, so no stored ranking exists"
        return result
    try:
        snapshot = load_snapshot(results_uri, task, sort)
    except RankingError as exc:
        result.snapshot_error = str(exc)
        return result
    if snapshot is None:
        result.snapshot_error = (
            f"no stored ranking at {snapshot_path(results_uri, task, sort)}; one is written the "
            "first time the Hub is reachable"
        )
        return result
    result.ranking, result.source = snapshot, "snapshot"
    return result


def format_age(age: timedelta) -> str:
    """A short human age: '3 minutes', '5 hours', '2 days'."""
    seconds = max(int(age.total_seconds()), 0)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"
