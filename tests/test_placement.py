"""Core counts a cluster can place: beyond one device, only whole connected device groups.

The Neuron scheduler extension places 1, 4, 8 or 16 devices of a trn1.32xlarge or
trn2.48xlarge (2D torus), and the Neuron DRA driver's connected groups are the same sizes
(docs/hardware.md). A run sized to cores spanning another count gets a pod that holds the next
placeable set; inf2 (a ring) and trn3 (all-to-all switched) place any count.
"""

from __future__ import annotations

import pytest

from model_support.hardware import get_profile


@pytest.mark.parametrize(
    ("instance", "lnc", "cores", "held"),
    [
        ("trn2", 2, 1, 1),
        ("trn2", 2, 2, 2),  # within one device: the cores themselves
        ("trn2", 2, 4, 4),
        ("trn2", 2, 8, 16),  # two devices are not placeable: four are held
        ("trn2", 2, 16, 16),
        ("trn2", 2, 32, 32),
        ("trn2", 2, 64, 64),
        ("trn2", 1, 16, 32),
        ("trn2", 1, 128, 128),
        ("trn1", None, 4, 8),
        ("trn1", None, 32, 32),
        ("inf2", None, 6, 6),  # a ring: any count
        ("trn3", 2, 8, 8),  # all-to-all NeuronSwitch: any count, as on a ring
        ("trn3", 2, 20, 20),
        ("trn3", 1, 12, 12),
        ("trn3", 2, 64, 64),
    ],
)
def test_a_pod_holds_a_placeable_set_of_cores(
    instance: str, lnc: int | None, cores: int, held: int
) -> None:
    assert get_profile(instance, lnc).pod_cores(cores) == held


def test_more_devices_than_one_instance_places_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 16 connected devices"):
        get_profile("trn2", 2).pod_cores(65)
