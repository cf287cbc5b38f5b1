"""Label and field selectors as the API server applies them to lists and watches.

kmock ignores ``labelSelector`` and ``fieldSelector`` and answers every list and watch with
every object of the resource. A real API server selects on the server, so a client that filters
nothing itself would be fed other objects only in the lab; and a scale run's lists (the
watchdog's Jobs not yet recorded) would carry every object ever made. The test cluster
(:class:`k8s_harness.Emulator`) selects with this module.

Label selectors follow k8s.io/apimachinery ``pkg/labels/selector.go`` (``Parse``): requirements
joined by commas, each ``key``, ``!key``, ``key=value`` (``==``), ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, ``key>n`` or ``key<n``; ``!=`` and ``notin`` also match
an object without the key. Field selectors follow ``pkg/fields/selector.go``: ``path=value``
(``==``) and ``path!=value`` over the object's fields, joined by commas; the API server accepts
only the fields each resource declares (every resource: ``metadata.name``,
``metadata.namespace``), and answers any other with 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_COMPARE = re.compile(
    r"^\s*(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s,()]*)\s*$"
)
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)\s*$")

FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                       "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                       "status.podIP", "status.nominatedNodeName"}),
    "events": frozenset({"involvedObject.kind", "involvedObject.namespace",
                         "involvedObject.name", "involvedObject.uid",
                         "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source",
                         "type"}),
    "secrets": frozenset({"type"}),
    "jobs": frozenset({"status.successful"}),
}  # fmt: skip
"""Fields beyond metadata.name and metadata.namespace that a resource's field selectors take
(kubernetes ``pkg/registry/*/strategy.go``, ``...ToSelectableFields``)."""


class SelectorError(ValueError):
    """A selector the API server refuses (400 BadRequest)."""


def _split(selector: str) -> list[str]:
    """Requirements at top-level commas (a set's values are inside parentheses)."""
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Predicate:
    if found := _SET.match(text):
        key, values = found["key"], {v.strip() for v in found["values"].split(",") if v.strip()}
        if found["op"] == "in":
            return lambda labels: key in labels and labels[key] in values
        return lambda labels: key not in labels or labels[key] not in values
    if found := _COMPARE.match(text):
        key, op, value = found["key"], found["op"], found["value"]
        if op in ("=", "=="):
            return lambda labels: labels.get(key) == value
        if op == "!=":
            return lambda labels: labels.get(key) != value
        try:
            bound = int(value)
        except ValueError:
            raise SelectorError(f"{text!r}: for '{op}', a value must be an integer") from None

        def compare(labels: Mapping[str, Any]) -> bool:
            try:
                held = int(labels[key])
            except (KeyError, ValueError):
                return False
            return held > bound if op == ">" else held < bound

        return compare
    if found := _EXISTS.match(text):
        key = found["key"]
        if found["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise SelectorError(f"unable to parse requirement {text!r}")


def label_selector(selector: str | None) -> Predicate:
    """Whether an object's labels match ``selector`` (None or empty: every object)."""
    requirements = [_requirement(part) for part in _split(selector or "")]
    return lambda labels: all(requirement(labels) for requirement in requirements)


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for step in path.split("."):
        value = value.get(step) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_selector(selector: str | None, plural: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an object of ``plural`` matches the field ``selector`` (None or empty: every
    object); :class:`SelectorError` for a field the resource does not declare."""
    checks: list[Callable[[Mapping[str, Any]], bool]] = []
    for part in _split(selector or ""):
        found = re.match(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if found is None:
            raise SelectorError(f"invalid field selector {part!r}")
        path, op, value = found.groups()
        if path not in {"metadata.name", "metadata.namespace"} | FIELDS.get(plural, frozenset()):
            raise SelectorError(f'field label not supported: "{path}"')
        if op == "!=":
            checks.append(lambda obj, path=path, value=value: _field(obj, path) != value)
        else:
            checks.append(lambda obj, path=path, value=value: _field(obj, path) == value)
    return lambda obj: all(check(obj) for check in checks)


def selects(params: Mapping[str, Any], plural: str) -> Callable[[Mapping[str, Any]], bool]:
    """What a list or watch request's ``labelSelector`` and ``fieldSelector`` select."""
    labels = label_selector(params.get("labelSelector"))
    fields = field_selector(params.get("fieldSelector"), plural)

    def matches(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return labels(meta.get("labels") or {}) and fields(obj)

    return matches
