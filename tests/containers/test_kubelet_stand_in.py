"""The Docker kubelet stand-in runs a Job's pod as a node would (the base image; no operator).

These pin down the stand-in itself, so the end-to-end scenarios can trust what it reports.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from cluster import Cluster
from k8s_harness import CMS_URL, JOBS_URL, NS, PODS_URL

PROBE = r"""
import grp, json, os, sys
facts = {"argv": sys.argv[1:], "cwd": os.getcwd(), "uid": os.getuid(), "gid": os.getgid(),
         "groups": sorted(os.getgroups()), "token": os.environ.get("TOKEN"),
         "pod": os.environ.get("POD_NAME"), "order": open("/data/order").read()}
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return True
    except OSError:
        return False
facts["root_writable"] = writable("/probe")
facts["config_writable"] = writable("/scripts/probe")
facts["data_writable"] = writable("/data/probe")
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
facts["no_new_privs"] = status["NoNewPrivs"].strip()
facts["cap_eff"] = status["CapEff"].strip()
facts["memory_limit"] = int(open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read())
open("/shared/hello.txt", "w").write("kept")
open("/dev/termination-log", "w").write(json.dumps(facts))
print("probe done")
"""


def job(name: str, pod_spec: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": {
            "backoffLimit": 0,
            **spec,
            "template": {"metadata": {"labels": {"test": name}}, "spec": pod_spec},
        },
    }


def container(image: str, name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["/bin/sh", "-c", script], **extra}


async def wait_job_condition(c: Cluster, name: str, timeout: float = 60) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        current = await c.h.get(f"{JOBS_URL}/{name}")
        assert current is not None
        kinds = {x["type"] for x in (current.get("status") or {}).get("conditions") or []}
        return current if kinds & {"Complete", "Failed"} else None

    result: dict[str, Any] = await c.node.wait_for(
        ended, timeout=timeout, what=f"Job {name} to end"
    )
    return result


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(x for x in obj["status"]["conditions"] if x["type"] == kind)


async def pods_of(c: Cluster, name: str) -> list[dict[str, Any]]:
    return [p for p in await c.h.items(PODS_URL) if p["metadata"]["labels"].get("job-name") == name]


async def test_a_pod_runs_as_its_spec_says(cluster: Cluster) -> None:
    c = cluster
    image = c.images.base
    await c.h.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"token": base64.b64encode(b"s3cr3t").decode()},
        },
    )
    await c.h.create(
        CMS_URL,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "probe"},
            "data": {"probe.py": PROBE},
        },
    )
    mounts = [
        {"name": "data", "mountPath": "/data"},
        {"name": "scripts", "mountPath": "/scripts"},
        {"name": "shared", "mountPath": "/shared"},
    ]
    pod_spec = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 2000,
        },
        "initContainers": [
            container(image, "first", "echo first >> /data/order", volumeMounts=mounts),
            container(image, "second", "echo second >> /data/order", volumeMounts=mounts),
        ],
        "containers": [
            {
                "name": "probe",
                "image": image,
                "command": ["python3", "/scripts/probe.py"],
                "args": ["$(GREETING)", "world", "$$(GREETING)"],
                "workingDir": "/data",
                "env": [
                    {"name": "GREETING", "value": "hello"},
                    {
                        "name": "TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                    },
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "resources": {"limits": {"memory": "256Mi"}},
                "volumeMounts": mounts,
            }
        ],
        "volumes": [
            {"name": "data", "emptyDir": {"sizeLimit": "10Mi"}},
            {"name": "scripts", "configMap": {"name": "probe"}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-claim"}},
        ],
    }
    await c.h.create(JOBS_URL, job("probe", pod_spec))
    done = await wait_job_condition(c, "probe")
    [pod] = await pods_of(c, "probe")
    status = pod["status"]
    assert condition(done, "Complete")["status"] == "True", status
    assert status["phase"] == "Succeeded"
    assert [
        (s["name"], s["state"]["terminated"]["exitCode"]) for s in status["initContainerStatuses"]
    ] == [("first", 0), ("second", 0)]
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    facts = json.loads(terminated["message"])  # the termination message, as the kubelet reads it
    assert facts["argv"] == ["hello", "world", "$(GREETING)"]
    assert facts["cwd"] == "/data" and facts["pod"] == pod["metadata"]["name"]
    assert (facts["uid"], facts["gid"]) == (1000, 1000) and 2000 in facts["groups"]
    assert facts["token"] == "s3cr3t"
    assert facts["order"] == "first\nsecond\n"
    assert facts["root_writable"] is False and facts["config_writable"] is False
    assert facts["data_writable"] is True
    assert facts["no_new_privs"] == "1" and int(facts["cap_eff"], 16) == 0
    assert facts["memory_limit"] == 256 * 2**20
    assert (c.node.root / "persistent-volumes" / "shared-claim" / "hello.txt").read_text() == "kept"
    log = await c.h.k.get(
        f"{PODS_URL}/{pod['metadata']['name']}/log", params={"container": "probe"}
    )
    assert "probe done" in await log.text()


async def test_over_its_memory_limit_a_container_is_oom_killed(cluster: Cluster) -> None:
    c = cluster
    hog = container(
        c.images.base,
        "hog",
        "python3 -c 'x = bytearray(512 * 2**20); print(len(x))'",
        resources={"limits": {"memory": "64Mi"}},
    )
    await c.h.create(JOBS_URL, job("hog", {"restartPolicy": "Never", "containers": [hog]}))
    done = await wait_job_condition(c, "hog")
    assert condition(done, "Failed")["reason"] == "BackoffLimitExceeded"
    [pod] = await pods_of(c, "hog")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")


async def test_deadline_and_size_limit_end_pods_as_a_node_does(cluster: Cluster) -> None:
    c = cluster
    sleeper = container(c.images.base, "main", "exec sleep 300")
    await c.h.create(
        JOBS_URL,
        job(
            "slow",
            {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [sleeper]},
            activeDeadlineSeconds=2,
        ),
    )
    filler = container(
        c.images.base,
        "main",
        "head -c 8000000 /dev/zero > /scratch/fill; exec sleep 300",
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    spec = {
        "restartPolicy": "Never",
        "containers": [filler],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "4Mi"}}],
    }
    await c.h.create(JOBS_URL, job("filler", spec))

    slow = await wait_job_condition(c, "slow")
    assert condition(slow, "Failed")["reason"] == "DeadlineExceeded"
    filled = await wait_job_condition(c, "filler")
    assert condition(filled, "Failed")["reason"] == "BackoffLimitExceeded"
    [pod] = await pods_of(c, "filler")
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "Evicted"
    # A local-storage eviction is the pod's own sizing: the kubelet marks no disruption.
    assert 'EmptyDir volume "scratch" exceeds the limit' in pod["status"]["message"]
    assert not any(c["type"] == "DisruptionTarget" for c in pod["status"].get("conditions") or [])


async def test_eviction_is_a_disruption_that_a_pod_failure_policy_can_ignore(
    cluster: Cluster,
) -> None:
    c = cluster
    marker = f"evicted-{uuid.uuid4().hex[:6]}"
    script = f"if [ -e /shared/{marker} ]; then exit 0; fi; touch /shared/{marker}; exec sleep 300"
    mounts = [{"name": "shared", "mountPath": "/shared"}]
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "containers": [container(c.images.base, "main", script, volumeMounts=mounts)],
        "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": "evictions"}}],
    }
    policy = {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]},
            },
        ]
    }
    await c.h.create(JOBS_URL, job("evicted", spec, podFailurePolicy=policy))
    await c.h.create(
        JOBS_URL,
        job(
            "fails",
            {"restartPolicy": "Never", "containers": [container(c.images.base, "main", "exit 42")]},
            backoffLimit=3,
            podFailurePolicy=policy,
        ),
    )

    first = await c.node.wait_for(
        lambda: next(
            (
                p
                for p in c.node.pods.values()
                if p.labels.get("job-name") == "evicted" and "main" in p.containers
            ),
            None,
        ),
        what="the first pod",
    )
    await c.node.wait_for(
        lambda: (c.node.root / "persistent-volumes" / "evictions" / marker).exists(),
        what="the marker",
    )
    await c.node.evict(first, grace_s=2)
    evicted = await wait_job_condition(c, "evicted")
    assert condition(evicted, "Complete")["status"] == "True"
    assert evicted["status"].get("failed", 0) == 0  # the disruption did not count
    [replacement] = await pods_of(c, "evicted")  # the evicted pod object is gone
    assert replacement["metadata"]["name"] != first.name
    disruption = first.condition("DisruptionTarget")
    assert disruption is not None and disruption["reason"] == "EvictionByEvictionAPI"

    failed = await wait_job_condition(c, "fails")
    assert condition(failed, "Failed")["reason"] == "PodFailurePolicy"
    assert len(await pods_of(c, "fails")) == 1  # FailJob: no retry despite backoffLimit 3


async def test_a_container_that_cannot_start_waits_with_the_kubelets_reason(
    cluster: Cluster,
) -> None:
    c = cluster
    root_user = container(c.images.base, "main", "true", securityContext={"runAsNonRoot": True})
    missing = container("model-support-test/missing:0", "main", "true", imagePullPolicy="Never")
    await c.h.create(
        JOBS_URL, job("as-root", {"restartPolicy": "Never", "containers": [root_user]})
    )
    await c.h.create(JOBS_URL, job("no-image", {"restartPolicy": "Never", "containers": [missing]}))

    async def waiting(name: str) -> str | None:
        for pod in await pods_of(c, name):
            for status in pod["status"].get("containerStatuses") or []:
                if "waiting" in status["state"]:
                    return str(status["state"]["waiting"]["reason"])
        return None

    assert (
        await c.node.wait_for(lambda: waiting("as-root"), what="as-root waiting")
        == "CreateContainerConfigError"
    )
    assert (
        await c.node.wait_for(lambda: waiting("no-image"), what="no-image waiting")
        == "ErrImageNeverPull"
    )
    await c.h.delete(f"{JOBS_URL}/no-image")  # garbage collection takes its pod

    async def collected() -> bool:
        return not await pods_of(c, "no-image")

    await c.node.wait_for(collected, what="the deleted Job's pod to go")
