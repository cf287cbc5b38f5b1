"""Rendering run.py: only the config block changes, and no value can become code."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_support.config import RunConfig
from model_support.records import ResultDocument
from model_support.script import (
    BEGIN,
    END,
    TemplateError,
    read_config,
    render_script,
    template_text,
)
from model_support.vocabulary import ErrorClass, Parallelism, Result, Task

HOSTILE = 'evil/x"\nimport os; os.system("touch /tmp/pwned") #\'\'\'"""\\'


def _outside_block(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + tail


def test_rendering_changes_only_the_config_block() -> None:
    rendered = render_script(RunConfig(model="org/model", dtype="float32", max_new_tokens=8))
    assert rendered != template_text()
    assert _outside_block(rendered) == _outside_block(template_text())


def test_config_round_trips_through_the_script() -> None:
    config = RunConfig(
        model="org/model",
        revision="v1.0",
        task=Task.IMAGE_TEXT_TO_TEXT,
        cores=4,
        parallelism=Parallelism.TENSOR,
        prompts=["Describe it.", "ünïcödé ✓"],
    )
    assert read_config(render_script(config)) == config


def test_hostile_values_stay_data() -> None:
    config = RunConfig(model=HOSTILE, prompts=[HOSTILE])
    rendered = render_script(config)
    tree = ast.parse(rendered)
    # The only module-level statements are the template's: no injected import or call.
    template_tree = ast.parse(template_text())
    assert [type(n).__name__ for n in tree.body] == [type(n).__name__ for n in template_tree.body]
    assert read_config(rendered).model == HOSTILE
    # Executing the config block defines exactly one string and nothing else.
    namespace: dict[str, object] = {}
    block = rendered.split(BEGIN, 1)[1].split(END, 1)[0]
    exec(compile(block, "config-block", "exec"), namespace)  # the block alone, as run.py runs it
    assert set(namespace) - {"__builtins__"} == {"CONFIG_JSON"}


def test_template_default_config_is_valid() -> None:
    config = read_config(template_text())
    assert config.max_new_tokens == 32
    assert config.trust_remote_code is False


def test_a_template_without_a_block_is_refused() -> None:
    with pytest.raises(TemplateError, match="exactly one config block"):
        render_script(RunConfig(model="org/model"), template="print('no block')\n")


def test_defaults_follow_the_task() -> None:
    assert RunConfig(model="a/b", task=Task.IMAGE_TEXT_TO_TEXT).prompts == ["Describe this image."]
    assert len(RunConfig(model="a/b").prompts) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cores": 2}, "needs parallelism"),
        ({"parallelism": "tensor"}, "must be 'none' on one core"),
        ({"prompts": ["  "]}, "must not be blank"),
        ({"max_new_tokens": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_parameters_are_refused_clearly(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(model="a/b", **kwargs)


def test_rendered_script_is_valid_python_that_needs_no_package() -> None:
    rendered = render_script(RunConfig(model="org/model"))
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(ast.parse(rendered))
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])  # type: ignore[attr-defined]
    }
    assert "model_support" not in imported
    result = subprocess.run(
        [sys.executable, "-c", "import ast,sys; ast.parse(sys.stdin.read())"],
        input=rendered,
        text=True,
    )
    assert result.returncode == 0


def test_run_py_without_torch_writes_a_classified_error(tmp_path: Path) -> None:
    """An image without torch (or whose torch fails to import) still gets a document: an
    infrastructure ERROR of the setup stage that says so, not a traceback and no record."""
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "run.py").write_text(render_script(RunConfig(model="org/model")))
    done = subprocess.run(
        [sys.executable, "run.py"],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(shadow.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    document = ResultDocument.model_validate_json((workdir / "result.json").read_text())
    assert (document.result, document.error_class, document.stage) == (
        Result.ERROR,
        ErrorClass.INFRASTRUCTURE,
        "setup",
    )
    assert document.error and "torch cannot be imported" in document.error
    assert document.backend is None and document.packages  # nothing ran; the stack is known


def test_the_config_block_reads_one_key_per_line() -> None:
    """The block a reader edits is indented JSON: every key of the config on its own line."""
    rendered = render_script(RunConfig(model="org/model", prompts=["a", "b"]))
    block = rendered.split(BEGIN, 1)[1].split(END, 1)[0]
    lines = block.strip().splitlines()
    for key in RunConfig.model_fields:
        assert sum(line.strip().startswith(f'"{key}":') for line in lines) == 1, key
    assert max(len(line) for line in lines) < 100
