"""The line of facts under a result's answer (``answer.py``): task, stack, where it ran, cores,
date; and the result as a badge.

Built from a matrix row (a mapping of its columns); every value from the run is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from model_support.markdown import literal
from model_support.viewer import formatting
from model_support.viewer.views import RESULT_COLOURS

NEURON_COMPILER = "neuronx-cc"


def _text(row: Mapping[str, object], name: str) -> str | None:
    value = row.get(name)
    return value if isinstance(value, str) and value else None


def _int(row: Mapping[str, object], name: str) -> int | None:
    value = row.get(name)
    return None if formatting.missing(value) else int(value)  # type: ignore[call-overload]


def on_trainium(row: Mapping[str, object]) -> bool:
    """Whether the run was on Trainium (the neuron backend)."""
    return _text(row, "backend") == "neuron" or _text(row, "compiler") == NEURON_COMPILER


def stack(row: Mapping[str, object]) -> str:
    """The compiler and library versions: ``neuronx-cc 2.28 · torch-neuronx 2.13.0 ·
    transformers 5.24.0``, or ``inductor (torch 2.13.0) · transformers 5.24.0`` off Trainium."""
    compiler = _text(row, "compiler") or _text(row, "compile_backend") or "unknown compiler"
    version = _text(row, "compiler_version") or _text(row, "neuronx_cc")
    parts = []
    if on_trainium(row):
        parts.append(f"{compiler} {version or 'unknown'}")
        if _text(row, "torch_neuronx"):
            parts.append(f"torch-neuronx {_text(row, 'torch_neuronx')}")
    else:
        torch = _text(row, "torch") or version
        parts.append(f"{compiler} (torch {torch})" if torch else compiler)
    library = _text(row, "library") or "transformers"
    parts.append(f"{library} {_text(row, 'library_version') or 'unknown'}")
    line = " · ".join(parts)
    return f"{line} (as its runner pod reported it)" if _stack_reported(row) else line


def _labels(row: Mapping[str, object]) -> dict[str, object]:
    """The row's labels (operator records carry them); empty when absent or damaged."""
    labels = row.get("labels")
    if not isinstance(labels, str) or not labels:
        return {}
    try:
        parsed = json.loads(labels)
    except ValueError:
        return {}  # a damaged labels column says nothing
    return parsed if isinstance(parsed, dict) else {}


def _stack_reported(row: Mapping[str, object]) -> bool:
    """Whether the operator recorded the stack from the pod's report, not from the runner
    image's declared versions (label ``stack``; runs outside the operator have no such label)."""
    return _labels(row).get("stack") == "reported"


def reported_stack_fields(row: Mapping[str, object]) -> list[str]:
    """The stack fields the operator recorded on its runner pod's word alone, checked against
    nothing it knows (label ``stack_reported``: python, os, device_name, ...)."""
    value = _labels(row).get("stack_reported")
    return [f for f in value.split(",") if f] if isinstance(value, str) else []


def device(row: Mapping[str, object]) -> str:
    """Where it ran: ``Trainium trn2.48xlarge, LNC 2``, ``CPU``, ``CUDA (NVIDIA H200)``."""
    instance = _text(row, "instance_type")
    lnc = _int(row, "lnc")
    backend = _text(row, "backend")
    reported = set(reported_stack_fields(row))
    if instance and "instance_type" in reported:
        instance += " as its pod reported it"
    if on_trainium(row):
        where = f"Trainium {instance}" if instance else "Trainium (instance not recorded)"
        return f"{where}, LNC {lnc}" if lnc else where
    name = {"cpu": "CPU", "cuda": "CUDA"}.get(backend or "", backend or "unknown device")
    device_name = _text(row, "device_name")
    if device_name and "device_name" in reported:
        device_name += " as its pod reported it"
    detail = ", ".join(v for v in (instance, device_name) if v)
    return f"{name} ({detail})" if detail else name


def cores(row: Mapping[str, object]) -> str:
    """``4 cores`` on Trainium, ``1 process`` elsewhere (what ``neuron_cores`` counts there)."""
    count = _int(row, "neuron_cores")
    if count is None:
        return "cores not recorded"
    unit = "core" if on_trainium(row) else "process"
    return f"{count:,} {unit}{'' if count == 1 else ('s' if unit == 'core' else 'es')}"


def when(row: Mapping[str, object]) -> str:
    """When the run finished (else when it was recorded)."""
    finished = row.get("finished_at")
    return formatting.when(row.get("recorded_at") if formatting.missing(finished) else finished)


def facts(row: Mapping[str, object]) -> str:
    """Task, stack, device, cores and date as one line of Markdown (each escaped), and that the
    model was a local checkpoint (its path is in the run's details)."""
    parts = [row.get("task") or "unknown task", stack(row), device(row), cores(row), when(row)]
    if _text(row, "model_path"):
        parts.append("a local checkpoint, not a Hub model")
    return " · ".join(literal(part) for part in parts)


def badge(result: str) -> str:
    """The result as a badge in its colour (Markdown; the result's name escaped)."""
    return f":{RESULT_COLOURS.get(result, 'gray')}-background[{literal(result)}]"
