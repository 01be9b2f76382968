"""Tool definitions in the shapes model providers and MCP take (``docs/tools.md``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from beam_agents.tools._schema import strict_parameters
from beam_agents.tools._tool import Tool
from beam_agents.tools.errors import ToolDefinitionError

__all__ = ["anthropic_tool", "mcp_tool", "openai_tool"]

# A Tool, or a tool schema mapping as found in ``ToolRegistry.tools_schema``.
_ToolLike = Tool[..., Any] | Mapping[str, Any]


def anthropic_tool(tool: _ToolLike) -> dict[str, Any]:
    """Export as an Anthropic Messages tool: ``{"name", "description", "input_schema"}``."""
    schema = _schema_of(tool)
    return {
        "name": schema["name"],
        "description": schema["description"],
        "input_schema": schema["parameters"],
    }


def openai_tool(tool: _ToolLike, *, strict: bool = False) -> dict[str, Any]:
    """Export as an OpenAI Chat Completions function tool, optionally in the strict dialect."""
    schema = _schema_of(tool)
    parameters = schema["parameters"]
    if strict:
        parameters = strict_parameters(parameters, tool_name=schema["name"])
    return {
        "type": "function",
        "function": {
            "name": schema["name"],
            "description": schema["description"],
            "parameters": parameters,
            "strict": strict,
        },
    }


def mcp_tool(tool: Tool[..., Any]) -> dict[str, Any]:
    """Export as an MCP ``tools/list`` entry, with annotations derived from ``side_effect``.

    A read-only tool is read-only and idempotent. A side-effecting tool gets MCP's cautious
    defaults stated outright (destructive, not idempotent). Both are open-world.
    """
    if not isinstance(tool, Tool):
        raise TypeError(
            f"mcp_tool takes a Tool (its annotations come from side_effect), "
            f"got {type(tool).__name__}"
        )
    schema = tool.schema
    read_only = not tool.side_effect
    return {
        "name": schema["name"],
        "description": schema["description"],
        "inputSchema": schema["parameters"],
        "annotations": {
            "readOnlyHint": read_only,
            "destructiveHint": not read_only,
            "idempotentHint": read_only,
            "openWorldHint": True,
        },
    }


def _schema_of(tool: _ToolLike) -> dict[str, Any]:
    if isinstance(tool, Tool):
        return tool.schema
    if not isinstance(tool, Mapping):
        raise TypeError(f"expected a Tool or a tool schema mapping, got {type(tool).__name__}")
    name = tool.get("name")
    if not isinstance(name, str):
        raise ToolDefinitionError(f"a tool schema needs a string 'name', got {name!r}")
    if not isinstance(tool.get("description"), str):
        raise ToolDefinitionError(
            f"tool {name!r}: its schema needs a string 'description'", tool_name=name
        )
    parameters = tool.get("parameters")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"tool {name!r}: its schema needs 'parameters', a JSON Schema of type object",
            tool_name=name,
        )
    return copy.deepcopy(dict(tool))
