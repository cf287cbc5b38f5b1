"""Operator settings: defaults for every test, limits of the infrastructure classification.

The Helm chart hands them to the operator as one JSON object (env ``MODEL_SUPPORT_SETTINGS``)
with camelCase keys: a field ``unschedulable_limit_s`` is ``unschedulableLimitSeconds``,
``min_host_memory_gib`` is ``minHostMemoryGiB``. The chart's ``settings:`` value holds any of
them; a few have chart values of their own (see :func:`settings_from_values`, which the chart's
template mirrors and a test keeps in step). Unknown keys are refused, naming the key.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from model_support.pricing import DEFAULT_PRICES, PriceTable, prices_from_mapping


def chart_key(field: str) -> str:
    """The camelCase key of a settings field in the chart (``_s`` = Seconds, ``_gib`` = GiB)."""
    if field.endswith("_s"):
        return to_camel(field[:-2]) + "Seconds"
    if field.endswith("_gib"):
        return to_camel(field[:-4]) + "GiB"
    return to_camel(field)


DEFAULT_RUNNER_IMAGE = "public.ecr.aws/model-support/runner:0.1.0"
"""The chart's runnerImage default (values.yaml), so the CLI renders what the chart deploys."""


class RunnerStack(BaseModel):
    """The compiler and library versions a runner image carries (chart value ``runnerStack``).

    They name the (compiler, library) pair, so the results file, of every test that runs on
    the configured runner image: a pod's own report of them is its claim, checked against
    these. A field left None is not declared: the pod's report of it is recorded as is.
    """

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    neuronx_cc: str | None = Field(None, min_length=1, description="neuronx-cc's version.")
    torch: str | None = Field(None, min_length=1, description="PyTorch's version.")
    transformers: str | None = Field(None, min_length=1, description="transformers' version.")


DEFAULT_RUNNER_STACK = RunnerStack(neuronx_cc="2.28.7631.0", torch="2.14.0", transformers="5.24.0")
"""What images/runner/Dockerfile's default build pins for certain: its base's Neuron SDK 2.33.0
row of docs/neuron-releases.md (neuronx-cc 2.28.7631.0, torch 2.14.0; the base recipe installs
exactly these, a test keeps them equal) and its TRANSFORMERS_VERSION: the versions that name a
Trainium row's results file. A pod reporting another is recorded ERROR infrastructure."""


class NeuronDraSettings(BaseModel):
    """The Neuron DRA driver's names (chart values ``neuron.dra.*``; docs/trainium.md).

    Defaults are what the AWS Neuron DRA documentation gives; they are settings so that a
    renamed class or a new config version needs no operator release.
    """

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    device_class_name: str = Field("neuron.aws.com", min_length=1)
    driver: str = Field(
        "neuron.aws.com", min_length=1, description="Driver the opaque NeuronConfig is for."
    )
    config_api_version: str = Field("neuron.aws.com/v1", min_length=1)
    config_kind: str = Field("NeuronConfig", min_length=1)
    default_lnc: Literal[1, 2] | None = Field(
        2,
        description="LNC of claims for tests that name no spec.lnc (trn2's default); None = such tests are refused.",
    )
    driver_version: str | None = Field(
        None,
        min_length=1,
        description="Claim only devices whose Neuron driver is this version (the device attribute neuronDriverVersion, as AWS's example claims select it); None = any.",
    )
    device_attribute_domain: str = Field(
        "neuron.aws.com",
        min_length=1,
        description="Domain of the driver's device attributes (instanceType, neuronDriverVersion) in claim selectors.",
    )

    @field_validator("driver_version", mode="before")
    @classmethod
    def _empty_is_any(cls, value: object) -> object:
        return None if value == "" else value


