#!/usr/bin/env python3
"""model-support runner: does this Hugging Face model run unmodified on this accelerator?

The recipe: load the model (``from_pretrained``), compile it (``torch.compile``: backend
``neuron`` on Trainium, ``inductor`` elsewhere), run it (text: greedy generation with a static
cache) and verify the output against a float32 CPU reference. Writes one JSON document to
``result_path`` and as the last stdout line (prefixed ``MODEL_SUPPORT_RESULT``).

``python3 run.py`` needs no other file: torch, the model's library (transformers; also
sentence-transformers or diffusers for those tasks) and torch-neuronx on Trainium. CONFIG sets
everything; with ``cores`` > 1 it starts its own workers and shards the model (tensor or expert
parallel).

Contents
    CONFIG       the test, one key per line: the part to read (and edit)
    main()       the stages, top to bottom: setup, load, compile, generate, verify
    Appendix A   task families, one section each ("# ---- task: <pipeline tags>")
    Appendix B   device backends, one class each: neuron, cuda, cpu
    Appendix C   the verdict: float32 reference, baseline, token and logit checks; on a FAIL,
                 the first module whose compiled output diverges (localization)
    Appendix D   plumbing: vocabulary, errors, stages, the document, sharded workers
"""

from __future__ import annotations

import abc
import collections
import contextlib
import dataclasses
import datetime
import gc
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

try:  # the one torch import: without torch the run still ends in a classified ERROR document
    import torch
except Exception as exc:  # not installed, or a device extension torch autoloads failed
    torch = None  # type: ignore[assignment]
    TORCH_UNAVAILABLE = f"torch cannot be imported ({type(exc).__name__}: {exc})"
else:
    TORCH_UNAVAILABLE = None

# ---- BEGIN MODEL-SUPPORT CONFIG (rendered by model-support; JSON only) ----
CONFIG_JSON = r"""
{
    "backend": "auto",
    "compile_backend": null,
    "cores": 1,
    "dtype": "bfloat16",
    "judge_model": null,
    "max_new_tokens": 32,
    "model": "Qwen/Qwen3-0.6B",
    "parallelism": "none",
    "prompts": [
        "def fibonacci(n):",
        "The capital of France is",
        "import numpy as np\n"
    ],
    "result_path": "result.json",
    "revision": null,
    "task": "text-generation",
    "trust_remote_code": false,
    "verification": {
        "enabled": true,
        "error_floor": 0.001,
        "float32_precision": "auto",
        "kl_floor": 1e-06,
        "localize": "on_fail",
        "localize_budget_s": 600.0,
        "max_error_ratio": 3.0,
        "max_kl_ratio": 10.0,
        "max_peak_ratio": 4.0,
        "max_q90_ratio": 3.5,
        "near_tie_floor": 0.02,
        "near_tie_multiple": 3.0,
        "router_tie_floor": 0.0001,
        "router_tie_multiple": 3.0,
        "router_tie_share": 0.1
    },
    "worker_timeout_s": 1800.0
}
"""
# ---- END MODEL-SUPPORT CONFIG ----


def main() -> int:
    """Run the test CONFIG describes and write its document; exit 0 when it has a verdict."""
    config = json.loads(CONFIG_JSON)
    sharded = int(config["cores"]) > 1 and torch is not None  # no worker can start without torch
    with CONSOLE.capturing():  # what the runtime writes to the console, for the error classes
        doc = run_sharded(config) if sharded else execute(RunContext(config))
    write_result(doc, config["result_path"])
    return 0 if doc["result"] in ("PASS", "FAIL", "UNVERIFIED") else 1


def run_test(ctx: RunContext) -> dict:
    """The test: setup, load, compile, generate (every rank); verify and judge (rank 0).

    Each stage is one function below: it reads what the previous stage returned and records its
    own figures in ``ctx.doc``; a failure inside ``stage`` becomes a classified StageFailure.
    """
    doc = ctx.doc
    with stage("setup", ctx):
        placement = setup_stage(ctx)
    with stage("load", ctx):
        loaded = load_stage(ctx, placement)
    with stage("compile", ctx):
        compile_start = compile_stage(ctx, placement, loaded)
    with stage("generate", ctx):
        generation = generate_stage(ctx, placement, loaded, compile_start)

    processor = loaded.processor
    del loaded  # the device model is no longer needed: free it before the CPU reference loads
    gc.collect()
    if ctx.rank != 0:
        # Rank 0 verifies; a FAIL's localization then needs every rank's shard again.
        follow_localization(ctx, placement, processor, generation)
        return doc
    try:
        return judge_stages(ctx, placement, processor, generation)
    finally:
        release_followers(ctx)


def judge_stages(ctx: RunContext, placement: Placement, processor, generation) -> dict:
    """Rank 0 after generating: verify, localize a FAIL, ask the judge model."""
    config, doc = ctx.config, ctx.doc
    if not config["verification"]["enabled"]:
        doc["result"] = "UNVERIFIED"  # it ran; whether its output is right was not checked
        doc["verification"] = {
            "passed": None,
            "reason": "verification disabled by the test's config",
        }
        return doc
    with stage("verify", ctx):
        verify_stage(ctx, processor, generation)
    if localization_wanted(config["verification"], doc["result"]):
        localize_stage(ctx, placement, processor, generation)
    release_followers(ctx)  # before the judge: the other workers need not wait for it
    if config["judge_model"]:
        judge_stage(ctx)
    return doc


def setup_stage(ctx: RunContext) -> Placement:
    """Choose the device backend and this rank's device, join the process group.

    Records the backend, the compile backend and the stack. On Trainium this process is first
    narrowed to its one NeuronCore, before torch_neuronx starts the runtime.
    """
    config, doc = ctx.config, ctx.doc
    if torch is None:
        raise InfrastructureError(
            f"{TORCH_UNAVAILABLE}; run in the model-support runner image built on "
            f"{TORCHNEURON_BASE_IMAGE}, or install torch"
        )
    if neuron_intended(config["backend"]):
        devices = neuron_devices(read_lnc()[0], instance_type()) if ctx.world_size > 1 else None
        apply_env(neuron_core_env(dict(os.environ), ctx.rank, ctx.world_size, devices))
    backend = ctx.backend = select_backend(config["backend"])
    if backend.name == "neuron":
        # Before any model is touched: a node that cannot run a test fails here, as
        # infrastructure naming the check, never as the model's result.
        failure = preflight_failure(node_checks(node_facts(), os.getuid()))
        if failure is not None:
            raise failure
    # Before the runtime starts (at the process group, or the first tensor on the device): the
    # growth from here is the runtime's own use as well as the tensors' (docs/trainium.md).
    runtime_before = read_runtime_device_memory() if backend.name == "neuron" else None
    doc["backend"] = backend.name
    doc["stack"] = collect_stack(backend)
    doc["stack"].update(backend.runtime_settings())
    pinned = backend.pin_compile_settings()  # before anything compiles
    doc["compilation"] = compile_policy(backend, pinned)
    device = backend.device(ctx.rank, ctx.world_size)
    compile_backend = resolve_compile_backend(config["compile_backend"], backend)
    doc["compile_backend"] = config["compile_backend"] or compile_backend
    distributed_config = distributed_setup(ctx, backend)
    # After the process group (TorchNeuron starts the runtime there, on this rank's core) and
    # before any model: a runtime that cannot run one operation fails here, as infrastructure,
    # never as the model's load error.
    backend.start_runtime(device)
    doc["stack"]["device_name"] = backend.device_name(device)
    backend.reset_peaks(device)
    # torch, the backend and the process group live as long as this process: the collector
    # need not walk them again in every full collection (loading, compiling, freeing the model).
    gc.freeze()
    return Placement(backend, device, compile_backend, distributed_config, runtime_before, pinned)


def load_stage(ctx: RunContext, placement: Placement) -> LoadedModel:
    """from_pretrained onto the device (the task's loader), and the task's inputs.

    Records timings.load_s, resolved_revision, parameters and parameters_per_core.
    """
    config, doc = ctx.config, ctx.doc
    scenario = scenario_for(config["task"])
    t0 = time.perf_counter()
    processor, model = scenario.load(
        config, config["dtype"], placement.device, placement.distributed_config
    )
    placement.backend.synchronize()
    doc["timings"]["load_s"] = time.perf_counter() - t0
    doc["resolved_revision"] = resolved_revision(config)
    parameters = [p for module in scenario.modules(model) for p in module.parameters()]
    doc["parameters"] = sum(p.numel() for p in parameters)
    # What this core holds: a DTensor's local shard, else the whole tensor.
    doc["parameters_per_core"] = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in parameters
    )
    inputs = scenario.inputs(config, processor, placement.device, config["dtype"])
    return LoadedModel(processor, model, inputs, scenario.pad_token_id(processor))


@dataclasses.dataclass
class CompileWatch:
    """The compilation counters from before compiling, the graphs compiled since, and what
    did not run compiled."""

    before: CompileCounts
    ledger: GraphLedger
    fallbacks: FallbackWatch


def compile_stage(ctx: RunContext, placement: Placement, loaded: LoadedModel) -> CompileWatch:
    """Compile what the task runs on the device, then make the first call, which compiles.

    Static shapes (``dynamic=False``): Neuron compiles one graph per input shape. Records
    timings.first_generate_s; returns the counters from before compiling and the ledger of
    the graphs compiled (each one's cache hit or miss).
    """
    config = ctx.config
    scenario = scenario_for(config["task"])
    before = read_compile_counts(placement.backend)
    ledger = GraphLedger(placement.backend.cache_probe)
    fallbacks = FallbackWatch()
    watch_recompiles()
    scenario.compile(loaded.model, ledger.wrap(placement.compile_backend))
    t0 = time.perf_counter()
    try:
        with torch.no_grad(), compiled_as_required(placement.backend, ledger, fallbacks):
            scenario.call(config, loaded)
    finally:
        ctx.doc["compilation"]["fallback_ops"] = fallbacks.reports()
    placement.backend.synchronize()
    ctx.doc["timings"]["first_generate_s"] = time.perf_counter() - t0
    return CompileWatch(before, ledger, fallbacks)


def generate_stage(
    ctx: RunContext, placement: Placement, loaded: LoadedModel, compile_start: CompileWatch
) -> Generation:
    """The compiled model's call again, timed (generating tasks: also its first token, the
    prefill). Records timings, what compiling took (and whether this call compiled again),
    peak device memory, tokens and text."""
    config, doc = ctx.config, ctx.doc
    scenario, backend = scenario_for(config["task"]), placement.backend
    clock = first_token_clock(backend) if scenario.generates else None
    compiled_before = len(compile_start.ledger.graphs)
    fallbacks = compile_start.fallbacks
    try:
        with (
            torch.no_grad(),
            compiled_as_required(backend, compile_start.ledger, fallbacks),
        ):
            t0 = time.perf_counter()
            out = scenario.call(config, loaded, clock)
            backend.synchronize()
            steady_s = time.perf_counter() - t0
    finally:
        doc["compilation"]["fallback_ops"] = fallbacks.reports()
    prefill_s = None if clock is None or clock.at is None else clock.at - t0
    record_timings(doc["timings"], config, steady_s, prefill_s)
    pinned = placement.compile_settings
    doc["compilation"] = compilation_summary(
        compile_start.before,
        read_compile_counts(backend),
        compile_start.ledger.graphs,
        timed_call_graphs=len(compile_start.ledger.graphs) - compiled_before,
        recompiled=recompiles(),
        policy={
            **compile_policy(backend, pinned),
            "fallback_ops": fallbacks.reports(),
            "compiler_args": backend.compiler_arguments(pinned),
        },
    )
    if pinned.get("debug_dir_owned"):  # every graph is compiled: its artifacts have been read
        shutil.rmtree(pinned["debug_dir_owned"], ignore_errors=True)
    peak, source = backend.peak_memory(placement.device)
    doc["memory"]["peak_device_memory_bytes"], doc["memory"]["device_memory_source"] = peak, source
    before = placement.runtime_memory_before  # None: not Neuron, sysfs is not read
    grown, categories = runtime_memory_growth(
        before, read_runtime_device_memory() if before is not None else {}
    )
    doc["memory"]["runtime_device_memory_bytes"] = grown
    doc["memory"]["runtime_device_memory_categories"] = categories
    generation = scenario.collect(config, loaded, out)
    doc["tokens"] = [] if generation.tokens is None else generation.tokens.tolist()
    doc["text"] = list(generation.text)
    return generation


def verify_stage(ctx: RunContext, processor, generation: Generation) -> None:
    """Judge the output against the float32 CPU reference (rank 0); records verdict and result."""
    config, doc = ctx.config, ctx.doc
    scenario = scenario_for(config["task"])
    verification, seconds = scenario.verify(
        config, processor, generation, config["dtype"], ctx.backend.name
    )
    verification.setdefault("method", scenario.method)
    # Every document has the same fields: the token verdict has no per-measure or per-item list.
    verification.setdefault("metrics", [])
    verification.setdefault("items", [])
    verification.setdefault("first_divergence", None)  # searched after the verdict, on a FAIL
    if scenario.method == "tokens":
        decode_positions(verification, processor)
    doc["timings"]["reference_s"] = seconds
    doc["verification"] = verification
    doc["result"] = "PASS" if verification["passed"] else "FAIL"


def decode_positions(verification: dict, processor) -> None:
    """Give each position where the device's token differs from the reference's choice both
    tokens as text, so that a FAIL reads as words rather than ids (matching positions stay ids
    only: the record stays small)."""
    tokenizer = tokenizer_of(processor)
    for position in verification.get("positions", []):
        if position.get("verdict") != "match":
            position["token_text"] = tokenizer.decode([position["token"]])
            position["reference_text"] = tokenizer.decode([position["reference_token"]])


def judge_stage(ctx: RunContext) -> None:
    """The advisory judge model's opinion of the text, when one is configured (rank 0)."""
    config, doc = ctx.config, ctx.doc
    try:
        doc["judge"] = judge(config["judge_model"], doc["text"])
    except Exception as exc:
        # The judge is advisory: its failure is recorded with its class, the verdict stands.
        doc["judge"] = {
            "model": config["judge_model"],
            "error_class": classify("load", exc),
            "error": f"{type(exc).__name__}: {exc}",
        }


# =========================================================================== Appendix A: tasks
#
# Everything that depends on the task lives in one class per task family, each under its own
# heading below ("task: <pipeline tags>"): how the model loads, what its inputs are, which part
# is compiled, one call of it, what it produced, and how that is verified. The stages above only
# call the TaskScenario interface; scenario_for(task) picks the class. Every verdict follows the
# text verdict's method (Appendix C): the device's output is compared with a float32 CPU
# reference, relative to the deviation of the same pass in the run's arithmetic on CPU (the
# baseline); each pure verdict function is unit-tested on synthetic tensors.

SEED = 0  # every random input (initial latents of text-to-image) comes from this CPU seed


class TaskScenario(abc.ABC):
    """The parts of a test that depend on its task: load, inputs, compile, call, verify."""

    tasks: tuple[str, ...] = ()
    generates = False  # decodes tokens greedily: max_new_tokens, prefill and decode timings
    shardable = False  # can be split over several cores (tensor or expert parallel)
    method = ""  # what the verdict compares: tokens, embeddings, classification, latents

    @abc.abstractmethod
    def load(self, config: dict, dtype_name: str, device, distributed_config=None):
        """from_pretrained for this task onto ``device``: (processor or None, model)."""

    @abc.abstractmethod
    def inputs(self, config: dict, processor, device, dtype_name: str):
        """The test's inputs, ready for the model on ``device``."""

    @abc.abstractmethod
    def call(self, config: dict, loaded: LoadedModel, clock=None):
        """One run of the (compiled) model on the inputs; ``clock`` (generating tasks): a
        :func:`first_token_clock` that notes when the first token is out."""

    @abc.abstractmethod
    def collect(self, config: dict, loaded: LoadedModel, out) -> Generation:
        """What the device produced, moved to CPU, for the document and the verdict."""

    @abc.abstractmethod
    def score(
        self, config: dict, processor, generation: Generation, dtype_name: str, precision: str
    ):
        """The float32 CPU reference and the baseline (same pass in the run's arithmetic)."""

    @abc.abstractmethod
    def judge(self, config: dict, generation: Generation, scored, label: str) -> dict:
        """The verdict on what the device produced, given the scored reference (pure)."""

    def pad_token_id(self, processor) -> int | None:
        return None

    def modules(self, model) -> list:
        """The torch modules that make up the model (parameters are counted over them)."""
        return [model]

    def compile(self, model, compile_backend) -> None:
        """Compile what runs on the device: the model's forward (static shapes for Neuron)."""
        model.forward = torch.compile(model.forward, backend=compile_backend, dynamic=False)

    def cast(self, model, dtype) -> None:
        """Move a float32 model to the baseline's dtype in place."""
        model.to(dtype)

    def localization_calls(self, config: dict, processor, generation: Generation) -> list | None:
        """The localized module's forward (see :meth:`localization_module`), once per input, as
        (args, kwargs) on CPU, for localizing a FAIL (the device's output fed back as input, as
        the verdict scores it); None where this family is not localized."""
        return None

    def localization_module(self, model):
        """The torch module whose forward the localization calls, given what :meth:`load`
        returned as the model (a pipeline's denoiser, say); the model itself by default."""
        return model

    def verify(
        self, config: dict, processor, generation: Generation, dtype_name: str, backend: str
    ) -> tuple[dict, float]:
        """The verdict and the seconds it took; the float32 precision policy as for text."""
        start = time.perf_counter()
        params = config["verification"]
        flags = neuron_compiler_flags()
        precision = float32_precision(params, backend, flags) if dtype_name == "float32" else None
        scored = self.score(config, processor, generation, dtype_name, precision or "ieee")
        verification = self.judge(
            config, generation, scored, precision_label(dtype_name, precision or "ieee")
        )
        verification["float32_precision"] = precision
        verification.setdefault("images", None)  # drawn by text-to-image only
        return verification, time.perf_counter() - start


class GreedyDecoding(TaskScenario):
    """A model that decodes ``max_new_tokens`` tokens greedily with a static cache, its logits
    kept: the tokens are verified by the token verdict (Appendix C)."""

    generates = True
    method = "tokens"

    def pad_token_id(self, processor):
        return tokenizer_of(processor).pad_token_id

    def call(self, config, loaded, clock=None):
        steps = int(config["max_new_tokens"])
        return generate(loaded.model, loaded.inputs, steps, loaded.pad_token_id, clock)


def single_core_only(task: str, distributed_config) -> None:
    """Refuse a sharded load for a task run.py runs on one core only."""
    if distributed_config is not None:
        raise ValueError(f"{task} runs on one core; sharding is supported for text generation")


def inputs_to(inputs, device, dtype=None):
    """A processor's batch on ``device``, floating-point tensors (pixels, audio) in ``dtype``."""
    moved = {}
    for key, value in inputs.items():
        if hasattr(value, "to"):
            value = value.to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
        moved[key] = value
    return moved


def is_local(model: str) -> bool:
    return os.path.isdir(model)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""Files that hold a checkpoint's weights (model_support.models keeps the same list)."""


def weights_digest(folder: str) -> str | None:
    """sha256 of a local checkpoint's weights: over each weight file's path (relative, sorted)
    and its content's sha256, so a row names exactly the weights it tested. None when the
    folder holds no weight file or cannot be read (model_support.models: the same function)."""
    entries = []
    try:
        for root, _, names in os.walk(folder):
            for name in names:
                if name.endswith(WEIGHT_SUFFIXES):
                    path = os.path.join(root, name)
                    digest = hashlib.sha256()
                    with open(path, "rb") as handle:
                        for block in iter(lambda: handle.read(1 << 20), b""):
                            digest.update(block)
                    entries.append(f"{os.path.relpath(path, folder)}\0{digest.hexdigest()}\n")
    except OSError:
        return None
    if not entries:
        return None
    return hashlib.sha256("".join(sorted(entries)).encode()).hexdigest()


def hub_arguments(config: dict) -> dict:
    """from_pretrained's revision (none for a local checkpoint) and remote-code arguments."""
    return {
        "revision": None if is_local(config["model"]) else config["revision"],
        "trust_remote_code": bool(config["trust_remote_code"]),
    }


def torch_dtype(name: str):
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def pretrained(
    config: dict,
    processor_class: str,
    model_class: str,
    dtype_name: str,
    device,
    distributed_config=None,
):
    """The test's processor (tokenizer, image or audio processor) and model, from_pretrained
    with transformers' Auto classes of those names, onto ``device`` (or sharded)."""
    import transformers

    common = hub_arguments(config)
    processor = getattr(transformers, processor_class).from_pretrained(config["model"], **common)
    # Weights from safetensors only: a pickle checkpoint can run code when it is unpickled.
    kwargs = dict(common, dtype=torch_dtype(dtype_name), use_safetensors=True)
    if distributed_config is not None:
        kwargs["distributed_config"] = distributed_config
    model = getattr(transformers, model_class).from_pretrained(config["model"], **kwargs)
    if distributed_config is None and device is not None:
        model = model.to(device)
    return processor, model.eval()


def resolved_revision(config: dict) -> str | None:
    """The commit the weights came from (None for a local checkpoint).

    A pinned commit is its own answer; otherwise the Hub cache's ref for the revision, which
    the download just wrote (transformers 5 no longer records it on the config).
    """
    if is_local(config["model"]):
        return None
    revision = config["revision"] or "main"
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    ref = os.path.join(
        constants.HF_HUB_CACHE,
        repo_folder_name(repo_id=config["model"], repo_type="model"),
        "refs",
        revision,
    )
    if not os.path.isfile(ref):
        return None  # loaded without a cache ref (e.g. offline from a snapshot): unknown
    with open(ref, encoding="utf-8") as handle:
        return handle.read().strip() or None


def tokenizer_of(processor):
    return getattr(processor, "tokenizer", processor)


def ensure_pad_token(tokenizer) -> None:
    """Batched prompts need a pad token; many causal LMs ship none.

    Which token pads does not matter (the attention mask hides it), so an existing one is
    reused rather than a new one added, which would change the vocabulary the model was made for.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = (
            tokenizer.eos_token or tokenizer.unk_token or tokenizer.convert_ids_to_tokens(0)
        )


def test_image():
    """A deterministic 224x224 RGB test image: colour gradients and a checkerboard."""
    from PIL import Image

    size = 224
    pixels = bytearray()
    for y in range(size):
        for x in range(size):
            check = 255 if ((x // 28) + (y // 28)) % 2 == 0 else 0
            pixels += bytes((x * 255 // size, y * 255 // size, check))
    return Image.frombytes("RGB", (size, size), bytes(pixels))


# ---- task: text-generation, image-text-to-text


class TextGeneration(GreedyDecoding):
    """A causal LM (or an image-text-to-text model) generating with a static cache; the only
    family that can be sharded over several cores (tensor or expert parallel)."""

    tasks = ("text-generation", "image-text-to-text")
    shardable = True

    def load(self, config, dtype_name, device, distributed_config=None):
        if config["task"] == "image-text-to-text":
            classes = ("AutoProcessor", "AutoModelForImageTextToText")
        else:
            classes = ("AutoTokenizer", "AutoModelForCausalLM")
        return pretrained(config, *classes, dtype_name, device, distributed_config)

    def inputs(self, config, processor, device, dtype_name):
        return build_inputs(config, processor, config["prompts"]).to(device)

    def collect(self, config, loaded, out):
        prompt_len = loaded.inputs["input_ids"].shape[1]
        generated = out.sequences[:, prompt_len:].cpu()
        device_logits = torch.stack([step.float().cpu() for step in out.logits], dim=1)
        text = tokenizer_of(loaded.processor).batch_decode(generated, skip_special_tokens=True)
        return Generation(generated, device_logits, text=text)

    def score(self, config, processor, generation, dtype_name, precision):
        prompts, tokens = config["prompts"], generation.tokens
        scored = score_reference(config, processor, prompts, tokens, dtype_name, precision)
        return match_routing(
            config,
            processor,
            prompts,
            tokens,
            dtype_name,
            precision,
            scored,
            generation.device_logits,
        )

    def judge(self, config, generation, scored, label):
        judged = verdict(
            scored["reference"],
            scored["baseline"],
            generation.device_logits,
            generation.tokens,
            config["verification"],
            dtype_name=label,
            router_gaps=scored["router_gaps"],
            router_noise=scored["router_noise"],
        )
        judged["routing_flips"] = scored["routing_flips"]
        return judged

    def localization_calls(self, config, processor, generation):
        calls = []
        for prompt, generated in zip(config["prompts"], generation.tokens, strict=True):
            single = dict(build_inputs(config, processor, [prompt]))
            ids = torch.cat([single.pop("input_ids"), generated.unsqueeze(0)], dim=1)
            single["attention_mask"] = torch.ones_like(ids)
            calls.append(((), {"input_ids": ids, "use_cache": False, **single}))
        return calls


def build_inputs(config: dict, processor, prompts: list[str]):
    """Batched model inputs (left padded) for the prompts of the test's task."""
    if config["task"] == "image-text-to-text":
        texts = [
            processor.apply_chat_template(
                [
                    {
                        "role": "user",
                        "content": [{"type": "image"}, {"type": "text", "text": prompt}],
                    }
                ],
                add_generation_prompt=True,
            )
            for prompt in prompts
        ]
        tokenizer_of(processor).padding_side = "left"
        ensure_pad_token(tokenizer_of(processor))
        return processor(
            images=[test_image() for _ in prompts], text=texts, return_tensors="pt", padding=True
        )
    processor.padding_side = "left"
    ensure_pad_token(processor)
    return processor(prompts, return_tensors="pt", padding=True)


def generate(
    model,
    inputs,
    max_new_tokens: int,
    pad_token_id,
    clock=None,
    logits_processor=None,
    stopping_criteria=(),
):
    """Greedy generation of exactly max_new_tokens with a static cache; logits kept.

    ``clock``: a :func:`first_token_clock`, told of every token (it never stops generation).
    ``logits_processor`` and ``stopping_criteria``: the localization's replay of a step (its
    tokens forced, stopped after the step).
    """
    criteria = [*([] if clock is None else [clock]), *stopping_criteria]
    return model.generate(
        stopping_criteria=criteria or None,
        logits_processor=logits_processor,
        **inputs,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        cache_implementation="static",
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=pad_token_id,
    )


def first_token_clock(backend: DeviceBackend):
    """A stopping criterion that never stops generation and notes (``at``, perf_counter
    seconds) when the first token is out: the prefill's end, measured inside the timed
    generation instead of by a generation of its own."""
    from transformers import StoppingCriteria

    class FirstTokenClock(StoppingCriteria):
        def __init__(self) -> None:
            self.at: float | None = None

        def __call__(self, input_ids, scores, **kwargs):
            if self.at is None:
                backend.synchronize()  # the prefill's work is done, not only queued
                self.at = time.perf_counter()
            return torch.zeros_like(input_ids[:, -1], dtype=torch.bool)

    return FirstTokenClock()


def teacher_forced_logprobs(model, single_inputs: dict, generated, prompt_len: int):
    """Log-probabilities (float64) the model gives at each generated position, teacher forced."""
    ids = torch.cat([single_inputs["input_ids"], generated.unsqueeze(0)], dim=1)
    kwargs = {k: v for k, v in single_inputs.items() if k not in ("input_ids", "attention_mask")}
    kwargs["attention_mask"] = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **kwargs).logits
    n = generated.shape[0]
    return torch.log_softmax(logits[0, prompt_len - 1 : prompt_len - 1 + n].double(), dim=-1)


