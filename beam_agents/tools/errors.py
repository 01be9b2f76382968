"""The errors ``beam_agents.tools`` raises; each carries the ``tool_name`` it concerns."""

from __future__ import annotations

from collections.abc import Sequence


class ToolError(Exception):
    """Base class of every tool error."""

    def __init__(self, message: str, *, tool_name: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name


class ToolDefinitionError(ToolError):
    """A tool cannot be defined or registered as written (raised at decoration/registration)."""

    def __init__(
        self, message: str, *, tool_name: str | None = None, parameter: str | None = None
    ) -> None:
        super().__init__(message, tool_name=tool_name)
        self.parameter = parameter


class ToolNotFoundError(ToolError, LookupError):
    """A registry was asked for a tool name it does not hold."""


class ToolArgumentError(ToolError, ValueError):
    """Arguments failed a tool's argument model; the tool was not invoked.

    ``problems`` lists every failing field as ``(location, message)`` pairs, where the location
    is the dotted path of the argument (``"address.zip"``, ``"items.0"``).
    """

    def __init__(
        self,
        message: str,
        *,
        tool_name: str | None = None,
        problems: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message, tool_name=tool_name)
        self.problems = tuple(problems)


class SideEffectToolError(ToolError):
    """A side-effecting tool was asked to run somewhere other than the effector."""

    @classmethod
    def for_tool(cls, tool_name: str) -> SideEffectToolError:
        """Build the refusal for ``tool_name``, pointing at ``ctx.act(...)``, the working path."""
        return cls(
            f"tool {tool_name!r} has side effects and never runs inside the pipeline, where a "
            f"retried bundle would perform it again; request it with "
            f"ctx.act({tool_name!r}, arguments) so the effector executes it once per intent",
            tool_name=tool_name,
        )
