"""A sweep's regressions against its previous run key, its cost so far, its one Event per run
and the operator's Prometheus metrics, end to end on kmock with the kubelet stand-in."""

from __future__ import annotations

import collections
import time
from typing import Any

import kmock
import pytest
from k8s_harness import NS, Harness
from kmock_kubelet import RUN_SECONDS, Kubelet
from prometheus_client import REGISTRY
from test_sweeps import (  # the sweep harness (its fixture sh included)
    SWEEPS_URL,
    children_of,
    create_sweep,
    model_id,
    ready,
    records,
    sh,
    start,
    sweep_hub,
    wait_sweep,
)

from model_support.operator.resource import ANNOTATION_CONFIRMS
from model_support.operator.sweep_manifests import child_name, rerun_name
from model_support.pricing import DEFAULT_PRICES
from model_support.vocabulary import Result

__all__ = ["sh", "sweep_hub"]  # fixtures used by name

MODELS = [model_id(i) for i in range(4)]
RUNNING_S = 2.5


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_a_new_run_key_counts_regressions_and_fixes_with_one_event_and_its_cost(
    sh: Harness,
) -> None:
    outcome = {m: Result.PASS for m in MODELS} | {MODELS[2]: Result.ERROR}
    held_since: dict[str, float] = {}

    def hold(model: str) -> bool:
        """Each runner stays RUNNING_S: its Job then spans whole seconds of Kubernetes time."""
        since = held_since.setdefault(model, time.monotonic())
        if time.monotonic() - since < RUNNING_S:
            return True
        del held_since[model]  # the next run of the model is held again
        return False

    await start(sh)
    async with Kubelet(
        sh, sh.results, result_for=lambda model: outcome[model], hold=hold
    ) as kubelet:
        await create_sweep(
            sh,
            "nightly",
            {
                "source": {"models": [{"model": m} for m in MODELS]},
                "template": {"cores": 1},
                "concurrency": {"maxRunning": 4},
                "confirm": {"reruns": 0},  # one run decides here (re-runs: the test below)
            },
        )
        first = await wait_sweep(
            sh, "nightly", lambda s: ready(s) and s["counts"]["done"] == 4, "4"
        )
        assert first["counts"]["regressions"] == 0 and "baseline" not in first
        # The next compiler: model 0 now fails, model 2 is fixed.
        outcome.update({MODELS[0]: Result.FAIL, MODELS[2]: Result.PASS})
        await sh.patch(f"{SWEEPS_URL}/nightly", {"spec": {"epoch": 2}})
        second = await wait_sweep(
            sh,
            "nightly",
            lambda s: ready(s) and s["observedGeneration"] == 2 and s["counts"]["done"] == 4,
            "the second run done",
        )
        assert kubelet.error is None, kubelet.error
    assert second["baseline"]["runKey"] == first["runKey"] != second["runKey"]
    assert second["baseline"]["results"] == {
        MODELS[0]: "PASS", MODELS[1]: "PASS", MODELS[2]: "ERROR", MODELS[3]: "PASS",
    }  # fmt: skip
    assert (second["counts"]["regressions"], second["counts"]["fixes"]) == (1, 1)
    tests = children_of(sh, "nightly")
    (failed,) = [t["status"]["runId"] for t in tests if t["status"]["result"] == "FAIL"]
    assert second["regressions"] == [
        {"model": MODELS[0], "before": "PASS", "after": "FAIL", "runs": [failed]}
    ]
    assert "1 regression(s) and 1 fix(es) against the previous run" in second["message"]
    # Cost so far: this run's four tests. Each runner claims 30 s on one trn2.48xlarge core;
    # the operator believes the claim only within the Job's own lifetime (RUNNING_S here, in
    # whole seconds of Kubernetes time), so a test's core-seconds are about that, not 30.
    trn2 = DEFAULT_PRICES.price_of("trn2.48xlarge")
    assert trn2 is not None
    used = [t["status"]["coreSeconds"] for t in tests]
    assert all(1 <= u <= RUNNING_S + 1 < RUN_SECONDS for u in used), used
    for test in tests:
        assert test["status"]["costUSD"] == pytest.approx(
            test["status"]["coreSeconds"] / 3600 * trn2.usd_per_hour / 64
        )
    assert second["cost"]["coreHours"] == pytest.approx(sum(used) / 3600, abs=1e-6)
    assert second["cost"]["usd"] == pytest.approx(
        sum(t["status"]["costUSD"] for t in tests), abs=1e-6
    )
    assert second["cost"]["unpriced"] == 0
    # One Warning Event for the run, naming the regression; a restart says nothing more.
    assert len(await sh.wait_events("Regressions", about="nightly")) == 1
    await sh.stop_operator()
    await start(sh)
    await wait_sweep(sh, "nightly", ready, "ready after the restart")
    await sh.wait_for(
        lambda: metric("model_support_sweep_regressions", namespace=NS, sweep="nightly") == 1,
        what="the regressions gauge after the restart",
    )
    events = await sh.wait_events("Regressions", about="nightly")
    assert len(events) == 1
    assert events[0]["type"] == "Warning"
    assert f"{MODELS[0]} PASS -> FAIL" in events[0]["message"]
    assert first["runKey"] in events[0]["message"]
    # The metrics: this sweep's regressions, fixes and cost; tests by phase; the stack's pass rate.
    assert metric("model_support_sweep_fixes", namespace=NS, sweep="nightly") == 1
    assert metric("model_support_sweep_cost_usd", namespace=NS, sweep="nightly") == pytest.approx(
        second["cost"]["usd"], rel=1e-3
    )
    assert (metric("model_support_tests_by_phase", phase="Completed") or 0) >= 4
    stack = {
        "compiler": "neuronx-cc", "compiler_version": "2.28", "library": "transformers",
        "library_version": "5.24.0",
    }  # fmt: skip
    # The first run's pass rate was 0.75 too: wait for what only the second run's last
    # materialize says (its FAIL, and the fix's PASS: a materialize between the two says 0.5);
    # its pass rate, set before the counts, is then current.
    await sh.wait_for(
        lambda: (
            (
                metric("model_support_stack_results", **stack, result="FAIL"),
                metric("model_support_stack_results", **stack, result="PASS"),
            )
            == (1, 3)
        ),
        what="the stack's counts after the second run (1 FAIL, 3 PASS)",
    )
    assert metric("model_support_pass_rate", **stack) == 0.75


