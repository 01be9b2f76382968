"""The strict schema dialect (OpenAI ``strict: true``) and how its nulls are read back.

:func:`strict_parameters` writes the dialect and :func:`drop_nulls_meaning_default` reads it
back, side by side so they cannot drift apart. Why a null can mean "use the default" is in
``beam_agents/tools/README.md``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from beam_agents.tools.errors import ToolDefinitionError

_DEFS_PREFIX = "#/$defs/"
_COMBINATORS = ("anyOf", "oneOf", "allOf")
_ANNOTATIONS = ("title", "description", "default", "examples")

Schema = dict[str, Any]


class _UnresolvedReferenceError(LookupError):
    """A ``$ref`` points outside the root ``$defs`` (never the case for a derived schema)."""


def strict_parameters(parameters: Mapping[str, Any], *, tool_name: str) -> Schema:
    """Rewrite a tool's ``parameters`` schema, as a copy, in the strict dialect.

    Every object is closed and requires all its properties; a property that was optional and does
    not admit null becomes nullable. A ``$ref`` with sibling keywords is inlined, since strict
    mode takes a reference only on its own. An object that must stay open (a free-form map such
    as ``dict[str, T]``) raises ``ToolDefinitionError`` naming the tool and the property.
    """
    original = copy.deepcopy(dict(parameters))
    defs = original.pop("$defs", {})
    try:
        strict: Schema = _strictify(original, path="", defs=defs, tool_name=tool_name)
        if defs:
            strict["$defs"] = {
                name: _strictify(definition, path=f"$defs.{name}", defs=defs, tool_name=tool_name)
                for name, definition in defs.items()
            }
    except _UnresolvedReferenceError as error:
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be exported in strict mode: {error}", tool_name=tool_name
        ) from None
    return strict


def drop_nulls_meaning_default(
    arguments: Mapping[str, Any], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """Copy ``arguments`` without the nulls that, in the strict dialect, mean "use the default".

    Applies at every depth the schema describes (nested models, list items, map values).
    """
    defs = parameters.get("$defs", {})
    pruned = _prune(dict(arguments), parameters, defs)
    assert isinstance(pruned, dict)  # _prune maps a dict to a dict
    return pruned


def admits_null(schema: Any, defs: Mapping[str, Any]) -> bool:
    """Tell whether ``schema`` accepts JSON ``null`` (unconstrained schemas do)."""
    if not isinstance(schema, Mapping):
        return bool(schema)
    if "$ref" in schema:
        return admits_null(_resolve(schema, defs), defs)
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if "enum" in schema:
        return None in schema["enum"]
    if "const" in schema:
        return schema["const"] is None
    branches = [branch for key in ("anyOf", "oneOf") for branch in schema.get(key, ())]
    if branches:
        return any(admits_null(branch, defs) for branch in branches)
    return declared is None and "allOf" not in schema


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    reference = schema.get("$ref")
    if not isinstance(reference, str):
        return schema
    name = reference.removeprefix(_DEFS_PREFIX)
    target = defs.get(name) if reference.startswith(_DEFS_PREFIX) else None
    if not isinstance(target, Mapping):
        raise _UnresolvedReferenceError(f"schema reference {reference!r} does not resolve in $defs")
    return target


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" or "properties" in schema


def _strictify(schema: Any, *, path: str, defs: Mapping[str, Any], tool_name: str) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    node = dict(schema)
    if "$ref" in node and len(node) > 1:
        reference = {"$ref": node.pop("$ref")}
        node = {**_resolve(reference, defs), **node}
    # A default of None only restates the nullability strict mode already expresses.
    if "default" in node and node["default"] is None:
        del node["default"]
    if _is_object(node):
        _close_object(node, path=path, defs=defs, tool_name=tool_name)
    if isinstance(node.get("items"), Mapping):
        node["items"] = _strictify(node["items"], path=f"{path}[]", defs=defs, tool_name=tool_name)
    if isinstance(node.get("prefixItems"), list):
        node["prefixItems"] = [
            _strictify(item, path=f"{path}[{index}]", defs=defs, tool_name=tool_name)
            for index, item in enumerate(node["prefixItems"])
        ]
    for key in _COMBINATORS:
        if isinstance(node.get(key), list):
            node[key] = [
                _strictify(branch, path=path, defs=defs, tool_name=tool_name)
                for branch in node[key]
            ]
    return node


def _close_object(node: Schema, *, path: str, defs: Mapping[str, Any], tool_name: str) -> None:
    extra = node.get("additionalProperties", False)
    if extra is not False:
        where = f"parameter {path!r}" if path else "its parameters object"
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be exported in strict mode: {where} is an open object "
            f"(a free-form map such as dict[str, T]), and strict mode requires every object "
            f"to list its properties and forbid others; use a Pydantic model with named "
            f"fields, or export without strict",
            tool_name=tool_name,
            parameter=path or None,
        )
    properties = node.get("properties", {})
    required = set(node.get("required", ()))
    strict_properties: Schema = {}
    for name, subschema in properties.items():
        child_path = f"{path}.{name}" if path else name
        strict = _strictify(subschema, path=child_path, defs=defs, tool_name=tool_name)
        if name not in required and not admits_null(strict, defs):
            strict = _nullable(strict)
        strict_properties[name] = strict
    node["properties"] = strict_properties
    node["required"] = list(strict_properties)
    node["additionalProperties"] = False


def _nullable(schema: Schema) -> Schema:
    annotations = {key: schema[key] for key in _ANNOTATIONS if key in schema}
    core = {key: value for key, value in schema.items() if key not in _ANNOTATIONS}
    if list(core) == ["anyOf"]:
        return {"anyOf": [*core["anyOf"], {"type": "null"}], **annotations}
    return {"anyOf": [core, {"type": "null"}], **annotations}


def _branch_of_type(
    schema: Mapping[str, Any], json_type: str, defs: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    schema = _resolve(schema, defs)
    if schema.get("type") == json_type or (json_type == "object" and "properties" in schema):
        return schema
    for key in _COMBINATORS:
        for branch in schema.get(key, ()):
            if isinstance(branch, Mapping):
                found = _branch_of_type(branch, json_type, defs)
                if found is not None:
                    return found
    return None


def _prune(value: Any, schema: Any, defs: Mapping[str, Any]) -> Any:
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, dict):
        described = _branch_of_type(schema, "object", defs)
        if described is None:
            return value
        properties = described.get("properties", {})
        required = set(described.get("required", ()))
        extra = described.get("additionalProperties")
        pruned: dict[Any, Any] = {}
        for key, item in value.items():
            subschema = properties.get(key, extra)
            if (
                item is None
                and key in properties
                and key not in required
                and not admits_null(subschema, defs)
            ):
                continue
            pruned[key] = _prune(item, subschema, defs)
        return pruned
    if isinstance(value, list):
        described = _branch_of_type(schema, "array", defs)
        if described is None:
            return value
        return [_prune(item, described.get("items"), defs) for item in value]
    return value
