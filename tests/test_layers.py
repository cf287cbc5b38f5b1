"""Layers point one way: every import in the package goes down, never up.

The layers, bottom to top:

* runner: images/runner (``model_support.runner``), the standalone run.py the runner image
  runs and its build helper. It imports nothing of ours (run.py runs where this package is not
  installed) and nothing imports run.py: model_support/script.py reads its text to render a
  run's script, and the tests import it to test it.
* core: model_support/ with compile_cache/: records, the store, sizing, planning shared by the
  layers above. It imports none of the layers above it.
* operator (operator/src, ``model_support.operator``) and viewer (viewer/,
  ``model_support.viewer``): each imports the core and itself, never the other.
* cli (model_support/cli): on top; it may start the operator and the viewer, run the
  operator's own planning (``model-support render``) and check the resources it writes with
  the operator's spec models (``sweep``, ``bisect --cluster``): :data:`CLI_DRIVERS` names the
  modules that do. Its command modules (``commands_*``)
  share helpers through the package's other modules (``common``: consoles, failing, stores,
  sizing; ``run_output``: how a run and the matrix print; ``run_cache``: the compile cache
  around a run) and never import each other.

Imports are read from the source (ast), lazy ones inside functions and code run from a string
(``python -c``) included, so an arrow that points up fails here with the file and line that
draws it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGE_FOLDERS = {
    # package name -> the folder that holds it (pyproject.toml's package-dir)
    "model_support.operator": ROOT / "operator" / "src",
    "model_support.viewer": ROOT / "viewer",
    "model_support.runner": ROOT / "images" / "runner",
    "model_support.cli": ROOT / "model_support" / "cli",
    "model_support.compile_cache": ROOT / "model_support" / "compile_cache",
    "model_support": ROOT / "model_support",
}
RUN_SCRIPT = "model_support.runner.run"

ALLOWED = {
    "runner": set(),
    "core": {"core"},
    "operator": {"core", "operator"},
    "viewer": {"core", "viewer"},
    "cli": {"core", "operator", "viewer", "cli"},
}
"""Which layers each layer may import (the runner's modules import nothing of ours)."""

COMMAND_MODULE = "model_support.cli.commands_"
"""The CLI's command modules: one command (or group) each."""

CLI_DRIVERS = {
    "operator": {
        # `model-support operator` starts it.
        "model_support/cli/commands_operator.py",
        # `model-support render` runs the operator's own planning steps, so a check the
        # operator adds reaches render too.
        "model_support/cli/commands_render.py",
        # `model-support sweep` and `bisect --cluster` write resources for the cluster
        # (ModelSupportTests for GitOps, a ModelSupportBisect): each is checked with the
        # operator's own spec model, the CRD's source, so the API server admits what they wrote.
        "model_support/cli/commands_sweep.py",
        "model_support/cli/commands_bisect.py",
    },
    # `model-support viewer` starts it.
    "viewer": {"model_support/cli/commands_viewer.py"},
}
"""The CLI's modules that use the operator or the viewer, and why; logic both need belongs in
the core."""

RUN_SCRIPT_IMPORTERS_FOR_NOW = {
    # For now, and only these two: task_fixtures.py and fixture_quality.py import run.py for its
    # task sections while the task families' declarations are being moved into the package;
    # once they no longer do, this set is emptied and run.py has no importer at all.
    "model_support/task_fixtures.py",
    "model_support/fixture_quality.py",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it stands."""

    source: str  # the importing file, relative to the repository
    line: int
    module: str  # the module imported (dotted, absolute)

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.module}"


def module_files() -> dict[str, Path]:
    """Every module of the package, by its dotted name."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGE_FOLDERS.items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def layer_of(module: str) -> str:
    """The layer a dotted module name belongs to."""
    for package, layer in (
        ("model_support.runner", "runner"),
        ("model_support.operator", "operator"),
        ("model_support.viewer", "viewer"),
        ("model_support.cli", "cli"),
    ):
        if module == package or module.startswith(package + "."):
            return layer
    return "core"


def imports_in(
    text: str, source: str, package: str, modules: set[str], line: int | None = None
) -> list[Import]:
    """The package's modules that ``text`` (the file ``source`` of ``package``) imports, at
    module level, inside functions, or in a string of code it runs (``python -c``), in the
    order of their lines (``line``: where a string of code stands in its file)."""
    found = []
    for node in ast.walk(ast.parse(text, source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                parent = package.split(".")
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            # `from package import module` imports that module; `from module import name`
            # imports the module.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # Code run as a string imports as surely as an import statement does.
            if "model_support" in node.value and line is None:
                with contextlib.suppress(SyntaxError, ValueError):
                    found += imports_in(node.value, source, package, modules, node.lineno)
            continue
        else:
            continue
        for target in targets:
            if target == "model_support" or target.startswith("model_support."):
                found.append(Import(source, line or node.lineno, target))
    return sorted(found, key=lambda i: i.line)


@functools.cache
def all_imports() -> list[tuple[str, Import]]:
    """Every import of the package's modules, with the importing module's layer."""
    modules = module_files()
    found: list[tuple[str, Import]] = []
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        source = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        found += [(layer_of(name), i) for i in imports_in(text, source, package, set(modules))]
    return list(dict.fromkeys(found))  # `from m import a, b` is one import of m


def test_the_reader_sees_lazy_relative_and_from_package_imports() -> None:
    """The test's own reader: an import inside a function, a relative one, a
    ``from package import module`` and one in a string of code each name the module they bring
    in, at their lines."""
    text = (
        "def later():\n"
        "    from model_support.viewer.markup import inline_code\n"
        "from . import common\n"
        "from model_support import history\n"
        "import json, model_support.operator.spec\n"
        'CODE = "import sys\\nfrom model_support.runner import run\\nrun.main()"\n'
    )
    modules = {
        "model_support.cli.common",
        "model_support.history",
        "model_support.cli",
        "model_support.runner.run",
    }
    found = imports_in(text, "probe.py", "model_support.cli", modules)
    assert [(i.line, i.module) for i in found] == [
        (2, "model_support.viewer.markup"),
        (3, "model_support.cli.common"),
        (4, "model_support.history"),
        (5, "model_support.operator.spec"),
        (6, "model_support.runner.run"),
    ]


def test_every_import_points_down() -> None:
    upward = [
        str(found)
        for layer, found in all_imports()
        if layer_of(found.module) not in ALLOWED[layer]
        and not (found.module == RUN_SCRIPT and found.source in RUN_SCRIPT_IMPORTERS_FOR_NOW)
    ]
    assert upward == [], "imports that point up a layer:\n" + "\n".join(upward)


def test_run_py_is_imported_by_no_module() -> None:
    """run.py is a standalone script: script.py reads its text; no module imports it."""
    importers = [
        str(found)
        for _, found in all_imports()
        if found.module == RUN_SCRIPT and found.source not in RUN_SCRIPT_IMPORTERS_FOR_NOW
    ]
    assert importers == [], "run.py imported as a library:\n" + "\n".join(importers)


def test_the_cli_uses_the_operator_and_viewer_only_to_start_them_or_run_their_planning() -> None:
    reaching = [
        str(found)
        for layer, found in all_imports()
        if layer == "cli"
        and layer_of(found.module) in CLI_DRIVERS
        and found.source not in CLI_DRIVERS[layer_of(found.module)]
    ]
    assert reaching == [], "CLI modules that take logic from the operator or viewer:\n" + (
        "\n".join(reaching)
    )


def test_cli_command_modules_do_not_import_each_other() -> None:
    crossing = [
        str(found)
        for _, found in all_imports()
        if found.source.startswith("model_support/cli/commands_")
        and found.module.startswith(COMMAND_MODULE)
    ]
    assert crossing == [], "a command module used as another's library:\n" + "\n".join(crossing)
