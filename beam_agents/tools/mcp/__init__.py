"""Tools from MCP servers: read-only ones run inline, side-effecting ones only in the effector.

Needs the ``[mcp]`` extra. See ``docs/tools.md``, "MCP tools".
"""

from beam_agents.tools.mcp._sessions import (
    McpConnectionError,
    McpError,
    McpResultError,
    McpServer,
    McpTimeoutError,
    McpToolError,
)
from beam_agents.tools.mcp._tools import INTENT_ID_META_KEY, McpTool, load_mcp_tools

__all__ = [
    "INTENT_ID_META_KEY",
    "McpConnectionError",
    "McpError",
    "McpResultError",
    "McpServer",
    "McpTimeoutError",
    "McpTool",
    "McpToolError",
    "load_mcp_tools",
]
