"""Planning and launching a test on the cluster: the Hub token its spec may name, the planning
steps (:func:`model_support.operator.planning.plan`), and the children of each attempt
(ResourceClaimTemplate, delivery slot, Job; the namespace's program ConfigMap), created or
adopted after a 409.

Children have deterministic names per generation and attempt, so a launch that meets what an
earlier try (or another replica) made adopts it instead of making a second one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from model_support.operator import metrics
from model_support.operator.kube import AlreadyExists, Kube, refusal
from model_support.operator.manifests import (
    Placement,
    TestRef,
    claim_template_name,
    run_script_sha256,
)
from model_support.operator.planning import InvalidTest, Planned, children, claim_template, plan
from model_support.operator.programs import ProgramConfigMaps
from model_support.operator.resource import child_name
from model_support.operator.settings import OperatorSettings
from model_support.operator.slots import DeliverySlots
from model_support.operator.spec import TestSpec
from model_support.operator.status import ACTIVE_PHASES, TestStatus

log = logging.getLogger(__name__)

HUB_TOKEN_LABEL = "modelsupport.dev/hub-token"
"""A Secret the operator may read for a test's hubTokenSecret must carry this label ("true")."""


class Launcher:
    """Plans a test with what the cluster holds for it, and creates each attempt's children."""

    def __init__(
        self,
        settings: OperatorSettings,
        kube: Kube,
        slots: DeliverySlots,
        store_uri: Callable[[TestSpec | None], str],
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.slots = slots
        self.programs = ProgramConfigMaps(kube)
        self._store_uri = store_uri  # the results store of a spec (Recorder.store_uri)

    def hub_token(self, spec: TestSpec, namespace: str) -> str | None:
        """The Hub token of a test's hubTokenSecret, when the operator may read it."""
        if spec.hubTokenSecret is None or not self.settings.read_token_secrets:
            return None
        # Only a Secret labelled so is ever returned to the operator (a selected list).
        secret = self.kube.read_labelled_secret(
            namespace, spec.hubTokenSecret.name, {HUB_TOKEN_LABEL: "true"}
        )
        name = f"{namespace}/{spec.hubTokenSecret.name}"
        if secret is None:
            raise InvalidTest(
                f"spec.hubTokenSecret names Secret {name}, which does not exist or lacks the "
                f"label {HUB_TOKEN_LABEL}=true; the operator reads only Secrets labelled so "
                f"(kubectl label secret -n {namespace} {spec.hubTokenSecret.name} "
                f"{HUB_TOKEN_LABEL}=true)"
            )
        value = self.kube.secret_key(secret, spec.hubTokenSecret.key)
        if value is None:
            raise InvalidTest(f"Secret {name} has no key {spec.hubTokenSecret.key!r}")
        return value

    def plan(self, test: dict[str, Any], ref: TestRef) -> Planned:
        """The planning steps for the test's spec, with the token of its hubTokenSecret."""
        return plan(
            dict(test.get("spec") or {}),
            self.settings,
            ref.namespace,
            token=lambda spec: self.hub_token(spec, ref.namespace),
        )

    def start(
        self, ref: TestRef, spec: TestSpec, placement: Placement, attempt: int
    ) -> tuple[str, str, str]:
        """Create (or adopt) the Job of one attempt, the namespace's program ConfigMap first
        (its pod mounts it); returns their names and the sha256 of the test's run.py. Raises
        CreateRefused when the API server refuses one (nothing is created for the test then)."""
        configmap, job = children(
            ref, spec, placement, self.settings, attempt, delivery_key=self.slots.key
        )
        self.programs.ensure(configmap)
        with refusal("ResourceClaimTemplate", None):
            self.claim_template(ref, spec, placement)
        self.slots.prepare(ref, spec, self._store_uri(spec), attempt)  # before the pod reads it
        name = job["metadata"]["name"]
        try:
            with refusal("Job", job):
                self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
        except AlreadyExists:
            log.info("Job %s/%s already exists; adopting it", ref.namespace, name)
            # Made by an earlier try, perhaps by an operator that rendered another run.py: the
            # status must name what that Job runs.
            adopted = self.kube.read_job(ref.namespace, name)
            if adopted is not None and run_script_sha256(adopted) is not None:
                job = adopted
        sha256 = run_script_sha256(job)
        assert sha256 is not None  # children() puts it in every Job it builds
        return configmap["metadata"]["name"], name, sha256

    def start_again(self, ref: TestRef, spec: TestSpec, placement: Placement, attempt: int) -> str:
        """Create (or adopt) the Job of ``attempt``, the same test's run.py again; returns its
        name. Raises InvalidTest when the operator's settings
        no longer allow the test (e.g. DRA's default LNC removed since the first attempt), and
        CreateRefused when the API server refuses a create, as :meth:`start` does."""
        configmap, job = children(
            ref, spec, placement, self.settings, attempt, delivery_key=self.slots.key
        )
        self.programs.ensure(configmap)  # the runner script may be new since the first attempt
        with refusal("ResourceClaimTemplate", None):
            self.claim_template(ref, spec, placement)  # in case it was deleted by hand
        self.slots.prepare(ref, spec, self._store_uri(spec), attempt)
        job_name = str(job["metadata"]["name"])
        try:
            with refusal("Job", job):
                self.kube.create_job(job)
            metrics.JOBS_CREATED.inc()
            metrics.RETRIES.inc()
        except AlreadyExists:
            log.info("retry Job %s/%s already exists; adopting it", ref.namespace, job_name)
        return job_name

    def claim_template(self, ref: TestRef, spec: TestSpec, placement: Placement) -> None:
        """Create (or adopt) the generation's ResourceClaimTemplate when cores come via DRA."""
        template = claim_template(ref, spec, placement, self.settings)
        if template is not None:
            with contextlib.suppress(AlreadyExists):  # shared by the generation's attempts
                self.kube.create_resource_claim_template(template)

    def delete_superseded(self, ref: TestRef, status: TestStatus) -> None:
        """A spec change supersedes what the previous generation (the one ``status`` is of)
        made: an active one's Jobs, every attempt's (a retry after node loss keeps the earlier
        attempts' until the run is recorded); its ResourceClaimTemplate (DRA), active or not.
        A recorded generation's Jobs are the TTL controller's."""
        old = status.observedGeneration
        if old is None or old == ref.generation:
            return
        if status.phase in ACTIVE_PHASES:
            for attempt in range(status.attempt or 1, 0, -1):
                self.kube.delete_job(ref.namespace, child_name(ref.name, ref.uid, old, attempt))
        if self.settings.neuron_dra is not None:
            superseded = TestRef(ref.namespace, ref.name, ref.uid, old)
            self.kube.delete_resource_claim_template(ref.namespace, claim_template_name(superseded))


__all__ = ["HUB_TOKEN_LABEL", "Launcher"]
