"""``ToolRunner``: the inline fast path for read-only tools.

``await ToolRunner().run(tool, arguments)`` refuses a side-effecting tool before anything else
(``SideEffectToolError``; it is never validated nor invoked), validates the arguments with the
tool's argument model, calls the tool, and awaits the result if it is awaitable (an
``async def`` tool, or a sync tool returning an awaitable).

Validation is Pydantic's lax mode: unambiguous conversions are made (``"5"`` for an ``int``
parameter arrives as ``5``, ``"red"`` as the matching enum member, a dict as the nested model),
and anything else raises ``ToolArgumentError`` listing every failing field, without the tool
being called. Exceptions the tool itself raises propagate unchanged.
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
