"""Pydantic models as Kubernetes structural OpenAPI v3 schemas (what a CRD's
``openAPIV3Schema`` holds), so that the operator's models are the one source of the CRDs.

Pydantic writes JSON Schema 2020-12; the API server wants OpenAPI v3.0 in structural form:
no ``$ref``, no ``anyOf`` for optional fields (absence is how a field is optional), no
``additionalProperties: false`` (unknown fields are pruned instead), ``exclusiveMinimum`` as a
boolean beside ``minimum``. Field descriptions are kept; class docstrings, written for Python
readers, are not. Extra keys (``x-kubernetes-validations``, list types, ``default`` of a
factory field) come from each model's or field's ``json_schema_extra``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, GetJsonSchemaHandler, JsonValue
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

_KEY_ORDER = (
    "type",
    "format",
    "description",
    "required",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "default",
    "enum",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "maxProperties",
    "additionalProperties",
    "items",
    "properties",
)
_DROPPED = frozenset({"title", "$defs"})


@dataclass(frozen=True)
class CelRule:
    """One of the API server's validation rules (``x-kubernetes-validations``): a CEL
    expression over ``self`` and the message the API server answers when it is false."""

    rule: str
    message: str


def cel_rules(rules: Iterable[CelRule]) -> JsonDict:
    """A model's or field's ``json_schema_extra`` that holds ``rules``."""
    listed: list[JsonValue] = [{"rule": rule.rule, "message": rule.message} for rule in rules]
    return {"x-kubernetes-validations": listed}


def cel_rule_list(rules: Iterable[CelRule]) -> list[dict[str, str]]:
    """``rules`` as a schema holds them."""
    return [{"rule": rule.rule, "message": rule.message} for rule in rules]


class SchemaFormat:
    """Annotates a field with an OpenAPI ``format`` (``Annotated[int, SchemaFormat("int64")]``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema["format"] = self.name
        return schema


Int64 = Annotated[int, SchemaFormat("int64")]
"""An integer Kubernetes stores as int64 (generations, epochs, byte counts)."""
Timestamp = Annotated[str, SchemaFormat("date-time")]
"""An RFC 3339 time as Kubernetes writes it."""


def openapi_schema(model: type[BaseModel], *, defaults: bool = True) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model``.

    ``defaults=False`` leaves out every ``default`` (a status schema: only the operator writes
    it, and the API server must not invent fields there).
    """
    schema = model.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    return _structural(schema, defs, defaults=defaults, root=True)


def _structural(
    node: dict[str, Any], defs: dict[str, Any], *, defaults: bool, root: bool = False
) -> dict[str, Any]:
    node = _resolved(node, defs, root=root)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "additionalProperties" and value is False):
            continue
        if key == "default" and (value is None or not defaults):
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "x-kubernetes-validations":  # pydantic sorts keys; a rule reads first
            out[key] = [{"rule": r["rule"], "message": r["message"]} for r in value]
        elif key == "properties":
            out[key] = {
                name: _structural(prop, defs, defaults=defaults) for name, prop in value.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs, defaults=defaults)
        else:
            out[key] = value
    order = {key: index for index, key in enumerate(_KEY_ORDER)}
    return dict(sorted(out.items(), key=lambda item: order.get(item[0], len(order))))


def _resolved(node: dict[str, Any], defs: dict[str, Any], *, root: bool) -> dict[str, Any]:
    """``node`` with its ``$ref`` inlined and an optional field's ``anyOf [X, null]`` made X;
    the field's own keys (its description, default) win over the referenced definition's."""
    if root:
        node = {key: value for key, value in node.items() if key != "description"}
    while True:
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            own = {key: value for key, value in node.items() if key != "$ref"}
            node = {**{k: v for k, v in target.items() if k != "description"}, **own}
        elif "anyOf" in node:
            options = [option for option in node["anyOf"] if option != {"type": "null"}]
            if len(options) != 1:
                raise ValueError(f"no structural schema for a field of either {node['anyOf']}")
            own = {key: value for key, value in node.items() if key != "anyOf"}
            node = {**options[0], **own}
        elif "allOf" in node and len(node["allOf"]) == 1:
            own = {key: value for key, value in node.items() if key != "allOf"}
            node = {**node["allOf"][0], **own}
        else:
            return node
