"""Fault-injecting torch.compile backends, for measuring how well the verdict catches bugs.

Each public function is a torch.compile backend usable as ``--compile-backend
model_support.faults:<name>``. It receives the FX graph Dynamo captured from the model's forward,
changes one well-defined place (found through the nodes' ``nn_module_stack``), and runs the
graph. Faults imitate real compiler bugs:

- everywhere: noise of a few sizes on one layer's MLP output, a lost attention head, two
  experts' routing swapped, one expert's output 1.5x (``one_expert_scaled``, the expert chosen
  by ``MODEL_SUPPORT_FAULT_EXPERT``), a 10% scaling inside a layer (a norm weight read with
  the wrong convention), noise on the final norm's output (``final_norm_noise_30pct``);
- in time: noise that starts late in decoding (``late_noise_20pct``), or hits one batch row at
  one decode step only (``one_row_step_noise_*``);
- in the vocabulary: a bias on every token outside each position's top 64 (``vocab_tail_bias``),
  or on one rare token (``rare_token_bias``), invisible in the reference's top tokens.
- only in decode-shaped graphs (one token per sequence, as a decode step compiles them): noise
  on one layer's MLP output (``decode_noise_100pct``) or one expert's output 1.5x
  (``decode_expert_scaled``), wrong from the first decode step; and the keys and values one
  layer's attention writes into its static cache from ``MODEL_SUPPORT_FAULT_CACHE_POSITION``
  on (``cache_write_noise``), wrong from the decode step that writes that position. Unlike the
  step-counting faults above, these depend only on what the miscompiled module is given (its
  shapes, the cache positions it writes), as a compiler bug does, so the search, compiling the
  module alone with that step's shapes, meets them too.

Benign backends change the arithmetic the way a correct compiler may: ``benign`` runs the graph
unchanged (the control); ``tf32_matmuls`` and ``bf16_matmuls`` round every matmul operand to
TF32 / bfloat16 with float32 accumulation (TF32 tensor cores, Neuron's default auto-cast);
``bf16_logits`` rounds the logits to bfloat16; ``float64_recompute`` computes every matmul in
float64 and rounds it back (more exact than any device); ``router_flip`` picks the other expert where a
mixture-of-experts router is nearly tied, at one or two decode positions. The demo's two
releases of a faulty compiler: ``moe_crash_compiler`` fails to compile mixture-of-experts
graphs, ``dense_miscompiler`` (the next release) compiles those and corrupts dense ones.

The layer is chosen by ``MODEL_SUPPORT_FAULT_LAYER`` (default: the last decoder layer for
noise/head/scale faults, the first for routing swaps, the last for router flips), so a test can
aim at any layer. In a sharded run, ``MODEL_SUPPORT_FAULT_RANK`` limits a fault to one worker
(the others compile correctly), the way a miscompile on one core would look. ``kill_worker`` kills
its own process and ``hang_worker`` stops answering (default rank 1).
"""

from __future__ import annotations

import operator
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

CompiledFn = Callable[..., Any]
_LAYER_PATH = re.compile(r"(?:layers|layer|block)\.(\d+)\.(.+)$")
# Where a layer's MLP output is, per architecture family: ``mlp`` (Llama and most decoders),
# ``fc2`` (BART, Whisper), ``output.dense`` (BERT, ViT), ``layer.<1|2>.DenseReluDense`` (T5's
# encoder and decoder blocks).
MLP_OUTPUTS = ("mlp", "fc2", "output.dense", "layer.1.DenseReluDense", "layer.2.DenseReluDense")
# A layer's self-attention output projection, whose input is the heads side by side.
ATTENTION_OUTPUTS = (
    "self_attn.o_proj",
    "self_attn.out_proj",
    "attention.o_proj",
    "attention.output.dense",
    "layer.0.SelfAttention.o",
)


