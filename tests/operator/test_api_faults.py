"""The test cluster's API failures: each kind, in each family of calls the operator makes, is
seen by the operator's own client as it would be from a real API server (``api_faults``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
import urllib3
from api_faults import Family, Fault
from k8s_harness import CMS_URL, JOBS_URL, NS, TESTS_URL, Harness
from kubernetes.client.exceptions import ApiException

from model_support.operator.kube import Kube, api_client

TIMEOUT_S = 0.5
"""The operator client's request timeout in these tests (the held request waits 1 s)."""


def kube(h: Harness) -> Kube:
    return Kube(api_client(h.settings.api_server), request_timeout_s=TIMEOUT_S)


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}}


def lease_call(k: Kube) -> Any:
    api = kubernetes.client.CoordinationV1Api(k.client)
    body = {"metadata": {"name": "lease", "namespace": NS}, "spec": {"holderIdentity": "x"}}
    return api.create_namespaced_lease(NS, body, _request_timeout=TIMEOUT_S)


def watch_call(k: Kube) -> Any:
    stream = kubernetes.watch.Watch().stream(
        k.batch.list_namespaced_job, NS, timeout_seconds=1, _request_timeout=TIMEOUT_S
    )
    return list(stream)


CALLS: dict[Family, Callable[[Kube], Any]] = {
    Family.LEASE: lease_call,
    Family.STATUS: lambda k: k.patch_test_status(NS, "t", {"phase": "Pending"}),
    Family.JOBS: lambda k: k.read_job(NS, "job"),
    Family.CONFIGMAPS: lambda k: k.create_configmap(configmap("cm")),
    Family.SECRETS: lambda k: k.create_secret(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "slot", "namespace": NS}}
    ),
    Family.EVENTS: lambda k: k.post_event(
        {"metadata": {"name": "t", "namespace": NS, "uid": "u"}}, "Normal", "Tested", "m"
    ),
    Family.LIST: lambda k: k.list_jobs(NS, {}),
    Family.WATCH: watch_call,
}


def expected(fault: Fault) -> tuple[type[BaseException], ...]:
    """What the operator's client raises for ``fault``: never an ApiException without an
    answer from the server."""
    if fault is Fault.SERVER_ERROR:
        return (ApiException,)
    return (urllib3.exceptions.HTTPError,)


@pytest.mark.parametrize("fault", list(Fault))
@pytest.mark.parametrize("family", list(CALLS))
async def test_each_fault_reaches_the_operators_client_in_each_family(
    harness: Harness, family: Family, fault: Fault
) -> None:
    h = harness
    await h.create_test("t", {"model": "Qwen/Qwen3-0.6B", "profile": "cpu"})
    client = kube(h)
    injected = h.k.inject(fault, family, hold_s=1.0)
    started = time.monotonic()
    with pytest.raises(expected(fault)) as raised:
        await asyncio.to_thread(CALLS[family], client)
    if fault is Fault.SERVER_ERROR:
        assert isinstance(raised.value, ApiException) and raised.value.status == 503
    if fault is Fault.TIMEOUT:  # the client gave up at its own deadline, not the server's
        assert "timed out" in str(raised.value).lower()
    assert injected.hits >= 1
    assert time.monotonic() - started < 30
    # Other families are untouched meanwhile, and once the fault is cleared this one answers.
    other = Family.CONFIGMAPS if family is not Family.CONFIGMAPS else Family.JOBS
    await asyncio.to_thread(CALLS[other], client)
    h.k.clear_faults()
    await asyncio.to_thread(CALLS[family], client)


async def test_a_fault_for_a_number_of_requests_is_spent_and_the_harness_is_never_hit(
    harness: Harness,
) -> None:
    h = harness
    injected = h.k.inject(Fault.SERVER_ERROR, Family.CONFIGMAPS, times=1)
    await h.create(CMS_URL, configmap("mine"))  # the harness's own request: not a victim
    client = kube(h)
    with pytest.raises(ApiException):
        await asyncio.to_thread(client.create_configmap, configmap("cm"))
    await asyncio.to_thread(client.create_configmap, configmap("cm"))  # spent
    assert injected.hits == 1
    assert await h.get(f"{CMS_URL}/cm") is not None and await h.get(f"{CMS_URL}/mine")


async def test_a_request_that_timed_out_was_not_applied(harness: Harness) -> None:
    h = harness
    h.k.inject(Fault.TIMEOUT, Family.JOBS, resource="jobs", hold_s=1.0)
    client = kube(h)
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": NS},
            "spec": {"template": {"spec": {"containers": []}}}}  # fmt: skip
    with pytest.raises(urllib3.exceptions.HTTPError):
        await asyncio.to_thread(client.create_job, body)
    await asyncio.sleep(1.2)  # past the hold: the server dropped it
    assert await h.get(f"{JOBS_URL}/j") is None
    assert await h.get(TESTS_URL) is not None


@pytest.mark.parametrize("family", [Family.WATCH, Family.LIST, Family.STATUS, Family.JOBS])
async def test_the_operator_rides_out_an_api_outage_in_each_family(
    harness: Harness, family: Family
) -> None:
    """A few refused connections and 5xx answers in one family of calls (kopf's watches and
    listings, the status writes, the Job creates): the test still gets its Job and status,
    through kopf's backoff and the watchdog's next round."""
    from test_operator_lifecycle import SPEC

    h = harness
    refused = h.k.inject(Fault.REFUSED, family, times=3)
    unavailable = h.k.inject(Fault.SERVER_ERROR, family, times=3)
    await h.start_operator()
    await h.create_test("qwen", dict(SPEC))
    [job] = await h.wait_job()
    status = await h.wait_status("qwen", lambda s: s.get("phase") == "Pending", "Pending")
    assert status["jobName"] == job["metadata"]["name"]
    assert refused.hits + unavailable.hits >= 1  # the outage did hit the operator
