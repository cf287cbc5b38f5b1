"""run.py repeats the vocabulary (it must run standalone): keep the two in step."""

from __future__ import annotations

import ast

from model_support import records
from model_support.script import template_text
from model_support.vocabulary import (
    COMPILE_FAILURE_MEANINGS,
    ERROR_CLASS_MEANINGS,
    EXCLUSION_MEANINGS,
    FLOAT32_PRECISION_DEFAULTS,
    FLOAT32_PRECISION_MEANINGS,
    GENERATING_TASKS,
    RESULT_MEANINGS,
    TASK_METHODS,
    VERDICT_CHECK_MEANINGS,
    CompileFailure,
    ErrorClass,
    ExclusionReason,
    Float32Precision,
    Result,
    Task,
    VerdictCheck,
)


def _runner_constant(name: str) -> object:
    tree = ast.parse(template_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"run.py defines no {name}")


def test_runner_result_states_match_the_vocabulary() -> None:
    assert tuple(_runner_constant("RESULTS")) == tuple(r.value for r in Result)


def test_runner_error_classes_match_the_vocabulary() -> None:
    assert tuple(_runner_constant("ERROR_CLASSES")) == tuple(c.value for c in ErrorClass)


def test_runner_compile_failure_reasons_match_the_vocabulary() -> None:
    assert tuple(_runner_constant("COMPILE_FAILURES")) == tuple(c.value for c in CompileFailure)
    assert set(COMPILE_FAILURE_MEANINGS) == set(CompileFailure)
    from model_support.runner import run as runner

    reasons = {runner.NotCompiled.reason} | {
        cls.reason for cls in runner.NotCompiled.__subclasses__()
    }
    assert reasons <= {c.value for c in CompileFailure}


def test_runner_markers_match_the_parsers() -> None:
    assert _runner_constant("RESULT_MARKER") == records.RESULT_MARKER
    assert _runner_constant("PROGRESS_MARKER") == records.PROGRESS_MARKER


def test_every_state_class_and_reason_is_documented() -> None:
    assert set(RESULT_MEANINGS) == set(Result)
    assert set(ERROR_CLASS_MEANINGS) == set(ErrorClass)
    assert set(EXCLUSION_MEANINGS) == set(ExclusionReason)
    assert all(
        len(text) > 20 for text in [*RESULT_MEANINGS.values(), *ERROR_CLASS_MEANINGS.values()]
    )


def test_runner_verdict_checks_and_float32_precisions_match_the_vocabulary() -> None:
    assert tuple(_runner_constant("VERDICT_CHECKS")) == tuple(c.value for c in VerdictCheck)
    assert tuple(_runner_constant("FLOAT32_PRECISIONS")) == tuple(
        p.value for p in Float32Precision if p is not Float32Precision.AUTO
    )
    assert _runner_constant("FLOAT32_PRECISION_BY_BACKEND") == {
        backend.value: precision.value for backend, precision in FLOAT32_PRECISION_DEFAULTS.items()
    }
    assert set(VERDICT_CHECK_MEANINGS) == set(VerdictCheck)
    assert set(FLOAT32_PRECISION_MEANINGS) == set(Float32Precision)


def test_runner_tasks_match_the_vocabulary() -> None:
    """Every task of the vocabulary has a scenario in run.py, and only those."""
    from model_support.runner import run as runner

    tasks = [task for scenario in runner.SCENARIOS for task in scenario.tasks]
    assert sorted(tasks) == sorted(t.value for t in Task)
    assert len(tasks) == len(set(tasks))  # one scenario per task
    assert set(_runner_constant("GENERATING_TASKS")) == {t.value for t in GENERATING_TASKS}
    assert {t for s in runner.SCENARIOS if s.generates for t in s.tasks} == {
        t.value for t in GENERATING_TASKS
    }
    for task in Task:
        assert runner.scenario_for(task.value).method == TASK_METHODS[task]