def _module_path(node: fx.Node) -> str | None:
    """The innermost module a node came from, as 'model.layers.1.mlp' (Dynamo spells it variously)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    raw = list(stack.values())[-1][0]
    # The compiled function's self: L['self'], or its first argument where transformers wraps
    # the model's forward in a decorator (L['args'][0]).
    path = re.sub(r"^L\['self'\]\.?|^L\['args'\]\[0\]\.?", "", raw)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"__dict__\['_modules'\]\['([^']+)'\]", r".\1", path)  # diffusers' modules
    return re.sub(r"_modules\['([^']+)'\]", r"\1", path).replace("..", ".").strip(".")


def _in_stack(path: str) -> bool:
    """Whether a module path is in the stack MODEL_SUPPORT_FAULT_STACK names (default: any).

    ``decoder``: the decoder of an encoder-decoder (its path names it); ``encoder``: anything
    else, i.e. the encoder's own compiled graph.
    """
    stack = os.environ.get("MODEL_SUPPORT_FAULT_STACK")
    if stack is None:
        return True
    return ("decoder" in path) == (stack == "decoder")


def _layer_nodes(gm: fx.GraphModule, suffix: str | tuple[str, ...]) -> dict[int, list[fx.Node]]:
    """Nodes per layer whose module path ends with ``layers.<i>.<suffix>...`` (or ``layer``,
    ``block``), for the first of the suffixes the graph has, in the chosen stack."""
    for wanted in (suffix,) if isinstance(suffix, str) else suffix:
        found: dict[int, list[fx.Node]] = {}
        for node in gm.graph.nodes:
            path = _module_path(node)
            if path is None or not _in_stack(path):
                continue
            match = _LAYER_PATH.search(path)
            if match and (match.group(2) == wanted or match.group(2).startswith(wanted + ".")):
                found.setdefault(int(match.group(1)), []).append(node)
        if found:
            return found
    return {}


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


def _output_node(nodes: list[fx.Node]) -> fx.Node:
    """The last tensor-valued operation of a module whose value is used: its output.

    A method such as reshape counts; an in-place copy whose result nobody reads does not (a
    tensor-parallel layer ends with ``out.copy_(all_reduce(out))``: its output is what the
    all-reduce hands to that copy).
    """
    ops = [n for n in nodes if n.op in ("call_function", "call_method", "call_module")]
    tensors = [
        n
        for n in ops
        if n.users and isinstance(n.meta.get("example_value", n.meta.get("val")), torch.Tensor)
    ]
    return (tensors or ops)[-1]


def _noisy_layer(
    scale: float, label: str
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        if not _on_faulty_rank():
            return gm.forward
        layers = _layer_nodes(gm, MLP_OUTPUTS)
        layer = _pick_layer(layers, default_last=True)
        if layer is not None:
            _insert_after(gm, _output_node(layers[layer]), _noise, scale)
        _report(label, layer is not None, f"layer {layer} mlp output")
        return gm.forward

    backend.__name__ = label
    return backend


noise_1pct = _noisy_layer(0.01, "noise_1pct")
noise_5pct = _noisy_layer(0.05, "noise_5pct")
noise_20pct = _noisy_layer(0.20, "noise_20pct")
noise_100pct = _noisy_layer(1.00, "noise_100pct")


class _Steps:
    """Which generation step the compiled forward runs: 0 for the prefill, then 1, 2, ...

    Observes the token embeddings (batch, sequence, hidden) at the start of every forward; a
    forward over more than one position is a prefill and restarts the count, so every generate
    call sees the same steps. Shared by the prefill and the decode graph of one backend.
    """

    def __init__(self) -> None:
        self.step = 0

    def observe(self, embeddings: torch.Tensor) -> torch.Tensor:
        self.step = 0 if embeddings.shape[1] > 1 else self.step + 1
        return embeddings


def _watch_steps(gm: fx.GraphModule, steps: _Steps) -> bool:
    """Insert ``steps.observe`` after the token embedding; False when the graph has none."""
    embeddings = [n for n in gm.graph.nodes if (_module_path(n) or "").endswith("embed_tokens")]
    if not embeddings:
        return False
    _insert_after(gm, _output_node(embeddings), steps.observe)
    return True


@dataclass
class _Window:
    """The batch row (None: all) and decode steps [first, last] (last None: to the end) a timed
    noise fault corrupts."""

    row: int | None
    first: int
    last: int | None


def _timed_noise(
    label: str, scale: float, first_step: int, last_step: int | None, row: int | None
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    """Noise on the last layer's MLP output at decode steps [first_step, last_step], one row or all.

    A one-row, one-step fault can be aimed elsewhere with ``MODEL_SUPPORT_FAULT_ROW_STEP``
    (``row:step``), read when the graph compiles."""
    steps = _Steps()
    window = _Window(row, first_step, last_step)

    def corrupt(x: torch.Tensor) -> torch.Tensor:
        if steps.step < window.first or (window.last is not None and steps.step > window.last):
            return x
        if window.row is None:
            return _noise(x, scale)
        out = x.clone()
        out[window.row] = _noise(x[window.row], scale)
        return out

    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        if not _on_faulty_rank():
            return gm.forward
        aimed = _aimed_row_step()
        if aimed is not None and row is not None and first_step == last_step:
            window.row, window.first = aimed
            window.last = window.first
        layers = _layer_nodes(gm, MLP_OUTPUTS)
        layer = _pick_layer(layers, default_last=True)
        landed = layer is not None and _watch_steps(gm, steps)
        if landed and layer is not None:
            _insert_after(gm, _output_node(layers[layer]), corrupt)
        where = (
            f"steps >= {window.first}"
            if window.row is None
            else f"row {window.row} at step {window.first}"
        )
        _report(label, landed, f"layer {layer} mlp output, {where}")
        return gm.forward

    backend.__name__ = label
    return backend


# The last 8 of 32 positions: a quarter, which a median over positions cannot see.
late_noise_20pct = _timed_noise("late_noise_20pct", 0.20, 24, None, None)
# Batch row 1 at decode step 16 only: one position of one prompt.
one_row_step_noise_20pct = _timed_noise("one_row_step_noise_20pct", 0.20, 16, 16, 1)
one_row_step_noise_100pct = _timed_noise("one_row_step_noise_100pct", 1.00, 16, 16, 1)
one_row_step_noise_300pct = _timed_noise("one_row_step_noise_300pct", 3.00, 16, 16, 1)


def _module_output(gm: fx.GraphModule, suffix: str) -> tuple[int | None, fx.Node | None]:
    """The output node of ``layers.<i>.<suffix>`` in the chosen layer (default: the last)."""
    layers = _layer_nodes(gm, suffix)
    layer = _pick_layer(layers, default_last=True)
    return layer, (_output_node(layers[layer]) if layer is not None else None)


def _scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def _scaled(
    label: str, suffix: str, factor: float
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    """Multiply one module's output in the last layer by ``factor`` (a wrong constant)."""

    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        if not _on_faulty_rank():
            return gm.forward
        layer, node = _module_output(gm, suffix)
        if node is not None:
            _insert_after(gm, node, _scale, factor)
        _report(label, node is not None, f"layer {layer} {suffix} output x{factor:g}")
        return gm.forward

    backend.__name__ = label
    return backend


