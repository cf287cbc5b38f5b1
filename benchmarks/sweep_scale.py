"""Sweep scale: one ModelSupportSweep over a 1,000-model Hub ranking, run to the end on kmock.

    python benchmarks/sweep_scale.py [--models 1000] [--max-running 100]

The stand-in Hub serves N text-generation models (copies of a tiny checkpoint) ranked by
downloads. The operator ranks them through the real client, stores the ranking snapshot,
creates the sweep's tests (at most ``--max-running`` unfinished at once), sizes each test from
its checkpoint through the real client, and launches its Job; the kubelet stand-in
(tests/operator/kmock_kubelet.py) plays every runner (ready, delivery of the result document of the
Job's own run.py, Job complete); the operator records each result and the sweep counts it.

The operator runs as in its pod, `model-support operator` in a process of its own (leader
election included); the emulated API server, the stand-in Hub and the kubelet stand-in run in
this one.

Printed: time to the ranking, to the last Job and to the sweep's Ready; the most unfinished
tests the API ever held (sampled after every write) against the cap; the operator's API
requests per test (watch streams and the stand-ins' own requests are not counted), in total
and by kind; the operator process's memory apart from this one's.

Targets, beside one CPU-heavy process (started by the benchmark; the load average is printed
before and after): the last Job within 30 s; the cap is never exceeded; at most 8 operator API
requests per test (the test's own life, 5 in benchmarks/operator_scale.py, plus what the sweep
adds: the create and its share of status writes and listings).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kmock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from k8s_harness import NS, Emulator, Harness, declare_resources
from kmock_kubelet import STACK, Kubelet
from operator_process import (
    CpuNeighbour,
    HubProcess,
    OperatorProcess,
    PeakRss,
    load_average,
    rss_bytes,
)
from operator_scale import start_operator

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.operator.resource import GROUP, LABEL_SWEEP, SWEEP_KIND, SWEEP_PLURAL, VERSION
from model_support.operator.settings import OperatorSettings, RunnerStack

TARGET_REQUESTS = 8.0
TARGET_JOBS_SECONDS = 30.0
SWEEPS_URL = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{SWEEP_PLURAL}"


class UnfinishedPeak:
    """After every write, the sweep's unfinished tests as kmock holds them (no request)."""

    def __init__(self, server: kmock.KubernetesEmulator) -> None:
        self.server = server
        self.unfinished: dict[str, bool] = {}
        self.resource: Any = None  # kmock's key for the kind, found once
        self.peak = 0

    def __call__(self, request: kmock.Request) -> None:
        if request.resource is None or request.resource.plural != "modelsupporttests":
            return
        if not request.name:
            return
        if self.resource is None:
            self.resource = next(
                (k[0] for k in self.server.objects if k[0].plural == "modelsupporttests"), None
            )
        try:
            found = self.server.objects[self.resource, request.namespace, request.name]
        except KeyError:
            return
        if found.deleted:
            return
        test = found.raw
        if (test["metadata"].get("labels") or {}).get(LABEL_SWEEP) is None:
            return
        status = test.get("status") or {}
        self.unfinished[request.name] = not (
            status.get("observedGeneration") == test["metadata"].get("generation", 1)
            and status.get("phase") in ("Completed", "Invalid")
        )
        self.peak = max(self.peak, sum(self.unfinished.values()))


