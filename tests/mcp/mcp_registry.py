"""The ticket server's tools as a registry, for an effector started with ``--tools``.

``beam-agents-effector serve --tools tests.mcp.mcp_registry:REGISTRY`` loads the tools of
``tests/mcp/ticket_server.py`` with ``load_mcp_tools``, reaching the server as the environment
says (the test sets it for the effector process):

- ``MCP_TICKETS_TRANSPORT``: ``stdio`` (the effector spawns its own server) or ``http``;
- ``MCP_TICKETS_URL``: the server's streamable HTTP endpoint, for ``http``;
- ``TICKET_LEDGER``, ``TICKET_HOLD``, ``TICKET_DEDUP``: passed on to a stdio server (whose
  environment is otherwise minimal); an HTTP server got them when the test started it.

``REGISTRY`` is built on first access, so the tests can import :func:`ticket_server` from here
without connecting to anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from beam_agents.tools import ToolRegistry
from beam_agents.tools.mcp import McpServer, load_mcp_tools

TRANSPORT_ENV = "MCP_TICKETS_TRANSPORT"
URL_ENV = "MCP_TICKETS_URL"
SERVER_ENV = ("TICKET_LEDGER", "TICKET_HOLD", "TICKET_DEDUP")
"""What a stdio ticket server is given from the environment of the process that spawns it."""
SCRIPT = str(Path(__file__).resolve().parent / "ticket_server.py")
REGISTRY_SPEC = f"{__name__}:REGISTRY"
"""What ``--tools`` is given to load :data:`REGISTRY`."""


def ticket_server(
    transport: str, *, url: str = "", env: Mapping[str, str] | None = None
) -> McpServer:
    """The ticket server over ``transport``: spawned with ``env`` (stdio), or at ``url``."""
    if transport == "stdio":
        return McpServer.stdio(sys.executable, [SCRIPT, "stdio"], env=dict(env or {}))
    if transport == "http":
        return McpServer.http(url)
    raise ValueError(f"unknown transport {transport!r}")


def server_from_env() -> McpServer:
    """The ticket server this process's environment describes (see the module docstring)."""
    transport = os.environ.get(TRANSPORT_ENV, "stdio")
    forwarded = {name: os.environ[name] for name in SERVER_ENV if name in os.environ}
    return ticket_server(transport, url=os.environ.get(URL_ENV, ""), env=forwarded)


def __getattr__(name: str) -> ToolRegistry:
    if name == "REGISTRY":
        return load_mcp_tools(server_from_env())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
