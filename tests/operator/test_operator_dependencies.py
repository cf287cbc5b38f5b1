"""The operator's declared kopf version has every kopf setting the operator configures.

The startup handler sets kopf's settings by attribute; a setting kopf added later than the
declared lower bound would fail (AttributeError) on an older kopf that pip is allowed to pick.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import kopf
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = ROOT / "operator" / "src" / "handlers.py"

SETTING_SINCE = {
    ("watching", "label_selectors"): "1.45.0",
    ("watching", "chunk_size"): "1.45.0",
}
"""kopf settings and the kopf release that introduced them (absent from 1.44.6, present in
1.45.0: OperatorSettings in kopf/_cogs/configs/configuration.py of each release)."""


def settings_used() -> set[tuple[str, str]]:
    """(group, name) of every ``settings.<group>.<name>`` the handlers set."""
    used: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(HANDLERS.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "settings"
            and isinstance(node.ctx, ast.Load | ast.Store)
        ):
            used.add((node.value.attr, node.attr))
    return used


def kopf_lower_bound() -> Version:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [requirement] = [
        Requirement(r) for r in project["dependencies"] if Requirement(r).name == "kopf"
    ]
    [bound] = [s.version for s in requirement.specifier if s.operator == ">="]
    return Version(bound)


def test_every_kopf_setting_used_exists_in_the_declared_lower_bound() -> None:
    used = settings_used()
    defaults = kopf.OperatorSettings()
    known = {(g, n) for g, n in used if hasattr(getattr(defaults, g, None), n)}
    assert known == used, f"not kopf settings: {sorted(used - known)}"
    assert ("watching", "label_selectors") in used  # what this check is about is still used
    for setting, since in SETTING_SINCE.items():
        if setting in used:
            assert kopf_lower_bound() >= Version(since), (
                f"settings.{'.'.join(setting)} needs kopf>={since}; pyproject says "
                f">={kopf_lower_bound()}"
            )
