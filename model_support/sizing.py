"""Sizing: the fewest cores a model needs for one test, from metadata only.

Inputs are ``config.json`` and the safetensors headers (see :mod:`model_support.hub`); no
weight is ever downloaded. The result is a :class:`Plan` (cores, parallelism, per-core memory
breakdown) or an :class:`Exclusion` with a reason code from
:class:`model_support.vocabulary.ExclusionReason`.

Memory model (per core, for a parallel degree ``d``; with sources in docs/memory-model.md)
----------------------------------------------------------------------------------------
* **weights**: every tensor's element count times the run dtype's width (bf16: 2 bytes).
  Floating-point tensors are counted in the run dtype, whatever they are stored in; integer and
  8-bit float tensors (quantized weights, scales) at their stored width. A tensor is *sharded*
  (counted ``1/d`` on each core) when the parallel plan splits it, otherwise *whole on every
  core*:

  - tensor parallel: the tensor's module matches a key of the model's TP plan
    (``config.base_model_tp_plan``, plus the ``lm_head`` entry of the ``*ForCausalLM`` class's
    plan) whose style splits weights (``colwise*``, ``rowwise*``, ``packed_*``,
    ``embedding_*``, ``moe_tp_experts``); the most specific key wins. Embeddings not in the plan,
    norms, replicated entries (``replicated_with_grad_allreduce``), routers and an unplanned
    lm_head are whole.
  - expert parallel: only expert tensors (a module path containing ``experts``) are split;
    attention, routers, embeddings, norms are whole.

  Checkpoint names are first renamed the way transformers renames them on load (its checkpoint
  conversion mapping, e.g. Mixtral's ``block_sparse_moe.experts.N.w1`` becomes
  ``mlp.experts.gate_up_proj``), so the plan keys match what will actually be sharded.
* **KV cache** (static, for the test's longest sequence): ``layers x 2 x kv_heads x head_dim x
  max_length x batch x dtype bytes`` with ``max_length`` = prompt + new tokens and ``batch`` =
  number of prompts. Under tensor parallel each core holds ``kv_heads / d`` heads when ``d``
  divides the KV heads, else one (heads replicated when ``d`` is a multiple of them); expert
  parallel and a single core hold all of it.
* **workspace**: ``profile.workspace_fraction`` (10 %) of weights + KV cache, for activations,
  logits and compiler scratch.
* **runtime reserve**: ``profile.runtime_reserve_bytes`` (1 GiB on Neuron) per core.

A degree fits when weights + KV + workspace + reserve <= the profile's bytes per core.

Choosing the degree
-------------------
Candidates are 1, 2, 4, 8, 16, ... up to ``min(max_cores, cores per instance)``. Degree 1 is
always valid. A degree ``d > 1`` is valid for tensor parallel when a TP plan exists, the query
heads divide by ``d`` and the KV heads divide by ``d`` (or ``d`` by them); a mixture-of-experts
model without a TP plan may use expert parallel when its expert count divides by ``d``. The
smallest valid degree that fits is chosen. When none fits: ``too-large`` if some degree above
1 was valid, else ``no-parallel-plan``.

Where the metadata comes from
-----------------------------
A model is read once, by :func:`model_support.hub.read_snapshot`, into a
:class:`~model_support.hub.ModelSnapshot` (config, tensor headers, pipeline index, access,
source); every decision after that (:func:`metadata_from_snapshot`, :func:`plan_from_metadata`)
reads the snapshot alone, so tests size a snapshot built in memory without files or a Hub.
Known architectures go through transformers' config class, which resolves defaults and aliases
and gives the parallel plan; that imports torch and the model's code (seconds of CPU). A run
(:func:`size_run`) of a plain text-generation checkpoint whose config.json states every count
sizing reads, and that fits one core (or is given one), is sized from config.json and the
headers alone (:func:`header_metadata`): at one core nothing is split, so the plan is the same.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

from huggingface_hub.errors import StrictDataclassError
from pydantic import BaseModel, ConfigDict, Field

from model_support import hub
from model_support.config import MAX_RUN_CORES, RunConfig
from model_support.hardware import (
    HardwareProfile,
    get_profile,
    instance_max_cores,
    torchneuron_refusal,
)
from model_support.hub import MetadataError, ModelNotFound, ModelSnapshot, TensorSpec
from model_support.vocabulary import (
    GENERATING_TASKS,
    SHARDABLE_TASKS,
    Backend,
    ExclusionReason,
    Parallelism,
    Task,
)

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
# Safetensors dtype codes that are floating point and get cast to the run dtype on load.
_CAST_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_STORED_BYTES: dict[str, int] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
_EXPERT_RE = re.compile(r"(?:^|\.)experts(?:\.|$)")
log = logging.getLogger(__name__)


class ModelMetadata(BaseModel):
    """What sizing needs to know about a model, read from config.json and safetensors headers.

    ``tensors`` use the names transformers gives them after loading (checkpoint renames
    applied); None when the model publishes no safetensors.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    revision: str | None = None
    source: Literal["hub", "local"] = "hub"
    model_type: str | None = None
    architectures: list[str] = Field(default_factory=list)
    task: str | None = None
    needs_remote_code: bool = False
    gated: bool = False
    token_available: bool = False
    access_refused: bool = False
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    num_experts: int = 0
    tp_plan: dict[str, str] | None = None
    tensors: list[TensorSpec] | None = None
    pipeline_class: str | None = Field(
        None, description="A diffusers pipeline's class (model_index.json); None otherwise."
    )
    components: dict[str, str] = Field(
        default_factory=dict, description="A diffusers pipeline's components: name -> class."
    )
    image_tokens: int = Field(
        0, ge=0, description="Tokens one image adds to a prompt (image-text-to-text models)."
    )
    header_only: bool = Field(
        False,
        description="Read from config.json alone (header_metadata): the parallel plan and the "
        "loaded tensor names were not derived, so it sizes one core only.",
    )


