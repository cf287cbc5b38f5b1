"""A model that fits one core is sized from config.json and the safetensors headers alone.

Deriving metadata through transformers' config class imports torch and the model's code (seconds
of CPU beside a run that needs them too) only to learn how the model would be split. These tests
hold the shortcut to the full derivation's answer wherever it is taken, and show where it is not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_sizing import REAL, _decoder

from model_support.checkpoints import (
    LLAMA_3_1_405B_CONFIG,
    build_header_only_checkpoint,
    llama_tensors,
)
from model_support.config import RunConfig
from model_support.hardware import get_profile
from model_support.hub import local_config, local_tensors
from model_support.sizing import (
    SIZING_CACHE_ENV,
    Exclusion,
    MetadataError,
    Plan,
    header_metadata,
    memory_at,
    metadata_from_config,
    plan_from_metadata,
    run_shape,
    size_model,
    size_run,
    valid_parallelism,
)
from model_support.vocabulary import Parallelism

PROFILES = [
    ("trn2", None),
    ("trn2", 1),
    ("trn3", None),
    ("trn3", 1),
    ("trn1", None),
    ("inf2", None),
    ("cpu", None),
]
TEXT = "text-generation"


def _both(config: dict, tensors: list) -> tuple:
    header = header_metadata(config, tensors, model="m", task=TEXT)
    full = metadata_from_config(config, tensors, model="m", task=TEXT)
    return header, full


@pytest.mark.parametrize("name", [n for n, (c, _, _) in REAL.items() if "head_dim" in c])
@pytest.mark.parametrize(("profile", "lnc"), PROFILES)
def test_a_published_model_that_fits_one_core_gets_the_full_derivations_plan(
    name: str, profile: str, lnc: int | None
) -> None:
    config, layout, _ = REAL[name]
    header, full = _both(config, _decoder(config, **layout))
    assert header is not None and header.header_only
    if memory_at(header, get_profile(profile, lnc), 1, Parallelism.NONE).fits:
        expected = plan_from_metadata(full, profile=profile, lnc=lnc)
        assert plan_from_metadata(header, profile=profile, lnc=lnc) == expected
    # Forced to one core (--cores 1), the answer is the same whether or not it fits.
    assert plan_from_metadata(header, profile=profile, lnc=lnc, cores=1) == plan_from_metadata(
        full, profile=profile, lnc=lnc, cores=1
    )


@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen3_path", "tiny_qwen3_moe_path"])
def test_trained_checkpoints_read_the_same_from_their_headers(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    path = request.getfixturevalue(fixture)
    config, tensors = local_config(str(path)), local_tensors(str(path))
    header, full = _both(config, tensors)
    assert header is not None
    for field in ("num_hidden_layers", "num_key_value_heads", "head_dim", "task", "image_tokens"):
        assert getattr(header, field) == getattr(full, field), field
    assert not full.needs_remote_code and not header.needs_remote_code
    for profile, lnc in PROFILES:
        assert plan_from_metadata(header, profile=profile, lnc=lnc) == plan_from_metadata(
            full, profile=profile, lnc=lnc
        )


def test_a_header_answer_cannot_size_a_split() -> None:
    config, layout, _ = REAL["Qwen3-0.6B"]
    header, _ = _both(config, _decoder(config, **layout))
    assert header is not None
    assert valid_parallelism(header, 1) is Parallelism.NONE
    with pytest.raises(ValueError, match="sizes one core, not a split"):
        valid_parallelism(header, 2)


@pytest.mark.parametrize(
    ("change", "task"),
    [
        ({"head_dim": None}, TEXT),  # left to the config class's default
        ({"num_key_value_heads": None}, TEXT),
        ({"auto_map": {"AutoConfig": "c.C"}}, TEXT),  # remote code: the full path decides
        ({"text_config": {"num_hidden_layers": 2}}, TEXT),  # nested counts: the config class
        ({"model_type": None}, TEXT),
        ({}, "text2text-generation"),  # other tasks: which loader takes it is transformers'
        ({}, None),  # the task comes from transformers' auto classes
    ],
)
def test_what_config_json_alone_cannot_say_goes_the_full_way(
    change: dict, task: str | None
) -> None:
    config, layout, _ = REAL["Qwen3-0.6B"]
    tensors = _decoder(config, **layout)
    changed = {k: v for k, v in {**config, **change}.items() if v is not None}
    assert header_metadata(changed, tensors, model="m", task=task) is None
    assert header_metadata(config, None, model="m", task=TEXT) is None  # no safetensors


def test_a_zero_count_is_refused_on_the_header_path_too() -> None:
    config = REAL["Qwen3-0.6B"][0]
    with pytest.raises(MetadataError, match="num_key_value_heads to 0"):
        header_metadata({**config, "num_key_value_heads": 0}, [], model="m", task=TEXT)


PROBE = """
import json, sys
from model_support.checkpoints import (
    LLAMA_3_1_405B_CONFIG,
    build_header_only_checkpoint,
    llama_tensors,
)
from model_support.config import RunConfig
from model_support.hardware import get_profile
from model_support.sizing import size_run
cores = None if sys.argv[2] == "-" else int(sys.argv[2])
result = size_run(RunConfig(model=sys.argv[1], cores=cores or 1), profile=sys.argv[3], cores=cores)
print(json.dumps({"result": result.model_dump(mode="json"),
                  "imported_transformers": "transformers" in sys.modules}))
