"""The project's images, built here from their own Dockerfiles, are what the cluster would run."""

from __future__ import annotations

import hashlib
import json
import re

import docker
from container_images import (
    OPERATOR_DOCKERFILE,
    REPO,
    RUNNER_DOCKERFILE,
    TORCHNEURON_BASE_DOCKERFILE,
    Images,
)

RUN_AS_USER_CHECK = (
    "import json, os, importlib.metadata as m; import model_support.runner_pod, s3fs; "
    "print(json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(), "
    "'transformers': m.version('transformers'), 'hub': m.version('huggingface_hub')}))"
)


def _run(client: docker.DockerClient, image: str, command: list[str], **kwargs: object) -> str:
    output = client.containers.run(
        image, command, remove=True, network_mode="none", read_only=True, **kwargs
    )
    return bytes(output).decode()


def _base_default(dockerfile: str) -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / dockerfile).read_text(), flags=re.M)
    assert match, f"{dockerfile} must take its base as the BASE_IMAGE build argument"
    return match.group(1)


def test_the_dockerfiles_keep_their_production_bases(images: Images) -> None:
    # The tests pass the local Debian base; the Dockerfiles' defaults stay the production ones.
    # The runner's default base is the recipe's image (docs/neuron-releases.md), built first.
    assert _base_default(RUNNER_DOCKERFILE).startswith("model-support/torchneuron-base:sdk")
    assert _base_default(OPERATOR_DOCKERFILE).startswith("python:3.11")
    assert _base_default(TORCHNEURON_BASE_DOCKERFILE).startswith(
        "public.ecr.aws/docker/library/ubuntu:"
    )
    assert images.base not in (_base_default(RUNNER_DOCKERFILE), _base_default(OPERATOR_DOCKERFILE))


def test_the_runner_image_runs_run_py_as_a_non_root_user(
    docker_client: docker.DockerClient, images: Images
) -> None:
    config = docker_client.images.get(images.runner).attrs["Config"]
    assert config["User"] == "1000:1000" and config["WorkingDir"] == "/work"
    assert config["Cmd"] == ["python3", "run.py"]
    # Its digest, not its text: run.py's 200 KB read back through the container's log (what
    # docker run returns) once came back cut short, beside a CPU-heavy run of the suite.
    held = _run(docker_client, images.runner, ["sha256sum", "/work/run.py"]).split()[0]
    assert held == hashlib.sha256((REPO / "images" / "runner" / "run.py").read_bytes()).hexdigest()
    facts = json.loads(_run(docker_client, images.runner, ["python3", "-c", RUN_AS_USER_CHECK]))
    pins = dict(
        re.findall(r"^ARG (\w+_VERSION)=(\S+)$", (REPO / RUNNER_DOCKERFILE).read_text(), re.M)
    )
    assert facts == {
        "uid": 1000,
        "cwd": "/work",
        "transformers": pins["TRANSFORMERS_VERSION"],
        "hub": pins["HF_HUB_VERSION"],
    }
    assert "buckets" in _run(docker_client, images.runner, ["hf", "--help"])


def test_the_runner_keeps_the_compiler_stack_of_its_base(
    docker_client: docker.DockerClient, images: Images
) -> None:
    """The runner's packages install under constraints that hold the base's compiler stack:
    torch (here in TorchNeuron's place, built by the plain-OS base recipe) is the base's, byte
    for byte the same version, and the constraints stay in the image for later installs."""
    version = "import torch, sys; print(torch.__version__, sys.executable)"
    in_base = _run(docker_client, images.torchneuron_base, ["python3", "-c", version]).split()
    in_runner = _run(docker_client, images.runner, ["python3", "-c", version]).split()
    assert in_base[1] == "/opt/torchneuron/bin/python3"  # the recipe's virtualenv, first on PATH
    assert in_runner == in_base
    pins = _run(
        docker_client, images.runner, ["cat", "/etc/model-support/compiler-constraints.txt"]
    )
    lines = pins.split()
    assert f"torch=={in_base[0]}" in lines
    assert any(line.startswith("filelock==") for line in lines)  # torch's own requirements too
    assert not any(line.startswith("transformers==") for line in lines)


def test_the_operator_image_starts_on_a_read_only_root(
    docker_client: docker.DockerClient, images: Images
) -> None:
    config = docker_client.images.get(images.operator).attrs["Config"]
    assert config["Entrypoint"] == ["model-support"] and config["User"] == "10001:10001"
    help_text = _run(docker_client, images.operator, ["operator", "--help"], tmpfs={"/tmp": ""})
    assert "--results" in help_text and "MODEL_SUPPORT_SETTINGS" in help_text
    check = "import s3fs, kopf, model_support.operator.handlers; print('ok')"
    imports = _run(docker_client, images.operator, [], entrypoint=["python3", "-c", check])
    assert imports.strip() == "ok"
