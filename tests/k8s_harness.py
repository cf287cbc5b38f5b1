"""A kopf operator against kmock (an emulated Kubernetes API), plus a stand-in for the kubelet.

The operator runs in its own thread and event loop (kopf.operator with ready/stop flags); kmock
serves on pytest's loop; the operator's blocking Kubernetes client runs in kopf's thread pool.
Objects are changed only through kmock's HTTP API so that watch events fire.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import itertools
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api_faults
import api_selectors
import kmock
import kopf
from api_faults import Family, Fault, Injected
from job_controller import JobDecision, account_failed_pod
from waiting import wait_until_async

from model_support.delivery import DELIVERY_KEY_ENV, deliver_to_folder, deliver_to_url
from model_support.operator.handlers import build_registry
from model_support.operator.manifests import DELIVERY_MOUNT, DELIVERY_URL_ENV, LABEL_PROGRAM
from model_support.operator.resource import (
    BISECT_KIND,
    BISECT_PLURAL,
    GROUP,
    KIND,
    PLURAL,
    RUNNER_CONTAINER,
    SWEEP_KIND,
    SWEEP_PLURAL,
    VERSION,
)
from model_support.operator.settings import OperatorSettings
from model_support.script import PROGRAM_KEYS, RUN_CONFIG_ENV, RUN_SHA256_ENV

NS = "default"
TESTS_URL = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
JOBS_URL = f"/apis/batch/v1/namespaces/{NS}/jobs"
PODS_URL = f"/api/v1/namespaces/{NS}/pods"
CMS_URL = f"/api/v1/namespaces/{NS}/configmaps"
EVENTS_URL = f"/api/v1/namespaces/{NS}/events"
CLAIM_TEMPLATES_URL = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates"
MODEL = "Qwen/Qwen3-0.6B"
_MODEL_COMMITS: list[str] = []


def serve_model_commit(commit: str) -> None:
    """Note the commit the stand-in Hub gives MODEL's main (the operator_hub fixture does)."""
    _MODEL_COMMITS[:] = [commit]


def model_commit() -> str:
    """The commit the operator pins MODEL's revision to (what run.py then writes)."""
    if not _MODEL_COMMITS:
        raise RuntimeError("no stand-in Hub serves the operator tests' model (operator_hub)")
    return _MODEL_COMMITS[0]


"""The model the operator tests name: served by the stand-in Hub (a tiny checkpoint)."""
MERGE = {"Content-Type": "application/merge-patch+json"}
_counter = itertools.count(1)
# The operator's delivery slot key, as the chart's Secret gives it: the same across the
# operator restarts a test makes (a random key per process would strand runs in flight).
os.environ.setdefault(DELIVERY_KEY_ENV, "harness-delivery-key-" + uuid.uuid4().hex)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_NAMED_OBJECT_ACTIONS = (
    kmock.action.UPDATE,
    kmock.action.CREATE,
    kmock.action.FETCH,
    kmock.action.DELETE,
)
"""kmock's routes that no discovery request can take (a discovery path names no object, and is
only read), the most requested first. Lists and watches stay behind the discovery routes:
kmock reads ``/apis/batch/v1`` as a list."""


