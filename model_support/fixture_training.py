"""How the tiny demo checkpoints are trained: the recipe, the tokenizer, the training loop.

Shared by the language models (:mod:`model_support.checkpoints`) and the task families'
builders (:mod:`model_support.task_fixtures`). ``torch``, ``tokenizers`` and ``transformers``
are imported only inside the functions (importing them costs seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
TOKENIZER_VOCAB_SIZE = 1000
TOKENIZER_MAX_LENGTH = 512
"""The tokenizer's ``model_max_length``: the text models' ``max_position_embeddings``."""
INIT_RANGE = 0.02
"""Every tiny model's ``initializer_range``. Training, not a large initializer range, is what
makes these models decisive: with 0.1 instead of 0.02 the same 400 steps of the tiny Llama end
at a higher loss (1.3 against 1.0) and smaller top-2 margins."""


@dataclass(frozen=True)
class TrainingRecipe:
    """How a demo model is trained: AdamW on random windows of the bundled corpus.

    Measured on the tiny Llama (2 cores, about 18 ms a step): 400 steps at 3e-3 end at loss 1.2
    and a median top-2 margin of 1.8 nats on the default prompts; 500 steps at 4e-3 with the
    cosine decay end at 0.6 and 2.7 nats for 25% more time.
    """

    steps: int = 500
    learning_rate: float = 4e-3
    batch_size: int = 16
    sequence_length: int = 64
    seed: int = 0


def train_tokenizer(
    corpus: str, *, image_token: str | None = None, chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (vocab 1000) on the corpus; prompts get a BOS token prepended.

    ``image_token``: a special token added on top (an image-text-to-text model's placeholder),
    with ``chat_template``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([corpus], trainer=trainer)
    bos_id = backend.token_to_id(BOS_TOKEN)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TOKENIZER_MAX_LENGTH,
    )
    if image_token is not None:
        tokenizer.add_special_tokens({"additional_special_tokens": [image_token]})
        tokenizer.chat_template = chat_template
    return tokenizer


def token_stream(tokenizer: PreTrainedTokenizerFast, corpus: str) -> torch.Tensor:
    """The corpus as one token stream, without special tokens."""
    import torch

    # The backend tokenizer directly: the wrapper warns about texts longer than the model.
    ids = tokenizer.backend_tokenizer.encode(corpus, add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.long)


def train(
    network: torch.nn.Module, recipe: TrainingRecipe, loss_of: Callable[[Any], torch.Tensor]
) -> tuple[float, float]:
    """``recipe.steps`` AdamW steps on ``loss_of(generator)``; the mean of the first and of the
    last 10 losses. ``generator``: a torch generator seeded with the recipe's seed, from which
    ``loss_of`` draws its batch. The rate decays along a cosine to 10%: a lower final rate
    settles the weights, which sharpens predictions. The network is left in eval mode."""
    import torch

    optimizer = torch.optim.AdamW(network.parameters(), lr=recipe.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    network.train()
    losses: list[float] = []
    for _ in range(recipe.steps):
        loss = loss_of(generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    network.eval()
    window = min(10, len(losses))
    return sum(losses[:window]) / window, sum(losses[-window:]) / window


def random_span(ids: list[int], low: int, high: int, generator: Any) -> list[int]:
    """A random run of ``ids``, between ``low`` and ``high`` long (at most all of them)."""
    import torch

    length = min(len(ids), int(torch.randint(low, high + 1, (1,), generator=generator)))
    start = int(torch.randint(0, len(ids) - length + 1, (1,), generator=generator))
    return ids[start : start + length]


def pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def with_seed(seed: int, make: Callable[[], Any]) -> Any:
    """Build a network under a private RNG state (deterministic, caller's seed untouched)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()
