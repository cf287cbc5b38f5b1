"""A stand-in for one Kubernetes node (kubelet) and the Job controller, running pods in Docker.

Test code, and only a stand-in: no real cluster can run on these machines (see
docs/testing-containers.md). It reads what the operator created in kmock and does what a node
does with it, for the parts of the pod API this project uses:

* the Job controller: one pod per Job from its template (labels ``job-name`` and
  ``controller-uid``), a new pod while failures stay within ``backoffLimit``, the
  ``podFailurePolicy`` rules as upstream applies them (``tests/job_controller.py``: every
  container, init containers included; a failure no rule matches counts), ``activeDeadlineSeconds`` from the Job's ``startTime``, the Job's conditions
  (``SuccessCriteriaMet`` + ``Complete``, ``FailureTarget`` + ``Failed`` with reasons
  ``BackoffLimitExceeded``, ``DeadlineExceeded``, ``PodFailurePolicy``), suspended Jobs left
  alone, and a deleted Job's pods stopped and deleted (garbage collection);
* the kubelet: init containers in order, then the containers; ``command`` / ``args`` /
  ``workingDir`` with ``$(VAR)`` expansion; ``env`` (values, ``secretKeyRef`` /
  ``configMapKeyRef`` from kmock, ``fieldRef``) and ``envFrom``; the ``securityContext``
  (``runAsUser`` / ``runAsGroup`` / ``fsGroup``, ``runAsNonRoot`` enforced,
  ``readOnlyRootFilesystem``, ``allowPrivilegeEscalation: false`` as no-new-privileges,
  capabilities); volumes (``emptyDir`` as a host folder or, with ``medium: Memory``, a tmpfs;
  its ``sizeLimit`` enforced by eviction (no DisruptionTarget: a local-storage eviction); ``configMap`` / ``secret`` files, read-only; a
  ``persistentVolumeClaim`` as a host folder per claim); ``resources.limits.memory`` as the
  container's memory limit (no swap: over it the kernel OOM-kills, reason ``OOMKilled``); the
  termination message file (``terminationMessagePath`` / ``FallbackToLogsOnError``); pod and
  container status as the kubelet writes it; the pod log, served through kmock's log route;
* an eviction on request (:meth:`Node.evict`), as the Eviction API does it: a
  ``DisruptionTarget`` condition, graceful termination, and the pod object deleted.

Two things differ from a cluster, both on purpose and visible here: every container runs on the
host network (the API server, S3 and the Hub stand-ins listen on 127.0.0.1), and cluster
admission is played by ``injected_env`` (env a mutating webhook would add: cloud credentials as
IRSA does, endpoints of the local stand-ins) plus, for pods that mount a service-account token,
a kubeconfig instead of the token (kmock speaks plain HTTP and checks no tokens).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from job_controller import account_failed_pod
from k8s_harness import JOBS_URL, NS, PODS_URL, Harness, now
from kubernetes.utils import parse_quantity

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
TERMINATION_MESSAGE_LIMIT = 4096  # bytes kept of a termination message file
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048  # FallbackToLogsOnError, as the kubelet
DEFAULT_GRACE_S = 30
MOUNT_RETRIES = 40  # a missing ConfigMap or Secret is looked for again for 10 s, then waited on
RETRY_DELAY_S = 1.0  # the Job controller backs off 10 s, doubling; the stand-in keeps tests fast
CONTAINERS_URL_LABEL = "model-support-test.node"
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, the rest stays."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(one, value)


def _condition(
    kind: str, reason: str = "", message: str = "", status: str = "True"
) -> dict[str, Any]:
    cond = {"type": kind, "status": status, "lastTransitionTime": now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


class Waiting(Exception):
    """A container cannot start (image missing, bad config): the kubelet's ``state.waiting``."""

    def __init__(self, container: str, reason: str, message: str) -> None:
        super().__init__(f"{container}: {reason}: {message}")
        self.container, self.reason, self.message = container, reason, message


@dataclass
class ContainerEnd:
    """How one container ended, as the kubelet reports it in ``state.terminated``."""

    name: str
    exit_code: int
    reason: str
    message: str | None
    started_at: str
    finished_at: str

    def status(self, image: str) -> dict[str, Any]:
        terminated: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
        if self.message:
            terminated["message"] = self.message
        return {
            "name": self.name,
            "image": image,
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }


