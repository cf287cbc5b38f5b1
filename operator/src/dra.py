"""NeuronCores through the Neuron DRA driver: one ResourceClaimTemplate per test generation.

Where the chart enables DRA (``neuron.dra.enabled``), a trn2 runner pod asks for whole
Trainium2 devices through a ResourceClaimTemplate instead of ``aws.amazon.com/neuroncore``:

- the smallest unit is one device (trn2: 8 physical NeuronCores = 4 logical cores at LNC=2,
  8 at LNC=1), so the claim holds the fewest devices that hold the sized cores;
- more than one device must be connected: a ``matchAttribute`` constraint on
  ``resource.aws.com/devicegroup{N}_id`` (N = 4, 8, 16, the driver's connected groups) keeps
  them in one group, so the Neuron scheduler extension is not needed;
- the LNC is set on the claim (opaque ``NeuronConfig``, ``logicalNeuronCore``). It is the
  test's ``spec.lnc``, else the chart's ``neuron.dra.defaultLnc``; sizing uses the same value,
  so the cores counted are the cores the devices show, and the runner container gets it in
  ``NEURON_LOGICAL_NC_CONFIG`` (:func:`runtime_lnc`), the only LNC setting TorchNeuron reads;
- the devices are selected by their instance type, as AWS's example claims do (a CEL selector
  on the driver's ``instanceType`` attribute): the test's ``spec.instanceType``, else every
  trn2 type whose devices hold the claim; and, where the chart names one
  (``neuron.dra.driverVersion``), by their driver's version (``neuronDriverVersion``).

Without DRA (the device plugin) the LNC is a node setting the pod cannot choose:
:func:`node_lnc` is the test's own where nodes carry an LNC label, else the chart's
``runner.defaultLnc`` (the node groups' LNC; AWS's EKS guide: 2 unless the launch template
sets 1), and a test is refused when neither is known.

Facts and sources: docs/trainium.md ("LNC and DRA").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from model_support.hardware import DEFAULT_LNC, get_profile, instance_types_holding
from model_support.operator.settings import NeuronDraSettings, OperatorSettings
from model_support.operator.spec import TestSpec

RESOURCE_API_VERSION = "resource.k8s.io/v1"
"""The DRA API the templates use (GA in Kubernetes 1.34, the driver's minimum)."""
CLAIM_NAME = "neurons"
"""The device request in the template, the pod's claim and the container's claim reference."""
CONNECTED_GROUPS = (4, 8, 16)
"""Sizes of the driver's connected device groups above one device (devicegroup{N}_id)."""
DEVICE_GROUP_ATTRIBUTE = "resource.aws.com/devicegroup{size}_id"
DRA_PROFILE = "trn2"
"""The profile DRA applies to (the driver supports Trainium2; other profiles keep the plugin)."""


class DraError(ValueError):
    """A test cannot be claimed through DRA as written; the message says what to change."""


class UnknownLnc(ValueError):
    """The LNC a test would run at cannot be known (device plugin, no LNC label, no default);
    the message says what to set."""


@dataclass(frozen=True)
class DeviceClaim:
    """What one runner pod claims: whole devices, their connected group, and the LNC."""

    devices: int
    lnc: int
    connected_group: int | None
    instance_types: tuple[str, ...] = ()
    """The instance types whose devices may be claimed (empty: any)."""

    @property
    def group_attribute(self) -> str | None:
        """The attribute all claimed devices must share (None for a single device)."""
        if self.connected_group is None:
            return None
        return DEVICE_GROUP_ATTRIBUTE.format(size=self.connected_group)


def dra_settings(spec: TestSpec, settings: OperatorSettings) -> NeuronDraSettings | None:
    """The DRA settings when this test's cores come through DRA, else None (device plugin)."""
    if settings.neuron_dra is None or spec.profile != DRA_PROFILE:
        return None
    return settings.neuron_dra


def claim_lnc(spec: TestSpec, dra: NeuronDraSettings) -> int:
    """The LNC the claim sets: the test's own, else the chart's default; DraError if neither."""
    lnc = spec.lnc or dra.default_lnc
    if lnc is None:
        raise DraError(
            "this operator requests NeuronCores through DRA, which sets the LNC on each claim, "
            "and it has no default LNC (chart value neuron.dra.defaultLnc): set spec.lnc to 1 "
            "or 2"
        )
    return lnc


LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
"""The only LNC setting TorchNeuron reads; without it the platform default (trn2/trn3: 2)
applies, never the node's /opt/aws/neuron/logical_nc_config (docs/trainium.md, "LNC")."""


def runtime_lnc(spec: TestSpec, settings: OperatorSettings) -> int | None:
    """The LNC a test is sized and placed for, which its runner must run at: the claim's under
    DRA, else :func:`node_lnc`; None for a profile without logical cores. Raises DraError when
    DRA has no LNC to claim, UnknownLnc when the nodes' LNC is not known."""
    dra = dra_settings(spec, settings)
    if dra is not None:
        return claim_lnc(spec, dra)
    if not spec.profile_info.neuron:
        return None
    return node_lnc(spec, settings)


def node_lnc(spec: TestSpec, settings: OperatorSettings) -> int | None:
    """The LNC of the nodes a device-plugin test runs on (None: a profile without LNC).

    With ``runner.lncNodeLabel`` the pod selects nodes by their LNC: the test's own, else the
    profile's default. Without it no pod can know a node's LNC (on EKS it is set in a node
    group's launch template, which adds no label), so the test runs at the chart's
    ``runner.defaultLnc``, the LNC the cluster's node groups are declared to use; a test asking
    for another LNC, or any test when no default is declared, is refused (UnknownLnc)."""
    if spec.profile not in DEFAULT_LNC:
        return spec.lnc
    if settings.lnc_node_label:
        return spec.lnc or DEFAULT_LNC[spec.profile]
    declared = settings.runner_default_lnc
    if declared is None:
        raise UnknownLnc(
            f"the LNC of this cluster's {spec.profile} nodes is not known to the operator: "
            "set spec.lnc, or the chart's runner.defaultLnc to the LNC the node groups run at "
            "(AWS's EKS guide: 2 unless their launch template sets 1), or label the nodes "
            "with their LNC (runner.lncNodeLabel), or use DRA (neuron.dra.enabled)"
        )
    if spec.lnc is not None and spec.lnc != declared:
        raise UnknownLnc(
            f"spec.lnc={spec.lnc} needs nodes labelled with their LNC, and this operator "
            "has no lncNodeLabel configured (chart value runner.lncNodeLabel) nor DRA "
            f"(neuron.dra.enabled): its {spec.profile} nodes are declared to run at LNC "
            f"{declared} (runner.defaultLnc); LNC is a node setting, not one a pod can choose"
        )
    return declared


def device_claim(cores: int, lnc: int, instance_type: str | None = None) -> DeviceClaim:
    """The fewest whole trn2 devices that hold ``cores`` logical cores at ``lnc``, on
    ``instance_type`` (else on any trn2 type whose devices hold them)."""
    profile = get_profile(DRA_PROFILE, lnc)
    per_device = profile.cores_per_device
    needed = math.ceil(cores / per_device)
    largest = CONNECTED_GROUPS[-1]
    if needed > largest:
        raise DraError(
            f"{cores} cores at LNC={lnc} need {needed} Trainium2 devices ({per_device} cores "
            f"each); one trn2 node has {largest}: lower spec.cores or spec.maxCores"
        )
    # Only whole connected groups are placed (1, 4, 8 or 16 devices): 2 devices are 4.
    devices = math.ceil(profile.pod_cores(cores) / per_device)
    group = None if devices == 1 else next(g for g in CONNECTED_GROUPS if g >= devices)
    types = (instance_type,) if instance_type else tuple(instance_types_holding("trn2", devices))
    return DeviceClaim(devices, lnc, group, types)


def _cel_string(value: str) -> str:
    """``value`` as a CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(value)


def device_selectors(claim: DeviceClaim, dra: NeuronDraSettings) -> list[dict[str, Any]]:
    """The claim's CEL selectors: the devices' instance type and, where set, driver version
    (the attributes AWS's example claims select by, deploy/eks/dra.rst)."""
    attributes = f"device.attributes[{_cel_string(dra.device_attribute_domain)}]"
    conditions = []
    if len(claim.instance_types) == 1:
        conditions.append(f"{attributes}.instanceType == {_cel_string(claim.instance_types[0])}")
    elif claim.instance_types:
        listed = ", ".join(_cel_string(t) for t in claim.instance_types)
        conditions.append(f"{attributes}.instanceType in [{listed}]")
    if dra.driver_version:
        conditions.append(f"{attributes}.neuronDriverVersion == {_cel_string(dra.driver_version)}")
    return [{"cel": {"expression": " && ".join(conditions)}}] if conditions else []


def build_claim_template(
    metadata: dict[str, Any], claim: DeviceClaim, dra: NeuronDraSettings
) -> dict[str, Any]:
    """The ResourceClaimTemplate of one runner pod (``metadata``: name, namespace, labels,
    owner references, as the test's other children carry)."""
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": CLAIM_NAME,
                "exactly": {
                    "deviceClassName": dra.device_class_name,
                    "allocationMode": "ExactCount",
                    "count": claim.devices,
                    **(
                        {"selectors": selectors}
                        if (selectors := device_selectors(claim, dra))
                        else {}
                    ),
                },
            }
        ],
        "config": [
            {
                "requests": [CLAIM_NAME],
                "opaque": {
                    "driver": dra.driver,
                    "parameters": {
                        "apiVersion": dra.config_api_version,
                        "kind": dra.config_kind,
                        "logicalNeuronCore": claim.lnc,
                    },
                },
            }
        ],
    }
    if claim.group_attribute is not None:
        devices["constraints"] = [
            {"requests": [CLAIM_NAME], "matchAttribute": claim.group_attribute}
        ]
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": devices}},
    }


def pod_claims(template_name: str) -> list[dict[str, Any]]:
    """The pod's ``spec.resourceClaims``: one claim made from the test's template."""
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": template_name}]


def container_claims() -> list[dict[str, Any]]:
    """The runner container's ``resources.claims``: it uses the pod's claim."""
    return [{"name": CLAIM_NAME}]
