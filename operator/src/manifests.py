"""Builders of the Kubernetes manifests the operator creates: pure functions, plain dicts.

Every manifest is validated against the Kubernetes 1.33 schemas in tests/operator/ (1.34 with
DRA claims). User values only ever land in typed fields (args lists, env values), never in a
shell string, so nothing a spec holds can become a command.
"""

from __future__ import annotations

import base64
import copy
import math
from dataclasses import dataclass
from typing import Any

from model_support import hardware
from model_support.compile_cache.compilers import NEURON_TARGET_ENV
from model_support.delivery import slot_subpath
from model_support.operator.dra import (
    LNC_ENV,
    container_claims,
    dra_settings,
    pod_claims,
    runtime_lnc,
)
from model_support.operator.resource import (
    ANNOTATION_TEST_NAME,
    ANNOTATION_TIMEOUT,
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
    child_name,
)
from model_support.operator.settings import NeuronDraSettings, OperatorSettings
from model_support.operator.spec import TestSpec
from model_support.script import PROGRAM_KEYS, RUN_CONFIG_ENV, RUN_SHA256_ENV, Program
from model_support.sizing import Plan
from model_support.stop_signals import STOPPED_EXIT
from model_support.vocabulary import Parallelism

GiB = 2**30
NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
NEURON_TAINT = "aws.amazon.com/neuron"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
WORKDIR = "/work"
EXTRA_PACKAGES_DIR = "/work/extra-packages"
RUN_PY_KEY = "run.py"
PROGRAM_DIR = "/opt/model-support/program"
"""Where the runner finds the program ConfigMap's ``head`` and ``tail`` (run.py around its
config block); it writes run.py from them into the working directory."""
LABEL_PROGRAM = "modelsupport.dev/program"
ANNOTATION_RUN_ID = "modelsupport.dev/run-id"
DELIVERY_DEADLINE_S = 300
"""How long the runner retries a delivery (``model_support.runner_pod``'s default)."""
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

RESULT_FILE = "result.json"
TERMINATION_LOG = "/dev/termination-log"


INDUCTOR_CACHE_DIR = "/tmp/inductor-cache"
"""inductor's on-disk cache in a runner pod (TORCHINDUCTOR_CACHE_DIR): the compile cache of the
cpu and cuda profiles, on the /tmp volume the init step and the runner share."""
PULL_REPORT = f"{WORKDIR}/.model-support/compile-cache-pull.json"
"""Where the init step writes its compile cache pull report for the runner to record."""
PULL_CONTAINER = "compile-cache-pull"


@dataclass(frozen=True)
class CacheWiring:
    """The compile cache around one run: pulled by the init step, pushed by the runner."""

    source: str | None
    target: str | None
    backend: str  # run.py's backend: whose cache (NEFF or inductor) moves
    deadline_s: float
    trusted_keys: tuple[str, ...] = ()  # the pull takes only what these keys signed
    trust_unsigned: bool = False  # the source is the namespace's own cache
    signing_secret: str | None = None  # the push signs with this Secret's key (shared target)

    def pull_command(self) -> list[str]:
        """The init step's argv (no shell): a failed pull is its report's error, exit 0."""
        assert self.source is not None
        command = [
            "model-support", "cache", "pull", self.source,
            "--backend", self.backend,
            "--keep-going",
            "--report", PULL_REPORT,
            "--deadline", f"{self.deadline_s:g}",
            # Runner pods of every namespace run as one uid: "only this user can write it"
            # says nothing about who wrote a folder of the compile cache volume.
            "--shared-user",
        ]  # fmt: skip
        if self.trust_unsigned:  # the namespace's own cache: its own entries, signed or not
            return [*command, "--trust-unsigned"]
        for key in self.trusted_keys:
            command += ["--trusted-key", key]
        return command

    def runner_args(self) -> list[str]:
        """The runner's cache arguments: read the pull report, push after run.py."""
        args: list[str] = []
        if self.source is not None:
            args += ["--pull-report", PULL_REPORT, "--pull-source", self.source]
        if self.target is not None:
            args += ["--compile-cache", self.target]
        return [*args, "--cache-backend", self.backend, "--cache-deadline", f"{self.deadline_s:g}"]


