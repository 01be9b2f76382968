"""A real MCP server (the SDK's ``MCPServer``) for the tests: files to read, tickets to file.

Run as ``python ticket_server.py stdio`` or ``python ticket_server.py http`` (prints
``ready PORT`` once listening on 127.0.0.1). ``TICKET_LEDGER`` names a SQLite file recording
every ``file_ticket`` call with the intent id it carried in ``_meta`` and every ticket filed;
with ``TICKET_DEDUP=1`` a call whose intent id already filed a ticket files nothing and
answers as before. While ``TICKET_HOLD`` names a file that exists, ``file_ticket`` waits after
filing, before answering (so a test can kill the effector between the effect and its record).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations

INTENT_ID_META_KEY = "beam_agents/intent_id"
FILES = {
    "runbooks/db.md": "Restart the primary, then page the database on-call.",
    "runbooks/web.md": "Roll back the last deploy.",
}
READ_ONLY = ToolAnnotations(read_only_hint=True)

server = MCPServer("tickets")


def _ledger() -> sqlite3.Connection:
    connection = sqlite3.connect(os.environ.get("TICKET_LEDGER", ":memory:"), timeout=30)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY, intent_id TEXT, title TEXT)"
    )
    connection.execute(
        "CREATE TABLE IF NOT EXISTS tickets (n INTEGER PRIMARY KEY, intent_id TEXT, title TEXT)"
    )
    return connection


@server.tool(annotations=READ_ONLY)
def read_file(path: str) -> str:
    """Read a runbook by its path."""
    if path not in FILES:
        raise ValueError(f"no such file: {path}")
    return FILES[path]


@server.tool(annotations=READ_ONLY)
def list_files(prefix: str = "") -> dict[str, Any]:
    """List the runbooks whose path starts with prefix."""
    return {"paths": sorted(path for path in FILES if path.startswith(prefix))}


@server.tool()
async def file_ticket(title: str, ctx: Context, priority: int = 3) -> dict[str, Any]:
    """File a ticket (destructive: it pages people)."""
    meta = ctx.request_context.meta or {}
    intent_id = str(meta.get(INTENT_ID_META_KEY, ""))
    with _ledger() as ledger:
        ledger.execute("INSERT INTO calls (intent_id, title) VALUES (?, ?)", (intent_id, title))
        known = ledger.execute(
            "SELECT n FROM tickets WHERE intent_id = ? AND intent_id != ''", (intent_id,)
        ).fetchone()
        if known is None or os.environ.get("TICKET_DEDUP") != "1":
            number = ledger.execute(
                "INSERT INTO tickets (intent_id, title) VALUES (?, ?)", (intent_id, title)
            ).lastrowid
        else:
            number = known[0]
    hold = os.environ.get("TICKET_HOLD")
    while hold and os.path.exists(hold):
        await asyncio.sleep(0.05)
    return {"ticket": f"T-{number}", "priority": priority}


@server.tool()
def refuse(reason: str) -> CallToolResult:
    """Answer with an isError result."""
    return CallToolResult(content=[TextContent(text=f"refused: {reason}")], is_error=True)


@server.tool(annotations=READ_ONLY)
def protocol_error(reason: str) -> str:
    """Answer with a JSON-RPC error rather than a result."""
    raise MCPError(code=INVALID_PARAMS, message=f"protocol error: {reason}")


@server.tool(annotations=READ_ONLY)
def classify(intent: str, limit: int | None = None) -> dict[str, Any]:
    """Classify a customer's intent (a parameter named like the effector's own)."""
    return {"intent": intent, "limit": limit}


@server.tool(annotations=READ_ONLY)
async def hang(seconds: float) -> str:
    """Sleep for seconds, then answer."""
    await asyncio.sleep(seconds)
    return "awake"


@server.tool(annotations=READ_ONLY)
def die() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool(annotations=READ_ONLY)
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool(annotations=READ_ONLY)
async def add_tool(name: str, ctx: Context, repeat: bool = False) -> str:
    """Offer one more tool (or offer it again with a ``times`` argument); notify clients."""

    def shout(text: str) -> str:
        return text.upper()

    def shout_times(text: str, times: int) -> str:
        return text.upper() * times

    if name in {tool.name for tool in await server.list_tools()}:
        server.remove_tool(name)
    chosen = shout_times if repeat else shout
    server.add_tool(chosen, name=name, description="Shout the text.", annotations=READ_ONLY)
    await ctx.notify_tools_changed()
    return name


def _serve_http() -> None:
    import uvicorn

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(os.environ.get("TICKET_PORT", "0"))))
    listener.listen(128)
    print(f"ready {listener.getsockname()[1]}", flush=True)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        _serve_http()
    else:
        server.run("stdio")
