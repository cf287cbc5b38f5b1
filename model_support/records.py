"""Typed records: the result document run.py writes and the immutable RunRecord stored from it.

The builders at the end (:func:`record_from_document`, :func:`failure_document`) are the one way
a record is made, by the CLI and the operator alike; a record holds the run.py it was given
(rendering one is :mod:`model_support.script`'s, and a test excluded before it ran is recorded by
:func:`model_support.runpath.excluded_record`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from model_support.config import RunConfig
from model_support.models import readable_model_id
from model_support.vocabulary import (
    CompileFailure,
    DivergencePhase,
    ErrorClass,
    ExclusionReason,
    Float32Precision,
    LocalizationStatus,
    Parallelism,
    Result,
    VerdictCheck,
)

RESULT_MARKER = "MODEL_SUPPORT_RESULT "
"""Prefix of the last stdout line of run.py: the result document as one line of JSON."""

PROGRESS_MARKER = "MODEL_SUPPORT_STAGE "
"""Prefix of run.py's progress lines (one JSON object each: stage, status, seconds)."""


_FORBID = ConfigDict(extra="forbid")
"""Every field of run.py's document is declared here: an unknown one is a bug (or a pod printing
more than it was asked to), never data to keep silently. tests/test_records.py holds run.py's
document and these classes to the same fields."""

PACKAGE_PIN = r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
"""One entry of a document's ``packages``: an installed distribution as ``name==version``."""


class Timings(BaseModel):
    """Seconds per stage of a run; None where the stage did not run."""

    model_config = _FORBID

    load_s: float | None = None
    first_generate_s: float | None = Field(
        None,
        description="First call of the compiled model (generate; a forward or a pipeline call for tasks that do not generate): includes compilation.",
    )
    steady_generate_s: float | None = Field(
        None, description="A second, identical call (compiled)."
    )
    prefill_s: float | None = Field(
        None,
        description="Seconds to the first token of the timed generation (the prefill, compiled).",
    )
    compile_s: float | None = Field(None, description="first_generate_s - steady_generate_s.")
    decode_tokens_per_s: float | None = Field(
        None,
        description="Generated tokens (all prompts) per second of decoding, excluding prefill.",
    )
    reference_s: float | None = Field(
        None, description="CPU reference pass for the verdict (not part of the test's wall time)."
    )
    wall_time_s: float | None = Field(
        None, description="Load + compile + generate; excludes the reference pass."
    )
    total_s: float | None = Field(None, description="Whole run.py, reference included.")


class Memory(BaseModel):
    """Peak memory. Device figures come from the allocator (cuda/neuron) or the process (cpu)."""

    model_config = _FORBID

    peak_device_memory_bytes: int | None = None
    device_memory_source: str | None = Field(
        None, description="Which API gave peak_device_memory_bytes."
    )
    host_peak_rss_bytes: int | None = None
    host_rss_anon_bytes: int | None = None
    host_rss_file_bytes: int | None = None
    runtime_device_memory_bytes: int | None = Field(
        None,
        description=(
            "Neuron only: device memory the runtime and driver held after generating, less what "
            "they held before the runtime started (sysfs device_mem, every category: model code, "
            "scratchpad, runtime memory, DMA rings, tensors...). Covers the whole host's cores."
        ),
    )
    runtime_device_memory_categories: dict[str, int] | None = Field(
        None, description="runtime_device_memory_bytes per sysfs category that grew."
    )


