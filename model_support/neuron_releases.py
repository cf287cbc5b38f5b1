"""The Neuron SDK releases model-support builds on: one row per release, what each one pins.

The table is docs/neuron-releases.md ("The releases"), where every figure has its public source;
this module is its copy for code (the doctor's runtime-driver check, the runner image's pins),
and tests/test_neuron_releases.py holds the Dockerfiles, the chart's ``runnerStack`` default,
images/runner/compiler_constraints.py and this copy equal to that table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NeuronRelease:
    """One Neuron SDK release: its base, and the exact versions of what it ships."""

    sdk: str
    base_os_image: str
    """The OS image the release ships TorchNeuron wheels for (the fallback base recipe's)."""
    runner_base: str
    """The runner image's BASE_IMAGE: a TorchNeuron image with a documented pull command, else
    the tag the fallback recipe (images/runner/torchneuron-base.Dockerfile) is built under."""
    python: str
    torch: str
    torch_neuronx: str
    """A pip version specifier's version: the release names a package family (``2.14.3.0.*``)."""
    neuronx_cc: str
    nki: str
    runtime: str
    """aws-neuronx-runtime-lib."""
    collectives: str
    """aws-neuronx-collectives."""
    tools: str
    """aws-neuronx-tools (neuron-ls, neuron-top)."""
    driver: str
    """aws-neuronx-dkms: the host's driver the release ships, the least its runtime is known
    to run with (a newer runtime may need a newer driver: nrt-troubleshoot)."""


NEURON_RELEASES: tuple[NeuronRelease, ...] = (
    NeuronRelease(
        sdk="2.33.0",
        base_os_image="public.ecr.aws/docker/library/ubuntu:26.04",
        runner_base="model-support/torchneuron-base:sdk2.33.0",
        python="3.14",
        torch="2.14.0",
        torch_neuronx="2.14.3.0.*",
        neuronx_cc="2.28.7631.0",
        nki="0.7.0",
        runtime="2.35.30.0",
        collectives="2.35.43.0",
        tools="2.33.38.0",
        driver="2.31.7.0",
    ),
)
"""Every release model-support's images are built from, oldest first."""

DEFAULT_RELEASE: NeuronRelease = NEURON_RELEASES[-1]
"""The release the runner image is built from by default."""


def release_of_runtime(runtime_version: str) -> NeuronRelease | None:
    """The release whose runtime library is ``runtime_version`` (a package version such as
    ``2.35.30.0-8d2c46a2f``: its upstream part is compared); None when no row has it."""
    upstream = runtime_version.split("-", 1)[0].split("+", 1)[0].strip()
    return next((r for r in NEURON_RELEASES if r.runtime == upstream), None)


def version_key(version: str) -> tuple[int, ...]:
    """The numeric release of a version, for ordering: ``2.31.7.0-abc`` -> (2, 31, 7, 0)."""
    parts: list[int] = []
    for part in version.split("-", 1)[0].split("+", 1)[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)
