"""An MCP server for ``mcp_tickets.py``: runbooks to read (read-only) and tickets to file.

Written with the ``mcp`` SDK, run over stdio by whoever connects (``McpServer.stdio``).
``read_runbook`` and ``list_runbooks`` are annotated ``readOnlyHint``; ``file_ticket`` is not,
so beam-agents treats it as side-effecting. ``file_ticket`` deduplicates on the intent id the
effector sends in ``_meta`` (``beam_agents/intent_id``), so even a re-execution after a crash
files one ticket. Tickets live in the SQLite file named by ``TICKETS_DB``.
"""

from __future__ import annotations

import os
import sqlite3

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

RUNBOOKS = {
    "db": "Database latency: fail over to the replica, then page the database on-call.",
    "web": "Web errors: roll back the last deploy, then page the web on-call.",
}
READ_ONLY = ToolAnnotations(read_only_hint=True)

server = MCPServer("tickets")


@server.tool(annotations=READ_ONLY, structured_output=False)
def read_runbook(service: str) -> str:
    """The runbook for a service."""
    if service not in RUNBOOKS:
        raise ValueError(f"no runbook for {service!r}")
    return RUNBOOKS[service]


@server.tool(annotations=READ_ONLY)
def list_runbooks() -> list[str]:
    """The services that have a runbook."""
    return sorted(RUNBOOKS)


@server.tool()
def file_ticket(service: str, summary: str, ctx: Context) -> dict[str, str]:
    """File a ticket for the service's on-call (pages a person)."""
    intent_id = str((ctx.request_context.meta or {}).get("beam_agents/intent_id", ""))
    with sqlite3.connect(os.environ["TICKETS_DB"]) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS tickets (n INTEGER PRIMARY KEY, intent_id TEXT UNIQUE,"
            " service TEXT, summary TEXT)"
        )
        db.execute(
            "INSERT OR IGNORE INTO tickets (intent_id, service, summary) VALUES (?, ?, ?)",
            (intent_id or None, service, summary),
        )
        (number,) = db.execute(
            "SELECT n FROM tickets WHERE intent_id = ? OR (? = '' AND n = last_insert_rowid())",
            (intent_id, intent_id),
        ).fetchone()
    return {"ticket": f"OPS-{number}", "service": service}


if __name__ == "__main__":
    server.run("stdio")