NEURON_DEVICES = "/dev/neuron*"
"""The Neuron device files a runner pod on a Neuron profile must be able to open."""
DELIVERY_MOUNT = "/var/run/model-support/delivery"
"""Where a runner pod sees its attempt's delivery slot (a folder of the results volume)."""
DELIVERY_URL_ENV = "MODEL_SUPPORT_DELIVERY_URL"
"""The runner's environment variable holding its attempt's signed upload URL (from a Secret)."""
DELIVERY_SECRET_KEY = "url"
SIGNING_KEY_DIR = "/var/run/model-support/cache-signing-key"
SIGNING_KEY_ENV = "MODEL_SUPPORT_CACHE_SIGNING_KEY"
"""The runner's variable naming the key file its compile cache push signs with
(model_support.compile_cache.trust reads the same name)."""


@dataclass(frozen=True)
class DeliveryWiring:
    """How a runner pod reaches its attempt's delivery slot, and nothing else of the store:
    a folder of the results volume mounted by ``sub_path``, or a signed upload URL kept in the
    Secret ``secret_name`` (S3)."""

    slot: str
    sub_path: str | None = None
    secret_name: str | None = None

    def runner_args(self) -> list[str]:
        """The runner's delivery arguments."""
        if self.sub_path is not None:
            return ["--deliver-to", DELIVERY_MOUNT]
        return ["--deliver-url-env", DELIVERY_URL_ENV]


def runner_command(
    run_id: str,
    delivery: DeliveryWiring | None,
    cache: CacheWiring | None,
    timeout_s: int | None = None,
    neuron: bool = False,
) -> list[str]:
    """The runner container's argv: run.py through model_support.runner_pod (no shell).

    ``timeout_s`` is the test's timeout: the runner stops run.py that long after it started
    and delivers TIMEOUT (the Job's own deadline is only a backstop, see :func:`job_deadline`).
    ``neuron``: the runner first checks that the pod's user can open the node's Neuron devices.

    The runner delivers the result document to its attempt's slot (``delivery``), writes the
    termination message, then pushes the compile cache (when ``cache`` has a target) and
    delivers the document again with the cache figures beside the result.
    """
    command = ["python3", "-m", "model_support.runner_pod", "--run-id", run_id]
    command += ["--program", PROGRAM_DIR]  # run.py is written from it, checked by its sha256
    if timeout_s is not None:
        command += ["--timeout", str(timeout_s)]
    if neuron:  # the node's devices must open for the pod's user, checked before anything
        command += ["--neuron-devices", NEURON_DEVICES]
    if delivery is not None:
        command += delivery.runner_args()
    command += ["--result-file", RESULT_FILE, "--termination-log", TERMINATION_LOG]
    if cache is not None:
        command += cache.runner_args()
    return command


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
    """How many cores a test gets, the host memory for its float32 reference, and the size of
    the checkpoint it downloads (for the pod's ephemeral storage)."""

    cores: int
    parallelism: Parallelism
    host_memory_bytes: int
    checkpoint_bytes: int = 0
    pod_cores: int | None = None
    """The cores the pod holds (a placeable set, see ``HardwareProfile.pod_cores``); None: the
    same as ``cores``."""

    @property
    def held_cores(self) -> int:
        """The cores the pod requests."""
        return self.pod_cores or self.cores


def placement_for(plan: Plan, settings: OperatorSettings) -> Placement:
    """The pod-level placement of a sized plan.

    The verdict's reference pass runs in float32 on the host: 4 bytes per parameter, times
    ``host_memory_factor`` for the loaded run-dtype copy and headroom, never below the floor.
    """
    floor = int(settings.min_host_memory_gib * GiB)
    host = int(plan.parameters * 4 * settings.host_memory_factor)
    return Placement(plan.cores, plan.parallelism, max(floor, host), plan.checkpoint_bytes)


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


def claim_template_name(test: TestRef) -> str:
    """Name of a test generation's ResourceClaimTemplate (DRA): one per generation, shared by
    its attempts (each pod gets its own claim from it)."""
    return child_name(test.name, test.uid, test.generation)


def job_reference(job: dict[str, Any]) -> dict[str, Any]:
    """Owner reference to a runner Job (as the API returned it, uid included)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": False,
    }


@dataclass(frozen=True)
class RunScript:
    """How a runner pod gets its run.py: the namespace's program ConfigMap (run.py around its
    config block, shared by every test), this test's config block, and the sha256 of the
    run.py they make (the runner runs nothing else; the status records it)."""

    configmap: str
    block: str
    sha256: str


def program_configmap_name(program: Program) -> str:
    """The program ConfigMap's name: named by its content, so a new runner script is a new one."""
    return f"model-support-run-py-{program.digest[:16]}"


