"""Compile cache: a cold compile against one warmed from a shared cache target.

The same tiny checkpoint is tested twice through the real CLI (`model-support run`, compile
backend inductor, each run a fresh process on a fresh local cache folder, like two machines):

* cold: an empty target; the run compiles everything and pushes its entries;
* warm: another empty local folder; the run pulls the target's entries first, then compiles.

Printed per pair: wall time and compile time (run.py's first generate minus its steady one) of
each run, the pull's entries and seconds, the warm run's cache hits, and warm/cold ratios,
with the machine's load (other processes share these cores).

Target: warm compile time <= 0.35x cold.
Run: python benchmarks/compile_cache.py [--repeats 1] [--target local|s3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from model_support.checkpoints import build_demo_models, default_cache_dir

TARGET_RATIO = 0.35


def run(
    cli: str, model: str, target: str, cache_dir: Path, results: Path, env: dict[str, str]
) -> dict[str, Any]:
    """One `model-support run`; its JSON summary plus the process's own elapsed seconds."""
    cmd = [cli, "run", model, "--cores", "1", "--compile-backend", "inductor", "--dtype", "float32"]
    cmd += ["--compile-cache", target, "--results", str(results), "--json"]
    started = time.perf_counter()
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)},
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"model-support run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if summary["result"] != "PASS":
        raise SystemExit(f"the test did not pass: {summary['result']} {summary['error']}")
    summary["process_s"] = elapsed
    return summary


def s3_target() -> tuple[str, dict[str, str], Any]:
    """An S3 bucket on moto's server (the real S3 protocol) and the env that reaches it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log between the figures
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem().mkdir("bench-cache")
    return "s3://bench-cache", env, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--target", choices=["local", "s3"], default="local")
    args = parser.parse_args()
    (checkpoint,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    model = str(checkpoint.require_path())
    cli = str(Path(sys.executable).with_name("model-support"))
    load_before = os.getloadavg()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root, env, server = s3_target() if args.target == "s3" else (str(work), {}, None)
        for i in range(args.repeats):
            target = f"{root}/target-{i}"
            cold = run(cli, model, target, work / f"cold-{i}", work / "results", env)
            warm = run(cli, model, target, work / f"warm-{i}", work / "results", env)
            pairs.append((cold, warm))
            c, w = cold["compile_time_s"], warm["compile_time_s"]
            print(
                f"pair {i + 1}: compile cold {c:.1f} s, warm {w:.1f} s (ratio {w / c:.2f}); "
                f"wall cold {cold['wall_time_s']:.1f} s, warm {warm['wall_time_s']:.1f} s; "
                f"process cold {cold['process_s']:.1f} s, warm {warm['process_s']:.1f} s; "
                f"pushed {cold['compile_cache']['push']['entries']} entries "
                f"({cold['compile_cache']['push']['bytes'] / 2**20:.1f} MiB) in "
                f"{cold['compile_cache']['push']['seconds']:.2f} s, pulled "
                f"{warm['compile_cache']['pull']['entries']} in "
                f"{warm['compile_cache']['pull']['seconds']:.2f} s",
                flush=True,
            )
        if server is not None:
            server.stop()
    load_after = os.getloadavg()
    compile_ratio = statistics.median(w["compile_time_s"] / c["compile_time_s"] for c, w in pairs)
    wall_ratio = statistics.median(w["wall_time_s"] / c["wall_time_s"] for c, w in pairs)
    process_ratio = statistics.median(w["process_s"] / c["process_s"] for c, w in pairs)
    print(
        f"\ntarget {args.target}, {len(pairs)} pair(s), {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.1f} before / {load_after[0]:.1f} after"
    )
    print(f"compile warm/cold  {compile_ratio:.2f}   (target <= {TARGET_RATIO})")
    print(f"wall    warm/cold  {wall_ratio:.2f}   (load + compile + generate)")
    print(f"process warm/cold  {process_ratio:.2f}   (whole CLI: imports, pull, run, push, record)")
    print("PASS" if compile_ratio <= TARGET_RATIO else "MISS")


if __name__ == "__main__":
    main()
