"""``ToolRegistry``: tools by name, for resolution and for the ``tools_schema`` a model is shown.

A registry is an ordinary value: build one where it is needed (the project keeps no
module-level registries) and hand it to ``AgentConfig(tool_registry=...)``. It pickles, since
Beam pickles the DoFns that hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

from beam_agents.tools._tool import Tool, ToolConnection
from beam_agents.tools.errors import ToolDefinitionError, ToolNotFoundError

_P = ParamSpec("_P")
_R = TypeVar("_R")


class ToolRegistry:
    """Tools keyed by their unique name, kept in registration order.

    ``name in registry`` and ``tool in registry`` both work (a Tool is in the registry when the
    registry holds an equal Tool under its name); ``len`` and iteration (in registration order,
    over Tools) too.
    """

    def __init__(self, tools: Iterable[Tool[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool[_P, _R]) -> Tool[_P, _R]:
        """Add ``tool`` and return it; a name already present raises ``ToolDefinitionError``."""
        if not isinstance(tool, Tool):
            raise TypeError(
                f"ToolRegistry.register takes a Tool (a function decorated with @tool), "
                f"got {type(tool).__name__}"
            )
        if tool.name in self._tools:
            raise ToolDefinitionError(
                f"a tool named {tool.name!r} is already registered; tool names must be unique "
                f"within a registry",
                tool_name=tool.name,
            )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool[..., Any]:
        """Return the tool registered as ``name``; else raise ``ToolNotFoundError`` naming it."""
        try:
            return self._tools[name]
        except (KeyError, TypeError):
            registered = ", ".join(self._tools) or "none"
            raise ToolNotFoundError(
                f"no tool named {name!r} in this registry (registered: {registered})",
                tool_name=name if isinstance(name, str) else repr(name),
            ) from None

    @property
    def tools_schema(self) -> list[dict[str, Any]]:
        """Every tool's ``schema``, in registration order; fresh copies the caller may change."""
        return [tool.schema for tool in self._tools.values()]

    def connections(self) -> list[ToolConnection]:
        """The distinct connections its tools need open (MCP sessions), in registration order."""
        found: dict[ToolConnection, None] = {}
        for tool in self._tools.values():
            connection = tool.connection
            if connection is not None:
                found.setdefault(connection, None)
        return list(found)

    def names(self) -> frozenset[str]:
        """Return the registered tool names."""
        return frozenset(self._tools)

    def merge(self, other: ToolRegistry) -> ToolRegistry:
        """Return a new registry with this one's tools, then ``other``'s; a shared name raises.

        Neither registry changes. A name registered in both raises ``ToolDefinitionError``
        naming it, even when both hold the same tool, so a merge never silently picks one.
        """
        if not isinstance(other, ToolRegistry):
            raise TypeError(f"ToolRegistry.merge takes a ToolRegistry, got {type(other).__name__}")
        return ToolRegistry([*self, *other])

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Tool):
            return self._tools.get(item.name) == item
        return isinstance(item, str) and item in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(list(self._tools.values()))

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"
