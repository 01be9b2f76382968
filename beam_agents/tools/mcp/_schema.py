"""A Pydantic v2 model built from an MCP tool's ``inputSchema``, to validate arguments at act time.

:func:`arguments_model` is the entry. It covers the JSON Schema a tool server writes in
practice: objects, arrays, scalars, ``enum``/``const``, nullable type lists, ``anyOf``/``oneOf``,
local references into ``$defs``, and the usual numeric, string and array bounds. What it cannot
express (``allOf``, ``not``, recursive references) is accepted as any JSON value and left to
the server, which validates again.
"""

from __future__ import annotations

import keyword
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

_SCALARS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}
_CONSTRAINTS = {
    "minimum": "ge",
    "maximum": "le",
    "exclusiveMinimum": "gt",
    "exclusiveMaximum": "lt",
    "minLength": "min_length",
    "maxLength": "max_length",
    "minItems": "min_length",
    "maxItems": "max_length",
    "pattern": "pattern",
    "multipleOf": "multiple_of",
}
_NOT_IDENTIFIER = re.compile(r"\W")


def arguments_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """The model that validates a call's arguments against ``schema`` (an object schema)."""
    builder = _Builder(tool_name, schema)
    return builder.object_model(f"{_identifier(tool_name)}_arguments", schema, ())


class _Builder:
    """Turns one schema document into Python types; references resolve against its root."""

    def __init__(self, tool_name: str, root: dict[str, Any]) -> None:
        self._tool_name = tool_name
        self._root = root
        self._models = 0

    def object_model(
        self, name: str, schema: dict[str, Any], refs: tuple[str, ...]
    ) -> type[BaseModel]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = set(schema.get("required") or ())
        extra = schema.get("additionalProperties", True)
        config = ConfigDict(
            extra="forbid" if extra is False else "allow",
            populate_by_name=False,
            protected_namespaces=(),
        )
        fields: dict[str, Any] = {}
        for position, (prop, prop_schema) in enumerate(properties.items()):
            kind = self.type_of(prop_schema, f"{name}_{position}", refs)
            description = prop_schema.get("description") if isinstance(prop_schema, dict) else None
            if prop in required:
                field = Field(..., alias=prop, description=description)
            else:
                default = prop_schema.get("default") if isinstance(prop_schema, dict) else None
                kind = Optional[kind]  # noqa: UP045 (a runtime-built union)
                field = Field(default, alias=prop, description=description)
            fields[f"f{position}_{_identifier(prop)}"] = (kind, field)
        return create_model(name, __config__=config, **fields)

    def type_of(self, schema: Any, name: str, refs: tuple[str, ...]) -> Any:
        if schema is True or not isinstance(schema, dict):
            return Any
        if "$ref" in schema:
            return self._reference(schema["$ref"], name, refs)
        if "const" in schema:
            return Literal[schema["const"]] if _literal_ok(schema["const"]) else Any
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            values = schema["enum"]
            return Literal[tuple(values)] if all(_literal_ok(v) for v in values) else Any
        for combinator in ("anyOf", "oneOf"):
            options = schema.get(combinator)
            if isinstance(options, list) and options:
                kinds = [self.type_of(o, f"{name}_{i}", refs) for i, o in enumerate(options)]
                return Union[tuple(kinds)]  # noqa: UP007 (a runtime-built union)
        declared = schema.get("type")
        if isinstance(declared, list):
            kinds = [self._single(schema, t, f"{name}_{t}", refs) for t in declared]
            return Union[tuple(kinds)] if kinds else Any  # noqa: UP007
        if isinstance(declared, str):
            return self._single(schema, declared, name, refs)
        if "properties" in schema:
            return self._single(schema, "object", name, refs)
        return Any

    def _single(
        self, schema: dict[str, Any], declared: str, name: str, refs: tuple[str, ...]
    ) -> Any:
        if declared == "object":
            if isinstance(schema.get("properties"), dict):
                self._models += 1
                return self.object_model(f"{name}_{self._models}", schema, refs)
            values = schema.get("additionalProperties", True)
            return dict[str, self.type_of(values, f"{name}_values", refs)]  # type: ignore[misc]
        if declared == "array":
            item = self.type_of(schema.get("items", True), f"{name}_item", refs)
            return _bounded(list[item], schema)  # type: ignore[valid-type]
        scalar = _SCALARS.get(declared)
        if scalar is None:
            return Any
        if declared == "number":
            # An integer stays an integer on its way to the server.
            return _bounded(int, schema) | _bounded(float, schema)
        return _bounded(scalar, schema)

    def _reference(self, ref: Any, name: str, refs: tuple[str, ...]) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#/") or ref in refs:
            return Any  # remote or recursive: the server validates it
        target: Any = self._root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return Any
            target = target[part]
        return self.type_of(target, f"{name}_ref", (*refs, ref))


def _bounded(kind: Any, schema: dict[str, Any]) -> Any:
    bounds = {
        keyword_: schema[key]
        for key, keyword_ in _CONSTRAINTS.items()
        if key in schema
        and isinstance(schema[key], (int, float, str))
        and not isinstance(schema[key], bool)
    }
    if kind is str:
        bounds = {k: v for k, v in bounds.items() if k in ("min_length", "max_length", "pattern")}
    elif kind in (int, float):
        bounds = {k: v for k, v in bounds.items() if k in ("ge", "le", "gt", "lt", "multiple_of")}
    else:
        bounds = {k: v for k, v in bounds.items() if k in ("min_length", "max_length")}
    return Annotated[kind, Field(**bounds)] if bounds else kind


def _literal_ok(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, bool))


def _identifier(text: str) -> str:
    name = _NOT_IDENTIFIER.sub("_", text) or "_"
    return f"_{name}" if name[0].isdigit() or keyword.iskeyword(name) else name
