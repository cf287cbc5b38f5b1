"""What `reproduce` says a row needs: the exact run.py, and only what run.py uses on top of the
row's base image, pinned to the row's versions, with the indexes they come from."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest

from model_support.config import RunConfig
from model_support.reproduce import NotReproducible, recipe
from model_support.script import render_script, runner_constant

HARNESS = ["kopf==1.38.0", "streamlit==1.50.0", "pytest==9.0.0", "moto==5.2.5"]


def installed_pins() -> list[str]:
    """This environment's packages as a row records them (name==version)."""
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())


def row(**fields: Any) -> dict[str, Any]:
    config = RunConfig(model="org/model", revision="a" * 40)
    base = {
        "run_id": "20261201T000000000000Z-000000000001",
        "model_id": "org/model",
        "model_path": "org/model",
        "task": "text-generation",
        "backend": "cpu",
        "compile_backend": "inductor",
        "result": "PASS",
        "neuron_cores": 1,
        "lnc": None,
        "instance_type": None,
        "stack": json.dumps({"python": "3.11.7", "torch": "2.13.0+cpu"}),
        "packages": [*installed_pins(), *HARNESS],
        "run_py": render_script(config),
    }
    return {**base, **fields}


def pins(lines: list[str]) -> dict[str, str]:
    return {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in lines}


def test_a_cpu_row_needs_torch_from_its_build_index_and_the_model_libraries_only() -> None:
    plan = recipe(row())
    required = pins(plan.requirements)
    assert required["torch"] == "2.13.0+cpu"
    assert required["transformers"] == importlib.metadata.version("transformers")
    assert "https://download.pytorch.org/whl/cpu" in plan.indexes
    assert not {"kopf", "streamlit", "pytest", "moto", "pandas", "sentence-transformers"} & set(
        required
    )
    assert plan.image == "python:3.11-slim"
    text = plan.requirements_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text
    assert f"transformers=={importlib.metadata.version('transformers')}" in text.splitlines()


def test_a_trainium_row_installs_nothing_the_torchneuron_image_brings() -> None:
    stack = {"python": "3.12.3", "torch": "2.14.0", "torch_neuronx": "2.14.1", "lnc": 2}
    neuron_pins = ["torch-neuronx==2.14.1", "neuronx-cc==2.28.7631.0", "torch==2.14.0"]
    packages = [p for p in installed_pins() if not p.lower().startswith("torch==")]
    plan = recipe(
        row(
            backend="neuron",
            stack=json.dumps(stack),
            packages=[*packages, *neuron_pins],
            instance_type="trn2.48xlarge",
            lnc=2,
            neuron_cores=4,
            task="feature-extraction",
        )
    )
    required = pins(plan.requirements)
    assert not {"torch", "torch-neuronx", "neuronx-cc", "sympy", "networkx"} & set(required)
    assert "sentence-transformers" in required and "transformers" in required
    assert plan.image == runner_constant("TORCHNEURON_BASE_IMAGE")
    assert plan.indexes == ["https://pypi.org/simple"]
    assert (plan.instance, plan.lnc, plan.cores) == ("trn2.48xlarge", 2, 4)


def test_a_row_without_a_run_py_cannot_be_reproduced() -> None:
    with pytest.raises(NotReproducible, match=r"stores no run\.py"):
        recipe(row(run_py=None))


def test_a_local_checkpoint_and_a_function_backend_are_said() -> None:
    plan = recipe(
        row(model_path="/data/ckpt", compile_backend="model_support.faults:buggy_compiler")
    )
    assert any("local checkpoint at /data/ckpt" in note for note in plan.notes)
    # A backend only this project's package holds: said in the notes and in requirements.txt.
    ran = f"model-support=={importlib.metadata.version('model-support')}"
    said = (
        "run.py's compile backend model_support.faults:buggy_compiler is importable only from "
        f"model-support (this project's own package, not on the package index): install it from "
        f"the project's repository at the version the row ran ({ran}) before running run.py"
    )
    assert said in plan.notes
    assert f"# NOTE: {said}" in plan.requirements_text().splitlines()
    # A backend from another installed distribution: that distribution, at the row's version.
    other = recipe(row(compile_backend="markdown_it.main:compile"))
    assert f"markdown-it-py=={importlib.metadata.version('markdown-it-py')}" in {
        r.lower() for r in other.requirements
    }


def test_an_excluded_row_needs_its_stacks_torch_and_transformers() -> None:
    """Nothing ran, so no packages were recorded: the stack it was planned on names them."""
    plan = recipe(
        row(
            result="EXCLUDED",
            packages=[],
            stack=json.dumps(
                {
                    "python": "3.11.7",
                    "torch": "2.13.0",
                    "transformers": "5.24.0",
                    "origin": "writer",
                }
            ),
        )
    )
    required = pins(plan.requirements)
    assert (required["torch"], required["transformers"]) == ("2.13.0", "5.24.0")


def test_a_neuron_row_runs_in_its_own_image_with_the_devices_its_cores_need() -> None:
    image = "123.dkr.ecr.us-east-1.amazonaws.com/runner:sdk2.27"
    plan = recipe(
        row(
            backend="neuron",
            stack=json.dumps({"python": "3.12.3", "torch": "2.14.0", "torch_neuronx": "2.14.1"}),
            instance_type="trn2.48xlarge",
            lnc=2,
            neuron_cores=6,
            labels=json.dumps({"image": image}),
        )
    )
    assert plan.image == image
    # trn2 at LNC=2: 4 logical cores a device, so 6 cores span 2 devices.
    assert plan.docker_flags == [
        "--device=/dev/neuron0", "--device=/dev/neuron1", "-e NEURON_LOGICAL_NC_CONFIG=2",
    ]  # fmt: skip
    assert "--device=/dev/neuron1 -e NEURON_LOGICAL_NC_CONFIG=2 -v" in plan.commands("f")[1]