class Compilation(BaseModel):
    """What compiling took during the run (run.py's compile and generate stages).

    On neuron a graph counts once TorchNeuron compiled it to a NEFF and a cache miss is a new
    persistent NEFF cache entry; elsewhere dynamo counts graphs and inductor's FX graph cache
    counts hits. With ``cache_hit`` true, ``timings.compile_s`` is mostly loading from the cache.
    """

    graphs: int | None = Field(None, description="Graphs compiled (one per shape and graph break).")
    graph_breaks: int | None = Field(None, description="Graph breaks dynamo inserted.")
    cache_hits: int | None = Field(None, description="Compiled graphs served by the cache.")
    cache_misses: int | None = Field(None, description="Graphs compiled from scratch.")
    cache_hit: bool | None = Field(
        None,
        description="Every compiled graph came from the cache; null where no cache was consulted.",
    )
    cache: str | None = Field(None, description="Which cache: neff or inductor-fx-graph.")
    source: str | None = Field(None, description="Which API counted the graphs.")
    cache_per_graph: bool | None = Field(
        None,
        description="Hits and misses were counted per compiled graph (what the cache did from "
        "its compile to the end of its first call), not from process-wide counters.",
    )
    cache_entries_outside_graphs: int | None = Field(
        None,
        description="NEFF cache entries written outside every compiled graph (eager ops inside "
        "generate()); not misses. Null off neuron.",
    )
    recompiles: int | None = Field(
        None,
        description="Times Dynamo compiled a code object again because a guard failed (a new "
        "shape or value); past its recompile limit the run is an ERROR compile, never an eager "
        "fallback. Null where not read.",
    )
    recompile_reasons: list[str] = Field(
        default_factory=list, description="The first distinct guard failures Dynamo gave."
    )
    timed_call_graphs: int | None = Field(
        None,
        description="Graphs compiled during the timed (second) call: 0 when the first call "
        "compiled everything; more means the timed figures include compiling (recompiles).",
    )
    graph_break_reasons: list[str] = Field(
        default_factory=list,
        description="The first distinct reasons Dynamo gave for the graph breaks it inserted.",
    )
    whole_graph: bool | None = Field(
        None,
        description="A graph break was an error (the neuron path: TorchNeuron recommends "
        "fullgraph), so a run that ended has one compiled graph per call.",
    )
    fallback_execution: str | None = Field(
        None,
        description="TorchNeuron's fallback setting in effect (TORCH_NEURONX_DISABLE_FALLBACK_"
        "EXECUTION, pinned by run.py on neuron); null off neuron.",
    )
    fallback_ops: list[str] = Field(
        default_factory=list,
        description="What TorchNeuron reported running on the CPU or eagerly, and where "
        "(inside a compiled graph: an ERROR compile cpu-fallback; between graphs: recorded).",
    )
    compiler_args: list[str] = Field(
        default_factory=list,
        description="The neuronx-cc command lines TorchNeuron ran (from its debug folder), "
        "paths left out; empty where none were found.",
    )


class PromptStatistics(BaseModel):
    """One prompt's logit statistics: the device's, the baseline's same one, and their ratio.

    median / q90 / peak: the median, 90th percentile and maximum over positions of the logit
    error (nats); kl: the mean over positions of the whole-vocabulary KL divergence from the
    reference (nats). q90, peak and kl leave out router-tie positions.
    """

    model_config = ConfigDict(extra="allow")

    prompt: int
    router_ties: int = 0
    median_device: float | None = None
    median_baseline: float | None = None
    median_ratio: float | None = None
    q90_device: float | None = None
    q90_baseline: float | None = None
    q90_ratio: float | None = None
    peak_device: float | None = None
    peak_baseline: float | None = None
    peak_ratio: float | None = None
    kl_device: float | None = None
    kl_baseline: float | None = None
    kl_ratio: float | None = None


class MetricStatistics(BaseModel):
    """One error measure of a task's verdict over its items (inputs, or prompts at steps).

    The median and the maximum over items of the device's error, each with the baseline's same
    statistic, their ratio and its bound (embeddings, classification, latents).
    """

    model_config = _FORBID

    check: str = Field(description="cosine, norm, logits or latents: what is measured per item.")
    what: str | None = Field(None, description="The measure in words, with its unit.")
    items: int | None = None
    median_device: float | None = None
    median_baseline: float | None = None
    median_ratio: float | None = None
    median_bound: float | None = None
    peak_device: float | None = None
    peak_baseline: float | None = None
    peak_ratio: float | None = None
    peak_bound: float | None = None