class OperatorSettings(BaseModel):
    """Everything the operator needs besides the resources it watches."""

    model_config = ConfigDict(extra="forbid", alias_generator=chart_key, populate_by_name=True)

    results_uri: str = Field(
        ...,
        min_length=1,
        description="Default results store URI (a spec's `results` overrides it).",
    )
    runner_image: str = Field(
        DEFAULT_RUNNER_IMAGE,
        description="Runner image used when a spec names none.",
    )
    runner_stack: RunnerStack | None = Field(
        None,
        description="The compiler and library versions runnerImage carries; None = the default image's pins (images/runner/Dockerfile) when runnerImage is the default, else not declared.",
    )
    image_pull_policy: str = "IfNotPresent"
    api_server: str | None = Field(
        None, description="Kubernetes API URL; None = in-cluster service account, else kubeconfig."
    )
    ttl_seconds_after_finished: int = Field(
        3600,
        ge=0,
        description="A runner Job (its pods, logs) is kept this long after its result is recorded; never deleted before.",
    )
    results_volume_claim: str | None = Field(
        None,
        description="PVC holding a local-path results store; mounted into runner pods so they deliver there.",
    )
    delivery_url_margin_s: int = Field(
        3600,
        ge=60,
        le=7 * 24 * 3600,  # the longest an S3 SigV4 signature lasts
        description="The upload URL a runner pod gets for its delivery slot (S3 stores) stays valid for what its Job may take (the test's timeout, deadlineBudgetSeconds, the compile cache and delivery deadlines) plus this margin, 7 days at most; it also ends when the operator's own credentials expire. A pod that waited longer before it ran cannot deliver: its result is read from its log and termination message.",
    )
    runner_env: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra env of runner containers (Kubernetes EnvVar objects), e.g. the store's endpoint.",
    )
    runner_env_from: list[dict[str, Any]] = Field(
        default_factory=list, description="envFrom of runner containers (EnvFromSource objects)."
    )
    result_unavailable_limit_s: float = Field(
        3600.0,
        gt=0,
        description="A finished Job whose result document cannot be read is retried this long, then recorded ERROR/infrastructure.",
    )
    retry_cap_s: float = Field(
        600.0, gt=0, description="Longest wait between retries of a failing store write."
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="Runner Jobs per generation when a pod fails for the cluster's reasons without a DisruptionTarget condition (node lost, stopped from outside). Disruptions with it are retried by the Job itself.",
    )
    unschedulable_limit_s: float | None = Field(
        None,
        gt=0,
        description="A runner pod unschedulable this long ends the test ERROR/infrastructure; None (default) = wait for capacity as long as it takes, phase Queued.",
    )
    image_pull_limit_s: float = Field(
        600.0,
        gt=0,
        description="A runner pod failing to pull its image this long after it was scheduled ends the test ERROR/infrastructure.",
    )
    deadline_budget_s: float | None = Field(
        3600.0,
        ge=0,
        description="Time a runner Job may spend outside run.py (waiting for a node or for Kueue, image pull, init steps) before its backstop deadline (activeDeadlineSeconds = timeoutSeconds + this + the compile cache and delivery deadlines). The test's own timeout is enforced by the runner from run.py's start. A Job that reaches the backstop before run.py ran its timeout (waiting, a pod replaced late) is no verdict: the next attempt runs in a new Job. None = no Job deadline: wait as long as it takes.",
    )
    running_write_delay_s: float = Field(
        2.0,
        ge=0,
        description="A ready runner pod's Running phase is written this long after it became ready, unless the run ended meanwhile (then one write says Completed): one status write less for runs that end at once. 0 = at once.",
    )
    kueue_admission_limit_s: float = Field(
        600.0,
        gt=0,
        description="A test whose Job Kueue has not admitted this long gets condition Queued=True, reason NotAdmitted, and a Warning Event NotAdmitted (is Kueue installed, does the LocalQueue exist?); it keeps waiting.",
    )
    cache_audit_s: float = Field(
        600.0,
        gt=0,
        description="The tests and sweeps the operator keeps in memory are compared with the API this often (and after every relist of its watches, which brings no event for what was deleted meanwhile); what no longer exists is dropped.",
    )
    watchdog_interval_s: float = Field(
        30.0, gt=0, description="How often stuck runner pods are looked for."
    )
    cpu_per_core: float = Field(
        2.0,
        gt=0,
        description="CPU request per NeuronCore (trn2.48xlarge: 192 vCPU / 64 cores = 3).",
    )
    min_host_memory_gib: float = Field(
        16.0, gt=0, description="Smallest host memory request of a runner pod."
    )
    host_memory_factor: float = Field(
        1.75,
        gt=0,
        description="Host memory per byte of float32 parameters: the CPU reference runs in float32, plus the loaded run-dtype copy and headroom.",
    )
    neff_cache_dir: str = "/var/cache/neff"
    compile_cache_volume_claim: str | None = Field(
        None,
        description="PVC holding compile caches named by absolute paths in spec.compileCache; mounted at compileCacheVolumePath in runner pods.",
    )
    compile_cache_volume_path: str = Field(
        "/var/cache/model-support/compile-caches",
        pattern=r"^/.+",
        description="Where the compile cache PVC is mounted; a spec's compileCache paths must lie under it.",
    )
    model_volume_paths: list[str] = Field(
        default_factory=list,
        description="Where checkpoints named by an absolute spec.model live (volumes the operator mounts at the same paths as the runner image or pods see them). An absolute spec.model elsewhere is refused: the operator would size it from its own filesystem.",
    )
    compile_cache_push_targets: list[str] = Field(
        default_factory=list,
        description="Where tests may push compile caches (roots; `{namespace}` is the test's namespace). Empty: the namespace's own folder on the compile cache volume, <compileCacheVolumePath>/{namespace}, when there is a volume; else nowhere. Tests that run code the project does not control never push.",
    )
    compile_cache_shared_pushers: list[str] = Field(
        default_factory=list,
        description="Namespaces whose tests may push to push targets shared by every namespace (those without `{namespace}`). Anyone who can create a pod there can push what every reader runs: keep them for trusted tests only.",
    )
    compile_cache_namespaces_isolated: bool = Field(
        False,
        description="The storage of the `{namespace}` push targets lets each namespace write its own folder or prefix only (a PVC per namespace, an IAM role per namespace's S3 prefix), so a namespace's own cache holds only what its own tests wrote: it is then pulled unsigned. Off (the default: runner pods of every namespace share one uid, and one claim name or bucket may reach one store), a namespace's own cache is pulled like any other: only entries signed by compileCacheTrustedKeys, and a test pulling it needs some.",
    )
    compile_cache_trusted_keys: list[str] = Field(
        default_factory=list,
        description="Public keys (ed25519:<base64>) whose signed manifests compile cache pulls trust; with any, pulls take only signed entries.",
    )
    compile_cache_signing_secret: str | None = Field(
        None,
        description="Secret (key `key`, an Ed25519 PEM private key) in each shared pusher namespace: runner pods of tests pushing to a shared target sign with it.",
    )
    compile_cache_deadline_s: float = Field(
        1800.0,
        ge=1,  # `model-support cache pull --deadline` takes no less
        description="How long a runner pod's compile cache pull (init step) or push (after run.py) may take before it is given up and recorded as the cache's error.",
    )
    shm_per_core_gib: float = Field(
        1.0,
        gt=0,
        description="/dev/shm (a memory-backed emptyDir) per worker; run.py starts one worker per core. Counted in the memory request.",
    )
    work_headroom_gib: float = Field(
        4.0,
        ge=0,
        description="Scratch space of /work beyond the checkpoint download (HF_HOME lives there).",
    )
    tmp_size_gib: float = Field(
        10.0, gt=0, description="sizeLimit of /tmp (compiler and inductor scratch)."
    )
    neff_cache_size_gib: float = Field(
        20.0, gt=0, description="sizeLimit of the local NEFF compile cache."
    )
    scheduler_name: str | None = Field(
        None,
        description="Scheduler of runner pods on more than one NeuronCore (the Neuron scheduler extension places connected cores); a test's scheduling.schedulerName wins.",
    )
    lnc_node_label: str | None = Field(
        None,
        description="Node label holding a trn2 node's logical NeuronCore config (LNC); runner pods select nodes with the LNC they were sized for. Without it a test cannot ask for an LNC.",
    )
    runner_default_lnc: Literal[1, 2] | None = Field(
        2,
        description="The LNC the cluster's trn2/trn3 nodes run at, where no lncNodeLabel says it per node (device plugin): tests that name no spec.lnc are sized and run at it. AWS's EKS guide: trn2 node groups run at LNC 2 unless their launch template sets 1. None = such tests are refused.",
    )
    neuron_dra: NeuronDraSettings | None = Field(
        None,
        description="Request trn2 NeuronCores through the Neuron DRA driver (a ResourceClaimTemplate per test, LNC set per claim) instead of the device plugin; None = device plugin.",
    )
    log_tail_lines: int = Field(
        400, ge=10, description="Lines of the runner's log read for the result line."
    )
    log_tail_bytes: int = Field(
        8 * 2**20,
        ge=64 * 2**10,
        description="At most this many bytes of those lines are read (the first of them: a runner pod decides how long its lines are); a result line cut off is read from the termination message instead.",
    )
    runner_supplemental_groups: list[int] = Field(
        default_factory=list,
        description="Supplemental groups of runner pods, e.g. the group owning /dev/neuron* on nodes (Bottlerocket, hardened AMIs) whose devices are not given to the pod's user by the container runtime.",
    )
    service_account: str | None = Field(
        None, description="ServiceAccount of runner pods (no API access needed)."
    )
    read_token_secrets: bool = Field(
        False,
        description="Read a spec's hubTokenSecret (only Secrets labelled modelsupport.dev/hub-token=true) to size gated models; needs `get secrets`.",
    )
    allowed_results_prefixes: list[str] = Field(
        default_factory=list,
        description="Store URIs a test's spec.results may point under; empty = only results_uri.",
    )
    sizing_max_retries: int = Field(
        12,
        ge=0,
        description="Transient sizing failures (Hub 5xx, timeouts) are retried this often, with backoff capped at retry_cap_s, then recorded ERROR/infrastructure.",
    )
    sizing_retry_base_s: float = Field(
        15.0, gt=0, description="First delay of the sizing retries (doubled each time)."
    )
    hub_endpoint: str | None = Field(
        None,
        description="Hugging Face Hub endpoint for sizing; None = HF_ENDPOINT, else huggingface.co.",
    )
    request_timeout_s: float = Field(
        30.0, gt=0, description="Deadline of every API request the operator makes."
    )
    watch_timeout_s: float = Field(
        300.0, gt=0, description="A watch stream is renewed after this long."
    )
    list_page_size: int = Field(
        500, ge=1, description="Objects per page of every list call (paginated with continue)."
    )
    sweep_status_interval_s: float = Field(
        2.0,
        gt=0,
        description="A sweep's status is written at most this often (counts change with every test); a change of its conditions is written at once.",
    )
    sweep_min_refresh_s: float = Field(
        300.0,
        gt=0,
        description="Shortest interval between two rankings of one sweep, whatever its refreshSeconds says (the Hub is shared).",
    )
    sweep_resync_s: float = Field(
        300.0,
        gt=0,
        description="A sweep with work left lists its tests from the API this often (the watch keeps them current in between).",
    )
    leader_election: bool = Field(
        True,
        description="Act only while holding a coordination.k8s.io Lease, so that two replicas (or the old and new pod of a rolling update) never both act; the others watch and wait.",
    )
    lease_name: str = Field("model-support-operator", min_length=1)
    lease_namespace: str | None = Field(
        None, description="Namespace of the Lease; None = the operator's own (POD_NAMESPACE)."
    )
    lease_duration_s: float = Field(
        30.0, gt=0, description="A Lease not renewed this long may be taken over."
    )
    lease_renew_deadline_s: float = Field(
        20.0,
        gt=0,
        description="The leader stops acting this long after the start of its last successful renewal, timed by the clock whatever call is in flight (less than the lease duration, more than 1.2 x the retry period; each Lease call times out after a quarter of it).",
    )
    lease_retry_s: float = Field(
        5.0, gt=0, description="How often the Lease is renewed, or tried by a waiting replica."
    )
    namespaces: list[str] = Field(default_factory=list)
    all_namespaces: bool = False
    metrics_port: int | None = Field(
        9090, description="Prometheus /metrics port; None = no metrics server."
    )
    instance_prices: dict[str, Any] | None = Field(
        None,
        description="Instance prices over the default table (docs/pricing.md: region, "
        "default_instance_type, prices); tests' and sweeps' costs use them.",
    )
    notify_format: Literal["slack", "github"] = Field(
        "slack",
        description="The shape of what the notification webhook (its URL from the Secret the "
        'chart\'s notifications.webhookSecret names) is sent: slack ({"text"}) or github (an '
        'issue: {"title", "body"}).',
    )
    notify_attempts: int = Field(
        5, ge=1, le=20, description="Tries of one notification before it is given up (logged)."
    )

    @field_validator("runner_env")
    @classmethod
    def _runner_env_leaves_lnc(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The operator sets it per test, to the LNC the test was sized and placed for; a
        # chart-wide value would run the runtime at another LNC than the cores counted.
        if any(isinstance(e, dict) and e.get("name") == "NEURON_LOGICAL_NC_CONFIG" for e in value):
            raise ValueError(
                "runner.env (runnerEnv) sets NEURON_LOGICAL_NC_CONFIG, which the operator sets on each "
                "runner from the LNC the test was sized for: remove it and set the LNC with "
                "spec.lnc, neuron.dra.defaultLnc or the nodes' LNC label"
            )
        return value

    @field_validator("instance_prices")
    @classmethod
    def _prices_parse(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            prices_from_mapping(value, "settings.instancePrices")  # raises, naming the field
        return value

    @model_validator(mode="after")
    def _lease_timings(self) -> OperatorSettings:
        if self.leader_election:
            from model_support.operator.leader import check_timings

            try:
                check_timings(
                    self.lease_duration_s, self.lease_renew_deadline_s, self.lease_retry_s
                )
            except ValueError as exc:  # said with the settings' names
                raise ValueError(
                    f"leaseDurationSeconds / leaseRenewDeadlineSeconds / leaseRetrySeconds: {exc}"
                ) from exc
        return self

    def prices(self) -> PriceTable:
        """The price table: the default one with ``instance_prices`` over it."""
        if self.instance_prices is None:
            return DEFAULT_PRICES
        return prices_from_mapping(self.instance_prices, "settings.instancePrices")

    def declared_runner_stack(self) -> RunnerStack:
        """The stack ``runner_image`` carries: ``runner_stack``, else the default image's pins
        when it is the default image (another image's versions are not known here)."""
        if self.runner_stack is not None:
            return self.runner_stack
        return DEFAULT_RUNNER_STACK if self.runner_image == DEFAULT_RUNNER_IMAGE else RunnerStack()


SETTINGS_ENV = "MODEL_SUPPORT_SETTINGS"
"""The environment variable the chart passes the settings in (one JSON object)."""


def settings_from_json(text: str, **overrides: Any) -> OperatorSettings:
    """Settings from the chart's JSON object (camelCase keys), with ``overrides`` (by field
    name) on top."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{SETTINGS_ENV} is not a JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{SETTINGS_ENV} must be a JSON object, not {type(data).__name__}")
    return OperatorSettings.model_validate(
        {**data, **{chart_key(key): value for key, value in overrides.items()}}
    )


class _ValuesBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _VolumeValues(_ValuesBlock):
    enabled: bool = False
    claimName: str | None = None


class _RunnerValues(_ValuesBlock):
    schedulerName: str | None = None
    lncNodeLabel: str | None = None
    defaultLnc: Literal[1, 2] | None = None
    serviceAccountName: str | None = None
    env: list[dict[str, Any]] | None = None
    envFrom: list[dict[str, Any]] | None = None


class _NeuronValues(_ValuesBlock):
    dra: dict[str, Any] | None = None


class _MetricsValues(_ValuesBlock):
    enabled: bool = True
    port: int = 9090


class _NotificationValues(_ValuesBlock):
    format: Literal["slack", "github"] = "slack"
    attempts: int = 5


class ChartValues(_ValuesBlock):
    """The chart values the operator's settings are made from, with their types (a value of
    the wrong type is refused naming it; values the operator does not read are left alone)."""

    results: str | None = None
    watchNamespaces: list[str] | None = None
    watchAllNamespaces: bool = False
    resultsVolume: _VolumeValues | None = None
    readHubTokenSecrets: bool = False
    runnerImage: str | None = None
    runnerStack: dict[str, str | None] | None = None
    allowedResultsPrefixes: list[str] | None = None
    runner: _RunnerValues | None = None
    neuron: _NeuronValues | None = None
    metrics: _MetricsValues | None = None
    notifications: _NotificationValues | None = None
    settings: dict[str, Any] | None = None


def settings_from_values(values: dict[str, Any]) -> OperatorSettings:
    """The operator's settings for Helm values (only what differs from values.yaml is needed).

    Mirrors the chart's ``model-support.settings`` template: top-level chart values first,
    then the ``settings:`` block (camelCase keys) over them. Raises pydantic's
    ValidationError naming a value of the wrong type.
    """
    ChartValues.model_validate(values)  # the types of what is read below
    results = values.get("results")
    if not results:
        raise ValueError(
            "the chart value `results` is required: where run records go, e.g. "
            "--set results=s3://my-bucket/model-support"
        )
    namespaces = list(values.get("watchNamespaces") or [])
    every = bool(values.get("watchAllNamespaces", False))
    if namespaces and every:
        raise ValueError("give watchNamespaces or watchAllNamespaces=true, not both")
    if not namespaces and not every:
        raise ValueError(
            "the chart value watchNamespaces is required: list the namespaces where tests run "
            "(the operator gets its rights, and runner pods their NetworkPolicy, only there), "
            "e.g. --set 'watchNamespaces={ml}'; to watch every namespace, kube-system included, "
            "set watchAllNamespaces=true explicitly"
        )
    volume = values.get("resultsVolume") or {}
    base: dict[str, Any] = {
        "resultsUri": results,
        "namespaces": namespaces,
        "allNamespaces": every,
        "readTokenSecrets": bool(values.get("readHubTokenSecrets", False)),
    }
    if values.get("runnerImage"):
        base["runnerImage"] = values["runnerImage"]
    if values.get("runnerStack"):
        base["runnerStack"] = values["runnerStack"]
    if volume.get("enabled"):
        base["resultsVolumeClaim"] = volume.get("claimName")
    if values.get("allowedResultsPrefixes"):
        base["allowedResultsPrefixes"] = list(values["allowedResultsPrefixes"])
    runner = values.get("runner") or {}
    for value_key, settings_key in (
        ("schedulerName", "schedulerName"),
        ("lncNodeLabel", "lncNodeLabel"),
        ("serviceAccountName", "serviceAccount"),
    ):
        if runner.get(value_key):
            base[settings_key] = runner[value_key]
    if "defaultLnc" in runner:  # null is a value: tests without spec.lnc are then refused
        base["runnerDefaultLnc"] = runner["defaultLnc"]
    dra = (values.get("neuron") or {}).get("dra") or {}
    if dra.get("enabled"):
        base["neuronDra"] = {key: value for key, value in dra.items() if key != "enabled"}
    if runner.get("env"):
        base["runnerEnv"] = list(runner["env"])
    if runner.get("envFrom"):
        base["runnerEnvFrom"] = list(runner["envFrom"])
    metrics = values.get("metrics") or {}
    base["metricsPort"] = metrics.get("port", 9090) if metrics.get("enabled", True) else None
    notifications = values.get("notifications") or {}
    base["notifyFormat"] = notifications.get("format", "slack")
    base["notifyAttempts"] = notifications.get("attempts", 5)
    return OperatorSettings.model_validate({**base, **(values.get("settings") or {})})
