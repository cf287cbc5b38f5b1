"""Shared parts of the fault-injection suites (text generation and the other tasks).

A captured graph is compiled again for each case with that case's backend
(:class:`SwitchableBackend`), so a model is captured once and judged case after case.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration (the faults read them when compiling)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class SwitchableBackend:
    """A torch.compile backend that hands the graphs Dynamo captured to the current case's backend.

    Dynamo captures the model's forward (prefill and decode graphs) once; each case then
    compiles fresh copies of those same graphs with its own backend, exactly what recompiling
    from scratch would hand it, without paying for the capture again.
    """

    def __init__(self) -> None:
        self.backend: Any = None
        self.graphs: list[dict[str, Any]] = []

    def _compile(self, entry: dict[str, Any]) -> Any:
        graph = copy.deepcopy(entry["gm"].graph)  # nodes copied, tensors shared
        return self.backend(torch.fx.GraphModule(entry["gm"], graph), entry["inputs"])

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        entry = {"gm": gm, "inputs": list(example_inputs)}
        entry["compiled"] = self._compile(entry)
        self.graphs.append(entry)
        return lambda *args: entry["compiled"](*args)

    def switch(self, backend: Any) -> None:
        self.backend = backend
        for entry in self.graphs:
            entry["compiled"] = self._compile(entry)
