"""The effector executing MCP tools over its own session: results, errors, hangs, deaths.

An in-process effector serves a registry of the ticket server's tools (every one
side-effecting here, so the effector runs each) and records what each call came to.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from beam_agents import intent_id_for
from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    ToolIntent,
    ToolResult,
    canonical_json,
)
from beam_agents.tools import ToolRegistry
from beam_agents.tools.mcp import McpServer, load_mcp_tools
from beam_agents.tools.mcp._sessions import session_pool
from effector.client import AsyncEffectorClient
from effector.launch import running_server
from effector.server import ServerSettings
from effector.worker import WorkerSettings
from tests.mcp.conftest import RAW_SERVER, stdio_server

SETTINGS = ServerSettings(worker=WorkerSettings(poll_interval_ms=50, lease_ms=30_000))


def _intent(tool_name: str, key: str, **arguments: Any) -> ToolIntent:
    now = int(time.time() * 1000)
    return ToolIntent(
        intent_id=intent_id_for(key.encode(), 0, 0),
        entity_key=key.encode(),
        seq=0,
        step_index=0,
        tool_name=tool_name,
        args_json=canonical_json(arguments),
        created_at_ms=now,
        kind=ToolIntent.TOOL,
    )


@asynccontextmanager
async def _effector(tmp_path: Path, registry: ToolRegistry) -> AsyncIterator[AsyncEffectorClient]:
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    async with running_server(store, registry, SETTINGS) as server:
        client = AsyncEffectorClient(server.address)
        try:
            yield client
        finally:
            await client.close()


async def _results(
    client: AsyncEffectorClient, intents: list[ToolIntent], timeout_s: float = 30
) -> dict[str, GetIntentResponse]:
    acks = await client.submit(intents)
    assert all(ack.outcome == ack.ACCEPTED for ack in acks), acks
    deadline = time.monotonic() + timeout_s
    done: dict[str, GetIntentResponse] = {}
    while len(done) < len(intents):
        for intent in intents:
            answer = await client.get_intent(intent.intent_id)
            if answer.state == IntentState.DONE:
                done[intent.tool_name] = answer
        assert time.monotonic() < deadline, f"not all DONE: {sorted(done)}"
        await asyncio.sleep(0.05)
    return done


@pytest.mark.asyncio
async def test_the_effector_records_results_and_each_kind_of_failure(
    ticket_server: McpServer, ledger: Path, tmp_path: Path
) -> None:
    impatient = McpServer(**{**ticket_server.__dict__, "call_timeout_s": 1.0})
    try:
        registry = load_mcp_tools(impatient, side_effect=True)
        async with _effector(tmp_path, registry) as client:
            done = await _results(
                client,
                [
                    _intent("file_ticket", "k1", title="disk full", priority=1),
                    _intent("refuse", "k2", reason="nobody on call"),
                    _intent("protocol_error", "k3", reason="bad cursor"),
                    _intent("hang", "k4", seconds=30),
                    _intent("read_file", "k5", path="runbooks/web.md"),
                ],
            )
    finally:
        session_pool().forget(impatient)

    ticket = done["file_ticket"].result
    assert ticket.status == ToolResult.OK
    assert json.loads(ticket.payload) == {"ticket": "T-1", "priority": 1}
    with sqlite3.connect(ledger) as db:
        seen = db.execute("SELECT intent_id FROM calls").fetchall()
    assert seen == [(done["file_ticket"].intent.intent_id,)]  # the id travelled in _meta

    refused = done["refuse"].result
    assert refused.status == ToolResult.ERROR
    assert (
        "McpToolError" in refused.error_message
        and "refused: nobody on call" in refused.error_message
    )
    protocol = done["protocol_error"].result
    assert protocol.status == ToolResult.ERROR and "code -32602" in protocol.error_message
    hung = done["hang"].result
    assert hung.status == ToolResult.ERROR
    assert "McpTimeoutError" in hung.error_message and "within 1 s" in hung.error_message
    text = done["read_file"].result
    assert text.status == ToolResult.OK
    assert json.loads(text.payload) == {"result": "Roll back the last deploy."}


@pytest.mark.asyncio
async def test_a_server_that_dies_under_a_call_is_recorded_and_restarted(
    ledger: Path, tmp_path: Path
) -> None:
    server = stdio_server(ledger)
    try:
        registry = load_mcp_tools(server, side_effect=True)
        async with _effector(tmp_path, registry) as client:
            before = await _results(client, [_intent("pid", "a")])
            died = await _results(client, [_intent("die", "b")])
            after = await _results(client, [_intent("pid", "c")])
    finally:
        session_pool().forget(server)

    assert died["die"].result.status == ToolResult.ERROR
    assert "McpConnectionError" in died["die"].result.error_message
    first, second = (json.loads(r["pid"].result.payload)["result"] for r in (before, after))
    assert first != second  # a new server process answered after the death


@pytest.mark.asyncio
async def test_a_malformed_answer_is_recorded_as_an_error(tmp_path: Path) -> None:
    server = McpServer.stdio(sys.executable, [RAW_SERVER], call_timeout_s=5)
    try:
        registry = load_mcp_tools(server, side_effect=True)
        async with _effector(tmp_path, registry) as client:
            done = await _results(client, [_intent("crooked", "m", n=2)])
    finally:
        session_pool().forget(server)

    result = done["crooked"].result
    assert result.status == ToolResult.ERROR
    assert "McpResultError" in result.error_message
    assert "malformed result: content: Input should be a valid list" in result.error_message
