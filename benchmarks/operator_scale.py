"""Operator scale: N sized ModelSupportTests run to completion against kmock and the stand-in Hub.

    python benchmarks/operator_scale.py [--tests 1000] [--idle-rounds 2]

Each test names a different Hub model (the stand-in Hub serves N copies of a tiny checkpoint),
so the operator sizes every one through the real client. A kubelet stand-in then plays each
runner (tests/operator/kmock_kubelet.py): the pod becomes ready (Running), the runner delivers
the PASS document of the run.py its Job was given (the test's model, revision and cores),
the Job completes; the operator reads the delivery, records the run and keeps the matrix.
After the sweep the operator idles for a number of watchdog rounds.

Printed: time until every Job exists and until every result is recorded, the operator's API
requests per test over the whole life of a test (watchdog included; watch streams, the
harness's own requests and the Hub's are not counted) and by kind, the watchdog's steady load
per round after the sweep, and the operator process's memory (apart from the emulator's) at the
end of the sweep and after the idle rounds.

Targets, beside one CPU-heavy process (started by the benchmark; the load average is printed
before and after): all Jobs within 15 s, at most 5 API requests per test, the operator's peak
memory at most half of the chart's memory limit (resources.limits.memory in values.yaml), and
memory flat after the sweep (growth over the idle rounds under 5 %). The chart's requests and
limits are set from a run at twice the scale (``--tests 2000``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import kmock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from k8s_harness import JOBS_URL, TESTS_URL, Emulator, Harness, declare_resources
from kmock_kubelet import STACK, Kubelet
from operator_process import (
    CpuNeighbour,
    HubProcess,
    OperatorProcess,
    PeakRss,
    chart_memory,
    load_average,
    rss_bytes,
)

from model_support.checkpoints import build_demo_models, default_cache_dir
from model_support.operator.settings import OperatorSettings, RunnerStack
from model_support.store import ResultsStore

TARGET_SECONDS = 15.0
TARGET_REQUESTS = 5.0
TARGET_MEMORY_GROWTH = 0.05
TARGET_MEMORY_SHARE = 0.5
"""The operator's peak memory, as a share of the chart's memory limit."""
WATCHDOG_INTERVAL_S = 30.0  # the production default
BATCH = 50


async def main(n_tests: int, idle_rounds: int) -> int:
    (tiny,) = build_demo_models(default_cache_dir(), ["tiny-llama"])
    names = [f"org/model-{i:05d}" for i in range(n_tests)]
    print(f"before: {load_average()}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        HubProcess(tiny.require_path(), names) as hub,
        CpuNeighbour(),
    ):
        async with Emulator() as server, kmock.Server(server) as srv:
            server.history = 1  # the request log kmock matches each request against
            server.operator_requests = collections.Counter()
            declare_resources(server)
            results = Path(tmp) / "results"
            settings = OperatorSettings(
                results_uri=str(results),
                results_volume_claim="results",  # runners deliver into the store
                api_server=str(srv.url).rstrip("/"),
                namespaces=["default"],
                metrics_port=None,
                hub_endpoint=hub.url,
                watchdog_interval_s=WATCHDOG_INTERVAL_S,
                # The image's declared stack is what its runners report: their PASS is kept.
                runner_stack=RunnerStack(
                    neuronx_cc=STACK.neuronx_cc, transformers=STACK.transformers
                ),
            )
            h = Harness(server, settings, results)
            operator = OperatorProcess(settings, Path(tempfile.gettempdir()) / "operator-scale.log")
            try:
                return await measure(h, server, operator, n_tests, idle_rounds)
            finally:
                operator.stop()


async def start_operator(h: Harness, operator: OperatorProcess) -> None:
    """Start the operator's process; wait until it watches tests and Jobs and leads."""
    before = h._watches()
    operator.start()

    def ready() -> bool:
        assert operator.alive(), f"the operator exited: see {operator.log_path}"
        tests, jobs = h._watches()
        return tests > before[0] and jobs > before[1]

    await h.wait_for(ready, timeout=120, what="the operator's watches", interval=0.2)
    lease = "/apis/coordination.k8s.io/v1/namespaces/default/leases/model-support-operator"

    async def leading() -> bool:
        found = await h.get(lease)
        return bool(found and found["spec"].get("holderIdentity"))

    await h.wait_for(leading, timeout=60, what="the operator to lead", interval=0.2)


async def measure(
    h: Harness,
    server: kmock.KubernetesEmulator,
    operator: OperatorProcess,
    n_tests: int,
    idle_rounds: int,
) -> int:
    """Run the sweep, print figures; 0 if on target."""
    await start_operator(h, operator)
    with PeakRss(operator.pid) as peak:
        return await _measure(h, server, operator, n_tests, idle_rounds, peak)


