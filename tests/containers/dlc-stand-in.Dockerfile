# Stands in for the runner's production base, the Neuron Deep Learning Container, in the container
# tests: a Python base plus CPU torch (the DLC brings torch and torch-neuronx; run.py selects the
# cpu backend where torch_neuronx does not import). Built offline from the tests' wheelhouse.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check torch