class MemoryBreakdown(BaseModel):
    """Bytes held on each core at one degree (see the module docstring for the model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    degree: int
    parallelism: Parallelism
    weights_sharded: int = Field(description="This core's share of the split weights.")
    weights_replicated: int = Field(description="Weights held whole on every core.")
    kv_cache: int
    workspace: int
    runtime_reserve: int
    capacity: int = Field(description="Memory of one core in the profile.")

    @property
    def total(self) -> int:
        """Everything this core holds."""
        return (
            self.weights_sharded
            + self.weights_replicated
            + self.kv_cache
            + self.workspace
            + self.runtime_reserve
        )

    @property
    def headroom(self) -> int:
        """Capacity left over (negative: does not fit)."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        """Whether this degree fits one core's memory."""
        return self.headroom >= 0


class Plan(BaseModel):
    """How to run a model: on how many cores, split how, and the memory each core holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["plan"] = "plan"
    model: str
    revision: str | None
    cores: int
    parallelism: Parallelism
    degree: int
    profile: str
    dtype: str
    batch: int
    max_length: int
    parameters: int
    checkpoint_bytes: int = Field(0, description="Bytes of the safetensors weights as stored.")
    memory: MemoryBreakdown
    total_bytes: int
    headroom_bytes: int
    headroom_fraction: float
    notes: list[str] = Field(default_factory=list)


class Exclusion(BaseModel):
    """Why a model is not run, as a reason code and a sentence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["exclusion"] = "exclusion"
    model: str
    revision: str | None
    reason: ExclusionReason
    message: str
    profile: str | None = None
    closest: MemoryBreakdown | None = Field(
        None, description="For too-large: the memory at the largest valid degree tried."
    )
    needed: MemoryBreakdown | None = Field(
        None,
        description="For too-large: the memory at the fewest cores of this profile's kind that "
        "would hold the model (more than the cores allowed: max_cores, at most one instance); "
        "None when no split of up to MAX_RUN_CORES cores would.",
    )

    @property
    def needed_split(self) -> tuple[int, Parallelism] | None:
        """(cores, parallelism) of :attr:`needed`, for the record; None when not known."""
        return None if self.needed is None else (self.needed.degree, self.needed.parallelism)


# --------------------------------------------------------------------------- pure sizing


def _is_sharding_style(style: str) -> bool:
    return "colwise" in style or "rowwise" in style or style in ("moe_tp_experts", "grouped_gemm")


@functools.lru_cache(maxsize=256)
def _compile_plan(plan: tuple[tuple[str, str], ...]) -> list[tuple[re.Pattern[str], bool]]:
    """Plan keys as regexes matching at module-path boundaries, most specific first."""
    compiled = []
    for key, style in sorted(plan, key=lambda kv: -len(kv[0])):
        body = re.escape(key).replace(r"\*", r"\d+")
        compiled.append((re.compile(rf"(?:^|\.){body}(?:\.|$)"), _is_sharding_style(style)))
    return compiled


def _tp_sharded(name: str, compiled: list[tuple[re.Pattern[str], bool]]) -> bool:
    for pattern, shards in compiled:
        if pattern.search(name):
            return shards
    return False


def _weight_bytes(tensor: TensorSpec, dtype_bytes: int) -> int:
    if tensor.dtype in _CAST_DTYPES:
        return tensor.numel * dtype_bytes
    if tensor.dtype not in _STORED_BYTES:
        raise MetadataError(
            f"tensor {tensor.name} has safetensors dtype {tensor.dtype!r}, which sizing does not know"
        )
    return tensor.numel * _STORED_BYTES[tensor.dtype]


def valid_parallelism(meta: ModelMetadata, degree: int) -> Parallelism | None:
    """How ``meta`` can be split ``degree`` ways, or None when it cannot (see module doc)."""
    if degree == 1:
        return Parallelism.NONE
    if meta.header_only:
        raise ValueError(
            f"the metadata of {meta.model} was read from config.json alone; it sizes one core, "
            "not a split (derive it with metadata_from_config)"
        )
    if meta.task is not None and meta.task not in {t.value for t in SHARDABLE_TASKS}:
        return None  # run.py runs this task on one core
    if meta.tp_plan:
        heads, kv = meta.num_attention_heads, meta.num_key_value_heads
        if heads is None or kv is None or heads % degree != 0:
            return None
        if kv % degree == 0 or degree % kv == 0:
            return Parallelism.TENSOR
        return None
    if meta.num_experts > 0 and meta.num_experts % degree == 0:
        return Parallelism.EXPERT
    return None


