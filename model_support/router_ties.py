"""The verdict's definition of a nearly tied mixture-of-experts router, copied from run.py.

run.py stands alone (it cannot import this package), and the package does not import run.py:
what the fixture builds measure of a mixture of experts (``model_support.fixture_quality``:
whether its routing has near-ties on the default prompts, which a correct bfloat16 run may
flip) uses these copies of run.py's functions, and ``tests/test_standalone_copies.py`` holds
each to run.py's source, byte for byte. Importing this module imports torch.
"""

from __future__ import annotations

import contextlib

import torch


def moe_routers(model) -> list:
    """Every mixture-of-experts router of ``model`` as (MoE block name, router module, top_k),
    in module order (the layers' order): the ``gate`` or ``router`` child of a module that has
    ``experts`` (the layout of transformers' MoE blocks)."""
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    default_k = getattr(text_config, "num_experts_per_tok", None)
    found = []
    for name, module in model.named_modules():
        router = getattr(module, "gate", None)
        if not isinstance(router, torch.nn.Module):
            router = getattr(module, "router", None)
        if not hasattr(module, "experts") or not isinstance(router, torch.nn.Module):
            continue
        top_k = getattr(router, "top_k", None) or getattr(module, "top_k", None) or default_k
        if top_k:
            found.append((name, router, int(top_k)))
    return found


@contextlib.contextmanager
def observe_routers(model):
    """Collect every mixture-of-experts router's logits of a forward pass, by module name.

    A router is the ``gate`` or ``router`` child of a module that has ``experts`` (the layout of
    transformers' MoE blocks). Its logits are recomputed from its input where it is a linear
    router (some return only scores), else taken from its output. Yields {name: (logits, top_k)}.
    """

    seen: dict = {}
    handles = []

    def hook_for(name: str, top_k: int):
        def hook(router, inputs, output):
            weight = getattr(router, "weight", None)
            logits = None
            if (
                isinstance(weight, torch.Tensor)
                and weight.dim() == 2
                and inputs
                and isinstance(inputs[0], torch.Tensor)
                and inputs[0].shape[-1] == weight.shape[1]
            ):
                flat = inputs[0].reshape(-1, weight.shape[1])
                logits = torch.nn.functional.linear(flat, weight, getattr(router, "bias", None))
            else:
                for item in output if isinstance(output, (tuple, list)) else (output,):
                    if isinstance(item, torch.Tensor) and item.is_floating_point():
                        logits = item
                        break
            if logits is not None and logits.shape[-1] > top_k:
                seen[name] = (logits.detach().reshape(-1, logits.shape[-1]).double(), top_k)

        return hook

    for name, router, top_k in moe_routers(model):
        handles.append(router.register_forward_hook(hook_for(name, top_k)))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def router_gap_and_noise(logits, top_k: int, baseline_logits):
    """Per position, a reference router's gap between its k-th and (k+1)-th expert logits, and
    the baseline's largest router-logit deviation from it (what router_tie_mask compares)."""
    ordered = torch.sort(logits, dim=-1, descending=True).values
    gap = ordered[:, top_k - 1] - ordered[:, top_k]
    return gap, torch.max(torch.abs(baseline_logits - logits), dim=-1).values


def router_tie_mask(gaps, noise, params: dict):
    """Which (position, MoE layer) router decisions were nearly tied in the reference.

    ``gaps`` is the reference router's gap between its k-th and (k+1)-th expert logits and
    ``noise`` the baseline's router-logit deviation (both positions x layers, as score_reference
    returns them): a decision is tied when its gap is within ``router_tie_multiple`` x that
    deviation, and at least ``router_tie_floor``.
    """
    allowed = torch.clamp(params["router_tie_multiple"] * noise, min=params["router_tie_floor"])
    return gaps <= allowed
