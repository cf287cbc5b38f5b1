"""Pure pandas queries behind the viewer: search, tables per view, triage, comparison, charts.

Nothing here touches Streamlit or storage, so every function can be tested (and benchmarked) on
a plain DataFrame in the matrix's columns (model_support.dataset.MATRIX_SCHEMA).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from packaging.version import InvalidVersion, Version

from model_support.records import FirstDivergence
from model_support.vocabulary import ExclusionReason, Result

if TYPE_CHECKING:
    from model_support.rankings import Ranking

NOT_PASSING = (Result.FAIL.value, Result.ERROR.value, Result.TIMEOUT.value)
"""Outcomes of a model that ran (or tried to) and did not pass; what triage groups."""

UNTESTED = "not tested"
LOCAL = "_local"
"""A list's hidden column: the row's model was tested from a local checkpoint (its id, e.g.
``demo/tiny-llama``, names no Hub repository), so it has no Hub link."""

# Columns each view reads (the loader reads only these from Parquet: every column more costs
# decoding time on a large matrix).
LIST_COLUMNS: tuple[str, ...] = (
    "model_id",
    "model_path",
    "task",
    "result",
    "error_class",
    "exclusion_reason",
    "failed_checks",
    "neuron_cores",
    "wall_time_s",
    "compile_time_s",
    "decode_tokens_per_s",
    "peak_device_memory_bytes",
    "recorded_at",
)
TRIAGE_COLUMNS: tuple[str, ...] = (
    "model_id", "task", "result", "error_class", "error_reason", "error", "verification_reason",
    "first_divergence", "first_divergence_kind", "first_divergence_phase",
)  # fmt: skip
COMPARE_COLUMNS: tuple[str, ...] = (
    "model_id", "model_path", "task", "result", "error_class", "wall_time_s",
)  # fmt: skip
PASS_RATE_COLUMNS: tuple[str, ...] = ("compiler", "compiler_version", "model_id", "result")
SCATTER_COLUMNS: tuple[str, ...] = ("model_id", "task", "result", "wall_time_s", "parameters")
DETAIL_COLUMNS: tuple[str, ...] = (
    "model_id", "model_path", "task", "result", "error_class", "error_reason", "error", "exclusion_reason", "neuron_cores",
    "wall_time_s", "compile_time_s", "peak_device_memory_bytes", "decode_tokens_per_s",
    "verified_exact", "error_ratio", "mismatches", "near_ties", "bad_tokens", "first_mismatch",
    "verification_reason", "verification_json", "text", "texts", "prompts", "neuronx_cc", "compiler", "run_py",
    "packages", "stack", "run_id", "source", "backend", "compile_backend", "dtype", "parallelism",
    "revision", "resolved_revision", "torch", "torch_neuronx", "started_at", "finished_at",
    "recorded_at", "stage", "failed_checks", "q90_ratio", "peak_ratio", "kl_ratio", "parameters",
    "instance_type", "lnc", "device_name", "library", "library_version", "labels",
)  # fmt: skip

COMPILE_CACHE_COLUMNS: tuple[str, ...] = (
    "compiler_version", "compile_cache_hits", "compile_cache_misses", "compile_cache_target",
    "compile_cache_prefix", "compile_cache_prefix_matched", "compile_cache_pulled_entries", "compile_cache_pulled_bytes",
    "compile_cache_pull_s", "compile_cache_pushed_entries", "compile_cache_pushed_bytes",
    "compile_cache_push_s", "compile_cache_skipped", "compile_cache_error",
)  # fmt: skip
"""What the details show about the compile cache (absent from datasets older than it)."""


def _text(row: Mapping[str, object], name: str) -> str | None:
    value = row.get(name)
    return value if isinstance(value, str) and value else None


CACHE_TARGETS_ENV = "MODEL_SUPPORT_VIEWER_CACHE_TARGETS"
"""Compile cache roots the viewer may name in a pull command (comma-separated; ``{namespace}``
stands for any one namespace): the targets the operator's admin configured."""
CACHE_KEYS_ENV = "MODEL_SUPPORT_VIEWER_CACHE_TRUSTED_KEYS"
"""The public keys (``ed25519:<base64>``, comma-separated) whose signatures a pull command
the viewer offers checks: the operator's compileCacheTrustedKeys."""


def configured_cache_targets() -> list[str]:
    """The compile cache roots the viewer may offer to pull from (see ``CACHE_TARGETS_ENV``)."""
    return [t.strip() for t in os.environ.get(CACHE_TARGETS_ENV, "").split(",") if t.strip()]


