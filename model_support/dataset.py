"""The matrix: one Parquet row per (model, task) and per compiler x library version pair.

This module is the ONE place where the matrix's columns are defined: :data:`COLUMNS` gives each
column's name, Arrow type, meaning and how it is read from a :class:`RunRecord`. The Parquet schema
(:data:`MATRIX_SCHEMA`), :func:`record_to_row` and the dataset card's column table are all derived
from it, so they cannot drift apart.

Placement: a record lands in the matrix file of its (compiler, compiler version, library,
library version). On the neuron backend the compiler is ``neuronx-cc`` at the recorded
``stack.neuronx_cc``; elsewhere it is the torch.compile backend (``inductor``, ``aot_eager``,
``module:function``) at the recorded torch version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

import pyarrow as pa
from huggingface_hub import DatasetCardData
from pydantic import BaseModel

from model_support.config import VerificationConfig
from model_support.models import is_local_path
from model_support.records import ResultDocument, RunRecord, Stack, Verification
from model_support.vocabulary import (
    COMPILE_FAILURE_MEANINGS,
    DIVERGENCE_PHASE_MEANINGS,
    ERROR_CLASS_MEANINGS,
    EXCLUSION_MEANINGS,
    FLOAT32_PRECISION_DEFAULTS,
    FLOAT32_PRECISION_MEANINGS,
    LOCALIZATION_STATUS_MEANINGS,
    PASS_BLIND_SPOTS,
    PASS_GUARANTEES,
    RESULT_MEANINGS,
    TASK_METHODS,
    VERDICT_CHECK_MEANINGS,
    Backend,
    Float32Precision,
    Result,
)

NEURON_COMPILER = "neuronx-cc"
"""Compiler name of every run on the neuron backend (torch.compile(backend="neuron"))."""

DEFAULT_COMPILE_BACKEND = "inductor"
"""run.py's torch.compile backend off Trainium when none is configured (see RunConfig)."""

LIBRARY = "transformers"
"""The modelling library every test goes through."""

UNKNOWN = "unknown"
"""Stands in for a missing compiler or version in matrix file names."""

MATRIX_FORMAT_VERSION = 3
"""Bump when what a column holds changes without the schema changing (a getter below): stores
rebuild their matrix from the records when it differs from the one their index was made with."""


@dataclass(frozen=True)
class MatrixKey:
    """Which matrix file a record belongs to. None = not known (no stack recorded).

    Keys sort with None as the empty string: a stack without a library version sorts beside
    the same compiler's others (compared field by field, None and a version do not order)."""

    compiler: str | None
    compiler_version: str | None
    library: str
    library_version: str | None

    def _sort_tuple(self) -> tuple[str, str, str, str]:
        return (
            self.compiler or "",
            self.compiler_version or "",
            self.library,
            self.library_version or "",
        )

    def __lt__(self, other: MatrixKey) -> bool:
        return self._sort_tuple() < other._sort_tuple()


@dataclass(frozen=True)
class _Source:
    """What a column reads from: the record, its document and its placement."""

    record: RunRecord
    doc: ResultDocument
    key: MatrixKey


@dataclass(frozen=True)
class Column:
    """One matrix column: name, Arrow type, meaning (shown in the dataset card), and reader."""

    name: str
    type: pa.DataType
    description: str
    get: Callable[[_Source], Any]


def _utc(value: datetime | None) -> datetime | None:
    """Timestamps are stored in UTC; a naive timestamp is taken to already be UTC (run.py writes UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _json(value: Any) -> str:
    """Deterministic JSON (sorted keys) so re-materializing gives byte-identical files."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _model_json(value: BaseModel) -> str:
    """A record part as JSON in its declared field order (deterministic, and fast)."""
    return value.model_dump_json()


def _field(path: str) -> Callable[[_Source], Any]:
    """A column that is one field of the record, e.g. ``"doc.timings.load_s"``.

    ``operator.attrgetter`` reads it in C: a matrix of 100,000 rows is built noticeably faster
    than with one Python function call per cell.
    """
    getter: Callable[[_Source], Any] = attrgetter(path)
    return getter


def _first_divergence(verification: Verification, name: str) -> Any:
    found = verification.first_divergence
    return None if found is None else getattr(found, name)