def memory_at(
    meta: ModelMetadata,
    profile: HardwareProfile,
    degree: int,
    parallelism: Parallelism,
    *,
    dtype: str = "bfloat16",
    batch: int = 3,
    max_length: int = 160,
) -> MemoryBreakdown:
    """Per-core memory of ``meta`` split ``degree`` ways with ``parallelism``."""
    if meta.tensors is None:
        raise MetadataError(f"{meta.model} has no safetensors tensors to size")
    width = DTYPE_BYTES[dtype]
    compiled = _compile_plan(tuple(sorted((meta.tp_plan or {}).items())))
    sharded = replicated = 0
    for tensor in meta.tensors:
        size = _weight_bytes(tensor, width)
        split = (parallelism is Parallelism.TENSOR and _tp_sharded(tensor.name, compiled)) or (
            parallelism is Parallelism.EXPERT and _EXPERT_RE.search(tensor.name) is not None
        )
        if split:
            sharded += size
        else:
            replicated += size
    kv = _kv_cache_bytes(meta, degree, parallelism, width, batch, max_length)
    own = math.ceil(sharded / degree) + replicated + kv
    return MemoryBreakdown(
        degree=degree,
        parallelism=parallelism,
        weights_sharded=math.ceil(sharded / degree),
        weights_replicated=replicated,
        kv_cache=kv,
        workspace=math.ceil(own * profile.workspace_fraction),
        runtime_reserve=profile.runtime_reserve_bytes,
        capacity=profile.bytes_per_core,
    )


def _kv_cache_bytes(
    meta: ModelMetadata, degree: int, parallelism: Parallelism, width: int, batch: int, length: int
) -> int:
    layers, kv_heads, head_dim = meta.num_hidden_layers, meta.num_key_value_heads, meta.head_dim
    if layers is None or kv_heads is None or head_dim is None:
        return 0
    if meta.task is not None and meta.task not in {t.value for t in GENERATING_TASKS}:
        return 0  # encoders, classifiers and denoisers keep no cache
    heads_here = kv_heads
    if parallelism is Parallelism.TENSOR:
        heads_here = kv_heads // degree if kv_heads % degree == 0 else 1
    return layers * 2 * heads_here * head_dim * length * batch * width


def _degrees(max_cores: int, profile: HardwareProfile) -> list[int]:
    limit = min(max_cores, profile.cores_per_instance)
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _validate_run(dtype: str, batch: int, max_length: int, max_cores: int) -> None:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1 (the number of prompts), got {batch}")
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1 token, got {max_length}")
    if max_cores < 1:
        raise ValueError(f"max_cores must be at least 1, got {max_cores}")


def plan_from_metadata(
    meta: ModelMetadata,
    *,
    profile: HardwareProfile | str = "trn2",
    lnc: int | None = None,
    max_cores: int = 16,
    dtype: str = "bfloat16",
    batch: int = 3,
    max_length: int = 160,
    trust_remote_code: bool = False,
    cores: int | None = None,
    parallelism: Parallelism | None = None,
) -> Plan | Exclusion:
    """Size ``meta`` on ``profile``: the smallest valid degree that fits, or an Exclusion.

    ``cores`` (with ``parallelism``) overrides the degree only: the plan is made at that degree
    (noted when it does not fit), every exclusion other than a size one still applies.
    Pure: reads nothing but its arguments. Raises ValueError for bad arguments.
    """
    _validate_run(dtype, batch, max_length, max_cores)
    hw = profile if isinstance(profile, HardwareProfile) else get_profile(profile, lnc)

    def exclude(reason: ExclusionReason, message: str, **extra: Any) -> Exclusion:
        return Exclusion(
            model=meta.model,
            revision=meta.revision,
            reason=reason,
            message=message,
            profile=hw.name,
            **extra,
        )

    if meta.gated and (meta.access_refused or not meta.token_available):
        if meta.access_refused:
            return exclude(
                ExclusionReason.GATED_WITHOUT_TOKEN,
                f"{meta.model} is gated and the Hub refused the token given; accept the "
                "model's conditions on the Hub with that account or use another token.",
            )
        return exclude(
            ExclusionReason.GATED_WITHOUT_TOKEN,
            f"{meta.model} is a gated repository and no Hub token was given; pass a token "
            "whose account has accepted the model's conditions.",
        )
    if meta.needs_remote_code and not trust_remote_code:
        return exclude(
            ExclusionReason.REMOTE_CODE_REQUIRED,
            f"{meta.model} ({meta.model_type or 'unknown model type'}) is not built into "
            "transformers and its config points at code in the repository (auto_map); it "
            "runs only with trust_remote_code, which this test does not allow.",
        )
    supported = [t.value for t in Task]
    if meta.task not in supported:
        what = f"task {meta.task!r}" if meta.task else "no task that could be determined"
        return exclude(
            ExclusionReason.UNSUPPORTED_TASK,
            f"{meta.model} has {what}; model-support tests {', '.join(supported)}.",
        )
    unsupported = unsupported_architecture(meta)
    if unsupported is not None:
        return exclude(ExclusionReason.UNSUPPORTED_TASK, unsupported)
    if meta.tensors is None:
        return exclude(ExclusionReason.NO_SAFETENSORS, no_safetensors_message(meta.model))

    if cores is not None:
        split = parallelism or (Parallelism.NONE if cores == 1 else Parallelism.TENSOR)
        mem = memory_at(meta, hw, cores, split, dtype=dtype, batch=batch, max_length=max_length)
        plan = _plan(meta, hw, mem, dtype, batch, max_length, max(max_cores, cores))
        if not mem.fits:
            note = (
                f"{cores} core(s) given: sizing expects {_gib(mem.total)} per core of "
                f"{_gib(hw.bytes_per_core)}, so the run may run out of device memory"
            )
            plan = plan.model_copy(update={"notes": [*plan.notes, note]})
        return plan

    degrees = _degrees(max_cores, hw)
    largest_valid: MemoryBreakdown | None = None
    for degree in degrees:
        parallelism = valid_parallelism(meta, degree)
        if parallelism is None:
            continue
        mem = memory_at(
            meta, hw, degree, parallelism, dtype=dtype, batch=batch, max_length=max_length
        )
        if mem.fits:
            return _plan(meta, hw, mem, dtype, batch, max_length, max_cores)
        largest_valid = mem
    assert largest_valid is not None  # degree 1 is always valid
    limit = degrees[-1]
    if largest_valid.degree == 1 and limit > 1:
        return exclude(
            ExclusionReason.NO_PARALLEL_PLAN,
            f"{meta.model} needs {_gib(largest_valid.total)} on one core (capacity "
            f"{_gib(hw.bytes_per_core)}) and cannot be split: {_why_no_split(meta, degrees)}.",
            closest=largest_valid,
        )
    needed = _fewest_cores_beyond(meta, hw, limit, dtype=dtype, batch=batch, max_length=max_length)
    return exclude(
        ExclusionReason.TOO_LARGE,
        f"{meta.model} does not fit {limit} core(s) of {hw.name}: at degree "
        f"{largest_valid.degree} each core needs {_gib(largest_valid.total)} of "
        f"{_gib(hw.bytes_per_core)}.{_would_fit(needed, hw)}",
        closest=largest_valid,
        needed=needed,
    )


