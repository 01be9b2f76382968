"""The operator MCP endpoint (``serve --mcp-listen``) driven by the MCP SDK's own client.

An assistant lists pending approvals, approves and denies them with a reason and reads intents
over streamable HTTP on 127.0.0.1; decisions go through the effector's one decision path and
record the identity configured for the token. Requests without the token are refused with 401,
a non-loopback endpoint without a token is refused at startup, and an effector without the
endpoint never imports ``mcp``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from conftest import sqlite_url
from effector_harness import (
    FAST_WORKER,
    TOOLS,
    EffectorProcess,
    cli_environment,
    make_intent,
    run_cli,
    running_effector,
    wait_done,
)
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from beam_agents._protos import IntentState, SubmitAck, ToolIntent, ToolResult
from effector import launch
from effector.client import AsyncEffectorClient
from effector.launch import MCP_PREFIX
from effector.server import ServerSettings
from effector.store.errors import ConfigurationError

TOKEN = "operator-token"
IDENTITY = "ops-assistant"


@asynccontextmanager
async def mcp_client(
    url: str, token: str | None, statuses: list[int] | None = None
) -> AsyncIterator[Client]:
    """The SDK's client on ``url`` over streamable HTTP, sending ``Bearer token`` if given.

    The HTTP status of every response is appended to ``statuses``, if given.
    """
    headers = {} if token is None else {"authorization": f"Bearer {token}"}

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    hooks = {"response": [record]}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30, event_hooks=hooks) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call ``tool``; its structured result, which must not be an error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    text = result.content[0]
    assert text.type == "text" and json.loads(text.text) == result.structured_content
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """Call ``tool``, which must answer a tool error; the error's text."""
    result: CallToolResult = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    [content] = result.content
    assert content.type == "text"
    return content.text


def mcp_url_of(effector: launch.EffectorProcess) -> str:
    """The endpoint's URL, which ``serve`` prints right after its ready line."""
    assert effector.process.stdout is not None
    line = effector.process.stdout.readline()
    assert line.startswith(MCP_PREFIX), line
    return line.strip().removeprefix(MCP_PREFIX)


