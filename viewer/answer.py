"""The answer a model's details give first, under its name: the result and one plain sentence
(where its output left the reference and which module diverges first, what stopped it, or why it
was not run), before any figure.

Pure functions of a matrix row (a mapping of its columns) and its parsed verification: the
details, the Compare view's two sides and a History run say a result the same way. The sentence
is plain text (the caller escapes it); an ERROR's own message is returned apart, to be shown as
code (a compiler's message is the answer, and it is data).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from model_support.records import divergence_where
from model_support.viewer import failures, formatting
from model_support.vocabulary import EXCLUSION_MEANINGS, ExclusionReason, Result


@dataclass(frozen=True)
class Answer:
    """What a result says first."""

    result: str
    sentence: str
    """One plain sentence (not Markdown)."""
    message: str | None = None
    """An ERROR's or TIMEOUT's own message (its first lines), shown as code under the sentence."""


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    if 10 <= number % 100 <= 20:
        return f"{number}th"
    return f"{number}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th') }"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _int(value: object) -> int | None:
    return None if formatting.missing(value) else int(value)  # type: ignore[call-overload]


def _ratio(value: object) -> str | None:
    if formatting.missing(value):
        return None
    number = float(value)  # type: ignore[arg-type]
    return f"{number:,.0f}" if number >= 100 else f"{number:.3g}"


def first_bad_token(verification: Mapping[str, object]) -> tuple[int, int] | None:
    """(prompt, position) of the first generated token beyond the noise (verdict ``bad``),
    both counted from 0; None when the record holds no such position."""
    listed = verification.get("positions")
    if not isinstance(listed, list):
        return None
    bad = [
        (int(p["prompt"]), int(p["position"]))
        for p in listed
        if isinstance(p, Mapping)
        and p.get("verdict") == "bad"
        and isinstance(p.get("prompt"), int)
        and isinstance(p.get("position"), int)
    ]
    return min(bad) if bad else None


def _prompts(verification: Mapping[str, object]) -> int:
    listed = verification.get("positions")
    if not isinstance(listed, list):
        return 0
    return len({p.get("prompt") for p in listed if isinstance(p, Mapping)})


def first_diverging_module(verification: Mapping[str, object]) -> str | None:
    """``the first module that diverges is model.layers.1.mlp.down_proj (from decode step 18),
    398x a correct run's error``; None when the search named none."""
    found = verification.get("first_divergence")
    if not isinstance(found, Mapping) or not isinstance(found.get("module"), str):
        return None
    clause = f"the first module that diverges is {found['module']}"
    step = found.get("step")
    where = divergence_where(found.get("phase"), step if isinstance(step, int | float) else None)
    if where:
        clause += f" ({where})"
    ratio = _ratio(found.get("error_ratio"))
    return f"{clause}, {ratio}x a correct run's error" if ratio else clause


def _fail(row: Mapping[str, object], verification: Mapping[str, object]) -> str:
    clauses = []
    bad = first_bad_token(verification)
    if bad is not None:
        prompt, position = bad
        where = f"its {ordinal(position + 1)} generated token"
        if _prompts(verification) > 1:
            where += f" of the {ordinal(prompt + 1)} prompt"
        clauses.append(f"the output diverges from the float32 reference from {where}")
    else:
        checks = failures.failed_checks(row, verification)
        measured = [
            c
            for c in checks.itertuples()
            if not formatting.missing(c.value) and not formatting.missing(c.bound) and c.bound
        ]
        if measured:
            first = measured[0]
            what = str(first.figure).replace(" / the baseline's", "")
            clauses.append(
                f"the output drifts from the float32 reference: its {what} is "
                f"{_ratio(first.value)}x a correct run's (bound {_ratio(first.bound)}x)"
            )
        elif isinstance(row.get("verification_reason"), str) and row["verification_reason"]:
            clauses.append(f"the verification rejected the output: {row['verification_reason']}")
        else:
            clauses.append("the verification rejected the output (the record says no more)")
    module = first_diverging_module(verification)
    if module:
        clauses.append(module)
    return "; ".join(clauses) + "."


