"""Operator scale: N ModelSupportTests against kmock; time until every Job exists, API requests per test.

    python benchmarks/operator_scale.py [--tests 1000]

Targets: all Jobs within 60 s, at most 8 API requests per test (the operator's requests only:
watch streams, and the harness's own creates and polls, are not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path

import kmock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from k8s_harness import JOBS_URL, TESTS_URL, Emulator, Harness, declare_resources

from model_support.operator.settings import OperatorSettings

TARGET_SECONDS = 60.0
TARGET_REQUESTS = 8.0


async def main(n_tests: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        async with Emulator() as server, kmock.Server(server) as srv:
            server.history = 4
            server.operator_requests = collections.Counter()
            declare_resources(server)
            settings = OperatorSettings(
                results_uri=str(Path(tmp) / "results"),
                api_server=str(srv.url).rstrip("/"),
                namespaces=["default"],
                metrics_port=None,
            )
            h = Harness(server, settings, Path(tmp) / "results")
            try:
                return await measure(h, server, n_tests)
            finally:
                await h.stop_operator()


async def measure(h: Harness, server: kmock.KubernetesEmulator, n_tests: int) -> int:
    """Create the tests, wait for their Jobs and statuses, print figures; 0 if on target."""
    await h.start_operator()
    server.operator_requests.clear()
    t0 = time.monotonic()
    spec = {"model": "Qwen/Qwen3-0.6B", "profile": "trn2", "cores": 1}
    for start in range(0, n_tests, 50):
        await asyncio.gather(
            *(
                h.create_test(f"t{i:05d}", dict(spec))
                for i in range(start, min(start + 50, n_tests))
            )
        )
    created_s = time.monotonic() - t0

    def all_jobs() -> bool:
        # Counted from kmock's object store: cheap, unlike filtering every request so far.
        return sum(1 for resource, _, _ in server.objects if resource.plural == "jobs") >= n_tests

    await h.wait_for(all_jobs, timeout=600, what=f"{n_tests} Jobs", interval=0.25)
    jobs_s = time.monotonic() - t0

    async def settled() -> bool:
        statuses = [t.get("status", {}).get("phase") for t in await h.items(TESTS_URL)]
        return sum(1 for p in statuses if p == "Pending") >= n_tests

    await h.wait_for(settled, timeout=600, what="every status Pending", interval=1.0)
    settled_s = time.monotonic() - t0
    kinds = collections.Counter(server.operator_requests)
    total = sum(kinds.values())
    assert len(await h.items(JOBS_URL)) == n_tests

    per_test = total / n_tests
    print(f"tests: {n_tests}")
    print(f"created all tests in     {created_s:7.2f} s")
    print(
        f"all Jobs exist after     {jobs_s:7.2f} s   (target <= {TARGET_SECONDS:.0f} s, ratio {jobs_s / TARGET_SECONDS:.2f})"
    )
    print(f"all statuses set after   {settled_s:7.2f} s   ({n_tests / settled_s:.1f} tests/s)")
    print(
        f"operator API requests    {total:7d}     = {per_test:.2f} per test (target <= {TARGET_REQUESTS:.0f}, ratio {per_test / TARGET_REQUESTS:.2f})"
    )
    for kind, count in kinds.most_common():
        print(f"  {count / n_tests:5.2f}/test  {kind}")
    ok = jobs_s <= TARGET_SECONDS and per_test <= TARGET_REQUESTS
    print("PASS" if ok else "MISSED TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000)
    sys.exit(asyncio.run(main(parser.parse_args().tests)))