@dataclass
class Pod:
    """One pod the node runs: its object in kmock, its containers in Docker, its end."""

    name: str
    spec: dict[str, Any]
    labels: dict[str, str]
    owner: dict[str, Any]
    root: Path
    phase: str = "Pending"
    reason: str | None = None  # pod-level status.reason and .message (Evicted, ...)
    message: str | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)
    containers: dict[str, Any] = field(default_factory=dict)  # name -> docker Container
    ends: list[ContainerEnd] = field(default_factory=list)
    init_ends: list[ContainerEnd] = field(default_factory=list)
    stop_reason: str | None = None  # why the node stopped it (eviction, deadline, deletion)
    stop_grace_s: float = 0.0
    finalizers: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"{PODS_URL}/{self.name}"

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    def set_condition(
        self, kind: str, reason: str = "", message: str = "", status: str = "True"
    ) -> None:
        """Set one condition (replacing an earlier one of its type), as the kubelet does."""
        self.conditions = [c for c in self.conditions if c["type"] != kind]
        self.conditions.append(_condition(kind, reason, message, status))

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c["type"] == kind), None)

    def log_text(self, container: str) -> str:
        return "".join(self.logs.get(container, []))


class Node:
    """The kubelet and Job controller stand-in over one kmock API server and a Docker engine."""

    def __init__(
        self,
        harness: Harness,
        client: docker.DockerClient,
        root: Path,
        *,
        injected_env: dict[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.h = harness
        self.docker = client
        self.root = root
        self.injected_env = dict(injected_env or {})
        self.kubeconfig = kubeconfig
        self.id = uuid.uuid4().hex[:10]
        self.pods: dict[str, Pod] = {}
        self.keep_logs = True  # False: a pod's log is gone once it ends (its node was removed)
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.errors: list[BaseException] = []  # of its background tasks: a test fails with them
        # Docker calls block: they run on threads of their own, never on the loop serving kmock.
        self._pool = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="kubelet")

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    # ------------------------------------------------------------------ lifecycle of the node

    def start(self) -> None:
        """Start the Job controller (it watches kmock's Jobs by polling)."""
        self._background(self._control_jobs(), "job-controller")

    def _background(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    def check(self) -> None:
        """Fail if a background task of the stand-in failed (a bug of the stand-in, or its input)."""
        if self.errors:
            error = self.errors[0]
            raise AssertionError(f"the node stand-in failed: {error!r}") from error

    async def wait_for(
        self, check: Any, *, timeout: float = 15, what: str = "the condition"
    ) -> Any:
        """The harness's poll, failing at once if the node stand-in itself failed."""

        async def probe() -> Any:
            self.check()
            value = check()
            return await value if asyncio.iscoroutine(value) else value

        return await self.h.wait_for(probe, timeout=timeout, what=what)

    async def stop(self) -> None:
        """Stop everything and remove every container this node made."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        filters = {"label": f"{CONTAINERS_URL_LABEL}={self.id}"}
        for container in await self._call(self.docker.containers.list, all=True, filters=filters):
            await self._call(container.remove, force=True)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the Job controller

    async def _control_jobs(self) -> None:
        while True:
            for job in await self.h.items(JOBS_URL):
                uid = job["metadata"]["uid"]
                if uid in self._jobs or job["spec"].get("suspend"):
                    continue
                self._jobs[uid] = self._background(self._run_job(job), f"job {uid}")
            await asyncio.sleep(0.25)

    async def _job_exists(self, job: dict[str, Any]) -> bool:
        current = await self.h.get(f"{JOBS_URL}/{job['metadata']['name']}")
        return current is not None and current["metadata"]["uid"] == job["metadata"]["uid"]

    async def _run_job(self, job: dict[str, Any]) -> None:
        name, spec = job["metadata"]["name"], job["spec"]
        url = f"{JOBS_URL}/{name}"
        started = time.monotonic()
        await self.h.patch(f"{url}/status", {"status": {"startTime": now(), "active": 0}})
        deadline_s = spec.get("activeDeadlineSeconds")
        deadline = started + deadline_s if deadline_s else None
        failed = 0
        while True:
            pod = self.new_pod(job["spec"]["template"], owner=job)
            await self.h.patch(f"{url}/status", {"status": {"active": 1}})
            watcher = self._background(self._watch_job(job, pod, deadline), f"watch {pod.name}")
            try:
                await self.run_pod(pod)
            finally:
                if pod.stop_reason != "JobDeleted":
                    watcher.cancel()
            if pod.stop_reason == "JobDeleted":
                await watcher  # it deletes the pod object, as garbage collection does
                return
            await self._account(pod)
            if pod.stop_reason == "DeadlineExceeded":
                await self._end_job(
                    url,
                    "Failed",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                    failed=failed + 1,
                )
                return
            if pod.succeeded:
                await self._end_job(
                    url,
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    succeeded=1,
                    failed=failed,
                )
                return
            # The Job's podFailurePolicy and backoffLimit, as upstream applies them.
            decision = account_failed_pod(
                {"spec": spec, "status": {"failed": failed}},
                {"metadata": {"namespace": NS, "name": pod.name}, "status": self._status(pod)},
                tracked=True,
            )
            if decision.ends is not None:
                reason, message = decision.ends
                await self._end_job(url, "Failed", reason, message, failed=decision.failed)
                return
            if decision.failed != failed:
                failed = decision.failed
                await self.h.patch(f"{url}/status", {"status": {"failed": failed, "active": 0}})
            await asyncio.sleep(RETRY_DELAY_S)

    async def _watch_job(self, job: dict[str, Any], pod: Pod, deadline: float | None) -> None:
        """While a Job's pod runs: its deadline, and the Job's deletion (garbage collection)."""
        while not pod.done.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                await self.stop_pod(pod, "DeadlineExceeded", grace_s=self._grace(pod))
                return
            if not await self._job_exists(job):
                await self.stop_pod(pod, "JobDeleted", grace_s=self._grace(pod))
                await pod.done.wait()
                await self.h.delete(pod.url)
                await self._account(pod)
                return
            await asyncio.sleep(0.25)

    async def _account(self, pod: Pod) -> None:
        """The Job controller counted the pod: it drops its tracking finalizer (a deleted pod goes)."""
        await self.h.patch(pod.url, {"metadata": {"finalizers": []}})

    async def _end_job(self, url: str, kind: str, reason: str, message: str, **counts: int) -> None:
        first = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        status: dict[str, Any] = {
            "active": 0,
            "ready": 0,
            "terminating": 0,
            **counts,
            "conditions": [_condition(first, reason, message), _condition(kind, reason, message)],
        }
        if kind == "Complete":
            status["completionTime"] = now()
        await self.h.patch(f"{url}/status", {"status": status})

    # ------------------------------------------------------------------ pods

    def new_pod(self, template: dict[str, Any], *, owner: dict[str, Any]) -> Pod:
        """A pod from a Job's or Deployment's template (not started yet)."""
        owner_name = owner["metadata"]["name"]
        name = f"{owner_name[:57]}-{uuid.uuid4().hex[:5]}"
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        if owner["kind"] == "Job":
            labels |= {
                "job-name": owner_name,
                "batch.kubernetes.io/job-name": owner_name,
                "controller-uid": owner["metadata"]["uid"],
                "batch.kubernetes.io/controller-uid": owner["metadata"]["uid"],
            }
        pod = Pod(name, template["spec"], labels, owner, self.root / name)
        if owner["kind"] == "Job":
            pod.finalizers = [JOB_TRACKING_FINALIZER]
        self.pods[name] = pod
        return pod

    def start_pod(self, pod: Pod) -> asyncio.Task[None]:
        """Run a pod in the background (for long-running pods such as the operator's)."""
        return self._background(self.run_pod(pod), f"pod {pod.name}")

    async def run_pod(self, pod: Pod) -> None:
        """Create the pod object, run its init containers then its containers, write its end."""
        owner = pod.owner
        reference = {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
        pod.conditions = [_condition("PodScheduled")]
        await self.h.create(
            PODS_URL,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod.name,
                    "labels": pod.labels,
                    "ownerReferences": [reference],
                    "finalizers": pod.finalizers,
                },
                "spec": pod.spec,
                "status": {"phase": "Pending", "conditions": pod.conditions},
            },
        )
        try:
            try:
                mounts = await self._volumes(pod)
                for container in pod.spec.get("initContainers") or []:
                    end = await self._run_container(pod, container, mounts, init=True)
                    pod.init_ends.append(end)
                    await self._write_status(pod)
                    if end.exit_code != 0 or pod.stop_reason:
                        break
                else:
                    pod.set_condition("Initialized")
                    if pod.stop_reason:  # stopped while initializing: nothing more starts
                        raise Waiting(pod.spec["containers"][0]["name"], "PodInitializing", "")
                    ends = await asyncio.gather(
                        *(self._run_container(pod, c, mounts) for c in pod.spec["containers"])
                    )
                    pod.ends = list(ends)
            except Waiting as waiting:
                # The kubelet keeps retrying; the pod stays Pending until it is stopped.
                await self._write_status(pod, waiting=waiting)
                while not pod.stop_reason:
                    await asyncio.sleep(0.25)
            ok = not pod.stop_reason and all(e.exit_code == 0 for e in pod.init_ends + pod.ends)
            for kind in ("ContainersReady", "Ready"):  # no container runs any more
                pod.set_condition(kind, "PodCompleted", status="False")
            pod.phase = "Succeeded" if ok and pod.ends else "Failed"
            await self._write_status(pod)
        finally:
            pod.done.set()
            if not self.keep_logs:
                self.forget_logs(pod)
            shutil.rmtree(pod.root, ignore_errors=True)

    def forget_logs(self, pod: Pod) -> None:
        """The pod's logs are gone (its node was removed): the log route answers 404."""
        for key in [k for k in self.h.logs if k == pod.name or k.startswith(f"{pod.name}/")]:
            del self.h.logs[key]

    async def _write_status(
        self, pod: Pod, running: list[str] | None = None, waiting: Waiting | None = None
    ) -> None:
        """Write the pod's status as the kubelet reports it."""
        await self._patch_status(pod, self._status(pod, running, waiting))

    @staticmethod
    def _status(
        pod: Pod, running: list[str] | None = None, waiting: Waiting | None = None
    ) -> dict[str, Any]:
        """The pod's status as the kubelet reports it (phase, conditions, container states)."""
        specs = pod.spec["containers"] + (pod.spec.get("initContainers") or [])
        images = {c["name"]: c["image"] for c in specs}
        statuses = [end.status(images[end.name]) for end in pod.ends]
        for name in running or []:
            state = {"running": {"startedAt": now()}}
            statuses.append(
                {
                    "name": name,
                    "image": images[name],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": state,
                }
            )
        init = [e.status(images[e.name]) for e in pod.init_ends]
        if waiting is not None:
            state = {"waiting": {"reason": waiting.reason, "message": waiting.message}}
            entry = {
                "name": waiting.container,
                "image": images.get(waiting.container, ""),
                "ready": False,
                "restartCount": 0,
                "state": state,
            }
            is_init = waiting.container in {c["name"] for c in pod.spec.get("initContainers") or []}
            (init if is_init else statuses).append(entry)
        status: dict[str, Any] = {
            "phase": pod.phase,
            "conditions": pod.conditions,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "initContainerStatuses": init,
            "containerStatuses": statuses,
        }
        if pod.reason:
            status["reason"] = pod.reason
        if pod.message:
            status["message"] = pod.message
        return status

    async def _patch_status(self, pod: Pod, status: dict[str, Any]) -> None:
        """Patch a pod's status; a pod object already deleted (not a Job's) has none to patch."""
        await self.h.patch_if_exists(f"{pod.url}/status", {"status": status})

    async def stop_pod(self, pod: Pod, reason: str, *, grace_s: float) -> None:
        """Terminate a pod's containers: SIGTERM, then SIGKILL after ``grace_s``."""
        pod.stop_reason = pod.stop_reason or reason
        pod.stop_grace_s = grace_s
        for container in list(pod.containers.values()):
            with contextlib.suppress(docker.errors.NotFound):
                await self._call(container.stop, timeout=int(grace_s))

    async def kill_pod(self, pod: Pod) -> None:
        """The pod's processes are killed outright (SIGKILL); returns once the signal is sent."""
        pod.stop_reason = pod.stop_reason or "Killed"
        for container in list(pod.containers.values()):
            with contextlib.suppress(docker.errors.APIError):
                await self._call(container.kill)

    async def evict(self, pod: Pod, *, grace_s: float | None = None) -> None:
        """What an Eviction (POST pods/NAME/eviction) does: DisruptionTarget, then graceful delete.

        ``grace_s`` is the eviction's own grace period (``kubectl drain --grace-period``);
        by default the pod's ``terminationGracePeriodSeconds``.
        """
        message = "Eviction API: evicting"
        pod.set_condition("DisruptionTarget", "EvictionByEvictionAPI", message)
        await self._patch_status(pod, {"conditions": pod.conditions})
        await self.h.delete(pod.url)  # marked for deletion; goes once its finalizer is dropped
        await self.stop_pod(
            pod, "Evicted", grace_s=self._grace(pod) if grace_s is None else grace_s
        )

    async def evict_by_kubelet(self, pod: Pod, message: str, *, node_pressure: bool) -> None:
        """The kubelet's own eviction: the pod is killed at once and stays, Failed with reason
        Evicted. Only a node-pressure eviction adds a DisruptionTarget condition
        (TerminationByKubelet); one for the pod's own local storage limits (an emptyDir over
        its sizeLimit, an ephemeral-storage limit) adds none (pkg/kubelet/eviction)."""
        pod.reason, pod.message = "Evicted", message
        if node_pressure:
            pod.set_condition("DisruptionTarget", "TerminationByKubelet", message)
        await self.stop_pod(pod, "Evicted", grace_s=0)

    @staticmethod
    def _grace(pod: Pod) -> float:
        return float(pod.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))

    # ------------------------------------------------------------------ volumes

    async def _volumes(self, pod: Pod) -> dict[str, dict[str, Any]]:
        """Lay out the pod's volumes on the host: volume name -> how to mount it."""
        security = pod.spec.get("securityContext") or {}
        gid = security.get("fsGroup")
        volumes: dict[str, dict[str, Any]] = {}
        for volume in pod.spec.get("volumes") or []:
            name = volume["name"]
            path = pod.root / "volumes" / name
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                limit = int(parse_quantity(empty["sizeLimit"])) if empty.get("sizeLimit") else None
                if empty.get("medium") == "Memory":
                    volumes[name] = {"tmpfs": limit}
                    continue
                self._writable_dir(path, gid)
                volumes[name] = {"path": path, "size_limit": limit}
            elif "configMap" in volume or "secret" in volume:
                source = volume.get("configMap") or volume["secret"]
                kind = "configmaps" if "configMap" in volume else "secrets"
                ref = source.get("name") or source.get("secretName")
                obj = await self.h.get(f"/api/v1/namespaces/{NS}/{kind}/{ref}")
                for _ in range(
                    MOUNT_RETRIES
                ):  # the kubelet retries a mount whose source is missing
                    if obj is not None:
                        break
                    await asyncio.sleep(0.25)
                    obj = await self.h.get(f"/api/v1/namespaces/{NS}/{kind}/{ref}")
                if obj is None:
                    first = pod.spec["containers"][0]["name"]
                    message = (
                        f'MountVolume.SetUp failed for volume "{name}": {kind} "{ref}" not found'
                    )
                    raise Waiting(first, "ContainerCreating", message)
                data = dict(obj.get("data") or {})
                if kind == "secrets":
                    data = {k: base64.b64decode(v).decode() for k, v in data.items()}
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                path.mkdir(parents=True)
                for item in items:
                    target = path / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item["key"]])
                    target.chmod(item.get("mode", source.get("defaultMode", 0o644)))
                volumes[name] = {"path": path, "read_only": True}
            elif "persistentVolumeClaim" in volume:
                claim = (
                    self.root / "persistent-volumes" / volume["persistentVolumeClaim"]["claimName"]
                )
                self._writable_dir(claim, gid)
                volumes[name] = {
                    "path": claim,
                    "read_only": bool(volume["persistentVolumeClaim"].get("readOnly")),
                }
            else:
                raise NotImplementedError(f"the kubelet stand-in has no volume type for {volume}")
        return volumes

    @staticmethod
    def _writable_dir(path: Path, gid: int | None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if gid is not None:
            shutil.chown(path, group=gid)
        path.chmod(0o2777 if gid is not None else 0o777)  # as the kubelet makes emptyDirs

    def _mounts(
        self, container: dict[str, Any], volumes: dict[str, dict[str, Any]]
    ) -> tuple[list[docker.types.Mount], dict[str, str]]:
        mounts, tmpfs = [], {}
        for m in container.get("volumeMounts") or []:
            volume = volumes[m["name"]]
            if "tmpfs" in volume:
                size = volume["tmpfs"]
                tmpfs[m["mountPath"]] = f"size={size},mode=1777" if size else "mode=1777"
                continue
            source = volume["path"] / m["subPath"] if m.get("subPath") else volume["path"]
            read_only = bool(m.get("readOnly") or volume.get("read_only"))
            mounts.append(
                docker.types.Mount(m["mountPath"], str(source), type="bind", read_only=read_only)
            )
        return mounts, tmpfs

    # ------------------------------------------------------------------ containers

    async def _env(self, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            kind = "configmaps" if "configMapRef" in source else "secrets"
            obj = await self.h.get(f"/api/v1/namespaces/{NS}/{kind}/{ref['name']}")
            if obj is None and not ref.get("optional"):
                message = f'{kind} "{ref["name"]}" not found'
                raise Waiting(container["name"], "CreateContainerConfigError", message)
            for key, value in ((obj or {}).get("data") or {}).items():
                env[source.get("prefix", "") + key] = (
                    base64.b64decode(value).decode() if kind == "secrets" else value
                )
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
                continue
            source = var["valueFrom"]
            if "fieldRef" in source:
                fields = {
                    "metadata.name": pod.name,
                    "metadata.namespace": NS,
                    "status.podIP": "127.0.0.1",
                    "spec.nodeName": f"node-{self.id}",
                }
                env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
                continue
            ref = source.get("secretKeyRef") or source["configMapKeyRef"]
            kind = "secrets" if "secretKeyRef" in source else "configmaps"
            obj = await self.h.get(f"/api/v1/namespaces/{NS}/{kind}/{ref['name']}")
            value = ((obj or {}).get("data") or {}).get(ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                message = f"couldn't find key {ref['key']} in {kind} {NS}/{ref['name']}"
                raise Waiting(container["name"], "CreateContainerConfigError", message)
            env[var["name"]] = base64.b64decode(value).decode() if kind == "secrets" else value
        for name, value in self.injected_env.items():  # admission adds, never overrides
            env.setdefault(name, value)
        return env

    def _user(
        self, pod: Pod, container: dict[str, Any], image: Any
    ) -> tuple[str | None, dict[str, Any]]:
        security = {
            **(pod.spec.get("securityContext") or {}),
            **(container.get("securityContext") or {}),
        }
        uid, gid = security.get("runAsUser"), security.get("runAsGroup")
        if security.get("runAsNonRoot"):
            image_user = (image.attrs["Config"].get("User") or "0").split(":")[0]
            effective = str(uid if uid is not None else image_user)
            if not effective.isdigit():
                message = f"container has runAsNonRoot and image has non-numeric user ({effective}), cannot verify user is non-root"
                raise Waiting(container["name"], "CreateContainerConfigError", message)
            if int(effective) == 0:
                message = "container has runAsNonRoot and image will run as root"
                raise Waiting(container["name"], "CreateContainerConfigError", message)
        user = None if uid is None else (f"{uid}:{gid}" if gid is not None else str(uid))
        return user, security

    async def _run_container(
        self,
        pod: Pod,
        container: dict[str, Any],
        volumes: dict[str, dict[str, Any]],
        *,
        init: bool = False,
    ) -> ContainerEnd:
        name = container["name"]
        try:
            image = await self._call(self.docker.images.get, container["image"])
        except docker.errors.ImageNotFound:
            # No registry can be reached from here: a missing image never arrives.
            never = container.get("imagePullPolicy") == "Never"
            reason = "ErrImageNeverPull" if never else "ErrImagePull"
            raise Waiting(
                name, reason, f'image "{container["image"]}" is not present on the node'
            ) from None
        env = await self._env(pod, container)
        user, security = self._user(pod, container, image)
        mounts, tmpfs = self._mounts(container, volumes)
        message_path = container.get("terminationMessagePath", "/dev/termination-log")
        message_file = pod.root / "termination" / name
        message_file.parent.mkdir(parents=True, exist_ok=True)
        message_file.write_bytes(b"")
        message_file.chmod(0o666)
        mounts.append(docker.types.Mount(message_path, str(message_file), type="bind"))
        if self.kubeconfig is not None and pod.spec.get("automountServiceAccountToken", True):
            target = "/var/run/secrets/kubernetes.io/serviceaccount-kubeconfig/config"
            mounts.append(
                docker.types.Mount(target, str(self.kubeconfig), type="bind", read_only=True)
            )
            env.setdefault("KUBECONFIG", target)
        command = [expand(c, env) for c in container.get("command") or []] or None
        args = [expand(a, env) for a in container.get("args") or []] or None
        limits = (container.get("resources") or {}).get("limits") or {}
        memory = int(parse_quantity(limits["memory"])) if "memory" in limits else None
        groups = [security["fsGroup"]] if security.get("fsGroup") is not None else []
        groups += list(security.get("supplementalGroups") or [])
        caps = security.get("capabilities") or {}
        created = await self._call(
            self.docker.containers.create,
            container["image"],
            entrypoint=command,
            command=args if command or args else None,
            working_dir=container.get("workingDir"),
            environment=env,
            user=user,
            group_add=groups or None,
            read_only=bool(security.get("readOnlyRootFilesystem")),
            security_opt=["no-new-privileges"]
            if security.get("allowPrivilegeEscalation") is False
            else None,
            cap_drop=caps.get("drop"),
            cap_add=caps.get("add"),
            privileged=bool(security.get("privileged")),
            mounts=mounts,
            tmpfs=tmpfs or None,
            mem_limit=memory,
            memswap_limit=memory,
            nano_cpus=int(float(parse_quantity(limits["cpu"])) * 1e9) if "cpu" in limits else None,
            network_mode="host",
            labels={
                CONTAINERS_URL_LABEL: self.id,
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.container.name": name,
            },
            name=f"k8s_{name}_{pod.name}_{self.id}",
        )
        pod.containers[name] = created
        pod.logs[name] = []
        self.h.logs[f"{pod.name}/{name}"] = ""
        started_at = now()
        await self._call(created.start)
        if pod.stop_reason:  # stopped while this container was being created
            await self._call(created.stop, timeout=int(pod.stop_grace_s))
        if not init:
            pod.phase = "Running"
            if not pod.stop_reason:
                pod.set_condition("ContainersReady")
                pod.set_condition("Ready")
            await self._write_status(pod, running=[c["name"] for c in pod.spec["containers"]])
        follower = threading.Thread(
            target=self._follow_logs, args=(pod, name, created), daemon=True
        )
        follower.start()
        monitor = asyncio.create_task(self._monitor(pod, volumes))
        try:
            await self._call(created.wait)
        finally:
            monitor.cancel()
        await self._call(follower.join, 30)
        await self._call(created.reload)
        state = created.attrs["State"]
        exit_code = int(state["ExitCode"])
        reason = (
            "OOMKilled" if state.get("OOMKilled") else ("Completed" if exit_code == 0 else "Error")
        )
        message = message_file.read_bytes()[:TERMINATION_MESSAGE_LIMIT].decode(errors="replace")
        if (
            not message
            and exit_code != 0
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            tail = "".join(pod.log_text(name).splitlines(keepends=True)[-FALLBACK_LOG_LINES:])
            message = tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="replace")
        await self._call(created.remove, force=True)
        del pod.containers[name]
        return ContainerEnd(name, exit_code, reason, message or None, started_at, now())

    def _follow_logs(self, pod: Pod, name: str, container: Any) -> None:
        """Stream a container's output into the pod log kmock serves (as the kubelet does)."""
        key = f"{pod.name}/{name}"
        for chunk in container.logs(stream=True, follow=True):
            pod.logs[name].append(chunk.decode(errors="replace"))
            if key in self.h.logs or self.keep_logs:
                self.h.logs[key] = pod.log_text(name)

    async def _monitor(self, pod: Pod, volumes: dict[str, dict[str, Any]]) -> None:
        """While containers run: emptyDir sizeLimits, enforced by eviction as the kubelet does."""
        while True:
            await asyncio.sleep(1.0)
            for name, volume in volumes.items():
                limit = volume.get("size_limit")
                if limit is None:
                    continue
                used = await self._call(_disk_usage, volume["path"])
                if used > limit:
                    message = f'Usage of EmptyDir volume "{name}" exceeds the limit "{limit}". '
                    await self.evict_by_kubelet(pod, message, node_pressure=False)
                    return

    async def wait_log(self, pod: Pod, container: str, text: str, timeout: float = 120) -> None:
        """Wait until a container of ``pod`` has printed ``text``."""
        await self.wait_for(
            lambda: text in pod.log_text(container) or pod.done.is_set(),
            timeout=timeout,
            what=f"{text!r} in the log of {pod.name}/{container}",
        )
        assert text in pod.log_text(container), (
            f"{pod.name} ended without printing {text!r}:\n{pod.log_text(container)[-3000:]}"
        )


def _disk_usage(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
