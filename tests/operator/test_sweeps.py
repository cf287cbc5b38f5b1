"""ModelSupportSweep end to end on kmock: rankings from the stand-in Hub, owned tests run by the
kubelet stand-in, the cap seen from the API at every write, restarts and re-rankings."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from hubserver import HubServer, Repo
from k8s_harness import JOBS_URL, NS, Emulator, Harness, declare_resources
from kmock_kubelet import Kubelet
from test_sweep import REFUSED, api_refusals

from model_support.operator.resource import (
    ANNOTATION_MODEL,
    GROUP,
    LABEL_SWEEP,
    SWEEP_KIND,
    SWEEP_PLURAL,
    VERSION,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.sweep_manifests import child_name
from model_support.store import ResultsStore
from model_support.vocabulary import Result

SWEEPS_URL = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{SWEEP_PLURAL}"
N_HUB = 200


def model_id(i: int) -> str:
    return f"org/model-{i:03d}"


@pytest.fixture(scope="module")
def sweep_hub(tiny_llama_path: Path) -> Iterator[HubServer]:
    """A stand-in Hub with N_HUB text-generation models, ranked by downloads in index order
    (they share one tiny checkpoint's bytes)."""
    files = {
        p.relative_to(tiny_llama_path).as_posix(): p.read_bytes()
        for p in tiny_llama_path.rglob("*")
        if p.is_file()
    }
    repos = [
        Repo(model_id(i), files=files, downloads=100_000 - i, likes=i, trending_score=i)
        for i in range(N_HUB)
    ]
    with HubServer(repos) as hub:
        yield hub


@pytest.fixture
async def sh(tmp_path: Path, sweep_hub: HubServer) -> AsyncIterator[Harness]:
    """kmock with both CRDs; settings pointing at the sweep Hub; runners deliver to the store."""
    async with Emulator() as server, kmock.Server(server) as srv:
        declare_resources(server)
        server.operator_requests = collections.Counter()
        results = tmp_path / "results"
        settings = OperatorSettings(
            results_uri=str(results),
            results_volume_claim="results",
            api_server=str(srv.url).rstrip("/"),
            runner_image="registry.example/model-support/runner:test",
            watchdog_interval_s=0.2,
            sweep_status_interval_s=0.2,
            sweep_min_refresh_s=0.5,
            namespaces=["default"],
            metrics_port=None,
            hub_endpoint=sweep_hub.url,
        )
        h = Harness(server, settings, results)
        try:
            yield h
        finally:
            await h.stop_operator()


async def start(h: Harness) -> None:
    """Start the operator and wait until it watches sweeps too.

    kmock matches each request against every earlier one: once the watches are seen (in the
    whole history), only the last few requests are kept (a history of 200 made the 200-model
    sweep 8 times slower), so hundreds of tests stay fast.
    """
    h.k.history = None
    sweeps = kmock.resource(GROUP, VERSION, SWEEP_PLURAL)
    before = len(list(h.k[kmock.action.WATCH, sweeps]))
    await h.start_operator()
    await h.wait_for(
        lambda: len(list(h.k[kmock.action.WATCH, sweeps])) > before, what="the sweep watch"
    )
    h.k.history = 4


async def create_sweep(h: Harness, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": SWEEP_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    return await h.create(SWEEPS_URL, body)


def objects(h: Harness, plural: str) -> list[dict[str, Any]]:
    """Objects of a kind as kmock holds them now (in memory: no request)."""
    return [
        obj.raw
        for (resource, _, _), obj in h.k.objects.items()
        if resource.plural == plural and not obj.deleted
    ]


def children_of(h: Harness, sweep: str) -> list[dict[str, Any]]:
    return [
        t
        for t in objects(h, "modelsupporttests")
        if (t["metadata"].get("labels") or {}).get(LABEL_SWEEP) == sweep
    ]


def unfinished(test: dict[str, Any]) -> bool:
    status = test.get("status") or {}
    return not (
        status.get("observedGeneration") == test["metadata"].get("generation", 1)
        and status.get("phase") in ("Completed", "Invalid")
    )


def job_unfinished(job: dict[str, Any]) -> bool:
    return not any(
        c.get("type") in ("Complete", "Failed")
        for c in (job.get("status") or {}).get("conditions") or []
    )


class CapWatch:
    """After every write the API server takes, counts the sweep's unfinished tests and their
    unfinished Jobs: the cap as the API shows it over time, not as the operator believes.

    Incremental (only the written object and those counted unfinished are read, from kmock's
    store) so that it keeps up with hundreds of tests without slowing the loop that serves kmock.
    Those counted unfinished are read again at every write: a write's observer runs once kmock
    has served it, and the write that finished a test can be observed after the create that
    followed it (kmock awaits between storing a write and returning), so a count kept from
    earlier observations alone would show the API holding a finished test as unfinished.
    """

    def __init__(self, h: Harness, sweep: str) -> None:
        self.h, self.sweep = h, sweep
        self.max_tests = 0
        self.max_jobs = 0
        self.samples = 0
        self.tests: dict[tuple[str, str], bool] = {}  # (namespace, test name) -> unfinished
        self.uids: set[str] = set()
        self.jobs: dict[tuple[str, str], bool] = {}  # (namespace, Job name) -> unfinished
        self._keys: dict[str, Any] = {}

    def _stored(self, plural: str, namespace: str, name: str | None) -> dict[str, Any] | None:
        if plural not in self._keys:
            found = next((k[0] for k in self.h.k.objects if k[0].plural == plural), None)
            if found is None:
                return None
            self._keys[plural] = found
        try:
            stored = self.h.k.objects[self._keys[plural], namespace, name]
        except KeyError:
            return None
        return None if stored.deleted else dict(stored.raw)

    def _object(self, plural: str, request: kmock.Request) -> dict[str, Any] | None:
        name = request.name or ((request.data or {}).get("metadata") or {}).get("name")
        return self._stored(plural, request.namespace or NS, name)

    def _refresh(
        self,
        plural: str,
        counted: dict[tuple[str, str], bool],
        still: Callable[[dict[str, Any]], bool],
    ) -> None:
        for key in [k for k, counted_unfinished in counted.items() if counted_unfinished]:
            obj = self._stored(plural, *key)
            counted[key] = obj is not None and still(obj)  # deleted: no longer held

    def __call__(self, request: kmock.Request) -> None:
        plural = request.resource.plural if request.resource else None
        if plural not in ("modelsupporttests", "jobs"):
            return
        obj = self._object(plural, request)
        if obj is None:
            return
        meta = obj["metadata"]
        if plural == "modelsupporttests":
            if (meta.get("labels") or {}).get(LABEL_SWEEP) != self.sweep:
                return
            self.uids.add(meta["uid"])
            self.tests[meta.get("namespace") or NS, meta["name"]] = unfinished(obj)
        else:
            if meta["labels"].get("modelsupport.dev/test-uid") not in self.uids:
                return
            self.jobs[meta.get("namespace") or NS, meta["name"]] = job_unfinished(obj)
        self._refresh("modelsupporttests", self.tests, unfinished)
        self._refresh("jobs", self.jobs, job_unfinished)
        self.max_tests = max(self.max_tests, sum(self.tests.values()))
        self.max_jobs = max(self.max_jobs, sum(self.jobs.values()))
        self.samples += 1


async def sweep_status(h: Harness, name: str) -> dict[str, Any]:
    sweep = await h.get(f"{SWEEPS_URL}/{name}")
    assert sweep is not None
    return dict(sweep.get("status") or {})


def ready(status: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
    )


async def wait_sweep(
    h: Harness, name: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 180
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await sweep_status(h, name)
        return status if check(status) else None

    found: dict[str, Any] = await h.wait_for(probe, timeout=timeout, what=what, interval=0.1)
    return found


def records(h: Harness) -> list[Any]:
    return list(ResultsStore(str(h.results)).records())


def result_for(model: str) -> Result:
    i = int(model.rsplit("-", 1)[1])
    return Result.ERROR if i % 25 == 7 else Result.FAIL if i % 10 == 3 else Result.PASS


# ------------------------------------------------------------------------------------------


async def test_200_models_never_more_than_8_running_and_all_done(sh: Harness) -> None:
    cap = CapWatch(sh, "nightly")
    sh.k.observers = (cap,)
    await start(sh)
    async with Kubelet(sh, sh.results, result_for=result_for) as kubelet:
        await create_sweep(
            sh,
            "nightly",
            {
                "source": {"hub": {"sort": "downloads", "limit": 200}},
                "stack": {"image": "registry.example/runner:2.14", "compilerVersion": "2.28"},
                "template": {"cores": 1, "maxNewTokens": 16},
                "concurrency": {"maxRunning": 8},
            },
        )
        status = await wait_sweep(
            sh, "nightly", lambda s: ready(s) and s["counts"]["done"] == 200, "200 done", 600
        )
        assert kubelet.error is None, kubelet.error
    expected = collections.Counter(result_for(model_id(i)) for i in range(200))
    counts = status["counts"]
    assert counts == {
        "models": 200, "queued": 0, "running": 0, "done": 200,
        "passed": expected[Result.PASS], "failed": expected[Result.FAIL],
        "errored": expected[Result.ERROR], "timedOut": 0, "excluded": 0, "unverified": 0,
        "invalid": 0, "skipped": 0, "retained": 0, "regressions": 0, "confirming": 0,
        "flaky": 0, "fixes": 0,
    }  # fmt: skip
    # The API never held more than 8 unfinished tests (or Jobs) of the sweep, and did hold 8.
    assert cap.samples > 400
    assert cap.max_tests == 8 and cap.max_jobs <= 8
    tests = children_of(sh, "nightly")
    assert len(tests) == 200
    assert {t["metadata"]["annotations"][ANNOTATION_MODEL] for t in tests} == {
        model_id(i) for i in range(200)
    }
    for test in tests:
        model = test["metadata"]["annotations"][ANNOTATION_MODEL]
        assert test["metadata"]["name"] == child_name("nightly", model)
        [owner] = test["metadata"]["ownerReferences"]
        assert owner["kind"] == SWEEP_KIND and owner["controller"] and owner["blockOwnerDeletion"]
        assert (
            test["spec"]["cores"] == 1 and test["spec"]["image"] == "registry.example/runner:2.14"
        )
        assert test["status"]["result"] == result_for(model).value
    # One Job and one record per model; the ranking it used is stored with the dataset.
    assert len(objects(sh, "jobs")) == 200
    stored = records(sh)
    assert sorted(r.document.model for r in stored) == sorted(model_id(i) for i in range(200))
    snapshot = ResultsStore(str(sh.results)).latest_ranking_snapshot("text-generation")
    assert snapshot is not None and snapshot.models == [model_id(i) for i in range(200)]
    assert snapshot.kind == "hub" and snapshot.sort == "downloads"
    assert snapshot.sweep == f"{NS}/nightly" and snapshot.stack["compilerVersion"] == "2.28"
    assert status["ranking"]["snapshot"].endswith(snapshot.file_name())
    assert status["source"] == "hub:downloads/text-generation/top200"


async def test_a_restarted_operator_leaves_no_duplicate_test_job_or_record(sh: Harness) -> None:
    cap = CapWatch(sh, "restart")
    sh.k.observers = (cap,)
    models = [model_id(i) for i in range(40)]
    await start(sh)
    async with Kubelet(sh, sh.results) as kubelet:
        await create_sweep(
            sh,
            "restart",
            {
                "source": {"models": [{"model": m} for m in models]},
                "template": {"cores": 1},
                "concurrency": {"maxRunning": 4},
            },
        )
        await wait_sweep(sh, "restart", lambda s: s.get("counts", {}).get("done", 0) >= 8, "8 done")
        await sh.stop_operator()  # mid-sweep: tests are running; their Jobs end meanwhile
        await sh.wait_for(
            lambda: (
                {j["metadata"]["name"] for j in objects(sh, "jobs")} <= set(kubelet.played)
                and not kubelet.running
            ),
            what="the runners that were started to finish",
        )
        await start(sh)
        status = await wait_sweep(
            sh, "restart", lambda s: ready(s) and s["counts"]["done"] == 40, "40 done", 300
        )
        assert kubelet.error is None, kubelet.error
    assert status["counts"]["passed"] == 40 and status["counts"]["running"] == 0
    tests = children_of(sh, "restart")
    names = [t["metadata"]["name"] for t in tests]
    assert len(tests) == 40 and len(set(names)) == 40
    assert sorted(t["metadata"]["annotations"][ANNOTATION_MODEL] for t in tests) == models
    assert all(t["metadata"]["generation"] == 1 for t in tests)
    assert len(objects(sh, "jobs")) == 40  # one Job per test: none made twice
    stored = records(sh)
    assert sorted(r.document.model for r in stored) == models
    assert len({r.run_id for r in stored}) == 40
    assert cap.max_tests == 4 and cap.max_jobs <= 4


async def test_a_rerank_mid_sweep_neither_kills_nor_duplicates(
    sh: Harness, sweep_hub: HubServer
) -> None:
    cap = CapWatch(sh, "trend")
    sh.k.observers = (cap,)
    released: set[str] = set()
    first = [model_id(i) for i in range(3)]
    await start(sh)
    async with Kubelet(sh, sh.results, hold=lambda m: m not in released) as kubelet:
        original = {i: sweep_hub.repos[model_id(i)].downloads for i in range(N_HUB)}
        try:
            await create_sweep(
                sh,
                "trend",
                {
                    "source": {"hub": {"sort": "downloads", "limit": 6, "refreshSeconds": 1}},
                    "template": {"cores": 1},
                    "concurrency": {"maxRunning": 3},
                },
            )
            await sh.wait_for(
                lambda: sorted(kubelet.running.values()) == first, what="3 runners running"
            )
            before = {t["metadata"]["name"]: t for t in children_of(sh, "trend")}
            jobs_before = {j["metadata"]["name"] for j in objects(sh, "jobs")}
            assert len(before) == 3 and len(jobs_before) == 3
            # The Hub re-ranks: models 0 and 1 (running) and 5 (queued) fall out of the top 6,
            # 198 and 199 enter at the top.
            for i, downloads in ((0, 1), (1, 2), (5, 3), (198, 900_000), (199, 800_000)):
                sweep_hub.repos[model_id(i)].downloads = downloads
            new_top = [model_id(i) for i in (198, 199, 2, 3, 4, 6)]
            status = await wait_sweep(
                sh,
                "trend",
                lambda s: (
                    [m["model"] for m in s["ranking"]["models"]] == new_top
                    and s["counts"]["retained"] == 2
                ),
                "the new ranking",
            )
            # Nothing was killed or re-made: the same 3 tests, generation 1, Jobs untouched.
            after = {t["metadata"]["name"]: t for t in children_of(sh, "trend")}
            assert after.keys() == before.keys()
            assert all(after[n]["metadata"]["uid"] == before[n]["metadata"]["uid"] for n in after)
            assert all(t["metadata"]["generation"] == 1 for t in after.values())
            assert {j["metadata"]["name"] for j in objects(sh, "jobs")} == jobs_before
            assert sorted(kubelet.running.values()) == first
            assert status["counts"]["running"] == 3 and status["counts"]["queued"] == 5
            released.update(model_id(i) for i in range(N_HUB))
            status = await wait_sweep(
                sh, "trend", lambda s: ready(s) and s["counts"]["done"] == 6, "the new top 6"
            )
        finally:
            for i, downloads in original.items():
                sweep_hub.repos[model_id(i)].downloads = downloads
        assert kubelet.error is None, kubelet.error
    tests = children_of(sh, "trend")
    by_model = collections.Counter(t["metadata"]["annotations"][ANNOTATION_MODEL] for t in tests)
    # The 6 ranked now, plus the 2 that left while running (kept, finished, recorded); the
    # queued model that left (5) was never made.
    assert set(by_model) == set(new_top) | {model_id(0), model_id(1)}
    assert max(by_model.values()) == 1
    assert all(t["status"]["phase"] == "Completed" for t in tests)
    assert status["counts"]["retained"] == 2 and status["counts"]["passed"] == 6
    assert sorted(r.document.model for r in records(sh)) == sorted(by_model)
    assert len(objects(sh, "jobs")) == 8
    assert cap.max_tests == 3


async def test_a_new_epoch_or_stack_retests_once_and_an_unchanged_sweep_does_not(
    sh: Harness,
) -> None:
    models = [model_id(i) for i in range(5)]
    await start(sh)
    async with Kubelet(sh, sh.results) as kubelet:
        await create_sweep(
            sh,
            "epochs",
            {
                "source": {"models": [{"model": m} for m in models]},
                "template": {"cores": 1},
                "concurrency": {"maxRunning": 2},
            },
        )
        first = await wait_sweep(sh, "epochs", lambda s: ready(s) and s["counts"]["done"] == 5, "5")
        # Unchanged: a restart, and a change of something that is not the stack, re-test nothing.
        await sh.stop_operator()
        await start(sh)
        await sh.patch(f"{SWEEPS_URL}/epochs", {"spec": {"concurrency": {"maxRunning": 3}}})
        await wait_sweep(
            sh, "epochs", lambda s: ready(s) and s["observedGeneration"] == 2, "generation 2"
        )
        assert len(objects(sh, "jobs")) == 5 and len(records(sh)) == 5
        # A new epoch: every test once more, as a new generation of the same test.
        await sh.patch(f"{SWEEPS_URL}/epochs", {"spec": {"epoch": 20261105}})
        second = await wait_sweep(
            sh,
            "epochs",
            lambda s: ready(s) and s["observedGeneration"] == 3 and s["counts"]["done"] == 5,
            "epoch 20261105 done",
        )
        assert second["runKey"] != first["runKey"]
        # A new stack (the image): once more.
        await sh.patch(f"{SWEEPS_URL}/epochs", {"spec": {"stack": {"image": "reg.example/r:2"}}})
        third = await wait_sweep(
            sh,
            "epochs",
            lambda s: ready(s) and s["observedGeneration"] == 4 and s["counts"]["done"] == 5,
            "the new stack done",
        )
        assert third["runKey"] not in (first["runKey"], second["runKey"])
        assert kubelet.error is None, kubelet.error
    tests = children_of(sh, "epochs")
    assert len(tests) == 5
    assert all(t["metadata"]["generation"] == 3 for t in tests)
    assert all(t["spec"]["epoch"] == 20261105 for t in tests)
    assert all(t["spec"]["image"] == "reg.example/r:2" for t in tests)
    # Earlier epochs' results stay in the dataset: 3 records per model, each its own run.
    stored = records(sh)
    assert collections.Counter(r.document.model for r in stored) == dict.fromkeys(models, 3)
    assert len(objects(sh, "jobs")) == 15
    assert len(await sh.items(JOBS_URL)) == 15


async def test_a_source_that_cannot_be_read_is_retried_and_an_invalid_sweep_stalls(
    sh: Harness,
) -> None:
    from model_support.selection import SelectedEntry, SelectedList, save_selected

    await start(sh)
    async with Kubelet(sh, sh.results) as kubelet:
        await create_sweep(
            sh, "broken", {"source": {"models": [{"model": "a/b"}]}, "template": {"cores": 4}}
        )
        await create_sweep(sh, "curated", {"source": {"selected": {}}, "template": {"cores": 1}})
        # No selected list yet: the sweep says so and waits; nothing is created.
        waiting = await wait_sweep(
            sh,
            "curated",
            lambda s: any(
                c["type"] == "Ranked" and c["reason"] == "RankingFailed"
                for c in s.get("conditions") or []
            ),
            "the ranking failure",
        )
        assert "there is no selected list" in " ".join(
            c["message"] for c in waiting["conditions"] if c["type"] == "Ranked"
        )
        assert not ready(waiting) and children_of(sh, "curated") == []
        # An invalid spec (CEL would refuse it; the operator refuses it too): Stalled, no test.
        broken = await wait_sweep(
            sh,
            "broken",
            lambda s: any(
                c["type"] == "Stalled" and c["status"] == "True" for c in s.get("conditions") or []
            ),
            "the invalid sweep stalled",
        )
        assert "parallelism" in broken["message"] and children_of(sh, "broken") == []
        # The list appears: the retry ranks it (the model left out on purpose is not tested).
        save_selected(
            str(sh.results),
            SelectedList(
                models=[
                    SelectedEntry(model=model_id(1)),
                    SelectedEntry(model=model_id(2)),
                    SelectedEntry(model=model_id(3), reason="needs a custom kernel"),
                ]
            ),
        )
        done = await wait_sweep(
            sh, "curated", lambda s: ready(s) and s["counts"]["done"] == 2, "the selected list"
        )
        assert kubelet.error is None, kubelet.error
    assert done["source"] == "selected" and done["counts"]["passed"] == 2
    assert sorted(
        t["metadata"]["annotations"][ANNOTATION_MODEL] for t in children_of(sh, "curated")
    ) == [model_id(1), model_id(2)]
    events = await sh.wait_events("RankingFailed")
    assert len(events) == 1  # said once, not at every retry
    snapshot = ResultsStore(str(sh.results)).latest_ranking_snapshot()
    assert snapshot is not None and snapshot.kind == "selected"
    assert snapshot.models == [model_id(1), model_id(2)]


async def test_ranked_models_the_crd_refuses_are_skipped_and_never_block_the_rest(
    sh: Harness, sweep_hub: HubServer
) -> None:
    """A Hub ranking can hold ids the CRD's pattern refuses: the sweep names them with why in
    its status and an Event, and creates the tests of every other model."""
    for i, refused in enumerate(REFUSED):
        sweep_hub.add(Repo(refused, downloads=200_000 + i))  # ranked first
    try:
        await start(sh)
        await create_sweep(
            sh,
            "mixed",
            {
                "source": {"hub": {"sort": "downloads", "limit": 4}},
                "template": {"cores": 1},
                "concurrency": {"maxRunning": 8},
            },
        )
        status = await wait_sweep(
            sh,
            "mixed",
            lambda s: 0 < (s.get("counts") or {}).get("running", 0) == s["counts"]["models"],
            "every ranked model's test started",
        )
    finally:
        for refused in REFUSED:
            del sweep_hub.repos[refused]
    assert status["counts"]["models"] == 2 and status["counts"]["skipped"] == 2
    skipped = {s["model"]: s["reason"] for s in status["ranking"]["skipped"]}
    assert status["ranking"]["skippedCount"] == 2 and skipped.keys() == REFUSED.keys()
    for model, reason in REFUSED.items():
        assert skipped[model].startswith(reason)
    assert "skipped 2 model(s) the API server would refuse a test of" in status["message"]
    tests = children_of(sh, "mixed")
    assert sorted(t["metadata"]["annotations"][ANNOTATION_MODEL] for t in tests) == [
        model_id(0), model_id(1),
    ]  # fmt: skip
    for test in tests:  # what was created, the API server admits
        doc = {k: test[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": "x"}}
        assert api_refusals(doc) == []
        # ... and the same test for a skipped model it refuses (schema or CEL rules)
        for model in REFUSED:
            assert api_refusals({**doc, "spec": {**doc["spec"], "model": model}}) != []
    [event] = await sh.wait_events("ModelsSkipped")
    assert event["type"] == "Warning" and "org/_leading-underscore (spec.model:" in event["message"]


async def test_a_listed_checkpoint_path_off_the_model_volumes_is_skipped_and_reported(
    sh: Harness, tmp_path: Path
) -> None:
    """A path in a sweep's list (or a selected list another tenant wrote) is a test the
    operator would refuse when it lies off its model volumes: the sweep skips it with why,
    never sizes it from the operator's own filesystem, and tests the models after it."""
    volume = tmp_path / "models"
    volume.mkdir()
    sh.settings.model_volume_paths = [str(volume)]
    await start(sh)
    listed = [{"model": "/etc"}, {"model": f"{volume}/../elsewhere"}, {"model": model_id(0)}]
    await create_sweep(sh, "paths", {"source": {"models": listed}, "template": {"cores": 1}})
    status = await wait_sweep(
        sh,
        "paths",
        lambda s: 0 < (s.get("counts") or {}).get("running", 0) == s["counts"]["models"],
        "the listed Hub model's test started",
    )
    assert status["counts"]["models"] == 1 and status["counts"]["skipped"] == 2
    skipped = {s["model"]: s["reason"] for s in status["ranking"]["skipped"]}
    assert skipped.keys() == {"/etc", f"{volume}/../elsewhere"}
    assert all("not on a model volume" in reason for reason in skipped.values())
    tests = children_of(sh, "paths")
    assert [t["metadata"]["annotations"][ANNOTATION_MODEL] for t in tests] == [model_id(0)]
