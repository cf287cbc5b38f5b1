# The runner's TorchNeuron base, from plain Ubuntu and Neuron's own repositories: the default
# base of images/runner/Dockerfile (no Neuron image with a pull command carries TorchNeuron).
# Build it, then the runner on it:
#   docker build -f images/runner/torchneuron-base.Dockerfile \
#       -t model-support/torchneuron-base:sdk2.33.0 images/runner
#   docker build -f images/runner/Dockerfile -t ms-runner .
# What it installs is one Neuron SDK release's row of docs/neuron-releases.md, every package
# pinned (a test keeps these defaults equal to the row): the runtime libraries from the Neuron apt
# repository, torch-neuronx / neuronx-cc / nki from the Neuron pip repository with CPU torch from
# PyTorch's index, on the Ubuntu release TorchNeuron ships wheels for (26.04 for SDK 2.33.0).
ARG BASE_IMAGE=public.ecr.aws/docker/library/ubuntu:26.04
FROM ${BASE_IMAGE}

# The Neuron SDK release whose row of docs/neuron-releases.md the defaults below are.
ARG NEURON_SDK=2.33.0

# The Neuron apt repository (signed; its key from the same host) and the runtime's packages;
# empty: no apt step (the container tests build this file offline on a Debian base).
ARG NEURON_APT_REPO=https://apt.repos.neuron.amazonaws.com
ARG NEURON_APT_PACKAGES="aws-neuronx-runtime-lib=2.35.30.0* aws-neuronx-collectives=2.35.43.0* aws-neuronx-tools=2.33.38.0*"
# The Python side: TorchNeuron and its compiler, from Neuron's pip repository.
ARG TORCHNEURON_PACKAGES="torch==2.14.0 torch-neuronx==2.14.3.0.* neuronx-cc==2.28.7631.0 nki==0.7.0"
ARG NEURON_PIP_INDEX=https://pip.repos.neuron.amazonaws.com
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Offline (air-gapped) builds: --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=<wheelhouse URL>
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS

LABEL dev.model-support.neuron-sdk="${NEURON_SDK}"
# Ubuntu's Python is externally managed (PEP 668): the stack lives in a virtualenv first on PATH,
# so `python3` in the runner image is this one. /opt/aws/neuron holds the runtime's libraries.
ENV VIRTUAL_ENV=/opt/torchneuron \
    PATH=/opt/torchneuron/bin:/opt/aws/neuron/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/aws/neuron/lib \
    PYTHONUNBUFFERED=1
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    if ! python3 -c "import ensurepip" 2>/dev/null || [ -n "${NEURON_APT_PACKAGES}" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3 python3-venv ca-certificates curl gnupg; \
    fi; \
    if [ -n "${NEURON_APT_PACKAGES}" ]; then \
        . /etc/os-release; \
        curl -fsSL "${NEURON_APT_REPO}/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" \
            | gpg --dearmor -o /usr/share/keyrings/neuron.gpg; \
        echo "deb [signed-by=/usr/share/keyrings/neuron.gpg] ${NEURON_APT_REPO} ${VERSION_CODENAME} main" \
            > /etc/apt/sources.list.d/neuron.list; \
        apt-get update; \
        apt-get install -y --no-install-recommends ${NEURON_APT_PACKAGES}; \
    fi; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -m venv "${VIRTUAL_ENV}"; \
    "${VIRTUAL_ENV}/bin/python3" -m pip install --no-cache-dir --disable-pip-version-check \
        --extra-index-url "${NEURON_PIP_INDEX}" --extra-index-url "${TORCH_INDEX}" \
        ${TORCHNEURON_PACKAGES}
