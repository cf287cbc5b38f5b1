"""Builders of the Kubernetes manifests the operator creates: pure functions, plain dicts.

Every manifest is validated against the Kubernetes 1.33 schemas in tests/operator/. User values
only ever land in typed fields (args lists, env values), never in a shell string, so nothing a
spec holds can become a command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from model_support.operator.resource import (
    API_VERSION,
    KIND,
    LABEL_ATTEMPT,
    LABEL_GENERATION,
    LABEL_KUEUE_QUEUE,
    LABEL_MANAGED_BY,
    LABEL_TEST,
    LABEL_UID,
    MANAGED_BY,
    RUNNER_CONTAINER,
)
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import TestSpec
from model_support.vocabulary import Parallelism

NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
NEURON_TAINT = "aws.amazon.com/neuron"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
WORKDIR = "/work"
EXTRA_PACKAGES_DIR = "/work/extra-packages"
RUN_PY_KEY = "run.py"
ANNOTATION_RUN_ID = "modelsupport.dev/run-id"

# The NEFF cache goes back to its target after run.py, whatever run.py's exit status; the
# status is kept so the pod (and the Job) still fail or succeed as run.py did. Paths come
# from env vars, so no spec value is ever spliced into this script.
_SYNC_BACK = (
    "python3 run.py; status=$?; "
    'hf buckets sync "$TORCH_NEURONX_NEFF_CACHE_DIR" "$MODEL_SUPPORT_CACHE_TARGET" 1>&2 '
    '|| echo "model-support: NEFF cache upload to $MODEL_SUPPORT_CACHE_TARGET failed" 1>&2; '
    'exit "$status"'
)


@dataclass(frozen=True)
class TestRef:
    """The identity of one ModelSupportTest, as its children point back to it."""

    __test__ = False  # not a pytest class, despite the name

    namespace: str
    name: str
    uid: str
    generation: int


@dataclass(frozen=True)
class Placement:
    """How many cores a test gets and how much host memory its pod requests."""

    cores: int
    parallelism: Parallelism
    host_memory_bytes: int


def labels_for(test: TestRef, attempt: int | None = None) -> dict[str, str]:
    """Labels that lead from a child back to its test (and the generation/attempt it serves)."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_TEST: test.name[:63].rstrip("-_."),
        LABEL_UID: test.uid,
        LABEL_GENERATION: str(test.generation),
    }
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    return labels


def owner_reference(test: TestRef) -> dict[str, Any]:
    """Owner reference to the test: deleting the test garbage-collects its children."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": test.name,
        "uid": test.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_configmap(test: TestRef, name: str, run_py: str) -> dict[str, Any]:
    """The ConfigMap holding the rendered run.py, byte for byte what runs and is recorded."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": test.namespace,
            "labels": labels_for(test),
            "ownerReferences": [owner_reference(test)],
        },
        "immutable": True,
        "data": {RUN_PY_KEY: run_py},
    }


def _memory(n_bytes: int) -> str:
    """A memory quantity rounded up: whole GiB, or MiB below one GiB (a small configured floor)."""
    if n_bytes < 2**30:
        return f"{max(1, math.ceil(n_bytes / 2**20))}Mi"
    return f"{math.ceil(n_bytes / 2**30)}Gi"


def _cpu(value: float) -> str:
    return f"{max(1, math.ceil(value * 1000))}m"


