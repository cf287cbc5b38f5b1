"""Harness overhead: `model-support run` against a bare hand-written recipe.

Both load the same tiny checkpoint with from_pretrained, compile the forward with the same
backend, and generate 32 tokens greedily with a static cache for the same prompts, each in a
fresh Python process (interpreter start and imports included). The harness also sizes the
model, measures a steady generation (and the time to its first token), collects the stack and
records the result; its CPU reference pass (the verdict) is excluded from the ratio and reported
separately.

Sizing is measured cold (an empty sizing cache) and warm (the same checkpoint sized before). A
text-generation checkpoint that fits one core is sized from config.json and its headers either
way (no transformers import); a larger one imports transformers when cold and reads the
remembered answer when warm.

Wall seconds decide the target; CPU seconds of the whole process tree (user + system, reference
pass included) are printed beside them, as they say more when the machine is shared.

Target: harness / bare <= 1.10, sized and with --cores.
Run: python benchmarks/harness_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.tasks import DEFAULT_PROMPTS

TARGET = 1.10
BARE_RECIPE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, backend, prompts = sys.argv[1], sys.argv[2], {prompts!r}
tokenizer = AutoTokenizer.from_pretrained(path)
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
inputs = tokenizer(prompts, return_tensors="pt", padding=True)
model.forward = torch.compile(model.forward, backend=backend)
with torch.no_grad():
    out = model.generate(**inputs, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                         cache_implementation="static", pad_token_id=tokenizer.pad_token_id)
print(out.shape)
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the process tree, and stdout of ``cmd``."""
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, _children_cpu() - cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile-backend", default="aot_eager")
    args = parser.parse_args()
    (model,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    path = str(model.require_path())
    cli = str(Path(sys.executable).with_name("model-support"))
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "cold": [], "warm": [], "cores": []}
    reference = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bare.py").write_text(BARE_RECIPE.format(prompts=list(DEFAULT_PROMPTS)))
        for i in range(args.repeats):
            wall, cpu, _ = timed([sys.executable, "bare.py", path, args.compile_backend], work)
            runs["bare"].append((wall, cpu))
            sizing_cache = work / f"sizing-{i}"  # empty: the first sized run derives, then warm
            env = {**os.environ, "MODEL_SUPPORT_SIZING_CACHE": str(sizing_cache)}
            for kind, extra in (("cold", []), ("warm", []), ("cores", ["--cores", "1"])):
                results = work / f"results-{i}-{kind}"
                cmd = [cli, "run", path, "--compile-backend", args.compile_backend, "--json"]
                wall, cpu, stdout = timed([*cmd, "--results", str(results), *extra], work, env)
                summary = json.loads(stdout.strip().splitlines()[-1])
                assert summary["result"] == "PASS", summary
                record = json.loads(next((results / "records").iterdir()).read_text())
                ref = record["document"]["timings"]["reference_s"]
                reference.append(ref)
                runs[kind].append((wall - ref, cpu))

    def median(kind: str, index: int) -> float:
        return statistics.median(run[index] for run in runs[kind])

    bare = median("bare", 0)
    print(
        f"model: tiny-llama ({path}), compile backend {args.compile_backend}, "
        f"{args.repeats} repeats, medians; load average now {os.getloadavg()[0]:.1f}"
    )
    print(
        f"bare recipe (load + compile + generate, own process): {bare:6.2f} s  cpu {median('bare', 1):6.2f} s"
    )
    labels = {
        "cold": "model-support run, sized, cold sizing cache:",
        "warm": "model-support run, sized, warm sizing cache:",
        "cores": "model-support run --cores 1 (no sizing):",
    }
    for kind, label in labels.items():
        wall = median(kind, 0)
        print(
            f"{label:<53}{wall:6.2f} s  cpu {median(kind, 1):6.2f} s  ratio {wall / bare:.2f} "
            f"({'met' if wall / bare <= TARGET else 'NOT met'}, target {TARGET:.2f})"
        )
    print(
        f"reference pass (verdict, excluded above):              {statistics.median(reference):6.2f} s"
    )


if __name__ == "__main__":
    main()