def configured_cache_keys() -> list[str]:
    """The keys the viewer's pull commands trust (see ``CACHE_KEYS_ENV``)."""
    return [k.strip() for k in os.environ.get(CACHE_KEYS_ENV, "").split(",") if k.strip()]


def _segments(location: str) -> list[str] | None:
    """A location's scheme and path segments; None when a segment is empty, ``.`` or ``..``."""
    scheme, separator, rest = location.rstrip("/").partition("://")
    body = rest if separator else location.rstrip("/")
    parts = body.split("/")
    if any(p in ("", ".", "..") for p in (parts[1:] if body.startswith("/") else parts)):
        return None
    return [scheme + separator if separator else "", *parts]


def _under_shared(target: str, configured: Sequence[str]) -> bool:
    """Whether ``target`` lies under a configured root shared by every namespace (one without
    ``{namespace}``: only the admin's trusted pushers write there, and they sign)."""
    parts = _segments(target)
    if parts is None:
        return False
    for root in configured:
        pattern = _segments(root) if "{namespace}" not in root else None
        if pattern is not None and parts[: len(pattern)] == pattern:
            return True  # (a {namespace} root is a namespace's own: what its tests run wrote)
    return False


def compile_cache_pull(
    row: Mapping[str, object],
    configured: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
) -> tuple[str, str] | None:
    """The exact pull command for a row's compile cache, and what it verifies; None when no
    cache whose entries a reader can verify holds them.

    Whoever can write a compile cache runs code in those who pull from it, so the viewer
    offers only the run's own target when it lies under a shared target the operator
    configured (``configured``, default :func:`configured_cache_targets`) and the operator's
    trusted keys are known (``keys``, default :func:`configured_cache_keys`): the command then
    takes only entries a manifest signed by those keys lists. A namespace's own cache (written
    by what its tests run) and the public NEFF cache (an unsigned mirror) are never offered.
    """
    from model_support.compile_cache import pull_command

    configured = configured_cache_targets() if configured is None else configured
    keys = configured_cache_keys() if keys is None else keys
    prefix = _text(row, "compile_cache_prefix")
    target = _text(row, "compile_cache_target")
    if prefix is None or target is None or not keys or not _under_shared(target, configured):
        return None
    command = pull_command(target, prefix) + "".join(
        f" --trusted-key {shlex.quote(key)}" for key in keys
    )
    how = (
        "the shared cache this run pushed to; the pull takes only entries that a manifest "
        "signed by the operator's trusted pushers lists (--trusted-key), and nothing else"
    )
    return command, how


def version_key(version: str | None) -> tuple[int, Version | str]:
    """Sort key for version strings: PEP 440 order where they parse, text order otherwise."""
    if version is None:
        return (0, "")
    try:
        return (2, Version(version))
    except InvalidVersion:
        return (1, version)


def newest_first(labelled: Iterable[tuple[str, str | None]]) -> list[str]:
    """Distinct labels by their version, newest first; labels of one version in name order.

    (A dataset of CPU runs holds several compilers at one torch version: the order, and so the
    stack the page opens on, must not depend on set iteration order.)
    """
    by_name = sorted(set(labelled))
    return list(
        dict.fromkeys(
            label for label, _ in sorted(by_name, key=lambda i: version_key(i[1]), reverse=True)
        )
    )


def search(frame: pd.DataFrame, text: str | None) -> pd.DataFrame:
    """Rows whose model id contains ``text`` (case-insensitive, literal, not a pattern)."""
    needle = (text or "").strip()
    if not needle or frame.empty:
        return frame
    mask = frame["model_id"].str.contains(needle, case=False, regex=False, na=False)
    return frame[mask]


def with_task(frame: pd.DataFrame, task: str | None) -> pd.DataFrame:
    """Rows of one task (all rows when ``task`` is None)."""
    if not task or frame.empty:
        return frame
    return frame[frame["task"] == task]


def gib(values: pd.Series) -> pd.Series:
    """Bytes as GiB, rounded for display."""
    return (values.astype("Float64") / 2**30).round(2)


