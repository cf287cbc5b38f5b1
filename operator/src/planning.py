"""Planning one test: what the operator would create for it, without creating anything.

Pure of the cluster: :func:`plan` runs the planning steps in order (the spec, the checks of
what it may touch, the pinned revision, sizing) and says what comes of them; the reconciler
calls it with what it read (a token from a Secret), and ``model-support render`` calls it from
a file, so a reviewer sees exactly the program ConfigMap and Job the operator would create (or the
status it would record instead), and a new check here reaches both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from huggingface_hub.errors import HfHubHTTPError

from model_support.delivery import slot_for
from model_support.hardware import LNC_CHOICES, get_profile
from model_support.hub import is_unreachable
from model_support.operator.dra import (
    DraError,
    UnknownLnc,
    build_claim_template,
    claim_lnc,
    device_claim,
    dra_settings,
    node_lnc,
)
from model_support.operator.manifests import (
    Placement,
    RunScript,
    TestRef,
    build_job,
    build_program_configmap,
    claim_template_name,
    delivery_wiring,
    labels_for,
    owner_reference,
    placement_for,
)
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, TestSpec, parse_spec
from model_support.runpath import ModelNotOnHub, RevisionNotFound, pin_revision, prepare
from model_support.script import config_block, program, render_script
from model_support.sizing import Exclusion, MetadataError, ModelNotFound
from model_support.vocabulary import ExclusionReason, Parallelism


class InvalidTest(Exception):
    """The test cannot run as written (phase Invalid, nothing recorded); says what to fix."""


class LoadFailure(Exception):
    """The model itself cannot be read (malformed config or checkpoint): ERROR/load, recorded."""


class Transient(Exception):
    """Sizing could not reach what it reads (Hub 5xx, timeouts): retried with capped backoff."""


def classify_sizing_error(exc: BaseException) -> type[Exception]:
    """Which of InvalidTest / LoadFailure / Transient a sizing failure is."""
    if isinstance(exc, ModelNotFound | FileNotFoundError):
        return InvalidTest
    if isinstance(exc, HfHubHTTPError):
        code = exc.response.status_code if exc.response is not None else None
        if code in (401, 403):
            return InvalidTest
        if code is None or code >= 500 or code == 429:
            return Transient
        return InvalidTest if code == 404 else LoadFailure
    if is_unreachable(exc) or isinstance(exc, ConnectionError | TimeoutError):
        return Transient
    if isinstance(exc, MetadataError | ValueError):
        return LoadFailure
    return Transient


def check_store_allowed(spec: TestSpec, settings: OperatorSettings) -> None:
    """A test may write only under the operator's allowed store prefixes."""
    if spec.results is None:
        return
    allowed = settings.allowed_results_prefixes or [settings.results_uri]
    # Segment by segment, and never through ".." (the spec's pattern refuses it too): a
    # plain prefix test would let <allowed>/../elsewhere through.
    if any(within(spec.results, prefix) for prefix in allowed):
        return
    raise InvalidTest(
        f"spec.results {spec.results!r} is outside the stores this operator may write to "
        f"({', '.join(allowed)}); remove spec.results or ask the operator's admin to allow "
        "it (chart value allowedResultsPrefixes)"
    )


def check_model_path(spec: TestSpec, settings: OperatorSettings) -> None:
    """An absolute spec.model must lie on a configured model volume: the operator sizes it
    from its own filesystem, which is not the test's to read (``/etc``, ``/proc/self``)."""
    if not spec.model.startswith("/"):
        return
    resolved = os.path.realpath(spec.model)  # a link on the volume may point off it
    for root in settings.model_volume_paths:
        real_root = os.path.realpath(root)
        if within(spec.model, root) and within(resolved, real_root):
            return
    raise InvalidTest(
        f"spec.model {spec.model!r} is a path, and it is not on a model volume of this operator "
        f"({', '.join(settings.model_volume_paths) or 'none is configured'}); name a Hub model, "
        "or a checkpoint under one of them (setting modelVolumePaths)"
    )


