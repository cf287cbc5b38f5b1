"""What the first-divergence search costs beside the run: a decode step's search on the demo's models.

On a FAIL, run.py searches the first module whose compiled output diverges. When the FAIL
first shows at a decode step, the search replays the run's generation on the float32
reference up to that step and compiles every level it opens with that step's shapes (one
token per sequence against the static cache); a FAIL from the first token is searched on the
whole sequence at once. A PASS pays nothing (``verification.localize`` is ``on_fail``).

Each case runs run.py as a real run does (its own process, ``model_support.execution.
run_local``), 32 tokens, on the demo's tiny checkpoints with a fault backend:

- decode: ``cache_write_noise`` from decode step 16 (tiny-llama, and the tiny Llava's
  language model), ``decode_expert_scaled`` (tiny-qwen3-moe: wrong from the first decode step
  routed to expert 2; the search also measures each expert alone);
- prefill, for comparison: ``dense_miscompiler`` (tiny-llama, wrong from the first token).

Printed per case (medians over the repeats): the run's time (load, compile and first
generation, steady generation, verdict, total before the search) and its host peak memory,
beside the search's time and how much it raised the host's peak memory, with the ratios.
Run: python benchmarks/localization_cost.py [--repeats 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.config import RunConfig
from model_support.execution import run_local
from model_support.vocabulary import Result, Task

NEW_TOKENS = 32
FAULT_STEP = 16  # the decode step from which cache_write_noise corrupts the cache


@dataclass(frozen=True)
class Case:
    model: str
    task: Task
    fault: str
    env: tuple[tuple[str, str], ...] = ()


def _prompt_length(path: str, task: Task) -> int:
    """The run's padded prompt length: the cache positions its prefill writes."""
    import torch

    from model_support.runner import run as runner

    config = RunConfig(model=path, task=task).model_dump(mode="json")
    scenario = runner.scenario_for(config["task"])
    processor, _ = scenario.load(config, "float32", torch.device("cpu"))
    return int(runner.build_inputs(config, processor, config["prompts"])["input_ids"].shape[1])


def cases() -> list[Case]:
    paths = {
        m.name: str(m.require_path())
        for m in build_demo_models(
            default_cache_dir(), ["tiny-llama", "tiny-qwen3-moe", "tiny-llava"]
        )
    }

    def from_step(model: str, task: Task) -> tuple[tuple[str, str], ...]:
        position = _prompt_length(paths[model], task) + FAULT_STEP - 1
        return (("MODEL_SUPPORT_FAULT_CACHE_POSITION", str(position)),)

    return [
        Case(
            "tiny-llama",
            Task.TEXT_GENERATION,
            "cache_write_noise",
            from_step("tiny-llama", Task.TEXT_GENERATION),
        ),
        Case(
            "tiny-qwen3-moe",
            Task.TEXT_GENERATION,
            "decode_expert_scaled",
            (("MODEL_SUPPORT_FAULT_EXPERT", "2"),),
        ),
        Case(
            "tiny-llava",
            Task.IMAGE_TEXT_TO_TEXT,
            "cache_write_noise",
            from_step("tiny-llava", Task.IMAGE_TEXT_TO_TEXT),
        ),
        Case("tiny-llama", Task.TEXT_GENERATION, "dense_miscompiler"),
    ]


def measure(case: Case, dtype: str) -> dict[str, float | str]:
    """One run of ``case``: the run's figures and its search's."""
    (model,) = build_demo_models(default_cache_dir(), [case.model])
    config = RunConfig(
        model=str(model.require_path()),
        task=case.task,
        backend="cpu",  # type: ignore[arg-type]
        compile_backend=f"model_support.faults:{case.fault}",
        dtype=dtype,  # type: ignore[arg-type]
        max_new_tokens=NEW_TOKENS,
    )
    doc = run_local(config, timeout_s=1800, env=dict(case.env)).document
    if doc.result != Result.FAIL or doc.verification.first_divergence is None:
        raise SystemExit(f"{case}: expected a searched FAIL, got {doc.result} ({doc.error})")
    found = doc.verification.first_divergence
    timings = doc.timings
    search_s = found.seconds or 0.0
    total = timings.total_s or 0.0
    return {
        "where": found.summary().split(" (")[0] if found.module else found.summary(),
        "load": timings.load_s or 0.0,
        "compile": timings.first_generate_s or 0.0,
        "generate": timings.steady_generate_s or 0.0,
        "verdict": timings.reference_s or 0.0,
        "run": total - search_s,  # the run before its search (the total includes the search)
        "search": search_s,
        "run_rss": (doc.memory.host_peak_rss_bytes or 0) / 2**20,
        "search_rss": (found.host_peak_rss_increase_bytes or 0) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    print(
        f"{NEW_TOKENS} tokens, {args.dtype}, cpu, {args.repeats} repeats (medians); load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    for case in cases():
        runs = [measure(case, args.dtype) for _ in range(args.repeats)]

        def median(key: str, runs: list[dict[str, float | str]] = runs) -> float:
            return statistics.median(float(run[key]) for run in runs)

        print(f"\n{case.model} with {case.fault}: {runs[0]['where']}")
        print(
            f"  run   {median('run'):6.1f} s (load {median('load'):.1f}, compile and first "
            f"generation {median('compile'):.1f}, generation {median('generate'):.1f}, verdict "
            f"{median('verdict'):.1f}); host peak {median('run_rss'):.0f} MiB"
        )
        print(
            f"  search {median('search'):5.1f} s = {median('search') / median('run'):.2f}x the "
            f"run; raised the host peak by {median('search_rss'):.0f} MiB = "
            f"{median('search_rss') / median('run_rss'):.2f}x"
        )
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