def _enum_value(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


def _cache_figure(s: _Source, direction: str, name: str) -> Any:
    """One figure of the run's compile cache pull or push; None where there was none."""
    cache = s.doc.compile_cache
    transfer = getattr(cache, direction) if cache is not None else None
    return None if transfer is None else getattr(transfer, name)


def _cache_skipped(s: _Source) -> int | None:
    cache = s.doc.compile_cache
    if cache is None:
        return None
    return sum(t.skipped for t in (cache.pull, cache.push) if t is not None)


def _cache_error(s: _Source) -> str | None:
    cache = s.doc.compile_cache
    if cache is None:
        return None
    errors = [
        f"{name}: {t.error}"
        for name, t in (("pull", cache.pull), ("push", cache.push))
        if t and t.error
    ]
    return "; ".join(errors) or None


def held_seconds(doc: ResultDocument) -> float | None:
    """Seconds the runner held its cores, from the run's own timestamps: run.py's start to its
    finish plus the compile cache pull and push around it; 0 for EXCLUDED (nothing ran); None
    when the run recorded no times (docs/pricing.md)."""
    if doc.result == Result.EXCLUDED:
        return 0.0
    started, finished = _utc(doc.started_at), _utc(doc.finished_at)
    if started is not None and finished is not None and finished >= started:
        held = (finished - started).total_seconds()
    elif doc.timings.total_s is not None:
        held = doc.timings.total_s
    else:
        return None
    cache = doc.compile_cache
    if cache is not None:
        held += sum(t.seconds or 0.0 for t in (cache.pull, cache.push) if t is not None)
    return held


def core_seconds(doc: ResultDocument, held_cores: int | None = None) -> float | None:
    """Cores held x :func:`held_seconds`: what the run used, compile included. ``held_cores``:
    the cores the pod held when the scheduler places more than the model uses (whole devices);
    else the run's own cores."""
    held = held_seconds(doc)
    return None if held is None else held * (held_cores or doc.cores)


def record_held_cores(record: RunRecord) -> int | None:
    """The cores the pod held, where the operator recorded it (label ``pod_cores``)."""
    value = record.labels.get("pod_cores")
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def _held_s(s: _Source) -> float | None:
    return held_seconds(s.doc)


def _core_seconds(s: _Source) -> float | None:
    return core_seconds(s.doc, record_held_cores(s.record))


def _compile_share(s: _Source) -> float | None:
    held = held_seconds(s.doc)
    compile_s = s.doc.timings.compile_s
    if held is None or compile_s is None or held <= 0:
        return None
    return min(max(compile_s / held, 0.0), 1.0)


_STRING = pa.string()
_INT = pa.int64()
_FLOAT = pa.float64()
_BOOL = pa.bool_()
_TIMESTAMP = pa.timestamp("us", tz="UTC")

COLUMNS: tuple[Column, ...] = (
    # identity of the test
    Column(
        "model_id",
        _STRING,
        "Hub model id (org/name); for a local checkpoint a readable id (local/<folder name>, or "
        "the name it was recorded under, e.g. demo/tiny-llama).",
        lambda s: s.record.model_id,
    ),
    Column(
        "model_path",
        _STRING,
        "The local checkpoint directory that was tested (on the machine that ran it); null for a Hub model.",
        lambda s: s.doc.model if is_local_path(s.doc.model) else None,
    ),
    Column(
        "weights_sha256",
        _STRING,
        "A local checkpoint: sha256 of its weight files (each one's relative path and content "
        "hash, sorted), so the row names the weights it tested; null for a Hub model (its "
        "resolved_revision names them).",
        _field("doc.weights_sha256"),
    ),
    Column(
        "revision",
        _STRING,
        "Requested Hub revision (branch, tag or commit); null = main.",
        _field("doc.revision"),
    ),
    Column(
        "resolved_revision",
        _STRING,
        "Commit the requested revision resolved to when the test ran.",
        _field("doc.resolved_revision"),
    ),
    Column(
        "task",
        _STRING,
        "Hub pipeline tag tested: text-generation, image-text-to-text, feature-extraction, sentence-similarity, text2text-generation, automatic-speech-recognition, image-classification, text-classification or text-to-image.",
        _field("doc.task"),
    ),
    Column(
        "backend",
        _STRING,
        "Device backend run.py executed on: neuron, cuda or cpu.",
        _field("doc.backend"),
    ),
    # placement: which matrix file the row is in
    Column(
        "neuronx_cc",
        _STRING,
        "neuronx-cc compiler version on the neuron backend; null off Trainium.",
        lambda s: s.key.compiler_version if s.key.compiler == NEURON_COMPILER else None,
    ),
    Column(
        "compiler",
        _STRING,
        "neuronx-cc on the neuron backend, else the torch.compile backend (inductor, aot_eager, module:function).",
        _field("key.compiler"),
    ),
    Column(
        "compiler_version",
        _STRING,
        "Version of `compiler`: the neuronx-cc version, or the torch version for torch.compile backends.",
        _field("key.compiler_version"),
    ),
    Column("library", _STRING, "Modelling library: transformers.", _field("key.library")),
    Column("library_version", _STRING, "Version of `library`.", _field("key.library_version")),
    Column("torch", _STRING, "PyTorch version.", _field("doc.stack.torch")),
    Column(
        "torch_neuronx",
        _STRING,
        "torch-neuronx version; null off Trainium.",
        _field("doc.stack.torch_neuronx"),
    ),
    # how it was run
    Column(
        "neuron_cores",
        _INT,
        "Cores the model was run on (NeuronCores on Trainium, processes elsewhere); for a "
        "too-large exclusion, the fewest cores sizing says would hold it (1 when none would).",
        _field("doc.cores"),
    ),
    Column(
        "parallelism",
        _STRING,
        "How the model was split over cores: none, tensor or expert.",
        _field("doc.parallelism"),  # a StrEnum is its value
    ),
    Column(
        "dtype",
        _STRING,
        "Weight and compute dtype (bfloat16, float16, float32).",
        _field("doc.dtype"),
    ),
    Column(
        "compile_backend",
        _STRING,
        "torch.compile backend as configured for the run.",
        _field("doc.compile_backend"),
    ),
    Column("max_new_tokens", _INT, "Tokens generated per prompt.", _field("doc.max_new_tokens")),
    Column(
        "parameters",
        _INT,
        "Total parameter count of the model as loaded (null where loading failed).",
        _field("doc.parameters"),
    ),
    # outcome
    Column(
        "result",
        _STRING,
        f"Outcome: {', '.join(r.value for r in Result)} (see Result states).",
        _field("doc.result"),  # a StrEnum is its value
    ),
    Column(
        "error_class",
        _STRING,
        "For ERROR: the stage that failed (see Error classes).",
        _field("doc.error_class"),  # a StrEnum is its value
    ),
    Column(
        "error_reason",
        _STRING,
        "For ERROR compile: why (see Compile failure reasons): the compiler failed, or the "
        "model's graph would not run compiled as a whole.",
        _field("doc.error_reason"),  # a StrEnum is its value
    ),
    Column(
        "error",
        _STRING,
        "For ERROR/TIMEOUT: the message (and traceback tail).",
        _field("doc.error"),
    ),
    Column("stage", _STRING, "Last stage of run.py reached.", _field("doc.stage")),
    Column(
        "exclusion_reason",
        _STRING,
        "For EXCLUDED: the reason code (see Exclusion reasons).",
        _field("record.exclusion_reason"),  # a StrEnum is its value
    ),
    # timings and memory
    Column(
        "wall_time_s",
        _FLOAT,
        "Seconds for load + compile + generate (the CPU reference pass excluded).",
        _field("doc.timings.wall_time_s"),
    ),
    Column(
        "compile_time_s",
        _FLOAT,
        "Seconds of compilation: first generate call minus the steady one.",
        _field("doc.timings.compile_s"),
    ),
    Column(
        "load_time_s",
        _FLOAT,
        "Seconds to load tokenizer/processor and weights.",
        _field("doc.timings.load_s"),
    ),
    Column(
        "first_generate_s",
        _FLOAT,
        "Seconds of the first generate call (includes compilation).",
        _field("doc.timings.first_generate_s"),
    ),
    Column(
        "steady_generate_s",
        _FLOAT,
        "Seconds of a second, identical generate call (compiled).",
        _field("doc.timings.steady_generate_s"),
    ),
    Column(
        "decode_tokens_per_s",
        _FLOAT,
        "Generated tokens (all prompts) per second of decoding, prefill excluded.",
        _field("doc.timings.decode_tokens_per_s"),
    ),
    Column(
        "peak_device_memory_bytes",
        _INT,
        "Peak device memory in bytes (allocator on neuron/cuda, the process on cpu).",
        _field("doc.memory.peak_device_memory_bytes"),
    ),
    Column(
        "host_peak_rss_bytes",
        _INT,
        "Peak resident memory of the host process in bytes.",
        _field("doc.memory.host_peak_rss_bytes"),
    ),
    # ---- Trainium path: memory source, LNC, compilation (run.py's stack / memory / compilation)
    Column(
        "device_memory_source",
        _STRING,
        "Which API gave peak_device_memory_bytes (e.g. torch.neuron.max_memory_allocated).",
        lambda s: s.doc.memory.device_memory_source,
    ),
    Column(
        "runtime_device_memory_bytes",
        _INT,
        "Neuron: device memory the runtime held after generating, less before it started "
        "(sysfs, every category; includes its own allocations the allocator peak misses).",
        lambda s: s.doc.memory.runtime_device_memory_bytes,
    ),
    Column(
        "lnc",
        _INT,
        "Logical NeuronCore size in effect on the neuron backend (1 or 2); null elsewhere.",
        lambda s: s.doc.stack.lnc,
    ),
    Column(
        "compiler_flags",
        _STRING,
        "NEURON_CC_FLAGS in effect on the neuron backend (its --auto-cast decides the float32 "
        "precision policy, column float32_precision); null when unset or off Neuron.",
        lambda s: s.doc.stack.compiler_flags,
    ),
    Column(
        "compiled_graphs",
        _INT,
        "Graphs compiled during the run (one per input shape and graph break).",
        lambda s: s.doc.compilation.graphs,
    ),
    Column(
        "graph_breaks",
        _INT,
        "Graph breaks torch.compile inserted in the model's forward.",
        lambda s: s.doc.compilation.graph_breaks,
    ),
    Column(
        "recompiles",
        _INT,
        "Times Dynamo compiled a code object again (a guard failed: a new shape or value); "
        "past its recompile limit the run is an ERROR compile, never a silent eager fallback.",
        lambda s: s.doc.compilation.recompiles,
    ),
    Column(
        "timed_call_graphs",
        _INT,
        "Graphs compiled during the timed (second) call: 0 when the first call compiled "
        "everything; more means it recompiled, and its timings include compiling.",
        lambda s: s.doc.compilation.timed_call_graphs,
    ),
    Column(
        "compile_cache_hit",
        _BOOL,
        "Every compiled graph came from the compile cache (compile_time_s is then mostly loading); "
        "null where no cache was consulted.",
        lambda s: s.doc.compilation.cache_hit,
    ),
    # ---- end of the Trainium path's columns
    # ---- compile cache (model_support/compile_cache): hits during the run, transfers around it
    Column(
        "compile_cache_hits",
        _INT,
        "Compiled graphs served by the compile cache during the run (TorchNeuron's NEFF cache "
        "on neuron, inductor's FX graph cache elsewhere).",
        lambda s: s.doc.compilation.cache_hits,
    ),
    Column(
        "compile_cache_misses",
        _INT,
        "Graphs compiled from scratch during the run (new compile cache entries).",
        lambda s: s.doc.compilation.cache_misses,
    ),
    Column(
        "compile_cache_target",
        _STRING,
        "Root URI of the compile cache pulled before and pushed after the run; null = none.",
        lambda s: s.doc.compile_cache.target if s.doc.compile_cache else None,
    ),
    Column(
        "compile_cache_prefix",
        _STRING,
        "The compiler prefix under that root: neuronxcc-<version> or inductor-torch-<version>.",
        lambda s: s.doc.compile_cache.prefix if s.doc.compile_cache else None,
    ),
    Column(
        "compile_cache_prefix_matched",
        _BOOL,
        "The pulled target held entries under that prefix (either spelling of neuronx-cc's "
        "version); false: it held none for this compiler, so every graph compiled cold.",
        lambda s: _cache_figure(s, "pull", "prefix_matched"),
    ),
    Column(
        "compile_cache_pulled_entries",
        _INT,
        "Complete, verified cache entries pulled before the run.",
        lambda s: _cache_figure(s, "pull", "entries"),
    ),
    Column(
        "compile_cache_pulled_bytes",
        _INT,
        "Bytes of the entries pulled before the run.",
        lambda s: _cache_figure(s, "pull", "bytes"),
    ),
    Column(
        "compile_cache_pull_s",
        _FLOAT,
        "Seconds the pull took (not part of wall_time_s).",
        lambda s: _cache_figure(s, "pull", "seconds"),
    ),
    Column(
        "compile_cache_pushed_entries",
        _INT,
        "New cache entries pushed after the run.",
        lambda s: _cache_figure(s, "push", "entries"),
    ),
    Column(
        "compile_cache_pushed_bytes",
        _INT,
        "Bytes of the entries pushed after the run.",
        lambda s: _cache_figure(s, "push", "bytes"),
    ),
    Column(
        "compile_cache_push_s",
        _FLOAT,
        "Seconds the push took (not part of wall_time_s).",
        lambda s: _cache_figure(s, "push", "seconds"),
    ),
    Column(
        "compile_cache_skipped",
        _INT,
        "Entries left out of the pull and push: incomplete locally, or corrupt/truncated in the target.",
        lambda s: _cache_skipped(s),
    ),
    Column(
        "compile_cache_error",
        _STRING,
        "Why a pull or push failed (the result is unaffected); null when both worked.",
        lambda s: _cache_error(s),
    ),
    # ---- end of the compile cache's columns
    # ---- cost (model_support/pricing.py turns core-seconds into money)
    Column(
        "held_s",
        _FLOAT,
        "Seconds the runner held its cores: run.py's start to its finish (reference pass "
        "included) plus the compile cache pull and push around it; 0 for EXCLUDED (nothing "
        "ran); null where the run recorded no times.",
        lambda s: _held_s(s),
    ),
    Column(
        "core_seconds",
        _FLOAT,
        "Cores x held_s: what the test used, compile included; a price per core-hour "
        "(docs/pricing.md) makes it a cost.",
        lambda s: _core_seconds(s),
    ),
    Column(
        "compile_share",
        _FLOAT,
        "compile_time_s / held_s: the share of the held time spent compiling (0..1).",
        lambda s: _compile_share(s),
    ),
    # ---- end of cost
    # verification
    Column(
        "verified_exact",
        _BOOL,
        "Every generated token equals the float32 reference's argmax.",
        _field("doc.verification.exact"),
    ),
    Column(
        "error_ratio",
        _FLOAT,
        "Median over positions of the device's logit error / the baseline's (worst prompt): the `median` check.",
        _field("doc.verification.error_ratio"),
    ),
    Column(
        "mismatches",
        _INT,
        "Generated tokens that differ from the reference argmax.",
        _field("doc.verification.mismatches"),
    ),
    Column(
        "near_ties",
        _INT,
        "Mismatches accepted as within the dtype's noise.",
        _field("doc.verification.near_ties"),
    ),
    Column(
        "bad_tokens",
        _INT,
        "Mismatches beyond the dtype's noise (any one FAILs the test).",
        _field("doc.verification.bad_tokens"),
    ),
    Column(
        "first_mismatch",
        _INT,
        "Index (over all prompts' generated tokens) of the first mismatch.",
        _field("doc.verification.first_mismatch"),
    ),
    # ---- verdict statistics: which check failed, and every check's worst ratio ----
    Column(
        "failed_checks",
        pa.list_(_STRING),
        "For FAIL: the checks that failed it (tokens, median, q90, peak, kl; see The verdict).",
        lambda s: [_enum_value(c) for c in s.doc.verification.failed_checks],
    ),
    Column(
        "q90_ratio",
        _FLOAT,
        "90th percentile over positions of the logit error / the baseline's (worst prompt): the `q90` check.",
        lambda s: s.doc.verification.q90_ratio,
    ),
    Column(
        "peak_ratio",
        _FLOAT,
        "Largest logit error over positions / the baseline's largest (worst prompt): the `peak` check.",
        lambda s: s.doc.verification.peak_ratio,
    ),
    Column(
        "kl_ratio",
        _FLOAT,
        "Mean whole-vocabulary KL divergence from the reference / the baseline's (worst prompt): the `kl` check.",
        lambda s: s.doc.verification.kl_ratio,
    ),
    Column(
        "router_ties",
        _INT,
        "Positions whose mixture-of-experts routing was nearly tied in the reference (either expert is correct there).",
        lambda s: s.doc.verification.router_ties,
    ),
    Column(
        "float32_precision",
        _STRING,
        "For float32 runs: the arithmetic the baseline reproduced (ieee, tf32 or bf16 matmul operands); null otherwise.",
        lambda s: _enum_value(s.doc.verification.float32_precision),
    ),
    Column(
        "first_divergence",
        _STRING,
        "For a FAIL: the first module, in execution order, whose compiled output diverges from the float32 reference on the reference's inputs (e.g. model.layers.1.mlp.down_proj); null when not searched or none diverges (see Where a FAIL starts).",
        lambda s: _first_divergence(s.doc.verification, "module"),
    ),
    Column(
        "first_divergence_phase",
        _STRING,
        "For a task that decodes: where that module was found: prefill (the whole sequence at once, or the prefill step as the run ran it) or decode (the decode step at which the FAIL first shows, first_divergence_step); null otherwise.",
        lambda s: _enum_value(_first_divergence(s.doc.verification, "phase")),
    ),
    Column(
        "first_divergence_step",
        _INT,
        "The generation step whose graph was searched: s for decode step s, 0 for the prefill step; null for the whole sequence at once.",
        lambda s: _first_divergence(s.doc.verification, "step"),
    ),
    Column(
        "first_divergence_kind",
        _STRING,
        "That module's class (LlamaMLP, Linear): what FAILs of a stack are grouped by across models.",
        lambda s: _first_divergence(s.doc.verification, "kind"),
    ),
    Column(
        "first_divergence_ratio",
        _FLOAT,
        "That module's median relative output error / the baseline's, on the same inputs.",
        lambda s: _first_divergence(s.doc.verification, "error_ratio"),
    ),
    # ---- end of verdict statistics ----
    Column(
        "verification_reason",
        _STRING,
        "The verdict's explanation in words.",
        _field("doc.verification.reason"),
    ),
    Column(
        "verification_json",
        _STRING,
        "The whole verification (thresholds, per-position figures) as JSON, to re-judge with other thresholds.",
        lambda s: _model_json(s.doc.verification),
    ),
    # what it produced
    Column(
        "text",
        _STRING,
        "Generated text for the first prompt.",
        lambda s: s.doc.text[0] if s.doc.text else None,
    ),
    Column(
        "texts",
        pa.list_(_STRING),
        "Generated text for every prompt, in prompt order.",
        _field("doc.text"),
    ),
    Column("prompts", pa.list_(_STRING), "The prompts, in order.", _field("doc.prompts")),
    # provenance
    Column(
        "instance_type",
        _STRING,
        "Machine type the test ran on (e.g. trn2.48xlarge), when known.",
        _field("doc.stack.instance_type"),
    ),
    Column(
        "device_name",
        _STRING,
        "Accelerator name reported by the backend, when known.",
        _field("doc.stack.device_name"),
    ),
    Column(
        "stack",
        _STRING,
        "JSON object of every recorded version (python, torch, transformers, torch_neuronx, neuronx_cc, ...). "
        '`"origin": "writer"` marks versions filled in by the process that stored an EXCLUDED record.',
        lambda s: _model_json(s.doc.stack),
    ),
    Column(
        "packages",
        pa.list_(_STRING),
        "Every installed distribution as name==version.",
        _field("doc.packages"),
    ),
    Column(
        "run_py",
        _STRING,
        "The exact run.py that ran (for EXCLUDED: the one that would have run). Save it and run it to reproduce.",
        _field("record.run_py"),
    ),
    Column(
        "run_id",
        _STRING,
        "Unique id of the run record (records/<run_id>.json in the store).",
        _field("record.run_id"),
    ),
    Column("source", _STRING, "Who ran the test: cli, operator, demo.", _field("record.source")),
    Column(
        "labels",
        _STRING,
        "The record's free labels (CR name, sweep name) as a JSON object.",
        lambda s: _json(s.record.labels) if s.record.labels else "{}",
    ),
    Column(
        "started_at", _TIMESTAMP, "When run.py started (UTC).", lambda s: _utc(s.doc.started_at)
    ),
    Column(
        "finished_at", _TIMESTAMP, "When run.py finished (UTC).", lambda s: _utc(s.doc.finished_at)
    ),
    Column(
        "recorded_at",
        _TIMESTAMP,
        "When the record was created (UTC).",
        lambda s: _utc(s.record.recorded_at),
    ),
)

_COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}