def check_compile_cache(
    spec: TestSpec, settings: OperatorSettings, namespace: str | None = None
) -> None:
    """A compile cache path in a spec must lie on the operator's compile cache volume, the
    only filesystem a runner pod shares with anything that outlives it; a push needs a test
    that runs only code the project controls, to a target this namespace may push to; a pull
    reads only the namespace's folder or a shared one, and only what it can trust (with
    ``namespace``: see :func:`check_cache_source`)."""
    cache = spec.compileCache
    if cache is None:
        return
    root = settings.compile_cache_volume_path.rstrip("/")
    for field, path in (("source", cache.source), ("target", cache.target)):
        if path is None or "://" in path:
            continue
        if settings.compile_cache_volume_claim is None:
            raise InvalidTest(
                f"spec.compileCache.{field} {path!r} is a path, and this operator has no compile "
                "cache volume (setting compileCacheVolumeClaim); use hf://buckets/... or "
                "s3://..., or ask the operator's admin for a compile cache volume"
            )
        if not within(path, root):
            raise InvalidTest(
                f"spec.compileCache.{field} {path!r} is not on the compile cache volume, "
                f"which runner pods mount at {root}: use a path under {root}/"
            )
    if namespace is None:
        return
    if cache.target is not None:
        _check_push(spec, cache.target, settings, namespace)
    if cache.source is not None:
        check_cache_source(cache.source, settings, namespace)


def _check_push(spec: TestSpec, target: str, settings: OperatorSettings, namespace: str) -> None:
    """A push needs a test that runs only code the project controls, to a target this
    namespace may push to."""
    untrusted = spec.untrusted_code(settings.runner_image)
    if untrusted:
        raise InvalidTest(
            f"spec.compileCache.target: this test runs code the project does not control "
            f"({', '.join(untrusted)}), and whoever pushes to a compile cache runs code in "
            "everyone who pulls from it; keep compileCache.source to pull, and remove the target"
        )
    pushable = push_target(target, settings, namespace)
    if pushable is None:
        allowed = [t.replace("{namespace}", namespace) for t in push_targets(settings)]
        raise InvalidTest(
            f"spec.compileCache.target {target!r} is not a compile cache this namespace "
            f"may push to ({', '.join(allowed) or 'none is configured'}); push under one of "
            "them, or ask the operator's admin (setting compileCachePushTargets)"
        )


def check_cache_source(source: str, settings: OperatorSettings, namespace: str) -> None:
    """A pull reads only what its pod may mount, and what it can trust.

    A path on the compile cache volume must lie in this namespace's folder or a shared push
    target (the pod mounts only that folder, by ``subPath``, never the volume). A namespace's
    own cache is trusted unsigned only where the storage isolates namespaces
    (``compile_cache_namespaces_isolated``); elsewhere its entries need a trusted signature.
    """
    if "://" not in source and cache_root(source, settings, namespace) is None:
        own = settings.compile_cache_volume_path.rstrip("/") + f"/{namespace}"
        shared = [t for t in push_targets(settings) if "{namespace}" not in t and "://" not in t]
        raise InvalidTest(
            f"spec.compileCache.source {source!r} is neither this namespace's compile cache "
            f"folder ({own}) nor a shared one ({', '.join(shared) or 'none is configured'}): "
            "a runner pod mounts only those; pull from one of them"
        )
    if (
        own_cache(source, settings, namespace)
        and not settings.compile_cache_namespaces_isolated
        and not settings.compile_cache_trusted_keys
    ):
        raise InvalidTest(
            f"spec.compileCache.source {source!r} is this namespace's own compile cache, and "
            "its storage does not keep other namespaces out (setting "
            "compileCacheNamespacesIsolated is off), so only signed entries could be trusted, "
            "and no keys are configured (compileCacheTrustedKeys): remove the source, or ask "
            "the operator's admin to isolate the caches or configure signing"
        )