def test_an_assistant_lists_approves_denies_and_reads_intents(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    store = sqlite_url(tmp_path / "s.db")
    serve = ["--tools", TOOLS, "--store", store, "--listen", "127.0.0.1:0"]
    mcp = ["--mcp-listen", "127.0.0.1:0", "--mcp-identity", IDENTITY]
    with EffectorProcess(*serve, *mcp, "--token-file", str(token_file)) as effector:
        url = mcp_url_of(effector)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        asyncio.run(_operate(effector.address, url))
        effector.signal(signal.SIGTERM)
        assert effector.wait() == 0
        log = effector.stderr()
    assert "effector stopped" in log and "Traceback" not in log, log
    assert TOKEN not in log


async def _operate(address: str, url: str) -> None:
    ship = make_intent("ship", {"order": 7}, key=b"alice", kind=ToolIntent.APPROVAL)
    refund = make_intent("refund", {"amount": 900}, key=b"bob", kind=ToolIntent.APPROVAL)
    added = make_intent("add", {"a": 2, "b": 3}, key=b"carol")
    failing = make_intent("fail", {"message": "the till is closed"}, key=b"dave")
    grpc_client = AsyncEffectorClient(address, token=TOKEN)
    try:
        acks = await grpc_client.submit([ship, refund, added, failing])
        assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
        await wait_done(grpc_client, [added.intent_id, failing.intent_id])
        async with mcp_client(url, TOKEN) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"list_pending_approvals", "approve", "deny", "intent_status"}
            assert tools["approve"].input_schema["required"] == ["intent_id", "reason"]
            assert tools["intent_status"].output_schema is not None

            pending = await call(client, "list_pending_approvals", limit=10)
            assert pending["pending"] == 2
            by_id = {approval["intent_id"]: approval for approval in pending["approvals"]}
            assert set(by_id) == {ship.intent_id, refund.intent_id}
            assert by_id[refund.intent_id]["entity_key"] == "bob"
            assert by_id[refund.intent_id]["tool"] == "refund"
            assert by_id[refund.intent_id]["args"] == {"amount": 900}
            assert by_id[refund.intent_id]["deadline_ms"] == 0
            one = await call(client, "list_pending_approvals", limit=1)
            assert [a["intent_id"] for a in one["approvals"]] == list(by_id)[:1]  # oldest
            assert one["pending"] == 2

            approved = await call(client, "approve", intent_id=ship.intent_id, reason="paid")
            assert approved["decision"] == "approved" and approved["approved"] is True
            assert (approved["approver"], approved["reason"]) == (IDENTITY, "paid")
            denied = await call(client, "deny", intent_id=refund.intent_id, reason="too much")
            assert denied["decision"] == "denied" and denied["approved"] is False
            assert (denied["approver"], denied["reason"]) == (IDENTITY, "too much")
            assert (await call(client, "list_pending_approvals"))["approvals"] == []

            status = await call(client, "intent_status", intent_id=ship.intent_id)
            assert (status["kind"], status["state"]) == ("APPROVAL", "DONE")
            assert (status["tool"], status["args"], status["entity_key"]) == (
                "ship",
                {"order": 7},
                "alice",
            )
            assert status["decision"] == {
                "approved": True,
                "approver": IDENTITY,
                "reason": "paid",
                "decided_at_ms": approved["decided_at_ms"],
            }
            assert status["result"]["status"] == "OK"
            assert status["result"]["payload"]["approver"] == IDENTITY
            denied_status = await call(client, "intent_status", intent_id=refund.intent_id)
            assert denied_status["decision"]["approved"] is False

            tool_status = await call(client, "intent_status", intent_id=added.intent_id)
            assert (tool_status["kind"], tool_status["state"]) == ("TOOL", "DONE")
            assert tool_status["tool"] == "add" and tool_status["args"] == {"a": 2, "b": 3}
            assert tool_status["decision"] is None and tool_status["attempts"] == 1
            assert tool_status["result"]["status"] == "OK"
            assert tool_status["result"]["payload"] == 5 and tool_status["result"]["error"] is None
            failed = await call(client, "intent_status", intent_id=failing.intent_id)
            assert failed["result"]["status"] == "ERROR"
            assert "the till is closed" in failed["result"]["error"]

            again = await refused(client, "deny", intent_id=ship.intent_id, reason="changed")
            assert "already approved" in again and IDENTITY in again
            not_approval = await refused(client, "approve", intent_id=added.intent_id, reason="x")
            assert "not an approval" in not_approval
            unknown = str(uuid.uuid4())
            assert "no intent" in await refused(client, "intent_status", intent_id=unknown)
            assert "no intent" in await refused(client, "approve", intent_id=unknown, reason="x")
            assert "not a UUID" in await refused(client, "intent_status", intent_id="nope")
            assert "reason" in await refused(client, "approve", intent_id=ship.intent_id)
            assert "reason" in await refused(client, "deny", intent_id=refund.intent_id, reason=" ")
            assert "limit" in await refused(client, "list_pending_approvals", limit=0)
            assert "unknown tool" in await refused(client, "delete_everything")

        # What the endpoint decided is what gRPC reads back: approver, reason and decision.
        for intent, verdict, reason in ((ship, True, "paid"), (refund, False, "too much")):
            recorded = await grpc_client.get_intent(intent.intent_id)
            assert recorded.state == IntentState.DONE
            assert recorded.result.status == ToolResult.OK
            decision = json.loads(recorded.result.payload)
            assert (decision["approved"], decision["approver"], decision["reason"]) == (
                verdict,
                IDENTITY,
                reason,
            )
    finally:
        await grpc_client.close()


