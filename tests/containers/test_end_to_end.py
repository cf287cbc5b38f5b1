"""End to end in containers: the chart's operator image against kmock, runner pods in Docker.

The operator container is started exactly as the rendered chart's Deployment describes it; it
sizes a tiny model through the Hub stand-in, creates the runner Job, and records the result in
an ``s3://`` store (moto). The node stand-in runs the runner image as a node would (non-root,
read-only root, memory limit, Secrets), so what the cluster would do to a run happens here for
real: OOM kills, evictions, lost logs, a killed operator. Each scenario asserts the recorded
outcome and that exactly one record exists.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import urllib.request
from typing import Any

import pytest
from cluster import TINY_LLAMA_REPO, Cluster
from hubserver import HubServer
from k8s_harness import CMS_URL, JOBS_URL, NS, PODS_URL
from kubelet import Pod

from model_support.records import RunRecord
from model_support.vocabulary import ErrorClass, Result

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "model": TINY_LLAMA_REPO,
    "profile": "cpu",
    "dtype": "float32",
    "maxNewTokens": 8,
    "compileBackend": "aot_eager",
}
STAGE = "MODEL_SUPPORT_STAGE "


def explain(c: Cluster, status: dict[str, Any]) -> str:
    """What to read when a scenario fails: the status, the runner logs, the operator log."""
    runners = [p for p in c.node.pods.values() if p.labels.get("job-name")]
    logs = "\n".join(f"--- {p.name}\n{p.log_text('runner')[-3000:]}" for p in runners)
    return f"status: {status}\n{logs}\n--- operator\n{c.operator_log()[-4000:]}"


async def only_record(c: Cluster) -> RunRecord:
    records = await c.records()
    assert len(records) == 1, [(r.run_id, r.document.result, r.document.error) for r in records]
    return records[0]


async def running_stage(c: Cluster) -> Pod:
    """The runner pod, once run.py has reported its first stage (it is really running)."""
    pod = await c.runner_pod()
    await c.node.wait_log(pod, "runner", STAGE, timeout=300)
    return pod


async def test_a_tiny_model_passes_through_the_runner_image(
    cluster: Cluster, hub: HubServer
) -> None:
    c = cluster
    token = "hf_model_support_test_token"
    await c.h.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hub-token"},
            "data": {"token": base64.b64encode(token.encode()).decode()},
        },
    )
    await c.start_operator()
    # Its liveness probe, as the chart declares it, answers (host network: the port is the node's).
    assert c.deployment is not None
    [operator] = c.deployment["spec"]["template"]["spec"]["containers"]
    probe = operator["livenessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in operator["ports"] if p["name"] == probe["port"])
    url = f"http://127.0.0.1:{port}{probe['path']}"
    assert await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).status) == 200
    hub_requests_before = len(hub.requests)
    await c.create_test("tiny", {**SPEC, "hubTokenSecret": {"name": "hub-token"}})
    status = await c.wait_completed("tiny")

    assert status["result"] == Result.PASS.value, explain(c, status)
    record = await only_record(c)
    assert record.run_id == status["runId"] and record.document.result == Result.PASS
    assert record.document.model == TINY_LLAMA_REPO and len(record.document.tokens[0]) == 8
    [job] = await c.h.items(JOBS_URL)
    pod = job["spec"]["template"]["spec"]
    cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    cm = await c.h.get(f"{CMS_URL}/{cm_name}")
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    # What ran is what is stored: the runner wrote run.py from the program ConfigMap and the
    # Job's config block, and ran it only because it hashed to the operator's rendering.
    assert cm is not None
    assert (
        record.run_py == cm["data"]["head"] + env["MODEL_SUPPORT_RUN_CONFIG"] + cm["data"]["tail"]
    )
    assert hashlib.sha256(record.run_py.encode()).hexdigest() == env["MODEL_SUPPORT_RUN_SHA256"]
    # The runner pod fetched the weights itself, with the token from the Secret (secretKeyRef).
    weights = [
        r
        for r in hub.requests[hub_requests_before:]
        if r["method"] == "GET" and r["path"].endswith(".safetensors") and r["range"] is None
    ]
    assert weights and all(r["token_sent"] for r in weights)
    # The operator materializes the dataset in the s3:// store.
    store = c.store()  # store calls block: they run in threads, never on the loop serving kmock

    async def materialized() -> bool:
        return bool(await asyncio.to_thread(store.matrix_files))

    await c.node.wait_for(materialized, timeout=60, what="the matrix on S3")
    rows = await asyncio.to_thread(store.matrix)
    assert rows[["run_id", "result"]].values.tolist() == [[status["runId"], "PASS"]]


async def test_a_memory_limit_below_the_need_is_recorded_as_out_of_memory(
    cluster: Cluster,
) -> None:
    c = cluster
    # 256 MiB of host memory + 64 MiB of /dev/shm: torch alone needs more.
    await c.start_operator({"settings": {"minHostMemoryGiB": 0.25, "shmPerCoreGiB": 0.0625}})
    await c.create_test("starved", SPEC)
    status = await c.wait_completed("starved")

    assert (status["result"], status.get("errorClass")) == (
        Result.ERROR.value,
        ErrorClass.OUT_OF_MEMORY.value,
    ), explain(c, status)
    [pod] = [p for p in await c.h.items(PODS_URL) if p["metadata"]["labels"].get("job-name")]
    [job] = await c.h.items(JOBS_URL)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "320Mi"
    runner = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "runner")
    assert runner["state"]["terminated"]["reason"] == "OOMKilled"  # a real kill by the kernel
    record = await only_record(c)
    assert record.document.error_class == ErrorClass.OUT_OF_MEMORY


async def test_an_eviction_during_the_run_is_retried_and_then_passes(cluster: Cluster) -> None:
    c = cluster
    await c.start_operator()
    await c.create_test("evicted", SPEC)
    first = await running_stage(c)
    await c.node.evict(first, grace_s=5)  # as `kubectl drain --grace-period=5` would
    status = await c.wait_completed("evicted")

    assert status["result"] == Result.PASS.value, explain(c, status)
    record = await only_record(c)  # nothing recorded for the disrupted attempt
    assert record.document.result == Result.PASS and record.run_id == status["runId"]
    assert first.stop_reason == "Evicted" and first.condition("DisruptionTarget") is not None


async def test_a_pod_log_lost_before_it_is_read_still_yields_the_real_result(
    cluster: Cluster,
) -> None:
    c = cluster
    c.node.keep_logs = False  # the node goes away with the pod's log once the pod ends
    await c.start_operator()
    await c.create_test("no-log", SPEC)
    status = await c.wait_completed("no-log")

    assert status["result"] == Result.PASS.value, explain(c, status)
    record = await only_record(c)
    assert record.document.result == Result.PASS and record.run_id == status["runId"]
    assert len(record.document.tokens[0]) == SPEC["maxNewTokens"]  # the real result, not a guess
    runners = [p.name for p in c.node.pods.values() if p.labels.get("job-name")]
    assert runners and not [k for k in c.h.logs if k.split("/")[0] in runners]  # no log served


async def test_an_operator_killed_mid_run_records_the_run_once(cluster: Cluster) -> None:
    c = cluster
    first_operator = await c.start_operator()
    await c.create_test("restarted", SPEC)
    runner = await running_stage(c)
    await c.node.kill_pod(first_operator)  # SIGKILL: no cleanup, no goodbye
    assert not runner.done.is_set(), "the run ended before the operator was killed"
    await c.node.wait_for(first_operator.done.is_set, timeout=120, what="the killed operator")
    await c.start_operator()  # the Deployment's replacement pod
    status = await c.wait_completed("restarted")

    assert status["result"] == Result.PASS.value, explain(c, status)
    record = await only_record(c)
    assert record.run_id == status["runId"]
    assert len(await c.h.items(JOBS_URL)) == 1  # the new operator adopted the Job, made no other
