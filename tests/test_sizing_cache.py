"""Sizing remembers what it derived: the same checkpoint sized again costs no transformers import.

Each check runs in a fresh process, as users run `model-support size` and `run`, with its own
cache folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_support.sizing import SIZING_CACHE_ENV

PROBE = """
import json, sys
from model_support.sizing import size_model
result = size_model(sys.argv[1], profile="trn2")
print(json.dumps({"result": result.model_dump(mode="json"),
                  "imported_transformers": "transformers" in sys.modules}))
"""


def _size(checkpoint: Path, cache: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, SIZING_CACHE_ENV: str(cache)},
    )
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_sizing_a_checkpoint_again_reads_the_remembered_answer(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = _size(tiny_llama_path, cache)
    again = _size(tiny_llama_path, cache)
    assert first["imported_transformers"] is True
    assert again["imported_transformers"] is False
    assert again["result"] == first["result"]


def test_a_changed_checkpoint_is_never_answered_from_an_old_entry(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_llama_path, checkpoint)
    assert _size(checkpoint, cache)["result"]["cores"] == 1  # type: ignore[index]
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_x.XConfig"}
    config["model_type"] = "not-built-in"
    (checkpoint / "config.json").write_text(json.dumps(config))
    changed = _size(checkpoint, cache)
    assert changed["result"]["reason"] == "remote-code-required"  # type: ignore[index]


@pytest.mark.parametrize("damage", ["corrupt entry", "unwritable folder"])
def test_the_cache_is_optional(tiny_llama_path: Path, tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    expected = _size(tiny_llama_path, cache)["result"]
    if damage == "corrupt entry":
        for entry in cache.iterdir():
            entry.write_text("{not json")
    else:
        shutil.rmtree(cache)
        cache.write_text("a file where the folder should be")
    answer = _size(tiny_llama_path, cache)
    assert answer["result"] == expected and answer["imported_transformers"] is True
