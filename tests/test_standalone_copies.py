"""run.py stands alone and the package does not import it: what both need is written in both.

The package keeps copies of run.py's drawn inputs (the test images' patterns, the tone-spelled
speech) for the builders of the tiny checkpoints, and of the verdict's router-tie definition
for the quality check of a mixture of experts. Each copy is run.py's source, byte for byte.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import pytest
import torch

from model_support import drawn_inputs, fixture_quality, router_ties
from model_support.checkpoints import DemoModel
from model_support.runner import run as runner
from model_support.script import template_text

ROOT = Path(__file__).resolve().parents[1]
COPIES: dict[ModuleType, tuple[str, ...]] = {
    drawn_inputs: (
        "TONE_ALPHABET", "TONE_SECONDS", "TONE_LOW_HZ", "TONE_HIGH_HZ",
        "tone_frequency", "spoken_waveform", "draw_pattern",
    ),
    router_ties: ("moe_routers", "observe_routers", "router_gap_and_noise", "router_tie_mask"),
}  # fmt: skip


def _top_level_sources(source: str) -> dict[str, str]:
    """Each top-level function's and assignment's source in ``source``, by name."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = ast.get_source_segment(source, node) or ""
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                for name in names:
                    if isinstance(name, ast.Name):
                        found[name.id] = ast.get_source_segment(source, node) or ""
    return found


@pytest.mark.parametrize("module", list(COPIES), ids=lambda m: m.__name__)
def test_the_package_s_copies_of_run_py_are_its_source(module: ModuleType) -> None:
    ours = _top_level_sources(inspect.getsource(module))
    theirs = _top_level_sources(template_text())
    for name in COPIES[module]:
        assert name in theirs, f"run.py no longer defines {name}: drop the copy in {module}"
        assert ours.get(name) == theirs[name], f"{module.__name__}.{name} differs from run.py's"
    # A function of the module that is not in the list is no copy (and not checked): say so.
    copied = {n for n, src in ours.items() if theirs.get(n) == src}
    assert copied == set(COPIES[module])


def test_the_fixture_builders_and_their_quality_checks_do_not_import_run_py() -> None:
    for name in ("checkpoints.py", "task_fixtures.py", "fixture_quality.py", "fixture_training.py"):
        text = (ROOT / "model_support" / name).read_text(encoding="utf-8")
        assert "model_support.runner" not in text, name


def _runner_router_ties(path: Path) -> list[torch.Tensor]:
    """The router ties as run.py's own functions find them (what the package's copy replaces)."""
    from model_support.config import RunConfig

    config = RunConfig(model=str(path)).model_dump(mode="json")
    processor, model = runner.scenario_for(config["task"]).load(
        config, "bfloat16", torch.device("cpu")
    )
    inputs = runner.build_inputs(config, processor, config["prompts"])
    pad = int(runner.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        out = runner.generate(model, inputs, config["max_new_tokens"], pad)
    tokens = out.sequences[:, inputs["input_ids"].shape[1] :]
    del model
    scored = runner.score_reference(
        config, processor, config["prompts"], tokens, "bfloat16", "ieee"
    )
    return [
        runner.router_tie_mask(gaps, noise, config["verification"])
        for gaps, noise in zip(scored["router_gaps"], scored["router_noise"], strict=True)
    ]


def test_a_mixture_of_experts_ties_are_the_ones_run_py_finds(
    demo_models: dict[str, DemoModel],
) -> None:
    path = demo_models["tiny-qwen3-moe"].require_path()
    ours, theirs = fixture_quality.router_ties(path), _runner_router_ties(path)
    assert len(ours) == len(theirs) == 3  # the default prompts
    assert any(bool(mask.any()) for mask in ours)  # the band it was built to: ties exist
    for mine, run_py in zip(ours, theirs, strict=True):
        assert torch.equal(mine, run_py)
