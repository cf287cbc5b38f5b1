"""run.py's program ConfigMap (operator/src/programs.py): one per namespace, made once, and made
again when someone deletes or changes it, so that no test's pod waits for a mount that never
comes or is refused a run.py that is not the one rendered."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from k8s_harness import CMS_URL, JOBS_URL, NS, Harness

from model_support.config import RunConfig
from model_support.operator.kube import Kube, api_client
from model_support.operator.manifests import TestRef, build_program_configmap
from model_support.operator.programs import ProgramConfigMaps
from model_support.operator.recording import Recorder
from model_support.operator.resource import RUNNER_CONTAINER
from model_support.operator.status import TestStatus
from model_support.script import RUN_CONFIG_ENV, config_block, program, render_script


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


async def test_run_py_is_recorded_as_its_runner_made_it_whichever_release_made_the_job(
    harness: Harness,
) -> None:
    """When rendering again does not give the bytes that ran (the runner script changed with an
    upgrade), the record takes them from the cluster: the program ConfigMap around the Job's
    config block, or, for a Job an earlier release made, that Job's own ConfigMap."""
    h = harness
    recorder = Recorder(h.settings, Kube(api_client(h.settings.api_server)))
    ref = TestRef(NS, "t", "6b1c2f4e-0000-4000-8000-00000000000a", 1)
    config = RunConfig(model="org/tiny", cores=1)
    earlier = render_script(config).replace("import", "import ", 1)  # another release's run.py
    current = render_script(config)

    def job(name: str, configmap: str, env: list[dict[str, str]]) -> dict:
        container = {"name": RUNNER_CONTAINER, "image": "runner", "env": env}
        volume = {"name": "run-script", "configMap": {"name": configmap}}
        pod = {"containers": [container], "volumes": [volume], "restartPolicy": "Never"}
        return {"metadata": {"name": name}, "spec": {"template": {"spec": pod}}}

    await h.create(CMS_URL, {"metadata": {"name": "t-cm"}, "data": {"run.py": earlier}})
    await h.create(JOBS_URL, job("t-old", "t-cm", []))
    program_cm = build_program_configmap(NS, program())
    await h.create(CMS_URL, program_cm)
    block = {"name": RUN_CONFIG_ENV, "value": config_block(config)}
    await h.create(JOBS_URL, job("t-new", program_cm["metadata"]["name"], [block]))

    for name, ran in (("t-old", earlier), ("t-new", current)):
        status = TestStatus(jobName=name, runScriptSha256=hashlib.sha256(ran.encode()).hexdigest())
        assert await asyncio.to_thread(recorder.run_py, ref, status, None) == ran
    # Bytes that do not hash to what the status recorded are never taken for what ran.
    wrong = TestStatus(jobName="t-old", runScriptSha256="0" * 64)
    with pytest.raises(RuntimeError, match="cannot be made again"):
        await asyncio.to_thread(recorder.run_py, ref, wrong, None)
