#!/usr/bin/env python3
"""model-support runner: does this Hugging Face model run unmodified on this accelerator?

Loads a model with ``from_pretrained``, compiles its forward (``torch.compile``; backend
``neuron`` on Trainium, ``inductor`` elsewhere), generates a fixed number of tokens greedily
with a static cache, and verifies them against a float32 CPU reference. Writes one JSON result
document (to ``result_path`` and as the last stdout line, prefixed ``MODEL_SUPPORT_RESULT``).

Standalone: needs only torch and transformers (and torch_neuronx on Trainium). Run it as
``python3 run.py``; everything it does is set by the config block below. When ``cores`` > 1 it
starts its own torch.distributed workers (no torchrun) and shards the model (tensor parallel, or
expert parallel for mixture-of-experts models).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys
import time
import traceback

# ---- BEGIN MODEL-SUPPORT CONFIG (rendered by model-support; JSON only) ----
CONFIG_JSON = '{"backend": "auto", "compile_backend": null, "cores": 1, "dtype": "bfloat16", "judge_model": null, "max_new_tokens": 32, "model": "Qwen/Qwen3-0.6B", "parallelism": "none", "prompts": ["def fibonacci(n):", "The capital of France is", "import numpy as np\\n"], "result_path": "result.json", "revision": null, "task": "text-generation", "trust_remote_code": false, "verification": {"enabled": true, "error_floor": 0.001, "max_error_ratio": 3.0, "near_tie_floor": 0.02, "near_tie_multiple": 3.0}, "worker_timeout_s": 1800.0}'
# ---- END MODEL-SUPPORT CONFIG ----

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
RESULT_MARKER = "MODEL_SUPPORT_RESULT "
PROGRESS_MARKER = "MODEL_SUPPORT_STAGE "
SCHEMA_VERSION = 1
TRACEBACK_LINES = 40
TOP_K_NOISE = 8  # reference top-k tokens whose baseline deviation sets a position's noise level

STACK_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "huggingface_hub": "huggingface_hub",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "torch_neuronx": "torch-neuronx",
    "neuronx_cc": "neuronx-cc",
}


# --------------------------------------------------------------------------- errors and stages


class StageFailure(Exception):
    """A stage failed; carries the classified error for the result document."""

    def __init__(self, error_class: str, stage: str, message: str, tb: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.stage = stage
        self.message = message
        self.tb = tb


def classify(stage: str, exc: BaseException) -> str:
    """Map an exception raised in a stage to an error class of the vocabulary."""
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    if (
        isinstance(exc, MemoryError)
        or "out of memory" in lowered
        or "outofmemory" in lowered
        or "resource_exhausted" in lowered
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
            module.startswith(("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses"))
            or "backend compiler failed" in lowered
            or "neuronx-cc" in lowered
            or "neff" in lowered
        ):
            return "compile"
        return "runtime"
    if stage == "verify":
        return "verification"
    return "runtime"


def emit_progress(
    stage: str, status: str, seconds: float | None = None, detail: str | None = None
) -> None:
    """One machine-readable progress line (the CLI shows these as stages)."""
    event = {"stage": stage, "status": status, "seconds": seconds, "detail": detail}
    print(PROGRESS_MARKER + json.dumps(event), flush=True)


@contextlib.contextmanager
def stage(name: str, ctx: RunContext):
    """Time a stage, report progress (rank 0), and classify any exception raised in it."""
    ctx.stage = name
    if ctx.rank == 0:
        emit_progress(name, "start")
    start = time.perf_counter()
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
        raise StageFailure(
            classify(name, exc), name, f"{type(exc).__name__}: {exc}", "\n".join(tb)
        ) from exc
    if ctx.rank == 0:
        emit_progress(name, "done", time.perf_counter() - start)


# --------------------------------------------------------------------------- environment


class RunContext:
    """Per-process state of one test: config, device, rank, partial results."""

    def __init__(self, config: dict, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.stage = "start"
        self.backend = "cpu"
        self.device = None
        self.doc: dict = {}


def select_backend(requested: str) -> str:
    """neuron if torch_neuronx imports, else cuda if available, else cpu (or the forced one)."""
    import torch

    if requested == "neuron":
        import torch_neuronx

        return "neuron"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "backend 'cuda' was requested but torch.cuda.is_available() is False"
            )
        return "cuda"
    if requested == "cpu":
        return "cpu"
    if importlib.util.find_spec("torch_neuronx") is not None:
        # Installed means Trainium was meant: a broken install must fail the run, not fall back.
        import torch_neuronx  # noqa: F401

        return "neuron"
    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(backend: str) -> None:
    """Wait for queued device work, so timings and memory readings are complete."""
    import torch

    if backend == "cuda":
        torch.cuda.synchronize()
    elif backend == "neuron":
        torch.neuron.synchronize()


def reset_peaks(backend: str) -> None:
    """Start peak-memory accounting from now."""
    import torch

    if backend == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elif backend == "neuron":
        fn = getattr(getattr(torch, "neuron", None), "reset_peak_memory_stats", None)
        if callable(fn):
            fn()
    # "5" resets VmHWM (peak RSS) of this process (Linux >= 4.0); unsupported elsewhere.
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


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


def device_peak_memory(backend: str) -> tuple[int | None, str | None]:
    """Peak device memory in bytes and which API gave it."""
    import torch

    if backend == "cuda":
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    if backend == "neuron":
        synchronize(backend)
        neuron = getattr(torch, "neuron", None)
        fn = getattr(neuron, "max_memory_allocated", None)
        if callable(fn):
            return int(fn()), "torch.neuron.max_memory_allocated"
        stats_fn = getattr(neuron, "memory_stats", None)
        if callable(stats_fn):
            stats = stats_fn()
            for key in ("allocated_bytes.all.peak", "peak_bytes", "max_allocated"):
                if key in stats:
                    return int(stats[key]), f"torch.neuron.memory_stats()[{key!r}]"
        return None, None
    # cpu: the device is this process; its own peak resident set (anonymous + file-backed).
    status = proc_status_bytes()
    return status.get("VmHWM"), "/proc/self/status VmHWM"


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


def collect_stack(backend: str) -> dict:
    """Versions of everything that decides the outcome."""
    stack = {key: package_version(dist) for key, dist in STACK_PACKAGES.items()}
    if stack["neuronx_cc"] is None and backend == "neuron":
        with contextlib.suppress(ImportError):
            import neuronxcc

            stack["neuronx_cc"] = getattr(neuronxcc, "__version__", None)
    stack["python"] = platform.python_version()
    stack["os"] = platform.platform()
    stack["instance_type"] = instance_type()
    stack["device_name"] = None
    if backend == "cuda":
        import torch

        stack["device_name"] = torch.cuda.get_device_name()
    elif backend == "cpu":
        stack["device_name"] = platform.processor() or platform.machine()
    return stack


def installed_packages() -> list[str]:
    """Every installed distribution as name==version, sorted."""
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return sorted(seen.values(), key=str.lower)


# --------------------------------------------------------------------------- model and inputs


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def resolve_compile_backend(name: str | None, backend: str):
    """A registered torch.compile backend name, or a callable from 'module:function'."""
    if name is None:
        return "neuron" if backend == "neuron" else "inductor"
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return getattr(importlib.import_module(module_name), attr)
    return name


def is_local(model: str) -> bool:
    return os.path.isdir(model)


def load_model(config: dict, dtype_name: str, device, distributed_config=None):
    """from_pretrained for the test's task; the tokenizer/processor and the model."""
    import transformers

    task = config["task"]
    revision = None if is_local(config["model"]) else config["revision"]
    common = {"revision": revision, "trust_remote_code": bool(config["trust_remote_code"])}
    if task == "image-text-to-text":
        processor = transformers.AutoProcessor.from_pretrained(config["model"], **common)
        model_cls = transformers.AutoModelForImageTextToText
    elif task == "text-generation":
        processor = transformers.AutoTokenizer.from_pretrained(config["model"], **common)
        model_cls = transformers.AutoModelForCausalLM
    else:
        raise ValueError(
            f"unsupported task {task!r}: expected text-generation or image-text-to-text"
        )
    # Weights from safetensors only: a pickle checkpoint can run code when it is unpickled.
    kwargs = dict(common, dtype=torch_dtype(dtype_name), use_safetensors=True)
    if distributed_config is not None:
        kwargs["distributed_config"] = distributed_config
    model = model_cls.from_pretrained(config["model"], **kwargs)
    if distributed_config is None and device is not None:
        model = model.to(device)
    model.eval()
    return processor, model


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