@pytest.mark.asyncio
async def test_requests_without_the_token_or_with_a_wrong_one_are_refused(
    tmp_path: Path,
) -> None:
    settings = ServerSettings(worker=FAST_WORKER, token=TOKEN, mcp_listen="127.0.0.1:0")
    waiting = make_intent("ship", {"order": 1}, key=b"k", kind=ToolIntent.APPROVAL)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        url = effector.server.mcp_url
        assert url == f"http://127.0.0.1:{effector.server.mcp_port}/mcp"
        await effector.client.submit([waiting])
        approve = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "approve", "arguments": {"intent_id": waiting.intent_id}},
        }
        headers = {"accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(timeout=30) as http:
            for authorization in (None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, "Basic x"):
                sent = dict(headers)
                if authorization is not None:
                    sent["authorization"] = authorization
                answer = await http.post(url, json=approve, headers=sent)
                assert answer.status_code == 401, (authorization, answer.text)
                assert answer.headers["www-authenticate"].startswith("Bearer")
        for wrong in (None, "wrong"):
            statuses: list[int] = []
            with pytest.raises(BaseExceptionGroup) as failure:
                async with mcp_client(url, wrong, statuses) as client:
                    await client.list_tools()
            assert failure.group_contains(MCPError)  # the SDK's client cannot even connect
            assert statuses and set(statuses) == {401}
        recorded = await effector.client.get_intent(waiting.intent_id)
        assert recorded.state == IntentState.AWAITING_DECISION  # nothing was decided
        async with mcp_client(url, TOKEN) as client:
            status = await call(client, "intent_status", intent_id=waiting.intent_id)
            assert status["state"] == "AWAITING_DECISION" and status["decision"] is None
            decided = await call(client, "approve", intent_id=waiting.intent_id, reason="ok")
            assert decided["approver"] == "mcp-operator"  # the default identity
    assert effector.server.mcp_url is None  # stopped with the effector


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
async def test_without_a_token_a_loopback_endpoint_needs_none(tmp_path: Path, host: str) -> None:
    settings = ServerSettings(worker=FAST_WORKER, mcp_listen=f"{host}:0", mcp_identity="ann")
    waiting = make_intent("", {"amount": 3}, key=b"k", kind=ToolIntent.APPROVAL)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        url = effector.server.mcp_url
        assert url is not None
        await effector.client.submit([waiting])
        async with mcp_client(url, None) as client:
            denied = await call(client, "deny", intent_id=waiting.intent_id, reason="no")
            assert (denied["approver"], denied["decision"]) == ("ann", "denied")
        # On loopback the SDK refuses a foreign Host (DNS rebinding), token or not.
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(url, json={}, headers={"host": "attacker.example"})
            assert answer.status_code in (403, 421), answer.text


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "mcp.example"])
def test_a_non_loopback_endpoint_needs_a_token(host: str) -> None:
    with pytest.raises(ConfigurationError, match="refusing to serve the MCP endpoint on non-loop"):
        ServerSettings(mcp_listen=f"{host}:8080").check()
    ServerSettings(mcp_listen=f"{host}:8080", token="t").check()
    with pytest.raises(ConfigurationError, match="whoever reaches it can approve"):
        ServerSettings(mcp_listen=f"{host}:8080", allow_insecure_bind=True).check()
    ServerSettings(mcp_listen="localhost:8080").check()
    with pytest.raises(ConfigurationError, match="MCP identity"):
        ServerSettings(mcp_listen="127.0.0.1:0", mcp_identity=" ").check()


def test_the_command_line_refuses_a_non_loopback_endpoint_without_a_token(
    tmp_path: Path,
) -> None:
    result = run_cli(
        "serve",
        "--tools",
        TOOLS,
        "--store",
        sqlite_url(tmp_path / "s.db"),
        "--listen",
        "127.0.0.1:0",
        "--mcp-listen",
        "0.0.0.0:0",
    )
    assert result.returncode == 2
    assert "refusing to serve the MCP endpoint on non-loopback '0.0.0.0'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()  # refused before the store was opened
    help_text = " ".join(run_cli("serve", "--help").stdout.split())
    for flag in ("--mcp-listen", "BEAM_AGENTS_EFFECTOR_MCP_LISTEN", "--mcp-identity"):
        assert flag in help_text
    assert "identity configured for the token" in help_text


def test_without_the_mcp_package_the_endpoint_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # what an interpreter without it finds
    with pytest.raises(ConfigurationError, match=r"pip install 'beam-agents\[console\]'"):
        ServerSettings(mcp_listen="127.0.0.1:0").check()
    ServerSettings().check()


def test_an_effector_without_the_endpoint_never_imports_mcp(tmp_path: Path) -> None:
    probe = (
        "import asyncio, sys\n"
        "from effector_test_tools import make_registry\n"
        "from effector.cli import main\n"
        "from effector.launch import running_server\n"
        "from effector.server import ServerSettings\n"
        "async def serve():\n"
        f"    async with running_server('sqlite:///{tmp_path / 's.db'}', make_registry(),\n"
        "                              ServerSettings()) as server:\n"
        "        assert server.mcp_url is None and server.mcp_port is None\n"
        "asyncio.run(serve())\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types'))\n"
        "loaded += [m for m in sys.modules if m.startswith('effector.console')]\n"
        "print(loaded or 'ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=cli_environment(),
        timeout=120,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