def figures(frame: pd.DataFrame) -> dict[str, pd.Series]:
    """A result's figures as every list shows them, in this order: the cores it ran on (or
    would need), wall time, compile time, decode speed and peak device memory; missing where
    the run did not get that far."""
    cores = frame["neuron_cores"].astype("Int64")
    # A too-large exclusion records the fewest cores that would hold the model, and 1 when no
    # count of this hardware would (as older records do): that is no count, not "1 core".
    unknown = (
        (frame["result"] == Result.EXCLUDED.value)
        & (frame["exclusion_reason"] == ExclusionReason.TOO_LARGE.value)
        & (cores <= 1)
    )
    return {
        "cores": cores.mask(unknown.fillna(False).astype(bool)),
        "wall time (s)": frame["wall_time_s"].astype("Float64").round(1),
        "compile time (s)": frame["compile_time_s"].astype("Float64").round(1),
        "decode (tok/s)": frame["decode_tokens_per_s"].astype("Float64").round(1),
        "peak device memory (GiB)": gib(frame["peak_device_memory_bytes"]),
    }


def local(frame: pd.DataFrame) -> pd.Series:
    """Per row: the model was tested from a local checkpoint (it has a ``model_path``), not
    loaded from the Hub; False where the frame does not say."""
    if "model_path" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["model_path"].notna()


def results_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The table of the "All results" view: one row per model and task, readable columns."""
    out = pd.DataFrame(
        {
            "model": frame["model_id"],
            "task": frame["task"],
            "result": frame["result"],
            "why": _why(frame),
            **figures(frame),
            LOCAL: local(frame),
        }
    )
    if not is_sorted_by(out["model"], out["task"]):  # matrix files come sorted: skip the sort
        out = out.sort_values(["model", "task"], kind="stable")
    return out.reset_index(drop=True)


def is_sorted_by(first: pd.Series, second: pd.Series) -> bool:
    """Whether rows are in (first, second) order (vectorized string comparisons, no sort)."""
    if len(first) < 2:
        return True
    a, b = pa.array(first, from_pandas=True), pa.array(second, from_pandas=True)
    head, tail = a[:-1], a[1:]
    ordered = pc.or_(
        pc.less(head, tail), pc.and_(pc.equal(head, tail), pc.less_equal(b[:-1], b[1:]))
    )
    return bool(pc.all(pc.fill_null(ordered, False)).as_py())


def _why(frame: pd.DataFrame) -> pd.Series:
    """The short reason beside a result: the error class for ERROR, the reason for EXCLUDED,
    the failed checks for FAIL (comma-separated)."""
    result = frame["result"]
    why = frame["error_class"].where(
        result == Result.ERROR.value,
        frame["exclusion_reason"].where(result == Result.EXCLUDED.value),
    )
    failed = (result == Result.FAIL.value).fillna(False).astype(bool)
    if "failed_checks" in frame.columns and failed.any():
        # Joined for the FAIL rows only: a list per row of 100,000 costs a quarter second.
        checks = pd.Series(
            [_joined(v) for v in frame["failed_checks"][failed]],
            index=frame.index[failed],
            dtype="object",
        )
        why = why.where(~failed, checks)
    return why.astype("string")


def _joined(value: object) -> str | None:
    """A list cell (None, a list or an array of strings) as "a, b"; None when empty."""
    if value is None or isinstance(value, (float, str)):
        return None
    return ", ".join(str(v) for v in value) or None  # type: ignore[attr-defined]


def _latest(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, task): the most recently recorded (a matrix file should hold one)."""
    if frame.empty:
        return frame
    if "recorded_at" in frame.columns:
        frame = frame.sort_values("recorded_at", kind="stable")
    return frame.drop_duplicates(["model_id", "task"], keep="last")


def selected_table(
    entries: Iterable[tuple[str, str, str | None]], frame: pd.DataFrame
) -> pd.DataFrame:
    """The Selected view: each curated (model, task, reason) with its result in ``frame``.

    A model left out on purpose shows EXCLUDED with the list's reason; a listed model with no
    result says it was not tested.
    """
    rows = pd.DataFrame(list(entries), columns=["model_id", "task", "reason"])
    merged = rows.merge(_latest(frame), on=["model_id", "task"], how="left")
    result = merged["result"].astype("string")
    why = _why(merged.assign(result=result.fillna("")))
    curated = merged["reason"].notna()
    result[curated] = Result.EXCLUDED.value
    why[curated] = merged.loc[curated, "reason"].astype("string")
    untested = result.isna()
    result[untested] = UNTESTED
    return pd.DataFrame(
        {
            "model": merged["model_id"],
            "task": merged["task"],
            "result": result,
            "why": why,
            **figures(merged),
            LOCAL: local(merged),
        }
    )