def cache_root(location: str, settings: OperatorSettings, namespace: str) -> PushTarget | None:
    """The compile cache folder ``location`` lies in, for ``namespace``: its own (its folder on
    the volume, or a ``{namespace}`` push target) or a shared push target; None: neither."""
    templates = push_targets(settings)
    if settings.compile_cache_volume_claim is not None:
        templates.append(settings.compile_cache_volume_path.rstrip("/") + "/{namespace}")
    for shared in (False, True):  # its own first: a shared root may hold the namespace's
        for template in templates:
            if ("{namespace}" not in template) is not shared:
                continue
            root = template.replace("{namespace}", namespace)
            if within(location, root):
                return PushTarget(root, shared)
    return None


def push_targets(settings: OperatorSettings) -> list[str]:
    """The configured push targets (templates with ``{namespace}``); by default the
    namespace's own folder on the compile cache volume."""
    if settings.compile_cache_push_targets:
        return list(settings.compile_cache_push_targets)
    if settings.compile_cache_volume_claim is None:
        return []
    return [settings.compile_cache_volume_path.rstrip("/") + "/{namespace}"]


@dataclass(frozen=True)
class PushTarget:
    """A configured push target a location lies under, resolved for one namespace."""

    root: str
    shared: bool  # not the namespace's own: its entries are read by every namespace


def push_target(location: str, settings: OperatorSettings, namespace: str) -> PushTarget | None:
    """The push target ``location`` lies under that ``namespace`` may push to, if any."""
    for template in push_targets(settings):
        shared = "{namespace}" not in template
        root = template.replace("{namespace}", namespace)
        if not within(location, root):
            continue
        if shared and namespace not in settings.compile_cache_shared_pushers:
            continue
        return PushTarget(root, shared)
    return None


def own_cache(location: str, settings: OperatorSettings, namespace: str) -> bool:
    """Whether ``location`` lies in this namespace's own compile cache (its folder on the
    volume, or a ``{namespace}`` push target): only its tests push there. Whether that makes its
    unsigned entries its own is the storage's to say (``compile_cache_namespaces_isolated``)."""
    root = cache_root(location, settings, namespace)
    return root is not None and not root.shared


def within(location: str, root: str) -> bool:
    """Whether ``location`` is ``root`` or under it, segment by segment: ``.``, ``..`` and
    empty segments never pass (``/a/../b`` is not under ``/a``)."""

    def segments(text: str) -> list[str] | None:
        scheme, sep, rest = text.partition("://")
        parts = (rest if sep else text).rstrip("/").split("/")
        head = [scheme + sep] if sep else []
        body = parts if sep else parts[1:] if text.startswith("/") else parts
        if any(p in ("", ".", "..") for p in body):
            return None
        return head + (["/"] if not sep and text.startswith("/") else []) + body

    loc, base = segments(location), segments(root)
    return loc is not None and base is not None and loc[: len(base)] == base


def pin(spec: TestSpec, settings: OperatorSettings, *, token: str | None) -> TestSpec:
    """The spec with its Hub revision pinned to the commit it names now
    (:func:`model_support.runpath.pin_revision`), so every run.py rendered from it (the Job's,
    an exclusion's, one rendered again to record) names the weights that were tested.

    A gated model the operator has no token for keeps its revision: sizing excludes it. Raises
    InvalidTest (no such model or revision) or Transient (the Hub did not answer).
    """

    config = spec.run_config(spec.cores or 1, spec.parallelism or Parallelism.NONE)
    try:
        pinned = pin_revision(
            config, token=token, endpoint=settings.hub_endpoint or os.environ.get("HF_ENDPOINT")
        )
    except (RevisionNotFound, ModelNotOnHub) as exc:
        raise InvalidTest(str(exc)) from exc
    except Exception as exc:
        kind = classify_sizing_error(exc)
        raise kind(f"pinning the revision of {spec.model} failed: {exc}") from exc
    if pinned.config.revision == spec.revision:
        return spec
    return spec.model_copy(update={"revision": pinned.config.revision})


