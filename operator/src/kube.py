"""The few Kubernetes API calls the operator makes, through the official client, as plain dicts.

Handlers run in kopf's thread pool, so this blocking client never runs on kopf's event loop.
Every call carries a request timeout (a stuck connection must not hold a worker thread
forever), and every list is fetched in pages (``limit`` + ``continue``), so a cluster with
thousands of runner pods costs bounded memory per request. Label and field selectors are sent
to the server and also applied here: cheap, and correct even where a server (or an emulator)
ignores them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from model_support.operator.resource import (
    BISECT_PLURAL,
    FIELD_MANAGER,
    GROUP,
    LABEL_RECORDED,
    PLURAL,
    SWEEP_PLURAL,
    VERSION,
)

CLIENT_FLOOR = (34, 1)
"""The oldest kubernetes client the operator runs with (pyproject.toml says the same): 34.1 is
the first generated from Kubernetes 1.34, with ``ResourceV1Api`` (resource.k8s.io/v1: the
ResourceClaimTemplates of Neuron devices through DRA)."""

REQUIRED_APIS = (
    "CoreV1Api",
    "BatchV1Api",
    "CustomObjectsApi",
    "ResourceV1Api",
    "CoordinationV1Api",
)
"""The client's API classes the operator calls."""


def client_problem(version: str, client: object) -> str | None:
    """Why the kubernetes client ``client`` (the module ``kubernetes.client``, at ``version``)
    cannot run the operator, or None when it can."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    missing = [name for name in REQUIRED_APIS if not hasattr(client, name)]
    if found >= CLIENT_FLOOR and not missing:
        return None
    floor = ".".join(map(str, CLIENT_FLOOR))
    lacking = f" (it has no {', '.join(missing)})" if missing else ""
    return (
        f"the kubernetes client {version} is installed{lacking}; the operator needs "
        f"kubernetes>={floor} (pip install 'kubernetes>={floor}')"
    )


def check_client() -> None:
    """Refuse to start with a kubernetes client older than :data:`CLIENT_FLOOR`, saying which
    version was found (rather than failing on the first DRA call, deep in a reconcile)."""
    problem = client_problem(kubernetes.__version__, kubernetes.client)
    if problem is not None:
        raise RuntimeError(problem)


class AlreadyExists(Exception):
    """The object exists (409 Conflict on create): the caller adopts it."""


class Conflict(Exception):
    """A write carried a resourceVersion the object no longer has (409): read it again."""


class CreateRefused(Exception):
    """The API server refused to create a child (quota, admission, validation)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def for_good(self) -> bool:
        """Refused by admission or validation (400, 422: a webhook, a LimitRange): the same
        create is refused again. Otherwise (a quota's 403, throttling's 429) it may pass later."""
        return self.status in (400, 422)


@contextlib.contextmanager
def refusal(kind: str, body: dict[str, Any] | None) -> Iterator[None]:
    """Turn the API server's refusal of a create (403, 422, ...) into CreateRefused, with its
    own message (a ResourceQuota's or LimitRange's, an admission webhook's)."""
    try:
        yield
    except ApiException as exc:
        if exc.status in (404, 409) or exc.status is None or exc.status >= 500:
            raise
        detail = exc.reason or ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            detail = json.loads(exc.body).get("message") or detail
        name = ((body or {}).get("metadata") or {}).get("name")
        raise CreateRefused(
            exc.status,
            f"the API server refused to create {kind}{' ' + name if name else ''} "
            f"({exc.status}): {detail}",
        ) from exc