def build_program_configmap(namespace: str, program: Program) -> dict[str, Any]:
    """The ConfigMap holding run.py's program (its text before and after the config block), one
    per namespace and runner script. Immutable, and owned by no test: tests come and go, the
    program stays for the next (one object of a few hundred KiB, not one per test)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": program_configmap_name(program),
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROGRAM: program.digest[:16]},
        },
        "immutable": True,
        "data": dict(zip(PROGRAM_KEYS, (program.head, program.tail), strict=True)),
    }


def _is_local(uri: str) -> bool:
    return "://" not in uri


def delivery_wiring(
    store_uri: str, settings: OperatorSettings, slot: str, secret_name: str
) -> DeliveryWiring | None:
    """How a runner pod delivers for a test whose store is ``store_uri``, or None (it cannot:
    the operator then reads the log and the termination message).

    S3 stores: a signed upload URL for the slot's one key, in the Secret ``secret_name``. A
    local path: only on the shared results volume (``results_volume_claim``), whose slot folder
    the pod mounts alone. Other stores cannot hand out a write to one object.
    """
    if _is_local(store_uri):
        if settings.results_volume_claim is None or not _is_local(settings.results_uri):
            return None
        sub_path = slot_subpath(store_uri, settings.results_uri, slot)
        return None if sub_path is None else DeliveryWiring(slot, sub_path=sub_path)
    if store_uri.startswith(("s3://", "s3a://")):
        return DeliveryWiring(slot, secret_name=secret_name)
    return None


def build_delivery_secret(
    test: TestRef, name: str, attempt: int, upload_url: str
) -> dict[str, Any]:
    """The Secret holding one attempt's signed upload URL (owned by the test, so it goes
    with it); the runner container reads it as ``MODEL_SUPPORT_DELIVERY_URL``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": test.namespace,
            "labels": labels_for(test, attempt),
            "annotations": {ANNOTATION_TEST_NAME: test.name},
            "ownerReferences": [owner_reference(test)],
        },
        "type": "Opaque",
        "data": {DELIVERY_SECRET_KEY: base64.b64encode(upload_url.encode()).decode()},
    }


def _gib(n_bytes: int) -> str:
    return f"{max(1, math.ceil(n_bytes / 2**30))}Gi"


def _memory(n_bytes: int) -> str:
    """A memory quantity rounded up: whole GiB, or MiB below one GiB (a small configured floor)."""
    if n_bytes < 2**30:
        return f"{max(1, math.ceil(n_bytes / 2**20))}Mi"
    return f"{math.ceil(n_bytes / 2**30)}Gi"


def _cpu(value: float) -> str:
    return f"{max(1, math.ceil(value * 1000))}m"


def job_deadline(spec: TestSpec, settings: OperatorSettings) -> int | None:
    """The runner Job's ``activeDeadlineSeconds``: a backstop, never the model's timeout.

    Kubernetes counts it from the Job's start, so waiting for a node, pulling the image and the
    init steps count too; the runner enforces the test's timeout itself from run.py's start.
    The backstop is that timeout plus what may happen outside run.py: the queue and pull budget
    (``deadlineBudgetSeconds``), the compile cache pull and push deadlines, and the delivery.
    None (no budget configured): no Job deadline at all, the Job waits as long as it takes.
    """
    if settings.deadline_budget_s is None:
        return None
    cache = spec.compileCache
    transfers = 0.0
    if cache is not None:
        transfers += settings.compile_cache_deadline_s * (
            (cache.source is not None) + (cache.target is not None)
        )
    return math.ceil(
        spec.timeoutSeconds + settings.deadline_budget_s + transfers + DELIVERY_DEADLINE_S
    )


S3_LONGEST_URL_S = 7 * 24 * 3600
"""The longest an S3 presigned URL (signature version 4) is valid."""


def delivery_url_expiry(spec: TestSpec, settings: OperatorSettings) -> int:
    """How long an attempt's upload URL stays valid: what its Job may take (the test's timeout,
    the queue and pull budget, the compile cache transfers and the delivery) plus
    ``delivery_url_margin_s``, at most 7 days. Past it the URL writes nothing: a pod cannot
    replay its delivery into a slot after its run was recorded, and a stale slot stays gone."""
    cache = spec.compileCache
    transfers = 0.0
    if cache is not None:
        transfers = settings.compile_cache_deadline_s * (
            (cache.source is not None) + (cache.target is not None)
        )
    budget = settings.deadline_budget_s or 0.0
    needed = spec.timeoutSeconds + budget + transfers + DELIVERY_DEADLINE_S
    return min(S3_LONGEST_URL_S, math.ceil(needed + settings.delivery_url_margin_s))


CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Every container of a runner pod: non-root, no capabilities, a read-only root filesystem."""
_STEP_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "500m", "memory": "1Gi"},
    "limits": {"memory": "4Gi"},
}
"""What an init step (package install, cache pull) asks for."""
_NEURON_TOLERATION = {"key": NEURON_TAINT, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class _Storage:
    """The pod's emptyDirs, each capped: /work holds the checkpoint download (HF_HOME) and extra
    packages, /tmp and the NEFF cache the compilers' files, /dev/shm one worker per core."""

    work_bytes: int
    tmp_bytes: int
    neff_bytes: int
    shm_bytes: int

    @classmethod
    def of(cls, placement: Placement, settings: OperatorSettings) -> _Storage:
        return cls(
            work_bytes=placement.checkpoint_bytes + int(settings.work_headroom_gib * GiB),
            tmp_bytes=int(settings.tmp_size_gib * GiB),
            neff_bytes=int(settings.neff_cache_size_gib * GiB),
            shm_bytes=int(settings.shm_per_core_gib * GiB) * placement.cores,
        )


@dataclass
class _RunnerOnly:
    """What the runner container alone gets (no init step sees it): the delivery slot and the
    cache signing key, with the volumes they need."""

    mounts: list[dict[str, Any]]
    env: list[dict[str, Any]]
    volumes: list[dict[str, Any]]