async def _measure(
    h: Harness,
    server: kmock.KubernetesEmulator,
    operator: OperatorProcess,
    n_tests: int,
    idle_rounds: int,
    peak: PeakRss,
) -> int:
    rss_start = rss_bytes(operator.pid)
    server.operator_requests.clear()
    t0 = time.monotonic()
    for start in range(0, n_tests, BATCH):
        await asyncio.gather(
            *(
                h.create_test(f"t{i:05d}", {"model": f"org/model-{i:05d}", "profile": "trn2"})
                for i in range(start, min(start + BATCH, n_tests))
            )
        )
    created_s = time.monotonic() - t0

    def job_count() -> int:
        # Counted from kmock's object store: cheap, unlike filtering every request so far.
        return sum(1 for resource, _, _ in server.objects if resource.plural == "jobs")

    await h.wait_for(
        lambda: job_count() >= n_tests, timeout=900, what=f"{n_tests} Jobs", interval=0.25
    )
    jobs_s = time.monotonic() - t0

    async def recorded() -> bool:
        phases = [t.get("status", {}).get("phase") for t in await h.items(TESTS_URL)]
        released = [
            j
            for j in await h.items(JOBS_URL)
            if "modelsupport.dev/recorded" in j["metadata"]["labels"]
        ]
        return sum(1 for p in phases if p == "Completed") >= n_tests and len(released) >= n_tests

    # The nodes: every runner reports a PASS of the run.py its Job was given (the test's own
    # model, revision and cores, so the operator records it as the model's result).
    async with Kubelet(h, h.results) as kubelet:
        await h.wait_for(recorded, timeout=900, what="every test Completed", interval=1.0)
    assert kubelet.error is None, kubelet.error
    done_s = time.monotonic() - t0
    store = ResultsStore(str(h.results))

    def materialized() -> bool:
        files = store.matrix_files()
        return bool(files) and len(store.matrix(columns=["run_id"])) >= n_tests

    await h.wait_for(materialized, timeout=900, what="the matrix", interval=1.0)
    matrix_s = time.monotonic() - t0
    life = collections.Counter(server.operator_requests)

    # After the sweep: the watchdog's steady load and the operator's memory.
    gc.collect()
    rss_end = rss_bytes(operator.pid)
    harness_end = rss_bytes()
    server.operator_requests.clear()
    await asyncio.sleep(idle_rounds * WATCHDOG_INTERVAL_S)
    idle = collections.Counter(server.operator_requests)
    rss_idle = rss_bytes(operator.pid)

    total = sum(life.values())
    per_test = total / n_tests
    growth = (rss_idle - rss_end) / rss_end
    print(f"tests: {n_tests} (each a different Hub model, sized by the operator)")
    print(f"created all tests in       {created_s:7.2f} s")
    print(
        f"all Jobs exist after       {jobs_s:7.2f} s   (target <= {TARGET_SECONDS:.0f} s, ratio {jobs_s / TARGET_SECONDS:.2f})"
    )
    print(f"all results recorded after {done_s:7.2f} s   ({n_tests / done_s:.1f} tests/s)")
    print(f"matrix holds every run at  {matrix_s:7.2f} s")
    print(
        f"operator API requests      {total:7d}     = {per_test:.2f} per test over its whole life "
        f"(target <= {TARGET_REQUESTS:.0f}, ratio {per_test / TARGET_REQUESTS:.2f})"
    )
    for kind, count in life.most_common():
        print(f"  {count / n_tests:5.2f}/test  {kind}")
    idle_total = sum(idle.values())
    if idle_rounds:
        print(
            f"watchdog after the sweep   {idle_total / idle_rounds:7.2f} requests per round "
            f"({idle_rounds} rounds of {WATCHDOG_INTERVAL_S:g} s): {dict(idle)}"
        )
    print(
        f"operator process memory    {rss_end / 2**20:7.1f} MiB at the end of the sweep, "
        f"{rss_idle / 2**20:.1f} MiB after idling (growth {growth * 100:+.1f} %, target <= "
        f"{TARGET_MEMORY_GROWTH * 100:.0f} %)"
    )
    print(f"operator at start          {rss_start / 2**20:7.1f} MiB (before any test)")
    limit = chart_memory("limits")
    share = peak.peak / limit
    print(
        f"operator peak memory       {peak.peak / 2**20:7.1f} MiB = {share * 100:.0f} % of the "
        f"chart's limit ({limit / 2**20:.0f} MiB; target <= {TARGET_MEMORY_SHARE * 100:.0f} %, "
        f"ratio {share / TARGET_MEMORY_SHARE:.2f}); chart request "
        f"{chart_memory('requests') / 2**20:.0f} MiB"
    )
    print(f"emulator process           {harness_end / 2**20:7.1f} MiB (not the operator's)")
    print(f"after: {load_average()} (one CPU-heavy process beside the run)")
    ok = (
        jobs_s <= TARGET_SECONDS
        and per_test <= TARGET_REQUESTS
        and growth <= TARGET_MEMORY_GROWTH
        and share <= TARGET_MEMORY_SHARE
    )
    print("PASS" if ok else "MISSED TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000)
    parser.add_argument("--idle-rounds", type=int, default=2)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.tests, args.idle_rounds)))
