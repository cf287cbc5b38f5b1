"""The kubelet stand-in of k8s_harness (Harness.finish_job ...), driven for many Jobs at once:
the Job controller, the scheduler, the kubelet and the runner of every runner Job.

It plays every runner Job kmock holds, as a node would run it: the pod becomes ready (the
test goes Running), the runner delivers the result document of the run.py it makes from the
program ConfigMap and the Job's config block to the results store, the Job completes. Which result each model gets, and which
models' runners wait (to keep tests running while a test looks), are the test's choice.

Everything runs on the loop that serves kmock and never blocks it: Jobs are found in kmock's
object store (in memory), writes go through kmock's HTTP API (so watch events fire), and the
delivery is written in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from k8s_harness import JOBS_URL, Harness, now

from model_support.config import RunConfig
from model_support.operator.resource import RUNNER_CONTAINER
from model_support.records import ResultDocument, Stack, Timings, failure_document
from model_support.script import PROGRAM_KEYS, RUN_CONFIG_ENV, RUN_SHA256_ENV, read_config
from model_support.vocabulary import ErrorClass, Result

STACK = Stack(torch="2.13.0", transformers="5.24.0", torch_neuronx="2.13.0", neuronx_cc="2.28")


RUN_SECONDS = 30.0
"""How long every stand-in run held its cores, by its own timestamps."""


def runner_document(config: RunConfig, result: Result) -> ResultDocument:
    """What a runner of ``config`` reports for ``result`` (the test's identity, our stack)."""
    if result is Result.PASS:
        document = failure_document(config, result, error_class=None, error="")
        document = document.model_copy(
            update={"error": None, "stack": STACK, "timings": Timings(wall_time_s=12.0)}
        )
    else:
        error_class = ErrorClass.VERIFICATION if result is Result.FAIL else ErrorClass.RUNTIME
        document = failure_document(config, result, error_class=error_class, error=f"{result} here")
        document = document.model_copy(update={"stack": STACK})
    assert document.finished_at is not None
    started = document.finished_at - timedelta(seconds=RUN_SECONDS)
    return document.model_copy(update={"started_at": started})


class Kubelet:
    """Plays every runner Job of the emulated cluster until stopped.

    ``result_for(model)`` chooses each run's result (PASS by default), or ``document_for(job,
    config)`` the whole document (what a runner in that Job reports: e.g. from the packages
    its extra-packages step installs); while ``hold(model)`` is true the runner of that model
    stays running. ``played`` lists the Jobs played, in order.
    """

    def __init__(
        self,
        h: Harness,
        results: Path,
        *,
        result_for: Callable[[str], Result] | None = None,
        hold: Callable[[str], bool] | None = None,
        document_for: Callable[[dict[str, Any], RunConfig], ResultDocument] | None = None,
        interval: float = 0.02,
    ) -> None:
        self.h = h
        self.results = results
        self.result_for = result_for or (lambda _: Result.PASS)
        self.hold = hold or (lambda _: False)
        self.document_for = document_for or (
            lambda _, config: runner_document(config, self.result_for(config.model))
        )
        self.interval = interval
        self.played: list[str] = []
        self._configmaps: dict[str, dict[str, Any]] = {}
        self.running: dict[str, str] = {}
        """Job name -> model, for runners that are ready and not finished."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    async def __aenter__(self) -> Kubelet:
        self._main = asyncio.create_task(self._loop(), name="kubelet stand-in")
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in [self._main, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def job_count(self) -> int:
        """How many runner Jobs kmock holds now (no request, no copy of any)."""
        return len(self._jobs())

    def _jobs(self) -> dict[str, Any]:
        """kmock's Job objects by name; the ConfigMaps seen on the way are kept for the runners
        waiting for theirs. A name is read from the store's key: an object's body is built
        (``raw``) only where it is needed."""
        jobs = {}
        for (resource, _, name), obj in self.h.k.objects.items():
            if obj.deleted:
                continue
            if resource.plural == "jobs":
                jobs[name] = obj
            elif resource.plural == "configmaps" and name not in self._configmaps:
                self._configmaps[name] = obj.raw
        return jobs

    async def _loop(self) -> None:
        seen: set[str] = set()
        while True:
            # One scan of kmock's objects per round, shared by every runner: at a thousand
            # tests a scan per waiting runner would make the stand-in, not the operator, the
            # pace of a scale benchmark.
            for name, obj in self._jobs().items():
                if name not in seen:
                    seen.add(name)
                    task = asyncio.create_task(self._play(obj.raw), name=f"runner {name}")
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
            await asyncio.sleep(self.interval)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()

    async def _play(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
        runner = next(c for c in pod["containers"] if c["name"] == RUNNER_CONTAINER)
        env = {e["name"]: e.get("value") for e in runner.get("env") or []}

        # The kubelet retries the mount until the program ConfigMap exists (the loop's next
        # scan finds it); the runner writes run.py from it, as model_support.runner_pod does.
        cm = await self.h.wait_for(
            lambda: self._configmaps.get(cm_name),
            timeout=30,
            what=f"ConfigMap {cm_name}",
            interval=self.interval,
        )
        head, tail = (cm["data"][key] for key in PROGRAM_KEYS)
        run_py = head + env[RUN_CONFIG_ENV] + tail
        assert hashlib.sha256(run_py.encode()).hexdigest() == env[RUN_SHA256_ENV], (
            f"Job {name}: the run.py its runner would write is not the one the operator rendered"
        )
        config = read_config(run_py)
        await self.h.patch(
            f"{JOBS_URL}/{name}/status", {"status": {"active": 1, "ready": 1, "startTime": now()}}
        )
        self.played.append(name)
        self.running[name] = config.model
        while self.hold(config.model):
            await asyncio.sleep(self.interval)
        document = self.document_for(job, config)
        await self.h.deliver(job, document.model_dump_json().encode())
        del self.running[name]
        await self.h.finish_job(job, exit_code=0)  # the Job controller's part, as in every test
