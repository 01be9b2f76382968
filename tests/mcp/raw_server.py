"""An MCP server over stdio written by hand, to answer what the SDK would never send.

It speaks the 2025-06-18 handshake, lists ``garbled`` (read-only) and ``crooked``
(side-effecting), and answers every ``tools/call`` with a result whose ``content`` is not a
list: malformed. Any other request gets a JSON-RPC "method not found".
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {
        "name": "garbled",
        "description": "Answers with a malformed result.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "crooked",
        "description": "Answers with a malformed result, and has side effects.",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
]


def _answer(request: dict) -> dict | None:
    method, ident = request.get("method"), request.get("id")
    if ident is None:
        return None  # a notification
    if method == "initialize":
        result: dict = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = {"content": "this should have been a list", "isError": "maybe"}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = _answer(json.loads(line))
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