def build_job(
    test: TestRef,
    spec: TestSpec,
    placement: Placement,
    *,
    job_name: str,
    configmap_name: str,
    attempt: int,
    run_id: str,
    settings: OperatorSettings,
) -> dict[str, Any]:
    """The runner Job: ``python3 run.py`` from the ConfigMap, sized and placed for the profile."""
    profile = spec.profile_info
    labels = labels_for(test, attempt)
    image = spec.image or settings.runner_image
    pull_policy = spec.imagePullPolicy or settings.image_pull_policy

    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HF_HOME", "value": f"{WORKDIR}/hf-home"},
        {"name": "TORCH_NEURONX_NEFF_CACHE_DIR", "value": settings.neff_cache_dir},
        {"name": "MODEL_SUPPORT_RUN_ID", "value": run_id},
    ]
    if spec.hubTokenSecret is not None:
        # The token comes from the Secret at run time; it is never in the ConfigMap or the spec.
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": spec.hubTokenSecret.name,
                        "key": spec.hubTokenSecret.key,
                    }
                },
            }
        )
    if spec.lnc is not None:
        env.append({"name": "NEURON_LOGICAL_NC_CONFIG", "value": str(spec.lnc)})
    if spec.extraPackages:
        env.append({"name": "PYTHONPATH", "value": EXTRA_PACKAGES_DIR})

    token_env = [e for e in env if e["name"] == "HF_TOKEN"]
    container_security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts: list[dict[str, Any]] = [
        {"name": "work", "mountPath": WORKDIR},
        {
            "name": "run-script",
            "mountPath": f"{WORKDIR}/{RUN_PY_KEY}",
            "subPath": RUN_PY_KEY,
            "readOnly": True,
        },
        {"name": "neff-cache", "mountPath": settings.neff_cache_dir},
        {"name": "tmp", "mountPath": "/tmp"},
    ]

    init_containers: list[dict[str, Any]] = []
    cache = spec.compileCache
    if cache is not None and cache.source is not None:
        init_containers.append(
            {
                "name": "neff-cache-fetch",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": ["hf", "buckets", "sync", cache.source, settings.neff_cache_dir],
                "env": [{"name": "HF_HOME", "value": f"{WORKDIR}/hf-home"}, *token_env],
                "securityContext": container_security,
                "volumeMounts": [m for m in mounts if m["name"] != "run-script"],
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"memory": "4Gi"},
                },
            }
        )
    if spec.extraPackages:
        init_containers.append(
            {
                "name": "extra-packages",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": [
                    "python3",
                    "-m",
                    "pip",
                    "install",
                    "--no-cache-dir",
                    "--disable-pip-version-check",
                    "--target",
                    EXTRA_PACKAGES_DIR,
                    *spec.extraPackages,
                ],
                "securityContext": container_security,
                "volumeMounts": [m for m in mounts if m["name"] != "run-script"],
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"memory": "4Gi"},
                },
            }
        )

    if cache is not None and cache.target is not None:
        command = ["/bin/sh", "-c", _SYNC_BACK]
        env.append({"name": "MODEL_SUPPORT_CACHE_TARGET", "value": cache.target})
    else:
        command = ["python3", RUN_PY_KEY]

    memory = _memory(placement.host_memory_bytes)
    resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": _cpu(placement.cores * settings.cpu_per_core), "memory": memory},
        "limits": {"memory": memory},
    }
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    if profile.neuron:
        # Extended resources need requests == limits; the device plugin sets NEURON_RT_VISIBLE_CORES.
        resources["requests"][NEURONCORE_RESOURCE] = str(placement.cores)
        resources["limits"][NEURONCORE_RESOURCE] = str(placement.cores)
        tolerations.append({"key": NEURON_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    instance_type = spec.instanceType or profile.instance_type
    if instance_type is not None:
        node_selector[INSTANCE_TYPE_LABEL] = instance_type
    node_selector.update(spec.scheduling.nodeSelector)
    tolerations.extend(t.model_dump(exclude_none=True) for t in spec.scheduling.tolerations)

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": RUNNER_CONTAINER,
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": command,
                "workingDir": WORKDIR,
                "env": env,
                "resources": resources,
                "securityContext": container_security,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "volumeMounts": mounts,
            }
        ],
        "volumes": [
            {"name": "work", "emptyDir": {}},
            {
                "name": "run-script",
                "configMap": {
                    "name": configmap_name,
                    "items": [{"key": RUN_PY_KEY, "path": RUN_PY_KEY}],
                },
            },
            {"name": "neff-cache", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.scheduling.schedulerName:
        pod_spec["schedulerName"] = spec.scheduling.schedulerName
    if spec.scheduling.priorityClassName:
        pod_spec["priorityClassName"] = spec.scheduling.priorityClassName
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account

    job_labels = dict(labels)
    if spec.queueName:
        job_labels[LABEL_KUEUE_QUEUE] = spec.queueName
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": spec.timeoutSeconds,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if spec.queueName:
        # Kueue admits the Job by unsuspending it.
        job_spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": test.namespace,
            "labels": job_labels,
            "annotations": {ANNOTATION_RUN_ID: run_id},
            "ownerReferences": [owner_reference(test)],
        },
        "spec": job_spec,
    }
