"""run.py's program ConfigMap (operator/src/programs.py): one per namespace, made once, and made
again when someone deletes or changes it, so that no test's pod waits for a mount that never
comes or is refused a run.py that is not the one rendered."""

from __future__ import annotations

import asyncio

from k8s_harness import CMS_URL, NS, Harness

from model_support.operator.kube import Kube, api_client
from model_support.operator.manifests import build_program_configmap
from model_support.operator.programs import ProgramConfigMaps
from model_support.script import program


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_program_configmap_is_made_once_and_again_when_deleted_or_changed(
    harness: Harness,
) -> None:
    h = harness
    h.k.history = None  # every request is kept: the test counts them
    clock = Clock()
    programs = ProgramConfigMaps(Kube(api_client(h.settings.api_server)), recheck_s=60, clock=clock)
    wanted = build_program_configmap(NS, program())
    name = wanted["metadata"]["name"]

    def writes() -> int:
        return sum(1 for r in h.requests() if r.method.value in ("POST", "DELETE") and r.resource
                   and r.resource.plural == "configmaps")  # fmt: skip

    async def stored() -> dict | None:
        return await h.get(f"{CMS_URL}/{name}")

    for _ in range(50):  # a namespace's first tests, each asking for it
        await asyncio.to_thread(programs.ensure, wanted)
    assert writes() == 1 and (await stored() or {}).get("data") == wanted["data"]

    await h.delete(f"{CMS_URL}/{name}")  # by hand
    await asyncio.to_thread(programs.ensure, wanted)
    assert await stored() is None  # taken to be there until it is looked at again
    clock.now = 61
    await asyncio.to_thread(programs.ensure, wanted)
    assert (await stored() or {}).get("data") == wanted["data"]

    changed = {**wanted, "data": {**wanted["data"], "tail": wanted["data"]["tail"] + "\nplanted\n"}}
    await h.delete(f"{CMS_URL}/{name}")
    await h.create(CMS_URL, changed)
    clock.now = 200
    await asyncio.to_thread(programs.ensure, wanted)
    assert (await stored() or {}).get("data") == wanted["data"]