def _shared_env(
    spec: TestSpec, settings: OperatorSettings, run_id: str, lnc: int | None
) -> list[dict[str, Any]]:
    """The environment of the runner and of the cache pull step."""
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HF_HOME", "value": f"{WORKDIR}/hf-home"},
        {"name": "TORCH_NEURONX_NEFF_CACHE_DIR", "value": settings.neff_cache_dir},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": INDUCTOR_CACHE_DIR},
        {"name": "MODEL_SUPPORT_RUN_ID", "value": run_id},
        # The root filesystem is read-only: every cache goes to a writable volume.
        {"name": "HOME", "value": "/tmp/home"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"},
        # Named in the runner's own errors about the node (e.g. devices it cannot open).
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if spec.hubTokenSecret is not None:
        # The token comes from the Secret at run time; it is never in the ConfigMap or the spec.
        secret = {"name": spec.hubTokenSecret.name, "key": spec.hubTokenSecret.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": secret}})
    if spec.extraPackages:
        env.append({"name": "PYTHONPATH", "value": EXTRA_PACKAGES_DIR})
    env.extend(settings.runner_env)
    if lnc is not None:
        # TorchNeuron reads only this variable (else trn2's default, 2), never the node's LNC
        # file: the runtime must run at the LNC the test was sized, selected and claimed for.
        env.append({"name": LNC_ENV, "value": str(lnc)})
    if spec.profile_info.neuron and spec.profile in hardware.INSTANCE_DEVICES:
        # The compile target the NEFF cache is kept by, whichever instance type the pod lands on.
        env.append({"name": NEURON_TARGET_ENV, "value": spec.profile})
    return env


def runner_env(job: dict[str, Any]) -> dict[str, str]:
    """The plain values of a runner Job's runner container environment (by name)."""
    containers = job["spec"]["template"]["spec"]["containers"]
    runner: dict[str, Any] = next((c for c in containers if c["name"] == RUNNER_CONTAINER), {})
    return {e["name"]: e["value"] for e in runner.get("env") or [] if "value" in e}


def run_script_sha256(job: dict[str, Any]) -> str | None:
    """The sha256 of the run.py a runner Job runs (its runner's ``MODEL_SUPPORT_RUN_SHA256``);
    None for a Job that names none (an earlier release's)."""
    return runner_env(job).get(RUN_SHA256_ENV)


def _run_script_env(run_script: RunScript) -> list[dict[str, Any]]:
    """The runner's variables naming this test's run.py: its config block and its sha256."""
    return [
        {"name": RUN_CONFIG_ENV, "value": run_script.block},
        {"name": RUN_SHA256_ENV, "value": run_script.sha256},
    ]


def _shared_mounts(settings: OperatorSettings) -> list[dict[str, Any]]:
    """The volume mounts of the runner and of the init steps."""
    mounts: list[dict[str, Any]] = [
        {"name": "work", "mountPath": WORKDIR},
        {"name": "neff-cache", "mountPath": settings.neff_cache_dir},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    return mounts


@dataclass(frozen=True)
class CacheMounts:
    """The compile cache volume as each container of a runner pod sees it: the pull step its
    source's folder read-only, the runner its push target's folder; nothing else of the volume
    (other namespaces' folders), and nothing at all for the steps that run package code."""

    pull: list[dict[str, Any]]
    runner: list[dict[str, Any]]


def _cache_mounts(test: TestRef, spec: TestSpec, settings: OperatorSettings) -> CacheMounts:
    from model_support.operator.planning import cache_root

    mounts = CacheMounts(pull=[], runner=[])
    cache = spec.compileCache
    if cache is None or not settings.compile_cache_volume_claim:
        return mounts
    volume = settings.compile_cache_volume_path.rstrip("/")
    for location, into, read_only in ((cache.source, mounts.pull, True),
                                      (cache.target, mounts.runner, False)):  # fmt: skip
        if location is None or "://" in location:
            continue
        # The folder it lies in (the operator checked it is the namespace's or a shared one).
        root = cache_root(location, settings, test.namespace)
        folder = root.root if root is not None else location
        mount: dict[str, Any] = {"name": "compile-caches", "mountPath": folder}
        if folder != volume:
            mount["subPath"] = folder[len(volume) :].strip("/")
        if read_only:
            mount["readOnly"] = True
        into.append(mount)
    return mounts


def _cache_wiring(test: TestRef, spec: TestSpec, settings: OperatorSettings) -> CacheWiring | None:
    """How the pod pulls and pushes the test's compile cache (None: it has none)."""
    cache = spec.compileCache
    if cache is None:
        return None
    from model_support.operator.planning import own_cache, push_target

    pushing = push_target(cache.target, settings, test.namespace) if cache.target else None
    # A namespace's own cache is its own only where the storage keeps others out; elsewhere
    # (and for any other source) only what the trusted keys signed is taken.
    own_and_isolated = (
        cache.source is not None
        and settings.compile_cache_namespaces_isolated
        and own_cache(cache.source, settings, test.namespace)
    )
    return CacheWiring(
        cache.source,
        cache.target,
        spec.profile_info.backend.value,
        settings.compile_cache_deadline_s,
        trusted_keys=() if own_and_isolated else tuple(settings.compile_cache_trusted_keys),
        trust_unsigned=own_and_isolated,
        signing_secret=settings.compile_cache_signing_secret
        if pushing is not None and pushing.shared
        else None,
    )


def _runner_only(wiring: CacheWiring | None, delivery: DeliveryWiring | None) -> _RunnerOnly:
    part = _RunnerOnly(mounts=[], env=[], volumes=[])
    if wiring is not None and wiring.signing_secret is not None:
        # The key a trusted test's push signs with (a shared target's readers check it).
        part.mounts.append(
            {"name": "cache-signing-key", "mountPath": SIGNING_KEY_DIR, "readOnly": True}
        )
        part.env.append({"name": SIGNING_KEY_ENV, "value": f"{SIGNING_KEY_DIR}/key"})
        part.volumes.append(
            {
                "name": "cache-signing-key",
                "secret": {"secretName": wiring.signing_secret, "defaultMode": 0o440},
            }
        )
    if delivery is not None and delivery.sub_path is not None:
        # Only this attempt's folder of the results volume, never the store.
        part.mounts.append(
            {"name": "results", "mountPath": DELIVERY_MOUNT, "subPath": delivery.sub_path}
        )
    elif delivery is not None and delivery.secret_name is not None:
        # optional: when the operator could not sign a URL the pod still runs, and the
        # operator reads its log and termination message instead.
        url = {"name": delivery.secret_name, "key": DELIVERY_SECRET_KEY, "optional": True}
        part.env.append({"name": DELIVERY_URL_ENV, "valueFrom": {"secretKeyRef": url}})
    return part


def as_pod_step(command: list[str]) -> list[str]:
    """An init step's argv, run through ``model_support.pod_step``: as the container's PID 1 a
    program without a SIGTERM handler would ignore the pod's stop signal and be killed after
    the grace period (137); the wrapper stops it and exits 143, which the Job ignores."""
    return ["python3", "-m", "model_support.pod_step", "--", *command]


def _init_containers(
    spec: TestSpec,
    settings: OperatorSettings,
    wiring: CacheWiring | None,
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    cache_mounts: CacheMounts,
) -> list[dict[str, Any]]:
    """The steps before the runner: the cache pull first, then the extra packages' install
    (which runs package code: it gets no compile cache at all)."""
    image = spec.image or settings.runner_image
    pull_policy = spec.imagePullPolicy or settings.image_pull_policy
    step_mounts = list(mounts)
    pull_mounts = step_mounts + cache_mounts.pull
    steps: list[dict[str, Any]] = []
    if wiring is not None and wiring.source is not None:
        # The pull writes only the cache and its report, and a failed pull is the report's
        # error (exit 0), so the test runs without the cache.
        steps.append(
            {
                "name": PULL_CONTAINER,
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": as_pod_step(wiring.pull_command()),
                "workingDir": WORKDIR,
                # The runner's env: the same cache folders, store endpoint and credentials.
                "env": [e for e in env if e["name"] != "PYTHONPATH"],
                **({"envFrom": list(settings.runner_env_from)} if settings.runner_env_from else {}),
                "securityContext": copy.deepcopy(CONTAINER_SECURITY),
                "volumeMounts": pull_mounts,
                "resources": copy.deepcopy(_STEP_RESOURCES),
            }
        )
    if spec.extraPackages:
        steps.append(
            {
                "name": "extra-packages",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": as_pod_step(
                    [
                        "python3",
                        "-m",
                        "pip",
                        "install",
                        "--no-cache-dir",
                        "--disable-pip-version-check",
                        "--target",
                        EXTRA_PACKAGES_DIR,
                        *spec.pip.args(),
                        *spec.extraPackages,
                    ]
                ),
                "securityContext": copy.deepcopy(CONTAINER_SECURITY),
                "volumeMounts": step_mounts,
                "resources": copy.deepcopy(_STEP_RESOURCES),
            }
        )
    return steps


def _resources(
    spec: TestSpec,
    placement: Placement,
    settings: OperatorSettings,
    storage: _Storage,
    dra: NeuronDraSettings | None,
) -> dict[str, Any]:
    """The runner's requests and limits: CPU per core, host memory (with /dev/shm, which is
    memory), the emptyDirs' sum, and the NeuronCores (or the DRA claim)."""
    memory = _memory(placement.host_memory_bytes + storage.shm_bytes)
    storage_bytes = storage.work_bytes + storage.tmp_bytes + storage.neff_bytes
    resources: dict[str, Any] = {
        "requests": {
            "cpu": _cpu(placement.cores * settings.cpu_per_core),
            "memory": memory,
            "ephemeral-storage": _gib(storage_bytes),
        },
        "limits": {"memory": memory},
    }
    if dra is not None:
        # Whole devices through the DRA driver's claim (its template sets the LNC).
        resources["claims"] = container_claims()
    elif spec.profile_info.neuron:
        # Extended resources need requests == limits; the device plugin sets NEURON_RT_VISIBLE_CORES.
        # The pod holds a placeable set (whole devices beyond one); run.py uses its cores.
        resources["requests"][NEURONCORE_RESOURCE] = str(placement.held_cores)
        resources["limits"][NEURONCORE_RESOURCE] = str(placement.held_cores)
    return resources


def _volumes(
    configmap_name: str,
    storage: _Storage,
    settings: OperatorSettings,
    cache_mounts: CacheMounts,
    runner_only: _RunnerOnly,
) -> list[dict[str, Any]]:
    """The pod's volumes: the capped emptyDirs, run.py's program ConfigMap, and the claims and
    Secrets the mounts name."""
    volumes: list[dict[str, Any]] = [
        {"name": "work", "emptyDir": {"sizeLimit": _gib(storage.work_bytes)}},
        {
            "name": "run-script",
            "configMap": {
                "name": configmap_name,
                "items": [{"key": key, "path": key} for key in PROGRAM_KEYS],
            },
        },
        {"name": "neff-cache", "emptyDir": {"sizeLimit": _gib(storage.neff_bytes)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": _gib(storage.tmp_bytes)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _gib(storage.shm_bytes)}},
    ]
    if any(m["name"] == "results" for m in runner_only.mounts):
        claim = {"claimName": settings.results_volume_claim}
        volumes.append({"name": "results", "persistentVolumeClaim": claim})
    volumes.extend(runner_only.volumes)
    if cache_mounts.pull or cache_mounts.runner:
        claim = {"claimName": settings.compile_cache_volume_claim}
        volumes.append({"name": "compile-caches", "persistentVolumeClaim": claim})
    return volumes


def _scheduling(
    spec: TestSpec,
    placement: Placement,
    settings: OperatorSettings,
    lnc: int | None,
    dra: NeuronDraSettings | None,
) -> dict[str, Any]:
    """Where the pod may run: the pod spec's nodeSelector, tolerations, schedulerName and
    priorityClassName (only those that are set)."""
    profile = spec.profile_info
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = [dict(_NEURON_TOLERATION)] if profile.neuron else []
    affinity: dict[str, Any] | None = None
    types = instance_types(spec, placement, lnc)
    if len(types) == 1:
        node_selector[INSTANCE_TYPE_LABEL] = types[0]
    elif types:
        # Any of the profile's instance types whose devices hold the pod (trn2.3xlarge for one
        # device, trn2.48xlarge or an UltraServer's trn2u/trn2p/trn2eu for more).
        term = {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types}
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    if (
        profile.name in hardware.LNC_CHOICES
        and settings.lnc_node_label
        and dra is None
        and lnc is not None
    ):
        # The devices' LNC is a node setting: select nodes configured with the LNC this test
        # was sized for (the same one its runtime is given).
        node_selector[settings.lnc_node_label] = str(lnc)
    node_selector.update(spec.scheduling.nodeSelector)
    tolerations.extend(t.model_dump(exclude_none=True) for t in spec.scheduling.tolerations)
    scheduler = spec.scheduling.schedulerName
    if scheduler is None and profile.neuron and placement.held_cores > 1 and dra is None:
        # More than one core must be connected cores: the Neuron scheduler extension's job
        # (under DRA the claim's connected-group constraint is).
        scheduler = settings.scheduler_name
    fields: dict[str, Any] = {}
    if node_selector:
        fields["nodeSelector"] = node_selector
    if affinity:
        fields["affinity"] = affinity
    if tolerations:
        fields["tolerations"] = tolerations
    if scheduler:
        fields["schedulerName"] = scheduler
    if spec.scheduling.priorityClassName:
        fields["priorityClassName"] = spec.scheduling.priorityClassName
    return fields


def instance_types(spec: TestSpec, placement: Placement, lnc: int | None) -> list[str]:
    """The instance types a test's pod may run on: its spec.instanceType, else those of its
    profile whose devices hold the pod's cores (hardware.INSTANCE_DEVICES), else the profile's
    own type; empty for a profile without one (cpu)."""
    profile = spec.profile_info
    if spec.instanceType:
        return [spec.instanceType]
    if profile.neuron and spec.profile in hardware.INSTANCE_DEVICES:
        per_device = hardware.get_profile(spec.profile, lnc).cores_per_device
        devices = -(-placement.held_cores // per_device)
        return hardware.instance_types_holding(spec.profile, devices)
    return [profile.instance_type] if profile.instance_type else []


def _pod_security(settings: OperatorSettings) -> dict[str, Any]:
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if settings.runner_supplemental_groups:
        # e.g. the group owning /dev/neuron* on nodes that keep the devices root-owned.
        security["supplementalGroups"] = list(settings.runner_supplemental_groups)
    return security


POD_FAILURE_POLICY: dict[str, Any] = {
    "rules": [
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        {
            "action": "Ignore",
            "onExitCodes": {"operator": "In", "values": [STOPPED_EXIT]},
        },
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": RUNNER_CONTAINER,
                "operator": "NotIn",
                "values": [0],
            },
        },
    ]
}
"""How the Job controller treats a failed runner pod (kubernetes pkg/controller/job/
pod_failure_policy.go: rules in order, the first match decides, a rule without containerName
looks at every container, init containers included; no match counts against backoffLimit):

1. a pod with a DisruptionTarget condition (eviction, preemption by the scheduler, a drained or
   lost node, node pressure) is ignored and replaced;
2. a container asked to stop exits 143 (``STOPPED_EXIT``): the runner and the init steps (run
   through ``model_support.pod_step``) alone use it, so it is ignored whichever container it
   was. Kueue preempts by suspending the Job, and the Job controller deletes its pods without
   that condition; a pod deleted by hand has none either;
3. the runner's own non-zero exit is the run's outcome: it fails the Job at once.

Everything else happened before the runner started and is not the model's doing: a pod the
kubelet refused at admission (``UnexpectedAdmissionError``, ``OutOf<resource>``: no condition,
no exit code), a pod deleted while its image pulled (no exit code), an init step that failed or
was killed. No rule matches those, so they count against ``BACKOFF_LIMIT`` and the Job starts
the pod again; a Job past it fails and the operator reads why. A suspended Job's pods are never
counted (the Job controller drops their tracking finalizer before deleting them)."""

BACKOFF_LIMIT = 3
"""Pod failures before the runner started that a runner Job absorbs (the Job controller
starts the pod again after 10 s, 20 s, 40 s): enough for a flaky package index or a refused
admission, few enough that a broken extra package ends the test within minutes."""


def build_job(
    test: TestRef,
    spec: TestSpec,
    placement: Placement,
    *,
    job_name: str,
    run_script: RunScript,
    attempt: int,
    run_id: str,
    settings: OperatorSettings,
    delivery: DeliveryWiring | None = None,
) -> dict[str, Any]:
    """The runner Job: ``python3 run.py``, written by the runner from the program ConfigMap and
    the test's config block (``run_script``), sized and placed for the profile.

    ``delivery`` is how the runner reaches its attempt's delivery slot (None: it cannot; the
    operator then reads the log and the termination message).
    """
    profile = spec.profile_info
    labels = labels_for(test, attempt)
    lnc = runtime_lnc(spec, settings)
    dra = dra_settings(spec, settings) if profile.neuron else None
    storage = _Storage.of(placement, settings)
    env = _shared_env(spec, settings, run_id, lnc)
    mounts = _shared_mounts(settings)
    cache_mounts = _cache_mounts(test, spec, settings)
    wiring = _cache_wiring(test, spec, settings)
    runner_only = _runner_only(wiring, delivery)
    runner_only.mounts.extend(cache_mounts.runner)
    runner: dict[str, Any] = {
        "name": RUNNER_CONTAINER,
        "image": spec.image or settings.runner_image,
        "imagePullPolicy": spec.imagePullPolicy or settings.image_pull_policy,
        "command": runner_command(
            run_id, delivery, wiring, spec.timeoutSeconds, neuron=profile.neuron
        ),
        "workingDir": WORKDIR,
        "env": env + runner_only.env + _run_script_env(run_script),
        "resources": _resources(spec, placement, settings, storage, dra),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            *mounts,
            {"name": "run-script", "mountPath": PROGRAM_DIR, "readOnly": True},
            *runner_only.mounts,
        ],
    }
    if settings.runner_env_from:
        runner["envFrom"] = list(settings.runner_env_from)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(settings),
        "containers": [runner],
        "volumes": _volumes(run_script.configmap, storage, settings, cache_mounts, runner_only),
    }
    if dra is not None:
        pod_spec["resourceClaims"] = pod_claims(claim_template_name(test))
    init_containers = _init_containers(spec, settings, wiring, env, mounts, cache_mounts)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec.update(_scheduling(spec, placement, settings, lnc, dra))
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account

    job_labels = dict(labels)
    if spec.queueName:
        job_labels[LABEL_KUEUE_QUEUE] = spec.queueName
    job_spec: dict[str, Any] = {
        "backoffLimit": BACKOFF_LIMIT,
        "podFailurePolicy": copy.deepcopy(POD_FAILURE_POLICY),
        # A replacement waits until its predecessor has ended: it needs the same NeuronCores.
        "podReplacementPolicy": "Failed",
        "template": {
            "metadata": {
                "labels": labels,
                "annotations": {
                    ANNOTATION_TEST_NAME: test.name,
                    # Karpenter must not consolidate the node under a running test.
                    ANNOTATION_DO_NOT_DISRUPT: "true",
                },
            },
            "spec": pod_spec,
        },
    }
    deadline = job_deadline(spec, settings)
    if deadline is not None:
        job_spec["activeDeadlineSeconds"] = deadline
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
            "annotations": {
                ANNOTATION_RUN_ID: run_id,
                ANNOTATION_TEST_NAME: test.name,
                ANNOTATION_TIMEOUT: str(spec.timeoutSeconds),
            },
            "ownerReferences": [owner_reference(test)],
        },
        "spec": job_spec,
    }