def _would_fit(needed: MemoryBreakdown | None, hw: HardwareProfile) -> str:
    """The sentence a too-large exclusion ends with: the cores that would hold the model."""
    if hw.instance == "cpu":
        return ""  # processes share one host's memory: more of them hold no more
    if needed is None:
        return f" No split of up to {MAX_RUN_CORES} cores holds it."
    beyond = (
        f", more than one {hw.instance_type or hw.name} has"
        if needed.degree > hw.cores_per_instance
        else ""
    )
    return f" It would fit {needed.degree} cores ({needed.parallelism.value} parallel){beyond}."


def _fewest_cores_beyond(
    meta: ModelMetadata, hw: HardwareProfile, limit: int, *, dtype: str, batch: int, max_length: int
) -> MemoryBreakdown | None:
    """The memory at the smallest valid degree above ``limit`` (up to MAX_RUN_CORES) that fits
    cores of ``hw``'s kind: how many a too-large model would need; None when none does, and
    on the CPU profile, whose processes share one host's memory."""
    if hw.instance == "cpu":
        return None
    degree = limit * 2
    while degree <= MAX_RUN_CORES:
        parallelism = valid_parallelism(meta, degree)
        if parallelism is not None:
            mem = memory_at(
                meta, hw, degree, parallelism, dtype=dtype, batch=batch, max_length=max_length
            )
            if mem.fits:
                return mem
        degree *= 2
    return None


def no_safetensors_message(model: str) -> str:
    """Why a model without safetensors weights is not run (sizing and ``run --cores`` alike)."""
    return (
        f"{model} publishes no safetensors weights (no model.safetensors or "
        "model.safetensors.index.json); pickle checkpoints are not loaded, since unpickling "
        "can run code."
    )


def _why_no_split(meta: ModelMetadata, degrees: list[int]) -> str:
    if meta.task is not None and meta.task not in {t.value for t in SHARDABLE_TASKS}:
        return f"model-support runs {meta.task} on one core"
    if meta.tp_plan:
        return (
            f"its {meta.num_attention_heads} query / {meta.num_key_value_heads} key-value heads "
            f"do not divide by any degree in {degrees[1:]}"
        )
    if meta.num_experts:
        return f"it has no tensor parallel plan and {meta.num_experts} experts do not divide by {degrees[1:]}"
    return "it has no tensor parallel plan (base_model_tp_plan) and is not a mixture of experts"


def _plan(
    meta: ModelMetadata,
    hw: HardwareProfile,
    mem: MemoryBreakdown,
    dtype: str,
    batch: int,
    max_length: int,
    max_cores: int,
) -> Plan:
    notes = []
    if meta.num_hidden_layers is None or meta.num_key_value_heads is None or meta.head_dim is None:
        notes.append("the config gives no layer/head counts, so the KV cache is not counted")
    if max_cores > hw.cores_per_instance:
        notes.append(f"max cores capped at the {hw.cores_per_instance} cores of one {hw.name}")
    return Plan(
        model=meta.model,
        revision=meta.revision,
        cores=mem.degree,
        parallelism=mem.parallelism,
        degree=mem.degree,
        profile=hw.name,
        dtype=dtype,
        batch=batch,
        max_length=max_length,
        parameters=sum(t.numel for t in meta.tensors or []),
        checkpoint_bytes=sum(t.numel * _STORED_BYTES.get(t.dtype, 4) for t in meta.tensors or []),
        memory=mem,
        total_bytes=mem.total,
        headroom_bytes=mem.headroom,
        headroom_fraction=mem.headroom / mem.capacity,
        notes=notes,
    )


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


# --------------------------------------------------------------------------- metadata


