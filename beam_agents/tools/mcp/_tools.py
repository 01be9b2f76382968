"""``McpTool``: one tool of an MCP server as a registry ``Tool``, and :func:`load_mcp_tools`."""

from __future__ import annotations

import contextlib
import copy
import json
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

import mcp.types as mcp_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from beam_agents._protos import MAX_JSON_DEPTH
from beam_agents.tools._schema import (
    IntentInfo,
    argument_error,
    drop_nulls_meaning_default,
    nesting_depth,
    nesting_problems,
    shown_input,
)
from beam_agents.tools._tool import Tool, ToolConnection, ToolRegistry
from beam_agents.tools.errors import SideEffectToolError, ToolArgumentError, ToolDefinitionError
from beam_agents.tools.mcp._sessions import (
    McpConnectionError,
    McpServer,
    McpToolError,
    current_pool,
    session_pool,
)

INTENT_ID_META_KEY = "beam_agents/intent_id"
"""The ``_meta`` key under which the effector sends the intent id with every call it makes."""

# The effector injects ``intent`` as a keyword; a server parameter of that name travels under
# this one instead, so the two never collide.
_INTENT_ARGUMENT = "__mcp_argument_intent"
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")


def load_mcp_tools(
    server: McpServer,
    *,
    side_effect: bool | Mapping[str, bool] | None = None,
    prefix: str = "",
) -> ToolRegistry:
    """The tools ``server`` lists, as a registry to merge with ``@tool`` registries.

    Only a ``readOnlyHint: true`` tool is read-only, unless ``side_effect`` says otherwise.
    """
    if not isinstance(server, McpServer):
        raise TypeError(f"load_mcp_tools takes an McpServer, got {type(server).__name__}")
    listed = session_pool().list_tools(server)
    overrides = _overrides(server, side_effect, listed)
    registry = ToolRegistry()
    for definition in listed.values():
        read_only = bool(definition.annotations and definition.annotations.read_only_hint)
        effect = overrides.get(definition.name, not read_only)
        registry.register(
            McpTool(server, definition, side_effect=effect, name=_name(prefix, definition.name))
        )
    return registry