class Emulator(kmock.KubernetesEmulator):
    """kmock plus what a real API server does that clients rely on (generateName, uid, ...).

    ``history`` bounds the request log: kmock matches every request against its whole history
    (quadratic in the number of requests), so a scale run keeps only the recent ones and counts
    the operator's requests itself, in ``operator_requests``.
    """

    history: int | None = None
    operator_requests: collections.Counter[str]
    observers: tuple[Callable[[kmock.Request], None], ...] = ()
    """Called after every request that wrote an object (a test's view of the API over time)."""
    refusals: tuple[Callable[[kmock.Request], kmock.KubernetesError | None], ...] = ()
    """Asked before a request is served: an error returned is the API server's answer (a
    ResourceQuota's 403, an admission webhook's 422), and nothing is stored."""

    faults: tuple[Injected, ...] = ()
    """API failures injected into the operator's calls (:mod:`api_faults`), in order."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock offers a request to its reactions in priority order, and to equals in the
        # order they were declared: every write and read of one object first went past the
        # seven discovery routes (/api, /apis/..., /version), each a walk of its request log.
        # The routes of one named object go first; priorities, and so any reaction a test
        # adds, still rule.
        first = {action: i for i, action in enumerate(_NAMED_OBJECT_ACTIONS)}

        def rank(reaction: Any) -> int:
            action = getattr(getattr(reaction._source, "criteria", None), "action", None)
            return first.get(action, len(first)) if isinstance(action, kmock.action) else len(first)

        self._payloads.sort(key=rank)

    def inject(
        self,
        fault: Fault,
        family: Family,
        *,
        times: int | None = None,
        resource: str | None = None,
        hold_s: float = 3.0,
    ) -> Injected:
        """Fail the next ``times`` operator requests of ``family`` (None: until
        :meth:`clear_faults`) with ``fault``; returns the injection (its ``hits`` count)."""
        injected = Injected(fault, family, times, resource, hold_s)
        self.faults = (*self.faults, injected)
        return injected

    def clear_faults(self) -> None:
        """The API server answers again."""
        self.faults = ()

    watches_opened: collections.Counter[str] | None = None
    """Watch requests per resource plural since the start: counted apart from the request log,
    which ``history`` trims."""

    async def _handle(self, request: kmock.Request) -> Any:
        if request.action == kmock.action.WATCH and request.resource is not None:
            if self.watches_opened is None:
                self.watches_opened = collections.Counter()
            self.watches_opened[request.resource.plural or ""] += 1
        if self.faults:
            await api_faults.apply(list(self.faults), request)
        for refuse in self.refusals:
            refused = refuse(request)
            if refused is not None:
                raise refused
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
            # What the API server sets on every object created (clients such as the operator's
            # send none of these; the Job controller stand-in tells Jobs apart by uid).
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now())
        if request.method.value == "PATCH" and isinstance(request.data, dict):
            self._check_precondition(request)
        if request.method.value in ("POST", "PATCH") and isinstance(request.data, dict):
            # Every write gets a new, larger resourceVersion, as on a real API server (the
            # operator orders what it sees of an object by it).
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(_counter))
            self._server_fields(request)
        if self.history is not None:
            if (
                not request.headers.get("User-Agent", "").startswith("kmock/")
                and request.action != kmock.action.WATCH
            ):
                resource = request.resource.plural if request.resource else request.url.path
                sub = f"/{request.subresource}" if request.subresource else ""
                self.operator_requests[f"{request.method.value} {resource}{sub}"] += 1
            if len(self._requests) > 2 * self.history:
                del self._requests[: -self.history]
        response = await super()._handle(request)
        if self.observers and request.method.value in ("POST", "PATCH", "DELETE"):
            for observe in self.observers:
                observe(request)
        return response

    # One object by name is one lookup, as on a real API server (kmock scans every object it
    # holds for each read, write and delete: quadratic in the objects of a scale run).

    def _stored_object(self, request: kmock.Request) -> Any:
        try:
            return self._objects[request.resource, request.namespace, request.name]
        except KeyError:
            return None

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_fetch(request)
        async with self._lock:
            obj = self._stored_object(request)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        # A create names its object in the body, not the URL (kmock then scans every object).
        metadata = (request.data or {}).get("metadata") or {}
        namespace = request.namespace or metadata.get("namespace")
        name = request.name or metadata.get("name")
        if name is None:
            return await super()._serve_create(request)
        async with self._lock:
            obj = self._stored_object(
                kmock.Request(resource=request.resource, namespace=namespace, name=name)
            )
        assert obj is not None  # created (or refused) by _handle before this is served
        return obj.raw

    def _selected(self, request: kmock.Request) -> Callable[[Mapping[str, Any]], bool]:
        """What a list or watch selects (its label and field selectors, on the server as the
        API server does: :mod:`api_selectors`); a selector it refuses is a 400."""
        plural = request.resource.plural if request.resource is not None else ""
        try:
            return api_selectors.selects(request.params, plural or "")
        except api_selectors.SelectorError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None

    async def _serve_list(self, request: kmock.Request) -> Any:
        matches = self._selected(request)
        listed = await super()._serve_list(request)
        return {**listed, "items": [item for item in listed["items"] if matches(item)]}

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        # A watch with a selector sees only the objects it selects (an object that stops
        # matching simply stops being sent: the operator's selectors are on labels it never
        # changes on a watched object).
        matches = self._selected(request)
        async for event in super()._serve_watch(request):
            if not isinstance(event, Mapping) or matches(event.get("object") or {}):
                yield event

    async def _serve_update(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_update(request)
        async with self._lock:
            obj = self._stored_object(request)
        assert obj is not None  # updated (or refused) by _handle before this is served
        return obj.last.raw

    async def _serve_delete(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_delete(request)
        async with self._lock:
            obj = self._stored_object(request)
        assert obj is not None  # deleted (or refused) by _handle before this is served
        return obj.last.raw

    def _check_precondition(self, request: kmock.Request) -> None:
        """Optimistic concurrency, as the API server has it: a patch that carries
        ``metadata.resourceVersion`` applies only to that version of the object, else 409.
        (The harness's own writes, which play other writers, carry none.)"""
        if request.headers.get("User-Agent", "").startswith("kmock/"):
            return
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is None or request.resource is None:
            return
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return  # kmock answers 404
        stored = str((self._objects[key].raw.get("metadata") or {}).get("resourceVersion"))
        if str(sent) != stored:
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Operation cannot be fulfilled on {request.resource.plural} "
                f'"{request.name}": the object has been modified; please apply your changes to '
                "the latest version and try again",
            )

    def _server_fields(self, request: kmock.Request) -> None:
        """What a real API server fills in: uid and creationTimestamp on create; for custom
        resources metadata.generation, 1 on create and +1 when a write changes the spec (a
        client cannot set these; tests that do are left alone)."""
        meta = request.data.setdefault("metadata", {})
        if request.action == kmock.action.CREATE:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now())
        if request.resource is None or request.resource.group != GROUP or request.subresource:
            return
        if request.action == kmock.action.CREATE:
            meta.setdefault("generation", 1)
        elif (
            request.action == kmock.action.UPDATE
            and "spec" in request.data
            and ("generation" not in meta)
        ):
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                return
            current = self._objects[key].raw
            spec = current.get("spec") or {}
            if any(spec.get(k) != v for k, v in request.data["spec"].items()):
                meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1