def place(
    spec: TestSpec, settings: OperatorSettings, *, token: str | None
) -> Placement | Exclusion:
    """Cores, host memory and storage of a test, sized from the model and the test's own
    config (the same entry point as the CLI's); ``spec.cores`` overrides the core count only.
    ``token`` is the Hub token the operator could read for it (None: none).

    Raises InvalidTest, LoadFailure or Transient (see :func:`classify_sizing_error`).
    """
    dra = dra_settings(spec, settings)
    lnc: int | None = spec.lnc
    if dra is not None:
        # DRA sets the LNC on the claim: size for exactly the LNC the devices will have.
        try:
            lnc = claim_lnc(spec, dra)
        except DraError as exc:
            raise InvalidTest(str(exc)) from exc
    elif spec.profile in LNC_CHOICES and spec.profile_info.neuron:
        # The device plugin: the LNC is the nodes', sized for as the runner will run at it.
        try:
            lnc = node_lnc(spec, settings)
        except UnknownLnc as exc:
            raise InvalidTest(str(exc)) from exc
    config = spec.run_config(spec.cores or 1, spec.parallelism or Parallelism.NONE)
    try:
        # The CLI's path (runpath.prepare): the revision pinned (already, by pin), then sized.
        prepared = prepare(
            config,
            profile=spec.profile,
            lnc=lnc,
            max_cores=spec.maxCores,
            cores=spec.cores,
            token=token,
            endpoint=settings.hub_endpoint or os.environ.get("HF_ENDPOINT"),
            instance_type=spec.instanceType or spec.profile_info.instance_type,
        )
    except (RevisionNotFound, ModelNotOnHub) as exc:
        raise InvalidTest(str(exc)) from exc
    except Exception as exc:
        kind = classify_sizing_error(exc)
        raise kind(f"sizing {spec.model} failed: {exc}") from exc
    plan = prepared.exclusion or prepared.plan
    assert plan is not None  # prepare gives one of the two
    if isinstance(plan, Exclusion):
        if (
            spec.hubTokenSecret is not None
            and token is None
            and plan.reason is ExclusionReason.GATED_WITHOUT_TOKEN
        ):
            raise InvalidTest(
                f"{spec.model} is gated and this operator does not read Secrets "
                "(readHubTokenSecrets is off); enable readHubTokenSecrets, or test it with "
                "`model-support run` where the token is"
            )
        return plan
    placement = placement_for(plan, settings)
    if dra is not None and lnc is not None:
        try:
            claim = device_claim(placement.cores, lnc, spec.instanceType)
        except DraError as exc:
            raise InvalidTest(str(exc)) from exc
        per_device = get_profile(spec.profile, lnc).cores_per_device
        return dataclasses.replace(placement, pod_cores=claim.devices * per_device)
    if not spec.profile_info.neuron:
        return placement
    try:
        pod_cores = get_profile(spec.profile, lnc).pod_cores(placement.cores)
    except ValueError as exc:
        raise InvalidTest(f"{exc}: lower spec.cores or spec.maxCores") from exc
    if pod_cores > 1 and not (spec.scheduling.schedulerName or settings.scheduler_name):
        raise InvalidTest(
            f"{spec.model} runs on {placement.cores} NeuronCores (the pod holds {pod_cores}), "
            "which must be connected cores: the default scheduler does not place them, so the "
            "pod would never run as sized. Set the chart value runner.schedulerName to the "
            "Neuron scheduler extension's scheduler, enable neuron.dra (trn2), or give the "
            "test spec.scheduling.schedulerName"
        )
    return dataclasses.replace(placement, pod_cores=pod_cores)


def store_uri(spec: TestSpec | None, settings: OperatorSettings) -> str:
    """The results store URI of a test (its spec's `results`, else the operator's)."""
    return (spec.results if spec is not None else None) or settings.results_uri


def claim_template(
    ref: TestRef, spec: TestSpec, placement: Placement, settings: OperatorSettings
) -> dict[str, Any] | None:
    """The ResourceClaimTemplate of a test generation when its cores come through DRA, else
    None. Owned by the test like its other children, so it goes when the test goes.

    Raises InvalidTest when the LNC is unknown or no node holds the devices (see
    :func:`place`, which refuses such tests before this is reached).
    """
    dra = dra_settings(spec, settings)
    if dra is None:
        return None
    try:
        claim = device_claim(placement.cores, claim_lnc(spec, dra), spec.instanceType)
    except DraError as exc:
        raise InvalidTest(str(exc)) from exc
    metadata = {
        "name": claim_template_name(ref),
        "namespace": ref.namespace,
        "labels": labels_for(ref),
        "ownerReferences": [owner_reference(ref)],
    }
    return build_claim_template(metadata, claim, dra)


