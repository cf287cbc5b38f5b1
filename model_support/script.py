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
import json
import re
from functools import cache, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable

from model_support.config import RunConfig

BEGIN = "# ---- BEGIN MODEL-SUPPORT CONFIG (rendered by model-support; JSON only) ----"
END = "# ---- END MODEL-SUPPORT CONFIG ----"
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


def render_script(config: RunConfig, template: str | None = None) -> str:
    """Return run.py with its config block holding ``config``."""
    template = template_text() if template is None else template
    matches = list(_BLOCK.finditer(template))
    if len(matches) != 1:
        raise TemplateError(f"run.py must contain exactly one config block, found {len(matches)}")
    payload = json.dumps(config.model_dump(mode="json"), sort_keys=True, indent=4)
    body = f'CONFIG_JSON = r"""\n{payload}\n"""'
    start, end = matches[0].span("body")
    rendered = template[:start] + body + template[end:]
    if read_config(rendered) != config:
        raise TemplateError("the rendered config block does not read back as the config given")
    return rendered


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