"""


def _size_run(checkpoint: Path, cache: Path, profile: str, cores: int | None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(checkpoint), str(cores or "-"), profile],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, SIZING_CACHE_ENV: str(cache)},
    )
    answer: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("cores", [None, 1])
def test_a_run_of_a_small_model_is_sized_without_importing_transformers(
    tiny_llama_path: Path, tmp_path: Path, cores: int | None
) -> None:
    """`model-support run` (and the operator) size through size_run: a model that fits one core,
    or a run given one core, costs no transformers import, even with an empty sizing cache."""
    answer = _size_run(tiny_llama_path, tmp_path / "cache", "trn2", cores)
    assert answer["imported_transformers"] is False
    path = str(tiny_llama_path)
    config = RunConfig(model=path, cores=cores or 1)
    full = metadata_from_config(
        local_config(path), local_tensors(path), model=path, source="local", task=TEXT
    )
    batch, max_length = run_shape(config)
    expected = plan_from_metadata(
        full, profile="trn2", batch=batch, max_length=max_length, cores=cores,
        parallelism=config.parallelism if cores else None,
    )  # fmt: skip
    assert isinstance(expected, Plan)
    assert answer["result"] == expected.model_dump(mode="json")


def test_a_model_too_large_for_one_core_is_sized_the_full_way(tmp_path: Path) -> None:
    """Llama-3.1-405B's shape (headers only, head_dim stated): the header path's one-core check
    fails, transformers derives the parallel plan, and the answer is the full derivation's."""
    config = {**LLAMA_3_1_405B_CONFIG, "head_dim": 128}
    path = build_header_only_checkpoint(tmp_path, "llama-405b", config, llama_tensors(config))
    answer = _size_run(path, tmp_path / "cache", "trn2", None)
    assert answer["imported_transformers"] is True
    full = size_run(RunConfig(model=str(path)), profile="trn2")
    assert isinstance(full, Exclusion) and full.reason.value == "too-large"
    assert answer["result"] == full.model_dump(mode="json")


def test_a_config_the_model_class_rejects_is_a_load_error_of_the_run(
    tiny_llama_path: Path, tmp_path: Path
) -> None:
    """What the header path leaves unchecked, the run's from_pretrained checks: a field of the
    wrong type passes sizing at one core and the run records a load ERROR, never a PASS; the
    full derivation (`size`) refuses the same config with a one-line reason."""
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_llama_path, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["rope_parameters"] = "not a mapping"
    (checkpoint / "config.json").write_text(json.dumps(config))
    cli = Path(sys.executable).with_name("model-support")
    done = subprocess.run(
        [str(cli), "run", str(checkpoint), "--compile-backend", "aot_eager", "--json",
         "--results", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, SIZING_CACHE_ENV: str(tmp_path / "cache")},
    )  # fmt: skip
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 1, done.stderr
    assert (summary["result"], summary["error_class"]) == ("ERROR", "load")
    assert "rope_parameters" in summary["error"]
    with pytest.raises(MetadataError, match=r"is not a valid llama config.*rope_parameters"):
        size_model(str(checkpoint), task=TEXT)