def declare_resources(server: kmock.KubernetesEmulator) -> None:
    """Built-in kinds plus our CRD (kmock knows nothing it is not told)."""
    server.resources.load_bundled()
    server.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=KIND,
        singular="modelsupporttest",
        shortnames={"mst"},
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )
    server.resources[f"{GROUP}/{VERSION}/{SWEEP_PLURAL}"] = kmock.ResourceInfo(
        kind=SWEEP_KIND,
        singular="modelsupportsweep",
        shortnames={"mss"},
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )
    server.resources[f"{GROUP}/{VERSION}/{BISECT_PLURAL}"] = kmock.ResourceInfo(
        kind=BISECT_KIND,
        singular="modelsupportbisect",
        shortnames={"msb"},
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )
    # DRA (Kubernetes >= 1.34) is not among kmock's bundled kinds.
    server.resources["resource.k8s.io/v1/resourceclaimtemplates"] = kmock.ResourceInfo(
        kind="ResourceClaimTemplate",
        singular="resourceclaimtemplate",
        namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )


class OperatorThread:
    """kopf.operator in a thread of its own, started and stopped on demand."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.ready = threading.Event()
        self.stop_flag = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.registry: kopf.OperatorRegistry | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The operator's event loop (its tasks run there), once it started."""

    def start(self) -> None:
        registry = self.registry = build_registry(self.settings)

        async def operate() -> None:
            self.loop = asyncio.get_running_loop()
            await kopf.operator(
                registry=registry,
                standalone=True,
                clusterwide=True,
                ready_flag=self.ready,
                stop_flag=self.stop_flag,
            )

        def main() -> None:
            try:
                asyncio.run(operate())
            except BaseException as exc:  # reported by the test through .error
                self.error = exc
                self.ready.set()

        self.thread = threading.Thread(target=main, name="kopf-operator", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join(timeout=15)
            assert not self.thread.is_alive(), "the operator did not stop within 15 s"


class Harness:
    """Helpers over kmock: create/read objects, wait for conditions, play the kubelet."""

    def __init__(
        self, server: kmock.KubernetesEmulator, settings: OperatorSettings, results: Path
    ) -> None:
        self.k = server
        self.settings = settings
        self.results = results
        self.operator: OperatorThread | None = None
        self.logs: dict[str, str] = {}  # pod name (or POD/CONTAINER) -> its log
        self.failing_log_reads = 0  # the next N pod-log reads answer 503 (an API server hiccup)
        server["get", kmock.resource("", "v1", "pods"), kmock.subresource("log")] << self._serve_log

    def _serve_log(self, request: kmock.Request) -> bytes:
        if self.failing_log_reads > 0:
            self.failing_log_reads -= 1
            raise kmock.KubernetesError(
                status=503, reason="ServiceUnavailable", message="try again"
            )
        # A pod's log, or one container's ("POD/CONTAINER", as the Docker kubelet stand-in keeps them).
        container = request.params.get("container")
        key = (
            f"{request.name}/{container}"
            if f"{request.name}/{container}" in self.logs
            else request.name
        )
        if key not in self.logs:
            raise kmock.KubernetesObjectNotFoundError()
        text = self.logs[key]
        tail = request.params.get("tailLines")
        if tail is not None:
            text = "".join(text.splitlines(keepends=True)[-int(tail) :])
        data = text.encode()
        # The API server applies limitBytes to what tailLines selected: its first N bytes.
        limit = request.params.get("limitBytes")
        return data if limit is None else data[: int(limit)]

    async def start_operator(self) -> None:
        """Start kopf and wait until its watches on tests and Jobs are open."""
        before = self._watches()
        self.operator = OperatorThread(self.settings)
        self.operator.start()
        await asyncio.to_thread(self.operator.ready.wait, 15)
        assert self.operator.error is None, f"the operator failed to start: {self.operator.error!r}"

        def opened() -> bool:
            tests, jobs = self._watches()
            return tests > before[0] and jobs > before[1]

        await self.wait_for(opened, what="the operator's watches")

    async def stop_operator(self) -> None:
        if self.operator is not None:
            await asyncio.to_thread(self.operator.stop)
            self.operator = None

    def _watches(self) -> tuple[int, int]:
        """How many watches of tests and of Jobs were opened so far."""
        opened = self.k.watches_opened or collections.Counter()
        return opened[PLURAL], opened["jobs"]

    def requests(self) -> list[kmock.Request]:
        """Every request the API server saw so far."""
        return (
            list(self.k[kmock.method.GET])
            + list(self.k[kmock.method.POST])
            + list(self.k[kmock.method.PATCH])
            + list(self.k[kmock.method.DELETE])
        )

    async def wait_for(
        self,
        check: Callable[[], Any],
        *,
        timeout: float = 60,
        what: str = "the condition",
        interval: float = 0.05,
    ) -> Any:
        """Poll ``check`` (sync or async) until it returns something truthy; fail at once when
        the operator under test has died."""
        return await wait_until_async(check, what, timeout, interval, abort=self._operator_alive)

    def _operator_alive(self) -> None:
        if self.operator is not None and self.operator.error is not None:
            raise AssertionError(f"the operator died: {self.operator.error!r}")

    # ------------------------------------------------------------------ objects

    async def create(self, url: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", NS)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("resourceVersion", str(next(_counter)))
        meta.setdefault("creationTimestamp", now())
        meta.setdefault("generation", 1)
        response = await self.k.post(url, json=obj)
        assert response.status in (200, 201), await response.text()
        return dict(await response.json())

    async def create_test(self, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name, **meta},
            "spec": spec,
        }
        return await self.create(TESTS_URL, body)

    async def get(self, url: str) -> dict[str, Any] | None:
        response = await self.k.get(url)
        if response.status == 404:
            return None
        assert response.status == 200, await response.text()
        return dict(await response.json())

    async def items(self, url: str) -> list[dict[str, Any]]:
        listing = await self.get(url)
        assert listing is not None
        return list(listing["items"])

    async def patch(self, url: str, data: dict[str, Any]) -> dict[str, Any]:
        result = await self.patch_if_exists(url, data)
        assert result is not None, f"{url} does not exist"
        return result

    async def patch_if_exists(self, url: str, data: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch with a new resourceVersion (so watchers see a change); None on 404."""
        data.setdefault("metadata", {})["resourceVersion"] = str(next(_counter))
        response = await self.k.patch(url, json=data, headers=MERGE)
        if response.status == 404:
            return None
        assert response.status == 200, await response.text()
        return dict(await response.json())

    async def delete(self, url: str) -> None:
        response = await self.k.delete(url)
        assert response.status == 200, await response.text()

    async def test_status(self, name: str) -> dict[str, Any]:
        test = await self.get(f"{TESTS_URL}/{name}")
        assert test is not None
        return dict(test.get("status") or {})

    async def wait_status(
        self, name: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.test_status(name)
            return status if check(status) else None

        result: dict[str, Any] = await self.wait_for(probe, timeout=timeout, what=what)
        return result

    async def wait_job(self, name: str | None = None, count: int = 1) -> list[dict[str, Any]]:
        async def probe() -> list[dict[str, Any]] | None:
            jobs = await self.items(JOBS_URL)
            if name is not None:
                jobs = [j for j in jobs if j["metadata"]["name"] == name]
            return jobs if len(jobs) >= count else None

        jobs: list[dict[str, Any]] = await self.wait_for(probe, what=f"{count} Job(s) {name or ''}")
        return jobs

    async def events(self) -> list[dict[str, Any]]:
        return await self.items(EVENTS_URL)

    async def configmaps(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The namespace's ConfigMaps: the program ConfigMaps (labelled so), and all others."""
        listed = await self.items(CMS_URL)
        programs = [c for c in listed if LABEL_PROGRAM in (c["metadata"].get("labels") or {})]
        return programs, [c for c in listed if c not in programs]

    async def run_py_of(self, job: dict[str, Any], *, timeout: float = 30) -> str:
        """The run.py ``job``'s runner writes (``model_support.runner_pod --program``): the
        program ConfigMap its pod mounts, head and tail around the config block in its env,
        checked against the sha256 its env names (the runner runs nothing else). Waits for the
        ConfigMap (the kubelet retries the mount)."""
        pod = job["spec"]["template"]["spec"]
        name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "run-script")
        [runner] = [c for c in pod["containers"] if c["name"] == RUNNER_CONTAINER]
        env = {e["name"]: e.get("value") for e in runner.get("env") or []}
        cm = await self.wait_for(
            lambda: self.get(f"{CMS_URL}/{name}"), what=f"ConfigMap {name}", timeout=timeout
        )
        head, tail = (cm["data"][key] for key in PROGRAM_KEYS)
        run_py: str = head + env[RUN_CONFIG_ENV] + tail
        assert hashlib.sha256(run_py.encode()).hexdigest() == env[RUN_SHA256_ENV], (
            f"Job {job['metadata']['name']}: the run.py its runner would write is not the "
            "one the operator rendered for it"
        )
        return run_py

    async def wait_events(
        self, reason: str, count: int = 1, *, about: str | None = None, timeout: float = 60
    ) -> list[dict[str, Any]]:
        """The Events with ``reason`` (on the object named ``about``, if given), once at least
        ``count`` were posted. The operator posts an Event right after the status write it
        explains, so a test that has just seen that status waits for the Event instead of
        reading the list once (under load the read can come between the two)."""

        async def probe() -> list[dict[str, Any]] | None:
            found = [
                e
                for e in await self.events()
                if e.get("reason") == reason
                and (about is None or (e.get("involvedObject") or {}).get("name") == about)
            ]
            return found if len(found) >= count else None

        events: list[dict[str, Any]] = await self.wait_for(
            probe, timeout=timeout, what=f"{count} {reason} Event(s)"
        )
        return events

    # ------------------------------------------------------------------ the kubelet stand-in

    async def start_pod(self, job: dict[str, Any], **status: Any) -> dict[str, Any]:
        """What the Job controller and scheduler do: a pod from the Job's template (tracked by
        the Job's finalizer). The Job's ``startTime`` is set once, when it first starts: a
        replacement pod does not reset it (only Kueue's resume does, see :meth:`resume`)."""
        template = job["spec"]["template"]
        name = f"{job['metadata']['name']}-{uuid.uuid4().hex[:5]}"
        labels = {**template["metadata"]["labels"], "job-name": job["metadata"]["name"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": dict(template["metadata"].get("annotations") or {}),
                "finalizers": [JOB_TRACKING_FINALIZER],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", **status},
        }
        created = await self.create(PODS_URL, pod)
        current = await self.get(f"{JOBS_URL}/{job['metadata']['name']}")
        assert current is not None, f"Job {job['metadata']['name']} is gone"
        job_status: dict[str, Any] = {"active": 1}
        if not (current.get("status") or {}).get("startTime"):
            job_status["startTime"] = now()
        await self.patch(f"{JOBS_URL}/{job['metadata']['name']}/status", {"status": job_status})
        return created

    async def run_pod(self, pod: dict[str, Any]) -> None:
        """The runner container started and the pod is Ready (the Job counts it in .ready)."""
        await self.patch(
            f"{PODS_URL}/{pod['metadata']['name']}/status",
            {
                "status": {
                    "phase": "Running",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now()},
                    ],
                    "containerStatuses": [
                        {
                            "name": RUNNER_CONTAINER,
                            "ready": True,
                            "state": {"running": {"startedAt": now()}},
                        }
                    ],
                }
            },
        )
        job = pod["metadata"]["labels"]["job-name"]
        await self.patch(f"{JOBS_URL}/{job}/status", {"status": {"ready": 1}})

    async def end_pod(
        self,
        job: dict[str, Any],
        pod: dict[str, Any],
        *,
        exit_code: int,
        log: str | None,
        container_reason: str | None = None,
        job_condition: tuple[str, str] | None = None,
        termination_message: str | None = None,
        pod_extra: dict[str, Any] | None = None,
        started_at: str | None = None,
    ) -> str:
        """The runner container ended: pod status and log, then the Job controller's part.

        Exit 0 completes the Job. A non-zero exit goes through the Job's own podFailurePolicy
        (:meth:`pod_failed`), unless ``job_condition`` says how the Job controller ended the
        Job for another reason (its deadline). Returns the Job controller's action.
        """
        if log is not None:
            self.logs[pod["metadata"]["name"]] = log
        terminated: dict[str, Any] = {"exitCode": exit_code, "finishedAt": now()}
        if started_at is not None:
            terminated["startedAt"] = started_at
        if container_reason:
            terminated["reason"] = container_reason
        if termination_message is not None:
            terminated["message"] = termination_message
        status = {
            **(pod_extra or {}),
            "containerStatuses": [{"name": RUNNER_CONTAINER, "state": {"terminated": terminated}}],
        }
        if exit_code != 0 and job_condition is None:
            return (await self.pod_failed(job, pod, status)).action
        phase = "Succeeded" if exit_code == 0 else "Failed"
        await self.patch(
            f"{PODS_URL}/{pod['metadata']['name']}/status", {"status": {"phase": phase, **status}}
        )
        await self.finish_job(job, exit_code=exit_code, job_condition=job_condition)
        return "Complete" if exit_code == 0 else "Failed"

    async def finish_job(
        self,
        job: dict[str, Any],
        *,
        exit_code: int,
        job_condition: tuple[str, str] | None = None,
        message: str | None = None,
        failed: int = 1,
    ) -> None:
        """The Job controller's part: the Job's terminal condition (Complete after exit 0, else
        the ``job_condition`` given: the Job's deadline, a FailJob rule, its backoff limit)."""
        if job_condition is None and exit_code != 0:
            raise ValueError(
                "a failed pod ends its Job only through the Job's podFailurePolicy: use "
                "end_pod / pod_failed, or name the job_condition the controller set"
            )
        kind, reason = job_condition or ("Complete", "Completed")
        await self._account_pods(job["metadata"]["name"])
        await self.patch(
            f"{JOBS_URL}/{job['metadata']['name']}/status",
            {
                "status": {
                    "active": 0,
                    "ready": 0,
                    "succeeded" if kind == "Complete" else "failed": 1
                    if kind == "Complete"
                    else failed,
                    "conditions": [
                        {
                            "type": kind,
                            "status": "True",
                            "reason": reason,
                            "message": message or reason,
                            "lastTransitionTime": now(),
                        }
                    ],
                }
            },
        )

    async def job_ended(self, job: dict[str, Any]) -> bool:
        """Whether the Job controller ended ``job`` (Complete or Failed)."""
        current = await self.get(f"{JOBS_URL}/{job['metadata']['name']}")
        return current is not None and _job_finished(current)

    async def _account_pods(self, job_name: str) -> None:
        """A finished Job's pods are all accounted: the Job controller drops their tracking
        finalizer (a pod deleted meanwhile then goes)."""
        for (resource, _, name), obj in list(self.k.objects.items()):
            if resource.plural != "pods" or obj.deleted:
                continue
            meta = obj.raw.get("metadata") or {}
            if (meta.get("labels") or {}).get(
                "job-name"
            ) == job_name and JOB_TRACKING_FINALIZER in (meta.get("finalizers") or []):
                await self.patch_if_exists(f"{PODS_URL}/{name}", {"metadata": {"finalizers": []}})

    async def pod_failed(
        self,
        job: dict[str, Any],
        pod: dict[str, Any],
        status: dict[str, Any],
        *,
        tracked: bool = True,
    ) -> JobDecision:
        """The kubelet wrote ``pod``'s terminal status (``status``, phase Failed) and the Job
        controller acted on it as upstream does (:func:`job_controller.account_failed_pod` on
        the Job and pod as the API holds them): Ignore and a failure within ``backoffLimit``
        leave the Job active, waiting for its replacement pod (:meth:`start_pod` again); FailJob
        and a failure past ``backoffLimit`` end it. ``tracked``: False for a pod the Job
        controller removed itself (a suspension), which it never counts."""
        url = f"{PODS_URL}/{pod['metadata']['name']}"
        failed_pod = await self.patch(f"{url}/status", {"status": {"phase": "Failed", **status}})
        current = await self.get(f"{JOBS_URL}/{job['metadata']['name']}")
        assert current is not None, f"Job {job['metadata']['name']} is gone"
        decision = account_failed_pod(current, failed_pod, tracked=tracked)
        if tracked:  # counted (or ignored): the controller drops its tracking finalizer
            await self.patch(url, {"metadata": {"finalizers": []}})
        if decision.ends is not None:
            reason, message = decision.ends
            await self.finish_job(
                job, exit_code=1, job_condition=("Failed", reason), message=message,
                failed=decision.failed,
            )  # fmt: skip
        else:
            await self.patch(
                f"{JOBS_URL}/{job['metadata']['name']}/status",
                {"status": {"active": 0, "ready": 0, "failed": decision.failed}},
            )
        return decision

    async def fail_pod(
        self,
        job: dict[str, Any],
        pod: dict[str, Any],
        *,
        exit_code: int,
        termination_message: str | None = None,
        pod_reason: str | None = None,
        pod_message: str | None = None,
        conditions: list[dict[str, Any]] | None = None,
    ) -> str:
        """The runner container ended non-zero (with the pod's reason, message and conditions
        given) and the Job controller applied the Job's own podFailurePolicy
        (:meth:`pod_failed`). Returns the action taken (FailJob, Ignore or Count)."""
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": "Error", "finishedAt": now()}
        if termination_message is not None:
            terminated["message"] = termination_message
        status: dict[str, Any] = {
            "containerStatuses": [{"name": RUNNER_CONTAINER, "state": {"terminated": terminated}}],
        }
        if pod_reason is not None:
            status["reason"] = pod_reason
        if pod_message is not None:
            status["message"] = pod_message
        if conditions is not None:
            status["conditions"] = conditions
        return (await self.pod_failed(job, pod, status)).action

    async def fail_init_step(
        self, job: dict[str, Any], pod: dict[str, Any], step: str, *, exit_code: int
    ) -> str:
        """An init step of ``pod`` ended with ``exit_code`` (the runner never started); the
        Job controller applies the Job's podFailurePolicy. Returns its action."""
        return (await self.pod_failed(job, pod, stage_status(pod, step, exit_code))).action

    async def reject_pod(
        self,
        job: dict[str, Any],
        pod: dict[str, Any],
        reason: str = "OutOfaws.amazon.com/neuroncore",
        message: str = "Node didn't have enough resource: aws.amazon.com/neuroncore, "
        "requested: 1, used: 8, capacity: 8",
    ) -> str:
        """The kubelet refused the pod at admission (``UnexpectedAdmissionError``,
        ``OutOf<resource>``: pkg/kubelet/lifecycle): phase Failed with that reason, no
        condition and no container that ever ran. Returns the Job controller's action."""
        status = {"reason": reason, "message": message, "containerStatuses": [], "conditions": []}
        return (await self.pod_failed(job, pod, status)).action

    async def delete_pod(
        self, job: dict[str, Any], pod: dict[str, Any], *, step: str | None = None,
        exit_code: int | None = None,
    ) -> str:  # fmt: skip
        """Someone deleted the pod (kubectl delete pod: no DisruptionTarget condition, the
        Job's tracking finalizer kept). The kubelet stops what runs: ``step`` (an init step or
        the runner) ends with ``exit_code``; None: no container had started (the image was
        still pulling), so the pod has no exit code. Returns the Job controller's action."""
        decision = await self.pod_failed(job, pod, stage_status(pod, step, exit_code))
        await self.delete(f"{PODS_URL}/{pod['metadata']['name']}")
        return decision.action

    async def suspend(
        self, job: dict[str, Any], pod: dict[str, Any] | None = None, *, step: str | None = None,
        exit_code: int | None = None,
    ) -> str | None:  # fmt: skip
        """Kueue preempts: it sets ``spec.suspend``; the Job controller removes the pod's
        tracking finalizer and deletes it (no DisruptionTarget condition); the kubelet stops
        what runs (``step`` ends with ``exit_code``, as in :meth:`delete_pod`). The pod is
        never counted, but a FailJob rule that matches its end still fails the Job
        (job_controller.py). Returns the action of the rule that matched (None: none)."""
        url = f"{JOBS_URL}/{job['metadata']['name']}"
        await self.patch(url, {"spec": {"suspend": True}})
        action: str | None = None
        if pod is not None:
            pod_url = f"{PODS_URL}/{pod['metadata']['name']}"
            await self.patch(pod_url, {"metadata": {"finalizers": []}})
            status = stage_status(pod, step, exit_code)
            decision = await self.pod_failed(job, pod, status, tracked=False)
            action = decision.match.action
            await self.delete(pod_url)
        current = await self.get(url)
        if current is not None and not _job_finished(current):
            suspended = {
                "type": "Suspended", "status": "True", "reason": "JobSuspended",
                "message": "Job suspended", "lastTransitionTime": now(),
            }  # fmt: skip
            await self.patch(
                f"{url}/status", {"status": {"active": 0, "ready": 0, "conditions": [suspended]}}
            )
        return action

    async def resume(self, job: dict[str, Any]) -> None:
        """Kueue admits the Job again: ``spec.suspend`` false, and the Job controller resets
        its ``startTime`` (job_controller.go: a resumed Job's deadline counts anew)."""
        url = f"{JOBS_URL}/{job['metadata']['name']}"
        await self.patch(url, {"spec": {"suspend": False}})
        await self.patch(f"{url}/status", {"status": {"startTime": now(), "conditions": []}})

    async def deliver(self, job: dict[str, Any], document: bytes) -> str:
        """What a runner does with its document: into the slot its pod was given and nothing
        else (the folder the pod mounts from the results volume, or the upload URL in the
        Secret its env names), exactly as model_support.runner_pod does."""
        container = job["spec"]["template"]["spec"]["containers"][0]
        mount = next(
            (m for m in container.get("volumeMounts") or [] if m["mountPath"] == DELIVERY_MOUNT),
            None,
        )
        if mount is not None:
            folder = Path(self.settings.results_uri) / mount["subPath"]
            return await asyncio.to_thread(deliver_to_folder, folder, document)
        [ref] = [
            e["valueFrom"]["secretKeyRef"]
            for e in container.get("env") or []
            if e["name"] == DELIVERY_URL_ENV
        ]
        namespace = job["metadata"]["namespace"]
        secret = await self.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
        assert secret is not None, f"the Secret {ref['name']} the runner reads is missing"
        url = (secret.get("stringData") or {}).get(ref["key"]) or base64.b64decode(
            secret["data"][ref["key"]]
        ).decode()
        return await asyncio.to_thread(deliver_to_url, url, document)

    async def disrupt_pod(self, pod: dict[str, Any], reason: str = "EvictionByEvictionAPI") -> str:
        """A disruption (eviction, preemption by the scheduler, a drained node): the pod fails
        with a DisruptionTarget condition and the runner, stopped by SIGTERM, exits 143; the Job
        controller applies the Job's podFailurePolicy. Returns its action."""
        job = await self.get(f"{JOBS_URL}/{pod['metadata']['labels']['job-name']}")
        assert job is not None
        status = {
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "lastTransitionTime": now(),
                }
            ],
            "containerStatuses": [
                {
                    "name": RUNNER_CONTAINER,
                    "state": {"terminated": {"exitCode": 143, "reason": "Error"}},
                }
            ],
        }
        return (await self.pod_failed(job, pod, status)).action


JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


def _job_finished(job: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def stage_status(pod: dict[str, Any], step: str | None, exit_code: int | None) -> dict[str, Any]:
    """A pod's terminal status when it was stopped at ``step`` (an init container or the
    runner) with ``exit_code``: the init steps before it completed (exit 0), the ones after it
    and the runner never started (waiting, no exit code). ``step`` None: stopped before any
    container started (its image was still pulling): no container has an exit code."""
    spec = pod["spec"]
    names = [c["name"] for c in spec.get("initContainers") or []]
    if step is not None and step != RUNNER_CONTAINER and step not in names:
        raise ValueError(f"the pod has no container {step!r} (its init steps: {names})")
    reached = names.index(step) if step in names else (len(names) if step else -1)

    def state(index: int, name: str) -> dict[str, Any]:
        if index < reached:
            return {"name": name, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        if index == reached and exit_code is not None:
            reason = "Completed" if exit_code == 0 else "Error"
            return {
                "name": name,
                "state": {"terminated": {"exitCode": exit_code, "reason": reason}},
            }
        return {"name": name, "state": {"waiting": {"reason": "PodInitializing"}}}

    init = [state(i, name) for i, name in enumerate(names)]
    runner = state(len(names), RUNNER_CONTAINER)
    if step is None:
        init = [{"name": n, "state": {"waiting": {"reason": "PodInitializing"}}} for n in names]
        runner = {"name": RUNNER_CONTAINER, "state": {"waiting": {"reason": "ContainerCreating"}}}
    return {"initContainerStatuses": init, "containerStatuses": [runner]}
