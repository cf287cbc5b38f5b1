"""Harness overhead: `model-support run` against a bare hand-written recipe.

Both load the same tiny checkpoint with from_pretrained, compile the forward with the same
backend, and generate 32 tokens greedily with a static cache for the same prompts, each in a
fresh Python process (interpreter start and imports included). The harness also sizes the
model, measures a steady and a prefill-only generation, collects the stack and records the
result; its CPU reference pass (the verdict) is excluded from the ratio and reported separately.

Target: harness / bare <= 1.25.  Run: python benchmarks/harness_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.config import DEFAULT_PROMPTS

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


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile-backend", default="aot_eager")
    args = parser.parse_args()
    (model,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    path = str(model.require_path())
    cli = str(Path(sys.executable).with_name("model-support"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bare.py").write_text(BARE_RECIPE.format(prompts=list(DEFAULT_PROMPTS)))
        bare, sized, fixed, reference = [], [], [], []
        for i in range(args.repeats):
            bare.append(timed([sys.executable, "bare.py", path, args.compile_backend], work)[0])
            for cores, sink in ((None, sized), ("1", fixed)):
                extra = ["--cores", cores] if cores else []
                results = work / f"results-{i}-{cores}"
                cmd = [
                    cli,
                    "run",
                    path,
                    "--compile-backend",
                    args.compile_backend,
                    "--json",
                    "--results",
                    str(results),
                    *extra,
                ]
                elapsed, stdout = timed(cmd, work)
                summary = json.loads(stdout.strip().splitlines()[-1])
                assert summary["result"] == "PASS", summary
                ref = json.loads(next((results / "records").iterdir()).read_text())["document"][
                    "timings"
                ]["reference_s"]
                reference.append(ref)
                sink.append(elapsed - ref)
    b, s, f = statistics.median(bare), statistics.median(sized), statistics.median(fixed)
    print(
        f"model: tiny-llama ({path}), compile backend {args.compile_backend}, {args.repeats} repeats, medians"
    )
    print(f"bare recipe (load + compile + generate, own process): {b:6.2f} s")
    print(f"model-support run, sized (reference pass excluded):  {s:6.2f} s   ratio {s / b:.2f}")
    print(f"model-support run --cores 1 (no sizing):             {f:6.2f} s   ratio {f / b:.2f}")
    print(
        f"reference pass (verdict, reported separately):       {statistics.median(reference):6.2f} s"
    )
    print(
        f"target: ratio <= 1.25 -> {'met' if s / b <= 1.25 else 'NOT met'} (sized), {'met' if f / b <= 1.25 else 'NOT met'} (--cores 1)"
    )


if __name__ == "__main__":
    main()
