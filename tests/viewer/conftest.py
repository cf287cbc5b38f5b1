"""Fixtures of the viewer tests (defined in viewer_support.py, which the tests also import)."""

from viewer_support import (
    _fresh_streamlit_caches,
    dataset,
    dead_hub,
    explained_dataset,
    hostile_dataset,
    hub,
    long_dataset,
    task_dataset,
)

__all__ = [
    "_fresh_streamlit_caches",
    "dataset",
    "dead_hub",
    "explained_dataset",
    "hostile_dataset",
    "hub",
    "long_dataset",
    "task_dataset",
]
