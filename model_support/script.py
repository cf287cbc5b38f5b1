"""Rendering run.py: the runner template with only its config block replaced.

The config travels as a JSON document, one key per line, inside a raw triple-quoted Python
string. ``json.dumps`` escapes every quote and backslash inside a JSON string and writes only
ASCII, and JSON never puts three string delimiters in a row, so the literal cannot end early and
no value (a hostile model id, a prompt) can become code; every rendering is parsed back and
compared before it is returned, so a template or value that broke this would be refused. The
rendered text is what runs and what is stored, byte for byte.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable

from model_support.config import RunConfig

BEGIN = "# ---- BEGIN MODEL-SUPPORT CONFIG (rendered by model-support; JSON only) ----"
END = "# ---- END MODEL-SUPPORT CONFIG ----"
PROGRAM_KEYS = ("head", "tail")
"""The program ConfigMap's keys: run.py before and after its config block (:class:`Program`)."""
RUN_CONFIG_ENV = "MODEL_SUPPORT_RUN_CONFIG"
"""The runner's variable holding its test's config block (what goes between head and tail)."""
RUN_SHA256_ENV = "MODEL_SUPPORT_RUN_SHA256"
"""The runner's variable holding the sha256 its run.py must have: anything else is not run."""
_BLOCK = re.compile(re.escape(BEGIN) + r"\n(?P<body>.*?)\n" + re.escape(END), re.DOTALL)


class TemplateError(RuntimeError):
    """run.py does not have exactly one well-formed config block."""


def template_file() -> Traversable:
    """The runner script shipped with the package (images/runner/run.py): its text is rendered
    here, and ``model-support doctor`` runs it as a process; no module imports it."""
    return resources.files("model_support.runner") / "run.py"


@cache
def template_text() -> str:
    """The unrendered runner script shipped with the package (images/runner/run.py)."""
    return template_file().read_text(encoding="utf-8")


@dataclass(frozen=True)
class Program:
    """run.py's text around its config block: ``head + config_block(config) + tail`` is the
    run.py rendered for ``config``, byte for byte. Every test shares the program; only its
    config block is its own (the operator ships the program once per namespace)."""

    head: str  # up to and including the BEGIN marker's line
    tail: str  # from the newline before the END marker

    @cached_property
    def digest(self) -> str:
        """sha256 of the program (head and tail), naming it."""
        return hashlib.sha256(f"{len(self.head)}:{self.head}{self.tail}".encode()).hexdigest()


def program(template: str | None = None) -> Program:
    """The program of ``template`` (None: the runner script shipped with the package)."""
    return _program(template_text() if template is None else template)


@lru_cache(maxsize=4)
def _program(template: str) -> Program:
    matches = list(_BLOCK.finditer(template))
    if len(matches) != 1:
        raise TemplateError(f"run.py must contain exactly one config block, found {len(matches)}")
    start, end = matches[0].span("body")
    return Program(head=template[:start], tail=template[end:])


def config_block(config: RunConfig) -> str:
    """The config block's text for ``config`` (what goes between the program's head and tail)."""
    payload = json.dumps(config.model_dump(mode="json"), sort_keys=True, indent=4)
    return f'CONFIG_JSON = r"""\n{payload}\n"""'


def read_block(block: str) -> RunConfig:
    """The config a config block's text holds (as :func:`read_config` reads it in run.py)."""
    return read_config(f"{BEGIN}\n{block}\n{END}")


def render_script(config: RunConfig, template: str | None = None) -> str:
    """Return run.py with its config block holding ``config``."""
    block = config_block(config)
    if read_block(block) != config:
        raise TemplateError("the rendered config block does not read back as the config given")
    parts = program(template)
    return parts.head + block + parts.tail


def read_config(script: str) -> RunConfig:
    """Parse the config block back out of a rendered run.py."""
    matches = list(_BLOCK.finditer(script))
    if len(matches) != 1:
        raise TemplateError(f"run.py must contain exactly one config block, found {len(matches)}")
    body = ast.parse(matches[0].group("body")).body
    if (
        len(body) != 1
        or not isinstance(body[0], ast.Assign)
        or [getattr(t, "id", None) for t in body[0].targets] != ["CONFIG_JSON"]
        or not isinstance(body[0].value, ast.Constant)
        or not isinstance(body[0].value.value, str)
    ):
        raise TemplateError("the config block must be a single CONFIG_JSON string assignment")
    return RunConfig.model_validate_json(body[0].value.value)


def runner_constant(name: str) -> object:
    """A module-level constant of the run.py template (a literal), read without importing it
    (run.py imports torch)."""
    for node in _statements(template_text()):
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise KeyError(f"run.py defines no constant {name}")


@lru_cache(maxsize=4)
def _statements(text: str) -> list[ast.stmt]:
    """The module-level statements of a run.py text, parsed once per text (parsing the
    template takes a tenth of a second, and the viewer asks for every neuron row's details)."""
    return ast.parse(text).body