class CacheTransferFigures(BaseModel):
    """One compile cache transfer: the pull before run.py, or the push after it.

    Filled by the harness around run.py (``model-support run --compile-cache``, the runner pod),
    never by run.py. A failed transfer keeps ``error``; the test's result is never changed by it.
    """

    model_config = _FORBID

    prefix_matched: bool | None = Field(
        None,
        description="Pull: the target held entries under this compiler's prefix (either "
        "spelling of neuronx-cc's version); false: it held none, so the run compiled cold.",
    )
    entries: int = Field(0, description="Complete cache entries transferred.")
    bytes: int = Field(0, description="Bytes of those entries.")
    seconds: float | None = Field(None, description="Wall time of the transfer.")
    skipped: int = Field(
        0,
        description="Entries left out: incomplete locally (push) or corrupt/truncated in the "
        "target (pull); each one is named in the transfer's report.",
    )
    unverified: int = Field(
        0,
        description="Pulled entries that carry no content hash (a plain mirror such as the "
        "public NEFF bucket): accepted on their layout and size alone.",
    )
    error: str | None = Field(
        None, description="Why the transfer failed (class: message); null when it did not."
    )


class CompileCacheFigures(BaseModel):
    """What the compile cache did for one run: where it lives, what was pulled and pushed."""

    model_config = _FORBID

    target: str = Field(..., description="The cache's root URI (without the compiler prefix).")
    prefix: str = Field(
        ...,
        description="The compiler prefix derived from the installed stack: "
        "neuronxcc-<version> or inductor-torch-<version>.",
    )
    pull: CacheTransferFigures | None = Field(None, description="The pull before run.py.")
    push: CacheTransferFigures | None = Field(None, description="The push after run.py.")


class ModuleDivergence(BaseModel):
    """One module's compiled output against the float32 reference, given the reference's inputs."""

    model_config = _FORBID

    module: str = Field(..., description="The module's name in the model (model.layers.1.mlp).")
    kind: str = Field(..., description="Its class (LlamaMLP, Linear).")
    error_ratio: float = Field(
        ...,
        description="Median over positions of the output's relative error / the baseline's.",
    )
    q90_ratio: float = Field(..., description="The same for the 90th percentile over positions.")
    peak_ratio: float = Field(..., description="The same for the largest error over positions.")
    device_error: float = Field(..., description="The device's median relative error.")
    baseline_error: float = Field(..., description="The baseline's median relative error.")
    failed_checks: list[str] = Field(
        default_factory=list, description="The bounds it beats: median, q90, peak."
    )
    rank: int | None = Field(
        None,
        description="A sharded run: the rank whose figures these are (the first on which it diverges, else 0).",
    )
    ranks: list[int] | None = Field(
        None, description="A sharded run: every rank on which the module's output diverges."
    )


def divergence_where(phase: object, step: float | None) -> str | None:
    """Where a search found its module, in words: "from decode step 18", "from the prefill";
    None where no phase is known (a family that does not decode, an older record). run.py's
    divergence_where says it alike."""
    if not isinstance(phase, str):  # None, or a missing cell of a table (NaN, pd.NA)
        return None
    if phase == DivergencePhase.DECODE.value:
        # A table's integer column with missing cells may hold the step as a float.
        return "from a decode step" if step is None else f"from decode step {int(step)}"
    return "from the prefill"