def ensure_pad_token(tokenizer) -> None:
    """Batched prompts need a pad token; many causal LMs ship none.

    Which token pads does not matter (the attention mask hides it), so an existing one is
    reused rather than a new one added, which would change the vocabulary the model was made for.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = (
            tokenizer.eos_token or tokenizer.unk_token or tokenizer.convert_ids_to_tokens(0)
        )


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


def generate(model, inputs, max_new_tokens: int, pad_token_id):
    """Greedy generation of exactly max_new_tokens with a static cache; logits kept."""
    return model.generate(
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


# --------------------------------------------------------------------------- verification


def teacher_forced_logprobs(model, single_inputs: dict, generated, prompt_len: int):
    """Log-probabilities (float64) the model gives at each generated position, teacher forced."""
    import torch

    ids = torch.cat([single_inputs["input_ids"], generated.unsqueeze(0)], dim=1)
    kwargs = {k: v for k, v in single_inputs.items() if k not in ("input_ids", "attention_mask")}
    kwargs["attention_mask"] = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **kwargs).logits
    n = generated.shape[0]
    return torch.log_softmax(logits[0, prompt_len - 1 : prompt_len - 1 + n].double(), dim=-1)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verify(
    config: dict, processor, prompts, tokens, device_logits, dtype_name: str
) -> tuple[dict, float]:
    """Judge the device's tokens and logits against a float32 CPU reference.

    For each prompt, the prompt plus the device's tokens are scored teacher-forced on CPU twice:
    in float32 (the reference) and in the run dtype (the baseline: how far a correct
    implementation in that dtype deviates). A generated token that is not the reference argmax
    is accepted only where the reference margin is within ``near_tie_multiple`` times the
    baseline's deviation at that position (at least ``near_tie_floor`` nats); any other
    mismatch fails.

    The device's logit error must stay within ``max_error_ratio`` times the baseline's. A
    position's error is the largest log-probability deviation from the reference over the
    reference's top tokens and the generated one; a prompt's error is the median over its
    positions (worst prompt counts). The median keeps a correct mixture-of-experts run, whose
    router flips a near-tied expert choice at a few positions, apart from a corrupted layer,
    which shifts every position. The whole-vocabulary RMSE ratio is recorded beside it.
    """
    import torch

    params = config["verification"]
    start = time.perf_counter()
    # Every argument is explicit so a sharded run's rank 0 loads an unsharded reference.
    _, reference = load_model(config, "float32", torch.device("cpu"))
    singles = [build_inputs(config, processor, [prompt]) for prompt in prompts]
    ref_lps = []
    for i, single in enumerate(singles):
        ref_lps.append(
            teacher_forced_logprobs(
                reference, dict(single), tokens[i], single["input_ids"].shape[1]
            )
        )
    if dtype_name == "float32":
        base_lps = ref_lps
    else:
        reference.to(torch_dtype(dtype_name))
        base_lps = [
            teacher_forced_logprobs(
                reference, dict(single), tokens[i], single["input_ids"].shape[1]
            )
            for i, single in enumerate(singles)
        ]
    del reference
    gc.collect()

    positions = []
    mismatches = near_ties = bad = 0
    first_mismatch = None
    worst_ratio = worst_rmse_ratio = 0.0
    worst = (0.0, 0.0)
    reasons = []
    for i, (ref, base) in enumerate(zip(ref_lps, base_lps, strict=True)):
        dev = torch.log_softmax(device_logits[i].double(), dim=-1)
        n = ref.shape[0]
        rmse_dev = float(torch.sqrt(torch.mean((dev - ref) ** 2)))
        rmse_base = float(torch.sqrt(torch.mean((base - ref) ** 2)))
        worst_rmse_ratio = max(worst_rmse_ratio, rmse_dev / max(rmse_base, params["error_floor"]))
        device_devs, baseline_devs = [], []
        for t in range(n):
            token = int(tokens[i][t])
            ref_arg = int(torch.argmax(ref[t]))
            margin = float(ref[t, ref_arg] - ref[t, token])
            top = torch.topk(ref[t], TOP_K_NOISE).indices.tolist()
            watch = torch.tensor(sorted(set(top) | {token}))
            noise = float(torch.max(torch.abs(base[t, watch] - ref[t, watch])))
            device_dev = float(torch.max(torch.abs(dev[t, watch] - ref[t, watch])))
            device_devs.append(device_dev)
            baseline_devs.append(noise)
            allowance = max(params["near_tie_multiple"] * noise, params["near_tie_floor"])
            verdict = "match"
            if token != ref_arg:
                mismatches += 1
                index = i * n + t
                first_mismatch = index if first_mismatch is None else min(first_mismatch, index)
                if margin <= allowance:
                    verdict = "near-tie"
                    near_ties += 1
                else:
                    verdict = "bad"
                    bad += 1
                    if len(reasons) < 3:
                        reasons.append(
                            f"prompt {i} token {t}: generated {token} but the reference prefers {ref_arg} "
                            f"by {margin:.3f} nats, beyond the {dtype_name} noise allowance {allowance:.3f}"
                        )
            positions.append(
                {
                    "prompt": i,
                    "position": t,
                    "token": token,
                    "reference_token": ref_arg,
                    "margin": round(margin, 6),
                    "baseline_deviation": round(noise, 6),
                    "device_deviation": round(device_dev, 6),
                    "verdict": verdict,
                }
            )
        dev_err, base_err = median(device_devs), median(baseline_devs)
        ratio = dev_err / max(base_err, params["error_floor"])
        if ratio >= worst_ratio:
            worst_ratio, worst = ratio, (dev_err, base_err)
    if worst_ratio > params["max_error_ratio"]:
        reasons.append(
            f"median logit error {worst[0]:.4f} is {worst_ratio:.2f}x the {dtype_name} baseline's {worst[1]:.4f} "
            f"(bound {params['max_error_ratio']:g}x)"
        )
    verification = {
        "passed": not reasons,
        "exact": mismatches == 0,
        "error_ratio": round(worst_ratio, 6),
        "device_error": round(worst[0], 8),
        "baseline_error": round(worst[1], 8),
        "rmse_ratio": round(worst_rmse_ratio, 6),
        "mismatches": mismatches,
        "near_ties": near_ties,
        "bad_tokens": bad,
        "first_mismatch": first_mismatch,
        "reason": "; ".join(reasons) if reasons else None,
        "parameters": {k: float(v) for k, v in params.items() if k != "enabled"},
        "positions": positions,
    }
    return verification, time.perf_counter() - start


JUDGE_QUESTION = (
    "Is the following text fluent English? Answer yes or no.\n\nText: {text}\n\nAnswer:"
)


def judge(path: str, texts: list[str]) -> dict:
    """A small local judge model's opinion of whether each text is fluent English.

    Recorded beside the verdict, never instead of it (the original Space asked a judge model).
    p_yes is the judge's probability of " yes" against " no" after the question.
    """
    import torch
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


# --------------------------------------------------------------------------- the test


def distributed_setup(ctx: RunContext):
    """Process group and transformers DistributedConfig for a sharded run (None when single)."""
    if ctx.world_size == 1:
        return None
    import torch
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    group_backend = {"neuron": "neuron", "cuda": "nccl"}.get(ctx.backend, "gloo")
    if ctx.backend == "cuda":
        torch.cuda.set_device(ctx.rank)
    dist.init_process_group(
        backend=group_backend, init_method="env://", rank=ctx.rank, world_size=ctx.world_size
    )
    if ctx.config["parallelism"] == "expert":
        # Experts split over the ranks, dense layers whole on every rank. transformers refuses an
        # empty tensor-parallel plan ("has no tp_plan"), so every entry of the model's plan is made
        # a replication; the expert-parallel plan takes precedence for the experts (docs/memory-model.md).
        import transformers

        auto_config = transformers.AutoConfig.from_pretrained(
            ctx.config["model"],
            revision=None if is_local(ctx.config["model"]) else ctx.config["revision"],
            trust_remote_code=bool(ctx.config["trust_remote_code"]),
        )
        text_config = getattr(auto_config, "text_config", None) or auto_config
        base_plan = getattr(text_config, "base_model_tp_plan", None) or {}
        replicated = {"model." + key: "replicated_with_grad_allreduce" for key in base_plan}
        return DistributedConfig(tp_size=ctx.world_size, ep_size=ctx.world_size, tp_plan=replicated)
    return DistributedConfig(tp_size=ctx.world_size)


def run_test(ctx: RunContext) -> dict:
    """Load, compile, generate (every rank); verify and build the result document (rank 0)."""
    import torch

    config = ctx.config
    doc = ctx.doc
    timings = doc["timings"]
    memory = doc["memory"]
    n_new = int(config["max_new_tokens"])
    with stage("setup", ctx):
        ctx.backend = select_backend(config["backend"])
        doc["backend"] = ctx.backend
        doc["stack"] = collect_stack(ctx.backend)
        if ctx.backend == "neuron":
            ctx.device = (
                torch.device("neuron", ctx.rank) if ctx.world_size > 1 else torch.device("neuron")
            )
        elif ctx.backend == "cuda":
            ctx.device = torch.device("cuda", ctx.rank)
        else:
            ctx.device = torch.device("cpu")
        compile_backend = resolve_compile_backend(config["compile_backend"], ctx.backend)
        doc["compile_backend"] = config["compile_backend"] or compile_backend
        distributed_config = distributed_setup(ctx)
        reset_peaks(ctx.backend)

    with stage("load", ctx):
        t0 = time.perf_counter()
        processor, model = load_model(config, config["dtype"], ctx.device, distributed_config)
        synchronize(ctx.backend)
        timings["load_s"] = time.perf_counter() - t0
        doc["resolved_revision"] = resolved_revision(config)
        doc["parameters"] = sum(p.numel() for p in model.parameters())
        # What this core holds: a DTensor's local shard, else the whole tensor.
        doc["parameters_per_core"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
        )
        inputs = build_inputs(config, processor, config["prompts"]).to(ctx.device)
        pad_token_id = tokenizer_of(processor).pad_token_id

    with stage("compile", ctx):
        model.forward = torch.compile(model.forward, backend=compile_backend)
        t0 = time.perf_counter()
        with torch.no_grad():
            generate(model, inputs, n_new, pad_token_id)
        synchronize(ctx.backend)
        timings["first_generate_s"] = time.perf_counter() - t0

    with stage("generate", ctx):
        with torch.no_grad():
            t0 = time.perf_counter()
            out = generate(model, inputs, n_new, pad_token_id)
            synchronize(ctx.backend)
            timings["steady_generate_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            generate(model, inputs, 1, pad_token_id)
            synchronize(ctx.backend)
            timings["prefill_s"] = time.perf_counter() - t0
        timings["compile_s"] = max(timings["first_generate_s"] - timings["steady_generate_s"], 0.0)
        decode_s = timings["steady_generate_s"] - timings["prefill_s"]
        batch = inputs["input_ids"].shape[0]
        timings["decode_tokens_per_s"] = (
            batch * (n_new - 1) / decode_s if decode_s > 0 and n_new > 1 else None
        )
        timings["wall_time_s"] = timings["load_s"] + timings["first_generate_s"]
        peak, source = device_peak_memory(ctx.backend)
        memory["peak_device_memory_bytes"], memory["device_memory_source"] = peak, source
        prompt_len = inputs["input_ids"].shape[1]
        generated = out.sequences[:, prompt_len:].cpu()
        device_logits = torch.stack([step.float().cpu() for step in out.logits], dim=1)
        doc["tokens"] = generated.tolist()
        doc["text"] = tokenizer_of(processor).batch_decode(generated, skip_special_tokens=True)

    del model, out
    gc.collect()
    if ctx.rank != 0:
        return doc

    if not config["verification"]["enabled"]:
        doc["result"] = "UNVERIFIED"  # it ran; whether its tokens are right was not checked
        doc["verification"] = {
            "passed": None,
            "reason": "verification disabled by the test's config",
        }
        return doc
    with stage("verify", ctx):
        verification, seconds = verify(
            config, processor, config["prompts"], generated, device_logits, config["dtype"]
        )
        timings["reference_s"] = seconds
        doc["verification"] = verification
        doc["result"] = "PASS" if verification["passed"] else "FAIL"
    if config["judge_model"]:
        try:
            doc["judge"] = judge(config["judge_model"], doc["text"])
        except Exception as exc:
            # The judge is advisory: its failure is recorded with its class, the verdict stands.
            doc["judge"] = {
                "model": config["judge_model"],
                "error_class": classify("load", exc),
                "error": f"{type(exc).__name__}: {exc}",
            }
    return doc


def new_document(config: dict) -> dict:
    """The result document skeleton; stages fill it in."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": config["model"],
        "revision": config["revision"],
        "resolved_revision": None,
        "task": config["task"],
        "backend": None,
        "compile_backend": config["compile_backend"],
        "dtype": config["dtype"],
        "cores": int(config["cores"]),
        "parallelism": config["parallelism"],
        "max_new_tokens": int(config["max_new_tokens"]),
        "parameters": None,
        "parameters_per_core": None,
        "result": "ERROR",
        "error_class": None,
        "error": None,
        "traceback": None,
        "stage": None,
        "timings": {},
        "memory": {},
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
        doc["stack"] = collect_stack(ctx.backend)
    doc["packages"] = installed_packages()
    doc["timings"]["total_s"] = time.perf_counter() - started
    doc["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    return doc


# --------------------------------------------------------------------------- sharded runs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_main(rank: int, world_size: int, config: dict, queue) -> None:
    """Entry point of one torch.distributed worker (spawned by run_sharded)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    ctx = RunContext(config, rank=rank, world_size=world_size)
    doc = execute(ctx)
    queue.put((rank, doc))
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _crashed_worker(procs, docs: dict, wait_s: float) -> int | None:
    """The first worker that exited abnormally without sending a result, waiting up to wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, proc in enumerate(procs):
            if rank not in docs and proc.exitcode not in (None, 0):
                return rank
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def run_sharded(config: dict) -> dict:
    """Start one worker per core on 127.0.0.1 and return rank 0's document.

    Any worker that fails or dies fails the whole run with that rank's error; waits are bounded
    by ``worker_timeout_s`` and every worker is killed before returning.
    """
    import queue as queue_module

    import torch.multiprocessing as mp

    world_size = int(config["cores"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    context = mp.get_context("spawn")
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
    try:
        while len(docs) < world_size and failure is None:
            try:
                rank, doc = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = [
                    r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in docs
                ]
                if dead:
                    failure = f"worker rank {dead[0]} exited with status {procs[dead[0]].exitcode} without a result"
                elif time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(docs))
                    failure = (
                        f"workers {missing} gave no result within {config['worker_timeout_s']:g} s"
                    )
                continue
            docs[rank] = doc
            if doc["error_class"] is not None:
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
    if failure is None:
        return docs[0]
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
        doc["stack"] = collect_stack(select_backend(config["backend"]))
        doc["packages"] = installed_packages()
    doc["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    return doc


# --------------------------------------------------------------------------- output


def write_result(doc: dict, path: str) -> None:
    """The result file (atomically) and the marked last stdout line."""
    text = json.dumps(doc, default=str)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
    print(RESULT_MARKER + text, flush=True)


def main() -> int:
    config = json.loads(CONFIG_JSON)
    doc = run_sharded(config) if int(config["cores"]) > 1 else execute(RunContext(config))
    write_result(doc, config["result_path"])
    return 0 if doc["result"] in ("PASS", "FAIL", "UNVERIFIED") else 1


if __name__ == "__main__":
    sys.exit(main())
