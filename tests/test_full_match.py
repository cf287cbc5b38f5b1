"""A name checked by a pattern is the whole name: a trailing newline is not a valid ending.

Python's ``re.match`` with a pattern that ends in ``$`` accepts a string with one more "\\n"
(``$`` matches before a final newline); every check here matches the whole string instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from model_support.compile_cache import layouts
from model_support.compile_cache.compilers import describe_prefix
from model_support.delivery import slot_for
from model_support.models import BadModelReference, check_model_id
from model_support.operator.spec import CompileCacheSpec, SpecError, parse_spec
from model_support.store import ResultsStore


def _store_get(tmp_path: Path) -> Callable[[str], object]:
    store = ResultsStore(str(tmp_path / "results"))
    return store.get


CHECKS: list[tuple[str, Callable[[Path], Callable[[str], object]], str, type[Exception]]] = [
    ("model id", lambda _: check_model_id, "org/name", BadModelReference),
    ("run id", _store_get, "20260101T000000000000Z-abc", ValueError),
    ("delivery run id", lambda _: lambda v: slot_for(v, b"k" * 32), "op-abc", ValueError),
    (
        "results store",
        lambda _: lambda v: parse_spec({"model": "a/b", "results": v}),
        "/results/team-a",
        SpecError,
    ),
    (
        "compile cache location",
        lambda _: lambda v: CompileCacheSpec(target=v),
        "s3://team-cache/neff",
        ValidationError,
    ),
]


@pytest.mark.parametrize(("what", "check", "valid", "error"), CHECKS, ids=[c[0] for c in CHECKS])
def test_a_trailing_newline_is_refused(
    tmp_path: Path,
    what: str,
    check: Callable[[Path], Callable[[str], object]],
    valid: str,
    error: type[Exception],
) -> None:
    with pytest.raises(error):
        check(tmp_path)(valid + "\n")


def test_cache_names_with_a_trailing_newline_are_not_entries_or_prefixes() -> None:
    entry = "3f/a2/3fa2" + "0" * 28 + ".neff"
    assert layouts.is_entry_path("neff", entry)
    assert not layouts.is_entry_path("neff", entry + "\n")
    assert describe_prefix("neuronxcc-2.28.0") == "neuronx-cc 2.28.0"
    assert describe_prefix("neuronxcc-2.28.0\n") == "neuronxcc-2.28.0\n"  # not a prefix