class FirstDivergence(BaseModel):
    """Where a FAIL starts: the first module in execution order whose output diverges."""

    model_config = _FORBID

    status: LocalizationStatus
    module: str | None = Field(None, description="The first diverging module (deepest level).")
    kind: str | None = None
    error_ratio: float | None = None
    q90_ratio: float | None = None
    peak_ratio: float | None = None
    device_error: float | None = None
    baseline_error: float | None = None
    failed_checks: list[str] = Field(default_factory=list)
    path: list[ModuleDivergence] = Field(
        default_factory=list, description="The enclosing modules that diverged, outermost first."
    )
    candidates: list[ModuleDivergence] = Field(
        default_factory=list,
        description="The next diverging modules of the same level, in execution order (at most two).",
    )
    expert: int | None = Field(
        None,
        description="For an experts module: the one expert whose output diverges alone, when only one does.",
    )
    diverging_experts: list[int] | None = Field(
        None,
        description="For an experts module: the experts whose outputs diverge, each measured alone (every token routed to it).",
    )
    rank: int | None = Field(
        None,
        description="The worker whose figures these are: in a sharded run the first rank on which the module diverges (0 when none does), else 0.",
    )
    ranks: list[int] | None = Field(
        None,
        description="A sharded run: every rank on which the first diverging module's output diverges (each rank runs its shard on its shard of the reference's inputs).",
    )
    phase: DivergencePhase | None = Field(
        None,
        description="For a task that decodes: where the modules were compiled and called: prefill (the whole sequence at once, or the prefill step as the run ran it) or decode (one decode step, one token per sequence against the filled static cache); null for the other families.",
    )
    step: int | None = Field(
        None,
        ge=0,
        description="The generation step searched, as the run ran it: s >= 1 for decode step s (where the FAIL first shows, or began just before it within the bounds), 0 for the prefill step; null for the whole sequence at once.",
    )
    reason: str | None = Field(None, description="Why the search stopped short, when it did.")
    error_class: ErrorClass | None = Field(
        None, description="The class of the error that stopped the search (status failed)."
    )
    seconds: float | None = Field(None, description="What the search took.")
    host_peak_rss_increase_bytes: int | None = Field(
        None, description="How much the search raised the process's peak resident memory."
    )
    device_peak_increase_bytes: int | None = Field(
        None,
        description="How much the search raised the device's peak memory (as the run's peak is read; rank 0's device in a sharded run; on cpu the process itself).",
    )

    def where(self) -> str | None:
        """Where the module was found, in words (see :func:`divergence_where`)."""
        return divergence_where(self.phase, self.step)

    def summary(self) -> str:
        """One line: the first diverging module, where, and its ratio, or why none is named."""
        cost = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        if self.module is None:
            line = f"no first diverging module ({self.status.value})"
        else:
            ratio = "?" if self.error_ratio is None else f"{self.error_ratio:.3g}"
            where = self.where()
            line = (
                f"first diverging module{', ' + where if where else ''}: {self.module} "
                f"({self.kind}), error ratio {ratio}"
            )
            if self.ranks:
                line += f", on rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
            if self.expert is not None:
                line += f", expert {self.expert} alone"
            elif self.diverging_experts:
                line += f", experts {', '.join(map(str, self.diverging_experts))}"
            if self.status is LocalizationStatus.INCOMPLETE:
                line += ", search incomplete"
        return line + (f": {self.reason}" if self.reason else "") + cost


class Pictures(BaseModel):
    """What a text-to-image run drew: each prompt's final latents decoded by a float32 CPU copy
    of the reference pipeline's VAE into a small PNG, the device's and the float32 reference's
    (shown beside each other; never judged, so they cannot change the result)."""

    model_config = _FORBID

    format: str = Field("png", description="The pictures' image format.")
    max_side: int = Field(..., description="The longest side of a picture, in pixels (at most).")
    device: list[str] = Field(
        default_factory=list, description="Per prompt: the device's picture, base64."
    )
    reference: list[str] = Field(
        default_factory=list, description="Per prompt: the float32 reference's picture, base64."
    )
    error: str | None = Field(
        None, description="Why no pictures were drawn (e.g. latents that are not an image's)."
    )