def children(
    ref: TestRef,
    spec: TestSpec,
    placement: Placement,
    settings: OperatorSettings,
    attempt: int = 1,
    delivery_key: bytes | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program ConfigMap (run.py around its config block, the namespace's) and the runner
    Job of one attempt, as the operator creates them; the Job names the sha256 of the test's
    rendered run.py.

    ``delivery_key`` is the operator's slot key (:func:`model_support.delivery.slot_for`);
    None (``model-support render``) draws one, so the slot shown is only an example.
    """
    config = spec.run_config(placement.cores, placement.parallelism)
    run_py = render_script(config)
    shared = program()
    configmap = build_program_configmap(ref.namespace, shared)
    run_script = RunScript(
        configmap=configmap["metadata"]["name"],
        block=config_block(config),
        sha256=hashlib.sha256(run_py.encode()).hexdigest(),
    )
    job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
    run_id = run_id_for(ref.uid, ref.generation, attempt)
    slot = slot_for(run_id, delivery_key or secrets.token_bytes(32))
    try:
        job = build_job(
            ref,
            spec,
            placement,
            job_name=job_name,
            run_script=run_script,
            attempt=attempt,
            run_id=run_id,
            settings=settings,
            delivery=delivery_wiring(store_uri(spec, settings), settings, slot, job_name),
        )
    except (DraError, UnknownLnc) as exc:  # the LNC to run at is unknown (see place)
        raise InvalidTest(str(exc)) from exc
    return configmap, job


@dataclass(frozen=True)
class Launch:
    """The test runs: its spec (the revision pinned) on this placement."""

    spec: TestSpec
    placement: Placement


@dataclass(frozen=True)
class Exclude:
    """Sizing excludes the model (recorded as EXCLUDED, no Job)."""

    spec: TestSpec
    exclusion: Exclusion


@dataclass(frozen=True)
class Invalid:
    """The test cannot run as written (phase Invalid, nothing recorded); says what to fix."""

    message: str


@dataclass(frozen=True)
class Unreadable:
    """The model itself cannot be read (recorded as ERROR/load, no Job)."""

    spec: TestSpec
    message: str


@dataclass(frozen=True)
class Unreachable:
    """Planning could not reach what it reads (the Hub): tried again with capped backoff."""

    spec: TestSpec
    message: str


Planned = Launch | Exclude | Invalid | Unreadable | Unreachable
"""What planning one test comes to."""


def plan(
    spec: dict[str, Any],
    settings: OperatorSettings,
    namespace: str,
    *,
    token: Callable[[TestSpec], str | None],
) -> Planned:
    """The operator's planning steps for a test's ``spec`` in ``namespace``, in order: parse
    it, check the store, model path and compile cache it names, pin its revision, size it.

    ``token`` gives the Hub token of the parsed spec (the operator reads its hubTokenSecret;
    it may raise InvalidTest). Every other failure is classified into the outcome.
    """
    try:
        parsed = parse_spec(dict(spec))
    except SpecError as exc:
        return Invalid(str(exc))
    current = parsed
    try:
        check_store_allowed(parsed, settings)
        check_model_path(parsed, settings)
        check_compile_cache(parsed, settings, namespace)
        hub_token = token(parsed)
        current = pin(parsed, settings, token=hub_token)
        placement = place(current, settings, token=hub_token)
    except InvalidTest as exc:
        return Invalid(str(exc))
    except LoadFailure as exc:
        return Unreadable(current, str(exc))
    except Transient as exc:
        return Unreachable(current, str(exc))
    if isinstance(placement, Exclusion):
        return Exclude(current, placement)
    return Launch(current, placement)
