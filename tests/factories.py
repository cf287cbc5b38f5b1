"""Records and stacks for tests, built through the real pydantic classes: what a typical
run's record holds, in one place (tests override only what they are about)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from model_support.records import (
    Memory,
    ResultDocument,
    RunRecord,
    Stack,
    Timings,
    Verification,
    new_run_id,
)
from model_support.vocabulary import ErrorClass, ExclusionReason, Parallelism, Result

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)

NEURON_STACK = Stack(
    python="3.11.7",
    torch="2.13.0",
    transformers="5.24.0",
    accelerate="1.12.0",
    huggingface_hub="2.4.0",
    tokenizers="0.23.1",
    safetensors="0.7.0",
    torch_neuronx="2.13.0.1",
    neuronx_cc="2.28.7631.0",
    os="Linux-6.1-x86_64",
    instance_type="trn2.48xlarge",
    device_name="Trainium2",
)
CPU_STACK = Stack(
    python="3.11.7",
    torch="2.13.0",
    transformers="5.24.0",
    tokenizers="0.23.1",
    safetensors="0.7.0",
    os="Linux-6.1-x86_64",
)


def make_record(
    model: str = "Qwen/Qwen3-0.6B",
    result: Result = Result.PASS,
    *,
    neuron: bool = True,
    finished: datetime = T0,
    cores: int = 1,
    stack: Stack | None = None,
    transformers: str | None = None,
    run_id: str | None = None,
    exclusion: ExclusionReason | None = None,
    run_py: str = "# run.py\nCONFIG = {}\n",
    source: str = "cli",
    recorded: datetime | None = None,
    document: Mapping[str, Any] | None = None,
    **record_fields: Any,
) -> RunRecord:
    """A record as run.py + the CLI produce it, through the real pydantic classes: a neuron
    (or, ``neuron=False``, CPU) run of ``model`` that finished at ``finished`` (recorded a
    second later unless ``recorded`` says when). ``document``
    replaces fields of the result document (validated again); ``record_fields`` set the
    record's own fields (``model_id``, ``labels``, ...)."""
    chosen = stack if stack is not None else NEURON_STACK if neuron else CPU_STACK
    if transformers is not None:
        chosen = chosen.model_copy(update={"transformers": transformers})
    ran = result != Result.EXCLUDED
    made = ResultDocument(
        model=model,
        revision="main",
        resolved_revision="0123456789abcdef0123456789abcdef01234567" if ran else None,
        task="text-generation",
        backend=("neuron" if neuron else "cpu") if ran else None,
        compile_backend=("neuron" if neuron else "inductor") if ran else None,
        dtype="bfloat16",
        cores=cores,
        parallelism=Parallelism.TENSOR if cores > 1 else Parallelism.NONE,
        max_new_tokens=32,
        result=result,
        error_class=ErrorClass.COMPILE if result == Result.ERROR else None,
        error="neuronx-cc exited with status 70" if result == Result.ERROR else None,
        stage="generate" if ran else None,
        timings=Timings(
            load_s=3.5,
            first_generate_s=95.0,
            steady_generate_s=1.25,
            compile_s=93.75,
            wall_time_s=99.8,
            decode_tokens_per_s=76.8,
        )
        if ran
        else Timings(),
        memory=Memory(peak_device_memory_bytes=2_400_000_000, host_peak_rss_bytes=5_100_000_000)
        if ran
        else Memory(),
        prompts=["def fibonacci(n):", "The capital of France is"],
        text=["\n    if n < 2:\n        return n", " Paris."] if ran else [],
        verification=Verification(
            passed=result == Result.PASS,
            exact=False,
            error_ratio=1.02,
            mismatches=2,
            near_ties=2,
            bad_tokens=0,
            first_mismatch=17,
            reason="2 near-ties",
        )
        if ran
        else Verification(),
        stack=chosen if ran else (stack or Stack()),
        packages=["torch==2.13.0", f"transformers=={chosen.transformers}"] if ran else [],
        started_at=finished - timedelta(seconds=120) if ran else None,
        finished_at=finished if ran else None,
    )
    if document:
        made = ResultDocument.model_validate({**dict(made), **document})
    return RunRecord(
        run_id=run_id or new_run_id(),
        document=made,
        run_py=run_py,
        source=source,
        exclusion_reason=exclusion,
        recorded_at=recorded or finished + timedelta(seconds=1),
        **record_fields,
    )