class Verification(BaseModel):
    """The verdict's figures, kept whole so thresholds can be re-judged from the dataset."""

    model_config = _FORBID

    passed: bool | None = None
    exact: bool | None = Field(None, description="Every token equals the float32 reference argmax.")
    failed_checks: list[VerdictCheck] = Field(
        default_factory=list,
        description="The checks that failed the run (tokens, median, q90, peak, kl); empty for a PASS.",
    )
    error_ratio: float | None = Field(
        None,
        description="Median over positions of the device's logit error / the baseline's (worst prompt).",
    )
    device_error: float | None = Field(
        None, description="The device's median deviation (nats), worst prompt."
    )
    baseline_error: float | None = Field(
        None, description="The baseline's median deviation (nats), same prompt."
    )
    q90_ratio: float | None = Field(
        None,
        description="90th percentile over positions of the logit error / the baseline's (worst prompt).",
    )
    peak_ratio: float | None = Field(
        None,
        description="Largest logit error over positions / the baseline's largest (worst prompt).",
    )
    kl_ratio: float | None = Field(
        None,
        description="Mean whole-vocabulary KL divergence from the reference / the baseline's (worst prompt).",
    )
    rmse_ratio: float | None = Field(
        None,
        description="Whole-vocabulary log-probability RMSE ratio device / baseline (recorded, not judged).",
    )
    mismatches: int | None = Field(
        None,
        description="Tokens that differ from the reference argmax (classification: inputs whose top-1 class differs; embeddings: pairs ranked in the other order).",
    )
    near_ties: int | None = Field(
        None, description="Mismatches accepted as within the dtype's noise."
    )
    bad_tokens: int | None = Field(
        None, description="Mismatches beyond the dtype's noise (each one FAILs)."
    )
    router_ties: int | None = Field(
        None,
        description="Positions whose mixture-of-experts routing was nearly tied in the reference (left out of q90, peak and kl).",
    )
    router_tie_tokens: int | None = Field(
        None,
        description="Mismatches at excused router-tie positions, accepted: the device may have picked the other nearly tied expert there.",
    )
    routing_flips: list[dict[str, int]] = Field(
        default_factory=list,
        description="Where the device evidently routed a token to the other nearly tied expert (prompt, position, MoE layer): that prompt's reference and baseline were scored again with that routing.",
    )
    first_mismatch: int | None = Field(
        None, description="Index (over all prompts' generated tokens) of the first mismatch."
    )
    float32_precision: Float32Precision | None = Field(
        None,
        description="For float32 runs: the arithmetic the baseline reproduced (ieee, tf32, bf16).",
    )
    reason: str | None = None
    parameters: dict[str, float] = Field(default_factory=dict)
    prompt_statistics: list[PromptStatistics] = Field(
        default_factory=list, description="Every prompt's statistics, device and baseline."
    )
    positions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per prompt and position: token, reference argmax, margin, baseline and device deviation and KL, router tie, verdict; where the token differs, both as text (token_text, reference_text).",
    )
    first_divergence: FirstDivergence | None = Field(
        None,
        description="Where the FAIL starts: the first module whose compiled output diverges (searched on a FAIL, or always on request).",
    )
    # ---- the tasks beyond text generation
    method: str | None = Field(
        None,
        description="What the verdict compared: tokens (teacher-forced logits), embeddings, classification (class logits) or latents.",
    )
    metrics: list[MetricStatistics] = Field(
        default_factory=list,
        description="Per error measure of an embeddings, classification or latents verdict: median and maximum over items, device against baseline.",
    )
    items: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per item of such a verdict (an input, or a prompt at a denoising step): its figures and, where it has one, its verdict; a classifier's input also its predicted label and the reference's (label, reference_label).",
    )
    images: Pictures | None = Field(
        None,
        description="text-to-image: the device's and the reference's final pictures (small PNGs).",
    )


class Stack(BaseModel):
    """Versions of everything that decides the outcome."""

    model_config = _FORBID

    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    accelerate: str | None = None
    huggingface_hub: str | None = None
    tokenizers: str | None = None
    safetensors: str | None = None
    torch_neuronx: str | None = None
    neuronx_cc: str | None = None
    sentence_transformers: str | None = Field(
        None, description="sentence-transformers version (feature-extraction, sentence-similarity)."
    )
    diffusers: str | None = Field(None, description="diffusers version (text-to-image).")
    os: str | None = None
    instance_type: str | None = None
    device_name: str | None = Field(
        None, description="The accelerator's name from get_device_properties (cpu: processor)."
    )
    lnc: int | None = Field(
        None, description="Logical NeuronCore size in effect on the neuron backend (1 or 2)."
    )
    lnc_source: str | None = Field(
        None,
        description="Where lnc came from: NEURON_LOGICAL_NC_CONFIG, the node's config file, "
        "or the instance type's default.",
    )
    compiler_flags: str | None = Field(
        None,
        description="NEURON_CC_FLAGS in effect on the neuron backend (the neuronx-cc options "
        "beyond TorchNeuron's own; they decide the float32 precision policy); null when unset "
        "or off Neuron.",
    )
    origin: str | None = Field(
        None,
        description='"writer": versions of the process that stored an EXCLUDED record (nothing ran); None: run.py\'s own.',
    )