class SweepWrites:
    """Every status the API server stored for one sweep, in order (an observer of kmock)."""

    def __init__(self, h: Harness, sweep: str) -> None:
        self.h, self.sweep = h, sweep
        self.statuses: list[dict[str, Any]] = []

    def __call__(self, request: kmock.Request) -> None:
        if request.resource is None or request.resource.plural != "modelsupportsweeps":
            return
        if request.name != self.sweep or request.subresource != "status":
            return
        stored = next(
            obj.raw
            for (resource, _, name), obj in self.h.k.objects.items()
            if resource.plural == "modelsupportsweeps" and name == self.sweep
        )
        self.statuses.append(dict(stored.get("status") or {}))


async def test_a_worse_result_counts_once_its_reruns_agree_and_runs_that_disagree_are_flaky(
    sh: Harness,
) -> None:
    """Each worse result is re-run (spec.confirm.reruns, by default the CLI's 2) as tests of
    their own, each recorded as its own run: the model whose re-runs repeat its FAIL is the one
    regression (status, Event, metric); the one whose re-runs pass is flaky, never counted."""
    steady, flaky, unchanged = MODELS[:3]
    runs: collections.Counter[str] = collections.Counter()

    def result_for(model: str) -> Result:
        runs[model] += 1
        if model == steady and runs[model] > 1:
            return Result.FAIL  # the new stack breaks it: every run fails
        if model == flaky and runs[model] == 2:
            return Result.FAIL  # once, on a loaded node: its re-runs pass
        return Result.PASS

    writes = SweepWrites(sh, "confirm")
    sh.k.observers = (writes,)
    await start(sh)
    async with Kubelet(sh, sh.results, result_for=result_for) as kubelet:
        await create_sweep(
            sh,
            "confirm",
            {
                "source": {"models": [{"model": m} for m in (steady, flaky, unchanged)]},
                "template": {"cores": 1},
                "concurrency": {"maxRunning": 3},
            },
        )
        first = await wait_sweep(
            sh, "confirm", lambda s: ready(s) and s["counts"]["done"] == 3, "3"
        )
        assert first["counts"]["passed"] == 3 and children_of(sh, "confirm") != []
        await sh.patch(f"{SWEEPS_URL}/confirm", {"spec": {"epoch": 2}})
        second = await wait_sweep(
            sh,
            "confirm",
            lambda s: ready(s) and s["observedGeneration"] == 2,
            "the second run and its re-runs done",
        )
        assert kubelet.error is None, kubelet.error
    tests = {t["metadata"]["name"]: t for t in children_of(sh, "confirm")}
    reruns = {n: t for n, t in tests.items() if ANNOTATION_CONFIRMS in t["metadata"]["annotations"]}
    # Two re-runs of the steady worse result, each a test of its own (the same spec) naming
    # the test it repeats; the first test keeps its own run and result. The flaky one's second
    # re-run is made only if the cap let it start before its first disagreed.
    shaky_reruns = [
        rerun_name("confirm", flaky, n) for n in (1, 2) if rerun_name("confirm", flaky, n) in reruns
    ]
    assert shaky_reruns[:1] == [rerun_name("confirm", flaky, 1)]
    assert sorted(reruns) == sorted(
        [rerun_name("confirm", steady, n) for n in (1, 2)] + shaky_reruns
    )
    for name, rerun in reruns.items():
        original = tests[rerun["metadata"]["annotations"][ANNOTATION_CONFIRMS]]
        assert name.startswith(original["metadata"]["name"])
        assert rerun["spec"] == original["spec"]
        assert rerun["status"]["runId"] != original["status"]["runId"]
    assert tests[child_name("confirm", steady)]["status"]["result"] == "FAIL"
    assert tests[child_name("confirm", flaky)]["status"]["result"] == "FAIL"
    # Each run recorded: 3 + 3 tests, then the re-runs.
    stored = collections.Counter(r.document.model for r in records(sh))
    assert stored == {steady: 4, flaky: 2 + len(shaky_reruns), unchanged: 2}
    # One regression, confirmed by three agreeing runs; the flaky model with its runs.
    counts = second["counts"]
    assert (counts["regressions"], counts["flaky"], counts["confirming"]) == (1, 1, 0)
    assert counts["fixes"] == 0 and counts["failed"] == 2 and counts["done"] == 3
    steady_runs = [
        tests[child_name("confirm", steady)]["status"]["runId"],
        *(tests[rerun_name("confirm", steady, n)]["status"]["runId"] for n in (1, 2)),
    ]
    assert second["regressions"] == [
        {"model": steady, "before": "PASS", "after": "FAIL", "runs": steady_runs}
    ]
    (shaky,) = second["flaky"]
    assert shaky["model"] == flaky and shaky["before"] == "PASS"
    assert shaky["results"] == ["FAIL"] + ["PASS"] * len(shaky_reruns)
    assert shaky["runs"] == [
        tests[name]["status"]["runId"] for name in [child_name("confirm", flaky), *shaky_reruns]
    ]
    assert "1 flaky" in second["message"]
    # No status ever counted the flaky model, or the steady one before its re-runs agreed.
    listed = [w for w in writes.statuses if (w.get("counts") or {}).get("regressions")]
    assert listed and all(
        w["regressions"] == second["regressions"] and w["counts"]["regressions"] == 1
        for w in listed
    )
    (event,) = await sh.wait_events("Regressions", about="confirm")
    assert f"{steady} PASS -> FAIL (3 run(s) agree)" in event["message"]
    assert f"{flaky} PASS" not in event["message"] and "1 flaky" in event["message"]
    assert metric("model_support_sweep_regressions", namespace=NS, sweep="confirm") == 1
    assert metric("model_support_sweep_flaky", namespace=NS, sweep="confirm") == 1
