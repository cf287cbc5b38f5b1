"""Leader election against an API server that fails as real ones do (client-go's rules, see
operator/src/leader.py): every error is a failed round, the loop never ends by itself, a leader
stops acting at its renew deadline whatever is in flight, and liveness fails when the loop is
not running."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf
import pytest
from api_faults import Family, Fault
from k8s_harness import NS, Harness
from kopf._core.intents.causes import Activity

from model_support.operator.handlers import ELECTION_TASK, _elect
from model_support.operator.kube import api_client
from model_support.operator.leader import Leadership
from model_support.operator.settings import OperatorSettings

LEASE_S, RENEW_DEADLINE_S, RETRY_S = 3.0, 2.0, 0.5
"""Short timings (client-go's proportions: lease > renew deadline > 1.2 x retry)."""


def leadership(h: Harness, identity: str = "me") -> Leadership:
    """A replica's Leadership as the operator builds it: its own client, no urllib3 retries."""
    return Leadership(
        api_client(h.settings.api_server, pool_size=2, retries=False),
        namespace=NS,
        name="model-support-operator",
        identity=identity,
        lease_s=LEASE_S,
        renew_deadline_s=RENEW_DEADLINE_S,
        retry_s=RETRY_S,
    )


@pytest.mark.parametrize("fault", list(Fault))
async def test_every_error_is_a_failed_round_and_the_replica_leads_once_it_clears(
    harness: Harness, fault: Fault
) -> None:
    h = harness
    replica = leadership(h)
    gained: list[bool] = []
    h.k.inject(fault, Family.LEASE, hold_s=1.0)
    for _ in range(2):  # failed rounds: logged, never raised
        assert await asyncio.to_thread(replica.step, lambda: gained.append(True)) == RETRY_S
    assert not replica.leading.is_set() and gained == []
    h.k.clear_faults()
    await asyncio.to_thread(replica.step, lambda: gained.append(True))
    assert replica.leading.is_set() and gained == [True]


async def test_the_election_loop_survives_errors_and_a_follower_leads_later(
    harness: Harness,
) -> None:
    h = harness
    replica = leadership(h)
    h.k.inject(Fault.REFUSED, Family.LEASE)
    loop = asyncio.create_task(_elect(replica, lambda: None))
    try:
        await asyncio.sleep(4 * RETRY_S)
        assert not loop.done(), loop  # the connection errors did not end it
        h.k.clear_faults()
        await h.wait_for(replica.leading.is_set, timeout=10, what="the follower leading")
    finally:
        loop.cancel()


async def test_a_leader_stops_acting_at_its_renew_deadline_whatever_is_in_flight(
    harness: Harness,
) -> None:
    """No round returns (a renewal stuck in flight, a loop blocked): the clock alone ends its
    acting, before any other replica may take the Lease (they wait the lease duration)."""
    h = harness
    replica = leadership(h)
    await asyncio.to_thread(replica.step, lambda: None)
    with replica.acting() as leading:
        assert leading
    await asyncio.sleep(RENEW_DEADLINE_S + 0.3)  # no round in between
    with replica.acting() as leading:
        assert not leading


async def test_a_round_ends_within_the_renew_deadline_against_a_hanging_api_server(
    harness: Harness,
) -> None:
    h = harness
    replica = leadership(h)
    await asyncio.to_thread(replica.step, lambda: None)
    h.k.inject(Fault.TIMEOUT, Family.LEASE, hold_s=10.0)
    started = time.monotonic()
    step = asyncio.to_thread(replica.step, lambda: None)
    await asyncio.wait_for(step, timeout=RENEW_DEADLINE_S + 5)
    assert time.monotonic() - started < RENEW_DEADLINE_S  # bounded below the deadline
    h.k.clear_faults()


def test_timings_that_let_two_replicas_act_at_once_are_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=r"lease duration .* must be longer than the renew"):
        OperatorSettings(results_uri=str(tmp_path), lease_duration_s=10, lease_renew_deadline_s=20)
    with pytest.raises(ValueError, match="leaseRetrySeconds"):
        OperatorSettings(results_uri=str(tmp_path), lease_renew_deadline_s=5, lease_retry_s=5)


async def test_liveness_fails_when_the_election_loop_is_not_running(harness: Harness) -> None:
    h = harness
    await h.start_operator()
    operator = h.operator
    assert operator is not None and operator.registry is not None and operator.loop is not None
    [probe] = operator.registry._activities.get_handlers(activity=Activity.PROBE)
    await h.wait_for(lambda: probe.fn() == "ok", what="the loops running")

    async def stop_election() -> None:
        [task] = [t for t in asyncio.all_tasks() if t.get_name() == ELECTION_TASK]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stop_election(), operator.loop))
    with pytest.raises(kopf.PermanentError, match="leader election loop is not running"):
        probe.fn()