class McpTool(Tool[..., Any]):
    """A tool an MCP server offers; a side-effecting one runs only in the effector."""

    def __init__(
        self,
        server: McpServer,
        definition: mcp_types.Tool,
        *,
        side_effect: bool,
        name: str | None = None,
    ) -> None:
        tool_name = definition.name if name is None else name
        if not isinstance(side_effect, bool):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: side_effect must be True or False", tool_name=tool_name
            )
        self._server = server
        self._name = tool_name
        self._side_effect = side_effect
        self._version = 0
        self._adopt(definition)

    @property
    def server(self) -> McpServer:
        """The server that runs this tool."""
        return self._server

    @property
    def remote_name(self) -> str:
        """The tool's name on its server (the registry name may carry a prefix)."""
        return self._definition.name

    @property
    def argument_model(self) -> type[BaseModel]:
        self._refresh()
        return self._model

    @property
    def schema(self) -> dict[str, Any]:
        self._refresh()
        return copy.deepcopy(self._schema)

    @property
    def description(self) -> str:
        self._refresh()
        return self._description

    @property
    def accepts_intent(self) -> bool:
        return self._side_effect

    @property
    def connection(self) -> ToolConnection | None:
        """The server's session, for a read-only tool (the pipeline calls only those)."""
        return None if self._side_effect else _ServerConnection(self._server)

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``arguments`` against the server's schema; return them as JSON values."""
        self._refresh()
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            raise ToolArgumentError(
                f"tool {self._name!r}: arguments must be a mapping of parameter name to value",
                tool_name=self._name,
            )
        too_deep = nesting_problems(arguments)
        if too_deep:
            raise argument_error(self._name, too_deep)
        arguments = _wire(arguments)
        # A null for an optional argument that cannot be null means "leave it out" (as for
        # @tool); a schema whose references do not resolve leaves that to the model.
        with contextlib.suppress(Exception):
            arguments = drop_nulls_meaning_default(arguments, self._schema["parameters"])
        try:
            validated = self._model.model_validate(arguments)
        except ValidationError as error:
            raise _argument_error(self._name, error) from error
        values: dict[str, Any] = validated.model_dump(
            mode="json", by_alias=True, exclude_unset=True
        )
        if "intent" in values:
            values[_INTENT_ARGUMENT] = values.pop("intent")
        return values

    def decode_result(self, data: bytes | str) -> Any:
        return json.loads(data) if data else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call a read-only tool: an awaitable of its result. A side-effecting one is refused."""
        if self._side_effect:
            raise SideEffectToolError.for_tool(self._name)
        if args:
            raise TypeError(f"MCP tool {self._name!r} takes keyword arguments only")
        return self._call_inline(self.validate_arguments(kwargs))

    def unwrap(self) -> Any:
        """The effector's entry: ``await f(intent=IntentInfo, **arguments)``."""
        return self._call_for_intent

    async def _call_inline(self, arguments: dict[str, Any]) -> Any:
        pool = session_pool()
        timeout, arguments = self._server.call_timeout_s, _wire(arguments)
        try:
            result = await pool.call_tool(
                self._server, self.remote_name, arguments, meta=None, timeout_s=timeout
            )
        except McpConnectionError as exc:
            if not exc.sent:
                raise
            # The session broke under the call; read-only, so asking again on a new one is safe.
            result = await pool.call_tool(
                self._server, self.remote_name, arguments, meta=None, timeout_s=timeout
            )
        return _value(self, result)

    async def _call_for_intent(self, *, intent: IntentInfo, **arguments: Any) -> Any:
        result = await session_pool().call_tool(
            self._server,
            self.remote_name,
            _wire(arguments),
            meta={INTENT_ID_META_KEY: intent.intent_id},
            timeout_s=self._server.call_timeout_s,
        )
        return _value(self, result)

    def _adopt(self, definition: mcp_types.Tool) -> None:
        schema = definition.input_schema
        self._definition = definition
        self._description = definition.description or definition.title or ""
        try:
            self._model = arguments_model(self._name, schema)
        except Exception as exc:
            raise ToolDefinitionError(
                f"MCP tool {definition.name!r}: its inputSchema cannot be read: {exc}",
                tool_name=self._name,
            ) from exc
        self._schema = {"name": self._name, "description": self._description, "parameters": schema}

    def _refresh(self) -> None:
        """Take the server's newer definition after a ``tools/list_changed``, if there is one."""
        pool = current_pool()
        entry = None if pool is None else pool.catalog.get(self._server)
        if entry is None or entry[0] == self._version:
            return
        version, tools = entry
        self._version = version
        definition = tools.get(self.remote_name)
        if definition is not None and definition != self._definition:
            self._adopt(definition)

    def _identity(self) -> tuple[object, ...]:
        return (self._server, self.remote_name, self._name, self._side_effect)

    def __repr__(self) -> str:
        return (
            f"McpTool(name={self._name!r}, server={self._server.label!r}, "
            f"side_effect={self._side_effect})"
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        listed = self._definition.model_dump(mode="json", by_alias=True, exclude_none=True)
        return (_restore, (self._server, listed, self._side_effect, self._name))


@dataclass(frozen=True)
class _ServerConnection:
    """An MCP server's session in this process's pool, held open by whoever opens it."""

    server: McpServer

    def open(self) -> None:
        session_pool().acquire(self.server)

    def close(self) -> None:
        session_pool().release(self.server)


def _restore(server: McpServer, listed: dict[str, Any], side_effect: bool, name: str) -> McpTool:
    return McpTool(
        server, mcp_types.Tool.model_validate(listed), side_effect=side_effect, name=name
    )


def _wire(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments as the server names them (``intent`` travels under another name here)."""
    wired = dict(arguments)
    if _INTENT_ARGUMENT in wired:
        wired["intent"] = wired.pop(_INTENT_ARGUMENT)
    return wired


def _value(tool: McpTool, result: mcp_types.CallToolResult) -> Any:
    """What a call returns: structured content, else the text, else the content blocks."""
    blocks = result.content
    texts = [block.text for block in blocks if isinstance(block, mcp_types.TextContent)]
    if result.is_error:
        text = "\n".join(texts) or "(no message)"
        raise McpToolError(
            f"MCP tool {tool.remote_name!r} on {tool.server.label} failed: {text[:2_000]}",
            tool_name=tool.name,
            content=text,
        )
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == len(blocks):
        return "\n".join(texts)
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in blocks]


def _overrides(
    server: McpServer,
    side_effect: bool | Mapping[str, bool] | None,
    listed: Mapping[str, mcp_types.Tool],
) -> dict[str, bool]:
    if side_effect is None:
        return {}
    if isinstance(side_effect, bool):
        return dict.fromkeys(listed, side_effect)
    if not isinstance(side_effect, Mapping):
        raise TypeError("side_effect is None, a bool, or a mapping of tool name to bool")
    unknown = sorted(set(side_effect) - set(listed))
    if unknown:
        offered = ", ".join(sorted(listed)) or "none"
        raise ToolDefinitionError(
            f"side_effect names tools {server.label} does not offer: {', '.join(unknown)} "
            f"(it offers: {offered})",
            tool_name=unknown[0],
        )
    for name, value in side_effect.items():
        if not isinstance(value, bool):
            raise ToolDefinitionError(
                f"side_effect[{name!r}] must be True or False, got {value!r}", tool_name=name
            )
    return dict(side_effect)


def _name(prefix: str, remote: str) -> str:
    return _NOT_IN_NAME.sub("_", prefix + remote)[:64] or "_"


def _argument_error(tool_name: str, error: ValidationError) -> ToolArgumentError:
    problems: list[tuple[str, str]] = []
    for detail in error.errors():
        location = ".".join(str(part) for part in detail["loc"]) or "(arguments)"
        message = "unknown argument" if detail["type"] == "extra_forbidden" else detail["msg"]
        if detail["type"] not in ("missing", "extra_forbidden"):
            message += f" (got {shown_input(detail['input'], 80)})"
        problems.append((location, message))
    return argument_error(tool_name, problems)


# -- arguments models from JSON Schema -----------------------------------------------------

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
    if nesting_depth(schema, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ToolDefinitionError(
            f"MCP tool {tool_name!r}: its inputSchema nests deeper than {MAX_JSON_DEPTH} levels",
            tool_name=tool_name,
        )
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