async def main(n_models: int, max_running: int) -> int:
    (tiny,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    names = [f"org/model-{i:05d}" for i in range(n_models)]
    downloads = [10 * n_models - i for i in range(n_models)]
    print(f"before: {load_average()}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        HubProcess(tiny.require_path(), names, downloads) as hub,
        CpuNeighbour(),
    ):
        async with Emulator() as server, kmock.Server(server) as srv:
            server.operator_requests = collections.Counter()
            declare_resources(server)
            results = Path(tmp) / "results"
            settings = OperatorSettings(
                results_uri=str(results),
                results_volume_claim="results",  # runners deliver into the store
                api_server=str(srv.url).rstrip("/"),
                namespaces=[NS],
                metrics_port=None,
                hub_endpoint=hub.url,
                watchdog_interval_s=5.0,
                # The image's declared stack is what its runners report: their PASS is kept.
                runner_stack=RunnerStack(
                    neuronx_cc=STACK.neuronx_cc, transformers=STACK.transformers
                ),
            )
            h = Harness(server, settings, results)
            operator = OperatorProcess(settings, Path(tempfile.gettempdir()) / "sweep-scale.log")
            try:
                return await measure(h, server, operator, n_models, max_running)
            finally:
                operator.stop()


async def measure(
    h: Harness, server: Any, operator: OperatorProcess, n_models: int, max_running: int
) -> int:
    """Run the sweep, print figures; 0 if on target."""
    await start_operator(h, operator)
    with PeakRss(operator.pid) as memory:
        return await _measure(h, server, operator, n_models, max_running, memory)


async def _measure(
    h: Harness,
    server: Any,
    operator: OperatorProcess,
    n_models: int,
    max_running: int,
    memory: PeakRss,
) -> int:
    # kmock matches each request against its whole history: keep only the recent ones.
    server.history = 1
    server.operator_requests.clear()
    peak = UnfinishedPeak(server)
    server.observers = (peak,)
    sweep = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": SWEEP_KIND,
        "metadata": {"name": "bench"},
        "spec": {
            "source": {"hub": {"sort": "downloads", "limit": n_models}},
            "concurrency": {"maxRunning": max_running},
        },
    }
    async with Kubelet(h, h.results, interval=0.1) as kubelet:
        t0 = time.monotonic()
        await h.create(SWEEPS_URL, sweep)

        async def status() -> dict[str, Any]:
            got = await h.get(f"{SWEEPS_URL}/bench")
            return dict((got or {}).get("status") or {})

        async def ranked() -> bool:
            return bool((await status()).get("lastRankedAt"))

        await h.wait_for(ranked, timeout=300, what="the ranking", interval=0.2)
        ranked_s = time.monotonic() - t0
        await h.wait_for(
            lambda: kubelet.job_count() >= n_models,
            timeout=3600,
            what=f"{n_models} Jobs",
            interval=0.5,
        )
        jobs_s = time.monotonic() - t0

        async def ready() -> dict[str, Any] | None:
            current = await status()
            conditions = {c["type"]: c["status"] for c in current.get("conditions") or []}
            return current if conditions.get("Ready") == "True" else None

        final = await h.wait_for(ready, timeout=3600, what="the sweep Ready", interval=0.5)
        done_s = time.monotonic() - t0
        if kubelet.error is not None:
            raise kubelet.error
    requests = collections.Counter(server.operator_requests)
    harness_rss = rss_bytes()
    total = sum(requests.values())
    per_test = total / n_models
    counts = final["counts"]
    print(f"models: {n_models} (a Hub ranking by downloads; each sized from its checkpoint)")
    print(f"cap (maxRunning):          {max_running}")
    print(f"ranked after               {ranked_s:8.2f} s")
    print(
        f"all {n_models} Jobs exist after  {jobs_s:8.2f} s   ({n_models / jobs_s:.1f} Jobs/s; "
        f"target <= {TARGET_JOBS_SECONDS:.0f} s, ratio {jobs_s / TARGET_JOBS_SECONDS:.2f})"
    )
    print(f"sweep Ready after          {done_s:8.2f} s   ({n_models / done_s:.1f} tests/s)")
    print(
        f"counts                     done {counts['done']}, passed {counts['passed']}, "
        f"running {counts['running']}, queued {counts['queued']}"
    )
    print(
        f"most unfinished tests seen {peak.peak:8d}     (cap {max_running}, ratio "
        f"{peak.peak / max_running:.2f})"
    )
    print(
        f"operator API requests      {total:8d}     = {per_test:.2f} per test "
        f"(target <= {TARGET_REQUESTS:.0f}, ratio {per_test / TARGET_REQUESTS:.2f})"
    )
    for kind, count in requests.most_common():
        print(f"  {count / n_models:6.2f}/test  {kind}")
    print(f"operator peak memory       {memory.peak / 2**20:8.1f} MiB")
    print(f"emulator and kubelet       {harness_rss / 2**20:8.1f} MiB (not the operator's)")
    print(f"after: {load_average()} (one CPU-heavy process beside the run)")
    ok = (
        0 < peak.peak <= max_running
        and jobs_s <= TARGET_JOBS_SECONDS
        and per_test <= TARGET_REQUESTS
        and counts["done"] == n_models
        and counts["passed"] == n_models
    )
    print("PASS" if ok else "MISSED TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--max-running", type=int, default=100)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.models, args.max_running)))