def ranking_table(ranking: Ranking, frame: pd.DataFrame) -> pd.DataFrame:
    """A Hub ranking beside our results: rank, model, the Hub's figures, our result or "not tested"."""
    ranked = pd.DataFrame(
        [
            {
                "rank": m.rank,
                "model_id": m.model_id,
                "downloads": m.downloads,
                "trending score": m.trending_score,
                "parameters": m.parameters,
                "gated": m.gated,
            }
            for m in ranking.models
        ],
        columns=["rank", "model_id", "downloads", "trending score", "parameters", "gated"],
    )
    ours = _latest(with_task(frame, ranking.task))
    merged = ranked.merge(ours, on="model_id", how="left")
    result = merged["result"].astype("string").fillna(UNTESTED)
    table = pd.DataFrame(
        {
            "rank": merged["rank"].astype("Int64"),
            "model": merged["model_id"],
            "result": result,
            "why": _why(merged.assign(result=result)),
            **figures(merged),
            "downloads": merged["downloads"].astype("Int64"),
            "trending score": merged["trending score"].astype("Float64"),
            "parameters": merged["parameters"].astype("Int64"),
            "gated": merged["gated"].astype("string"),
        }
    )
    drop = "downloads" if ranking.sort == "trending_score" else "trending score"
    return table.drop(columns=[drop])


# ---------------------------------------------------------------------------------------------
# Triage

_PATH = re.compile(
    r"(?:[A-Za-z]:)?(?:[\\/][\w.\-@+]+){2,}[\\/]?|\b[\w.\-]+\.(?:py|so|cc|cpp|h|json|neff|safetensors)\b"
)
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_SPACE = re.compile(r"\s+")
SIGNATURE_LENGTH = 200


def error_signature(error: object) -> str:
    """A normalized signature of an error message, so the same failure in many models groups.

    Uses the message's first non-empty line (the traceback tail differs per model), with the
    next one when it ends in a colon (a wrapper such as "BackendCompilerFailed: ... raised:"
    introducing the real error), and replaces paths, quoted names, hex addresses/hashes and
    numbers with placeholders. A missing message (None or a missing value) is "(no message)".
    """
    if not isinstance(error, str) or not error.strip():
        return "(no message)"
    lines = [part.strip() for part in error.strip().splitlines() if part.strip()]
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {lines[1]}"
    line = _PATH.sub("<path>", line)
    line = _QUOTED.sub("<name>", line)
    line = _HEX.sub("<hex>", line)
    line = _NUMBER.sub("<n>", line)
    line = _SPACE.sub(" ", line).strip()
    return line[:SIGNATURE_LENGTH]


def failure_messages(failed: pd.DataFrame) -> pd.Series:
    """What each failure says: its error, else (a FAIL: the verdict rejected the output) the
    verification's reason; None where neither was recorded."""
    messages = failed["error"].astype("object")
    if "verification_reason" in failed.columns:
        messages = messages.where(messages.notna(), failed["verification_reason"].astype("object"))
    return messages.where(messages.notna(), None)


def divergence_signature(module: object, kind: object, phase: object = None) -> str | None:
    """A FAIL's group by where it starts: the first diverging module's own name (its last
    part, e.g. o_proj) and class, the same in every layer and every model, and the phase it
    was found in (prefill or decode; not the step, which differs by model); None when
    unknown."""
    if not isinstance(module, str) or not module:
        return None
    found_in = {"decode": " in a decode step", "prefill": " in the prefill"}.get(str(phase), "")
    return f"FAIL, first diverging module{found_in}: {module.rpartition('.')[2]} ({kind})"


def reason_prefix(error_class: object, reason: object) -> str:
    """What leads an ERROR's signature when it has a reason (an ERROR compile's: the compiler
    failed, or the model's graph would not run compiled), so those never share a group."""
    if not isinstance(reason, str) or not reason:
        return ""
    return f"{error_class if isinstance(error_class, str) else 'ERROR'} ({reason}): "


def failure_signatures(failed: pd.DataFrame) -> list[str]:
    """The signature of each failure: for a FAIL whose first diverging module is known, that
    module's kind; else of its error (led by its reason, where it has one), else of the
    verdict's first reason (a FAIL lists up to a few bad tokens and the error ratio, separated
    by "; ")."""
    none = pd.Series(None, index=failed.index, dtype="object")

    def column(name: str) -> pd.Series:
        return failed[name].astype("object") if name in failed.columns else none

    errors, reasons = column("error"), column("verification_reason")
    modules, kinds = column("first_divergence"), column("first_divergence_kind")
    phases = column("first_divergence_phase")
    classes, why = column("error_class"), column("error_reason")
    return [
        divergence_signature(m, k, p)
        or reason_prefix(c, w)
        + error_signature(
            e if isinstance(e, str) else r.split("; ")[0] if isinstance(r, str) else None
        )
        for e, r, m, k, p, c, w in zip(
            errors, reasons, modules, kinds, phases, classes, why, strict=True
        )
    ]