def unticked_exact(row: Mapping[str, object]) -> str | None:
    """Why a PASS is not ``exact``: its differing tokens were all within the noise; None for an
    exact run, or one whose counts are not recorded."""
    if row.get("verified_exact") is not False and row.get("verified_exact") != 0:
        return None
    mismatches = _int(row.get("mismatches"))
    if not mismatches:
        return None
    near = _int(row.get("near_ties")) or 0
    ties = (
        f"{_plural(near, 'near tie')} (the reference's top two tokens closer than a correct "
        "run's rounding moves them)"
        if near
        else "ties a correct run's rounding can reverse"
    )
    return (
        f"{_plural(mismatches, 'generated token')} differ from the float32 reference's choice, "
        f"all at {ties}, so the output is right but not exact"
    )


def _pass(row: Mapping[str, object], verification: Mapping[str, object]) -> str:
    if not failures.token_verdict(verification):
        return "the output agrees with the float32 reference within every bound."
    unticked = unticked_exact(row)
    if unticked:
        return f"the output matches the float32 reference within its noise: {unticked}."
    if row.get("verified_exact") is True or row.get("verified_exact") == 1:
        return "the output matches the float32 reference token for token."
    return "the output passed its verification against the float32 reference."


def _stopped(row: Mapping[str, object], timeout: bool) -> Answer:
    took = formatting.duration(row.get("started_at"), row.get("finished_at"))
    after = f" after {took}" if took else ""
    error = row.get("error")
    message = None
    if isinstance(error, str) and error.strip():
        lines = error.strip().splitlines()
        message = "\n".join(lines[: failures.MESSAGE_LINES])
        if len(lines) > failures.MESSAGE_LINES:
            message += f"\n… ({len(lines) - failures.MESSAGE_LINES:,} more lines below)"
    if timeout:
        sentence = f"it ran past its time limit and was stopped{after}."
        return Answer(Result.TIMEOUT.value, sentence, message)
    stage = row.get("stage") if isinstance(row.get("stage"), str) else None
    error_class = row.get("error_class") if isinstance(row.get("error_class"), str) else None
    what = f"the {stage or error_class} stage" if stage or error_class else "the test"
    said = "; the compiler said:" if (stage or error_class) == "compile" else ":"
    sentence = f"{what} failed{after}" + (said if message else ".")
    return Answer(Result.ERROR.value, sentence, message)


def _excluded(row: Mapping[str, object]) -> str:
    reason = row.get("exclusion_reason")
    known = {r.value: r for r in ExclusionReason}
    meaning = (
        EXCLUSION_MEANINGS.get(known[reason])
        if isinstance(reason, str) and reason in known
        else None
    )
    sentence = "not run"
    if isinstance(reason, str) and reason:
        sentence += f" ({reason})"
    if meaning:
        sentence += f": {meaning[0].lower()}{meaning[1:].rstrip('.')}"
    cores = _int(row.get("neuron_cores"))
    if reason == ExclusionReason.TOO_LARGE.value and cores is not None and cores > 1:
        parallelism = row.get("parallelism")
        split = f", {parallelism} parallel" if isinstance(parallelism, str) and parallelism else ""
        sentence += f"; it would need {cores:,} NeuronCores{split}"
    return sentence + "."


def answer(row: Mapping[str, object], verification: Mapping[str, object]) -> Answer:
    """The result and its plain sentence (which starts with a capital)."""
    said = _answer(row, verification)
    return Answer(said.result, said.sentence[:1].upper() + said.sentence[1:], said.message)


def _answer(row: Mapping[str, object], verification: Mapping[str, object]) -> Answer:
    result = str(row.get("result"))
    if result == Result.FAIL.value:
        return Answer(result, _fail(row, verification))
    if result == Result.PASS.value:
        return Answer(result, _pass(row, verification))
    if result in (Result.ERROR.value, Result.TIMEOUT.value):
        return _stopped(row, timeout=result == Result.TIMEOUT.value)
    if result == Result.EXCLUDED.value:
        return Answer(result, _excluded(row))
    if result == Result.UNVERIFIED.value:
        return Answer(
            result,
            "it ran to the end, but its test did not verify the output: whether it is right "
            "is unknown.",
        )
    return Answer(result, "the record holds no result this viewer knows.")
