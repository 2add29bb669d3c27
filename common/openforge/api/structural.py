"""Pydantic JSON schema -> structural OpenAPI v3 schema, as a CRD version needs it.

The API server accepts only *structural* schemas: every node states its
``type`` (or preserves unknown fields), no ``$ref``, no type inside
``anyOf``/``oneOf``, no ``additionalProperties`` beside ``properties``, no
``uniqueItems``, and OpenAPI v3.0 spellings (``nullable``, boolean
``exclusiveMinimum``). Pydantic writes JSON Schema 2020-12, so this module
rewrites it:

- ``$ref`` is inlined; keywords beside it (a field's description, its CEL
  rules) are merged in, CEL rules appended to the model's own.
- ``X | None`` (``anyOf: [X, {type: null}]``) becomes ``X`` with
  ``nullable: true``; ``has()`` in CEL is false for a null field, as ``None``
  means unset in the models. Any other union is refused.
- ``extra="allow"`` models (``additionalProperties: true``) and ``Any`` values
  become ``x-kubernetes-preserve-unknown-fields: true``; ``extra="forbid"``
  (``additionalProperties: false``) is dropped, since the API server prunes
  or, under strict field validation, rejects unknown fields itself.
- A field marked ``x-openforge-opaque`` (the pod template) becomes a bare
  object that preserves unknown fields: the models check it, the server keeps it.
- ``title``, ``const`` and ``default: null`` are dropped or rewritten.

A keyword this module does not know is an error, not silently passed on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPAQUE = "x-openforge-opaque"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
VALIDATIONS = "x-kubernetes-validations"

_KEPT = {
    "type",
    "description",
    "format",
    "enum",
    "default",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "nullable",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    PRESERVE,
    VALIDATIONS,
}
_DROPPED = {"title", "$defs"}
# Keys of each output node in this order, so that the YAML reads top-down.
_ORDER = [
    "description",
    "type",
    "format",
    "enum",
    "default",
    "nullable",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "items",
    "properties",
    "required",
    "additionalProperties",
    PRESERVE,
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    VALIDATIONS,
]


class SchemaError(ValueError):
    """A model whose JSON schema has no structural equivalent."""


def structural(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite a pydantic ``model_json_schema()`` (with its ``$defs``) as a structural schema."""
    return _convert(schema, schema.get("$defs", {}), path="")


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], *, path: str) -> dict[str, Any]:
    node = _inline(node, defs, path=path)
    if node.get(OPAQUE):
        return _opaque(node)
    if "anyOf" in node:
        return _nullable(node, defs, path=path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key == OPAQUE:
            continue
        if key == "properties":
            out[key] = {
                name: _convert(sub, defs, path=f"{path}.{name}") for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, path=f"{path}[]")
        elif key == "additionalProperties":
            _additional(out, value, defs=defs, path=path)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum" or key == "exclusiveMaximum":
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default" and value is None:
            continue
        elif key in _KEPT:
            out[key] = value
        else:
            raise SchemaError(f"{path or '<root>'}: keyword {key!r} has no structural equivalent")
    if "type" not in out and not out.get(PRESERVE):
        raise SchemaError(f"{path or '<root>'}: no type (an untyped field needs Any, or a model)")
    return _ordered(out)


def _inline(node: Mapping[str, Any], defs: Mapping[str, Any], *, path: str) -> dict[str, Any]:
    """Resolve ``$ref`` (or a one-element ``allOf`` around one), merging sibling keywords in."""
    node = dict(node)
    if "allOf" in node:
        (inner,) = node.pop("allOf")
        node = {**inner, **node}
    ref = node.pop("$ref", None)
    if ref is None:
        return node
    name = ref.removeprefix("#/$defs/")
    if name not in defs:
        raise SchemaError(f"{path}: unresolvable $ref {ref!r}")
    target = _inline(defs[name], defs, path=path)
    rules = [*target.get(VALIDATIONS, []), *node.get(VALIDATIONS, [])]
    merged = {**target, **node}
    if rules:
        merged[VALIDATIONS] = rules
    return merged


def _nullable(node: dict[str, Any], defs: Mapping[str, Any], *, path: str) -> dict[str, Any]:
    branches = node.pop("anyOf")
    real = [branch for branch in branches if branch != {"type": "null"}]
    if len(real) != 1:
        raise SchemaError(
            f"{path}: a union of {len(real)} types is not structural; use one type or a model"
        )
    merged = _inline(real[0], defs, path=path)
    rules = [*merged.get(VALIDATIONS, []), *node.get(VALIDATIONS, [])]
    merged.update(node)
    if rules:
        merged[VALIDATIONS] = rules
    out = _convert(merged, defs, path=path)
    if len(real) < len(branches):
        out["nullable"] = True
    return _ordered(out)


def _additional(out: dict[str, Any], value: Any, *, defs: Mapping[str, Any], path: str) -> None:
    if value is True or value == {}:
        out[PRESERVE] = True
    elif isinstance(value, Mapping):
        out["additionalProperties"] = _convert(value, defs, path=f"{path}.*")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    return {key: node[key] for key in sorted(node, key=_ORDER.index)}


def _opaque(node: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", PRESERVE: True}
    if "description" in node:
        out["description"] = node["description"]
    if VALIDATIONS in node:
        out[VALIDATIONS] = node[VALIDATIONS]
    return _ordered(out)