def first_divergence(verification: dict) -> tuple[str | None, pd.DataFrame]:
    """Where a FAIL starts, from a run's verification: one sentence, and the modules searched
    (the enclosing ones, the first diverging one, the next candidates) with their ratios."""
    found = verification.get("first_divergence")
    if not isinstance(found, dict):
        return None, pd.DataFrame()
    sentence = FirstDivergence.model_validate(found).summary()
    module = found.get("module")
    roles = (
        [("enclosing", m) for m in found.get("path") or []]
        + ([("first diverging", found)] if module else [])
        + [("next candidate", m) for m in found.get("candidates") or []]
    )
    rows = [
        {
            "role": role,
            "module": m.get("module"),
            "kind": m.get("kind"),
            "error ratio": m.get("error_ratio"),
            "q90 ratio": m.get("q90_ratio"),
            "peak ratio": m.get("peak_ratio"),
            "failed checks": ", ".join(m.get("failed_checks") or []),
            # A sharded run's search: the ranks on which each module diverges.
            **({"ranks": ", ".join(map(str, m["ranks"]))} if m.get("ranks") is not None else {}),
        }
        for role, m in roles
    ]
    return sentence, pd.DataFrame(rows)


def triage(frame: pd.DataFrame, max_models: int = 5) -> pd.DataFrame:
    """Failures (FAIL/ERROR/TIMEOUT) grouped by error signature, largest groups first."""
    columns = ["signature", "count", "results", "error classes", "models", "example"]
    failed = frame[frame["result"].isin(NOT_PASSING)]
    if failed.empty:
        return pd.DataFrame(columns=columns)
    failed = failed.assign(message=failure_messages(failed), signature=failure_signatures(failed))
    rows = []
    for signature, group in failed.groupby("signature", sort=False):
        models = sorted(group["model_id"].unique())
        shown = ", ".join(models[:max_models]) + (
            f" (+{len(models) - max_models} more)" if len(models) > max_models else ""
        )
        rows.append(
            {
                "signature": signature,
                "count": len(group),
                "results": ", ".join(sorted(group["result"].unique())),
                "error classes": ", ".join(sorted(group["error_class"].dropna().unique())),
                "models": shown,
                "example": group["message"].dropna().iloc[0]
                if group["message"].notna().any()
                else "",
            }
        )
    table = pd.DataFrame(rows, columns=columns)
    return table.sort_values(
        ["count", "signature"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)


def models_with_signature(frame: pd.DataFrame, signature: str) -> list[str]:
    """Model ids whose failure has ``signature``."""
    failed = frame[frame["result"].isin(NOT_PASSING)]
    return sorted(
        {
            m
            for m, s in zip(failed["model_id"], failure_signatures(failed), strict=True)
            if s == signature
        }
    )


# ---------------------------------------------------------------------------------------------
# Comparison of two stacks

REGRESSION, FIX, CHANGED, SAME, ADDED, REMOVED = (
    "regression",
    "fix",
    "changed",
    "same",
    "only after",
    "only before",
)


def compare(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task): the result before and after, and the change.

    regression = PASS before, not PASS after; fix = not PASS before, PASS after; changed = another
    difference (of result, or of error class within ERROR); same; only before / only after =
    tested with one stack only.
    """
    cols = ["model_id", "task", "result", "error_class", "wall_time_s"]
    cols += (
        ["model_path"] if "model_path" in before.columns and "model_path" in after.columns else []
    )
    merged = _latest(before)[cols].merge(
        _latest(after)[cols], on=["model_id", "task"], how="outer", suffixes=(" before", " after")
    )
    b, a = merged["result before"], merged["result after"]
    change = pd.Series(SAME, index=merged.index, dtype="string")
    error_before = merged["error_class before"].astype("string").fillna("")
    error_after = merged["error_class after"].astype("string").fillna("")
    change[(b != a) & b.notna() & a.notna()] = CHANGED
    change[(b == a) & b.notna() & (error_before != error_after)] = CHANGED
    change[(b == Result.PASS.value) & a.notna() & (a != Result.PASS.value)] = REGRESSION
    change[(a == Result.PASS.value) & b.notna() & (b != Result.PASS.value)] = FIX
    change[b.isna()] = ADDED
    change[a.isna()] = REMOVED
    order = {REGRESSION: 0, FIX: 1, CHANGED: 2, ADDED: 3, REMOVED: 4, SAME: 5}
    table = pd.DataFrame(
        {
            "change": change,
            "model": merged["model_id"],
            "task": merged["task"],
            "before": b.astype("string"),
            "after": a.astype("string"),
            "error class after": merged["error_class after"].astype("string"),
            "wall time before (s)": merged["wall_time_s before"].astype("Float64").round(1),
            "wall time after (s)": merged["wall_time_s after"].astype("Float64").round(1),
            LOCAL: (
                merged["model_path before"].notna() | merged["model_path after"].notna()
                if "model_path" in cols
                else False
            ),
        }
    )
    table["_order"] = table["change"].map(order)
    return (
        table.sort_values(["_order", "model", "task"], kind="stable")
        .drop(columns="_order")
        .reset_index(drop=True)
    )


# ---------------------------------------------------------------------------------------------
# Charts


def pass_rate_by_compiler(frame: pd.DataFrame) -> pd.DataFrame:
    """Pass rate per compiler version, over models that ran (EXCLUDED rows left out).

    Columns: compiler, compiler_version, label, tested, passed, pass_rate (0..1); in version order.
    """
    columns = ["compiler", "compiler_version", "label", "tested", "passed", "pass_rate"]
    ran = frame[frame["result"] != Result.EXCLUDED.value]
    if ran.empty:
        return pd.DataFrame(columns=columns)
    grouped = (
        ran.assign(passed=ran["result"] == Result.PASS.value)
        .groupby(["compiler", "compiler_version"], dropna=False)
        .agg(tested=("model_id", "size"), passed=("passed", "sum"))
        .reset_index()
    )
    grouped["pass_rate"] = grouped["passed"] / grouped["tested"]
    grouped["label"] = (
        grouped["compiler"].fillna("unknown") + " " + grouped["compiler_version"].fillna("unknown")
    )
    grouped = grouped.sort_values(
        "compiler_version", key=lambda s: s.map(version_key), kind="stable"
    ).reset_index(drop=True)
    return grouped[columns]


def wall_time_vs_parameters(frame: pd.DataFrame) -> pd.DataFrame | None:
    """Points (model, parameters, wall time, result) for the scatter, or None without parameter counts."""
    if "parameters" not in frame.columns:
        return None
    points = frame.dropna(subset=["parameters", "wall_time_s"])
    return pd.DataFrame(
        {
            "model": points["model_id"],
            "parameters": points["parameters"].astype("float64"),
            "wall time (s)": points["wall_time_s"].astype("float64"),
            "result": points["result"],
        }
    ).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Task verdicts beyond text generation: what the details panel shows of them

OUTPUT_LABELS: dict[str, str] = {
    "text-classification": "Predicted class per input",
    "image-classification": "Predicted class per test image",
    "automatic-speech-recognition": "Transcription per waveform",
}
"""How the details panel names the ``text`` column for tasks whose text is not a continuation."""


def output_label(task: str) -> str:
    """The details panel's heading for a row's ``text``."""
    return OUTPUT_LABELS.get(task, "Generated text")


def verdict_measures(verification: dict) -> pd.DataFrame:
    """One row per error measure of an embeddings, classification or latents verdict: the
    median and the maximum over items, device and baseline, their ratio and bound.

    Empty for a text verdict (its figures are the matrix's own columns).
    """
    rows = [
        {
            "measure": m.get("check"),
            "what": m.get("what"),
            "items": m.get("items"),
            "median device": m.get("median_device"),
            "median baseline": m.get("median_baseline"),
            "median ratio": m.get("median_ratio"),
            "median bound": m.get("median_bound"),
            "max device": m.get("peak_device"),
            "max baseline": m.get("peak_baseline"),
            "max ratio": m.get("peak_ratio"),
            "max bound": m.get("peak_bound"),
        }
        for m in verification.get("metrics") or []
    ]
    return pd.DataFrame(rows)


def verdict_items(verification: dict) -> pd.DataFrame:
    """A task verdict's per-item figures (an input, or a prompt at a denoising step)."""
    return pd.DataFrame(verification.get("items") or [])
