"""Delivery slots: where each attempt's runner pod delivers its result document.

A slot is one key in the results store (``deliveries/<run id>.<token>/result.json``), its token
an HMAC of the run id with the operator's key (:func:`model_support.delivery.slot_for`), so a
pod can reach its own attempt's slot and no other. Before the pod starts the operator makes the
slot reachable to it alone (a folder on the results volume, or a Secret with an upload URL
signed for that one key); when the Job ends it reads what was delivered; once the run is
recorded it removes the slot.
"""

from __future__ import annotations

import contextlib
import logging

from model_support.delivery import DeliveryArea, DeliveryError, delivery_key, slot_for
from model_support.operator.kube import AlreadyExists, Kube, refusal
from model_support.operator.manifests import (
    TestRef,
    build_delivery_secret,
    delivery_url_expiry,
    delivery_wiring,
)
from model_support.operator.resource import child_name, run_id_for
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import TestSpec
from model_support.runpath import Unavailable

log = logging.getLogger(__name__)


class DeliverySlots:
    """The operator's side of delivery: prepare, read and remove each attempt's slot."""

    def __init__(self, settings: OperatorSettings, kube: Kube, key: bytes | None = None) -> None:
        """``key`` signs the slots; None: from the environment (``MODEL_SUPPORT_DELIVERY_KEY``),
        else random for this process."""
        self.settings = settings
        self.kube = kube
        if key is None:
            key, configured = delivery_key()
            if not configured:
                log.warning(
                    "MODEL_SUPPORT_DELIVERY_KEY is not set: delivery slots use a key of this "
                    "process, so runs started before a restart fall back to log and "
                    "termination message"
                )
        self.key: bytes = key

    def slot(self, run_id: str) -> str:
        """The slot of ``run_id`` (its folder name in the store's delivery area)."""
        return slot_for(run_id, self.key)

    def prepare(self, ref: TestRef, spec: TestSpec, store_uri: str, attempt: int) -> None:
        """Make the attempt's slot reachable by its runner pod alone: the slot's folder on the
        results volume, or a Secret with an upload URL signed for its one key.

        A store that cannot make the slot is logged, never fatal: the runner then cannot deliver
        (the Secret's env is optional) and the operator reads its log and termination message
        instead. The API server's refusal of the Secret is CreateRefused, as for the Job.
        """
        run_id = run_id_for(ref.uid, ref.generation, attempt)
        job_name = child_name(ref.name, ref.uid, ref.generation, attempt)
        slot = self.slot(run_id)
        wiring = delivery_wiring(store_uri, self.settings, slot, job_name)
        if wiring is None:
            return
        try:
            area = DeliveryArea(store_uri)
            if wiring.sub_path is not None:
                area.prepare(slot)
                return
            url = area.upload_url(slot, delivery_url_expiry(spec, self.settings))
        except (DeliveryError, ValueError) as exc:
            log.warning("run %s cannot deliver to %s: %s", run_id, store_uri, exc)
            return
        secret = build_delivery_secret(ref, job_name, attempt, url)
        # A refusal (a quota on Secrets, say) is said on the test like the Job's own.
        with refusal("Secret", secret), contextlib.suppress(AlreadyExists):
            self.kube.create_secret(secret)  # made by an earlier try: signed alike

    def read(self, store_uri: str, run_id: str) -> bytes | Unavailable | None:
        """What the runner of ``run_id`` delivered: the bytes, None (nothing), or Unavailable."""
        try:
            return DeliveryArea(store_uri).get(self.slot(run_id))
        except (DeliveryError, ValueError) as exc:
            return Unavailable(f"the delivery area could not be read: {exc}")

    def remove(self, store_uri: str, run_id: str) -> None:
        """Remove a recorded run's slot (prepared, delivered or not); a failure is logged."""
        try:
            DeliveryArea(store_uri).remove(self.slot(run_id))
        except (DeliveryError, ValueError):
            log.warning("run %s is recorded; its delivery slot goes in a later sweep", run_id)


__all__ = ["DeliverySlots"]