MATRIX_SCHEMA: pa.Schema = pa.schema([pa.field(c.name, c.type, nullable=True) for c in COLUMNS])
"""The one schema of every matrix file (so a directory of them reads as one table)."""

MATRIX_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS)

HISTORY_COLUMNS: tuple[str, ...] = (
    "model_id", "task", "compiler", "compiler_version", "library", "library_version",
    "revision", "resolved_revision", "result", "error_class", "exclusion_reason",
    "failed_checks", "neuron_cores", "lnc", "instance_type", "wall_time_s", "compile_time_s",
    "compile_cache_hit", "decode_tokens_per_s", "peak_device_memory_bytes", "error_ratio",
    "q90_ratio", "peak_ratio", "kl_ratio", "bad_tokens", "first_divergence",
    "first_divergence_kind", "first_divergence_phase", "first_divergence_step",
    "first_divergence_ratio", "held_s",
    "core_seconds", "compile_share", "run_id", "source", "started_at", "finished_at",
    "recorded_at",
)  # fmt: skip
"""The columns of the history (``history/runs.parquet`` in a store): every run, not only the
latest per stack, with what the History and Regressions views and commands read. The matrix's
own columns, so a history row says what the matrix row of the same record says; the long ones
(error messages, texts, run.py) stay in the matrix and the records, so the history of 100,000
runs stays a few MiB."""

