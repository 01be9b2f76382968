"""The errors MCP tools raise; each is a ``ToolError`` naming the tool (or server) concerned."""

from __future__ import annotations

from beam_agents.tools.errors import ToolError


class McpError(ToolError):
    """Base class of the errors an MCP tool call or listing raises."""


class McpConnectionError(McpError, ConnectionError):
    """The server could not be reached, or the connection broke during the call.

    ``sent`` tells whether the request had gone out: a call that was never sent is safe to
    make again; one that was may have run.
    """

    def __init__(self, message: str, *, tool_name: str | None = None, sent: bool = False) -> None:
        super().__init__(message, tool_name=tool_name)
        self.sent = sent


class McpTimeoutError(McpError, TimeoutError):
    """The server did not answer within the call's time limit (the session stays usable)."""


class McpToolError(McpError):
    """The server ran the tool and reported failure (an ``isError`` result or a JSON-RPC error).

    ``content`` is the text the server returned with the failure.
    """

    def __init__(self, message: str, *, tool_name: str | None = None, content: str = "") -> None:
        super().__init__(message, tool_name=tool_name)
        self.content = content


class McpResultError(McpError):
    """The server's answer is not a valid MCP result (malformed, or off its output schema)."""
