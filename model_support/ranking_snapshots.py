"""The ranking a sweep tested from: when it was taken, from what source, the model ids in order.

A snapshot is written to the results store (``rankings/snapshots/``, see
:meth:`model_support.store.ResultsStore.add_ranking_snapshot`) every time a sweep ranks its
models, so the dataset says which models a sweep meant to test and when, next to the records of
what ran. Snapshots are immutable: a re-ranking is a new snapshot.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SourceKind = Literal["hub", "models", "selected"]


class RankingSnapshot(BaseModel):
    """One ranking as a sweep used it."""

    model_config = ConfigDict(extra="forbid")

    taken_at: datetime = Field(..., description="When the ranking was fetched (UTC).")
    kind: SourceKind = Field(..., description="hub ranking, explicit model list, selected list.")
    source: str = Field(
        ..., description="The source in words, e.g. hub:trending/text-generation/top200."
    )
    models: list[str] = Field(default_factory=list, description="Model ids, best ranked first.")
    task: str | None = None
    sort: str | None = Field(None, description="Hub sort key (trending_score, downloads, likes).")
    limit: int | None = None
    library: str | None = None
    endpoint: str | None = Field(None, description="The Hub endpoint ranked from (hub only).")
    sweep: str | None = Field(None, description="namespace/name of the sweep that ranked.")
    epoch: int | None = None
    run_key: str | None = Field(None, description="The sweep's epoch + stack key.")
    stack: dict[str, str] = Field(default_factory=dict, description="image, profile, versions.")

    def file_name(self) -> str:
        """Its name in the store: the time first (names sort by time), then a content hash."""
        taken = self.taken_at.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
        return f"{taken}-{digest}.json"


def now() -> datetime:
    """The current time, as snapshots record it."""
    return datetime.now(UTC)