def score_reference(config: dict, processor, prompts, tokens, dtype_name: str, precision: str):
    """Score each prompt + the device's tokens teacher forced on CPU: the reference and baseline.

    The reference is the model in float32 (``precision`` "ieee"); the baseline is the same pass
    in the arithmetic a correct run may use: the run dtype, or for a float32 run the float32
    precision the backend is allowed. Returns per prompt the reference and baseline
    log-probabilities (positions x vocabulary, float64) and, for mixture-of-experts models, the
    reference routers' top-k gaps and the baseline's router-logit deviation (positions x layers).
    """
    import math

    singles = [build_inputs(config, processor, [prompt]) for prompt in prompts]
    router_names: list = []  # columns in moe_routers' order, the layer index flipped_routing takes

    def score_all(model):
        if not router_names:
            router_names.extend(name for name, _, _ in moe_routers(model))
        logprobs, routers = [], []
        for i, single in enumerate(singles):
            prompt_len = single["input_ids"].shape[1]
            with observe_routers(model) as seen:
                logprobs.append(teacher_forced_logprobs(model, dict(single), tokens[i], prompt_len))
            # The router decisions behind position t are those at input position prompt_len-1+t.
            rows = slice(prompt_len - 1, prompt_len - 1 + len(tokens[i]))
            routers.append({name: (logits[rows], k) for name, (logits, k) in seen.items()})
        return logprobs, routers

    # The reference always loads whole, on CPU, in float32 (also on a sharded run's rank 0).
    (reference, ref_routers), (baseline, base_routers) = reference_and_baseline(
        scenario_for(config["task"]), config, dtype_name, precision, score_all
    )
    router_gaps, router_noise = [], []
    for ref_seen, base_seen in zip(ref_routers, base_routers, strict=True):
        if not ref_seen:
            router_gaps.append(None)
            router_noise.append(None)
            continue
        gaps, noise = [], []
        positions = len(next(iter(ref_seen.values()))[0])
        for name in router_names:
            if name not in ref_seen:  # a router that never ran is never tied
                gaps.append(torch.full((positions,), math.inf, dtype=torch.float64))
                noise.append(torch.zeros(positions, dtype=torch.float64))
                continue
            logits, k = ref_seen[name]
            gap, deviation = router_gap_and_noise(logits, k, base_seen[name][0])
            gaps.append(gap)
            noise.append(deviation)
        router_gaps.append(torch.stack(gaps, dim=1))
        router_noise.append(torch.stack(noise, dim=1))
    return {
        "reference": reference,
        "baseline": baseline,
        "router_gaps": router_gaps,
        "router_noise": router_noise,
    }


ROUTING_CANDIDATES = 8  # flipped forward passes per prompt, at most, when matching routing


def match_routing(
    config: dict, processor, prompts, tokens, dtype_name: str, precision: str, scored, device_logits
):
    """The reference and baseline, re-scored where the device evidently took the other expert.

    A correct reduced-precision run may route a token to the other of two nearly tied experts;
    that moves its logits at that position far more than rounding would, and, through the
    attention of later layers to that position, at the positions after it too. Where a router
    tie the verdict excuses (see excused_positions) comes with a device deviation beyond the
    rounding allowance, each tied layer's flip is tried in the float32 reference (at most
    ROUTING_CANDIDATES passes a prompt); the flip that brings the reference closest to the
    device there, if any brings it closer, is kept, and the reference and the baseline of that
    prompt are scored again with the kept flips, so every later position is judged against the
    routing the device used. Returns a new scored dict (``scored`` is left as it was) with
    ``routing_flips``: the (prompt, position, layer) kept. A fault that only imitates such a
    flip is indistinguishable from it (docs/verification.md).
    """
    import math

    params = config["verification"]
    plans: dict = {}
    for i, gaps in enumerate(scored["router_gaps"]):
        if gaps is None:
            continue
        toks = torch.as_tensor(tokens[i], dtype=torch.long).reshape(-1)
        ref, base = scored["reference"][i], scored["baseline"][i]
        dev = torch.log_softmax(device_logits[i].double(), dim=-1)
        ties = router_tie_mask(gaps, scored["router_noise"][i], params)
        device_dev = position_deviations(dev, ref, toks)
        baseline_dev = position_deviations(base, ref, toks)
        allowance = torch.clamp(
            params["near_tie_multiple"] * baseline_dev, min=params["near_tie_floor"]
        )
        excused = excused_positions(ties.any(dim=1), device_dev, params)
        moved = torch.nonzero(excused & (device_dev > allowance)).flatten().tolist()
        candidates = [
            (t, layer) for t in moved for layer in torch.nonzero(ties[t]).flatten().tolist()
        ]
        if candidates:
            plans[i] = (candidates[:ROUTING_CANDIDATES], dev, toks, device_dev)
    result = dict(scored, reference=list(scored["reference"]), baseline=list(scored["baseline"]))
    result["routing_flips"] = []
    if not plans:
        return result

    _, model = scenario_for(config["task"]).load(config, "float32", torch.device("cpu"))
    singles = {i: build_inputs(config, processor, [prompts[i]]) for i in plans}
    kept: dict = {}
    for i, (candidates, dev, toks, device_dev) in plans.items():
        prompt_len = singles[i]["input_ids"].shape[1]
        best: dict = {}  # position -> (deviation, layer)
        for t, layer in candidates:
            with flipped_routing(model, {layer: [prompt_len - 1 + t]}):
                flipped = teacher_forced_logprobs(model, dict(singles[i]), toks, prompt_len)
            deviation = float(
                position_deviations(dev[t : t + 1], flipped[t : t + 1], toks[t : t + 1])[0]
            )
            if deviation < float(device_dev[t]) and deviation < best.get(t, (math.inf,))[0]:
                best[t] = (deviation, layer)
        if best:
            kept[i] = {t: layer for t, (_, layer) in sorted(best.items())}

    def rescore(model, i: int):
        flips: dict = {}
        prompt_len = singles[i]["input_ids"].shape[1]
        for t, layer in kept[i].items():
            flips.setdefault(layer, []).append(prompt_len - 1 + t)
        with flipped_routing(model, flips):
            return teacher_forced_logprobs(model, dict(singles[i]), plans[i][2], prompt_len)

    for i in kept:
        result["reference"][i] = rescore(model, i)
    if kept and dtype_name != "float32":
        model.to(torch_dtype(dtype_name))
        for i in kept:
            result["baseline"][i] = rescore(model, i)
    elif kept and precision != "ieee":
        with reduced_precision(precision):
            for i in kept:
                result["baseline"][i] = rescore(model, i)
    elif kept:
        for i in kept:
            result["baseline"][i] = result["reference"][i]
    del model
    gc.collect()
    result["routing_flips"] = [
        {"prompt": i, "position": t, "layer": layer}
        for i in sorted(kept)
        for t, layer in kept[i].items()
    ]
    return result


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
def flipped_routing(model, flips: dict):
    """Route some tokens to the other of two nearly tied experts: within forward passes, in MoE
    layer ``layer`` (the index in :func:`moe_routers`' order) the rows ``flips[layer]`` of the
    router's logits swap their k-th and (k+1)-th largest values, the choice a correct
    reduced-precision run makes where its rounding reverses a near-tie. The router's logits are
    the first ``F.linear`` inside its forward (transformers' routers compute them so)."""

    class SwapRows(torch.overrides.TorchFunctionMode):
        def __init__(self, rows, top_k: int) -> None:
            super().__init__()
            self.rows, self.top_k, self.done = rows, top_k, False

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.nn.functional.linear and not self.done:
                self.done = True
                logits = out.reshape(-1, out.shape[-1])
                flat = logits.clone()
                order = torch.sort(logits.float(), dim=-1, descending=True).indices
                k = self.top_k
                for row in self.rows:
                    # Read from the untouched logits: indexing a row gives views, so swapping
                    # in place would copy one value over both.
                    inside, outside = order[row, k - 1], order[row, k]
                    flat[row, inside], flat[row, outside] = (
                        logits[row, outside],
                        logits[row, inside],
                    )
                out = flat.reshape(out.shape)
            return out

    handles, modes = [], []
    routers = moe_routers(model)
    for layer, rows in flips.items():
        _, router, top_k = routers[layer]

        def enter(module, args, rows=rows, top_k=top_k):
            modes.append(SwapRows(rows, top_k))
            modes[-1].__enter__()

        def leave(module, args, output):
            modes.pop().__exit__(None, None, None)

        handles += [router.register_forward_pre_hook(enter), router.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# ---- task: text2text-generation, automatic-speech-recognition

# Spoken inputs: run.py spells each prompt as a sequence of tones, one per character, so the
# waveform is deterministic, needs no audio file, and a model trained on such "speech" (the
# tiny test fixture) transcribes it back. A real speech model hears tones; its verdict does not
# depend on understanding them.
TONE_ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,:;()[]=+-*/_'\"\n"
TONE_SECONDS = 0.04  # one character
TONE_LOW_HZ, TONE_HIGH_HZ = 150.0, 7000.0


def tone_frequency(char: str) -> float | None:
    """The tone of one character (mel-spaced over the alphabet); None: silence."""
    import math

    index = TONE_ALPHABET.find(char.lower())
    if index < 0:
        return None

    def mel(hz: float) -> float:
        return 2595.0 * math.log10(1.0 + hz / 700.0)

    low, high = mel(TONE_LOW_HZ), mel(TONE_HIGH_HZ)
    point = low + (high - low) * index / (len(TONE_ALPHABET) - 1)
    return 700.0 * (10 ** (point / 2595.0) - 1.0)


def spoken_waveform(text: str, sampling_rate: int):
    """The text as tones (float32 numpy array at ``sampling_rate``), with 5 ms ramps."""
    import numpy as np

    n = round(TONE_SECONDS * sampling_rate)
    ramp = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.005 * sampling_rate))
    t = np.arange(n) / sampling_rate
    pieces = []
    for char in text:
        frequency = tone_frequency(char)
        tone = np.zeros(n) if frequency is None else 0.5 * np.sin(2 * np.pi * frequency * t)
        pieces.append(tone * ramp)
    return np.concatenate(pieces or [np.zeros(n)]).astype(np.float32)


class EncoderDecoderGeneration(GreedyDecoding):
    """An encoder-decoder generating 32 tokens greedily with a static cache.

    Both the encoder's forward (run once by generate) and the model's forward (every decoder
    step) are compiled. Verified like text generation: the device's tokens are scored teacher
    forced (encoder inputs + decoder prefix + tokens) and judged by verdict().
    """

    def compile(self, model, compile_backend):
        encoder = model.get_encoder()
        encoder.forward = torch.compile(encoder.forward, backend=compile_backend, dynamic=False)
        super().compile(model, compile_backend)

    def collect(self, config, loaded, out):
        n = int(config["max_new_tokens"])
        sequences = out.sequences.cpu()
        generated = sequences[:, -n:]
        device_logits = torch.stack([step.float().cpu() for step in out.logits], dim=1)
        text = tokenizer_of(loaded.processor).batch_decode(generated, skip_special_tokens=True)
        cpu_inputs = {k: v.cpu() for k, v in loaded.inputs.items() if hasattr(v, "cpu")}
        start = getattr(loaded.model.generation_config, "decoder_start_token_id", None)
        return Generation(
            generated,
            device_logits,
            text=text,
            outputs={"prefix": sequences[:, :-n], "inputs": cpu_inputs, "start": start},
        )

    def decoder_prefix(self, generation: Generation):
        """What the decoder read before the first generated token, per input (prompts x n)."""
        prefix = generation.outputs["prefix"]
        if prefix.shape[1] == 0:  # a generate that returns only the new tokens
            start = generation.outputs["start"]
            prefix = torch.full((generation.tokens.shape[0], 1), int(start), dtype=prefix.dtype)
        return prefix

    def teacher_forced_inputs(self, generation: Generation, dtype) -> list[dict]:
        """Per input, the keyword arguments of the model's teacher-forced forward: that input's
        encoder inputs (floating ones in ``dtype``), the decoder prefix and the device's tokens
        but the last as the decoder's input, no cache."""
        tokens, prefix = generation.tokens, self.decoder_prefix(generation)
        inputs = generation.outputs["inputs"]
        calls = []
        for i in range(tokens.shape[0]):
            single = cast_floats({k: v[i : i + 1] for k, v in inputs.items()}, dtype)
            decoder_ids = torch.cat([prefix[i], tokens[i, :-1]]).unsqueeze(0)
            calls.append({**single, "decoder_input_ids": decoder_ids, "use_cache": False})
        return calls

    def score(self, config, processor, generation, dtype_name, precision):
        n = generation.tokens.shape[1]
        start = self.decoder_prefix(generation).shape[1] - 1  # the first generated position

        def teacher_forced(model):
            dtype = next(model.parameters()).dtype
            logprobs = []
            for kwargs in self.teacher_forced_inputs(generation, dtype):
                logits = model(**kwargs).logits
                window = logits[0, start : start + n].double()
                logprobs.append(torch.log_softmax(window, dim=-1))
            return logprobs

        return reference_and_baseline(self, config, dtype_name, precision, teacher_forced)

    def localization_calls(self, config, processor, generation):
        # The verdict's own teacher-forced forward, per input: the encoder and the decoder
        # (over every generated position) in one call, the encoder's output fed to the decoder.
        return [((), kwargs) for kwargs in self.teacher_forced_inputs(generation, torch.float32)]

    def judge(self, config, generation, scored, label):
        reference, baseline = scored
        result = verdict(
            reference,
            baseline,
            generation.device_logits,
            generation.tokens,
            config["verification"],
            label,
        )
        result["method"] = self.method
        return result


class Text2TextGeneration(EncoderDecoderGeneration):
    """A sequence-to-sequence text model (T5, BART, ...): the prompts are its encoder's input."""

    tasks = ("text2text-generation",)

    def load(self, config, dtype_name, device, distributed_config=None):
        single_core_only(config["task"], distributed_config)
        return pretrained(config, "AutoTokenizer", "AutoModelForSeq2SeqLM", dtype_name, device)

    def inputs(self, config, processor, device, dtype_name):
        ensure_pad_token(processor)
        batch = processor(config["prompts"], return_tensors="pt", padding=True)
        return inputs_to(batch, device)


class SpeechRecognition(EncoderDecoderGeneration):
    """A speech sequence-to-sequence model (Whisper-style) transcribing generated waveforms."""

    tasks = ("automatic-speech-recognition",)

    def load(self, config, dtype_name, device, distributed_config=None):
        single_core_only(config["task"], distributed_config)
        return pretrained(config, "AutoProcessor", "AutoModelForSpeechSeq2Seq", dtype_name, device)

    def inputs(self, config, processor, device, dtype_name):
        extractor = getattr(processor, "feature_extractor", processor)
        rate = int(extractor.sampling_rate)
        waves = [spoken_waveform(prompt, rate) for prompt in config["prompts"]]
        batch = extractor(waves, sampling_rate=rate, return_tensors="pt")
        return inputs_to(batch, device, torch_dtype(dtype_name))


# ---- task: feature-extraction, sentence-similarity


class SentenceEmbeddings(TaskScenario):
    """Sentence embeddings through sentence-transformers (a plain transformers encoder gets
    sentence-transformers' default mean pooling); the transformer's forward is compiled."""

    tasks = ("feature-extraction", "sentence-similarity")
    method = "embeddings"

    def load(self, config, dtype_name, device, distributed_config=None):
        from sentence_transformers import SentenceTransformer

        single_core_only(config["task"], distributed_config)
        model = SentenceTransformer(
            config["model"],
            device=str(device),
            **hub_arguments(config),
            model_kwargs={"dtype": torch_dtype(dtype_name), "use_safetensors": True},
        )
        return None, model.eval()

    def inputs(self, config, processor, device, dtype_name):
        return list(config["prompts"])

    def compile(self, model, compile_backend):
        encoder = sentence_encoder(model)
        encoder.forward = torch.compile(encoder.forward, backend=compile_backend, dynamic=False)

    def localization_module(self, model):
        return sentence_encoder(model)

    def localization_calls(self, config, processor, generation):
        # The encoder's inputs exactly as sentence-transformers builds them for the verdict's
        # batch (its tokenizer, truncation and padding), recorded from one float32 CPU encode:
        # the pooling after the encoder is not compiled, so not searched.
        _, model = self.load(config, "float32", torch.device("cpu"))
        encoder = sentence_encoder(model)
        forward, calls = encoder.forward, []

        # sentence-transformers calls the encoder's forward itself (no module hook sees it),
        # as the run's compiled forward is called: the forward is wrapped the same way.
        def recorded(*args, **kwargs):
            calls.append((map_tensors(args, torch.clone), map_tensors(kwargs, torch.clone)))
            return forward(*args, **kwargs)

        encoder.forward = recorded
        with torch.no_grad():
            encode_sentences(model, list(config["prompts"]))
        return calls

    def call(self, config, loaded, clock=None):
        return encode_sentences(loaded.model, loaded.inputs)

    def collect(self, config, loaded, out):
        return Generation(None, None, outputs=out.double().cpu())

    def score(self, config, processor, generation, dtype_name, precision):
        sentences = list(config["prompts"])
        return reference_and_baseline(
            self, config, dtype_name, precision, lambda model: encode_sentences(model, sentences)
        )

    def judge(self, config, generation, scored, label):
        reference, baseline = scored
        return embedding_verdict(
            reference, baseline, generation.outputs, config["verification"], label
        )


def sentence_encoder(model):
    """The transformers model inside a sentence-transformers model: what the run compiles."""
    import transformers

    for module in model.modules():
        if isinstance(module, transformers.PreTrainedModel):
            return module
    raise ValueError("this sentence-transformers model holds no transformers model to compile")


def encode_sentences(model, sentences: list[str]):
    """One batch of embeddings (float64 on CPU), unnormalized, as the model computes them."""
    embeddings = model.encode(
        sentences,
        batch_size=len(sentences),
        convert_to_tensor=True,
        normalize_embeddings=False,
        show_progress_bar=False,
    )
    return embeddings.double().cpu()


def _angles(x, y):
    """Angle (radians) between rows of x and y, accurate near zero (Kahan's formula)."""
    ux = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    uy = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return 2 * torch.atan2((ux - uy).norm(dim=-1), (ux + uy).norm(dim=-1))


def embedding_verdict(
    reference, baseline, device, params: dict, dtype_name: str = "bfloat16"
) -> dict:
    """Judge the device's embeddings against the reference and baseline (pure function).

    ``reference``, ``baseline``, ``device``: (inputs x dimensions). Checks:

    - cosine: per input, the angle between the device's and the reference's embedding; its
      median and maximum over inputs against the baseline's (bounds ``max_error_ratio``,
      ``max_peak_ratio``).
    - norm: per input, the relative error of the embedding's length; same statistics.
    - ranking: with each input as the query and the others as the corpus, every pair the
      reference orders by cosine similarity must keep its order, unless the reference's gap
      is within ``near_tie_multiple`` x the baseline's largest similarity deviation for that
      query (at least ``near_tie_floor``): the ranking a search would return is preserved.
    """
    ref, base, dev = (torch.as_tensor(x).double() for x in (reference, baseline, device))
    n = ref.shape[0]
    angle_dev, angle_base = _angles(dev, ref), _angles(base, ref)
    ref_norm = ref.norm(dim=-1).clamp_min(1e-300)
    norm_dev = (dev.norm(dim=-1) / ref_norm - 1).abs()
    norm_base = (base.norm(dim=-1) / ref_norm - 1).abs()

    def similarities(x):
        unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        return unit @ unit.T

    s_ref, s_base, s_dev = similarities(ref), similarities(base), similarities(dev)
    mismatches = near_ties = bad = 0
    reasons: list[str] = []
    items = []
    for q in range(n):
        others = [j for j in range(n) if j != q]
        noise = max((float((s_base[q, j] - s_ref[q, j]).abs()) for j in others), default=0.0)
        allowance = max(params["near_tie_multiple"] * noise, params["near_tie_floor"])
        swaps = ties = 0
        for a in others:
            for b in others:
                gap = float(s_ref[q, a] - s_ref[q, b])
                if a >= b or gap == 0 or float((s_dev[q, a] - s_dev[q, b]) * gap) >= 0:
                    continue
                mismatches += 1
                if abs(gap) <= allowance:
                    near_ties += 1
                    ties += 1
                    continue
                bad += 1
                swaps += 1
                if len(reasons) < 3:
                    first, second = (a, b) if gap > 0 else (b, a)
                    reasons.append(
                        f"for input {q} the device ranks input {second} above input {first}, "
                        f"which the reference places {abs(gap):.3f} higher in cosine similarity, "
                        f"beyond the {dtype_name} noise allowance {allowance:.3f}"
                    )
        items.append(
            {
                "item": q,
                "cosine": _figure(torch.cos(angle_dev[q])),
                "angle_device": _figure(angle_dev[q]),
                "angle_baseline": _figure(angle_base[q]),
                "norm_device": _figure(norm_dev[q]),
                "norm_baseline": _figure(norm_base[q]),
                "ranking_swaps": swaps,
                "ranking_near_ties": ties,
            }
        )
    cosine = item_statistics("cosine", angle_dev, angle_base, params, "relative_error_floor")
    cosine["what"] = "angle to the reference embedding (radians)"
    norm = item_statistics("norm", norm_dev, norm_base, params, "relative_error_floor")
    norm["what"] = "relative error of the embedding's length"
    choices = {
        "check": "ranking",
        "mismatches": mismatches,
        "near_ties": near_ties,
        "bad": bad,
        "reasons": reasons,
    }
    return task_verdict("embeddings", [cosine, norm], choices, items, params, dtype_name)


# ---- task: text-classification, image-classification

# Test images drawn by name (the prompts of an image-classification test): a pattern, its
# period in pixels and two colours. "gradient-checkerboard" is test_image() above.
TEST_IMAGES = {
    "horizontal-stripes": ("horizontal", 28, (220, 40, 40), (250, 240, 200)),
    "vertical-stripes": ("vertical", 28, (40, 40, 200), (240, 240, 240)),
    "checkerboard": ("checkerboard", 28, (20, 20, 20), (230, 230, 230)),
    "diagonal-stripes": ("diagonal", 28, (30, 150, 60), (250, 250, 250)),
    "horizontal-stripes-wide": ("horizontal", 56, (90, 30, 120), (200, 220, 90)),
    "vertical-stripes-wide": ("vertical", 56, (200, 120, 20), (30, 60, 90)),
    "checkerboard-fine": ("checkerboard", 14, (200, 30, 120), (30, 200, 200)),
}


def draw_pattern(kind: str, period: int, colour_a, colour_b, size: int = 224, phase: int = 0):
    """An RGB PIL image of stripes or a checkerboard (numpy), two colours, given period."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size]
    half = max(period // 2, 1)
    if kind == "horizontal":
        mask = ((y + phase) // half) % 2 == 0
    elif kind == "vertical":
        mask = ((x + phase) // half) % 2 == 0
    elif kind == "checkerboard":
        mask = (((x + phase) // half) + ((y + phase) // half)) % 2 == 0
    elif kind == "diagonal":
        mask = ((x + y + phase) // half) % 2 == 0
    else:
        raise ValueError(f"unknown pattern {kind!r}")
    pixels = np.where(mask[..., None], np.array(colour_a), np.array(colour_b)).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def draw_test_image(name: str):
    """One named test image (the names are the image-classification prompts)."""
    if name == "gradient-checkerboard":
        return test_image()
    if name not in TEST_IMAGES:
        raise ValueError(
            f"unknown test image {name!r}; known: gradient-checkerboard, {', '.join(TEST_IMAGES)}"
        )
    kind, period, colour_a, colour_b = TEST_IMAGES[name]
    return draw_pattern(kind, period, colour_a, colour_b)


class Classification(TaskScenario):
    """A classifier's logits for a batch of inputs; the model's forward is compiled."""

    method = "classification"

    def call(self, config, loaded, clock=None):
        return loaded.model(**loaded.inputs).logits

    def collect(self, config, loaded, out):
        logits = out.double().cpu()
        labels = getattr(loaded.model.config, "id2label", None) or {}
        text = [class_label(labels, int(i)) for i in logits.argmax(dim=-1)]
        cpu_inputs = {k: v.cpu() for k, v in loaded.inputs.items() if hasattr(v, "cpu")}
        return Generation(None, logits, text=text, outputs={"inputs": cpu_inputs, "labels": labels})

    def score(self, config, processor, generation, dtype_name, precision):
        inputs = generation.outputs["inputs"]

        def class_logprobs(model):
            batch = cast_floats(inputs, next(model.parameters()).dtype)
            return torch.log_softmax(model(**batch).logits.double(), dim=-1)

        return reference_and_baseline(self, config, dtype_name, precision, class_logprobs)

    def localization_calls(self, config, processor, generation):
        # The verdict's own scoring call: the whole batch the device classified, in one forward
        # (one graph per level, as the run compiled one for the batch).
        return [((), cast_floats(generation.outputs["inputs"], torch.float32))]

    def judge(self, config, generation, scored, label):
        reference, baseline = scored
        verdict = classification_verdict(
            reference, baseline, generation.device_logits, config["verification"], label
        )
        # Each input's predicted label beside the float32 reference's, as the viewer shows them.
        labels = generation.outputs["labels"]
        for item in verdict["items"]:
            item["label"] = class_label(labels, item["class"])
            item["reference_label"] = class_label(labels, item["reference_class"])
        return verdict


def class_label(labels: dict, index: int) -> str:
    """A class's name from the model's id2label (its index where the config names none)."""
    return str(labels.get(index, index))


class TextClassification(Classification):
    """A sequence classifier (BERT-style or a decoder with a score head) over the prompts."""

    tasks = ("text-classification",)

    def load(self, config, dtype_name, device, distributed_config=None):
        single_core_only(config["task"], distributed_config)
        processor, model = pretrained(
            config, "AutoTokenizer", "AutoModelForSequenceClassification", dtype_name, device
        )
        ensure_pad_token(processor)
        if model.config.pad_token_id is None:
            # Batched inputs are padded; a decoder classifier finds each row's last real token
            # through the pad id, which many checkpoints leave unset.
            model.config.pad_token_id = processor.pad_token_id
        return processor, model

    def inputs(self, config, processor, device, dtype_name):
        batch = processor(config["prompts"], return_tensors="pt", padding=True, truncation=True)
        return inputs_to(batch, device)


class ImageClassification(Classification):
    """An image classifier over the named test images."""

    tasks = ("image-classification",)

    def load(self, config, dtype_name, device, distributed_config=None):
        single_core_only(config["task"], distributed_config)
        return pretrained(
            config, "AutoImageProcessor", "AutoModelForImageClassification", dtype_name, device
        )

    def inputs(self, config, processor, device, dtype_name):
        images = [draw_test_image(name) for name in config["prompts"]]
        batch = processor(images=images, return_tensors="pt")
        return inputs_to(batch, device, torch_dtype(dtype_name))


def classification_verdict(
    reference, baseline, device_logits, params: dict, dtype_name: str = "bfloat16"
) -> dict:
    """Judge the device's class logits against the reference and baseline (pure function).

    ``reference`` and ``baseline``: log-probabilities (inputs x classes); ``device_logits``
    the device's logits. An input's error is its largest log-probability deviation over the
    reference's top 8 classes and the device's top class. Checks:

    - top1: where the device's top class is not the reference's, the reference's margin
      between the two must be within ``near_tie_multiple`` x the baseline's error on that input
      (at least ``near_tie_floor`` nats), or the run fails;
    - median, peak: the median and the maximum over inputs of the error against the
      baseline's same statistic (bounds ``max_error_ratio``, ``max_peak_ratio``).
    """
    ref = torch.as_tensor(reference).double()
    base = torch.as_tensor(baseline).double()
    dev = torch.log_softmax(torch.as_tensor(device_logits).double(), dim=-1)
    ref_arg, dev_arg = ref.argmax(dim=-1), dev.argmax(dim=-1)
    watch = torch.cat(
        [torch.topk(ref, min(TOP_K_NOISE, ref.shape[-1])).indices, dev_arg[:, None]], 1
    )
    device_err = (dev - ref).abs().gather(1, watch).max(dim=1).values
    baseline_err = (base - ref).abs().gather(1, watch).max(dim=1).values
    mismatches = near_ties = bad = 0
    reasons: list[str] = []
    items = []
    for i in range(ref.shape[0]):
        margin = float(ref[i, ref_arg[i]] - ref[i, dev_arg[i]])
        allowance = max(
            params["near_tie_multiple"] * float(baseline_err[i]), params["near_tie_floor"]
        )
        judged = "match"
        if int(dev_arg[i]) != int(ref_arg[i]):
            mismatches += 1
            if margin <= allowance:
                near_ties += 1
                judged = "near-tie"
            else:
                bad += 1
                judged = "bad"
                if len(reasons) < 3:
                    reasons.append(
                        f"input {i}: class {int(dev_arg[i])} but the reference prefers "
                        f"{int(ref_arg[i])} by {margin:.3f} nats, beyond the {dtype_name} noise "
                        f"allowance {allowance:.3f}"
                    )
        items.append(
            {
                "item": i,
                "class": int(dev_arg[i]),
                "reference_class": int(ref_arg[i]),
                "margin": _figure(margin),
                "device_deviation": _figure(device_err[i]),
                "baseline_deviation": _figure(baseline_err[i]),
                "verdict": judged,
            }
        )
    # A log-probability deviation is its probability's relative error: the relative floor.
    logits = item_statistics("logits", device_err, baseline_err, params, "relative_error_floor")
    logits["what"] = "log-probability error over the top classes (nats)"
    choices = {
        "check": "top1",
        "mismatches": mismatches,
        "near_ties": near_ties,
        "bad": bad,
        "reasons": reasons,
    }
    result = task_verdict(
        "classification", [logits], choices, items, params, dtype_name,
        failing_statistics={"median": "median", "peak": "peak"},
    )  # fmt: skip
    result["exact"] = mismatches == 0
    return result


# ---- task: text-to-image


class TextToImage(TaskScenario):
    """A diffusers text-to-image pipeline: a few denoising steps from a fixed seed with the
    denoiser (``unet`` or ``transformer``) compiled.

    Kept per step: the latents after it, and the denoiser's inputs and prediction. The verdict
    compares both with the float32 reference, relative to the baseline: the trajectory (the
    latents, free running from the same noise) and, teacher forced, the reference denoiser's
    prediction from the device's own inputs at every step (as text is scored teacher forced),
    which the scheduler's rounding and the compounding of earlier steps do not blur.
    """

    tasks = ("text-to-image",)
    method = "latents"

    def load(self, config, dtype_name, device, distributed_config=None):
        import diffusers

        single_core_only(config["task"], distributed_config)
        pipeline = diffusers.DiffusionPipeline.from_pretrained(
            config["model"],
            dtype=torch_dtype(dtype_name),
            **hub_arguments(config),
            use_safetensors=True,
        )
        pipeline.set_progress_bar_config(disable=True)
        return None, pipeline.to(device)

    def inputs(self, config, processor, device, dtype_name):
        return list(config["prompts"])

    def modules(self, model):
        return [c for c in model.components.values() if isinstance(c, torch.nn.Module)]

    def compile(self, model, compile_backend):
        denoiser = denoiser_of(model)
        denoiser.forward = torch.compile(denoiser.forward, backend=compile_backend, dynamic=False)

    def cast(self, model, dtype):
        model.to(dtype=dtype)

    def localization_module(self, model):
        return denoiser_of(model)

    def localization_calls(self, config, processor, generation):
        # One call per denoising step, on the inputs the device's denoiser had at that step
        # (latents, timestep, text conditioning), as the verdict's denoiser check scores it:
        # teacher forced, so an earlier step's error never reaches a later step's search.
        return [
            (cast_floats(args, torch.float32), cast_floats(kwargs, torch.float32))
            for args, kwargs, _ in generation.outputs["calls"]
        ]

    def call(self, config, loaded, clock=None):
        return denoise(loaded.model, loaded.inputs, int(config["denoising_steps"]), record=True)

    def collect(self, config, loaded, out):
        return Generation(None, None, outputs=out)

    def score(self, config, processor, generation, dtype_name, precision):
        prompts, steps = list(config["prompts"]), int(config["denoising_steps"])
        calls = generation.outputs["calls"]
        decoders: list = []  # the reference's VAE, kept to draw the pictures

        def trajectory_and_predictions(pipe):
            denoiser = denoiser_of(pipe)
            dtype = next(denoiser.parameters()).dtype
            predictions = [
                first_tensor(denoiser(*cast_floats(args, dtype), **cast_floats(kwargs, dtype)))
                .double()
                .cpu()
                for args, kwargs, _ in calls
            ]
            if not decoders:  # the first call is the float32 reference's, before any cast
                decoders.append(PictureDecoder(pipe))
            return denoise(pipe, prompts, steps)["latents"], predictions

        reference, baseline = reference_and_baseline(
            self, config, dtype_name, precision, trajectory_and_predictions
        )
        return reference, baseline, decoders[0]

    def judge(self, config, generation, scored, label):
        (reference, reference_predictions), (baseline, baseline_predictions), decoder = scored
        verdict = latent_verdict(
            reference,
            baseline,
            generation.outputs["latents"],
            config["verification"],
            label,
            predictions=(
                reference_predictions,
                baseline_predictions,
                [prediction for _, _, prediction in generation.outputs["calls"]],
            ),
        )
        # What the run drew, beside what the reference drew (the verdict does not look at them).
        verdict["images"] = decoder.pictures(generation.outputs["latents"][-1], reference[-1])
        return verdict


PICTURE_SIDE = 128
"""The longest side of a recorded picture, in pixels."""
PICTURE_BYTES = 40_000
"""The most bytes of one recorded picture's PNG: a larger one is drawn again at half the side."""


