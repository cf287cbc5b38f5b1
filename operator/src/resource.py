"""Names of the custom resource, the labels on its children, and child naming."""

from __future__ import annotations

import hashlib
import re

GROUP = "modelsupport.dev"
VERSION = "v1alpha1"
PLURAL = "modelsupporttests"
KIND = "ModelSupportTest"
API_VERSION = f"{GROUP}/{VERSION}"
SWEEP_PLURAL = "modelsupportsweeps"
SWEEP_KIND = "ModelSupportSweep"
BISECT_PLURAL = "modelsupportbisects"
BISECT_KIND = "ModelSupportBisect"

FIELD_MANAGER = "model-support-operator"
"""Who we are in managedFields, Events and the kopf annotations."""

# Labels on every child (ConfigMap, Job, pod template): they lead from a Job back to its test.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "model-support-operator"
LABEL_TEST = f"{GROUP}/test"
LABEL_UID = f"{GROUP}/test-uid"
LABEL_GENERATION = f"{GROUP}/generation"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_RECORDED = f"{GROUP}/recorded"
"""Set on a runner Job once its result is recorded: the watchdog lists only Jobs without it."""

LABEL_SWEEP = f"{GROUP}/sweep"
"""On every test a sweep made (or a flat sweep generated): the sweep's name."""
ANNOTATION_MODEL = f"{GROUP}/model"
"""The full model id on a sweep's test (labels hold at most 63 characters)."""
ANNOTATION_SWEEP_RUN = f"{GROUP}/sweep-run"
"""On a sweep's test: the run key (epoch + stack) its current generation tests."""
ANNOTATION_CONFIRMS = f"{GROUP}/confirms"
"""On a sweep's re-run of a test: the name of the test whose worse result it re-runs."""

LABEL_BISECT = f"{GROUP}/bisect"
"""On every step test of a ModelSupportBisect: the bisect's name."""
ANNOTATION_BISECT_STEP = f"{GROUP}/bisect-step"
"""On a bisect's step test: the sha256 of the run.py it runs, a space, and the environment it
runs it in (every suspect's ``name==version``, sorted, space-separated)."""

ANNOTATION_TEST_NAME = f"{GROUP}/test-name"
"""The test's full name on its Job and pods (names go up to 253 characters, labels to 63)."""

ANNOTATION_TIMEOUT = f"{GROUP}/timeout-seconds"
"""The test's timeoutSeconds on its runner Job: what the runner enforces from run.py's start."""

RUNNER_CONTAINER = "runner"

_MAX_NAME = 63  # Job names end up in the pod label job-name, which is limited to 63 characters.
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def child_name(test_name: str, uid: str, generation: int, attempt: int | None = None) -> str:
    """Deterministic name of a test's ConfigMap (attempt None) or Job for one generation.

    The same test, generation and attempt always give the same name, so a replayed event meets
    409 Conflict instead of creating a twin. A short hash of the uid keeps a recreated test of
    the same name from adopting a leftover child of its predecessor.
    """
    suffix = f"-{uid.replace('-', '')[:6]}-g{generation}"
    if attempt is not None:
        suffix += f"-a{attempt}"
    base = _NOT_DNS.sub("-", test_name.lower()).strip("-") or "test"
    room = _MAX_NAME - len(suffix)
    if len(base) > room:
        digest = hashlib.sha256(test_name.encode()).hexdigest()[:6]
        base = base[: room - 7].rstrip("-") + "-" + digest
    return base + suffix


def run_id_for(uid: str, generation: int, attempt: int) -> str:
    """The run id of one attempt of one generation of one test: the same on every replay.

    Records are keyed by run id and the store refuses a duplicate, so an operator that restarts
    (or sees an event twice) can never record the same run twice.
    """
    digest = hashlib.sha256(f"{uid}/{generation}/{attempt}".encode()).hexdigest()[:24]
    return f"op-{digest}"