def being_deleted(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is being deleted (``metadata.deletionTimestamp`` set: finalizers, such
    as the garbage collector's foregroundDeletion, hold it until they are done)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def api_client(
    server: str | None, pool_size: int = 32, *, retries: bool = True
) -> kubernetes.client.ApiClient:
    """An API client for ``server``, else in-cluster credentials, else the local kubeconfig.

    ``retries=False``: urllib3 does not retry a request on its own (by default it retries an
    idempotent one up to three times on a connection or read error, each attempt with the
    whole request timeout): for calls that must end within a deadline (leader election)."""
    if server is not None:
        configuration = kubernetes.client.Configuration()
        configuration.host = server
    else:
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    if not retries:
        configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


def _json(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.data))


def _matches(obj: dict[str, Any], selector: dict[str, str], without: tuple[str, ...] = ()) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items()) and not any(
        k in labels for k in without
    )


def _selector(labels: dict[str, str], without: tuple[str, ...] = ()) -> str:
    """A label selector: every ``labels`` pair, and none of the ``without`` keys."""
    return ",".join([f"{k}={v}" for k, v in sorted(labels.items())] + [f"!{k}" for k in without])


class Kube:
    """Typed-enough access to ConfigMaps, Jobs, Pods, Secrets and ModelSupportTests."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        request_timeout_s: float = 30.0,
        page_size: int = 500,
    ) -> None:
        check_client()
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.resource = kubernetes.client.ResourceV1Api(client)
        self.timeout = request_timeout_s
        self.page_size = page_size

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call with the raw response and the request deadline."""
        return method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)

    def _create(self, create: Callable[..., Any], body: dict[str, Any]) -> dict[str, Any]:
        """Call a create_namespaced_* method; a 409 becomes AlreadyExists (adopt, don't fail)."""
        try:
            return _json(self._call(create, body["metadata"]["namespace"], cast(Any, body)))
        except ApiException as exc:
            if exc.status == 409:
                raise AlreadyExists(body["metadata"]["name"]) from exc
            raise

    def _unless_gone(
        self, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any] | None:
        """One read, patch or delete of an object; None when the object does not exist (404)."""
        try:
            return _json(self._call(method, *args, **kwargs))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _list(
        self,
        namespaced: Callable[..., Any],
        everywhere: Callable[..., Any],
        namespace: str | None,
        **selectors: Any,
    ) -> list[dict[str, Any]]:
        """Every page of a list call (``limit`` + ``continue``)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"limit": self.page_size, **selectors}
            if token:
                paging["_continue"] = token
            if namespace is None:
                page = _json(self._call(everywhere, **paging))
            else:
                page = _json(self._call(namespaced, namespace, **paging))
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def create_configmap(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ConfigMap; AlreadyExists on 409."""
        return self._create(self.core.create_namespaced_config_map, body)

    def create_secret(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Secret; AlreadyExists on 409."""
        return self._create(self.core.create_namespaced_secret, body)

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Job; AlreadyExists on 409."""
        return self._create(self.batch.create_namespaced_job, body)

    def create_resource_claim_template(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaimTemplate (DRA); AlreadyExists on 409."""
        return self._create(self.resource.create_namespaced_resource_claim_template, body)

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap, or None if it does not exist."""
        return self._unless_gone(self.core.read_namespaced_config_map, name, namespace)

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Job, or None if it does not exist."""
        return self._unless_gone(self.batch.read_namespaced_job, name, namespace)

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and (in the background) its pods; a missing Job is already deleted."""
        self._unless_gone(
            self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background"
        )

    def delete_configmap(self, namespace: str, name: str) -> None:
        """Delete a ConfigMap; a missing one is already deleted."""
        self._unless_gone(self.core.delete_namespaced_config_map, name, namespace)

    def delete_resource_claim_template(self, namespace: str, name: str) -> None:
        """Delete a ResourceClaimTemplate (DRA); a missing one is already deleted. Claims made
        from it belong to their pods and stay until those go."""
        self._unless_gone(self.resource.delete_namespaced_resource_claim_template, name, namespace)

    def mark_job_recorded(self, namespace: str, name: str, ttl_seconds: int) -> None:
        """Label a Job whose result is recorded and hand it to the TTL controller, which
        deletes it ``ttl_seconds`` after it finished (:func:`.jobs.ttl_from_now` says how many).

        Runner Jobs are created without ``ttlSecondsAfterFinished`` so nothing collects them
        (and their pods and logs) before the result is recorded; a missing Job is fine.
        """
        body = {
            "metadata": {"labels": {LABEL_RECORDED: "true"}},
            "spec": {"ttlSecondsAfterFinished": ttl_seconds},
        }
        self._unless_gone(self.batch.patch_namespaced_job, name, namespace, body)

    def list_jobs(
        self, namespace: str | None, labels: dict[str, str], without: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """Jobs with all of ``labels`` and none of the ``without`` label keys in ``namespace``
        (None = every namespace)."""
        jobs = self._list(
            self.batch.list_namespaced_job,
            self.batch.list_job_for_all_namespaces,
            namespace,
            label_selector=_selector(labels, without),
        )
        return [j for j in jobs if _matches(j, labels, without)]

    def list_pods(
        self, namespace: str | None, labels: dict[str, str], phase: str | None = None
    ) -> list[dict[str, Any]]:
        """Pods with all of ``labels`` (and in ``phase``, if given: filtered on the server) in
        ``namespace`` (None = every namespace)."""
        selectors: dict[str, Any] = {"label_selector": _selector(labels)}
        if phase:
            selectors["field_selector"] = f"status.phase={phase}"
        pods = self._list(
            self.core.list_namespaced_pod, self.core.list_pod_for_all_namespaces, namespace,
            **selectors,
        )  # fmt: skip
        return [
            p
            for p in pods
            if _matches(p, labels)
            and (phase is None or (p.get("status") or {}).get("phase") == phase)
        ]

    def list_events(self, namespace: str | None, *, kind: str, reason: str) -> list[dict[str, Any]]:
        """core/v1 Events about objects of ``kind`` with ``reason`` in ``namespace`` (None =
        every namespace), selected on the server by their fields."""
        selector = f"involvedObject.kind={kind},reason={reason}"
        events = self._list(
            self.core.list_namespaced_event, self.core.list_event_for_all_namespaces, namespace,
            field_selector=selector,
        )  # fmt: skip
        return [
            e
            for e in events
            if (e.get("involvedObject") or {}).get("kind") == kind and e.get("reason") == reason
        ]

    def pod_log(
        self, namespace: str, name: str, container: str, tail_lines: int, limit_bytes: int
    ) -> str | None:
        """The tail of a container's log, or None if the pod (or its log) is gone: its last
        ``tail_lines`` lines, of which at most the first ``limit_bytes`` bytes (the API server
        stops there, and no more is read here either: a runner pod decides how long its
        lines are)."""
        try:
            response = self._call(
                self.core.read_namespaced_pod_log,
                name,
                namespace,
                container=container,
                tail_lines=tail_lines,
                limit_bytes=limit_bytes,
            )
        except ApiException as exc:
            if exc.status in (400, 404):
                return None
            raise
        # With _preload_content=False the client returns the raw urllib3 response.
        raw = cast(Any, response)
        try:
            data = raw.read(limit_bytes)
        finally:
            raw.release_conn()
        return bytes(data).decode("utf-8", errors="replace")

    def read_labelled_secret(
        self, namespace: str, name: str, labels: dict[str, str]
    ) -> dict[str, Any] | None:
        """The Secret ``name`` when it carries ``labels`` (its values still base64), else None.
        Never logged.

        A list selected by the name and the labels: the API server returns the Secret only
        when it is labelled so, so the operator never receives another Secret's data (a GET of
        the name would return it whatever its labels). RBAC may limit the list to given names
        (``resourceNames``), which a list names in its ``metadata.name`` field selector."""
        page = _json(
            self._call(
                self.core.list_namespaced_secret,
                namespace,
                field_selector=f"metadata.name={name}",
                label_selector=_selector(labels),
            )
        )
        found = [
            item
            for item in page.get("items") or []
            if (item.get("metadata") or {}).get("name") == name and _matches(item, labels)
        ]
        return found[0] if found else None

    @staticmethod
    def secret_key(secret: dict[str, Any], key: str) -> str | None:
        """One decoded value of a Secret read with :meth:`read_labelled_secret`; None if the key
        is missing."""
        value = (secret.get("data") or {}).get(key)
        return base64.b64decode(value).decode() if value is not None else None

    def post_event(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``obj`` (kubectl describe shows it)."""
        meta = obj["metadata"]
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion") or f"{GROUP}/{VERSION}",
                "kind": obj.get("kind") or "ModelSupportTest",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call(self.core.create_namespaced_event, meta["namespace"], cast(Any, event))

    def get_test(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ModelSupportTest, or None if it was deleted."""
        return self._unless_gone(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )

    def patch_test_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        """Merge ``status`` into a test's status subresource; None if the test is gone.

        With ``resource_version`` the write applies only to that version of the test (the API
        server's optimistic concurrency): Conflict when the test changed since it was read.
        """
        return self._patch_status(PLURAL, namespace, name, status, resource_version)

    def _patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None,
    ) -> dict[str, Any] | None:
        """A status merge patch, with the resourceVersion precondition when one is given."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self._unless_gone(
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            raise

    # ------------------------------------------------------------- what sweeps need of tests

    def create_test(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ModelSupportTest; AlreadyExists on 409 (the caller adopts it)."""

        def create(namespace: str, obj: Any, **kwargs: Any) -> Any:
            return self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, obj, **kwargs
            )

        return self._create(create, body)

    def list_sweeps(self, namespace: str | None) -> list[dict[str, Any]]:
        """Every ModelSupportSweep in ``namespace`` (None = every namespace; every page)."""

        def namespaced(ns: str, **kwargs: Any) -> Any:
            return self.custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, SWEEP_PLURAL, **kwargs
            )

        def everywhere(**kwargs: Any) -> Any:
            return self.custom.list_cluster_custom_object(GROUP, VERSION, SWEEP_PLURAL, **kwargs)

        return self._list(namespaced, everywhere, namespace)

    def list_tests(self, namespace: str | None, labels: dict[str, str]) -> list[dict[str, Any]]:
        """ModelSupportTests with all of ``labels`` in ``namespace`` (None = every namespace;
        every page)."""

        def namespaced(ns: str, **kwargs: Any) -> Any:
            return self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kwargs)

        def everywhere(**kwargs: Any) -> Any:
            return self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)

        selectors = {"label_selector": _selector(labels)} if labels else {}
        tests = self._list(namespaced, everywhere, namespace, **selectors)
        return [t for t in tests if _matches(t, labels)]

    def patch_test(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """Merge ``patch`` into a test (metadata and spec); None if the test is gone."""
        return self._unless_gone(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            patch,
        )

    def get_sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ModelSupportSweep, or None if it was deleted."""
        return self._unless_gone(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, SWEEP_PLURAL, name
        )

    def patch_sweep_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        """Merge ``status`` into a sweep's status subresource; None if the sweep is gone.

        With ``resource_version``, as for tests (:meth:`patch_test_status`): the write applies
        only to that version of the sweep, else Conflict (read it again, write again).
        """
        return self._patch_status(SWEEP_PLURAL, namespace, name, status, resource_version)

    # ------------------------------------------------------------- bisects

    def get_bisect(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ModelSupportBisect, or None if it was deleted."""
        return self._unless_gone(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, BISECT_PLURAL, name
        )

    def patch_bisect_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        """Merge ``status`` into a bisect's status as of ``resource_version`` (Conflict when
        it changed since it was read); None if the bisect is gone."""
        return self._patch_status(BISECT_PLURAL, namespace, name, status, resource_version)