# A norm weight read with the wrong convention (Gemma's 1 + w), 10% off: the attention's inputs
# are scaled. (Scaling a projection's output instead is invisible where a norm follows it.)
scale_norm_10pct = _scaled("scale_norm_10pct", "input_layernorm", 1.10)


FINAL_NORMS = ("model.norm", "model.final_layernorm", "model.decoder.final_layer_norm")


def final_norm_noise_30pct(
    gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]
) -> CompiledFn:
    """Noise of 30% of its spread on the final norm's output (a plain scaling would only scale
    the logits, leaving every token and its rank as they were)."""
    if not _on_faulty_rank():
        return gm.forward
    nodes = [n for n in gm.graph.nodes if _module_path(n) in FINAL_NORMS]
    if nodes:
        _insert_after(gm, _output_node(nodes), _noise, 0.30)
    _report("final_norm_noise_30pct", bool(nodes), "the final norm's output, 30% noise")
    return gm.forward


def _lm_head(gm: fx.GraphModule) -> fx.Node | None:
    """The output of the language-model head (``lm_head``; Whisper's is ``proj_out``)."""
    nodes = [
        n
        for n in gm.graph.nodes
        if (_module_path(n) or "").endswith("lm_head") or _module_path(n) == "proj_out"
    ]
    return _output_node(nodes) if nodes else None


TAIL_FROM = 64  # tokens ranked below this at a position form the tail
TAIL_BIAS = 1.0  # nats added to every tail logit: the top tokens' log-probs barely move
RARE_BIAS = 6.0  # nats added to one rare token: its probability stays negligible


def _bias_tail(logits: torch.Tensor) -> torch.Tensor:
    threshold = torch.topk(logits, TAIL_FROM, dim=-1).values[..., -1:]
    return torch.where(logits < threshold, logits + TAIL_BIAS, logits)


