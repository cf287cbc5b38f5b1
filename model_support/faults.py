"""Fault-injecting torch.compile backends, for measuring how well the verdict catches bugs.

Each public function is a torch.compile backend usable as ``--compile-backend
model_support.faults:<name>``. It receives the FX graph Dynamo captured from the model's forward,
corrupts one well-defined place (found through the nodes' ``nn_module_stack``), and runs the
graph. They imitate real compiler bugs: numeric noise in one layer, a lost attention head, a
mis-routed mixture-of-experts layer, a crash (``buggy_compiler``, which the demo uses).
``benign`` runs the graph unchanged (the control).

The layer is chosen by ``MODEL_SUPPORT_FAULT_LAYER`` (default: the last decoder layer for
noise/head faults, the first for routing), so a test can aim at any layer. In a sharded run,
``MODEL_SUPPORT_FAULT_RANK`` limits a fault to one worker (the others compile correctly), the way
a miscompile on one core would look. ``kill_worker`` kills its own process and ``hang_worker`` stops answering (default rank 1).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

CompiledFn = Callable[..., Any]
_LAYER_PATH = re.compile(r"layers\.(\d+)\.(.+)$")


def _module_path(node: fx.Node) -> str | None:
    """The innermost module a node came from, as 'model.layers.1.mlp' (Dynamo spells it variously)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    raw = list(stack.values())[-1][0]
    path = re.sub(r"^L\['self'\]\.?", "", raw)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return re.sub(r"_modules\['([^']+)'\]", r"\1", path).replace("..", ".").strip(".")


def _layer_nodes(gm: fx.GraphModule, suffix: str) -> dict[int, list[fx.Node]]:
    """Nodes per decoder layer whose module path ends with ``layers.<i>.<suffix>...``."""
    found: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        path = _module_path(node)
        if path is None:
            continue
        match = _LAYER_PATH.search(path)
        if match and (match.group(2) == suffix or match.group(2).startswith(suffix + ".")):
            found.setdefault(int(match.group(1)), []).append(node)
    return found


def _pick_layer(layers: dict[int, list[fx.Node]], default_last: bool) -> int | None:
    if not layers:
        return None
    wanted = os.environ.get("MODEL_SUPPORT_FAULT_LAYER")
    if wanted is not None:
        return int(wanted) if int(wanted) in layers else None
    return max(layers) if default_last else min(layers)


def _on_faulty_rank(default: str | None = None) -> bool:
    wanted = os.environ.get("MODEL_SUPPORT_FAULT_RANK", default)
    return wanted is None or os.environ.get("RANK", "0") == wanted


def _report(kind: str, applied: bool, where: str) -> None:
    # stderr, so the runner's output shows whether the fault actually landed in this graph.
    print(
        f"[fault] {kind}: {'applied at ' + where if applied else 'target not in this graph'}",
        file=sys.stderr,
    )


def _insert_after(
    gm: fx.GraphModule, node: fx.Node, fn: Callable[..., torch.Tensor], *extra: Any
) -> None:
    with gm.graph.inserting_after(node):
        new = gm.graph.call_function(fn, (node, *extra))
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    gm.recompile()


def _noise(x: torch.Tensor, scale: float) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(1234)
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device)
    return (x.float() + noise * x.float().std() * scale).to(x.dtype)


def _noisy_layer(
    scale: float, label: str
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        if not _on_faulty_rank():
            return gm.forward
        layers = _layer_nodes(gm, "mlp")
        layer = _pick_layer(layers, default_last=True)
        if layer is not None:
            output = [n for n in layers[layer] if n.op == "call_function"][-1]
            _insert_after(gm, output, _noise, scale)
        _report(label, layer is not None, f"layer {layer} mlp output")
        return gm.forward

    backend.__name__ = label
    return backend


noise_1pct = _noisy_layer(0.01, "noise_1pct")
noise_5pct = _noisy_layer(0.05, "noise_5pct")
noise_20pct = _noisy_layer(0.20, "noise_20pct")
noise_100pct = _noisy_layer(1.00, "noise_100pct")


def _zero_slice(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    out = x.clone()
    out[..., :head_dim] = 0
    return out


def _head_dim(attn_output: fx.Node) -> int:
    """head_dim from the (batch, seq, heads, head_dim) tensor reshaped into o_proj's input."""
    for candidate in (attn_output, *[a for a in attn_output.args if isinstance(a, fx.Node)]):
        value = candidate.meta.get("example_value", candidate.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.dim() == 4:
            return int(value.shape[-1])
    value = attn_output.meta.get("example_value", attn_output.meta.get("val"))
    return int(value.shape[-1]) // 4 if isinstance(value, torch.Tensor) else 16


def zero_head(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Zero attention head 0 of one layer (the input of its o_proj)."""
    if not _on_faulty_rank():
        return gm.forward
    layers = _layer_nodes(gm, "self_attn.o_proj")
    layer = _pick_layer(layers, default_last=True)
    if layer is not None:
        linear = next(n for n in layers[layer] if n.op == "call_function")
        attn_output = linear.args[0]
        assert isinstance(attn_output, fx.Node)
        with gm.graph.inserting_before(linear):
            zeroed = gm.graph.call_function(_zero_slice, (attn_output, _head_dim(attn_output)))
        linear.replace_input_with(attn_output, zeroed)
        gm.recompile()
    _report("zero_head", layer is not None, f"layer {layer} head 0")
    return gm.forward


def _swap_first_two(x: torch.Tensor) -> torch.Tensor:
    perm = torch.arange(x.shape[-1], device=x.device)
    perm[0], perm[1] = 1, 0
    return x.index_select(-1, perm)


def swap_experts(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Swap the routing of experts 0 and 1 in one MoE layer (columns of its router logits)."""
    if not _on_faulty_rank():
        return gm.forward
    layers = _layer_nodes(gm, "mlp.gate")
    if not layers:
        layers = _layer_nodes(gm, "block_sparse_moe.gate")
    layer = _pick_layer(layers, default_last=False)
    if layer is not None:
        router_logits = next(n for n in layers[layer] if n.op == "call_function")
        _insert_after(gm, router_logits, _swap_first_two)
    _report("swap_experts", layer is not None, f"layer {layer} router")
    return gm.forward


def benign(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """The control: run the captured graph unchanged."""
    return gm.forward


def kill_worker(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """SIGKILL this process when it is the faulty rank (default 1): a worker dying mid-run."""
    if _on_faulty_rank(default="1"):
        print("[fault] kill_worker: killing this worker", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return gm.forward


def hang_worker(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Never return when this is the faulty rank (default 1): a worker stuck mid-run."""
    if _on_faulty_rank(default="1"):
        print("[fault] hang_worker: this worker stops answering", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    return gm.forward


class InjectedCompilerError(RuntimeError):
    """What ``buggy_compiler`` raises: a compiler crashing on a graph it cannot lower."""


def buggy_compiler(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """A compiler with two bugs, to show what failures look like in results (used by the demo).

    A graph with mixture-of-experts routing fails to compile (ERROR, class compile); any other
    graph is miscompiled the way ``noise_100pct`` does it (the verdict FAILs it).
    """
    routers = _layer_nodes(gm, "mlp.gate") or _layer_nodes(gm, "block_sparse_moe.gate")
    if routers:
        raise InjectedCompilerError(
            f"buggy_compiler cannot lower the expert routing of layer {min(routers)} "
            "(an injected compiler failure)"
        )
    return noise_100pct(gm, example_inputs)