class PictureDecoder:
    """Draws a text-to-image run's final latents as small PNG pictures (base64) with a float32
    CPU copy of the reference pipeline's VAE, the device's and the reference's alike: the
    pictures differ only where the denoising did."""

    def __init__(self, pipeline) -> None:
        import copy

        vae = getattr(pipeline, "vae", None)
        self.vae = None if vae is None else copy.deepcopy(vae).to("cpu", torch.float32)

    def pictures(self, device_latents, reference_latents) -> dict:
        """The record's ``images``: one picture per prompt of the device and of the reference,
        or none and why (a picture is shown, never judged: it cannot fail the run)."""
        pictures = {"format": "png", "max_side": PICTURE_SIDE, "device": [], "reference": []}
        try:
            if self.vae is None:
                raise ValueError("the pipeline has no vae component to decode its latents")
            pictures["device"] = self.draw(device_latents)
            pictures["reference"] = self.draw(reference_latents)
        except Exception as exc:
            pictures["device"], pictures["reference"] = [], []
            pictures["error"] = f"{type(exc).__name__}: {exc}"
        return pictures

    def draw(self, latents) -> list[str]:
        """Latents (batch, channels, height, width) as one base64 PNG per batch row."""
        x = torch.as_tensor(latents).detach().to("cpu", torch.float32)
        if x.dim() != 4:
            raise ValueError(
                f"latents of shape {tuple(x.shape)} are not (batch, channels, height, width)"
            )
        config = self.vae.config
        scaling = getattr(config, "scaling_factor", None) or 1.0
        shift = getattr(config, "shift_factor", None) or 0.0
        with torch.no_grad():
            images = self.vae.decode(x / scaling + shift, return_dict=False)[0]
        pixels = ((images.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
        return [png_base64(row) for row in pixels]


def png_base64(pixels) -> str:
    """One picture (channels, height, width; uint8) as a base64 PNG of at most PICTURE_SIDE
    pixels a side and PICTURE_BYTES bytes."""
    import base64
    import io

    from PIL import Image

    channels = pixels.shape[0]
    array = pixels[:3].permute(1, 2, 0).numpy() if channels >= 3 else pixels[0].numpy()
    image = Image.fromarray(array, "RGB" if channels >= 3 else "L")
    side = PICTURE_SIDE
    while True:
        small = image.copy()
        small.thumbnail((side, side))
        buffer = io.BytesIO()
        small.save(buffer, format="PNG", optimize=True)
        if buffer.tell() <= PICTURE_BYTES or side <= 8:
            return base64.b64encode(buffer.getvalue()).decode("ascii")
        side //= 2


def denoiser_of(pipeline):
    """The pipeline's denoising network: its ``unet`` or its ``transformer``."""
    for name in ("unet", "transformer"):
        module = getattr(pipeline, name, None)
        if module is not None:
            return module
    raise ValueError(f"{type(pipeline).__name__} has no unet or transformer component to compile")


def first_tensor(output):
    """A denoiser's prediction: its output tensor, or the first of a tuple / output class."""
    return output if hasattr(output, "dim") else output[0]


def map_tensors(value, fn):
    """``fn`` applied to every tensor in nested tuples, lists and dicts (others kept)."""
    if hasattr(value, "dim"):
        return fn(value)
    if isinstance(value, dict):
        return {key: map_tensors(item, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(item, fn) for item in value)
    return value


def cast_floats(value, dtype):
    """Floating-point tensors of a nested structure in ``dtype`` (on CPU)."""
    return map_tensors(value, lambda t: t.cpu().to(dtype) if t.is_floating_point() else t.cpu())


def denoise(pipeline, prompts: list[str], steps: int, record: bool = False) -> dict:
    """Run the pipeline from SEED: the latents after every step (CPU, float64) and, with
    ``record``, every denoiser call's inputs and prediction (CPU, as computed)."""
    latents: list = []
    calls: list = []

    def keep(pipe, step, timestep, tensors):
        latents.append(tensors["latents"].detach().clone())
        return tensors

    def note(module, args, kwargs, output):
        detached = (
            map_tensors(args, lambda t: t.detach().clone()),
            map_tensors(kwargs, lambda t: t.detach().clone()),
            first_tensor(output).detach().clone(),
        )
        calls.append(detached)

    hook = denoiser_of(pipeline).register_forward_hook(note, with_kwargs=True) if record else None
    try:
        pipeline(
            prompt=prompts,
            num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(SEED),
            output_type="pt",
            callback_on_step_end=keep,
        )
    finally:
        if hook is not None:
            hook.remove()
    return {
        "latents": [step.double().cpu() for step in latents],
        "calls": [
            (map_tensors(a, lambda t: t.cpu()), map_tensors(k, lambda t: t.cpu()), p.double().cpu())
            for a, k, p in calls
        ],
    }


def _relative_rows(value, reference):
    """Per batch row, ||value - reference|| / ||reference|| (float64)."""
    ref = torch.as_tensor(reference).double()
    rows = ref.reshape(ref.shape[0], -1)
    diff = torch.as_tensor(value).double().reshape(rows.shape) - rows
    return diff.norm(dim=-1) / rows.norm(dim=-1).clamp_min(1e-300)


def latent_verdict(
    reference,
    baseline,
    device,
    params: dict,
    dtype_name: str = "bfloat16",
    predictions=None,
) -> dict:
    """Judge a text-to-image run step by step against the reference and baseline (pure).

    ``reference``, ``baseline``, ``device``: the latents after every denoising step (batch
    first); the runs start from the same noise. ``predictions``: (reference, baseline, device)
    lists of the denoiser's prediction at every step, the reference's and the baseline's
    computed from the device's own inputs (teacher forced). Per step and batch row, an error is
    a relative error, ||x - reference|| / ||reference||. Checks, each the median and the maximum
    over (step, row) items against the baseline's same statistic (bounds ``max_error_ratio``,
    ``max_peak_ratio``):

    - denoiser: the device's predictions (a wrong timestep, a stale step, a corrupted block
      shows at the step it happens, whatever the scheduler does with it);
    - latents: the trajectory, what the pipeline hands on.
    """
    if not (len(reference) == len(baseline) == len(device)):
        raise ValueError(
            f"steps differ: reference {len(reference)}, baseline {len(baseline)}, device {len(device)}"
        )
    metrics, items = [], []
    if predictions is not None:
        ref_pred, base_pred, dev_pred = predictions
        if not (len(ref_pred) == len(base_pred) == len(dev_pred)):
            raise ValueError(
                "the denoiser predictions of reference, baseline and device differ in number"
            )
        device_err, baseline_err = [], []
        for step, (ref, base, dev) in enumerate(zip(ref_pred, base_pred, dev_pred, strict=True)):
            dev_rel, base_rel = _relative_rows(dev, ref), _relative_rows(base, ref)
            for row in range(dev_rel.shape[0]):
                device_err.append(float(dev_rel[row]))
                baseline_err.append(float(base_rel[row]))
                items.append(
                    {
                        "check": "denoiser",
                        "step": step,
                        "row": row,
                        "device_error": _figure(dev_rel[row]),
                        "baseline_error": _figure(base_rel[row]),
                    }
                )
        denoiser = item_statistics(
            "denoiser", device_err, baseline_err, params, "relative_error_floor"
        )
        denoiser["what"] = "relative error of the denoiser's prediction from the device's inputs"
        metrics.append(denoiser)
    device_err, baseline_err = [], []
    for step, (ref, base, dev) in enumerate(zip(reference, baseline, device, strict=True)):
        dev_rel, base_rel = _relative_rows(dev, ref), _relative_rows(base, ref)
        for row in range(dev_rel.shape[0]):
            device_err.append(float(dev_rel[row]))
            baseline_err.append(float(base_rel[row]))
            items.append(
                {
                    "check": "latents",
                    "step": step,
                    "row": row,
                    "device_error": _figure(dev_rel[row]),
                    "baseline_error": _figure(base_rel[row]),
                }
            )
    latents = item_statistics("latents", device_err, baseline_err, params, "relative_error_floor")
    latents["what"] = "relative latent error after a denoising step"
    metrics.append(latents)
    return task_verdict("latents", metrics, {}, items, params, dtype_name)


# ---- the task table

SCENARIOS: tuple[TaskScenario, ...] = (
    TextGeneration(),
    Text2TextGeneration(),
    SpeechRecognition(),
    SentenceEmbeddings(),
    TextClassification(),
    ImageClassification(),
    TextToImage(),
)


def scenario_for(task: str) -> TaskScenario:
    """The scenario that runs ``task`` (a Hub pipeline tag)."""
    for scenario in SCENARIOS:
        if task in scenario.tasks:
            return scenario
    known = ", ".join(t for s in SCENARIOS for t in s.tasks)
    raise ValueError(f"unsupported task {task!r}: run.py tests {known}")


# =========================================================================== Appendix B: devices
#
# One class per device backend (device, synchronization, peak memory, name, default compile and
# process-group backends); the stages only call it; select_backend picks one.

# The runner image's default base (images/runner/Dockerfile, ARG BASE_IMAGE; a test keeps the two in
# step with docs/neuron-releases.md): images/runner/torchneuron-base.Dockerfile built for Neuron
# SDK 2.33.0 (torch 2.14.0, torch-neuronx 2.14.3.0.*, neuronx-cc 2.28.7631.0).
TORCHNEURON_BASE_IMAGE = "model-support/torchneuron-base:sdk2.33.0"


class DeviceBackend:
    """The cpu backend, and the interface of the others: the device is this process."""

    name = "cpu"
    process_group = "gloo"  # the torch.distributed backend of a sharded run
    compile_backend = "inductor"  # torch.compile's backend unless the config names one
    device_is_host = True  # the device is this process: its name is known before setup
    whole_graph = False  # a graph break is an error (the compiled forward must be one graph)

    def device(self, rank: int, world_size: int):
        """This rank's torch device."""
        return torch.device("cpu")

    def start_runtime(self, device) -> float:
        """Prove the device runs work before any model is loaded: a tensor onto it, one op,
        synchronize. Returns the seconds it took; raises InfrastructureError (the device's
        runtime, not the model, is at fault) when it fails or computes a wrong value."""
        start = time.perf_counter()
        try:
            probe = torch.ones(4, dtype=torch.float32).to(device)
            total = (probe * 2).sum()
            self.synchronize()
            value = float(total.cpu())
        except Exception as exc:
            raise InfrastructureError(
                f"the {self.name} device {device} did not run a first operation "
                f"({type(exc).__name__}: {exc}): its runtime did not start, before any model "
                "was loaded"
            ) from exc
        if value != 8.0:
            raise InfrastructureError(
                f"the {self.name} device {device} computed {value} for sum(2 * ones(4)), not 8"
            )
        return time.perf_counter() - start

    def pin_compile_settings(self) -> dict:
        """Set what decides how the device compiler runs (before anything compiles) and
        return what was set, for the compilation block."""
        return {}

    def compiler_arguments(self, pinned: dict) -> list[str]:
        """The arguments the device compiler was called with, where the backend keeps them."""
        return []

    def runtime_settings(self) -> dict:
        """Stack fields read at setup, once the backend is chosen (Neuron: the LNC)."""
        return {}

    def synchronize(self) -> None:
        """Wait for queued device work, so timings and memory readings are complete."""

    def reset_peaks(self, device) -> None:
        """Start peak-memory accounting from now (the process's peak resident set too)."""
        # "5" resets VmHWM (peak RSS) of this process (Linux >= 4.0); unsupported elsewhere.
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

    def peak_memory(self, device) -> tuple[int | None, str | None]:
        """Peak device memory in bytes and which API gave it."""
        # cpu: the device is this process; its own peak resident set (anonymous + file-backed).
        return proc_status_bytes().get("VmHWM"), "/proc/self/status VmHWM"

    def device_name(self, device) -> str | None:
        """The accelerator's name (the processor on cpu)."""
        return platform.processor() or platform.machine()

    def compiler_version(self) -> str | None:
        """The device compiler's version where the backend has one of its own."""
        return None

    def compile_counts(self) -> tuple[int | None, int | None]:
        """Graphs the device compiler built and complete entries in its persistent cache
        (None, None: dynamo's and inductor's counters say it)."""
        return None, None

    def cache_probe(self) -> tuple[int, int | None] | None:
        """The compile cache's counters now, read before and after each compiled graph:
        (entries written, hits); hits None where only new entries can be seen; None where
        there is no cache to read. Here inductor's FX graph cache counts both."""
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        return int(inductor["fxgraph_cache_miss"]), int(inductor["fxgraph_cache_hit"])


class CudaBackend(DeviceBackend):
    """An NVIDIA GPU: one per rank."""

    name = "cuda"
    process_group = "nccl"
    device_is_host = False

    def device(self, rank, world_size):
        if world_size > 1:
            torch.cuda.set_device(rank)
        return torch.device("cuda", rank)

    def synchronize(self):
        torch.cuda.synchronize()

    def reset_peaks(self, device):
        torch.cuda.reset_peak_memory_stats()
        super().reset_peaks(device)

    def peak_memory(self, device):
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"

    def device_name(self, device):
        return torch.cuda.get_device_properties(device).name


class NeuronBackend(DeviceBackend):
    """Trainium through TorchNeuron: one NeuronCore per rank (the helpers below)."""

    name = "neuron"
    process_group = "neuron"
    compile_backend = "neuron"
    device_is_host = False
    # TorchNeuron's torch.compile reference: fullgraph=True "raises an error if graph breaks
    # occur, and is recommended for the Neuron path" (docs/trainium.md).
    whole_graph = True

    def pin_compile_settings(self):
        inherited = os.environ.get(FALLBACK_EXECUTION_ENV)
        os.environ[FALLBACK_EXECUTION_ENV] = "1"  # a failed compile raises, never runs eagerly
        note = f"disabled: {FALLBACK_EXECUTION_ENV}=1, set by run.py"
        if inherited not in (None, "1"):
            note += f" (the environment had {inherited!r})"
        debug_dir = os.environ.get(DEBUG_DIR_ENV)
        owned = None
        if not debug_dir:
            owned = debug_dir = tempfile.mkdtemp(prefix="model-support-neuron-backend-")
            os.environ[DEBUG_DIR_ENV] = debug_dir
        # Kept so that the compiler's arguments can be read; the run removes its own folder.
        os.environ[PRESERVE_ARTIFACTS_ENV] = "1"
        return {"fallback_execution": note, "debug_dir": debug_dir, "debug_dir_owned": owned}

    def compiler_arguments(self, pinned):
        directory = pinned.get("debug_dir")
        return compiler_arguments_in(directory) if directory else []

    def device(self, rank, world_size):
        return torch.device("neuron", rank) if world_size > 1 else torch.device("neuron")

    def runtime_settings(self):
        lnc, source = read_lnc()
        # The flags that set the float32 precision policy: the row says which were in effect.
        return {"lnc": lnc, "lnc_source": source, "compiler_flags": neuron_compiler_flags()}

    def synchronize(self):
        torch.neuron.synchronize()

    def reset_peaks(self, device):
        torch.neuron.reset_peak_memory_stats(device_index(device))
        super().reset_peaks(device)

    def peak_memory(self, device):
        self.synchronize()  # the Neuron allocator is asynchronous
        current = torch.accelerator.current_accelerator()
        accelerator_memory = (
            torch.accelerator.memory if current is not None and current.type == "neuron" else None
        )
        return first_peak(
            neuron_peak_sources(
                getattr(torch, "neuron", None), accelerator_memory, device_index(device)
            )
        )

    def device_name(self, device):
        return torch.neuron.get_device_properties(device).name

    def compiler_version(self):
        with contextlib.suppress(ImportError):
            import neuronxcc

            return getattr(neuronxcc, "__version__", None)
        return None

    def cache_probe(self):
        # A graph TorchNeuron compiles writes one NEFF entry unless the persistent cache had it;
        # eager ops write entries too, but never while a compiled graph compiles or first runs.
        directory = neff_cache_dir(dict(os.environ))
        return None if directory is None else (count_neff_entries(directory), None)

    def compile_counts(self):
        metrics = getattr(torch.neuron, "get_dynamo_metrics", None)
        cache_dir = neff_cache_dir(dict(os.environ))
        return (
            len(metrics()) if callable(metrics) else None,
            count_neff_entries(cache_dir) if cache_dir else None,
        )


BACKENDS: dict[str, DeviceBackend] = {
    backend.name: backend for backend in (NeuronBackend(), CudaBackend(), DeviceBackend())
}


def select_backend(requested: str) -> DeviceBackend:
    """neuron where TorchNeuron is installed, else cuda if available, else cpu (or the forced one).

    An installed torch_neuronx means Trainium was meant: one that fails to import, or the XLA-era
    library, is an infrastructure error naming the image to use, never a silent CPU fallback.
    """
    if neuron_intended(requested):
        try:
            import torch_neuronx  # noqa: F401  (registers the neuron device and compile backend)
        except Exception as exc:
            raise InfrastructureError(
                f"torch_neuronx failed to import ({type(exc).__name__}: {exc}); run in the "
                f"model-support runner image built on {TORCHNEURON_BASE_IMAGE}"
            ) from exc
        problem = native_neuron_problem(
            hasattr(torch, "neuron"),
            torch._dynamo.list_backends(exclude_tags=()),
            package_version("torch-neuronx"),
        )
        if problem:
            raise InfrastructureError(problem)
        return BACKENDS["neuron"]
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("backend 'cuda' was requested but torch.cuda.is_available() is False")
    return intended_backend(requested)


def intended_backend(requested: str) -> DeviceBackend:
    """The backend a run is meant for, importing no device library (for a failed run's record)."""
    if neuron_intended(requested):
        return BACKENDS["neuron"]
    if requested in ("cuda", "cpu"):
        return BACKENDS[requested]
    cuda = torch is not None and torch.cuda.is_available()
    return BACKENDS["cuda" if cuda else "cpu"]


def neuron_intended(requested: str) -> bool:
    """Whether this run is meant for Trainium: forced, or auto where torch_neuronx is installed."""
    return requested == "neuron" or (
        requested == "auto" and importlib.util.find_spec("torch_neuronx") is not None
    )


def native_neuron_problem(
    has_device_module: bool, compile_backends: list[str], torch_neuronx_version: str | None
) -> str | None:
    """Why the installed torch-neuronx is not the native TorchNeuron backend (None when it is).

    TorchNeuron (torch-neuronx 2.13 and later) registers the ``torch.neuron`` device module and
    the ``neuron`` torch.compile backend on import; the PyTorch/XLA library of the same name
    (2.9 and earlier) registers neither, and run.py cannot use it.
    """
    missing = []
    if not has_device_module:
        missing.append("the torch.neuron device module")
    if "neuron" not in compile_backends:
        missing.append('the "neuron" torch.compile backend')
    if not missing:
        return None
    return (
        f"torch-neuronx {torch_neuronx_version or '(version unknown)'} is installed but does not "
        f"register {' or '.join(missing)}, so it is not TorchNeuron, the native backend "
        "(torch-neuronx 2.13 and later; 2.9 and earlier are the PyTorch/XLA library). Run in the "
        f"model-support runner image built on {TORCHNEURON_BASE_IMAGE}."
    )


def resolve_compile_backend(name: str | None, backend: DeviceBackend):
    """A registered torch.compile backend name, or a callable from 'module:function'."""
    if name is None:
        return backend.compile_backend
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return getattr(importlib.import_module(module_name), attr)
    return name


def distributed_setup(ctx: RunContext, backend: DeviceBackend):
    """Process group and transformers DistributedConfig for a sharded run (None when single)."""
    if ctx.world_size == 1:
        return None
    from transformers.distributed import DistributedConfig

    torch.distributed.init_process_group(
        backend=backend.process_group,
        init_method="env://",
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
    # Rank 0's messages to the others while it localizes a FAIL come after generation, when
    # rank 0 may have verified for long: a gloo group of their own (on any device backend)
    # waits as long as the run may take.
    ctx.control_group = torch.distributed.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=float(ctx.config["worker_timeout_s"]))
    )
    if ctx.config["parallelism"] == "expert":
        # Experts split over the ranks, dense layers whole on every rank. transformers refuses an
        # empty tensor-parallel plan ("has no tp_plan"), so every entry of the model's plan is made
        # a replication; the expert-parallel plan takes precedence for the experts (docs/memory-model.md).
        import transformers

        auto_config = transformers.AutoConfig.from_pretrained(
            ctx.config["model"], **hub_arguments(ctx.config)
        )
        text_config = getattr(auto_config, "text_config", None) or auto_config
        base_plan = getattr(text_config, "base_model_tp_plan", None) or {}
        replicated = {"model." + key: "replicated_with_grad_allreduce" for key in base_plan}
        return DistributedConfig(tp_size=ctx.world_size, ep_size=ctx.world_size, tp_plan=replicated)
    return DistributedConfig(tp_size=ctx.world_size)


# ---- NeuronCores: one per worker


def parse_visible_cores(spec: str) -> list[int]:
    """The cores of a NEURON_RT_VISIBLE_CORES value: "3", "0-3", "3,4,5" or "0-1,4" (in order)."""
    cores: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        if not low.strip().isdigit() or (sep and not high.strip().isdigit()):
            raise InfrastructureError(
                f"NEURON_RT_VISIBLE_CORES={spec!r} is malformed: expected core indices and "
                "ranges such as 0-3 or 0,1,4"
            )
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise InfrastructureError(
                f"NEURON_RT_VISIBLE_CORES={spec!r} has the descending range {part!r}"
            )
        cores.extend(range(first, last + 1))
    if len(set(cores)) != len(cores):
        raise InfrastructureError(f"NEURON_RT_VISIBLE_CORES={spec!r} names a core twice")
    return cores


# Physical NeuronCores per device, by instance family (docs/hardware.md): a copy of
# model_support.hardware.PHYSICAL_CORES_PER_DEVICE, held equal by a test.
PHYSICAL_CORES_PER_DEVICE = {
    "trn2": 8,
    "trn2u": 8,
    "trn2p": 8,
    "trn2eu": 8,
    "trn3": 8,
    "trn1": 2,
    "trn1n": 2,
    "inf2": 2,
}


@dataclasses.dataclass(frozen=True)
class NeuronDevices:
    """The Neuron devices this process sees and how many (logical) cores each one has."""

    indices: tuple[int, ...]  # the N of every /dev/neuronN present, ascending
    cores_per_device: int | None  # None: the instance family or its LNC is unknown
    instance: str | None = None

    def cores(self) -> list[int]:
        """The runtime's core indices of these devices: device N holds cores N*c .. N*c+c-1
        (the runtime numbers cores across the host's devices, as NEURON_RT_VISIBLE_CORES does)."""
        per = self.cores_per_device or 0
        return [index * per + core for index in self.indices for core in range(per)]


def neuron_device_indices() -> list[int]:
    """The N of every /dev/neuronN this process sees, ascending."""
    indices: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(NEURON_DEVICE_DIR):
            if entry.startswith("neuron") and entry[len("neuron") :].isdigit():
                indices.append(int(entry[len("neuron") :]))
    return sorted(indices)


def neuron_devices(lnc: int | None, instance: str | None) -> NeuronDevices:
    """The devices of this process (/dev/neuronN) and their cores at ``lnc``."""
    physical = PHYSICAL_CORES_PER_DEVICE.get((instance or "").split(".")[0])
    per = physical // lnc if physical is not None and lnc is not None else None
    return NeuronDevices(tuple(neuron_device_indices()), per, instance)


def neuron_core_env(
    inherited: dict, rank: int, world_size: int, devices: NeuronDevices | None = None
) -> dict[str, str | None]:
    """Environment changes that give this process exactly one NeuronCore (None = unset).

    Rank r takes the r-th core of the inherited NEURON_RT_VISIBLE_CORES (on Kubernetes, the
    device plugin's allocation for the whole pod); TorchNeuron refuses a worker that sees more
    than one core and narrows the variable itself only when it is unset. Without the variable
    (the DRA driver need not set it) a sharded run takes the cores of the devices this process
    sees, not cores 0..n-1, which on a DRA claim of other devices are not the pod's; when those
    cannot be known the run stops as infrastructure, saying what to set. A single-core run asks
    the runtime for any one free core of its devices (NEURON_RT_NUM_CORES=1).
    """
    spec = (inherited.get("NEURON_RT_VISIBLE_CORES") or "").strip()
    if not spec:
        if world_size == 1:
            return {"NEURON_RT_NUM_CORES": "1"}
        cores, source = cores_of_devices(devices, world_size)
    else:
        cores, source = parse_visible_cores(spec), f"NEURON_RT_VISIBLE_CORES={spec!r}"
    if len(cores) < world_size:
        raise InfrastructureError(
            f"{world_size} workers need {world_size} NeuronCores but {source} makes only "
            f"{len(cores)} visible: request {world_size} cores for the pod "
            "(aws.amazon.com/neuroncore, or a DRA claim of enough devices) or run with fewer cores"
        )
    # NEURON_RT_VISIBLE_CORES takes precedence, but a stale core count must not linger.
    return {"NEURON_RT_VISIBLE_CORES": str(cores[rank]), "NEURON_RT_NUM_CORES": None}


def cores_of_devices(devices: NeuronDevices | None, world_size: int) -> tuple[list[int], str]:
    """The cores a sharded run takes when NEURON_RT_VISIBLE_CORES is unset, and their source."""
    unknown = (
        f"NEURON_RT_VISIBLE_CORES is unset, so the {world_size} workers' cores must come from "
        "the Neuron devices this pod holds, "
    )
    fix = (
        "; set NEURON_RT_VISIBLE_CORES to the pod's cores (the device plugin does; a DRA "
        "driver that does not needs it set from the claim)"
    )
    if devices is None or not devices.indices:
        raise InfrastructureError(unknown + f"and no {NEURON_DEVICE_DIR}/neuron* is present" + fix)
    if devices.cores_per_device is None:
        raise InfrastructureError(
            unknown + f"and the cores per device are unknown (instance type "
            f"{devices.instance or 'unknown'}, LNC unknown): set MODEL_SUPPORT_INSTANCE_TYPE and "
            "NEURON_LOGICAL_NC_CONFIG" + fix
        )
    names = ",".join(f"neuron{index}" for index in devices.indices)
    source = f"the devices present ({names}; {devices.cores_per_device} cores each)"
    return devices.cores(), source


def apply_env(changes: dict[str, str | None]) -> None:
    """Set (or, for None, unset) environment variables of this process."""
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# ---- Logical NeuronCore configuration

LNC_CONFIG_FILE = "/opt/aws/neuron/logical_nc_config"  # a node's LNC, set by its launch template
# A copy of model_support.hardware.LNC_DEFAULT_BY_FAMILY (run.py runs without the package); a
# test holds the two equal.
LNC_DEFAULT_BY_FAMILY = {
    "trn2": 2,
    "trn2u": 2,
    "trn2p": 2,
    "trn2eu": 2,
    "trn3": 2,
    "trn1": 1,
    "trn1n": 1,
    "inf2": 1,
}


# model_support.neuron_node.effective_lnc is the package's copy of this rule (its compile cache
# keys NEFFs by the LNC before run.py starts); tests/runner/test_trainium.py holds them equal.
def effective_lnc(
    environ: dict, config_file_text: str | None, instance: str | None
) -> tuple[int | None, str | None]:
    """The Logical NeuronCore size the runtime uses, and where that figure came from.

    The runtime reads NEURON_LOGICAL_NC_CONFIG; on EKS a node's launch template writes it to
    /opt/aws/neuron/logical_nc_config; otherwise the instance's default applies (2 on Trn2 and
    Trn3; Trn1 and Inf2 have no LNC setting, i.e. 1). Only 1 and 2 are valid.
    """

    def checked(value: str, source: str) -> tuple[int, str]:
        if value.strip() not in ("1", "2"):
            raise InfrastructureError(
                f"{source} sets the logical NeuronCore size to {value.strip()!r}; only 1 and 2 "
                "are supported"
            )
        return int(value), source

    if (environ.get("NEURON_LOGICAL_NC_CONFIG") or "").strip():
        return checked(environ["NEURON_LOGICAL_NC_CONFIG"], "NEURON_LOGICAL_NC_CONFIG")
    for line in (config_file_text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "NEURON_LOGICAL_NC_CONFIG" and value.strip():
            return checked(value, LNC_CONFIG_FILE)
    family = (instance or "").split(".")[0]
    if family in LNC_DEFAULT_BY_FAMILY:
        return LNC_DEFAULT_BY_FAMILY[family], f"default for {family}"
    return None, None


def read_lnc() -> tuple[int | None, str | None]:
    """effective_lnc for this process and machine."""
    text = None
    with contextlib.suppress(OSError), open(LNC_CONFIG_FILE, encoding="utf-8") as handle:
        text = handle.read()
    return effective_lnc(dict(os.environ), text, instance_type())


# ---- node preflight: can this node run a Trainium test at all?
#
# Each check is a pure function of facts gathered once (node_facts): the CPU tests drive every
# failure path, and `model-support doctor` prints the same checks for people (docs/trainium.md).

NEURON_DEVICE_DIR = "/dev"
NEURON_DRIVER_VERSION_FILE = "/sys/module/neuron/version"  # the kernel module's own version
TORCHNEURON_MIN_VERSION = (2, 13)  # torch-neuronx 2.13 and later is TorchNeuron; 2.9 was XLA


@dataclasses.dataclass(frozen=True)
class PreflightCheck:
    """One preflight check: its name, whether the node passes it, what was found, and (for a
    failure) what to do. ``applicable`` False: the check has nothing to check here (no Neuron
    device on this machine), which is neither a pass nor a failure."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    applicable: bool = True

    @property
    def status(self) -> str:
        """ok, FAILED or n/a."""
        if not self.applicable:
            return "n/a"
        return "ok" if self.ok else "FAILED"


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the preflight checks read, gathered by node_facts() (or written by a test)."""

    device_files: dict[str, str | None]  # /dev/neuronN -> None when usable, else why not
    versions: dict[str, str | None]  # torch-neuronx, neuronx-cc, torch
    driver_version: str | None
    environ: dict[str, str]
    lnc_file_text: str | None
    instance: str | None
    cache_dir_problem: str | None  # why TorchNeuron's NEFF cache folder cannot be written
    torch_requirement: str | None = None  # torch-neuronx's own requirement on torch


def check_device_files(device_files: dict[str, str | None], uid: int) -> PreflightCheck:
    """The Neuron devices are present and readable and writable by this user."""
    name = "device files"
    if not device_files:
        return PreflightCheck(
            name,
            False,
            f"no {NEURON_DEVICE_DIR}/neuron* device: this is not a Neuron instance, or the "
            "container was given none",
            fix="run on a trn2/trn3 instance; give the container its devices (request "
            "aws.amazon.com/neuroncore or a DRA claim, or docker run --device=/dev/neuron0)",
        )
    refused = {path: why for path, why in sorted(device_files.items()) if why is not None}
    if refused:
        path, why = next(iter(refused.items()))
        return PreflightCheck(
            name,
            False,
            f"{path} cannot be used by uid {uid}: {why} ({len(refused)} of {len(device_files)} "
            "devices); the runtime opens it read-write",
            fix="give the runner's user the devices' group (chart value "
            "runner.supplementalGroups) or the devices to the container",
        )
    return PreflightCheck(name, True, ", ".join(sorted(device_files)))


def version_tuple(version: str | None) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``2.14.3.0+abc`` -> (2, 14, 3, 0)."""
    parts: list[int] = []
    for part in (version or "").split("+", 1)[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def check_versions(
    versions: dict[str, str | None],
    driver_version: str | None,
    torch_requirement: str | None = None,
) -> PreflightCheck:
    """TorchNeuron (torch-neuronx 2.13 or later) and neuronx-cc are installed, and torch is the
    one torch-neuronx requires (each torch-neuronx family is built for one PyTorch: "install
    torch-neuronx==2.14.* with PyTorch 2.14", TorchNeuron release notes); reports the driver."""
    name = "versions"
    found = ", ".join(f"{dist} {versions.get(dist) or 'missing'}" for dist in sorted(versions))
    found += f", neuron driver {driver_version or 'unknown'}"
    neuronx = versions.get("torch-neuronx")
    image = (
        "run in the model-support runner image (images/runner/torchneuron-base.Dockerfile pins "
        "one Neuron SDK release's packages, docs/neuron-releases.md)"
    )
    if neuronx is None or versions.get("neuronx-cc") is None:
        return PreflightCheck(
            name,
            False,
            f"{found}: torch-neuronx and neuronx-cc must both be installed",
            fix=image,
        )
    if version_tuple(neuronx)[:2] < TORCHNEURON_MIN_VERSION:
        return PreflightCheck(
            name,
            False,
            f"{found}: torch-neuronx {neuronx} is the PyTorch/XLA library, not TorchNeuron "
            "(2.13 and later)",
            fix=image,
        )
    problem = requirement_problem(torch_requirement, versions.get("torch"))
    if problem:
        return PreflightCheck(
            name,
            False,
            f"{found}: torch-neuronx {neuronx} requires {torch_requirement}, {problem}",
            fix=f"install the torch torch-neuronx {neuronx} was built for ({torch_requirement}, "
            "from https://download.pytorch.org/whl/cpu), or the torch-neuronx family of the "
            f"installed torch; {image}",
        )
    return PreflightCheck(name, True, found)


def requirement_problem(requirement: str | None, installed: str | None) -> str | None:
    """Why ``installed`` does not satisfy the PEP 508 ``requirement`` (None when it does, or
    when there is no requirement to check). packaging, where importable, decides."""
    if not requirement:
        return None
    if installed is None:
        return "and torch is not installed"
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:
        return None  # nothing to judge with: the runtime will say
    specifier = Requirement(requirement).specifier
    public = Version(installed.split("+", 1)[0])
    if specifier.contains(public, prereleases=True):
        return None
    return f"but torch {installed} is installed"


def check_torchneuron(
    import_error: str | None,
    has_device_module: bool,
    compile_backends: list[str],
    version: str | None,
) -> PreflightCheck:
    """torch_neuronx imports and registers torch.neuron and the "neuron" compile backend."""
    name = "TorchNeuron"
    fix = (
        "run in the model-support runner image (torch-neuronx 2.13 or later, with the torch "
        "it requires)"
    )
    if import_error is not None:
        return PreflightCheck(
            name, False, f"torch_neuronx failed to import: {import_error}", fix=fix
        )
    problem = native_neuron_problem(has_device_module, compile_backends, version)
    if problem:
        return PreflightCheck(name, False, problem, fix=fix)
    return PreflightCheck(name, True, 'torch.neuron and the "neuron" compile backend registered')


def check_cores_and_lnc(
    environ: dict[str, str],
    lnc_file_text: str | None,
    instance: str | None,
    device_indices: list[int] | None = None,
) -> PreflightCheck:
    """The cores the runtime will be given and the LNC it will use, as run.py reads them."""
    name = "cores and LNC"
    try:
        lnc, source = effective_lnc(environ, lnc_file_text, instance)
        spec = (environ.get("NEURON_RT_VISIBLE_CORES") or "").strip()
        cores = parse_visible_cores(spec) if spec else None
    except InfrastructureError as exc:
        return PreflightCheck(
            name,
            False,
            str(exc),
            fix="set NEURON_LOGICAL_NC_CONFIG to 1 or 2 and NEURON_RT_VISIBLE_CORES to cores "
            "such as 0-3",
        )
    if lnc is None:
        return PreflightCheck(
            name,
            False,
            f"the logical NeuronCore size is unknown: no NEURON_LOGICAL_NC_CONFIG, no "
            f"{LNC_CONFIG_FILE} and no known instance type ({instance or 'none found'})",
            fix="set NEURON_LOGICAL_NC_CONFIG (the node's LNC) or MODEL_SUPPORT_INSTANCE_TYPE",
        )
    if cores is not None:
        visible = f"NEURON_RT_VISIBLE_CORES={spec} ({len(cores)} cores)"
    else:
        # What run.py does (neuron_core_env): one core asks for any free one; a sharded run
        # takes the cores of the devices this process sees, device N holding cores N*c ..
        devices = NeuronDevices(
            tuple(device_indices or ()),
            (PHYSICAL_CORES_PER_DEVICE.get((instance or "").split(".")[0]) or 0) // lnc or None,
            instance,
        )
        held = (
            f"the cores of its devices ({format_cores(devices.cores())})"
            if devices.indices and devices.cores_per_device
            else "the cores of its devices (none known here: it would stop as infrastructure)"
        )
        visible = (
            "NEURON_RT_VISIBLE_CORES unset: one core takes any free core; a sharded run takes "
            + held
        )
    return PreflightCheck(name, True, f"{visible}; LNC {lnc} ({source})")


def format_cores(cores: list[int]) -> str:
    """Core indices as NEURON_RT_VISIBLE_CORES writes them: ``0-3,8-11``."""
    parts: list[str] = []
    for core in cores:
        if parts and "-" not in parts[-1] and int(parts[-1]) == core - 1:
            parts[-1] = f"{parts[-1]}-{core}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == core - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{core}"
        else:
            parts.append(str(core))
    return ",".join(parts) or "none"


def check_fallback_setting(environ: dict[str, str]) -> PreflightCheck:
    """TorchNeuron's fallback execution is off: a graph that fails to compile raises rather than
    running eagerly (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION, default 1). run.py pins it for its
    own runs; set to 0 here it would silently change anything else run on this node."""
    name = "fallback setting"
    value = environ.get(FALLBACK_EXECUTION_ENV)
    if value is not None and value.strip().lower() in ("0", "false", "no", "off"):
        return PreflightCheck(
            name,
            False,
            f"{FALLBACK_EXECUTION_ENV}={value}: a graph that fails to compile runs eagerly "
            "instead of failing (run.py sets it to 1 for its own runs)",
            fix=f"unset {FALLBACK_EXECUTION_ENV} (its default, 1, is what model-support runs with)",
        )
    shown = (
        f"{FALLBACK_EXECUTION_ENV}={value}"
        if value is not None
        else f"{FALLBACK_EXECUTION_ENV} unset"
    )
    return PreflightCheck(name, True, f"{shown}: a failed compile raises (run.py pins 1)")


def check_compile_cache_dir(environ: dict[str, str], problem: str | None) -> PreflightCheck:
    """TorchNeuron's NEFF cache folder can be written (a miss is then cached for the next run)."""
    name = "compile cache folder"
    directory = neff_cache_dir(environ)
    if directory is None:
        return PreflightCheck(
            name, True, "TORCH_NEURONX_NEFF_DISABLE_CACHE is set: every run compiles cold"
        )
    if problem is not None:
        return PreflightCheck(
            name,
            False,
            f"{directory}: {problem}",
            fix="point TORCH_NEURONX_NEFF_CACHE_DIR at a folder this user can write",
        )
    return PreflightCheck(name, True, f"{directory} (TORCH_NEURONX_NEFF_CACHE_DIR) is writable")


def node_checks(facts: NodeFacts, uid: int) -> list[PreflightCheck]:
    """The preflight checks of the node itself, in the order a person would fix them."""
    indices = sorted(
        int(path.rsplit("neuron", 1)[1])
        for path in facts.device_files
        if path.rsplit("neuron", 1)[-1].isdigit()
    )
    return [
        check_device_files(facts.device_files, uid),
        check_versions(facts.versions, facts.driver_version, facts.torch_requirement),
        check_cores_and_lnc(facts.environ, facts.lnc_file_text, facts.instance, indices),
        check_compile_cache_dir(facts.environ, facts.cache_dir_problem),
    ]


def torchneuron_check() -> PreflightCheck:
    """check_torchneuron for this process (imports torch_neuronx, which starts no runtime)."""
    try:
        import torch_neuronx  # noqa: F401
    except Exception as exc:
        return check_torchneuron(f"{type(exc).__name__}: {exc}", False, [], None)
    return check_torchneuron(
        None,
        hasattr(torch, "neuron"),
        torch._dynamo.list_backends(exclude_tags=()),
        package_version("torch-neuronx"),
    )


def device_file_problem(path: str) -> str | None:
    """Why this user cannot open ``path`` read-write (None when it can), without opening it."""
    if not os.path.exists(path):
        return "missing"
    if not os.access(path, os.R_OK | os.W_OK):
        return "permission denied (no read-write access)"
    return None


def writable_dir_problem(directory: str) -> str | None:
    """Why ``directory`` (or, while it does not exist, the folder it would be made in) cannot be
    written by this user (None when it can)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable by uid {os.getuid()}"
    return None


def node_facts() -> NodeFacts:
    """The facts node_checks reads, from this process and machine."""
    devices: dict[str, str | None] = {}
    for index in neuron_device_indices():
        path = os.path.join(NEURON_DEVICE_DIR, f"neuron{index}")
        devices[path] = device_file_problem(path)
    driver = None
    with contextlib.suppress(OSError), open(NEURON_DRIVER_VERSION_FILE, encoding="utf-8") as handle:
        driver = handle.read().strip() or None
    lnc_text = None
    with contextlib.suppress(OSError), open(LNC_CONFIG_FILE, encoding="utf-8") as handle:
        lnc_text = handle.read()
    environ = dict(os.environ)
    cache_dir = neff_cache_dir(environ)
    return NodeFacts(
        device_files=devices,
        versions={dist: package_version(dist) for dist in ("torch", "torch-neuronx", "neuronx-cc")},
        driver_version=driver,
        torch_requirement=requirement_on("torch-neuronx", "torch"),
        environ=environ,
        lnc_file_text=lnc_text,
        instance=instance_type(),
        cache_dir_problem=writable_dir_problem(cache_dir) if cache_dir else None,
    )


def requirement_on(distribution: str, required: str) -> str | None:
    """``distribution``'s own requirement on ``required`` (e.g. ``torch==2.14.*``) from its
    installed metadata; None when either is not installed or it has none."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        text = requirement.split(";", 1)[0].strip()
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        if match and match.group(1).lower().replace("_", "-") == required:
            return text
    return None


SMOKE_MARKER = "MODEL_SUPPORT_SMOKE "


def smoke_main(requested: str = "neuron") -> int:
    """The device smoke test of ``model-support doctor`` (``python3 run.py --smoke-device
    BACKEND``, started by :func:`smoke_check`: the runtime may hang or abort its process): the
    backend, a tensor onto its first device, one op, synchronize.
    Prints one marked JSON line: ok, the device, the seconds, or the error (its class and fix)."""
    report: dict[str, Any] = {"ok": False, "backend": requested, "device": None}
    try:
        if torch is None:
            raise InfrastructureError(TORCH_UNAVAILABLE)
        backend = select_backend(requested)
        device = backend.device(0, 1)
        report.update(device=str(device), seconds=backend.start_runtime(device), ok=True)
        report["device_name"] = backend.device_name(device)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        report.update(error=text, error_class=classify("setup", exc), fix=fix_for(text))
    print(SMOKE_MARKER + json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


def preflight_failure(checks: list[PreflightCheck]) -> InfrastructureError | None:
    """The error a failed preflight is recorded as: infrastructure, naming the first failed check."""
    failed = [check for check in checks if not check.ok]
    if not failed:
        return None
    first = failed[0]
    others = f" (and {len(failed) - 1} more: run `model-support doctor`)" if len(failed) > 1 else ""
    fix = f"; fix: {first.fix}" if first.fix else ""
    return InfrastructureError(
        f"node preflight check '{first.name}' failed: {first.detail}{fix}{others}"
    )


# ---- the doctor's preflight: `model-support doctor` runs this script (it never imports it)
#
#   python3 run.py --preflight [--smoke auto|always] [--smoke-timeout SECONDS]
#
# prints one marked JSON line: the node checks above, the fallback setting, TorchNeuron's
# import, the device smoke test (in a process of its own, given its timeout; on a node with
# device files, or always), and the node facts the doctor's own checks read.

PREFLIGHT_MARKER = "MODEL_SUPPORT_PREFLIGHT "


def smoke_check(requested: str, timeout_s: float, env: dict | None = None) -> PreflightCheck:
    """The device smoke test (:func:`smoke_main`) in a process of its own, given ``timeout_s``
    (the runtime may hang or abort the process), quoting the runtime's own console lines when
    it fails."""
    import subprocess

    name = "smoke test"
    try:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--smoke-device", requested],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        written = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        console = runtime_lines(written.splitlines())
        return PreflightCheck(
            name,
            False,
            f"a tensor onto the {requested} device, one op and a synchronize did not finish "
            f"within {timeout_s:.0f} s" + _quoted(console),
            fix=fix_for("\n".join(console))
            or "the runtime hung at its first operation: see neuron-ls for processes holding "
            "the cores and dmesg for driver errors; reboot the instance if it recurs",
        )
    console = runtime_lines(done.stderr.splitlines())
    report = next(
        (
            json.loads(line[len(SMOKE_MARKER) :])
            for line in reversed(done.stdout.splitlines())
            if line.startswith(SMOKE_MARKER)
        ),
        None,
    )
    if report is None:
        return PreflightCheck(
            name,
            False,
            f"the smoke test's process ended (exit {done.returncode}) without a report"
            + _quoted(console or done.stderr.strip().splitlines()[-5:]),
            fix=fix_for(done.stderr)
            or "the runtime killed the process: see the lines above, dmesg and neuron-ls",
        )
    if report.get("ok"):
        seconds = report.get("seconds")
        return PreflightCheck(
            name,
            True,
            f"{report.get('device')} ({report.get('device_name') or 'name unknown'}): "
            f"sum(2 * ones(4)) = 8 in {seconds:.2f} s",
        )
    error = str(report.get("error") or "failed")
    return PreflightCheck(
        name,
        False,
        f"{error} ({report.get('error_class')})" + _quoted(console),
        fix=fix_for("\n".join([error, *console]))
        or report.get("fix")
        or "read the runtime's lines above; check the driver (lsmod | grep neuron), the devices "
        "given to this container (/dev/neuron*) and neuron-ls",
    )


def _quoted(lines: list[str]) -> str:
    return ("; the runtime wrote: " + " | ".join(lines)) if lines else ""


def preflight_report(smoke: str, smoke_timeout_s: float) -> dict:
    """What `model-support doctor` takes from run.py: its node checks, the fallback setting,
    TorchNeuron's import and the smoke test (``smoke``: ``always``, or ``auto``: where this node
    has Neuron device files), each as a dict, and the node facts its own checks read."""
    node = node_facts()
    spec = (node.environ.get("NEURON_RT_VISIBLE_CORES") or "").strip()
    try:
        visible = parse_visible_cores(spec) if spec else None
    except InfrastructureError:
        visible = None  # the cores check says why
    if smoke == "always" or node.device_files:
        smoked = smoke_check("neuron", smoke_timeout_s)
    else:
        smoked = PreflightCheck(
            "smoke test",
            True,
            "no Neuron device on this machine: nothing to run a first operation on",
            applicable=False,
        )
    checks = [*node_checks(node, os.getuid()), check_fallback_setting(node.environ)]
    return {
        "node": [dataclasses.asdict(check) for check in checks],
        "torchneuron": dataclasses.asdict(torchneuron_check()),
        "smoke": dataclasses.asdict(smoked),
        "driver_version": node.driver_version,
        "instance": node.instance,
        "visible_cores": visible,
    }


def doctor_main(argv: list[str]) -> int:
    """run.py's command line beyond ``python3 run.py`` (the test): ``--preflight`` for
    `model-support doctor`, ``--smoke-device BACKEND`` for its smoke test's own process."""
    import argparse

    parser = argparse.ArgumentParser(prog="run.py", description="See model-support doctor.")
    modes = parser.add_mutually_exclusive_group(required=True)
    modes.add_argument("--preflight", action="store_true", help="print the node's checks")
    modes.add_argument("--smoke-device", metavar="BACKEND", help="run the device smoke test")
    parser.add_argument("--smoke", choices=("auto", "always"), default="auto")
    parser.add_argument("--smoke-timeout", type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.smoke_device:
        return smoke_main(args.smoke_device)
    if args.smoke_timeout is None or not args.smoke_timeout > 0:
        parser.error("--preflight needs --smoke-timeout SECONDS (above 0)")
    report = preflight_report(args.smoke, args.smoke_timeout)
    print(PREFLIGHT_MARKER + json.dumps(report), flush=True)
    return 0


# ---- device memory


NEURON_SYSFS_ROOT = "/sys/devices/virtual/neuron_device"  # one neuronN/ folder per device


def read_runtime_device_memory(root: str = NEURON_SYSFS_ROOT) -> dict[str, int]:
    """Device memory the Neuron runtime and driver hold now, per category, in bytes, summed over
    every NeuronCore the driver's sysfs lists ({} where there is none: not a Neuron machine).

    Layout (Neuron sysfs user guide): ``neuronN/neuron_coreM/stats/memory_usage/device_mem/
    <category>/{total,present,peak}``, categories such as model_code, model_shared_scratchpad,
    runtime_memory, dma_rings, collectives, tensors; ``total`` is the current usage.
    """
    usage: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for device in sorted(os.listdir(root)):
            if not (device.startswith("neuron") and device[len("neuron") :].isdigit()):
                continue
            for core in sorted(os.listdir(os.path.join(root, device))):
                if not core.startswith("neuron_core"):
                    continue
                base = os.path.join(root, device, core, "stats", "memory_usage", "device_mem")
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    for category in sorted(os.listdir(base)):
                        with open(os.path.join(base, category, "total"), encoding="utf-8") as f:
                            usage[category] = usage.get(category, 0) + int(f.read().split()[0])
    return usage


def runtime_memory_growth(
    before: dict[str, int] | None, after: dict[str, int]
) -> tuple[int | None, dict[str, int] | None]:
    """What a run added to the runtime's device memory: the total and each category that grew.

    None where sysfs gave nothing (not Neuron, or no reading before the runtime started).
    """
    if before is None or not after:
        return None, None
    grown = {cat: after[cat] - before.get(cat, 0) for cat in sorted(after)}
    return sum(grown.values()), {cat: bytes_ for cat, bytes_ in grown.items() if bytes_ > 0}


def device_index(device) -> int | None:
    return None if device is None else device.index


def proc_status_bytes() -> dict[str, int]:
    """VmHWM / VmRSS / RssAnon / RssFile of this process, in bytes (Linux)."""
    out: dict[str, int] = {}
    if not os.path.exists("/proc/self/status"):
        return out  # not Linux: the figures stay null
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def peak_from_stats(stats) -> int | None:
    """The allocated-bytes peak of a memory_stats() result, nested or flat.

    TorchNeuron nests it (``stats["allocated_bytes"]["peak"]``); torch's nested form adds the
    pool (``["allocated_bytes"]["all"]["peak"]``); torch.accelerator's is flat
    (``"allocated_bytes.all.peak"``).
    """
    if not stats:
        return None
    if "allocated_bytes.all.peak" in stats:
        return int(stats["allocated_bytes.all.peak"])
    allocated = stats.get("allocated_bytes")
    if isinstance(allocated, dict):
        if "peak" in allocated:
            return int(allocated["peak"])
        pool = allocated.get("all")
        if isinstance(pool, dict) and "peak" in pool:
            return int(pool["peak"])
    return None


def neuron_peak_sources(neuron, accelerator_memory, index) -> list[tuple[str, Any]]:
    """Where a Neuron run's peak device memory can be read, in order of preference.

    TorchNeuron's own function first, then torch.accelerator.memory (torch's device-generic API,
    given only when the current accelerator is neuron), then the memory_stats of each.
    """
    sources: list[tuple[str, Any]] = []
    if callable(getattr(neuron, "max_memory_allocated", None)):
        sources.append(
            ("torch.neuron.max_memory_allocated", lambda: neuron.max_memory_allocated(index))
        )
    if callable(getattr(accelerator_memory, "max_memory_allocated", None)):
        sources.append(
            (
                "torch.accelerator.memory.max_memory_allocated",
                lambda: accelerator_memory.max_memory_allocated(index),
            )
        )
    if callable(getattr(neuron, "memory_stats", None)):
        sources.append(
            (
                'torch.neuron.memory_stats()["allocated_bytes"]["peak"]',
                lambda: peak_from_stats(neuron.memory_stats(index)),
            )
        )
    if callable(getattr(accelerator_memory, "memory_stats", None)):
        sources.append(
            (
                'torch.accelerator.memory.memory_stats()["allocated_bytes.all.peak"]',
                lambda: peak_from_stats(accelerator_memory.memory_stats(index)),
            )
        )
    return sources


def first_peak(sources: list[tuple[str, Any]]) -> tuple[int | None, str | None]:
    """The first figure a source gives, and that source's name (None, None when none does)."""
    for name, read in sources:
        value = read()
        if value is not None:
            return int(value), name
    return None, None


# ---- the stack: versions of everything that decides the outcome

STACK_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "huggingface_hub": "huggingface_hub",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "torch_neuronx": "torch-neuronx",
    "neuronx_cc": "neuronx-cc",
    # the libraries of the tasks beyond text generation: sentence-transformers, diffusers
    "sentence_transformers": "sentence-transformers",
    "diffusers": "diffusers",
}


def instance_type() -> str | None:
    """EC2 instance type where the environment or DMI tells it."""
    for var in ("MODEL_SUPPORT_INSTANCE_TYPE", "INSTANCE_TYPE"):
        if os.environ.get(var):
            return os.environ[var]
    with contextlib.suppress(OSError), open("/sys/devices/virtual/dmi/id/product_name") as handle:
        name = handle.read().strip()
        if "." in name:  # EC2 reports e.g. "trn2.48xlarge"
            return name
    return None


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_stack(backend: DeviceBackend) -> dict:
    """Versions of everything that decides the outcome (the device's name is added at setup)."""
    stack: dict[str, Any] = {key: package_version(dist) for key, dist in STACK_PACKAGES.items()}
    if stack["neuronx_cc"] is None:
        stack["neuronx_cc"] = backend.compiler_version()
    stack["python"] = platform.python_version()
    stack["os"] = platform.platform()
    stack["instance_type"] = instance_type()
    stack["device_name"] = backend.device_name(None) if backend.device_is_host else None
    # Read at setup (DeviceBackend.runtime_settings), on the neuron backend only.
    stack["lnc"] = stack["lnc_source"] = stack["compiler_flags"] = None
    return stack


def installed_packages() -> list[str]:
    """Every installed distribution as name==version, sorted."""
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return sorted(seen.values(), key=str.lower)


# ---- compilation: graphs, graph breaks, cache hits


@dataclasses.dataclass
class CompileCounts:
    """Process-wide compilation counters at one moment; two readings bracket a stage."""

    graphs: int  # torch._dynamo: graphs captured
    graph_breaks: int  # torch._dynamo: graph breaks (all reasons)
    fx_cache_hits: int  # inductor's FX graph cache (the CPU/GPU stand-in for the NEFF cache)
    fx_cache_misses: int
    neuron_graphs: int | None  # TorchNeuron: graphs compiled to NEFF (get_dynamo_metrics)
    neff_entries: int | None  # complete entries in the persistent NEFF cache
    graph_break_reasons: dict[str, int] = dataclasses.field(default_factory=dict)  # dynamo's


def count_neff_entries(directory: str) -> int:
    """Complete NEFF cache entries under directory (a zero-size file reads as a miss)."""
    count = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if name.endswith(".neff") and not name.startswith(".tmp"):
                with contextlib.suppress(OSError):
                    count += os.path.getsize(os.path.join(root, name)) > 0
    return count


FALLBACK_EXECUTION_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
DEBUG_DIR_ENV = "TORCH_NEURONX_DEBUG_DIR"  # TorchNeuron's compilation artifacts
PRESERVE_ARTIFACTS_ENV = "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"
MAX_COMPILER_COMMANDS = 5
_BINARY_ARTIFACTS = (".neff", ".pb", ".mlir", ".mlirbc", ".bc", ".bin", ".so", ".ntff", ".hlo")
_PATH_LIKE = re.compile(r"[\\/]|\.(?:neff|pb|mlir|mlirbc|hlo|json|txt|log)$")


def compiler_arguments_in(directory: str, limit_bytes: int = 256 * 1024) -> list[str]:
    """The neuronx-cc command lines found in TorchNeuron's debug folder (its compilation
    artifacts), paths left out, each distinct one once (at most MAX_COMPILER_COMMANDS).

    Which artifact holds the command is not documented: every small text file is read for a
    line that calls ``neuronx-cc`` (docs/trainium.md, "Compiled means the whole graph")."""
    commands: dict[str, None] = {}
    for root, _dirs, files in os.walk(directory):
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(_BINARY_ARTIFACTS):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if os.path.getsize(path) > limit_bytes:
                    continue
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                for line in text.splitlines():
                    if "neuronx-cc" not in line:
                        continue
                    try:
                        words = shlex.split(line)
                    except ValueError:
                        words = line.split()
                    words = [w.strip("[]',\"") for w in words]
                    start = next((i for i, w in enumerate(words) if w.endswith("neuronx-cc")), 0)
                    kept = ["neuronx-cc"] + [
                        w for w in words[start + 1 :] if w and not _PATH_LIKE.search(w)
                    ]
                    commands[" ".join(kept)] = None
    return list(commands)[:MAX_COMPILER_COMMANDS]


def neff_cache_dir(environ: dict) -> str | None:
    """TorchNeuron's persistent NEFF cache directory (None when caching is disabled)."""
    if environ.get("TORCH_NEURONX_NEFF_DISABLE_CACHE", "").lower() in ("1", "true", "yes"):
        return None
    return environ.get("TORCH_NEURONX_NEFF_CACHE_DIR") or "/tmp/neff_cache"


@dataclasses.dataclass
class GraphCompile:
    """One graph dynamo handed to the compile backend, and what the cache did for it: entries
    written and hits counted from its compile to the end of its first call (where a backend
    that compiles lazily compiles)."""

    index: int
    new_entries: int | None = None
    hits: int | None = None

    @property
    def outcome(self) -> str | None:
        """ "miss" (it wrote an entry), "hit" (it came from the cache), None (no cache seen)."""
        if self.new_entries is None:
            return None
        if self.new_entries > 0:
            return "miss"
        if self.hits is None:  # only new entries are visible: compiled without writing one
            return "hit"
        return "hit" if self.hits > 0 else None  # no lookup at all (aot_eager): no verdict


class GraphLedger:
    """Wraps a torch.compile backend to count cache hits and misses per compiled graph.

    A process-wide count of new cache entries also counts what the eager ops around the graphs
    write (TorchNeuron caches those too), so cold and warm would not mean what they say.
    ``probe`` is the backend's :meth:`DeviceBackend.cache_probe`. ``running`` is the index of the
    compiled graph being called right now (None between graphs), for :class:`FallbackWatch`.
    """

    def __init__(self, probe) -> None:
        self.probe = probe
        self.graphs: list[GraphCompile] = []
        self.running: int | None = None

    def wrap(self, compile_backend):
        """A torch.compile backend that compiles with ``compile_backend`` (a registered name or
        a callable) and records each graph it is given."""
        if isinstance(compile_backend, str):
            inner = torch._dynamo.lookup_backend(compile_backend)
        else:
            inner = compile_backend

        def compile_graph(graph_module, example_inputs, **kwargs):
            record = GraphCompile(len(self.graphs))
            self.graphs.append(record)
            start = self.probe()
            compiled = inner(graph_module, example_inputs, **kwargs)
            first = [True]

            def call(*args):
                outer, self.running = self.running, record.index
                try:
                    if not first:
                        return compiled(*args)
                    try:
                        return compiled(*args)
                    finally:
                        first.clear()
                        self._note_first_call(record, start)
                finally:
                    self.running = outer

            # The calling convention dynamo reads from what a backend returns (boxed arguments).
            if getattr(compiled, "_boxed_call", False):
                call._boxed_call = True  # type: ignore[attr-defined]
            return call

        return compile_graph

    def _note_first_call(self, record: GraphCompile, start) -> None:
        """What the cache did from ``record``'s compile to the end of its first call."""
        end = self.probe()
        if start is not None and end is not None:
            record.new_entries = end[0] - start[0]
            if start[1] is not None and end[1] is not None:
                record.hits = end[1] - start[1]


class NotCompiled(RuntimeError):
    """Part of a compiled call did not, or would not, run compiled: an ERROR ``compile`` whose
    reason (the vocabulary's CompileFailure, :attr:`reason`) says which part and why."""

    reason = "compiler-error"


class EagerFallback(NotCompiled):
    """torch.compile recompiled past Dynamo's recompile limit: Dynamo would run the rest of
    the call eagerly, so the run would not measure the compiled stack. In a decode this is a
    recompile at every step (a guard on a value that changes per step, such as a static
    sliding-window cache's length kept as a Python int)."""

    reason = "recompiles-per-step"


class CpuFallback(NotCompiled):
    """TorchNeuron ran part of a compiled graph on the CPU (an operator it does not lower,
    "runs on the CPU and the result is copied back"), or fell back to running a graph eagerly."""

    reason = "cpu-fallback"


MAX_RECOMPILE_REASONS = 3
MAX_FALLBACK_REPORTS = 10


def watch_recompiles() -> None:
    """Start Dynamo's compilation log afresh: recompiles() reads what was compiled since."""
    from torch._dynamo import utils

    utils.set_compilation_metrics_limit(4096)  # default 64: a long decode must not drop any
    utils.clear_compilation_metrics()


def recompiles() -> tuple[int, list[str]]:
    """The recompiles since watch_recompiles() and their first distinct reasons, as Dynamo gives
    them (the guard that failed, e.g. ``0/1: cache_position[0] == 12``)."""
    from torch._dynamo.utils import get_compilation_metrics

    reasons = [m.recompile_reason for m in get_compilation_metrics() if m.recompile_reason]
    distinct = dict.fromkeys(" ".join(r.split("#")[0].split()) for r in reasons)
    return len(reasons), list(distinct)[:MAX_RECOMPILE_REASONS]


@contextlib.contextmanager
def eager_fallback_refused():
    """Within it, Dynamo's recompile limit is a hard error rather than a silent switch to eager
    execution, raised as an EagerFallback that says how often it recompiled and why."""
    import torch._dynamo
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            yield
    except FailOnRecompileLimitHit as exc:
        count, reasons = recompiles()
        raise EagerFallback(
            f"the compiled call recompiled {count} times and hit torch._dynamo's recompile_limit "
            f"({torch._dynamo.config.recompile_limit}): it recompiles at every step, so Dynamo "
            "would run the rest eagerly and the run would not measure the compiled stack (each "
            f"recompile is a device compile); Dynamo's guard: {'; '.join(reasons) or 'not given'}"
        ) from exc


@dataclasses.dataclass(frozen=True)
class Fallback:
    """One report of work TorchNeuron did not run compiled on the device."""

    message: str
    graph: int | None  # the compiled graph running when it was reported; None: between graphs

    def describe(self) -> str:
        where = "between compiled graphs" if self.graph is None else f"compiled graph {self.graph}"
        return f"{where}: {self.message}"


class FallbackWatch:
    """What TorchNeuron reported running on the CPU (or eagerly) while the compiled calls ran,
    from its log records (logger ``torch_neuronx``) and Python warnings, each noted with the
    compiled graph that was running (:class:`GraphLedger`'s ``running``).

    TorchNeuron's operator table marks operators CPU_FALLBACK: "the named ATen operator runs
    on the CPU and the result is copied back to the Neuron device"; with fallback execution
    enabled a graph that fails on the device runs eagerly ("Falling back to original
    GraphModule execution"). Either inside a compiled graph means that graph did not run
    compiled (docs/trainium.md, "Compiled means the whole graph").
    """

    PATTERN = re.compile(r"fall(?:s|ing|en)?[ _-]?back", re.IGNORECASE)
    WHERE = ("cpu", "eager", "graphmodule")

    def __init__(self) -> None:
        self.seen: list[Fallback] = []

    def note(self, text: str, graph: int | None) -> None:
        """Keep ``text`` when it reports a fallback to the CPU or to eager execution."""
        first = (text.strip().splitlines() or [""])[0][:300]
        lowered = first.lower()
        if self.PATTERN.search(first) and any(word in lowered for word in self.WHERE):
            self.seen.append(Fallback(first, graph))

    @contextlib.contextmanager
    def watching(self, ledger: GraphLedger):
        import logging
        import warnings

        watch = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                watch.note(record.getMessage(), ledger.running)

        handler = Handler()
        logger = logging.getLogger("torch_neuronx")
        logger.addHandler(handler)
        with warnings.catch_warnings():
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                watch.note(str(message), ledger.running)
                shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            try:
                yield self
            finally:
                logger.removeHandler(handler)

    def in_graphs(self) -> list[Fallback]:
        return [f for f in self.seen if f.graph is not None]

    def reports(self) -> list[str]:
        """Each distinct report, in order (at most MAX_FALLBACK_REPORTS)."""
        return list(dict.fromkeys(f.describe() for f in self.seen))[:MAX_FALLBACK_REPORTS]

    def raise_for_graphs(self) -> None:
        """A CpuFallback when anything inside a compiled graph did not run compiled."""
        inside = list(dict.fromkeys(f.describe() for f in self.in_graphs()))
        if inside:
            raise CpuFallback(
                f"{len(inside)} part(s) of the compiled graphs did not run compiled on the "
                f"device (TorchNeuron fell back to the CPU or to eager execution): "
                + "; ".join(inside[:MAX_FALLBACK_REPORTS])
            )


@contextlib.contextmanager
def compiled_as_required(backend: DeviceBackend, ledger: GraphLedger, watch: FallbackWatch):
    """Run the compiled calls under the backend's compile policy: never past Dynamo's recompile
    limit (every backend); where the backend requires the whole graph (neuron, as TorchNeuron's
    torch.compile reference recommends with fullgraph=True), a graph break is an error and so
    is a fallback inside a compiled graph."""
    import torch._dynamo

    with (
        eager_fallback_refused(),
        torch._dynamo.error_on_graph_break(backend.whole_graph),
        watch.watching(ledger),
    ):
        yield
    if backend.whole_graph:
        watch.raise_for_graphs()


def compile_policy(backend: DeviceBackend | None, pinned: dict | None = None) -> dict:
    """The compilation block's record of how the run compiles: whether a graph break is an
    error (``whole_graph``), the fallback setting run.py pinned (``pinned``, from
    :meth:`DeviceBackend.pin_compile_settings`); the fallbacks seen and the compiler's arguments are
    filled in once the compiled calls ran."""
    return {
        "whole_graph": None if backend is None else backend.whole_graph,
        "fallback_execution": (pinned or {}).get("fallback_execution"),
        "fallback_ops": [],
        "compiler_args": [],
    }


def read_compile_counts(backend: DeviceBackend) -> CompileCounts:
    """The compilation counters now: dynamo's and inductor's, and the device compiler's."""
    from torch._dynamo.utils import counters

    neuron_graphs, neff_entries = backend.compile_counts()
    return CompileCounts(
        graphs=int(counters["stats"]["unique_graphs"]),
        graph_breaks=int(sum(counters["graph_break"].values())),
        fx_cache_hits=int(counters["inductor"]["fxgraph_cache_hit"]),
        fx_cache_misses=int(counters["inductor"]["fxgraph_cache_miss"]),
        neuron_graphs=neuron_graphs,
        neff_entries=neff_entries,
        graph_break_reasons={str(k): int(v) for k, v in counters["graph_break"].items()},
    )


def compilation_summary(
    before: CompileCounts,
    after: CompileCounts,
    compiled_graphs: list[GraphCompile] | None = None,
    timed_call_graphs: int | None = None,
    recompiled: tuple[int, list[str]] | None = None,
    policy: dict | None = None,
) -> dict:
    """What compiling took between two readings: graphs, breaks, and whether the cache served it.

    On neuron a graph counts once TorchNeuron compiled it to a NEFF, and a cache miss is a new
    entry in the persistent NEFF cache; elsewhere dynamo counts graphs and inductor's FX graph
    cache counts hits and misses. With ``compiled_graphs`` (a :class:`GraphLedger`'s) hits and misses
    are counted per compiled graph, and NEFF entries written outside every graph (eager ops)
    are counted apart, never as misses. ``cache_hit`` is true when every compiled graph came
    from the cache (compile_s is then mostly loading), null where no cache was consulted.
    ``timed_call_graphs``: graphs compiled during the timed (second) call, 0 when the first
    call compiled everything. ``recompiled``: Dynamo's recompiles and their reasons
    (:func:`recompiles`). ``policy``: what ran compiled and how (:func:`compile_policy`, with
    the fallbacks seen and the compiler's arguments), copied in.
    """
    if after.neuron_graphs is not None and before.neuron_graphs is not None:
        graphs, source = (
            after.neuron_graphs - before.neuron_graphs,
            "torch.neuron.get_dynamo_metrics",
        )
    else:
        graphs, source = after.graphs - before.graphs, "torch._dynamo.utils.counters"
    hits: int | None
    misses: int | None
    if after.neff_entries is not None and before.neff_entries is not None:
        misses = max(after.neff_entries - before.neff_entries, 0)
        hits, cache = max(graphs - misses, 0), "neff"
    elif (after.fx_cache_hits + after.fx_cache_misses) > (
        before.fx_cache_hits + before.fx_cache_misses
    ):
        hits = after.fx_cache_hits - before.fx_cache_hits
        misses = after.fx_cache_misses - before.fx_cache_misses
        cache = "inductor-fx-graph"
    else:
        hits = misses = cache = None
    outcomes = [g.outcome for g in compiled_graphs or []]
    per_graph = any(outcome is not None for outcome in outcomes)
    outside = None
    if per_graph:
        hits, misses = outcomes.count("hit"), outcomes.count("miss")
        if cache == "neff" and after.neff_entries is not None and before.neff_entries is not None:
            written = after.neff_entries - before.neff_entries
            outside = max(written - sum(g.new_entries or 0 for g in compiled_graphs or []), 0)
        cache = cache or "inductor-fx-graph"
    return {
        "graphs": graphs,
        "graph_breaks": after.graph_breaks - before.graph_breaks,
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit": None if hits is None else (misses == 0 and hits > 0),
        "cache": cache,
        "source": source,
        "cache_per_graph": per_graph,
        "cache_entries_outside_graphs": outside,
        "timed_call_graphs": timed_call_graphs,
        "recompiles": None if recompiled is None else recompiled[0],
        "recompile_reasons": [] if recompiled is None else list(recompiled[1]),
        "graph_break_reasons": [
            " ".join(reason.split())[:300]
            for reason, count in after.graph_break_reasons.items()
            if count > before.graph_break_reasons.get(reason, 0)
        ][:MAX_RECOMPILE_REASONS],
        **compile_policy(None),
        **(policy or {}),
    }


# =========================================================================== Appendix C: verdict
#
# The output is compared with a float32 CPU reference, relative to the same pass in a correct
# run's arithmetic (the baseline). Method and sources: docs/verification.md.

# The verification settings that are not thresholds (the record keeps the thresholds as numbers).
NON_NUMERIC_PARAMETERS = ("enabled", "float32_precision", "localize")

TOP_K_NOISE = 8  # reference top-k tokens whose baseline deviation sets a position's noise level


# The arithmetic a correct compile backend may use in a float32 run, which the float32 baseline
# reproduces: "ieee" is strict float32 (the baseline is the reference itself); "tf32" rounds
# every matmul and convolution operand to TF32 (10 mantissa bits) and "bf16" every matmul operand
# to bfloat16, both accumulating in float32. docs/verification.md gives the sources.
FLOAT32_PRECISIONS = ("ieee", "tf32", "bf16")


FLOAT32_PRECISION_BY_BACKEND = {
    # neuronx-cc leaves float32 as float32 (--auto-cast none) since 2.22 (Neuron 2.27.0), unless
    # NEURON_CC_FLAGS asks otherwise: neuron_float32_precision reads the flags actually used.
    "neuron": "ieee",
    "cuda": "tf32",  # PyTorch runs cuDNN convolutions in TF32 by default; matmuls by one setting
    "cpu": "ieee",  # inductor on CPU keeps float32 arithmetic float32
}


# What can fail a run: a token the reference clearly rejects, or one of the logit statistics;
# for the tasks beyond text generation also a top-1 class, a similarity ranking, the embeddings'
# angle or length, or the latents of a denoising step (the task sections below).
VERDICT_CHECKS = (
    "tokens",
    "median",
    "q90",
    "peak",
    "kl",
    "top1",
    "ranking",
    "cosine",
    "norm",
    "latents",
    "denoiser",
)


# Matmul-like ops and the positions of the operands a matrix engine reads.
MATMUL_OPERANDS = {
    "linear": (0, 1),
    "matmul": (0, 1),
    "__matmul__": (0, 1),
    "__rmatmul__": (0, 1),
    "mm": (0, 1),
    "bmm": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "_grouped_mm": (0, 1),
    "conv1d": (0, 1),
    "conv2d": (0, 1),
    "conv3d": (0, 1),
}


def float32_precision(params: dict, backend: str, compiler_flags: str | None = None) -> str:
    """The float32 arithmetic the baseline reproduces: the configured one, else the backend's
    (on neuron, what the compiler flags in effect, ``compiler_flags``, make neuronx-cc do)."""
    configured = params.get("float32_precision", "auto")
    if configured in FLOAT32_PRECISIONS:
        return configured
    if backend == "neuron":
        return neuron_float32_precision(compiler_flags)
    return FLOAT32_PRECISION_BY_BACKEND.get(backend, "ieee")


def neuron_compiler_flags() -> str | None:
    """The options neuronx-cc compiles with beyond TorchNeuron's own (NEURON_CC_FLAGS), or
    None when unset: the float32 precision policy is read from them and the row records them."""
    return (os.environ.get("NEURON_CC_FLAGS") or "").strip() or None


def neuron_float32_precision(compiler_flags: str | None) -> str:
    """The float32 matmul arithmetic of neuronx-cc under ``compiler_flags`` (NEURON_CC_FLAGS).

    ``--auto-cast`` is none (float32 stays float32) by default since neuronx-cc 2.22; matmult or
    all casts to ``--auto-cast-type`` (bf16 by default; the right-most option wins). fp16 keeps
    TF32's 10 mantissa bits, so its operands are judged as tf32; fp8 has no baseline of its own
    and is judged as bf16 (stricter than its arithmetic).
    """
    mode, cast_type = "none", "bf16"
    tokens = (compiler_flags or "").split()
    for i, token in enumerate(tokens):
        name, equals, value = token.partition("=")
        if not equals:
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
        if name == "--auto-cast":
            mode = value
        elif name == "--auto-cast-type":
            cast_type = value
    if mode == "none":
        return "ieee"
    return {"tf32": "tf32", "fp16": "tf32"}.get(cast_type, "bf16")


def reduced_precision(precision: str):
    """A context in which float32 matmuls read operands rounded to TF32 or bfloat16.

    Products and sums stay float32, as on a matrix engine with float32 accumulation; everything
    else (norms, softmax, activations) is untouched. "ieee" changes nothing.
    """

    if precision == "ieee":
        return contextlib.nullcontext()

    def rounded(x):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
            return x
        if precision == "bf16":
            return x.to(torch.bfloat16).to(torch.float32)
        bits = x.contiguous().view(torch.int32)  # TF32: drop 13 of the 23 mantissa bits, rounded
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)

    def attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs
    ):
        # scaled_dot_product_attention written out, so both of its matmuls read rounded operands.
        if kwargs.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
            repeat = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(repeat, dim=-3)
            value = value.repeat_interleave(repeat, dim=-3)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        scores = torch.matmul(rounded(query), rounded(key).transpose(-2, -1)) * scale
        if is_causal:
            causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            scores = (
                scores.masked_fill(~attn_mask, float("-inf"))
                if attn_mask.dtype == torch.bool
                else scores + attn_mask
            )
        return torch.matmul(rounded(torch.softmax(scores, dim=-1)), rounded(value))

    class RoundedMatmuls(torch.overrides.TorchFunctionMode):
        # Inside __torch_function__ the mode is off, so the ops called here are not re-entered.
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name == "scaled_dot_product_attention":
                return attention(*args, **kwargs)
            if name == "einsum":
                operands = [
                    [rounded(a) for a in arg] if isinstance(arg, (list, tuple)) else rounded(arg)
                    for arg in args[1:]
                ]
                return func(args[0], *operands, **kwargs)
            positions = MATMUL_OPERANDS.get(name, ())
            args = tuple(rounded(a) if i in positions else a for i, a in enumerate(args))
            return func(*args, **kwargs)

    return RoundedMatmuls()


def reference_and_baseline(
    scenario: TaskScenario, config: dict, dtype_name: str, precision: str, compute
):
    """``compute(model)`` for the float32 CPU reference, then for the baseline.

    The baseline is the same computation in the arithmetic a correct run may use: the run dtype
    (the float32 model cast to it), or for a float32 run the backend's float32 precision.
    """
    # Every argument explicit: the reference always loads whole, on CPU, in float32.
    _, model = scenario.load(config, "float32", torch.device("cpu"))
    with torch.no_grad():
        reference = compute(model)
        if dtype_name != "float32":
            scenario.cast(model, torch_dtype(dtype_name))
            baseline = compute(model)
        elif precision != "ieee":
            with reduced_precision(precision):
                baseline = compute(model)
        else:
            baseline = reference
    del model
    gc.collect()
    return reference, baseline


def precision_label(dtype_name: str, precision: str) -> str:
    """How a verdict names the baseline's arithmetic: the dtype, or float32 with its precision."""
    return (
        dtype_name if dtype_name != "float32" or precision == "ieee" else f"float32 ({precision})"
    )


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


def verdict(
    reference,
    baseline,
    device_logits,
    tokens,
    params: dict,
    dtype_name: str = "bfloat16",
    router_gaps=None,
    router_noise=None,
) -> dict:
    """Judge the device's tokens and logits against the reference and baseline (pure function).

    ``reference`` and ``baseline`` are per-prompt log-probabilities (positions x vocabulary), the
    float32 reference and a correct run's arithmetic (see score_reference); ``device_logits`` the
    device's logits at the same positions; ``tokens`` the device's tokens. Checks:

    - tokens: a token that is not the reference argmax is accepted only where the reference
      margin is within ``near_tie_multiple`` x the baseline's deviation there (at least
      ``near_tie_floor`` nats); any other mismatch fails.
    - median, q90, peak: a position's error is its largest log-probability deviation from the
      reference over the reference's top tokens and the generated one. Per prompt, the median,
      90th percentile and maximum over positions must stay within their bound times the
      baseline's same statistic: the median sees faults everywhere, the quantile faults in a
      part of the run (late onset), the peak a single wrong step.
    - kl: per position, the KL divergence of the device's whole distribution from the
      reference's; its mean over positions must stay within ``max_kl_ratio`` x the baseline's,
      which sees faults outside the top tokens (the vocabulary's tail).

    A correct mixture-of-experts run may pick the other of two nearly tied experts where its
    rounding differs: positions whose reference router gap is within ``router_tie_multiple`` x
    the baseline's router-logit deviation (``router_tie_floor`` at least) are router ties. Up to
    ``router_tie_share`` of a prompt's positions, the tied ones where the device deviates most,
    are excused from the q90, peak and kl statistics and from the token check (a token that
    differs there is that routing's, judged "router-tie"); the median still sees them. Every
    figure is returned; the worst prompt of each statistic is the headline.
    """

    floor, kl_floor = params["error_floor"], params["kl_floor"]
    bounds = {
        "median": params["max_error_ratio"],
        "q90": params["max_q90_ratio"],
        "peak": params["max_peak_ratio"],
        "kl": params["max_kl_ratio"],
    }
    positions, prompt_stats, token_reasons = [], [], []
    mismatches = near_ties = bad = router_ties = router_tie_tokens = 0
    first_mismatch = None
    worst_rmse_ratio = 0.0
    for i, (ref, base) in enumerate(zip(reference, baseline, strict=True)):
        dev = torch.log_softmax(device_logits[i].double(), dim=-1)
        ref, base = ref.double(), base.double()
        toks = torch.as_tensor(tokens[i], dtype=torch.long).reshape(-1)
        n = ref.shape[0]
        rmse_dev = float(torch.sqrt(torch.mean((dev - ref) ** 2)))
        rmse_base = float(torch.sqrt(torch.mean((base - ref) ** 2)))
        worst_rmse_ratio = max(worst_rmse_ratio, rmse_dev / max(rmse_base, floor))

        ref_arg = torch.argmax(ref, dim=-1)
        margin = ref.gather(1, ref_arg[:, None])[:, 0] - ref.gather(1, toks[:, None])[:, 0]
        device_dev = position_deviations(dev, ref, toks)
        baseline_dev = position_deviations(base, ref, toks)
        device_kl = (dev.exp() * (dev - ref)).sum(dim=-1).clamp_min(0.0)
        baseline_kl = (base.exp() * (base - ref)).sum(dim=-1).clamp_min(0.0)
        ties = torch.zeros(n, dtype=torch.bool)
        if router_gaps is not None and router_gaps[i] is not None:
            ties = router_tie_mask(router_gaps[i], router_noise[i], params).any(dim=1)
        excused = excused_positions(ties, device_dev, params)
        router_ties += int(excused.sum())

        for t in range(n):
            token, arg = int(toks[t]), int(ref_arg[t])
            allowance = max(
                params["near_tie_multiple"] * float(baseline_dev[t]), params["near_tie_floor"]
            )
            judged = "match"
            if token != arg:
                mismatches += 1
                index = i * n + t
                first_mismatch = index if first_mismatch is None else min(first_mismatch, index)
                if float(margin[t]) <= allowance:
                    judged = "near-tie"
                    near_ties += 1
                elif excused[t]:
                    # The device may have routed to the other nearly tied expert here, which
                    # moves the logits by far more than rounding: its token is that routing's.
                    judged = "router-tie"
                    router_tie_tokens += 1
                else:
                    judged = "bad"
                    bad += 1
                    if len(token_reasons) < 3:
                        token_reasons.append(
                            f"prompt {i} token {t}: generated {token} but the reference prefers {arg} "
                            f"by {float(margin[t]):.3f} nats, beyond the {dtype_name} noise allowance {allowance:.3f}"
                        )
            positions.append(
                {
                    "prompt": i,
                    "position": t,
                    "token": token,
                    "reference_token": arg,
                    "margin": round(float(margin[t]), 6),
                    "baseline_deviation": round(float(baseline_dev[t]), 6),
                    "device_deviation": round(float(device_dev[t]), 6),
                    "baseline_kl": float(f"{float(baseline_kl[t]):.6g}"),
                    "device_kl": float(f"{float(device_kl[t]):.6g}"),
                    "router_tie": bool(ties[t]),
                    "excused": bool(excused[t]),
                    "verdict": judged,
                }
            )

        kept = ~excused
        stats = {"prompt": i, "router_ties": int(excused.sum())}
        figures = {
            "median": (_quantile(device_dev, 0.5), _quantile(baseline_dev, 0.5), floor),
            "q90": (_quantile(device_dev[kept], 0.9), _quantile(baseline_dev[kept], 0.9), floor),
            "peak": (_quantile(device_dev[kept], 1.0), _quantile(baseline_dev[kept], 1.0), floor),
            "kl": (_mean(device_kl[kept]), _mean(baseline_kl[kept]), kl_floor),
        }
        for check, (device_figure, baseline_figure, check_floor) in figures.items():
            device_figure, baseline_figure = float(device_figure), float(baseline_figure)
            stats[f"{check}_device"] = float(f"{device_figure:.6g}")
            stats[f"{check}_baseline"] = float(f"{baseline_figure:.6g}")
            stats[f"{check}_ratio"] = round(device_figure / max(baseline_figure, check_floor), 6)
        prompt_stats.append(stats)

    worst = {check: max(prompt_stats, key=lambda s, c=check: s[f"{c}_ratio"]) for check in bounds}
    failed = ["tokens"] if bad else []
    reasons = []
    if bad:
        more = f" ({bad} such tokens in all)" if bad > len(token_reasons) else ""
        reasons.append("tokens: " + "; ".join(token_reasons) + more)
    described = {
        "median": "median logit error",
        "q90": "90th-percentile logit error",
        "peak": "largest logit error",
        "kl": "mean KL divergence from the reference",
    }
    for check, bound in bounds.items():
        stats = worst[check]
        if stats[f"{check}_ratio"] > bound:
            failed.append(check)
            reasons.append(
                f"{check}: prompt {stats['prompt']}'s {described[check]} {stats[f'{check}_device']:.4g} "
                f"is {stats[f'{check}_ratio']:.2f}x the {dtype_name} baseline's "
                f"{stats[f'{check}_baseline']:.4g} (bound {bound:g}x)"
            )
    median_worst = worst["median"]
    return {
        "passed": not failed,
        "exact": mismatches == 0,
        "failed_checks": failed,
        "error_ratio": median_worst["median_ratio"],
        "device_error": median_worst["median_device"],
        "baseline_error": median_worst["median_baseline"],
        "q90_ratio": worst["q90"]["q90_ratio"],
        "peak_ratio": worst["peak"]["peak_ratio"],
        "kl_ratio": worst["kl"]["kl_ratio"],
        "rmse_ratio": round(worst_rmse_ratio, 6),
        "mismatches": mismatches,
        "near_ties": near_ties,
        "bad_tokens": bad,
        "router_ties": router_ties,
        "router_tie_tokens": router_tie_tokens,
        "first_mismatch": first_mismatch,
        "reason": "; ".join(reasons) if reasons else None,
        "parameters": {k: float(v) for k, v in params.items() if k not in NON_NUMERIC_PARAMETERS},
        "prompt_statistics": prompt_stats,
        "positions": positions,
    }


def position_deviations(logprobs, ref, tokens):
    """Per position, the largest log-probability deviation of ``logprobs`` from ``ref`` over the
    reference's top TOP_K_NOISE tokens and the generated one (``tokens``)."""
    watch = torch.cat(
        [torch.topk(ref, min(TOP_K_NOISE, ref.shape[-1])).indices, tokens[:, None]], 1
    )
    return torch.abs(logprobs - ref).gather(1, watch).max(dim=1).values


def excused_positions(ties, device_dev, params: dict):
    """The router-tie positions the verdict excuses: at most ``router_tie_share`` of a prompt's
    positions (deep MoEs have a near-tie somewhere at most positions), the tied ones where the
    device deviates most, which a flip explains."""
    import math

    n = ties.shape[0]
    excused = torch.zeros(n, dtype=torch.bool)
    limit = math.ceil(params["router_tie_share"] * n)
    tied = torch.nonzero(ties).flatten()
    if tied.numel() and limit:
        worst_first = tied[torch.argsort(device_dev[tied], descending=True)]
        excused[worst_first[:limit]] = True
    return excused


def _quantile(values, q: float) -> float:
    """The q-quantile (linear interpolation) of a 1-D tensor; 0 for an empty one."""
    return float(torch.quantile(values, q)) if values.numel() else 0.0


def _mean(values) -> float:
    return float(values.mean()) if values.numel() else 0.0


def _figure(value: float) -> float:
    return float(f"{float(value):.6g}")


def item_statistics(
    check: str, device_errors, baseline_errors, params: dict, floor_name: str = "error_floor"
) -> dict:
    """Median and maximum over items of the device's error, each against the baseline's same.

    The ratio's denominator is at least ``params[floor_name]`` (``error_floor`` for nats,
    ``relative_error_floor`` for relative measures); the median's bound is
    ``max_error_ratio``, the maximum's ``max_peak_ratio`` (as for the text verdict's median
    and peak over positions).
    """
    device_errors = torch.as_tensor(device_errors, dtype=torch.float64).flatten()
    baseline_errors = torch.as_tensor(baseline_errors, dtype=torch.float64).flatten()
    stats: dict[str, Any] = {"check": check, "items": int(device_errors.numel())}
    for name, q, bound in (
        ("median", 0.5, params["max_error_ratio"]),
        ("peak", 1.0, params["max_peak_ratio"]),
    ):
        device_figure = _quantile(device_errors, q)
        baseline_figure = _quantile(baseline_errors, q)
        stats[f"{name}_device"] = _figure(device_figure)
        stats[f"{name}_baseline"] = _figure(baseline_figure)
        stats[f"{name}_ratio"] = round(device_figure / max(baseline_figure, params[floor_name]), 6)
        stats[f"{name}_bound"] = float(bound)
    return stats


def task_verdict(
    method: str,
    metrics: list[dict],
    choices: dict,
    items: list[dict],
    params: dict,
    dtype_name: str,
    failing_statistics: dict[str, str] | None = None,
) -> dict:
    """Assemble a verdict from item statistics and a discrete-choice check (pure).

    ``metrics``: item_statistics results; a metric fails when its median or maximum ratio is
    beyond the bound. Its failed check is the metric's name, or per statistic the names in
    ``failing_statistics`` (classification's logit error fails as ``median`` / ``peak``, like
    text). ``choices``: the discrete check (``check``, ``mismatches``, ``near_ties``, ``bad``,
    ``reasons``: top-1 classes, similarity orders), or {}. The first metric is the headline
    (``error_ratio``, ``peak_ratio``).
    """
    failed: list[str] = []
    reasons: list[str] = []
    if choices.get("bad"):
        failed.append(choices["check"])
        more = f" ({choices['bad']} in all)" if choices["bad"] > len(choices["reasons"]) else ""
        reasons.append(f"{choices['check']}: " + "; ".join(choices["reasons"]) + more)
    for stats in metrics:
        for statistic in ("median", "peak"):
            ratio, bound = stats[f"{statistic}_ratio"], stats[f"{statistic}_bound"]
            if ratio <= bound:
                continue
            check = (failing_statistics or {}).get(statistic, stats["check"])
            if check not in failed:
                failed.append(check)
            reasons.append(
                f"{check}: the {'median' if statistic == 'median' else 'largest'} {stats['what']} "
                f"{stats[f'{statistic}_device']:.4g} is {ratio:.2f}x the {dtype_name} baseline's "
                f"{stats[f'{statistic}_baseline']:.4g} (bound {bound:g}x)"
            )
    headline = metrics[0]
    return {
        "passed": not failed,
        "method": method,
        "exact": None,
        "failed_checks": failed,
        "error_ratio": headline["median_ratio"],
        "device_error": headline["median_device"],
        "baseline_error": headline["median_baseline"],
        "peak_ratio": headline["peak_ratio"],
        "mismatches": choices.get("mismatches"),
        "near_ties": choices.get("near_ties"),
        "bad_tokens": choices.get("bad"),
        "reason": "; ".join(reasons) if reasons else None,
        "parameters": {k: float(v) for k, v in params.items() if k not in NON_NUMERIC_PARAMETERS},
        "metrics": metrics,
        "items": items,
    }


# ---- localization: where a FAIL starts
#
# On a FAIL (verification.localize "on_fail"; "always" for any run, "never" to skip) the run
# names the first module, in execution order, whose compiled output diverges. The float32
# reference runs the searched module's forward and keeps every module's inputs and output: for
# a generating task whose FAIL first shows at a decode step, that step as the run ran it (the
# run's batch generated again with the device's tokens forced, one token per sequence against
# the static cache the earlier steps filled); otherwise each prompt and the device's tokens in
# one pass (as the verdict scores it). Level by level from the model's children down, the
# modules of a level are compiled together with the run's compile backend (one graph per level
# and root call, under the model's own module names, with the step's shapes) and each is called
# on the reference's inputs for it (teacher forced: an earlier module's error never reaches a
# later one); the baseline (the run's arithmetic on CPU) runs on the same inputs. A module
# diverges when its output's relative error beats the baseline's by the verdict's own bounds
# (max_error_ratio on the median over positions, max_q90_ratio, max_peak_ratio). The first
# diverging module of a level is searched in turn, down to a module none of whose children
# diverges. It never changes the result; what stopped it is recorded. docs/verification.md.

LOCALIZE_MODES = ("on_fail", "always", "never")
LOCALIZATION_STATUSES = ("found", "none", "incomplete", "failed", "not_supported")
# Where a generating task's search compiled the modules: the prompt's forward (or the whole
# sequence at once), or one decode step (one token per sequence against the filled cache).
DIVERGENCE_PHASES = ("prefill", "decode")
LOCALIZE_CANDIDATES = 2  # further diverging modules (after the answer) that are named too
# Each check of a module's relative error (over positions) and the verdict's bound for it.
DIVERGENCE_BOUNDS = (
    ("median", 0.5, "max_error_ratio"),
    ("q90", 0.9, "max_q90_ratio"),
    ("peak", 1.0, "max_peak_ratio"),
)


def localization_wanted(params: dict, result: str | None) -> bool:
    """Whether this run localizes: on a FAIL by default, on any verdict with "always"."""
    mode = params.get("localize", "on_fail")
    if mode not in LOCALIZE_MODES:
        raise ValueError(
            f"verification.localize is {mode!r}: use one of {', '.join(LOCALIZE_MODES)}"
        )
    return mode == "always" or (mode == "on_fail" and result == "FAIL")


def failing_positions(verification: dict, params: dict) -> list:
    """Where a token verdict's FAIL starts (pure): the generated positions to search (0: the
    prefill's token, s: decode step s), in order; [] when no position fails.

    The first failing position is the earliest whose token is bad, or whose logit error or KL
    divergence is beyond the peak (or KL) bound times the largest a correct run reaches on its
    prompt (the baseline's): it fails by itself. Where no position does (a FAIL of the median,
    q90 or mean KL over many positions), the earliest beyond the baseline's largest error or KL
    on its prompt. A fault may start below the bounds a step or more before (a cache write read
    again later): where the positions just before it on its prompt are already beyond the
    baseline's largest, the first of them is searched first. Router ties the verdict excused
    never count.
    """
    largest: dict = {}
    positions = [p for p in verification.get("positions") or [] if not p.get("excused")]
    for p in positions:
        peak, kl = largest.get(p["prompt"], (0.0, 0.0))
        largest[p["prompt"]] = (max(peak, p["baseline_deviation"]), max(kl, p["baseline_kl"]))
    alone, beyond = set(), set()
    for p in positions:
        peak, kl = largest[p["prompt"]]
        peak, kl = max(peak, params["error_floor"]), max(kl, params["kl_floor"])
        deviation, divergence = p["device_deviation"], p["device_kl"]
        where = (p["prompt"], p["position"])
        # "not <=": a NaN fails.
        if (
            p["verdict"] == "bad"
            or not deviation <= params["max_peak_ratio"] * peak
            or not divergence <= params["max_kl_ratio"] * kl
        ):
            alone.add(where)
        if not deviation <= peak or not divergence <= kl:
            beyond.add(where)
    chosen = alone or beyond
    if not chosen:
        return []
    first = min(position for _, position in chosen)
    onset = first
    for prompt in {prompt for prompt, position in chosen if position == first}:
        start = first
        while (prompt, start - 1) in beyond:
            start -= 1
        onset = min(onset, start)
    return sorted({onset, first})


@dataclasses.dataclass
class SearchPlan:
    """What one search compiles the modules with: the whole sequence at once (``step`` None:
    the scenario's root calls, one prefill-shaped forward per input), or one step of the
    generation as the run ran it (0: the prefill, s >= 1: decode step s)."""

    phase: str | None  # DIVERGENCE_PHASES; None for a family that does not decode
    step: int | None

    def shapes(self) -> str:
        """Where the modules were compiled and called, in words."""
        if self.step is None:
            return "on the whole sequence at once" if self.phase else "on the run's inputs"
        if self.step == 0:
            return "at the prefill step as the run ran it (the prompt, writing the static cache)"
        return f"at decode step {self.step} (one token per sequence, against the static cache)"


def search_plans(generates: bool, verification: dict, params: dict, failed: bool) -> list:
    """The searches a run makes, in order, each only when the one before finds nothing.

    A FAIL first seen at a decode step is searched at that step (from where it began below the
    bounds, see failing_positions). One first seen at the prefill's token, or a run with no
    failing position (a PASS searched with "always", a FAIL spread over positions), is searched
    on the whole sequence at once, as the verdict scores it; a prefill FAIL then also at the
    prefill step as the run ran it (for an encoder-decoder, the decoder's first step: one token
    against the encoder's output). A family that does not decode has one search, on its inputs.
    """
    if not generates:
        return [SearchPlan(None, None)]
    positions = failing_positions(verification, params) if failed else []
    if not positions:
        return [SearchPlan("prefill", None)]
    plans = []
    for position in positions:
        if position == 0:
            plans += [SearchPlan("prefill", None), SearchPlan("prefill", 0)]
        else:
            plans.append(SearchPlan("decode", position))
    return plans


def row_errors(value, reference):
    """Per position (every row of the last dimension), ||value - reference|| / ||reference||."""
    ref = torch.as_tensor(reference).double()
    rows = ref.reshape(-1, ref.shape[-1]) if ref.dim() else ref.reshape(1, 1)
    diff = torch.as_tensor(value).double().reshape(rows.shape) - rows
    return diff.norm(dim=-1) / rows.norm(dim=-1).clamp_min(1e-30)


@dataclasses.dataclass
class ModuleDeviation:
    """One module's output against the reference, the device's errors over the baseline's."""

    module: str  # its name in the model, as named_modules spells it
    kind: str  # its class
    ratios: dict  # check -> the device's error statistic / the baseline's (floored)
    device_error: float  # the median relative error over positions
    baseline_error: float
    failed_checks: list
    # An experts module (all experts in one): the experts that diverge measured alone, and the
    # one expert that carries the fault when only one does.
    diverging_experts: list | None = None
    expert: int | None = None
    # A sharded run: the rank whose figures these are (the first on which the module
    # diverges) and every rank on which it does.
    rank: int | None = None
    ranks: list | None = None

    def record(self) -> dict:
        return {
            "module": self.module,
            "kind": self.kind,
            "error_ratio": _figure(self.ratios["median"]),
            "q90_ratio": _figure(self.ratios["q90"]),
            "peak_ratio": _figure(self.ratios["peak"]),
            "device_error": _figure(self.device_error),
            "baseline_error": _figure(self.baseline_error),
            "failed_checks": list(self.failed_checks),
            **({} if self.ranks is None else {"rank": self.rank, "ranks": list(self.ranks)}),
            **(
                {}
                if self.diverging_experts is None
                else {"expert": self.expert, "diverging_experts": list(self.diverging_experts)}
            ),
        }


def module_deviation(module: str, kind: str, device_errors, baseline_errors, params: dict):
    """Judge one module from its per-position relative errors, device and baseline (pure).

    Each check is a statistic over positions of the device's error divided by the baseline's
    (at least ``relative_error_floor``), against the verdict's bound for that statistic.
    """
    floor = float(params.get("relative_error_floor", 1e-5))
    ratios, failed = {}, []
    for check, q, bound in DIVERGENCE_BOUNDS:
        device = _quantile(device_errors.double(), q)
        base = _quantile(baseline_errors.double(), q)
        ratios[check] = device / max(base, floor)
        if not ratios[check] <= params[bound]:  # a NaN error diverges too
            failed.append(check)
    return ModuleDeviation(
        module,
        kind,
        ratios,
        _quantile(device_errors.double(), 0.5),
        _quantile(baseline_errors.double(), 0.5),
        failed,
    )


def called_children(parent: str, called: list) -> list:
    """The modules called directly under ``parent`` ("" is the model), in first-call order.

    ``called``: every module the forward called, in first-call order. A container that is never
    called itself (a ModuleList of layers) is looked through: its layers are the children.
    """
    called_set = set(called)
    children = []
    for name in called:
        if name == parent or not (parent == "" or name.startswith(parent + ".")):
            continue
        ancestor = name.rpartition(".")[0]
        while ancestor != parent and ancestor not in called_set:
            ancestor = ancestor.rpartition(".")[0]
        if ancestor == parent:
            children.append(name)
    return children


def descend(measure, called: list, in_time) -> dict:
    """Search the first diverging module level by level (pure: ``measure`` does the running).

    ``measure(names)``: the ModuleDeviation of each named module, in order. ``in_time()``:
    whether another level may start. Returns the deepest first diverging module, the modules
    that led to it (``path``), the next LOCALIZE_CANDIDATES diverging modules after it (its own
    level's first, then the enclosing levels') and the status: found, none (no module of the model diverges) or incomplete (out of time).
    """
    found: ModuleDeviation | None = None
    path: list = []
    candidates: list = []
    parent = ""
    while True:
        names = called_children(parent, called)
        if not names:
            break
        if not in_time():
            return {
                "status": "incomplete",
                "found": found,
                "path": path,
                "candidates": candidates[:LOCALIZE_CANDIDATES],
            }
        diverging = [d for d in measure(names) if d.failed_checks]
        if not diverging:
            break
        if found is not None:
            path.append(found)
        # The level's later diverging modules first, then the enclosing levels' later ones.
        found, candidates = diverging[0], diverging[1:] + candidates
        parent = found.module
    return {
        "status": "found" if found is not None else "none",
        "found": found,
        "path": path,
        "candidates": candidates[:LOCALIZE_CANDIDATES],
    }


class LevelProbe(torch.nn.Module if torch is not None else object):  # type: ignore[misc]
    """The modules of one level, each called on its own inputs, under the model's own names.

    The model's top-level children are this module's children, so a compile backend sees the
    module paths it sees in the whole model's graph (``model.layers.1.mlp``).
    """

    def __init__(self, model, names: list) -> None:
        super().__init__()
        for child, module in model.named_children():
            if any(name == child or name.startswith(child + ".") for name in names):
                self.add_module(child, module)
        self.names = list(names)

    def forward(self, calls: list) -> list:
        outputs = []
        for name, (args, kwargs) in zip(self.names, calls, strict=True):
            module = self
            for part in name.split("."):
                # A list's item by index, as the model's own code reaches its layers: the
                # backend then sees the same module path (model.layers[1]) as in the whole model.
                module = module[int(part)] if part.isdigit() else getattr(module, part)
            outputs.append(tensor_output(module(*args, **kwargs)))
        return outputs


def tensor_output(output):
    """A module's output tensor: itself, or the first item of a tuple / output class; None
    when there is none (such a module is left out of the search: nothing to compare)."""
    if hasattr(output, "dim"):
        return output
    first = output[0] if isinstance(output, (tuple, list)) or hasattr(output, "to_tuple") else None
    return first if hasattr(first, "dim") else None


def is_cache(value) -> bool:
    """Whether ``value`` is a transformers cache object (a static cache, one of its layers, an
    encoder-decoder pair of caches): state that a decode step's call reads and updates in place."""
    return type(value).__module__ == "transformers.cache_utils"


def map_call(value, fn, memo: dict | None = None):
    """``fn`` applied to every tensor of a module call's nested tuples, lists, dicts and model
    outputs, and inside transformers cache objects, which become copies: a cache is state the
    call updates in place, so a call never writes into the cache it was given. ``memo`` (id of
    a cache -> (that cache, its copy)) makes calls share one copy, and maps a copy back to its
    original where it holds (copy -> original) pairs."""
    if hasattr(value, "dim"):
        return fn(value)
    if isinstance(value, dict):
        mapped = {key: map_call(item, fn, memo) for key, item in value.items()}
        # A model output (encoder_outputs of an encoder-decoder's decode step) stays one: the
        # model reads it by index as well as by name.
        return type(value)(**mapped) if hasattr(value, "to_tuple") else mapped
    if isinstance(value, (list, tuple)):
        return type(value)(map_call(item, fn, memo) for item in value)
    if is_cache(value):
        return _copy_cache(value, fn, {} if memo is None else memo)
    return value


def _copy_cache(cache, fn, memo: dict):
    """A copy of a cache object with ``fn`` applied to its tensors (see map_call)."""
    import copy

    if id(cache) in memo:
        return memo[id(cache)][1]
    copied = copy.copy(cache)
    memo[id(cache)] = (cache, copied)
    device = None
    for name, item in vars(cache).items():
        if hasattr(item, "dim"):
            mapped = fn(item)
            if hasattr(mapped, "dim"):
                if mapped.untyped_storage().data_ptr() == item.untyped_storage().data_ptr():
                    mapped = mapped.clone()  # never the original's storage: the call writes it
                device = mapped.device if device is None else device
            setattr(copied, name, mapped)
        elif isinstance(item, (dict, list, tuple)) or is_cache(item):
            setattr(copied, name, map_call(item, fn, memo))
    if isinstance(getattr(copied, "device", None), torch.device) and device is not None:
        copied.device = device  # where a static layer makes its cache positions
    return copied


def capture_calls(model, names: list, root_calls: list) -> list:
    """Run the model on each root call; per call, each named module's first (args, kwargs,
    output) on CPU, and the order in which all modules were first called (``names`` empty).

    A root call's caches are copied for the forward (it updates them); a module's captured
    call holds the root call's own cache, the state before the step, which is what the module
    read of it (each module reads the part of the cache only it updates: its layer's)."""
    modules = dict(model.named_modules())
    captured: list = []
    pending: dict = {}
    order: list = []
    back: dict = {}  # id of a root call's cache copy -> (the copy, the root call's cache)

    def clone(tensor):
        return tensor.detach().clone().cpu()

    def before(name: str):
        def keep(module, args, kwargs):
            if name not in captured[-1] and name not in pending:
                pending[name] = map_call((args, kwargs), clone, back)

        return keep

    def after(name: str):
        def keep(module, args, kwargs, output):
            if name in pending:
                value = tensor_output(output)
                captured[-1][name] = (
                    *pending.pop(name),
                    None if value is None else value.detach().double().cpu(),
                )

        return keep

    def note(name: str):
        def seen(module, args):
            if name not in order:
                order.append(name)

        return seen

    hooks = [
        hook
        for name in names
        for hook in (
            modules[name].register_forward_pre_hook(before(name), with_kwargs=True),
            modules[name].register_forward_hook(after(name), with_kwargs=True),
        )
    ] + [
        module.register_forward_pre_hook(note(name))
        for name, module in modules.items()
        if name and not names
    ]
    try:
        with torch.no_grad():
            for call in root_calls:
                captured.append({})
                pending.clear()
                memo: dict = {}
                args, kwargs = map_call((call[0], call[1]), lambda t: t, memo)
                back.clear()
                back.update({id(copied): (copied, own) for own, copied in memo.values()})
                model(*args, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return order if not names else captured


def _cast_call(call, dtype, device, memo: dict | None = None):
    """A call's (args, kwargs) with its floating tensors in ``dtype``, all on ``device``; its
    caches copies (``memo``: shared with other calls, see map_call)."""
    move = lambda t: t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)  # noqa: E731
    return map_call((call[0], call[1]), move, memo)


def tensor_shapes(value) -> list:
    """The shape of every tensor of a nested structure (caches included), in map_call's order."""
    shapes: list = []
    map_call(value, lambda t: shapes.append(tuple(t.shape)))
    return shapes


def shard_span(size: int, world_size: int, rank: int) -> tuple[int, int]:
    """The [start, end) of ``rank``'s shard of a dimension of ``size`` split over the ranks as
    torch.chunk and DTensor's Shard split it (ceil-sized, the last shards shorter or empty)."""
    step = -(-size // world_size)
    start = min(rank * step, size)
    return start, min(start + step, size)


def shard_dims(full: list, local: list, world_size: int, rank: int) -> list | None:
    """How ``rank`` holds each tensor of a module's call (or output): None where whole, else
    the one dimension it holds its shard of; None overall when some tensor is held otherwise
    (a packed projection's interleaved shards, say), so the module cannot be compared."""
    if len(full) != len(local):
        return None
    dims: list = []
    for whole, held in zip(full, local, strict=True):
        if whole == held:
            dims.append(None)
            continue
        differing = [d for d, (w, h) in enumerate(zip(whole, held, strict=False)) if w != h]
        if len(whole) != len(held) or len(differing) != 1:
            return None
        (dim,) = differing
        start, end = shard_span(whole[dim], world_size, rank)
        if held[dim] != end - start:
            return None
        dims.append(dim)
    return dims


def take_shards(value, dims: list, world_size: int, rank: int):
    """``value`` (nested tensors) with each tensor cut to ``rank``'s shard along its dim."""
    remaining = iter(dims)

    def cut(tensor):
        dim = next(remaining)
        if dim is None:
            return tensor
        start, end = shard_span(tensor.shape[dim], world_size, rank)
        return tensor.narrow(dim, start, end - start)

    return map_call(value, cut)


def module_layouts(model, root_call, dtype, device) -> dict:
    """Each module's call and output shapes as this rank holds them: the model (on this rank,
    sharded) run eagerly once on ``root_call``; name -> (call shapes, output shape or None)."""
    layouts: dict = {}

    def keeper(name: str):
        def keep(module, args, kwargs, output):
            if name not in layouts:
                value = tensor_output(output)
                layouts[name] = (
                    tensor_shapes((args, kwargs)),
                    None if value is None else tuple(value.shape),
                )

        return keep

    hooks = [
        module.register_forward_hook(keeper(name), with_kwargs=True)
        for name, module in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            args, kwargs = _cast_call(root_call, dtype, device)
            model(*args, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return layouts


def run_level(device_model, placement: Placement, names: list, calls: list, dtype) -> list:
    """This rank's part of one level: the named modules compiled together (one graph) and
    called per prompt on ``calls[prompt]`` (this rank's (args, kwargs) per name); the outputs,
    per prompt, on CPU."""
    torch._dynamo.reset()  # one fresh graph per level (and prompt), never a stale one
    compiled = torch.compile(
        LevelProbe(device_model, names), backend=placement.compile_backend, dynamic=False
    )
    outputs = []
    with torch.no_grad():
        for prompt_calls in calls:
            # The level's modules share one copy of a cache: each updates only its own layer's.
            memo: dict = {}
            out = compiled(
                [_cast_call(call, dtype, placement.device, memo) for call in prompt_calls]
            )
            placement.backend.synchronize()
            outputs.append([tensor.detach().cpu() for tensor in out])
    return outputs


class LocalizationChannel:
    """Rank 0's messages to the other workers of a sharded run while it localizes.

    Rank 0 leads: it holds the reference and decides each level; every rank holds its shard of
    the device model and runs each level on its shard of the reference's inputs (the level's
    collectives need every rank). Each exchange is one broadcast from rank 0 and one gather to
    it, on a gloo group of its own (on any device backend), so a failure on one side is sent
    as a message, never left as a collective the other side waits in.
    """

    START, MEASURE, DONE = "start", "measure", "done"

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.group = ctx.control_group

    def broadcast(self, message=None):
        box = [message]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, item) -> list | None:
        gathered = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
        torch.distributed.gather_object(item, gathered, dst=0, group=self.group)
        return gathered


class FollowerFailed(RuntimeError):
    """Another worker of a sharded run could not do its part of the localization."""


def _answers(gathered: list) -> list:
    """The workers' answers to one exchange; a worker's failure (sent as text) raised here."""
    for rank, answer in enumerate(gathered):
        if isinstance(answer, str):
            raise FollowerFailed(f"rank {rank}: {answer}")
    return gathered


def follow_localization(ctx: RunContext, placement: Placement, processor, generation) -> None:
    """A sharded run's rank > 0 after generating: do its part of rank 0's search, if any.

    Its own failures are sent to rank 0 as text (the search then stops, recorded as failed);
    they never change this worker's document.
    """
    try:
        _follow(ctx, placement, processor, generation)
    except Exception as exc:
        # The channel itself failed (rank 0 gone, a timeout): rank 0 records its search as
        # failed or has its verdict already; this worker's document stays as it was.
        print(f"localization: rank {ctx.rank} stopped following: {exc!r}", file=sys.stderr)


def _follow(ctx: RunContext, placement: Placement, processor, generation) -> None:
    channel = LocalizationChannel(ctx)
    config = ctx.config
    scenario, dtype = scenario_for(config["task"]), torch_dtype(config["dtype"])
    model = None
    message = channel.broadcast()
    # One search after another (a prefill's whole sequence, then its step), until rank 0 is done.
    while isinstance(message, tuple) and message[0] == LocalizationChannel.START:
        _, step, tokens = message
        layouts: dict = {}
        try:
            if model is None:
                _, model = scenario.load(
                    config, config["dtype"], placement.device, placement.distributed_config
                )
            root_call = own_root_call(
                scenario, config, processor, generation, model, step, tokens, placement
            )
            model_searched = scenario.localization_module(model)
            layouts = module_layouts(model_searched, root_call, dtype, placement.device)
            channel.gather(layouts)
        except Exception as exc:
            channel.gather(f"{type(exc).__name__}: {exc}")
        message = channel.broadcast()
        while isinstance(message, tuple) and message[0] == LocalizationChannel.MEASURE:
            _, names, full_calls = message
            try:
                local_calls = [
                    [
                        take_shards(
                            call,
                            shard_dims(
                                tensor_shapes(call), layouts[name][0], ctx.world_size, ctx.rank
                            ),
                            ctx.world_size,
                            ctx.rank,
                        )
                        for name, call in zip(names, prompt_calls, strict=True)
                    ]
                    for prompt_calls in full_calls
                ]
                searched = scenario.localization_module(model)
                channel.gather(run_level(searched, placement, names, local_calls, dtype))
            except Exception as exc:
                channel.gather(f"{type(exc).__name__}: {exc}")
            message = channel.broadcast()


def own_root_call(scenario, config, processor, generation, model, step, tokens, placement):
    """This rank's root call for learning how it holds each module (module_layouts): the first
    input's whole-sequence call (``step`` None), or the step replayed on this rank's own shard
    of the model, so its cache is the shard it holds."""
    if step is None:
        return scenario.localization_calls(config, processor, generation)[0]
    return replay_step(
        scenario, config, processor, model, tokens, step, placement.device, config["dtype"]
    )


def release_followers(ctx: RunContext) -> None:
    """Rank 0 of a sharded run: tell the other workers that no (further) search follows."""
    if ctx.world_size > 1 and ctx.control_group is not None and not ctx.followers_released:
        ctx.followers_released = True
        LocalizationChannel(ctx).broadcast((LocalizationChannel.DONE,))


def combine_ranks(per_rank: list) -> ModuleDeviation:
    """One module's deviation over the ranks of a sharded run: the first diverging rank's
    figures (else rank 0's), with every diverging rank named."""
    diverging = [rank for rank, deviation in enumerate(per_rank) if deviation.failed_checks]
    chosen = per_rank[diverging[0] if diverging else 0]
    chosen.rank = diverging[0] if diverging else 0
    chosen.ranks = diverging
    return chosen


def router_ties(reference, baseline, root_calls: list, dtype, params: dict, precision) -> dict:
    """Where a mixture-of-experts model's routing is nearly tied on the search's inputs: per MoE
    block (as observe_routers names it), per root call, which positions' router decisions are
    within the baseline's router noise of a tie (router_tie_mask, the verdict's rule). A correct
    device may route those positions to the other expert; {} for a dense model."""
    ties: dict = {}
    if not moe_routers(reference):
        return ties  # a dense model: no forward passes for nothing
    with torch.no_grad():
        for call in root_calls:
            args, kwargs = map_call((call[0], call[1]), lambda t: t)  # its caches copied
            with observe_routers(reference) as reference_seen:
                reference(*args, **kwargs)
            cast_args, cast_kwargs = _cast_call(call, dtype, torch.device("cpu"))
            with observe_routers(baseline) as baseline_seen, precision:
                baseline(*cast_args, **cast_kwargs)
            for name, (logits, k) in reference_seen.items():
                gap, noise = router_gap_and_noise(logits, k, baseline_seen[name][0])
                ties.setdefault(name, []).append(router_tie_mask(gap, noise, params))
    return ties


def untied_rows(ties: dict, module: str, prompt: int):
    """A filter of a module's per-position errors on one root call that leaves out the
    positions where a router inside the module is nearly tied (a correct device may route them
    otherwise: the verdict excuses them too). Modules without a router inside, and outputs
    whose rows are not the call's positions, keep every row."""
    inside = [
        masks[prompt]
        for block, masks in ties.items()
        if block == module or block.startswith(module + ".")
    ]

    def kept(errors):
        if not inside or any(len(mask) != len(errors) for mask in inside):
            return errors
        tied = torch.stack(inside).any(dim=0)
        return errors if bool(tied.all()) else errors[~tied]

    return kept


EXPERT_ROUTING = ("top_k_index", "top_k_weights")  # transformers' experts modules' routing


def experts_count(module) -> int | None:
    """How many experts a module holds when it is transformers' experts module (every expert
    in one, called with each token's chosen experts and weights); None for any other module."""
    import inspect

    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    count = getattr(module, "num_experts", None)
    if not all(name in parameters for name in EXPERT_ROUTING) or not isinstance(count, int):
        return None
    return count


def expert_call(module, call, expert: int):
    """An experts module's captured call with every token routed to ``expert`` alone, weight
    1: that expert's function on the reference's inputs, comparable across backends."""
    import inspect

    args, kwargs, _ = call
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    index = bound.arguments["top_k_index"]
    weights = bound.arguments["top_k_weights"]
    # Every slot names the expert, the first with weight 1 and the others 0: the call keeps
    # its shapes (as a sharded run's layout of the module has them).
    bound.arguments["top_k_index"] = torch.full_like(index, expert)
    only_first = torch.zeros_like(weights)
    only_first[..., 0] = 1
    bound.arguments["top_k_weights"] = only_first
    return tuple(bound.args), dict(bound.kwargs)


def replay_step(scenario, config, processor, model, tokens, step: int, device, dtype_name: str):
    """The root call of generation step ``step`` as the run made it: ``model`` generates the
    run's batch with the run's generate (its static cache and max_new_tokens, so the same
    shapes), each step's token forced to the device's (``tokens``), and the searched module's
    (args, kwargs) are kept as that step's forward begins: its cache as the earlier steps
    filled it (a copy, which no later call changes)."""
    from transformers import LogitsProcessor, StoppingCriteria

    forwards: list = []
    captured: list = []

    class ForcedTokens(LogitsProcessor):
        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, float("-inf"))
            rows = torch.arange(scores.shape[0], device=scores.device)
            forced[rows, tokens[:, len(forwards) - 1].to(scores.device)] = 0
            return forced

    class AfterStep(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = len(forwards) > step
            return torch.full(
                (input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device
            )

    def before(module, args, kwargs):
        if len(forwards) == step:
            captured.append(map_call((args, kwargs), lambda t: t.detach().clone()))
        forwards.append(len(forwards))

    hook = scenario.localization_module(model).register_forward_pre_hook(before, with_kwargs=True)
    try:
        with torch.no_grad():
            generate(
                model,
                scenario.inputs(config, processor, device, dtype_name),
                int(config["max_new_tokens"]),
                scenario.pad_token_id(processor),
                logits_processor=[ForcedTokens()],
                stopping_criteria=[AfterStep()],
            )
    finally:
        hook.remove()
    if not captured:
        raise RuntimeError(
            f"generation step {step} was never reached: generate made {len(forwards)} forward "
            f"passes for {config['max_new_tokens']} tokens"
        )
    return captured[0]


class LevelFailed(RuntimeError):
    """A level of the search could not be compiled and run on its own (on some rank)."""

    def __init__(self, names: list, plan: SearchPlan, cause: BaseException | str) -> None:
        unique = list(dict.fromkeys(names))
        modules = ", ".join(unique[:3]) + (
            f" and {len(unique) - 3} more" if len(unique) > 3 else ""
        )
        # Dynamo wraps a compile backend's own error (BackendCompilerFailed): say that one,
        # and classify the wrapper (a compile failure).
        own = getattr(cause, "inner_exception", None) or cause
        detail = own if isinstance(own, str) else f"{type(own).__name__}: {own}"
        lines = [line for line in detail.splitlines() if line.strip()]
        super().__init__(
            f"{modules} could not be compiled and run on its own {plan.shapes()}: "
            f"{lines[0] if lines else detail}"
        )
        self.cause = cause


class Localizer:
    """The search's models, loaded once for every search a run makes: the device's copy of the
    searched module (this rank's shard in a sharded run, whose other workers follow), and on
    CPU the float32 reference and the baseline (the run's arithmetic)."""

    def __init__(self, ctx: RunContext, placement: Placement, processor, generation) -> None:
        config = ctx.config
        self.ctx, self.placement = ctx, placement
        self.processor, self.generation = processor, generation
        self.params = config["verification"]
        self.scenario = scenario_for(config["task"])
        self.dtype_name = config["dtype"]
        self.dtype = torch_dtype(self.dtype_name)
        precision = float32_precision(self.params, placement.backend.name)
        self.baseline_precision = (
            reduced_precision(precision)
            if self.dtype_name == "float32"
            else contextlib.nullcontext()
        )
        self.channel = LocalizationChannel(ctx) if ctx.world_size > 1 else None
        self.device_model: Any = None  # as loaded (what generates); searched: its module
        self.reference_model: Any = None
        self.reference: Any = None
        self.baseline: Any = None

    def _load_device(self) -> None:
        if self.device_model is None:
            # In a sharded run every rank loads its shard together (collectives).
            _, self.device_model = self.scenario.load(
                self.ctx.config,
                self.dtype_name,
                self.placement.device,
                self.placement.distributed_config,
            )

    def _load_reference(self) -> None:
        if self.reference is not None:
            return
        _, self.reference_model = self.scenario.load(
            self.ctx.config, "float32", torch.device("cpu")
        )
        baseline = self.reference_model
        if self.dtype_name != "float32":
            import copy

            baseline = copy.deepcopy(self.reference_model)
            self.scenario.cast(baseline, self.dtype)
        self.reference = self.scenario.localization_module(self.reference_model)
        self.baseline = self.scenario.localization_module(baseline)

    def root_calls(self, plan: SearchPlan, whole: list) -> list:
        """The reference's root calls for ``plan``: ``whole`` (the scenario's, per input), or
        the one call of the planned step, replayed on the reference."""
        if plan.step is None:
            return whole
        return [
            replay_step(
                self.scenario,
                self.ctx.config,
                self.processor,
                self.reference_model,
                self.generation.tokens,
                plan.step,
                torch.device("cpu"),
                "float32",
            )
        ]

    def search(self, plan: SearchPlan, whole: list, in_time) -> dict:
        """Run the level-by-level search of ``plan`` on this run's device (see the section's
        comment); in a sharded run, rank 0 leads it and the other workers follow."""
        ctx, placement, params = self.ctx, self.placement, self.params
        scenario, dtype, channel = self.scenario, self.dtype, self.channel
        world_size = ctx.world_size
        layouts: list = [{}]
        if channel is not None:
            channel.broadcast((LocalizationChannel.START, plan.step, self.generation.tokens))
            own: Any
            try:
                # Every rank loads its shard, replays the step on it, and runs its layout
                # pass together (collectives).
                self._load_device()
                call = own_root_call(
                    scenario,
                    ctx.config,
                    self.processor,
                    self.generation,
                    self.device_model,
                    plan.step,
                    self.generation.tokens,
                    placement,
                )
                own = module_layouts(
                    scenario.localization_module(self.device_model), call, dtype, placement.device
                )
            except Exception as exc:
                own = exc
            gathered = channel.gather(own if isinstance(own, dict) else f"{type(own).__name__}")
            if isinstance(own, Exception):
                raise own
            layouts = _answers(gathered)
        else:
            self._load_device()
        device_model = scenario.localization_module(self.device_model)
        self._load_reference()
        reference, baseline = self.reference, self.baseline
        baseline_precision = self.baseline_precision
        root_calls = self.root_calls(plan, whole)
        called = capture_calls(reference, [], root_calls)
        ties = router_ties(reference, baseline, root_calls, dtype, params, baseline_precision)
        kinds = {name: type(module).__name__ for name, module in reference.named_modules()}

        def held(name: str, first_call) -> list | None:
            """Per rank, how it holds the module's call and output (shard_dims); None when some
            rank holds them in a way that cannot be compared."""
            if channel is None:
                return [(None, None)]
            call_shapes = tensor_shapes((first_call[0], first_call[1]))
            output_shape = tuple(first_call[2].shape)
            per_rank = []
            for rank, layout in enumerate(layouts):
                if name not in layout or layout[name][1] is None:
                    return None
                call_dims = shard_dims(call_shapes, layout[name][0], world_size, rank)
                output_dims = shard_dims([output_shape], [layout[name][1]], world_size, rank)
                if call_dims is None or output_dims is None:
                    return None
                per_rank.append((call_dims, output_dims[0]))
            return per_rank

        def device_outputs(names: list, reference_calls: list) -> list:
            """Per rank, per root call, each named module's output on the device (every rank's
            level run together in a sharded run)."""
            calls = [[(call[0], call[1]) for call in root_calls] for root_calls in reference_calls]
            if channel is None:
                try:
                    return [run_level(device_model, placement, names, calls, dtype)]
                except Exception as exc:
                    raise LevelFailed(names, plan, exc) from exc
            channel.broadcast((LocalizationChannel.MEASURE, names, calls))
            own: Any
            try:
                dims = [held(name, reference_calls[0][i]) for i, name in enumerate(names)]
                own_calls = [
                    [
                        take_shards(call, dims[i][0][0], world_size, 0)
                        for i, call in enumerate(root_calls)
                    ]
                    for root_calls in calls
                ]
                own = run_level(device_model, placement, names, own_calls, dtype)
            except Exception as exc:
                own = exc
            gathered = channel.gather(own if isinstance(own, list) else f"{type(own).__name__}")
            if isinstance(own, Exception):
                raise LevelFailed(names, plan, own) from own
            try:
                return _answers(gathered)
            except FollowerFailed as exc:
                raise LevelFailed(names, plan, str(exc)) from exc

        def compare(names: list, reference_calls: list) -> list:
            """Each named module (a name may repeat) compiled in one level and called on its
            reference call, per root call: ``reference_calls[root][i]`` is (args, kwargs,
            output)."""
            dims = [held(name, reference_calls[0][i]) for i, name in enumerate(names)]
            outputs = device_outputs(names, reference_calls)
            device_errors: list = [[[] for _ in names] for _ in outputs]
            baseline_errors: list = [[[] for _ in names] for _ in outputs]
            for root, calls in enumerate(reference_calls):
                baseline_out = []
                with torch.no_grad(), baseline_precision:
                    for name, call in zip(names, calls, strict=True):
                        args, kwargs = _cast_call(call, dtype, torch.device("cpu"))
                        baseline_out.append(
                            tensor_output(baseline.get_submodule(name)(*args, **kwargs))
                        )
                for rank, rank_outputs in enumerate(outputs):
                    for i, call in enumerate(calls):
                        output_dim = dims[i][rank][1]
                        expected = take_shards(call[2], [output_dim], world_size, rank)
                        baseline_value = take_shards(
                            baseline_out[i], [output_dim], world_size, rank
                        )
                        kept = untied_rows(ties, names[i], root)
                        device_errors[rank][i].append(
                            kept(row_errors(rank_outputs[root][i], expected))
                        )
                        baseline_errors[rank][i].append(kept(row_errors(baseline_value, expected)))
            deviations = []
            for i, name in enumerate(names):
                per_rank = [
                    module_deviation(
                        name,
                        kinds[name],
                        torch.cat(device_errors[rank][i]),
                        torch.cat(baseline_errors[rank][i]),
                        params,
                    )
                    for rank in range(len(outputs))
                ]
                deviations.append(combine_ranks(per_rank) if channel is not None else per_rank[0])
            return deviations

        def measure(names: list) -> list:
            reference_calls = capture_calls(reference, names, root_calls)
            names = [
                name
                for name in names
                if all(name in calls and calls[name][2] is not None for calls in reference_calls)
                and held(name, reference_calls[0][name]) is not None
            ]
            if not names:
                return []
            return compare(names, [[calls[name] for name in names] for calls in reference_calls])

        def split_experts(found: ModuleDeviation) -> list | None:
            """Each expert of a diverging experts module, measured alone (see expert_call)."""
            module = reference.get_submodule(found.module)
            count = experts_count(module)
            if count is None:
                return None
            captured = [
                calls[found.module]
                for calls in capture_calls(reference, [found.module], root_calls)
            ]
            per_root = []
            with torch.no_grad():
                for call in captured:
                    calls = []
                    for expert in range(count):
                        args, kwargs = expert_call(module, call, expert)
                        out = tensor_output(module(*args, **kwargs)).detach().double()
                        calls.append((args, kwargs, out))
                    per_root.append(calls)
            return compare([found.module] * count, per_root)

        searched = descend(measure, called, in_time)
        found = searched["found"]
        # Under expert parallelism each expert lives on one rank; its experts module still
        # answers for all (the ranks' parts summed), so each expert is measured alone the same
        # way.
        if found is not None and searched["status"] == "found" and in_time():
            experts = split_experts(found)
            if experts is not None:
                found.diverging_experts = [e for e, d in enumerate(experts) if d.failed_checks]
                if len(found.diverging_experts) == 1:
                    found.expert = found.diverging_experts[0]
        return searched


def none_reason(plans: list, verification: dict, params: dict) -> str:
    """Why a FAIL's search named no module, in one sentence (``plans``: the searches made)."""
    outside = (
        "the error arises outside what the search compares (e.g. only in a statistic over "
        "positions such as a pooled embedding, or in an earlier step's cache write, which the "
        "reference's cache does not repeat)"
    )
    if plans[0].phase is None:
        return f"no module's output diverges on the reference's inputs: {outside}"
    if plans[0].step is None and len(plans) == 1:
        spread = bool(verification.get("positions"))
        return (
            "the failure is spread over positions (none is beyond the largest error or KL "
            "divergence a correct run reaches on its prompt), so no step is singled out, and "
            "over the whole sequence at once no module's output diverges on the reference's "
            f"inputs: {outside}"
            if spread
            else f"no module's output diverges on the reference's inputs: {outside}"
        )
    searched = " or ".join(plan.shapes() for plan in plans)
    return f"no module's output diverges {searched}, on the reference's inputs: {outside}"


def localize_stage(ctx: RunContext, placement: Placement, processor, generation) -> None:
    """Name the first diverging module in ``verification.first_divergence`` (rank 0).

    Never changes the result: a search that cannot finish (time, memory, a module that does
    not compile on its own) records why, with the error's class.
    """
    config, doc = ctx.config, ctx.doc
    params = config["verification"]
    start, rss_before = time.perf_counter(), proc_status_bytes().get("VmHWM")
    # Both peaks run from the setup on (never reset here: the run's own peaks stay recorded),
    # so what the search adds is how much it raised them.
    device_before = placement.backend.peak_memory(placement.device)[0]
    record: dict = {
        "status": "not_supported",
        "module": None,
        "kind": None,
        "phase": None,
        "step": None,
        "path": [],
        "candidates": [],
        "rank": ctx.rank,
        "reason": None,
        "error_class": None,
    }
    scenario = scenario_for(config["task"])
    whole = scenario.localization_calls(config, processor, generation)
    if whole is None:
        record["reason"] = f"localization is not implemented for {config['task']} models"
    else:
        emit_progress("localize", "start")
        if ctx.world_size > 1:
            # The verdict stands whatever happens to the workers during the search.
            doc["verification"]["first_divergence"] = {
                **record,
                "status": "failed",
                "error_class": "worker-crash",
                "reason": "the search did not finish: a worker stopped during it",
            }
            ctx.report_provisional(doc)
        budget = float(params.get("localize_budget_s", 600.0))
        failed = doc["result"] == "FAIL"
        plans = search_plans(scenario.generates, doc["verification"], params, failed)
        searched: dict = {}
        plan = plans[0]
        try:
            localizer = Localizer(ctx, placement, processor, generation)
            for plan in plans:
                searched = localizer.search(
                    plan, whole, lambda: time.perf_counter() - start < budget
                )
                if searched["status"] != "none":
                    break
        except Exception as exc:
            # The search failed, not the model: the verdict stands; why it failed is recorded.
            cause = exc.cause if isinstance(exc, LevelFailed) else exc
            record["status"] = "failed"
            record["error_class"] = classify(
                "compile", cause if isinstance(cause, BaseException) else exc
            )
            record["reason"] = (
                str(exc) if isinstance(exc, LevelFailed) else f"{type(exc).__name__}: {exc}"
            )[:2000]
        else:
            record["status"] = searched["status"]
            if searched["status"] == "incomplete":
                record["reason"] = f"the localization's time budget ({budget:g} s) ran out"
            elif searched["status"] == "none" and failed:
                record["reason"] = none_reason(plans, doc["verification"], params)
            found = searched["found"]
            if found is not None:
                record.update(found.record())
            record["path"] = [d.record() for d in searched["path"]]
            record["candidates"] = [d.record() for d in searched["candidates"]]
        record["phase"], record["step"] = plan.phase, plan.step
        gc.collect()
    rss_after = proc_status_bytes().get("VmHWM")
    device_after = placement.backend.peak_memory(placement.device)[0]
    record["device_peak_increase_bytes"] = (
        None
        if device_before is None or device_after is None
        else max(device_after - device_before, 0)
    )
    record["seconds"] = _figure(time.perf_counter() - start)
    record["host_peak_rss_increase_bytes"] = (
        None if rss_before is None or rss_after is None else max(rss_after - rss_before, 0)
    )
    doc["verification"]["first_divergence"] = record
    if record["status"] != "not_supported":
        # A progress line's status is start, done or failed (what the CLI shows); what the
        # search found is its detail, and where (the prefill, a decode step).
        progress = "failed" if record["status"] == "failed" else "done"
        found = record["module"] or record["reason"] or record["status"]
        status = record["status"]
        if record["module"] and record["phase"]:
            status += " " + divergence_where(record["phase"], record["step"])
        emit_progress("localize", progress, record["seconds"], f"{status}: {found}")


def divergence_where(phase: str, step: int | None) -> str:
    """Where a generating task's search found its module, in words ("from decode step 18");
    model_support.records.FirstDivergence says it the same way."""
    return f"from decode step {step}" if phase == "decode" else "from the prefill"


JUDGE_QUESTION = (
    "Is the following text fluent English? Answer yes or no.\n\nText: {text}\n\nAnswer:"
)


def judge(path: str, texts: list[str]) -> dict:
    """A small local judge model's opinion of whether each text is fluent English.

    Recorded beside the verdict, never instead of it (the original Space asked a judge model).
    p_yes is the judge's probability of " yes" against " no" after the question.
    """
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yes = tokenizer.encode(" yes", add_special_tokens=False)[0]
    no = tokenizer.encode(" no", add_special_tokens=False)[0]
    verdicts = []
    for text in texts:
        ids = tokenizer(JUDGE_QUESTION.format(text=text), return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits[0, -1]
        p_yes = float(torch.softmax(logits[[yes, no]].float(), dim=-1)[0])
        verdicts.append({"p_yes": round(p_yes, 6), "fluent": p_yes > 0.5})
    return {
        "model": path,
        "question": JUDGE_QUESTION,
        "texts": verdicts,
        "fluent": all(v["fluent"] for v in verdicts),
    }


# =========================================================================== Appendix D: plumbing

# ---- the vocabulary

# The vocabulary of model_support.vocabulary, repeated because this file must run standalone
# (tests/test_vocabulary.py keeps the two in step).
RESULTS = ("PASS", "FAIL", "ERROR", "TIMEOUT", "EXCLUDED", "UNVERIFIED")


ERROR_CLASSES = (
    "load",
    "unsupported-architecture",
    "remote-code-refused",
    "compile",
    "runtime",
    "out-of-memory",
    "verification",
    "worker-crash",
    "infrastructure",
)


COMPILE_FAILURES = ("compiler-error", "graph-break", "cpu-fallback", "recompiles-per-step")


RESULT_MARKER = "MODEL_SUPPORT_RESULT "
PROGRESS_MARKER = "MODEL_SUPPORT_STAGE "
SCHEMA_VERSION = 1
TRACEBACK_LINES = 40


# Tasks that decode tokens (max_new_tokens applies); the vocabulary's GENERATING_TASKS.
GENERATING_TASKS = (
    "text-generation",
    "image-text-to-text",
    "text2text-generation",
    "automatic-speech-recognition",
)


# ---- errors and stages


class StageFailure(Exception):
    """A stage failed; carries the classified error for the result document."""

    def __init__(
        self, error_class: str, stage: str, message: str, tb: str, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.stage = stage
        self.message = message
        self.tb = tb
        self.reason = reason  # an ERROR compile's CompileFailure


class InfrastructureError(RuntimeError):
    """The environment, not the model, is at fault (wrong image, too few cores, bad LNC)."""


# Neuron messages that decide an error's class regardless of the stage, lower case, each from a
# public source cited in docs/trainium.md. Checked in this order: a hardware fault or a core held
# by another process is the machine's problem even when its message mentions memory. The runtime
# and the driver write most of them to the console, not into the Python exception: they are
# looked for in both (ConsoleTail below).
NEURON_INFRASTRUCTURE_MESSAGES = (
    "neuroncore(s) not available",  # runtime: the cores are held by another process
    "uncorrectable memory error",  # runtime: hardware error of a NeuronCore
    "uncorrectable hbm memory error",  # runtime: hardware error of the device memory
    "is in an abort state",  # runtime: a DMA engine aborted (hardware)
    "neuron_hw_err=",  # runtime: the hardware-error line it logs for the instance (any kind)
    "nrt_exec_hw_err_",  # runtime status: HBM / NeuronCore memory / DMA / collectives hardware
    "dma engine encountered an unrecoverable error",  # runtime status text of ..._DMA_ABORT
    "nrt_exec_nc_busy",  # runtime status: the core is locked by another model or process
    "neuron core is locked",  # its text: "the neuron core is locked (in use) by another ..."
    "nrt_load_not_enough_nc",  # runtime status: not enough NeuronCores to load a NEFF
    "failed to allocate enough ncs",  # its text
    "attempted to have more than one device per process",  # TorchNeuron: >1 core per worker
    "ncc_earg001",  # compiler: LNC not supported by the target (node/compiler mismatch)
    # The runtime could not start: no driver, or a driver older than the runtime needs.
    "unable to determine neuron driver version",  # runtime at nrt_init: driver not installed
    "this runtime requires neuron driver version",  # runtime at nrt_init: driver too old
    "is not compatible with the installed aws-neuron",  # runtime/driver compatibility id
    "nrt:nrt_init",  # any error the runtime logs while it initializes
    "nrt_uninitialized",  # runtime status 13: called before the runtime started
    # The image's compiler and runtime do not belong together.
    "neff version mismatch",  # runtime: "NEFF version mismatch supported: 1.1 received: 2.0"
    "nrt_unsupported_neff_version",  # runtime status 10
    "unsupported hardware operator code",  # runtime older than the compiler that made the NEFF
    # The device did not finish an execution: a hardware fault or a hung runtime.
    "execution timeout (",  # TDRV: "[ND 1][NC 0] execution timeout (30000 ms) on model ..."
    "inference timeout (",  # TDRV: "inference timeout (600000 ms) on Neuron Device 0 NC 0"
    "fatal-rt-undefined-state",  # runtime: the execution unit is in an undefined state
    "nrt_timeout",  # runtime status 5
    "nrt_exec_sw_nq_overflow",  # runtime status 1204: dropped notifications (timed out)
    # The image lacks the compiler: an image problem, not the model's compile error.
    "neuronx-cc not found",
    "no such file or directory: 'neuronx-cc'",
)


NEURON_OUT_OF_MEMORY_MESSAGES = (
    "failed to allocate",  # runtime OOM report: "Failed to allocate 4.000GB (...) on ND 0:NC 4"
    "ncc_eoom001",  # compiler: activations exceed the device memory (HBM) limit
    "ncc_eoom002",
    "exceeds the high-bandwidth memory limit",  # the message of NCC_EOOM001/002
    "estimated peak hbm usage",  # compiler: "[XCG815] Estimated peak HBM usage (...) exceeds 16GB"
    "device mempool",  # driver: "neuron:mc_alloc: device mempool [0:0] total ... needed ..."
    "(oom)",  # TorchNeuron: "NRT allocation failed ... (OOM)" (review of its source; unconfirmed)
)


# Compiler errors by their own names only: a message that merely mentions a NEFF file (a cache
# path, a load of a finished executable) says nothing about compiling, so "neff" is not here.
NEURON_COMPILE_MESSAGES = (
    "ncc_e",  # every neuronx-cc error code (NCC_EXXXnnn)
    "neuronx-cc",  # e.g. "Failed compilation with ['neuronx-cc', 'compile', ...]"
)
CONSOLE_COMPILE_MESSAGES = ("ncc_e",)
"""What of NEURON_COMPILE_MESSAGES counts in the console: an error code, never the compiler's
name (its progress lines name it in every compile, failed or not)."""


# What to do about each kind of Neuron failure (docs/trainium.md gives the sources): the first
# entry whose messages the error or the console carries names the fix.
NEURON_FIXES = (
    (
        ("unable to determine neuron driver version",),
        "install the Neuron driver on the host (aws-neuronx-dkms) and load it (modprobe neuron); "
        "a container needs the host's driver, it cannot bring its own",
    ),
    (
        (
            "this runtime requires neuron driver version",
            "is not compatible with the installed aws-neuron",
        ),
        "upgrade the host's driver (aws-neuronx-dkms) to at least the version the release of the "
        "image's runtime ships (docs/neuron-releases.md), then reload it (no process may hold a "
        "device: rmmod neuron && modprobe neuron), or run an image of an older Neuron SDK",
    ),
    (
        (
            "neff version mismatch",
            "nrt_unsupported_neff_version",
            "unsupported hardware operator code",
        ),
        "the compiler and the runtime in the image belong to different Neuron SDK releases: "
        "build the image from one release's row of docs/neuron-releases.md, and do not reuse "
        "NEFFs another compiler version wrote",
    ),
    (
        (
            "neuroncore(s) not available",
            "nrt_exec_nc_busy",
            "neuron core is locked",
            "nrt_load_not_enough_nc",
            "failed to allocate enough ncs",
        ),
        "another process holds these NeuronCores (neuron-ls shows its PID): stop it, or give "
        "this run free cores (NEURON_RT_VISIBLE_CORES)",
    ),
    (
        (
            "execution timeout (",
            "inference timeout (",
            "fatal-rt-undefined-state",
            "nrt_timeout",
            "nrt_exec_sw_nq_overflow",
        ),
        "the device did not finish an execution: run again; if it recurs on this node, leave "
        "NEURON_RT_RESET_CORES unset (the runtime resets the cores when it starts) or reboot "
        "the instance; raise NEURON_RT_EXEC_TIMEOUT only for a step known to run longer",
    ),
    (
        (
            "uncorrectable memory error",
            "uncorrectable hbm memory error",
            "is in an abort state",
            "neuron_hw_err=",
            "nrt_exec_hw_err_",
            "dma engine encountered an unrecoverable error",
        ),
        "a hardware error: take the node out of service and replace the instance",
    ),
    (
        ("neuronx-cc not found", "no such file or directory: 'neuronx-cc'"),
        "the image has no neuronx-cc on its PATH: build it from images/runner/torchneuron-base.Dockerfile "
        "(which installs the release's neuronx-cc) or install that neuronx-cc in its Python",
    ),
    (
        ("nrt:nrt_init", "nrt_uninitialized"),
        "the Neuron runtime did not start: check the driver (lsmod | grep neuron), the devices "
        "given to the container (/dev/neuron*) and neuron-ls",
    ),
)


def fix_for(text: str) -> str | None:
    """What to do about the Neuron failure ``text`` describes (None: no known one)."""
    lowered = text.lower()
    for messages, fix in NEURON_FIXES:
        if any(message in lowered for message in messages):
            return fix
    return None


# ---- what the runtime wrote: this process's own stderr, kept

CONSOLE_TAIL_LINES = 400  # lines of this process's stderr kept
RUNTIME_LOG_LINES = 20  # runtime lines quoted in an error message, the last ones
# The log lines of the Neuron runtime, driver and compiler (their component prefixes, the
# hardware-error line, compiler error codes); docs/trainium.md has an example of each.
NEURON_LOG_LINE = re.compile(
    r"\b(?:NRT|TDRV|NMGR|HAL|NCCL|ENC|NDS):|NEURON_HW_ERR=|\bNCC_E[A-Z]{3}\d{3}|neuron:mc_alloc"
    r"|NEFF version mismatch|\bnrt_[a-z_]+\b"
)


class ConsoleTail:
    """The last lines this process (and the workers it starts) wrote to file descriptor 2.

    The Neuron runtime and driver write their failures there (nrt-troubleshoot: "fail with an
    error message in console and syslog"), not into the Python exception, so a classification
    of the exception alone reads "RuntimeError" where the console says which driver is missing.
    While started, a pipe stands in front of fd 2: a thread copies everything to the original
    stderr, unchanged, and keeps the last CONSOLE_TAIL_LINES lines.
    """

    _SYNC = b"\x1emodel-support-console-sync\x1e\n"

    def __init__(self, keep: int = CONSOLE_TAIL_LINES) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.seen = 0  # lines ever kept: a mark() is a position in this count
        self._partial = b""
        self._carry = b""
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._original: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._original is not None

    def start(self) -> None:
        """Put the pipe in front of fd 2 (nothing when already started)."""
        if self.active:
            return
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        self._original = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(
            target=self._copy, args=(read_end, self._original), name="console-tail", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Give fd 2 back to the original stderr, after copying everything written so far. The
        thread goes on copying what workers still holding the pipe write, until they end."""
        if not self.active:
            return
        self.sync()
        assert self._original is not None
        os.dup2(self._original, 2)
        self._original = None

    def _copy(self, read_end: int, original: int) -> None:
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                return
            if not chunk:
                os.close(read_end)
                return
            data = self._carry + chunk
            self._carry = b""
            synced = self._SYNC in data
            data = data.replace(self._SYNC, b"")
            # A sync marker cut in two by the read: hold its beginning back for the next one.
            for keep in range(min(len(self._SYNC) - 1, len(data)), 0, -1):
                if self._SYNC.startswith(data[-keep:]):
                    data, self._carry = data[:-keep], data[-keep:]
                    break
            with contextlib.suppress(OSError):
                view = memoryview(data)
                while view:
                    view = view[os.write(original, view) :]
            self._keep(data)
            if synced:  # only now is everything before the marker kept
                self._synced.set()

    def _keep(self, data: bytes) -> None:
        *complete, self._partial = (self._partial + data).split(b"\n")
        with self._lock:
            for line in complete:
                self.lines.append(line.decode("utf-8", "replace").rstrip("\r"))
                self.seen += 1

    def sync(self, timeout_s: float = 2.0) -> None:
        """Wait until everything written to fd 2 so far has been read (bounded)."""
        if not self.active:
            return
        sys.stderr.flush()
        self._synced.clear()
        with contextlib.suppress(OSError):
            os.write(2, self._SYNC)
        self._synced.wait(timeout_s)

    def mark(self) -> int:
        """A position: lines_since(mark) is what was written after it."""
        self.sync()
        with self._lock:
            return self.seen

    def lines_since(self, mark: int) -> list[str]:
        """The kept lines written after ``mark`` (at most the last CONSOLE_TAIL_LINES)."""
        self.sync()
        with self._lock:
            new = self.seen - mark
            return list(self.lines)[-new:] if new > 0 else []

    @contextlib.contextmanager
    def capturing(self):
        """start() ... stop()."""
        self.start()
        try:
            yield self
        finally:
            self.stop()


CONSOLE = ConsoleTail()
"""This process's console tail: started by main() and by every sharded worker."""


def runtime_lines(lines: list[str]) -> list[str]:
    """The lines of ``lines`` the Neuron runtime, driver or compiler wrote, or that carry a
    message the error tables know (last RUNTIME_LOG_LINES)."""
    known = (
        NEURON_INFRASTRUCTURE_MESSAGES + NEURON_OUT_OF_MEMORY_MESSAGES + CONSOLE_COMPILE_MESSAGES
    )
    picked = [
        line.strip()
        for line in lines
        if line.strip() and (NEURON_LOG_LINE.search(line) or any(m in line.lower() for m in known))
    ]
    return picked[-RUNTIME_LOG_LINES:]


def classify(stage: str, exc: BaseException, console: list[str] | None = None) -> str:
    """Map an exception raised in a stage to an error class of the vocabulary.

    ``console``: what the runtime wrote to the console during the stage (runtime_lines); the
    Neuron message tables are matched against it as well as the exception."""
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    written = "\n".join(console or []).lower()
    both = f"{lowered}\n{written}"
    if isinstance(exc, InfrastructureError) or any(
        message in both for message in NEURON_INFRASTRUCTURE_MESSAGES
    ):
        return "infrastructure"
    if (
        isinstance(exc, MemoryError)
        or "out of memory" in lowered
        or "outofmemory" in lowered
        or "resource_exhausted" in lowered
        or any(message in both for message in NEURON_OUT_OF_MEMORY_MESSAGES)
    ):
        return "out-of-memory"
    if stage == "load":
        if "trust_remote_code" in lowered or "custom code" in lowered:
            return "remote-code-refused"
        if (
            "does not recognize this architecture" in lowered
            or "unrecognized model" in lowered
            or "unrecognized configuration class" in lowered
        ):
            return "unsupported-architecture"
        return "load"
    if stage in ("compile", "generate"):
        module = type(exc).__module__ or ""
        if (
            isinstance(exc, NotCompiled)
            or module.startswith(
                ("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses")
            )
            or "backend compiler failed" in lowered
            or any(message in lowered for message in NEURON_COMPILE_MESSAGES)
            or any(message in written for message in CONSOLE_COMPILE_MESSAGES)
        ):
            return "compile"
        return "runtime"
    if stage == "verify":
        return "verification"
    return "runtime"


def compile_failure_reason(exc: BaseException) -> str:
    """Why an ERROR ``compile`` happened (the vocabulary's CompileFailure): the model's graph
    would not run compiled as a whole (a graph break, a CPU fallback inside a compiled graph,
    a recompile at every decode step), or the compile stack itself failed."""
    if isinstance(exc, NotCompiled):
        return exc.reason
    if torch is not None:
        from torch._dynamo.exc import Unsupported

        if isinstance(exc, Unsupported):  # raised only where a graph break is an error
            return "graph-break"
    return "compiler-error"


def emit_progress(
    stage: str, status: str, seconds: float | None = None, detail: str | None = None
) -> None:
    """One machine-readable progress line (the CLI shows these as stages)."""
    event = {"stage": stage, "status": status, "seconds": seconds, "detail": detail}
    print(PROGRESS_MARKER + json.dumps(event), flush=True)


@contextlib.contextmanager
def stage(name: str, ctx: RunContext):
    """Time a stage, report progress (rank 0), and classify any exception raised in it, with
    what the runtime wrote to the console meanwhile (quoted in the error)."""
    ctx.stage = name
    if ctx.rank == 0:
        emit_progress(name, "start")
    start = time.perf_counter()
    mark = CONSOLE.mark()
    try:
        yield
    except StageFailure:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        seconds = time.perf_counter() - start
        if ctx.rank == 0:
            emit_progress(name, "failed", seconds, f"{type(exc).__name__}: {exc}"[:500])
        tb = "".join(traceback.format_exception(exc)).splitlines()[-TRACEBACK_LINES:]
        console = runtime_lines(CONSOLE.lines_since(mark))
        error_class = classify(name, exc, console)
        message = f"{type(exc).__name__}: {exc}"
        if console:
            message += "\nthe Neuron runtime wrote:\n" + "\n".join(console)
        fix = fix_for(message) if error_class in ("infrastructure", "out-of-memory") else None
        if fix:
            message += f"\nfix: {fix}"
        reason = compile_failure_reason(exc) if error_class == "compile" else None
        raise StageFailure(error_class, name, message, "\n".join(tb), reason) from exc
    if ctx.rank == 0:
        emit_progress(name, "done", time.perf_counter() - start)


# ---- what the stages hand on


class RunContext:
    """Per-process state of one test: config, device, rank, partial results."""

    def __init__(self, config: dict, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.stage = "start"
        self.backend: DeviceBackend | None = None  # chosen at setup
        self.device = None
        self.doc: dict = {}
        self.control_group = None  # a sharded run's gloo group for the localization's messages
        self.results = None  # a sharded worker's queue to run_sharded: (rank, doc, final)
        self.followers_released = False  # rank 0 told the others that no search follows

    def report_provisional(self, doc: dict) -> None:
        """A sharded worker's document before a step that must not change it (rank 0's
        verdict before the localization): the run's result if the step never ends."""
        if self.results is not None:
            self.results.put((self.rank, json.loads(json.dumps(doc, default=str)), False))


@dataclasses.dataclass
class Placement:
    """What the setup stage decided: where the model runs and how it is compiled."""

    backend: DeviceBackend
    device: Any
    compile_backend: Any  # a registered torch.compile backend name or a callable
    distributed_config: Any  # transformers DistributedConfig, None on one core
    runtime_memory_before: dict[str, int] | None = None  # sysfs device_mem before the runtime
    compile_settings: dict = dataclasses.field(default_factory=dict)  # pin_compile_settings()


@dataclasses.dataclass
class LoadedModel:
    """What the load stage produced: the model on its device and the batched prompts."""

    processor: Any
    model: Any
    inputs: Any
    pad_token_id: int | None


@dataclasses.dataclass
class Generation:
    """What the generate stage produced (on CPU): the new tokens and the device's logits for
    generating tasks, the class logits of a classifier, or a task's other outputs."""

    tokens: Any  # int tensor [prompts, max_new_tokens]; None where nothing is decoded
    device_logits: Any  # float tensor [prompts, max_new_tokens, vocab], or [inputs, classes]
    text: list = dataclasses.field(default_factory=list)  # the document's text, per input
    outputs: Any = None  # task-specific: embeddings, latents per step, the inputs to re-score


def record_timings(timings: dict, config: dict, steady_s: float, prefill_s: float | None) -> None:
    """The steady call's timings; what the first call took beyond it is compiling. ``prefill_s``:
    the time to the first token of a generating task (decode throughput follows from it)."""
    timings["steady_generate_s"] = steady_s
    timings["compile_s"] = max(timings["first_generate_s"] - steady_s, 0.0)
    if prefill_s is not None:
        timings["prefill_s"] = prefill_s
        n_new = int(config["max_new_tokens"])
        decode_s = steady_s - prefill_s
        batch = len(config["prompts"])
        timings["decode_tokens_per_s"] = (
            batch * (n_new - 1) / decode_s if decode_s > 0 and n_new > 1 else None
        )
    timings["wall_time_s"] = timings["load_s"] + timings["first_generate_s"]


# ---- the document


def new_document(config: dict) -> dict:
    """The result document skeleton; stages fill it in."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": config["model"],
        "weights_sha256": None,
        "revision": config["revision"],
        "resolved_revision": None,
        "task": config["task"],
        "backend": None,
        "compile_backend": config["compile_backend"],
        "dtype": config["dtype"],
        "cores": int(config["cores"]),
        "parallelism": config["parallelism"],
        "max_new_tokens": (
            int(config["max_new_tokens"]) if config["task"] in GENERATING_TASKS else None
        ),
        "parameters": None,
        "parameters_per_core": None,
        "result": "ERROR",
        "error_class": None,
        "error_reason": None,
        "error": None,
        "traceback": None,
        "stage": None,
        "timings": {},
        "memory": {},
        "compilation": {},
        # Filled by whatever runs run.py with a compile cache (it pulls before, pushes after).
        "compile_cache": None,
        "prompts": list(config["prompts"]),
        "tokens": [],
        "text": [],
        "verification": {},
        "judge": None,
        "stack": {},
        "packages": [],
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "finished_at": None,
    }


def execute(ctx: RunContext) -> dict:
    """run_test with every failure turned into a classified ERROR document."""
    started = time.perf_counter()
    doc = ctx.doc = new_document(ctx.config)
    try:
        run_test(ctx)
    except StageFailure as failure:
        doc["result"] = "ERROR"
        doc["error_class"] = failure.error_class
        doc["error_reason"] = failure.reason
        doc["error"] = failure.message
        doc["traceback"] = failure.tb
    doc["stage"] = ctx.stage
    status = proc_status_bytes()
    doc["memory"].update(
        host_peak_rss_bytes=status.get("VmHWM"),
        host_rss_anon_bytes=status.get("RssAnon"),
        host_rss_file_bytes=status.get("RssFile"),
    )
    if not doc["stack"]:
        doc["stack"] = collect_stack(
            ctx.backend if doc["backend"] else intended_backend(ctx.config["backend"])
        )
    doc["packages"] = installed_packages()
    if is_local(ctx.config["model"]):
        doc["weights_sha256"] = weights_digest(ctx.config["model"])
    doc["timings"]["total_s"] = time.perf_counter() - started
    doc["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    return doc


# ---- sharded runs


def worker_main(rank: int, world_size: int, config: dict, queue) -> None:
    """Entry point of one torch.distributed worker (spawned by run_sharded)."""
    # torchrun's variables; TorchNeuron reads LOCAL_RANK and LOCAL_WORLD_SIZE (without both it
    # discovers them through the store), all ranks being on this host.
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    CONSOLE.start()  # this worker's own console, for its error classes
    ctx = RunContext(config, rank=rank, world_size=world_size)
    ctx.results = queue
    doc = execute(ctx)
    queue.put((rank, doc, True))
    with contextlib.suppress(Exception):
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _dead_worker(procs, docs: dict) -> int | None:
    """The worker to blame among those that exited abnormally without sending a result.

    One killed by a signal (negative exit code: OOM killer, SIGKILL) comes first: a peer that
    lost it in a collective exits with a plain status of its own moments later, and by the time
    the parent looks both may be dead.
    """
    dead = [r for r, p in enumerate(procs) if r not in docs and p.exitcode not in (None, 0)]
    if not dead:
        return None
    signalled = [r for r in dead if procs[r].exitcode < 0]
    return (signalled or dead)[0]


def _crashed_worker(procs, docs: dict, wait_s: float) -> int | None:
    """The worker to blame for a crash (see _dead_worker), waiting up to wait_s for one."""
    deadline = time.monotonic() + wait_s
    while True:
        crashed = _dead_worker(procs, docs)
        if crashed is not None or time.monotonic() > deadline:
            return crashed
        time.sleep(0.1)


FOLLOWERS_GRACE_S = 60.0  # how long the other workers may take to end after rank 0's verdict


def run_sharded(config: dict) -> dict:
    """Start one worker per core on 127.0.0.1 and return rank 0's document.

    Any worker that fails or dies fails the whole run with that rank's error; waits are bounded
    by ``worker_timeout_s`` and every worker is killed before returning.
    """
    import queue as queue_module

    world_size = int(config["cores"])
    # The workers meet at a store served from here, on a port the kernel picks at bind and held
    # until they end: as torchrun's agent store, every rank a client of it. Choosing a free port
    # for rank 0 to bind later let any other program on the host take it meanwhile, and the run
    # ended in EADDRINUSE, an ERROR that said nothing about the model.
    rendezvous = torch.distributed.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=float(config["worker_timeout_s"])),
    )
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(rendezvous.port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [
        context.Process(target=worker_main, args=(rank, world_size, config, results), daemon=True)
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + float(config["worker_timeout_s"])
    docs: dict[int, dict] = {}
    failure = None
    failed_rank = None
    verdict_at = None  # when rank 0's document arrived without an error
    provisional = None  # rank 0's verdict before its search (the result if the search never ends)
    try:
        while len(docs) < world_size and failure is None:
            if verdict_at is not None and time.monotonic() > verdict_at + FOLLOWERS_GRACE_S:
                # Rank 0 has its verdict and has released the others: one still busy (stuck
                # in the search's collective after rank 0 gave up, say) cannot change it.
                break
            try:
                rank, doc, final = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = _dead_worker(procs, docs)
                if dead is not None and provisional is not None:
                    # A worker stopped during rank 0's search: the verdict stands, the search
                    # is recorded as failed (the provisional document says so).
                    provisional["verification"]["first_divergence"]["reason"] += (
                        f" (worker rank {dead} exited with status {procs[dead].exitcode})"
                    )
                    break
                if dead is not None and verdict_at is None:
                    failure = f"worker rank {dead} exited with status {procs[dead].exitcode} without a result"
                elif time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(docs))
                    failure = (
                        f"workers {missing} gave no result within {config['worker_timeout_s']:g} s"
                    )
                continue
            if not final:
                provisional = doc
                continue
            docs[rank] = doc
            if rank == 0 and doc["error_class"] is None:
                verdict_at = time.monotonic()
            if doc["error_class"] is not None and verdict_at is None:
                # The others may wait forever in a collective for this rank: stop them now.
                failure, failed_rank = f"rank {rank} failed", rank
        if failed_rank is not None:
            # A rank often fails only because a peer died under it ("connection closed by
            # peer"): give a dead peer a moment to show its exit status, and blame it instead.
            crashed = _crashed_worker(procs, docs, wait_s=3.0)
            if crashed is not None:
                failure = f"worker rank {crashed} exited with status {procs[crashed].exitcode} without a result"
                failure += f" (rank {failed_rank} then failed: {docs[failed_rank]['error']})"
                failed_rank = None
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=10)
        del rendezvous  # closed once no worker can still reach it
    if failure is None:
        return docs.get(0, provisional)
    if 0 not in docs and provisional is not None:
        provisional["verification"]["first_divergence"]["reason"] += f" ({failure})"
        return provisional
    doc = docs.get(0) or new_document(config)
    if failed_rank == 0:
        return doc
    doc["result"] = "ERROR"
    if failed_rank is not None:
        failed = docs[failed_rank]
        doc["error_class"] = failed["error_class"]
        doc["error"] = f"{failure} in stage {failed['stage']}: {failed['error']}"
        doc["traceback"] = failed["traceback"]
        doc["stage"] = failed["stage"]
    else:
        doc["error_class"] = "worker-crash"
        doc["error"] = failure
    if not doc["stack"]:
        # The workers' setup chose the backend; here only versions are wanted, so nothing that
        # could raise again (select_backend) or start a device runtime runs in this process.
        doc["stack"] = collect_stack(intended_backend(config["backend"]))
        doc["packages"] = installed_packages()
    doc["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    return doc


# ---- output


def write_result(doc: dict, path: str) -> None:
    """The result file (atomically) and the marked last stdout line."""
    text = json.dumps(doc, default=str)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
    print(RESULT_MARKER + text, flush=True)


if __name__ == "__main__":
    sys.exit(doctor_main(sys.argv[1:]) if len(sys.argv) > 1 else main())
