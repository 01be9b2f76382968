"""``ToolRunner``: the inline fast path for read-only tools.

``await ToolRunner().run(tool, arguments)`` refuses a side-effecting tool, validates the
arguments in Pydantic's lax mode (``"5"`` for an ``int`` parameter arrives as ``5``), calls the
tool and awaits its result if it is awaitable. See ``beam_agents/tools/README.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from beam_agents.tools._tool import Tool
from beam_agents.tools.errors import SideEffectToolError


class ToolRunner:
    """Runs ``side_effect=False`` tools inline: refuse side effects, validate, call, await."""

    async def run(self, tool: Tool[..., Any], arguments: Mapping[str, Any]) -> Any:
        """Validate ``arguments`` and run the read-only ``tool``; return its (awaited) result."""
        if not isinstance(tool, Tool):
            raise TypeError(f"ToolRunner.run takes a Tool, got {type(tool).__name__}")
        if tool.side_effect:
            raise SideEffectToolError.for_tool(tool.name)
        result = tool(**tool.validate_arguments(arguments))
        if inspect.isawaitable(result):
            return await result
        return result
