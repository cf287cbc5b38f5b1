"""One table of Neuron SDK releases (docs/neuron-releases.md): every copy of its pins agrees.

The runner image, its base recipe, run.py's image name, the operator's declared default stack
(and the chart's comment on it), compiler_constraints.py's release table and the doctor's copy
are each checked against the documented row, so a new release is one row and these checks say
what else to change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model_support.neuron_releases import DEFAULT_RELEASE, NEURON_RELEASES, release_of_runtime
from model_support.operator.settings import DEFAULT_RUNNER_STACK
from model_support.runner import compiler_constraints
from model_support.runner import run as runner

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = {
    "Neuron SDK": "sdk",
    "runner base (`BASE_IMAGE`)": "runner_base",
    "OS image of the base": "base_os_image",
    "Python": "python",
    "torch": "torch",
    "torch-neuronx": "torch_neuronx",
    "neuronx-cc": "neuronx_cc",
    "nki": "nki",
    "aws-neuronx-runtime-lib": "runtime",
    "aws-neuronx-collectives": "collectives",
    "aws-neuronx-tools": "tools",
    "driver (aws-neuronx-dkms) minimum": "driver",
}


def documented_rows() -> list[dict[str, str]]:
    """The rows of the table under "## The releases", by field name."""
    text = (ROOT / "docs" / "neuron-releases.md").read_text()
    section = text.split("## The releases", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert set(header) == set(COLUMNS), header
    rows = []
    for line in lines[2:]:
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows.append({COLUMNS[name]: cell for name, cell in zip(header, cells, strict=True)})
    return rows


def _arg(dockerfile: str, name: str) -> str:
    text = (ROOT / "images" / "runner" / dockerfile).read_text()
    match = re.search(rf'^ARG {name}="?([^"\n]*)"?$', text, re.MULTILINE)
    assert match, f"{dockerfile} declares no {name}"
    return match.group(1)


def test_the_code_s_copy_of_the_releases_is_the_documented_table() -> None:
    documented = documented_rows()
    assert [vars(release) for release in NEURON_RELEASES] == documented
    assert vars(DEFAULT_RELEASE) == documented[-1]  # the newest row is the default


def test_the_base_recipe_installs_the_default_release_exactly() -> None:
    row = vars(DEFAULT_RELEASE)
    assert _arg("torchneuron-base.Dockerfile", "BASE_IMAGE") == row["base_os_image"]
    assert _arg("torchneuron-base.Dockerfile", "NEURON_SDK") == row["sdk"]
    python = _arg("torchneuron-base.Dockerfile", "TORCHNEURON_PACKAGES").split()
    assert python == [
        f"torch=={row['torch']}",
        f"torch-neuronx=={row['torch_neuronx']}",
        f"neuronx-cc=={row['neuronx_cc']}",
        f"nki=={row['nki']}",
    ]  # every package pinned: no neuronx-cc==2.* drifting to the next release
    apt = _arg("torchneuron-base.Dockerfile", "NEURON_APT_PACKAGES").split()
    assert apt == [
        f"aws-neuronx-runtime-lib={row['runtime']}*",
        f"aws-neuronx-collectives={row['collectives']}*",
        f"aws-neuronx-tools={row['tools']}*",
    ]


def test_the_runner_is_built_on_the_default_release_s_base() -> None:
    image = _arg("Dockerfile", "BASE_IMAGE")
    assert image == DEFAULT_RELEASE.runner_base == runner.TORCHNEURON_BASE_IMAGE
    assert not image.endswith(":latest") and "sdk" + DEFAULT_RELEASE.sdk in image


def test_the_operator_declares_the_default_release_s_compiler_and_torch() -> None:
    assert DEFAULT_RUNNER_STACK.neuronx_cc == DEFAULT_RELEASE.neuronx_cc
    assert DEFAULT_RUNNER_STACK.torch == DEFAULT_RELEASE.torch
    values = (ROOT / "charts" / "model-support" / "values.yaml").read_text()
    comment = values.split("runnerStack:", 1)[0].rsplit("runnerImage:", 1)[1]
    assert f"neuronx-cc {DEFAULT_RELEASE.neuronx_cc}" in comment
    assert f"torch {DEFAULT_RELEASE.torch}" in comment


def test_compiler_constraints_knows_every_release_and_names_the_one_a_base_is() -> None:
    assert {
        release.sdk: {
            "torch": release.torch,
            "torch-neuronx": release.torch_neuronx,
            "neuronx-cc": release.neuronx_cc,
            "nki": release.nki,
        }
        for release in NEURON_RELEASES
    } == compiler_constraints.SDK_RELEASES
    base = {"torch": "2.14.0+cpu", "torch-neuronx": "2.14.3.0.1041", "neuronx-cc": "2.28.7631.0"}
    assert compiler_constraints.release_of({**base, "nki": "0.7.0"}) == "2.33.0"
    assert (
        compiler_constraints.release_of({**base, "nki": "0.7.0", "neuronx-cc": "2.29.1.0"}) is None
    )
    assert compiler_constraints.release_of(base) is None  # nki missing: not the release's stack


@pytest.mark.parametrize(
    ("runtime", "sdk"), [("2.35.30.0-8d2c46a2f", "2.33.0"), ("2.99.0.0", None)]
)
def test_a_runtime_package_version_names_its_release(runtime: str, sdk: str | None) -> None:
    release = release_of_runtime(runtime)
    assert (release.sdk if release else None) == sdk