def _first_int(source: Any, *names: str) -> int | None:
    for name in names:
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _task_of(architectures: list[str]) -> str | None:
    """The task transformers' auto classes associate with the config's architectures."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    image_text = set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values())
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for arch in architectures:
        if arch in image_text:
            return Task.IMAGE_TEXT_TO_TEXT.value
        if arch in causal or arch.endswith("ForCausalLM"):
            return Task.TEXT_GENERATION.value
    for arch in architectures:
        for task, (_, classes) in _architecture_tables().items():
            if arch in classes:
                return task
    return None


# ---- tasks beyond text generation: the architectures run.py's loader of each task
# takes, from transformers' auto-class tables. A model outside them is EXCLUDED with reason
# unsupported-task before anything runs (never an ERROR at load time).

_TEXT_ENCODER_TABLES = (
    "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
)
# Model types whose auto class exists but whose code lives in a library the runner lacks.
_NEEDS_OTHER_LIBRARY = {"timm_wrapper": "timm"}


def _architecture_tables() -> dict[str, tuple[set[str], set[str]]]:
    """(model types, architecture classes) per task whose loader is a transformers auto class,
    in the order a local checkpoint's task is recognised (most specific first)."""
    from transformers.models.auto import modeling_auto

    def table(name: str) -> tuple[set[str], set[str]]:
        mapping = getattr(modeling_auto, name)
        classes: set[str] = set()
        for value in mapping.values():
            classes.update([value] if isinstance(value, str) else value)
        return set(mapping), classes

    return {
        Task.TEXT2TEXT_GENERATION.value: table("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
        Task.AUTOMATIC_SPEECH_RECOGNITION.value: table("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
        Task.IMAGE_CLASSIFICATION.value: table("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
        Task.TEXT_CLASSIFICATION.value: table("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
        Task.FEATURE_EXTRACTION.value: table("MODEL_MAPPING_NAMES"),
    }


def _text_encoder_types() -> set[str]:
    """Model types with a text encoder that sentence-transformers can pool (text models)."""
    from transformers.models.auto import modeling_auto

    return {key for name in _TEXT_ENCODER_TABLES for key in getattr(modeling_auto, name)}


def unsupported_architecture(meta: ModelMetadata) -> str | None:
    """Why run.py's loader for ``meta.task`` cannot take this model (None when it can).

    Text generation keeps its own checks (remote code, plans); the other tasks need an
    architecture of their auto class (speech: sequence-to-sequence, not CTC), a text model for
    embeddings, and for text-to-image a diffusers pipeline with a UNet or transformer denoiser.
    """
    task = meta.task
    if task in (Task.TEXT_GENERATION.value, Task.IMAGE_TEXT_TO_TEXT.value, None):
        return None
    what = meta.model_type or "no model_type"
    if task == Task.TEXT_TO_IMAGE.value:
        if meta.pipeline_class is None:
            return (
                f"{meta.model} is tagged text-to-image but holds no diffusers pipeline "
                "(model_index.json); adapters (LoRA) and single-file checkpoints are not tested."
            )
        if not {"unet", "transformer"} & set(meta.components):
            return (
                f"{meta.model} is a {meta.pipeline_class} without a unet or transformer "
                "component: model-support compiles the pipeline's denoiser, and finds none."
            )
        return None
    if meta.model_type in _NEEDS_OTHER_LIBRARY:
        library = _NEEDS_OTHER_LIBRARY[meta.model_type]
        return f"{meta.model} ({what}) needs the {library} library, which the runner does not use."
    if task in (Task.FEATURE_EXTRACTION.value, Task.SENTENCE_SIMILARITY.value):
        if meta.model_type is None or meta.model_type not in _text_encoder_types():
            return (
                f"{meta.model} ({what}) is not a text model: model-support tests {task} "
                "through sentence-transformers over text encoders."
            )
        return None
    model_types, classes = _architecture_tables()[task]
    if any(arch in classes for arch in meta.architectures) or (
        not meta.architectures and meta.model_type in model_types
    ):
        return None
    names = ", ".join(meta.architectures) or what
    if task == Task.AUTOMATIC_SPEECH_RECOGNITION.value:
        return (
            f"{meta.model} ({names}) is not a speech sequence-to-sequence model (Whisper-style); "
            "CTC and other speech models are not tested yet."
        )
    return (
        f"{meta.model} ({names}) has no architecture that {task} loads (transformers' auto class)."
    )


def _loaded_names(model_type: str | None, tensors: list[TensorSpec]) -> list[TensorSpec]:
    """Rename checkpoint tensors as transformers does on load, so TP plan keys match them."""
    if model_type is None:
        return tensors
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    mapping = get_checkpoint_conversion_mapping(model_type) or []
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    if not mapping:
        return tensors
    return [
        TensorSpec(rename_source_key(t.name, renamings, converters)[0], t.dtype, t.shape)
        for t in tensors
    ]


OneCoreCheck = Callable[[ModelMetadata], bool]
"""Whether the caller sizes a model of this metadata at one core (see remembered_metadata)."""

P = ParamSpec("P")
R = TypeVar("R")

_TRANSFORMERS_LOCK = threading.RLock()
"""transformers' lazily loaded modules are not safe to first touch from several threads at once
("cannot import name 'CONFIG_MAPPING'"); the operator sizes from a thread pool."""


def _holding_transformers_lock(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` run under :data:`_TRANSFORMERS_LOCK` (safe to call from several threads)."""

    @functools.wraps(function)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R:
        with _TRANSFORMERS_LOCK:
            return function(*args, **kwargs)

    return locked


@_holding_transformers_lock
def metadata_from_config(
    config: dict[str, Any],
    tensors: list[TensorSpec] | None,
    *,
    model: str,
    revision: str | None = None,
    source: Literal["hub", "local"] = "hub",
    task: str | None = None,
    gated: bool = False,
    token_available: bool = False,
) -> ModelMetadata:
    """Build :class:`ModelMetadata` from a config.json dict and safetensors tensor list.

    Known architectures go through transformers' config class (no weights, no model): it
    resolves attribute aliases, nested text configs and the class-level ``base_model_tp_plan``.
    ``task`` None: the task of the config's architectures. Safe to call from several threads.
    """
    from transformers import CONFIG_MAPPING, AutoConfig

    raw_type = config.get("model_type")
    model_type = raw_type if isinstance(raw_type, str) else None
    architectures = list(config.get("architectures") or [])
    known = model_type is not None and model_type in CONFIG_MAPPING
    tp_plan: dict[str, str] | None = None
    text: Any
    if known and model_type is not None:
        fields = {k: v for k, v in config.items() if k != "model_type"}
        _check_counts(model, config)
        try:
            cfg = AutoConfig.for_model(model_type, **fields)
        except (TypeError, ValueError, ArithmeticError, StrictDataclassError) as e:
            # transformers 5's config classes validate their fields as strict dataclasses
            raise MetadataError(
                f"config.json of {model} is not a valid {model_type} config: {e}"
            ) from e
        text = cfg.get_text_config()
        tp_plan = dict(getattr(text, "base_model_tp_plan", None) or {}) or None
        if tp_plan is not None:
            tp_plan.update(_head_plan(architectures))
    else:
        text = config.get("text_config") or config
        raw_plan = config.get("base_model_tp_plan")
        tp_plan = dict(raw_plan) if isinstance(raw_plan, dict) and raw_plan else None
    heads = _first_int(text, "num_attention_heads", "n_head", "num_heads")
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model")
    head_dim = _first_int(text, "head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    kv_heads = _first_int(text, "num_key_value_heads", "num_kv_heads") or heads
    for name, value in (("attention heads", heads), ("key-value heads", kv_heads)):
        if value is not None and value < 1:
            raise MetadataError(
                f"config.json of {model} gives {value} {name}; a model needs at least one: "
                "fix the config"
            )
    return ModelMetadata(
        image_tokens=_image_tokens(config),
        model=model,
        revision=revision,
        source=source,
        model_type=model_type,
        architectures=architectures,
        task=task if task is not None else _task_of(architectures),
        needs_remote_code=bool(config.get("auto_map")) and not known,
        gated=gated,
        token_available=token_available,
        num_hidden_layers=_first_int(text, "num_hidden_layers", "n_layer", "num_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_experts=_first_int(text, "num_experts", "num_local_experts", "n_routed_experts") or 0,
        tp_plan=tp_plan,
        tensors=_loaded_names(model_type if known else None, tensors) if tensors else tensors,
    )


_COUNT_FIELDS = (
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "hidden_size",
    "head_dim",
    "vocab_size",
)


def _check_counts(model: str, config: dict[str, Any]) -> None:
    """Counts a model cannot have zero (or fewer) of, checked before transformers divides by them."""
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for name in _COUNT_FIELDS:
            value = part.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                raise MetadataError(
                    f"config.json of {model} sets {name} to {value}; it must be a positive "
                    "integer: fix the config"
                )


_HEADER_COUNTS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def header_metadata(
    config: dict[str, Any],
    tensors: list[TensorSpec] | None,
    *,
    model: str,
    revision: str | None = None,
    source: Literal["hub", "local"] = "hub",
    task: str | None = None,
    gated: bool = False,
    token_available: bool = False,
) -> ModelMetadata | None:
    """The metadata of a plain text-generation checkpoint read from config.json alone, or None.

    Deriving metadata through transformers' config class costs seconds of CPU (it imports torch
    and the model's code, for the parallel plan), all of it for splitting the model. A model
    that fits one core is never split, and for it this answer is the same: its weights are the
    safetensors headers' (renaming changes names, not sizes) and its KV cache is counted from
    counts config.json states. So it is given only when the task is text generation, the
    config has no ``auto_map`` (no remote code) and no nested ``text_config``, and it states
    every count sizing reads (layers, query and key-value heads, head_dim) rather than leaving
    one to a config class's default. Counts below one are refused as by the full derivation;
    other checks of the config class (e.g. a field of the wrong type) are left to the run,
    which loads the model with it and records the load error. ``header_only`` marks it: it
    cannot size a split.
    """
    if task != Task.TEXT_GENERATION.value or tensors is None:
        return None
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or config.get("auto_map") or "text_config" in config:
        return None
    if any(_first_int(config, name) is None for name in _HEADER_COUNTS):
        return None
    _check_counts(model, config)
    return ModelMetadata(
        model=model,
        revision=revision,
        source=source,
        model_type=model_type,
        architectures=list(config.get("architectures") or []),
        task=task,
        gated=gated,
        token_available=token_available,
        num_hidden_layers=_first_int(config, "num_hidden_layers"),
        num_attention_heads=_first_int(config, "num_attention_heads"),
        num_key_value_heads=_first_int(config, "num_key_value_heads"),
        head_dim=_first_int(config, "head_dim"),
        num_experts=_first_int(config, "num_experts", "num_local_experts", "n_routed_experts") or 0,
        tensors=tensors,
        image_tokens=_image_tokens(config),
        header_only=True,
    )


def _image_tokens(config: dict[str, Any]) -> int:
    """Tokens one image adds to a prompt: the config's image_seq_length, else one per patch of
    the vision tower (plus its class token); 0 for a text-only model."""
    direct = _first_int(config, "image_seq_length", "mm_tokens_per_image", "num_image_tokens")
    if direct:
        return direct
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        size, patch = _first_int(vision, "image_size"), _first_int(vision, "patch_size")
        if size and patch:
            return (size // patch) ** 2 + 1
    return 0


def _head_plan(architectures: list[str]) -> dict[str, str]:
    """The plan entries of the task head class (e.g. ``lm_head``), which the base plan omits."""
    import transformers

    for arch in architectures:
        cls = getattr(transformers, arch, None)
        plan = getattr(cls, "_tp_plan", None)
        if isinstance(plan, dict):
            return dict(plan)
    return {}


SIZING_CACHE_ENV = "MODEL_SUPPORT_SIZING_CACHE"


def sizing_cache_dir() -> Path:
    """Where sized metadata is remembered: ``$MODEL_SUPPORT_SIZING_CACHE``, else
    ~/.cache/model-support/sizing."""
    configured = os.environ.get(SIZING_CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "model-support" / "sizing"


@functools.cache
def _code_fingerprint() -> str:
    """What :func:`metadata_from_config` depends on besides its arguments: this module's code
    and the installed transformers (its config classes and parallel plans)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(importlib.metadata.version("transformers").encode())
    return digest.hexdigest()


def remembered_metadata(
    config: dict[str, Any],
    tensors: list[TensorSpec] | None,
    *,
    one_core: OneCoreCheck | None = None,
    **kwargs: Any,
) -> ModelMetadata:
    """:func:`metadata_from_config`, remembered on disk by everything its answer depends on.

    ``one_core``: when given and it accepts the :func:`header_metadata` of the checkpoint (the
    caller will size it at one core), that is the answer, derived without transformers.

    Deriving the metadata imports transformers and torch (seconds of CPU, which a speculative
    run started beside sizing also needs); sizing the same checkpoint again with the same
    transformers and the same code reads the answer back instead. The key covers the whole
    config, every tensor's name, dtype and shape, the arguments and the code, so a changed
    checkpoint or upgrade is never answered from an old entry. The cache is optional: an
    unreadable entry is recomputed, an unwritable folder only means nothing is remembered.
    """
    header = _accepted_header(config, tensors, one_core, kwargs)
    if header is not None:
        return header
    material = json.dumps(
        {
            "config": config,
            "tensors": None if tensors is None else [[t.name, t.dtype, t.shape] for t in tensors],
            "arguments": kwargs,
            "code": _code_fingerprint(),
        },
        sort_keys=True,
        default=str,
    )
    path = sizing_cache_dir() / f"{hashlib.sha256(material.encode()).hexdigest()}.json"
    try:
        return ModelMetadata.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:  # damaged entry: derive it again
        log.debug("sizing cache entry %s is unreadable (%s); recomputing", path, exc)
    meta = metadata_from_config(config, tensors, **kwargs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.write_text(meta.model_dump_json(), encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        log.debug("sizing cache %s is not writable (%s); not remembered", path.parent, exc)
    return meta


def metadata_from_snapshot(
    snapshot: ModelSnapshot, *, one_core: OneCoreCheck | None = None, remember: bool = False
) -> ModelMetadata:
    """What sizing needs to know about the model ``snapshot`` read: no files, no Hub.

    A gated model without access, or without weights or config.json to read, keeps only what
    the read found (the plan excludes it); a pipeline gives its components; a checkpoint's
    config.json is derived through transformers' config class, or from the config alone when
    ``one_core`` accepts the :func:`header_metadata`. ``remember``: derive through the disk
    cache of :func:`remembered_metadata` (the same answer, read back when known).
    """
    found: dict[str, Any] = {
        "model": snapshot.model,
        "revision": snapshot.revision,
        "source": snapshot.source,
        "task": snapshot.task,
        "gated": snapshot.gated,
        "token_available": snapshot.token_available,
    }
    if snapshot.access_refused or (snapshot.gated and not snapshot.token_available):
        return ModelMetadata(**found, access_refused=snapshot.access_refused)
    if snapshot.pipeline_index is not None:
        class_name = snapshot.pipeline_index.get("_class_name")
        return ModelMetadata(
            **found,
            pipeline_class=class_name if isinstance(class_name, str) else "DiffusionPipeline",
            components=hub.pipeline_components(snapshot.pipeline_index),
            tensors=snapshot.tensors,
        )
    if snapshot.config is None:
        return ModelMetadata(**found, tensors=snapshot.tensors)
    derive = remembered_metadata if remember else _header_or_full_metadata
    return derive(snapshot.config, snapshot.tensors, one_core=one_core, **found)


def _header_or_full_metadata(
    config: dict[str, Any],
    tensors: list[TensorSpec] | None,
    *,
    one_core: OneCoreCheck | None = None,
    **kwargs: Any,
) -> ModelMetadata:
    """:func:`header_metadata` when ``one_core`` accepts it, else :func:`metadata_from_config`."""
    header = _accepted_header(config, tensors, one_core, kwargs)
    return header if header is not None else metadata_from_config(config, tensors, **kwargs)


def _accepted_header(
    config: dict[str, Any],
    tensors: list[TensorSpec] | None,
    one_core: OneCoreCheck | None,
    arguments: dict[str, Any],
) -> ModelMetadata | None:
    """The :func:`header_metadata` of the checkpoint when ``one_core`` accepts it, else None."""
    if one_core is None:
        return None
    header = header_metadata(config, tensors, **arguments)
    return header if header is not None and one_core(header) else None


def read_metadata(
    model: str,
    revision: str | None = None,
    *,
    task: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    one_core: OneCoreCheck | None = None,
) -> ModelMetadata:
    """Read a model's metadata from a local checkpoint directory or the Hub (no weights): one
    :func:`~model_support.hub.read_snapshot`, then :func:`metadata_from_snapshot`.

    ``model`` is a directory when one exists at that path; otherwise a Hub id. ``one_core``:
    see :func:`remembered_metadata`. Raises MetadataError when the model, revision or its
    config.json cannot be found.
    """
    snapshot = hub.read_snapshot(model, revision, task=task, token=token, endpoint=endpoint)
    return metadata_from_snapshot(snapshot, one_core=one_core, remember=True)


def size_model(
    model: str,
    revision: str | None = None,
    *,
    profile: str = "trn2",
    lnc: int | None = None,
    max_cores: int = 16,
    dtype: str = "bfloat16",
    batch: int = 3,
    max_length: int = 160,
    task: str | None = None,
    token: str | None = None,
    trust_remote_code: bool = False,
    endpoint: str | None = None,
) -> Plan | Exclusion:
    """Size a Hub model (id + revision) or a local checkpoint directory for one test.

    Reads only config.json and safetensors headers. ``max_length`` is the longest sequence
    (prompt + new tokens), ``batch`` the number of prompts. Raises ValueError (MetadataError)
    for bad arguments or a model that cannot be found.
    """
    _validate_run(dtype, batch, max_length, max_cores)
    hw = get_profile(profile, lnc)
    meta = read_metadata(model, revision, task=task, token=token, endpoint=endpoint)
    return plan_from_metadata(
        meta, profile=hw, max_cores=max_cores, dtype=dtype, batch=batch, max_length=max_length,
        trust_remote_code=trust_remote_code,
    )  # fmt: skip


PROMPT_OVERHEAD_TOKENS = 16
"""Special tokens a tokenizer may add around a prompt (BOS, EOS, role markers)."""
CHAT_TEMPLATE_TOKENS = 64
"""Tokens of the chat template run.py wraps an image prompt in."""


def run_shape(config: RunConfig, image_tokens: int = 0) -> tuple[int, int]:
    """(batch, longest sequence) of the run ``config`` describes, as run.py will run it.

    batch = the number of prompts (one batch); the sequence = the longest prompt + the new
    tokens. A prompt's token count is bounded by its UTF-8 bytes (byte-level BPE and
    byte-fallback tokenizers emit at most one token per byte) plus special tokens; an image
    prompt adds the chat template and the image's tokens.
    """
    longest = max(len(p.encode("utf-8")) for p in config.prompts) + PROMPT_OVERHEAD_TOKENS
    if config.task == Task.IMAGE_TEXT_TO_TEXT:
        longest += CHAT_TEMPLATE_TOKENS + image_tokens
    return len(config.prompts), longest + config.max_new_tokens


def size_run(
    config: RunConfig,
    *,
    profile: str = "trn2",
    lnc: int | None = None,
    max_cores: int = 16,
    cores: int | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    instance_type: str | None = None,
) -> Plan | Exclusion:
    """Size the run ``config`` describes: the one entry point of the CLI and the operator.

    Model, revision, task, dtype, prompts and new tokens come from ``config``, so what is sized
    is what runs (:func:`run_shape`). ``cores`` overrides the core count only (with
    ``config.parallelism``): the plan, its parameter count and checkpoint size are still read
    from the model. ``instance_type`` is the EC2 type the test asked for (else the profile's
    kind): a neuron run on an instance TorchNeuron does not support (trn1, inf2) is EXCLUDED
    (unsupported-instance) before the model is read. Raises MetadataError (ModelNotFound)
    when the model cannot be read.
    """
    hw = get_profile(profile, lnc)
    cap = instance_max_cores(instance_type, hw) if instance_type else None
    if cap is not None:
        # A named instance type holds only its own devices (trn2.3xlarge: one, 4 cores at LNC 2).
        if cores is not None and cores > cap:
            raise ValueError(
                f"{cores} cores do not fit one {instance_type}: it has {cap} cores of {hw.name}; "
                "ask for fewer cores or another instance type"
            )
        max_cores = min(max_cores, cap)
    if config.backend == Backend.NEURON and hw.instance not in ("cpu", "cuda"):
        # Refused before the Hub is asked anything: whatever the model, it cannot run there.
        refusal = torchneuron_refusal(instance_type or hw.instance)
        if refusal is not None:
            return Exclusion(
                model=config.model,
                revision=config.revision,
                reason=ExclusionReason.UNSUPPORTED_INSTANCE,
                message=refusal,
                profile=hw.name,
            )

    def one_core(meta: ModelMetadata) -> bool:
        # The plan is made at one core when one is given, or when one fits (the smallest
        # degree that fits wins): then the parallel plan is never read.
        if cores is not None:
            return cores == 1
        batch, max_length = run_shape(config, meta.image_tokens)
        return memory_at(
            meta, hw, 1, Parallelism.NONE, dtype=config.dtype, batch=batch, max_length=max_length
        ).fits

    meta = read_metadata(
        config.model, config.revision, task=config.task.value, token=token, endpoint=endpoint,
        one_core=one_core,
    )  # fmt: skip
    batch, max_length = run_shape(config, meta.image_tokens)
    return plan_from_metadata(
        meta, profile=hw, max_cores=max_cores, dtype=config.dtype, batch=batch,
        max_length=max_length, trust_remote_code=config.trust_remote_code, cores=cores,
        parallelism=config.parallelism if cores is not None else None,
    )  # fmt: skip


__all__ = [
    "DTYPE_BYTES",
    "Exclusion",
    "MemoryBreakdown",
    "MetadataError",
    "ModelMetadata",
    "ModelNotFound",
    "Plan",
    "header_metadata",
    "memory_at",
    "metadata_from_config",
    "metadata_from_snapshot",
    "plan_from_metadata",
    "read_metadata",
    "remembered_metadata",
    "run_shape",
    "size_model",
    "size_run",
    "valid_parallelism",
]