HISTORY_SCHEMA: pa.Schema = pa.schema([MATRIX_SCHEMA.field(name) for name in HISTORY_COLUMNS])

MATRIX_ROW_GROUP_BYTES = 8 * 2**20
"""Target size of a matrix file's row groups (uncompressed). Rows are sorted by model id, so a
reader looking for one model (the viewer's details) decodes only the row groups whose model_id
statistics can hold it: one group of a few MiB instead of the whole file."""


def matrix_row_group_rows(table: pa.Table) -> int:
    """Rows per row group for ``table``: about MATRIX_ROW_GROUP_BYTES each (64 rows at least)."""
    if table.num_rows == 0:
        return 1
    row_bytes = max(table.nbytes // table.num_rows, 1)
    return max(64, min(table.num_rows, MATRIX_ROW_GROUP_BYTES // row_bytes))


MATRIX_ZSTD_COLUMNS: tuple[str, ...] = ("run_py", "verification_json")
"""The matrix columns written with zstd; every other column is snappy. Every row holds its whole
run.py (~160 KB: the same harness text but for the config block), and snappy's 64 KB window
never sees the previous row's copy: 53-87 KB per row. zstd's window (2 MiB at level 3) with data
pages as large as a row group sees the rows before it in the page, so a repeated run.py costs
under 1 KB; the verification JSON (per-position figures, unique to each row) takes half
snappy's bytes. The columns the viewer's lists read stay snappy, cheaper to decode than zstd
(zstd everywhere read them 1.1-1.4x slower), so the list and triage reads are as fast as
before run.py was compressed across rows (benchmarks/matrix_size.py,
benchmarks/viewer_scale.py --compare-codecs). Both are standard Parquet codecs, chosen per
column chunk: pandas, pyarrow, DuckDB and datasets.load_dataset read such files."""

MATRIX_ZSTD_LEVEL = 3
"""zstd's level for MATRIX_ZSTD_COLUMNS (zstd's default). Over 1,000 realistic rows level 1 took
4.63 KB a row against 4.68 and 0.23 s of CPU to write against 0.28, but its window (512 KiB for
inputs this large, against 2 MiB) holds only three of today's 158 KB run.py copies, and a
run.py it cannot see back to costs its whole compressed size again; level 6 took 4.35 KB a row
for twice the write time."""


def matrix_write_options(schema: pa.Schema) -> dict[str, Any]:
    """pyarrow's Parquet writer options for a matrix table of ``schema``: zstd for
    MATRIX_ZSTD_COLUMNS, snappy for the rest, data pages as large as a row group.

    Per-column codecs are keyed by Parquet leaf paths (a list column ``packages`` is
    ``packages.list.element``), and a column the mapping leaves out would be written
    uncompressed, so the paths are taken from the schema pyarrow writes for ``schema``.
    """
    paths = _parquet_leaf_paths(schema)
    return {
        "compression": {
            path: "zstd" if path in MATRIX_ZSTD_COLUMNS else "snappy" for path in paths
        },
        "compression_level": {
            path: MATRIX_ZSTD_LEVEL for path in paths if path in MATRIX_ZSTD_COLUMNS
        },
        "data_page_size": MATRIX_ROW_GROUP_BYTES,
    }


def _parquet_leaf_paths(schema: pa.Schema) -> list[str]:
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_metadata(schema, buffer)
    buffer.seek(0)
    parquet_schema = pq.read_metadata(buffer).schema
    return [parquet_schema.column(i).path for i in range(len(parquet_schema))]


def write_matrix(table: pa.Table, where: Any) -> None:
    """Write a matrix table (a file path or a binary file object) as every matrix file is
    written: row groups of about MATRIX_ROW_GROUP_BYTES, matrix_write_options."""
    import pyarrow.parquet as pq

    pq.write_table(
        table,
        where,
        row_group_size=matrix_row_group_rows(table),
        **matrix_write_options(table.schema),
    )


# ---------------------------------------------------------------------------------------------
# Placement


def _is_neuron(doc: ResultDocument) -> bool:
    if doc.backend == Backend.NEURON.value or doc.compile_backend == "neuron":
        return True
    # Planned but not run (EXCLUDED) documents may name no backend: with neither a backend nor a
    # compile backend given, run.py picks neuron wherever neuronx-cc is installed.
    unset = doc.backend in (None, Backend.AUTO.value) and doc.compile_backend is None
    return unset and doc.stack.neuronx_cc is not None


def matrix_key(record: RunRecord) -> MatrixKey:
    """The (compiler, compiler version, library, library version) file a record belongs to."""
    doc = record.document
    stack = doc.stack
    if _is_neuron(doc):
        return MatrixKey(NEURON_COMPILER, stack.neuronx_cc, LIBRARY, stack.transformers)
    if doc.compile_backend:
        compiler: str | None = doc.compile_backend
    elif doc.backend in (Backend.CPU.value, Backend.CUDA.value) or stack.torch is not None:
        # run.py's default off Trainium; a stack with torch but no neuronx-cc is off Trainium.
        compiler = DEFAULT_COMPILE_BACKEND
    else:
        compiler = None  # nothing recorded says where it ran (e.g. an infrastructure ERROR)
    return MatrixKey(compiler, stack.torch, LIBRARY, stack.transformers)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _part(value: str | None) -> str:
    if not value:
        return UNKNOWN
    return _UNSAFE.sub("_", value).strip("._") or UNKNOWN


def matrix_file_stem(key: MatrixKey, disambiguate: bool = False) -> str:
    """Flat, path-safe file stem, e.g. ``neuronx-cc-2.28.7631.0__transformers-5.24.0``.

    Characters outside ``[A-Za-z0-9._-]`` become ``_``. When that changed anything, or when
    ``disambiguate`` is set (the store sets it when two keys would share a name), a short hash of
    the exact key is appended so different keys never share a file.
    """
    compiler = f"{_part(key.compiler)}-{_part(key.compiler_version)}"
    library = f"{_part(key.library)}-{_part(key.library_version)}"
    stem = f"{compiler[:100]}__{library[:100]}"
    exact = (
        f"{key.compiler or UNKNOWN}-{key.compiler_version or UNKNOWN}"
        f"__{key.library}-{key.library_version or UNKNOWN}"
    )
    if disambiguate or stem != exact:
        digest = hashlib.sha256(repr(key._sort_tuple()).encode()).hexdigest()[:8]
        stem = f"{stem}__{digest}"
    return stem


# ---------------------------------------------------------------------------------------------
# Rows


def record_to_row(record: RunRecord) -> dict[str, Any]:
    """One matrix row (a dict keyed by :data:`MATRIX_COLUMNS`) from a run record."""
    source = _Source(record=record, doc=record.document, key=matrix_key(record))
    return {column.name: column.get(source) for column in COLUMNS}


def recency(record: RunRecord) -> tuple[datetime, str]:
    """Sort key of "latest": finished_at (recorded_at when the run never finished), then run_id."""
    when = _utc(record.document.finished_at) or _utc(record.recorded_at)
    assert when is not None  # recorded_at always has a value
    return (when, record.run_id)


MATRIX_ORDER = [("model_id", "ascending"), ("task", "ascending"), ("run_id", "ascending")]
"""Row order of every matrix file: the same records always give the same bytes."""


def records_to_table(
    records: Sequence[RunRecord],
    keys: Sequence[MatrixKey],
    schema: pa.Schema = MATRIX_SCHEMA,
) -> pa.Table:
    """Records (placed at ``keys``) as one Arrow table in ``schema`` (the matrix's, or a
    subset of its columns such as :data:`HISTORY_SCHEMA`), in :data:`MATRIX_ORDER`: the rows
    :func:`record_to_row` gives, built a column at a time."""
    sources = sorted(
        (_Source(record=r, doc=r.document, key=k) for r, k in zip(records, keys, strict=True)),
        key=lambda s: (s.record.model_id, s.doc.task, s.record.run_id),  # = MATRIX_ORDER
    )
    chosen = [_COLUMN_BY_NAME[name] for name in schema.names]
    getters = [c.get for c in chosen]
    # Row by row, then transposed: each record's objects are read while they are in the CPU's
    # cache, twice as fast at 100,000 records as reading one column through all of them.
    rows = [[get(source) for get in getters] for source in sources]
    columns = zip(*rows, strict=True) if rows else ([] for _ in chosen)
    arrays = [
        pa.array(list(values), type=c.type) for values, c in zip(columns, chosen, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


_VERSION_FIELDS = ("python", "torch", "transformers", "torch_neuronx", "neuronx_cc")


def has_versions(stack: Stack) -> bool:
    """Whether a recorded stack says anything about the versions that place it in the matrix."""
    return any(getattr(stack, name) is not None for name in _VERSION_FIELDS)


def writer_stack() -> Stack:
    """Versions known to this process: the stack an EXCLUDED record (nothing ran) is filed under."""

    def version(distribution: str) -> str | None:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None  # not installed here: the column stays null, which is the truth

    return Stack.model_validate(
        {
            "python": platform.python_version(),
            "torch": version("torch"),
            "transformers": version("transformers"),
            "torch_neuronx": version("torch-neuronx"),
            "neuronx_cc": version("neuronx-cc"),
            "origin": "writer",
        }
    )


# ---------------------------------------------------------------------------------------------
# Dataset card


@dataclass(frozen=True)
class CardFile:
    """One matrix file as the dataset card lists it."""

    key: MatrixKey
    path: str  # relative to the dataset root, e.g. data/<stem>.parquet
    results: dict[str, int]  # result state -> rows


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def _type_name(data_type: pa.DataType) -> str:
    return str(data_type)


def column_table() -> str:
    """The Markdown table of the matrix's columns (name, type, meaning), from :data:`COLUMNS`."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{c.name}` | {_type_name(c.type)} | {_cell(c.description)} |" for c in COLUMNS]
    return "\n".join(lines)


def verdict_section() -> str:
    """The dataset card's account of the verdict: guarantees, blind spots, checks, precision."""
    bounds = VerificationConfig()
    bound_of = {
        "median": bounds.max_error_ratio,
        "q90": bounds.max_q90_ratio,
        "peak": bounds.max_peak_ratio,
        "kl": bounds.max_kl_ratio,
    }
    checks = "\n".join(
        f"- `{check.value}`"
        + (f" (default bound {bound_of[check.value]:g}x)" if check.value in bound_of else "")
        + f": {meaning}"
        for check, meaning in VERDICT_CHECK_MEANINGS.items()
    )
    defaults = ", ".join(
        f"{backend.value} `{precision.value}`"
        for backend, precision in FLOAT32_PRECISION_DEFAULTS.items()
    )
    precisions = "\n".join(
        f"- `{precision.value}`: {meaning}"
        for precision, meaning in FLOAT32_PRECISION_MEANINGS.items()
        if precision is not Float32Precision.AUTO
    )
    guarantees = "\n".join(f"- {text}" for text in PASS_GUARANTEES)
    blind_spots = "\n".join(f"- {text}" for text in PASS_BLIND_SPOTS)
    return f"""## The verdict: what a PASS guarantees

run.py keeps the device's logits at every generated position, then scores the prompt and the
device's tokens teacher forced on CPU twice: in float32 (the reference) and in the arithmetic a
correct run may use (the baseline: the run dtype; for float32 runs, the float32 precision
below). Every check compares the device with the reference relative to the baseline; the
figures are in the columns above and whole in `verification_json`, with the bounds each row was
judged with. The method and its sources: `docs/verification.md` in the model-support repository.

A PASS guarantees, for the tested prompts:

{guarantees}

A PASS cannot see:

{blind_spots}

A FAIL lists the checks that failed it in `failed_checks`:

{checks}

Float32 runs are judged against the arithmetic their backend may use (`float32_precision`):
{defaults} by default; the test's `verification.float32_precision` overrides it.

{precisions}

{task_verdicts_section()}

{first_divergence_section()}
"""


def first_divergence_section() -> str:
    """Where a FAIL starts (the localization), for the dataset card."""
    statuses = "\n".join(
        f"- `{status.value}`: {meaning}" for status, meaning in LOCALIZATION_STATUS_MEANINGS.items()
    )
    phases = "\n".join(
        f"- `{phase.value}`: {meaning}" for phase, meaning in DIVERGENCE_PHASE_MEANINGS.items()
    )
    return f"""### Where a FAIL starts

On a FAIL, run.py searches the first module whose compiled output diverges: level by level
from the model's children down, the modules of a level are compiled together with the run's
compile backend and each is called on the float32 reference's inputs for it (teacher forced),
its output compared with the reference's relative to the baseline's on the same inputs, by the
verdict's bounds on the median, 90th percentile and maximum over positions. For a task that
decodes, the search runs where the FAIL first shows: at a decode step, the modules are compiled
with that step's shapes (one token per sequence against the static cache the earlier steps
filled, replayed with the device's tokens); at the first token, on the whole sequence at once.
The deepest first diverging module is `first_divergence` (its class `first_divergence_kind`,
where it was found `first_divergence_phase` and `first_divergence_step`); `verification_json`
holds the whole search (`first_divergence`: the enclosing modules, the next two diverging
modules, the time and memory it took). A sharded run is searched on every rank at once, each
on its shard of the reference's inputs: `ranks` names the ranks on which the module diverges.
When the module is a fused experts module, each expert is measured alone: `expert` names the
one expert that diverges, when only one does. The search's `status`:

{statuses}

Where it searched (`first_divergence_phase`):

{phases}
"""


def task_verdicts_section() -> str:
    """How the tasks beyond text generation are verified, for the dataset card."""
    methods = "\n".join(
        f"- `{task.value}`: {TASK_VERDICT_DESCRIPTIONS[method]}"
        for task, method in TASK_METHODS.items()
    )
    return f"""### Other tasks

The same method judges every task: the device's output against a float32 CPU reference,
relative to the same pass in the run's arithmetic on CPU (the baseline). `verification_json`
names what was compared (`method`) and holds each measure's median and maximum over items
(`metrics`) and every item's figures (`items`); `error_ratio` and `peak_ratio` are the first
measure's. A classifier's items also name each input's predicted label and the reference's
(`label`, `reference_label`); a text-to-image run's `images` holds, per prompt, the picture its
final latents make and the reference's (base64 PNGs of at most 128 pixels a side, decoded by the
reference's VAE; shown, never judged).

{methods}
"""


TASK_VERDICT_DESCRIPTIONS: dict[str, str] = {
    "tokens": (
        "32 greedy tokens, scored teacher forced (an encoder-decoder with its encoder inputs), "
        "judged by the text verdict's checks."
    ),
    "embeddings": (
        "per sentence the angle to the reference embedding (`cosine`) and the error of its "
        "length (`norm`); with each sentence as the query, the similarity ranking of the "
        "others must keep the reference's order beyond near-ties (`ranking`)."
    ),
    "classification": (
        "per input the log-probability error over the top classes (`median`, `peak`), and the "
        "top class must be the reference's unless the reference's margin is within the "
        "baseline's noise (`top1`)."
    ),
    "latents": (
        "a few denoising steps from a fixed seed: per step the denoiser's prediction against "
        "the reference denoiser fed the device's own inputs (`denoiser`, teacher forced), and "
        "the latents after the step (`latents`)."
    ),
}


def render_card(files: list[CardFile]) -> str:
    """The dataset card (README.md): HF YAML front matter listing every file, then the docs."""
    files = sorted(files, key=lambda f: f.path)
    configs: list[dict[str, Any]] = [
        {
            "config_name": "default",
            "data_files": [{"split": "train", "path": "data/*.parquet"}],
            "default": True,
        }
    ]
    configs += [
        {
            "config_name": f.path.rsplit("/", 1)[-1].removesuffix(".parquet"),
            "data_files": [{"split": "train", "path": f.path}],
        }
        for f in files
    ]
    card_data = DatasetCardData(
        pretty_name="model-support: Hugging Face models on AWS Trainium",
        license="apache-2.0",
        tags=["trainium", "neuron", "torch-compile", "compatibility"],
        configs=configs,
    )
    states = list(Result)
    summary = [
        "| file | compiler | compiler version | library | library version | rows | "
        + " | ".join(states)
        + " |"
    ]
    summary.append("| --- " * (6 + len(states)) + "|")
    for f in files:
        counts = " | ".join(str(f.results.get(state.value, 0)) for state in states)
        summary.append(
            f"| `{f.path}` | {_cell(f.key.compiler or UNKNOWN)} | {_cell(f.key.compiler_version or UNKNOWN)} | "
            f"{f.key.library} | {_cell(f.key.library_version or UNKNOWN)} | {sum(f.results.values())} | {counts} |"
        )
    if not files:
        summary.append("| (no results yet) |" + " |" * (5 + len(states)))

    results = "\n".join(
        f"- **{state.value}**: {meaning}" for state, meaning in RESULT_MEANINGS.items()
    )
    errors = "\n".join(
        f"- `{cls.value}`: {meaning}" for cls, meaning in ERROR_CLASS_MEANINGS.items()
    )
    compile_reasons = "\n".join(
        f"- `{reason.value}`: {meaning}" for reason, meaning in COMPILE_FAILURE_MEANINGS.items()
    )
    exclusions = "\n".join(
        f"- `{reason.value}`: {meaning}" for reason, meaning in EXCLUSION_MEANINGS.items()
    )
    body = f"""
# model-support: does this model run unmodified on AWS Trainium?

Each row is the latest test of one Hugging Face Hub model (for one task) with one compiler
version and one transformers version: whether it ran unmodified through TorchNeuron
(`torch.compile(backend="neuron")`), on how many cores, how fast, with how much memory, and the
exact `run.py` that reproduces it. Rows from other torch.compile backends (for example `inductor`
on CPU) use the same format.

This directory is a materialized view: the source of truth is the immutable run records under
`records/`, and the files under `data/` (and this card) are regenerated from them; `index/` says
which records they hold, so a new record rewrites only the file it belongs to. `data/` holds
the latest run of each model per stack; `history/runs.parquet` (in the results store) holds
every run, re-runs on the same stack included, with a subset of these columns.

## Files

One Parquet file per (compiler version, library version) pair; all share one schema.

{chr(10).join(summary)}

## Loading

```python
import pandas as pd

matrix = pd.read_parquet("data")  # or a single file: pd.read_parquet("data/<file>.parquet")
matrix[lambda d: d.model_id == "Qwen/Qwen3-0.6B"][
    ["neuronx_cc", "library", "library_version", "neuron_cores", "result"]
]
```

With the `datasets` library: `load_dataset("<repo>", "<config>")`, where the config is one
file's name (without `.parquet`) or `default` for all of them.

## Result states

{results}

{verdict_section()}
## Error classes (`error_class`, for ERROR)

{errors}

## Compile failure reasons (`error_reason`, for ERROR compile)

{compile_reasons}

## Exclusion reasons (`exclusion_reason`, for EXCLUDED)

{exclusions}

## Columns

{column_table()}
"""
    return f"---\n{card_data.to_yaml()}\n---\n{body}"