class ResultDocument(BaseModel):
    """What run.py writes: one JSON object (file + marked last stdout line)."""

    model_config = _FORBID

    schema_version: int = 1
    model: str
    weights_sha256: str | None = Field(
        None,
        description="A local checkpoint: sha256 of its weight files (each one's relative path "
        "and content hash, sorted); null for a Hub model, whose revision names its weights.",
    )
    revision: str | None = None
    resolved_revision: str | None = None
    task: str
    backend: str | None = None
    compile_backend: str | None = None
    dtype: str | None = None
    cores: int = 1
    parallelism: Parallelism = Parallelism.NONE
    max_new_tokens: int | None = None
    parameters: int | None = Field(
        None, description="Total parameter count of the model as loaded."
    )
    parameters_per_core: int | None = Field(
        None, description="Parameters held by one core (rank 0) after sharding."
    )
    result: Result
    error_class: ErrorClass | None = None
    error_reason: CompileFailure | None = Field(
        None, description="Why an ERROR compile happened (the vocabulary's CompileFailure)."
    )
    error: str | None = None
    traceback: str | None = None
    stage: str | None = Field(None, description="Last stage reached.")
    timings: Timings = Field(default_factory=lambda: Timings())
    memory: Memory = Field(default_factory=lambda: Memory())
    compilation: Compilation = Field(default_factory=lambda: Compilation())
    compile_cache: CompileCacheFigures | None = Field(
        None,
        description="Compile cache transfers around the run (filled by the harness, not run.py); "
        "null when no cache target was given.",
    )
    prompts: list[str] = Field(default_factory=list)
    tokens: list[list[int]] = Field(default_factory=list)
    text: list[str] = Field(default_factory=list)
    verification: Verification = Field(default_factory=lambda: Verification())
    judge: dict[str, Any] | None = None
    stack: Stack = Field(default_factory=lambda: Stack())
    packages: list[Annotated[str, Field(pattern=PACKAGE_PIN, max_length=300)]] = Field(
        default_factory=list, description="Every installed distribution as name==version."
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None


def new_run_id(now: datetime | None = None) -> str:
    """A unique, sortable, path-safe run id: UTC timestamp + a random suffix."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}"


class RunRecord(BaseModel):
    """One immutable record in the results store: a result document plus how it came to be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    document: ResultDocument
    # ---- readable ids: how results name the model (document.model keeps what run.py loaded)
    model_id: str = Field(
        default_factory=lambda data: (
            readable_model_id(data["document"].model) if "document" in data else ""
        ),
        description="The model's id in results: a Hub id as is; a local checkpoint as "
        "local/<folder name> unless the recorder named it (e.g. demo/tiny-llama).",
    )
    # ----
    run_py: str = Field(
        ..., description="The exact run.py that ran (or would have run, for EXCLUDED)."
    )
    source: str = Field("cli", description="Who ran it: cli, operator, demo.")
    exclusion_reason: ExclusionReason | None = None
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    labels: dict[str, str] = Field(
        default_factory=dict, description="Free labels (e.g. the CR name, sweep name)."
    )

    def to_json(self) -> str:
        """Serialize to one JSON document."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> RunRecord:
        """Parse a record written by to_json; raises pydantic.ValidationError when malformed."""
        return cls.model_validate_json(text)


def parse_result_line(stdout: str) -> ResultDocument | None:
    """Find the marked result line in run.py's stdout (the last one wins)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return ResultDocument.model_validate(json.loads(line[len(RESULT_MARKER) :]))
    return None


def record_from_document(
    document: ResultDocument,
    run_py: str,
    *,
    source: str = "cli",
    labels: dict[str, str] | None = None,
    run_id: str | None = None,
) -> RunRecord:
    """Wrap a result document and the exact script that produced it into an immutable record."""
    return RunRecord(
        run_id=run_id or new_run_id(),
        document=document,
        run_py=run_py,
        source=source,
        labels=labels or {},
    )


def failure_document(
    config: RunConfig,
    result: Result,
    *,
    error_class: ErrorClass | None,
    error: str,
    started_at: datetime | None = None,
    stage: str | None = None,
    total_s: float | None = None,
) -> ResultDocument:
    """A result document for a run that produced none itself (timeout, killed, OOM-killed, no output)."""
    doc = ResultDocument(
        model=config.model,
        revision=config.revision,
        task=config.task.value,
        backend=config.backend.value,
        compile_backend=config.compile_backend,
        dtype=config.dtype,
        cores=config.cores,
        parallelism=config.parallelism,
        max_new_tokens=config.max_new_tokens,
        prompts=list(config.prompts),
        result=result,
        error_class=error_class,
        error=error,
        stage=stage,
        started_at=started_at,
        finished_at=datetime.now(UTC),
    )
    doc.timings.total_s = total_s
    return doc