def vocab_tail_bias(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Raise every logit outside each position's top TAIL_FROM tokens by TAIL_BIAS nats."""
    if not _on_faulty_rank():
        return gm.forward
    node = _lm_head(gm)
    if node is not None:
        _insert_after(gm, node, _bias_tail)
    _report("vocab_tail_bias", node is not None, f"lm_head, below the top {TAIL_FROM}")
    return gm.forward


def _rare_token_bias() -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    chosen: list[int] = []  # shared by the prefill and the decode graph

    def bias(logits: torch.Tensor) -> torch.Tensor:
        if not chosen:
            chosen.append(int(torch.argmin(logits.reshape(-1, logits.shape[-1])[-1])))
        out = logits.clone()
        out[..., chosen[0]] += RARE_BIAS
        return out

    def rare_token_bias(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        """Raise one rare token's logit (the lowest at the first call) by RARE_BIAS nats."""
        if not _on_faulty_rank():
            return gm.forward
        node = _lm_head(gm)
        if node is not None:
            _insert_after(gm, node, bias)
        _report("rare_token_bias", node is not None, "lm_head, one rare token")
        return gm.forward

    return rare_token_bias


rare_token_bias = _rare_token_bias()


def _bf16_round(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype) if x.is_floating_point() else x


def bf16_logits(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Round the logits to bfloat16 (a float32 run whose output stage is bf16): benign noise."""
    node = _lm_head(gm)
    if node is not None:
        _insert_after(gm, node, _bf16_round)
    _report("bf16_logits", node is not None, "lm_head output")
    return gm.forward


def _tf32_round(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to TF32 (10 mantissa bits), to nearest."""
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF  # add half of the dropped 13 bits, then drop them
    return rounded.view(torch.float32)


# Operands of these ops are what a matrix engine reads (activations and weights alike).
_MATMUL_OPERANDS: dict[Any, tuple[int, ...]] = {
    torch._C._nn.linear: (0, 1),
    torch.matmul: (0, 1),
    torch.bmm: (0, 1),
    torch.mm: (0, 1),
    torch.baddbmm: (1, 2),
    torch.addmm: (1, 2),
    torch._C._nn.scaled_dot_product_attention: (0, 1, 2),
}
if hasattr(torch, "_grouped_mm"):
    _MATMUL_OPERANDS[torch._grouped_mm] = (0, 1)


def _rounded_matmuls(
    label: str, rounding: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    """Round the operands of every matmul in the graph; products and sums stay float32."""

    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        count = 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            operands = _MATMUL_OPERANDS.get(node.target)
            if operands is None and node.target is operator.matmul:
                operands = (0, 1)
            if operands is None:
                continue
            for index in operands:
                if index < len(node.args) and isinstance(node.args[index], fx.Node):
                    with gm.graph.inserting_before(node):
                        rounded = gm.graph.call_function(rounding, (node.args[index],))
                    node.update_arg(index, rounded)
            count += 1
        gm.recompile()
        _report(label, count > 0, f"{count} matmuls")
        return gm.forward

    backend.__name__ = label
    return backend


def _promote(value: Any, wide: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(wide)
    return value


def _wide_op(op: Callable[..., Any], wide: torch.dtype) -> Callable[..., Any]:
    """``op`` computed on ``wide`` copies of its floating operands, its result rounded back to
    the dtype of its first floating operand (a more exact matrix engine)."""

    def in_wide(*args: Any, **kwargs: Any) -> Any:
        floating = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        result = op(
            *[_promote(a, wide) for a in args],
            **{key: _promote(value, wide) for key, value in kwargs.items()},
        )
        if isinstance(result, torch.Tensor) and floating:
            return result.to(floating[0].dtype)
        return result

    in_wide.__name__ = f"{wide}_{getattr(op, '__name__', 'op')}".replace("torch.", "")
    return in_wide


def float64_recompute(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """A benign backend more exact than any device: every matmul of the graph computes in
    float64 (a grouped matmul, which has no float64 kernel, in float32), its result rounded to
    the dtype it would have had."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if "grouped_mm" in str(node.target):
            node.target = _wide_op(node.target, torch.float32)
        elif node.target in _MATMUL_OPERANDS or node.target is operator.matmul:
            node.target = _wide_op(node.target, torch.float64)
        else:
            continue
        count += 1
    gm.recompile()
    _report("float64_recompute", count > 0, f"{count} matmuls")
    return gm.forward


tf32_matmuls = _rounded_matmuls("tf32_matmuls", _tf32_round)
bf16_matmuls = _rounded_matmuls("bf16_matmuls", _bf16_round)


ROUTER_TIE = 0.01  # router-logit gap below which a bf16 device may pick either expert


ROUTER_FLIPS_ENV = "MODEL_SUPPORT_FAULT_ROUTER_FLIPS"
"""``row:step,...``: the batch rows and decode steps where ``router_flip`` flips (see there)."""


FAULT_ROW_STEP_ENV = "MODEL_SUPPORT_FAULT_ROW_STEP"
"""``row:step``: where a one-row, one-step noise fault (``one_row_step_noise_*``) lands."""


def _row_step_pairs(env: str, value: str | None = None) -> set[tuple[int, int]] | None:
    """The (batch row, decode step) pairs in ``value`` (default: the variable ``env``), or None
    when it is unset: ``row:step`` pairs separated by commas, e.g. ``1:16,0:7``. Decode step s
    computes generated position s; the prefill (step 0) is never a target."""
    value = os.environ.get(env) if value is None else value
    if value is None:
        return None
    targets = set()
    pairs = [part.strip() for part in value.split(",") if part.strip()]
    for pair in pairs:
        row, sep, step = pair.partition(":")
        if not (sep and row.isdigit() and step.isdigit() and int(step) > 0):
            raise ValueError(
                f"{env}={value!r}: each target is ROW:STEP with a decode step of at least 1 "
                f"(the prefill is never a target), e.g. 1:16; {pair!r} is not"
            )
        targets.add((int(row), int(step)))
    return targets


def _aimed_row_step() -> tuple[int, int] | None:
    """The one (batch row, decode step) ``MODEL_SUPPORT_FAULT_ROW_STEP`` aims a one-row,
    one-step fault at, or None when it is unset."""
    targets = _row_step_pairs(FAULT_ROW_STEP_ENV)
    if targets is None:
        return None
    if len(targets) != 1:
        value = os.environ[FAULT_ROW_STEP_ENV]
        raise ValueError(f"{FAULT_ROW_STEP_ENV}={value!r}: give exactly one ROW:STEP, e.g. 1:16")
    (target,) = targets
    return target


def router_flip_targets(value: str | None = None) -> set[tuple[int, int]] | None:
    """The (batch row, decode step) pairs ``router_flip`` is aimed at, or None when not aimed.

    Read from ``MODEL_SUPPORT_FAULT_ROUTER_FLIPS`` unless ``value`` is given, e.g. ``1:16,0:7``,
    so a test can aim at positions whose reference routing the verdict calls tied.
    """
    return _row_step_pairs(ROUTER_FLIPS_ENV, value)


def router_flip(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Where one MoE layer's router is nearly tied at the top-k boundary, pick the other expert.

    Benign: a correct reduced-precision run does this where rounding reverses a near-tie. In
    the last MoE layer by default (``MODEL_SUPPORT_FAULT_LAYER`` chooses another). Aimed with
    ``MODEL_SUPPORT_FAULT_ROUTER_FLIPS`` (see router_flip_targets), it swaps the k-th and
    (k+1)-th experts at exactly those rows and steps; otherwise at most two decode tokens per
    generation are flipped, the first whose gap in the device's own logits is below ROUTER_TIE.
    """
    targets = router_flip_targets()
    layers = _layer_nodes(gm, "mlp.gate") or _layer_nodes(gm, "block_sparse_moe.gate")
    layer = _pick_layer(layers, default_last=True)
    steps = _Steps()
    flips: list[int] = []
    if layer is None or not _watch_steps(gm, steps):
        _report("router_flip", False, "no router")
        return gm.forward
    topk = next((n for n in layers[layer] if n.target is torch.topk), None)
    k_arg = topk.args[1] if topk is not None and len(topk.args) > 1 else 2
    k = k_arg if isinstance(k_arg, int) else 2

    def flip(logits: torch.Tensor) -> torch.Tensor:
        if steps.step == 0:
            flips.clear()  # a new generation: its prefill is never touched
            return logits
        ordered = torch.sort(logits.float(), dim=-1, descending=True)
        if targets is not None:
            chosen = [row for row, step in sorted(targets) if step == steps.step]
        elif len(flips) >= 2:
            return logits
        else:
            gaps = ordered.values[:, k - 1] - ordered.values[:, k]
            chosen = torch.nonzero(gaps < ROUTER_TIE).flatten().tolist()[: 2 - len(flips)]
        out = logits.clone()
        for token in chosen:
            inside, outside = ordered.indices[token, k - 1], ordered.indices[token, k]
            out[token, inside], out[token, outside] = logits[token, outside], logits[token, inside]
            flips.append(steps.step)
            print(f"[fault] router_flip: step {steps.step} token {token}", file=sys.stderr)
        return out

    router_logits = next(n for n in layers[layer] if n.op == "call_function")
    _insert_after(gm, router_logits, flip)
    _report("router_flip", True, f"layer {layer} router (top-{k})")
    return gm.forward


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
    layers = _layer_nodes(gm, ATTENTION_OUTPUTS)
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


FAULTY_EXPERT_ENV = "MODEL_SUPPORT_FAULT_EXPERT"  # the expert one_expert_scaled corrupts
FAULTY_EXPERT = 0


def _scale_one_group(out: torch.Tensor, offsets: torch.Tensor, group: int) -> torch.Tensor:
    """Rows of one group of a grouped matmul's output (tokens sorted by expert; ``offsets``:
    the cumulative row count per expert) scaled by 1.5."""
    start = int(offsets[group - 1]) if group > 0 else 0
    scaled = out.clone()
    scaled[start : int(offsets[group])] *= 1.5
    return scaled


def _expert_scaled(
    label: str, decode_only: bool
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    """One expert's output 1.5x too large in one MoE layer (default: the last), the others
    right: a miscompiled slice of the grouped matmul, seen only in tokens routed to it; with
    ``decode_only``, only where the experts compute a decode step's tokens (_decode_shaped).

    The expert is ``MODEL_SUPPORT_FAULT_EXPERT`` (default 0). Experts run as transformers'
    grouped matmul (``grouped_mm_fallback``, tokens sorted by expert): the second of each pair
    of calls in the layer's experts is the down projection, whose rows of that expert are scaled.
    """

    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        if not _on_faulty_rank():
            return gm.forward
        expert = int(os.environ.get(FAULTY_EXPERT_ENV, FAULTY_EXPERT))
        layers = _layer_nodes(gm, ("mlp.experts", "block_sparse_moe.experts"))
        layer = _pick_layer(layers, default_last=True)
        nodes = layers[layer] if layer is not None else []
        grouped = [n for n in nodes if n.op == "call_function" and "grouped_mm" in str(n.target)]
        if decode_only and grouped and not _decode_shaped(_output_node(nodes)):
            grouped = []
        # Every call of the layer's experts in the graph is miscompiled alike: each is a
        # gate/up then a down projection.
        for down in grouped[1::2]:
            offsets = down.kwargs.get("offs", down.args[2] if len(down.args) > 2 else None)
            _insert_after(gm, down, _scale_one_group, offsets, expert)
        _report(label, bool(grouped), f"layer {layer} expert {expert} output x1.5")
        return gm.forward

    backend.__name__ = label
    return backend


one_expert_scaled = _expert_scaled("one_expert_scaled", decode_only=False)


# ---- decode-shaped graphs only: one token per sequence
#
# A decode step compiles a graph of its own (one query token per sequence against the filled
# static cache), and compiler bugs that show only there are common: a kernel chosen for
# one-row shapes, the cache update, attention over a long cache. These faults corrupt a module
# only in such graphs: the prefill, and every graph the search compiles on the whole sequence
# at once, compute correctly.

DECODE_ROWS = 4
"""Flattened tokens (tokens, features), as an experts module gets them, count as a decode
step's when there are at most this many: one token for each of up to 4 sequences (the suite
batches 3 prompts; a prompt with its generated tokens, or a batch's prefill, is longer)."""


def _decode_shaped(node: fx.Node) -> bool:
    """Whether a module's output holds one token per sequence, as in a decode step: (batch, 1,
    features), or flattened tokens (tokens, features) of at most DECODE_ROWS rows."""
    value = node.meta.get("example_value", node.meta.get("val"))
    if not isinstance(value, torch.Tensor):
        return False
    if value.dim() >= 3:
        return value.shape[-2] == 1
    return value.dim() == 2 and value.shape[0] <= DECODE_ROWS


def decode_noise_100pct(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Noise of 100% of the spread on one layer's MLP output (as ``noise_100pct``), only where
    that output holds one token per sequence: every decode step, from the first, is wrong; the
    prefill is right."""
    if not _on_faulty_rank():
        return gm.forward
    layers = _layer_nodes(gm, MLP_OUTPUTS)
    layer = _pick_layer(layers, default_last=True)
    node = _output_node(layers[layer]) if layer is not None else None
    landed = node is not None and _decode_shaped(node)
    if landed and node is not None:
        _insert_after(gm, node, _noise, 1.0)
    _report("decode_noise_100pct", landed, f"layer {layer} mlp output, one token per sequence")
    return gm.forward


# One expert's output 1.5x, only where the experts compute a decode step's tokens.
decode_expert_scaled = _expert_scaled("decode_expert_scaled", decode_only=True)


CACHE_POSITION_ENV = "MODEL_SUPPORT_FAULT_CACHE_POSITION"
"""The first static-cache position whose keys and values ``cache_write_noise`` corrupts."""
CACHE_POSITION = 16


def _cache_writes(gm: fx.GraphModule) -> dict[int, list[fx.Node]]:
    """Per layer, the graph's writes into a self-attention's static cache (``index_copy_`` of
    the new keys or values into the cache's tensor), in the chosen stack."""
    writes: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        is_write = (node.op == "call_method" and node.target == "index_copy_") or (
            node.op == "call_function" and node.target is torch.Tensor.index_copy_
        )
        path = _module_path(node) or ""
        match = _LAYER_PATH.search(path)
        # Self-attention only: a cross-attention's cache is written once, with every
        # position of the encoder's output.
        if is_write and match and "self" in path.lower() and _in_stack(path):
            writes.setdefault(int(match.group(1)), []).append(node)
    return writes


def _noise_from(source: torch.Tensor, positions: torch.Tensor, first: int) -> torch.Tensor:
    """``source`` (batch, heads, tokens, head_dim), written at cache ``positions``: its tokens
    written at ``first`` or later replaced by 100% noise."""
    late = positions.reshape(-1) >= first
    if not bool(late.any()):
        return source
    return torch.where(late.view(1, 1, -1, 1), _noise(source, 1.0), source)


def cache_write_noise(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """The keys and values one layer's self-attention writes into its static cache at position
    ``MODEL_SUPPORT_FAULT_CACHE_POSITION`` (default 16) or later are 100% noise: a cache write
    miscompiled once the cache is longer than a tile. The decode step that writes that position
    is the first to go wrong (it attends to what it wrote), at a step the test chooses: for a
    decoder-only model, position prompt length + step - 1 (left-padded batch)."""
    if not _on_faulty_rank():
        return gm.forward
    first = int(os.environ.get(CACHE_POSITION_ENV, CACHE_POSITION))
    writes = _cache_writes(gm)
    layer = _pick_layer(writes, default_last=True)
    for write in writes.get(layer, []) if layer is not None else []:
        source = write.args[3]
        with gm.graph.inserting_before(write):
            noisy = gm.graph.call_function(_noise_from, (source, write.args[2], first))
        write.update_arg(3, noisy)
    if layer is not None:
        gm.recompile()
    _report("cache_write_noise", layer is not None, f"layer {layer} cache writes from {first}")
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


def kill_worker_in_search(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Miscompile as ``noise_100pct`` does (the run FAILs), and SIGKILL this process when it
    is the faulty rank (default 1) and compiles a level of the FAIL's localization (run.py's
    ``run_level`` is on the stack): a worker dying during the search, after the verdict."""
    import inspect

    if _on_faulty_rank(default="1") and any(f.function == "run_level" for f in inspect.stack()):
        print("[fault] kill_worker_in_search: killing this worker", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return noise_100pct(gm, example_inputs)


def hang_worker(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Never return when this is the faulty rank (default 1): a worker stuck mid-run."""
    if _on_faulty_rank(default="1"):
        print("[fault] hang_worker: this worker stops answering", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    return gm.forward


# ---- inputs of a batch: one row wrong


def _row_noise(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    out[ROW] = _noise(x[ROW], 1.0)
    return out


ROW = 1  # the batch row (input) row_noise_100pct corrupts


def row_noise_100pct(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Noise of 100% of the spread on one batch row of the last layer's MLP output, at every
    call: one input of the batch (a sentence, an image) wrong, the others right."""
    if not _on_faulty_rank():
        return gm.forward
    layers = _layer_nodes(gm, MLP_OUTPUTS)
    layer = _pick_layer(layers, default_last=True)
    if layer is not None:
        _insert_after(gm, _output_node(layers[layer]), _row_noise)
    _report("row_noise_100pct", layer is not None, f"layer {layer} mlp output, row {ROW}")
    return gm.forward


def _classifier_head(gm: fx.GraphModule) -> fx.Node | None:
    """The output of a sequence or image classifier's head (``classifier``)."""
    nodes = [n for n in gm.graph.nodes if (_module_path(n) or "").endswith("classifier")]
    return _output_node(nodes) if nodes else None


def _negate_row(logits: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    out[ROW] = -logits[ROW]
    return out


def row_logits_negated(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """A sign error in a classifier head's output for one batch row (ROW): that input's
    prediction becomes the class the reference finds least likely, whatever the weights, while
    every other input's prediction is untouched."""
    if not _on_faulty_rank():
        return gm.forward
    node = _classifier_head(gm)
    if node is not None:
        _insert_after(gm, node, _negate_row)
    _report("row_logits_negated", node is not None, f"classifier head, row {ROW}")
    return gm.forward


# ---- denoisers (diffusers UNet / transformer): the timestep, one step, one block

TIMESTEP_SHIFT = 250  # one step of a 4-step schedule over 1000 training timesteps
STALE_STEP = 2  # the denoising step (from 0) at which stale_step repeats the previous output


def _module_nodes(gm: fx.GraphModule, pattern: str) -> list[fx.Node]:
    """Nodes whose module path matches ``pattern`` (a regular expression, searched)."""
    regex = re.compile(pattern)
    return [n for n in gm.graph.nodes if regex.search(_module_path(n) or "")]


def _timestep_input(gm: fx.GraphModule) -> tuple[fx.Node, fx.Node] | None:
    """(the first node of the time-embedding projection, the timestep tensor it reads).

    The timestep is computed outside the projection, or is a graph input: where time_proj is
    compiled on its own (localization), its input placeholder carries time_proj's module path.
    """
    inside = [n for n in _module_nodes(gm, r"(^|\.)time_proj$") if n.op != "placeholder"]
    members = set(inside)
    for node in inside:
        for arg in node.args:
            if isinstance(arg, fx.Node) and arg not in members:
                return node, arg
    return None


def _shift_timestep(t: torch.Tensor) -> torch.Tensor:
    return (t - TIMESTEP_SHIFT).clamp_min(0)


def wrong_timestep(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Embed the timestep of the next step (TIMESTEP_SHIFT earlier) in the denoiser: every step
    denoises as if it were one scheduler step later."""
    found = _timestep_input(gm)
    if found is not None:
        user, timestep = found
        with gm.graph.inserting_before(user):
            shifted = gm.graph.call_function(_shift_timestep, (timestep,))
        user.replace_input_with(timestep, shifted)
        gm.recompile()
    _report("wrong_timestep", found is not None, f"time_proj input - {TIMESTEP_SHIFT}")
    return gm.forward


class _DenoisingSteps:
    """Which denoising step the compiled denoiser runs: restarts when the timestep rises."""

    def __init__(self) -> None:
        self.step = -1
        self.last: float | None = None
        self.previous: torch.Tensor | None = None

    def observe(self, t: torch.Tensor) -> torch.Tensor:
        value = float(t.reshape(-1)[0])
        self.step = 0 if self.last is None or value >= self.last else self.step + 1
        self.last = value
        return t

    def stale(self, x: torch.Tensor) -> torch.Tensor:
        if self.step == STALE_STEP and self.previous is not None:
            return self.previous
        self.previous = x.clone()
        return x


def stale_step(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """At denoising step STALE_STEP return the previous step's prediction (a reused buffer)."""
    steps = _DenoisingSteps()
    found = _timestep_input(gm)
    out = _module_nodes(gm, r"^conv_out$") or _module_nodes(gm, r"^proj_out$")
    if found is not None and out:
        user, timestep = found
        with gm.graph.inserting_before(user):
            observed = gm.graph.call_function(steps.observe, (timestep,))
        user.replace_input_with(timestep, observed)
        _insert_after(gm, _output_node(out), steps.stale)
    _report("stale_step", found is not None and bool(out), f"output at step {STALE_STEP}")
    return gm.forward


def _denoiser_noise(
    label: str, pattern: str, scale: float, where: str
) -> Callable[[fx.GraphModule, Sequence[torch.Tensor]], CompiledFn]:
    """Noise of ``scale`` x the spread on the output of the denoiser's blocks matching ``pattern``."""

    def backend(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
        nodes = _module_nodes(gm, pattern)
        if nodes:
            _insert_after(gm, _output_node(nodes), _noise, scale)
        _report(label, bool(nodes), where)
        return gm.forward

    backend.__name__ = label
    return backend


denoiser_noise_20pct = _denoiser_noise(
    "denoiser_noise_20pct", r"^mid_block(\.|$)", 0.20, "mid_block output"
)
denoiser_noise_100pct = _denoiser_noise(
    "denoiser_noise_100pct", r"^mid_block(\.|$)", 1.00, "mid_block output"
)
denoiser_last_block_noise_20pct = _denoiser_noise(
    "denoiser_last_block_noise_20pct",
    r"^up_blocks\.\d+\.attentions\.\d+(\.|$)",
    0.20,
    "last up block's last attention output",
)


def denoiser_zero_head(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """Zero head 0 at the input of the last self-attention output projection (attn1.to_out.0)."""
    nodes = _module_nodes(gm, r"attn1\.to_out\.0$")
    linear = next((n for n in reversed(nodes) if n.op == "call_function"), None)
    if linear is not None:
        attn_output = linear.args[0]
        assert isinstance(attn_output, fx.Node)
        with gm.graph.inserting_before(linear):
            zeroed = gm.graph.call_function(_zero_slice, (attn_output, _head_dim(attn_output)))
        linear.replace_input_with(attn_output, zeroed)
        gm.recompile()
    where = _module_path(linear) if linear is not None else None
    _report("denoiser_zero_head", linear is not None, f"{where} head 0")
    return gm.forward


class InjectedCompilerError(RuntimeError):
    """What ``moe_crash_compiler`` raises: a compiler crashing on a graph it cannot lower."""


def _routers(gm: fx.GraphModule) -> dict[int, list[fx.Node]]:
    """The mixture-of-experts routers of a graph, by layer (none in a dense model)."""
    return _layer_nodes(gm, "mlp.gate") or _layer_nodes(gm, "block_sparse_moe.gate")


def moe_crash_compiler(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """One release of a compiler, as the demo shows it: a graph with mixture-of-experts
    routing fails to compile (ERROR, class compile); any other graph runs as captured (PASS)."""
    routers = _routers(gm)
    if routers:
        raise InjectedCompilerError(
            f"moe_crash_compiler cannot lower the expert routing of layer {min(routers)} "
            "(an injected compiler failure)"
        )
    return benign(gm, example_inputs)


def dense_miscompiler(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> CompiledFn:
    """The next release, as the demo shows it: the routing crash of ``moe_crash_compiler`` is
    fixed (mixture-of-experts graphs run as captured: PASS), but any other graph is
    miscompiled the way ``noise_100pct`` does it (the verdict FAILs it): one regression and
    one fix between the two releases."""
    if _routers(gm):
        return benign(gm, example_inputs)
    return noise_100pct(gm, example_inputs)
