"""What a recorded test cost: core-seconds from the run's own timestamps, priced by the instance
the operator ran it on (docs/pricing.md)."""

from __future__ import annotations

from typing import Any

from model_support.dataset import core_seconds
from model_support.operator.settings import OperatorSettings
from model_support.operator.spec import SpecError, parse_spec
from model_support.records import ResultDocument


def run_cost(
    spec: dict[str, Any],
    document: ResultDocument,
    settings: OperatorSettings,
    held_cores: int | None = None,
) -> tuple[float | None, float | None]:
    """(core-seconds, dollars) of one recorded run.

    The instance is the one the test asked for (its ``instanceType``, else its profile's):
    what the operator scheduled it on, not what a pod says; a Neuron run that names none is
    priced by the table's ``default_instance_type``, a cpu profile's run never (its
    core-seconds are not Trainium core-hours). The cores
    priced are those the pod held (``held_cores``, whole devices), not only those it used.
    """
    used = core_seconds(document, held_cores)
    try:
        test = parse_spec(spec)
    except SpecError:
        return used, None
    instance = test.instanceType or test.profile_info.instance_type
    lnc = test.lnc or document.stack.lnc
    return used, settings.prices().cost_usd(used, instance, lnc, test.profile_info.neuron)
