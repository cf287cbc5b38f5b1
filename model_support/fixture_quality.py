"""What a correctly trained tiny checkpoint is, checked once, right after training.

Training a demo checkpoint is deterministic on one machine but not across machines: CPU kernels
differ, so the same recipe gives different weights on an Intel and an AMD core. Nothing may
therefore depend on the exact model a machine trained; what the demo and the tests rely on is
written down here as a :class:`QualityBand`, measured by :func:`measure` and checked by the
build (``model_support.checkpoints``), which trains again with the next seed when a model comes
out outside its band, and fails with the figures when none of its seeds gets there.

The measurements are those of a user looking at the model: greedy continuations of the run's
default prompts in float32, how decided each next-token choice is (the top-1/top-2 logit
margin), how much of the continuation is text of the training corpus, whether it knows the
capital of France, and for a mixture of experts whether its routing has near-ties on the
prompts (a correct bfloat16 run may flip there; the verifier's tests aim their router flips
at such positions, found with the verdict's own definition).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NEW_TOKENS = 32
CAPITAL_PROMPT = "The capital of France is"


@dataclass(frozen=True)
class QualityBand:
    """The bounds a trained fixture must meet; part of its recipe (and of its cache key).

    ``median_margin`` bounds the median top-1/top-2 logit margin (nats) over the greedy tokens
    of every prompt, both ends inclusive; ``corpus_trigram_share`` is the least share of the
    first prompt's continuation's word trigrams found in the corpus (None: not checked);
    ``knows_paris``: the capital prompt continues with "Paris"; ``router_ties``: a mixture of
    experts has at least one decode position whose routing the verdict calls tied in bfloat16.
    """

    median_margin: tuple[float, float] = (1.0, math.inf)
    corpus_trigram_share: float | None = 0.5
    knows_paris: bool = True
    router_ties: bool = False
    text_prompts_only: tuple[str, ...] | None = None
    """Prompts to measure instead of the run's defaults (a vision model's language part)."""


DECISIVE_TEXT = QualityBand()
DECIDED = QualityBand(corpus_trigram_share=None, knows_paris=False)
"""Decided predictions only: what the verifier's fault-injection fixtures rely on."""
DECISIVE_MOE = QualityBand(router_ties=True)
DECISIVE_VISION_TEXT = QualityBand(corpus_trigram_share=None, text_prompts_only=(CAPITAL_PROMPT,))
UNDECIDED_TEXT = QualityBand(median_margin=(0.3, 0.8), corpus_trigram_share=None, knows_paris=False)


@dataclass(frozen=True)
class FixtureQuality:
    """What :func:`measure` found in one checkpoint."""

    median_margin: float
    corpus_trigram_share: float | None
    continuations: dict[str, str] = field(default_factory=dict)
    router_tie_positions: int | None = None
    """Decode positions (over all prompts) whose routing is tied in some layer; None: no MoE."""

    def problems(self, band: QualityBand) -> list[str]:
        """Each way this checkpoint falls outside ``band``, in words (empty: inside)."""
        found = []
        low, high = band.median_margin
        if not low <= self.median_margin <= high:
            found.append(
                f"median top-1/top-2 margin {self.median_margin:.3f} nats is outside "
                f"[{low:g}, {high:g}]"
            )
        share = self.corpus_trigram_share
        if band.corpus_trigram_share is not None and (
            share is None or share < band.corpus_trigram_share
        ):
            found.append(
                f"only {share or 0:.3f} of the first continuation's word trigrams are in the "
                f"corpus (at least {band.corpus_trigram_share:g} wanted)"
            )
        if band.knows_paris:
            capital = self.continuations.get(CAPITAL_PROMPT, "")
            if not capital.lstrip().startswith("Paris"):
                found.append(f"{CAPITAL_PROMPT!r} continues with {capital[:40]!r}, not 'Paris'")
        if band.router_ties and not self.router_tie_positions:
            found.append("no decode position has a nearly tied router in bfloat16")
        return found


def corpus_trigram_share(text: str, corpus: str) -> float:
    """Share of the word trigrams of ``text`` that also occur in ``corpus``."""
    words = corpus.split()
    known = set(zip(words, words[1:], words[2:], strict=False))
    mine = list(zip(*(text.split()[i:] for i in range(3)), strict=False))
    if not mine:
        return 0.0
    return sum(t in known for t in mine) / len(mine)


def measure(path: Path, band: QualityBand, corpus: str, *, vision: bool = False) -> FixtureQuality:
    """Load the checkpoint at ``path`` with from_pretrained and measure what ``band`` bounds."""
    import transformers

    from model_support.config import RunConfig

    prompts = list(band.text_prompts_only or RunConfig(model=str(path)).prompts)
    if vision:
        tokenizer = transformers.AutoProcessor.from_pretrained(path).tokenizer
        model = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    margins: list[float] = []
    continuations: dict[str, str] = {}
    for prompt in prompts:
        tokens, step_margins = greedy(model, dict(tokenizer(prompt, return_tensors="pt")))
        margins += step_margins
        continuations[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    first = prompts[0]
    return FixtureQuality(
        median_margin=round(statistics.median(margins), 4),
        corpus_trigram_share=(
            round(corpus_trigram_share(first + continuations[first], corpus), 4)
            if band.corpus_trigram_share is not None
            else None
        ),
        continuations=continuations,
        router_tie_positions=_router_tie_positions(path) if band.router_ties else None,
    )


def greedy(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[list[int], list[float]]:
    """Greedy-generate NEW_TOKENS tokens; return them and the top-2 logit margin at each step."""
    import torch

    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    top2 = torch.stack(out.scores)[:, 0].topk(2, dim=-1).values
    return new, (top2[:, 0] - top2[:, 1]).tolist()


def router_ties(path: Path) -> list[torch.Tensor]:
    """Per prompt, (positions x MoE layers) of the routing the verdict calls tied.

    The run's own steps for a text-generation test with the default config: its default
    prompts batched (left padded) and generated greedily in bfloat16 with a static cache, then
    each prompt with its tokens scored teacher forced in float32 (the reference) and in
    bfloat16 (the baseline); a router decision is tied where ``router_tie_mask`` says so
    (:mod:`model_support.router_ties`: run.py's own definition, copied).
    """
    import torch
    import transformers

    from model_support import router_ties as tie
    from model_support.config import RunConfig

    config = RunConfig(model=str(path))
    params = config.verification.model_dump(mode="json")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, use_safetensors=True
    ).eval()
    batch = tokenizer(config.prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=config.max_new_tokens,
            min_new_tokens=config.max_new_tokens,
            do_sample=False,
            num_beams=1,
            cache_implementation="static",
            pad_token_id=tokenizer.pad_token_id,
        )
    tokens = out[:, batch["input_ids"].shape[1] :]
    del model
    singles = [tokenizer([prompt], return_tensors="pt", padding=True) for prompt in config.prompts]

    def routers_of(network: Any) -> list[dict[str, Any]]:
        """Per prompt, each router's logits (and top-k) at the generated positions."""
        seen_per_prompt = []
        for single, generated in zip(singles, tokens, strict=True):
            prompt_len = single["input_ids"].shape[1]
            ids = torch.cat([single["input_ids"], generated.unsqueeze(0)], dim=1)
            with torch.no_grad(), tie.observe_routers(network) as seen:
                network(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
            rows = slice(prompt_len - 1, prompt_len - 1 + len(generated))
            seen_per_prompt.append({name: (logits[rows], k) for name, (logits, k) in seen.items()})
        return seen_per_prompt

    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, use_safetensors=True
    ).eval()
    names = [name for name, _, _ in tie.moe_routers(reference_model)]
    reference = routers_of(reference_model)
    baseline = routers_of(reference_model.to(torch.bfloat16))
    masks = []
    for ref_seen, base_seen, generated in zip(reference, baseline, tokens, strict=True):
        gaps, noise = [], []
        for name in names:
            if name not in ref_seen:  # a router that never ran is never tied
                gaps.append(torch.full((len(generated),), math.inf, dtype=torch.float64))
                noise.append(torch.zeros(len(generated), dtype=torch.float64))
                continue
            logits, k = ref_seen[name]
            gap, deviation = tie.router_gap_and_noise(logits, k, base_seen[name][0])
            gaps.append(gap)
            noise.append(deviation)
        if not names:
            masks.append(torch.zeros(len(generated), 0, dtype=torch.bool))
            continue
        masks.append(tie.router_tie_mask(torch.stack(gaps, 1), torch.stack(noise, 1), params))
    return masks


def _router_tie_positions(path: Path) -> int:
    # Position 0 comes from the prefill, which a decode-step router flip never reaches.
    return sum(int(mask[1:].any(dim=1).sum()) for mask in router_ties(path))
