"""MCP tools in the registry: import, classification, validation, inline calls and failures.

Every test talks to a real MCP server (``ticket_server.py``, the SDK's ``MCPServer``) over
stdio and over streamable HTTP on 127.0.0.1, or to ``raw_server.py`` for malformed answers.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from beam_agents.tools import IntentInfo, ToolRegistry, ToolRunner, tool
from beam_agents.tools.errors import (
    SideEffectToolError,
    ToolArgumentError,
    ToolDefinitionError,
)
from beam_agents.tools.mcp import (
    INTENT_ID_META_KEY,
    McpConnectionError,
    McpResultError,
    McpServer,
    McpTimeoutError,
    McpTool,
    McpToolError,
    load_mcp_tools,
)
from beam_agents.tools.mcp._sessions import session_pool
from tests.mcp.conftest import RAW_SERVER, HttpServerProcess, stdio_server

READ_ONLY = {
    "read_file",
    "list_files",
    "hang",
    "die",
    "pid",
    "add_tool",
    "protocol_error",
    "classify",
}


def _run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def _inline(registry: ToolRegistry, name: str, /, **arguments: object) -> object:
    return _run(ToolRunner().run(registry.get(name), arguments))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_tools_are_listed_with_the_servers_schema_and_classified(ticket_server: McpServer) -> None:
    registry = load_mcp_tools(ticket_server)

    assert {t.name for t in registry} >= READ_ONLY | {"file_ticket", "refuse"}
    assert {t.name for t in registry if not t.side_effect} == READ_ONLY
    file_ticket = registry.get("file_ticket")
    assert isinstance(file_ticket, McpTool)
    schema = file_ticket.schema
    assert schema["description"] == "File a ticket (destructive: it pages people)."
    assert schema["parameters"]["required"] == ["title"]
    assert schema["parameters"]["properties"]["priority"]["type"] == "integer"
    assert any(entry["name"] == "file_ticket" for entry in registry.tools_schema)


def test_the_listing_is_fetched_once_per_process(ticket_server: McpServer) -> None:
    first = load_mcp_tools(ticket_server)
    version = session_pool().catalog[ticket_server][0]
    second = load_mcp_tools(ticket_server)

    assert session_pool().catalog[ticket_server][0] == version
    assert list(first) == list(second)


def test_side_effect_overrides_per_tool_and_for_all(ticket_server: McpServer) -> None:
    registry = load_mcp_tools(ticket_server, side_effect={"read_file": True, "refuse": False})
    assert registry.get("read_file").side_effect
    assert not registry.get("refuse").side_effect
    assert registry.get("file_ticket").side_effect

    everything = load_mcp_tools(ticket_server, side_effect=True)
    assert all(t.side_effect for t in everything)

    with pytest.raises(ToolDefinitionError, match="does not offer: fle_ticket"):
        load_mcp_tools(ticket_server, side_effect={"fle_ticket": False})


def test_registries_merge_with_decorated_tools_and_collisions_are_refused(
    ticket_server: McpServer,
) -> None:
    @tool
    def score(account: str) -> int:
        """Score an account."""
        return len(account)

    @tool
    def read_file(path: str) -> str:
        """A local reader with the MCP tool's name."""
        return path

    merged = ToolRegistry([score]).merge(load_mcp_tools(ticket_server))
    assert "score" in merged and "file_ticket" in merged
    with pytest.raises(ToolDefinitionError, match="read_file"):
        ToolRegistry([read_file]).merge(load_mcp_tools(ticket_server))
    prefixed = ToolRegistry([read_file]).merge(load_mcp_tools(ticket_server, prefix="tickets_"))
    assert prefixed.get("tickets_read_file").remote_name == "read_file"  # type: ignore[attr-defined]


def test_arguments_are_validated_at_act_time_with_the_schemas_model(
    ticket_server: McpServer,
) -> None:
    file_ticket = load_mcp_tools(ticket_server).get("file_ticket")

    assert file_ticket.validate_arguments({"title": "db down", "priority": "2"}) == {
        "title": "db down",
        "priority": 2,
    }
    assert file_ticket.validate_arguments({"title": "db down"}) == {"title": "db down"}
    # A null for an optional argument that cannot be null means "leave it out", as for @tool.
    assert file_ticket.validate_arguments({"title": "x", "priority": None}) == {"title": "x"}
    with pytest.raises(ToolArgumentError) as missing:
        file_ticket.validate_arguments({"priority": 1})
    assert missing.value.problems[0][0] == "title"
    with pytest.raises(ToolArgumentError, match="priority"):
        file_ticket.validate_arguments({"title": "x", "priority": "high"})


def test_read_only_calls_run_inline_and_return_text_or_structured_content(
    ticket_server: McpServer,
) -> None:
    registry = load_mcp_tools(ticket_server)

    runbook = _inline(registry, "read_file", path="runbooks/db.md")
    assert runbook == {"result": "Restart the primary, then page the database on-call."}
    assert _inline(registry, "list_files", prefix="runbooks/w") == {"paths": ["runbooks/web.md"]}


def test_a_parameter_named_intent_reaches_the_server_under_its_name(
    ticket_server: McpServer,
) -> None:
    registry = load_mcp_tools(ticket_server)

    assert _inline(registry, "classify", intent="refund") == {"intent": "refund", "limit": None}
    assert _inline(registry, "classify", intent="refund", limit=None) == {
        "intent": "refund",
        "limit": None,  # nullable here: the null is a value and is sent
    }


def test_a_side_effecting_tool_never_runs_inline(ticket_server: McpServer, ledger: Path) -> None:
    file_ticket = load_mcp_tools(ticket_server).get("file_ticket")

    with pytest.raises(SideEffectToolError):
        _run(ToolRunner().run(file_ticket, {"title": "nope"}))
    with pytest.raises(SideEffectToolError):
        file_ticket(title="nope")
    assert not ledger.exists() or _ledger_rows(ledger, "calls") == []


def test_the_effectors_entry_sends_the_intent_id_in_meta(
    ticket_server: McpServer, ledger: Path
) -> None:
    file_ticket = load_mcp_tools(ticket_server).get("file_ticket")
    assert file_ticket.accepts_intent
    intent = IntentInfo(intent_id="intent-7", entity_key=b"k", seq=1, step_index=0, attempt=1)

    result = _run(
        file_ticket.unwrap()(intent=intent, **file_ticket.validate_arguments({"title": "a"}))
    )

    assert result == {"ticket": "T-1", "priority": 3}
    assert _ledger_rows(ledger, "calls") == [("intent-7", "a")]
    assert INTENT_ID_META_KEY == "beam_agents/intent_id"


def test_server_errors_and_is_error_results_raise_typed_errors(ticket_server: McpServer) -> None:
    registry = load_mcp_tools(ticket_server, side_effect={"refuse": False})

    with pytest.raises(McpToolError) as refused:
        _inline(registry, "refuse", reason="not today")
    assert refused.value.content == "refused: not today"
    assert refused.value.tool_name == "refuse"
    hostile = "line 1\nline 2\r\n\x1b[31mred\x1b[0m \x00 \u202eevil\u202c \t end"
    with pytest.raises(McpToolError) as refused:  # control characters stay data, unchanged
        _inline(registry, "refuse", reason=hostile)
    assert refused.value.content == f"refused: {hostile}"
    assert str(refused.value).endswith(f"failed: refused: {hostile}")
    with pytest.raises(McpToolError, match="read_file"):
        _inline(registry, "read_file", path="no/such/file")
    with pytest.raises(McpToolError, match=r"refused tool 'protocol_error'.*code -32602"):
        _inline(registry, "protocol_error", reason="bad cursor")  # a JSON-RPC error
    # The session survives both and answers the next call.
    assert _inline(registry, "list_files") == {"paths": ["runbooks/db.md", "runbooks/web.md"]}


def test_a_hanging_server_times_out_and_the_session_stays_usable(ticket_server: McpServer) -> None:
    impatient = McpServer(**{**ticket_server.__dict__, "call_timeout_s": 0.5})
    try:
        registry = load_mcp_tools(impatient)
        started = time.monotonic()
        with pytest.raises(McpTimeoutError, match=r"did not answer within 0\.5 s"):
            _inline(registry, "hang", seconds=30)
        assert time.monotonic() - started < 5
        assert _inline(registry, "hang", seconds=0) == {"result": "awake"}
    finally:
        session_pool().forget(impatient)


def test_a_dead_stdio_server_is_restarted_by_the_next_call(ledger: Path) -> None:
    server = stdio_server(ledger)
    try:
        registry = load_mcp_tools(server)
        first = _inline(registry, "pid")
        with pytest.raises(McpConnectionError, match="closed"):
            _inline(registry, "die")
        second = _inline(registry, "pid")
        assert first != second
    finally:
        session_pool().forget(server)
    assert not _alive(second["result"])  # type: ignore[index]


def test_an_http_server_that_restarts_is_reconnected(ledger: Path) -> None:
    process = HttpServerProcess(ledger)
    server = McpServer.http(process.url, call_timeout_s=3)
    try:
        registry = load_mcp_tools(server)
        before = _inline(registry, "pid")
        process.stop()
        started = time.monotonic()
        with pytest.raises(McpConnectionError, match=process.url):
            _inline(registry, "pid")
        assert time.monotonic() - started < 8  # within the call's window, not twice over
        process = HttpServerProcess(ledger, port=process.port)
        deadline = time.monotonic() + 20
        while True:  # the session is opened again once the backoff allows
            try:
                after = _inline(registry, "pid")
                break
            except McpConnectionError:
                assert time.monotonic() < deadline, "never reconnected"
        assert before != after
    finally:
        session_pool().forget(server)
        process.stop()


def test_opening_a_connection_never_waits_for_a_hung_server() -> None:
    marker = f"hung-mcp-server-{uuid.uuid4().hex}"
    # A "server" that never answers the handshake, as AgentDoFn.setup may meet one.
    hung = McpServer.stdio(
        sys.executable, ["-c", f"import time; time.sleep(60)  # {marker}"], connect_timeout_s=30
    )
    try:
        started = time.monotonic()
        session_pool().acquire(hung)
        assert time.monotonic() - started < 1
        deadline = time.monotonic() + 10
        while not _processes_with(marker):  # it is being connected to in the background
            assert time.monotonic() < deadline, "the pool never started connecting"
            time.sleep(0.05)
        session_pool().release(hung)
        assert time.monotonic() - started < 10
    finally:
        session_pool().forget(hung)
    deadline = time.monotonic() + 10
    while _processes_with(marker):  # the half-connected server was stopped with its session
        assert time.monotonic() < deadline, "the hung server was left running"
        time.sleep(0.05)


def _processes_with(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.split()


def test_a_malformed_result_is_a_typed_error_and_loses_nothing() -> None:
    server = McpServer.stdio(sys.executable, [RAW_SERVER], call_timeout_s=5)
    try:
        registry = load_mcp_tools(server)
        assert not registry.get("garbled").side_effect and registry.get("crooked").side_effect
        with pytest.raises(McpResultError, match="malformed result: content: Input should be"):
            _inline(registry, "garbled")
        crooked = registry.get("crooked")
        intent = IntentInfo(intent_id="i-1", entity_key=b"k", seq=1, step_index=0, attempt=1)
        with pytest.raises(McpResultError, match="crooked"):
            _run(crooked.unwrap()(intent=intent, **crooked.validate_arguments({"n": "3"})))
        with pytest.raises(McpResultError):  # still answering: the session was not lost
            _inline(registry, "garbled")
    finally:
        session_pool().forget(server)


def test_an_unreachable_server_fails_to_load_with_a_typed_error(tmp_path: Path) -> None:
    missing = McpServer.stdio(str(tmp_path / "no-such-server"), connect_timeout_s=2)
    try:
        with pytest.raises(McpConnectionError, match="cannot connect to MCP server"):
            load_mcp_tools(missing)
    finally:
        session_pool().forget(missing)


def test_giving_up_on_an_unreachable_server_says_so_with_the_attempts(tmp_path: Path) -> None:
    missing = McpServer.stdio(str(tmp_path / "no-such-server"), connect_timeout_s=2)
    try:
        with pytest.raises(McpConnectionError) as raised:
            load_mcp_tools(missing)  # retries with backoff until its 2 s are spent
    finally:
        session_pool().forget(missing)
    message = str(raised.value)
    assert "next attempt" not in message
    gave_up = re.search(r"gave up after (\d+) failed attempts in a row; last error: (.+)", message)
    assert gave_up is not None, message
    assert int(gave_up[1]) >= 2
    assert "No such file" in gave_up[2] or "FileNotFoundError" in gave_up[2], message


def test_giving_up_on_a_hung_server_counts_its_one_attempt() -> None:
    hung = McpServer.stdio(
        sys.executable, ["-c", "import time; time.sleep(60)"], connect_timeout_s=1
    )
    try:
        with pytest.raises(McpConnectionError) as raised:
            load_mcp_tools(hung)
    finally:
        session_pool().forget(hung)
    message = str(raised.value)
    ending = r"gave up after 1 failed attempt in a row; last error: no answer within [\d.]+ s$"
    assert re.search(ending, message), message


def test_a_list_changed_notification_refreshes_the_listing(ticket_server: McpServer) -> None:
    registry = load_mcp_tools(ticket_server)
    assert "shout" not in registry
    _inline(registry, "add_tool", name="shout")

    deadline = time.monotonic() + 10
    while "shout" not in session_pool().catalog[ticket_server][1]:
        assert time.monotonic() < deadline, "the listing was not refreshed"
        time.sleep(0.05)
    refreshed = load_mcp_tools(ticket_server)
    assert _inline(refreshed, "shout", text="hi") == {"result": "HI"}

    # The server offers shout again with another argument: the tool already held adopts it.
    shout = refreshed.get("shout")
    version = session_pool().catalog[ticket_server][0]
    _inline(registry, "add_tool", name="shout", repeat=True)
    while session_pool().catalog[ticket_server][0] == version:
        assert time.monotonic() < deadline + 10, "the listing was not refreshed"
        time.sleep(0.05)
    assert "times" in shout.schema["parameters"]["properties"]
    assert _inline(refreshed, "shout", text="ha", times=2) == {"result": "HAHA"}


def test_mcp_tools_pickle_without_connecting_and_compare_equal(ticket_server: McpServer) -> None:
    registry = load_mcp_tools(ticket_server)
    copied = pickle.loads(pickle.dumps(registry))

    assert list(copied) == list(registry)
    assert copied.get("file_ticket") == registry.get("file_ticket")
    assert hash(copied.get("file_ticket")) == hash(registry.get("file_ticket"))
    assert copied.get("file_ticket").schema == registry.get("file_ticket").schema
    assert registry.connections() == copied.connections()
    assert len(registry.connections()) == 1


def test_server_descriptions_check_their_input_and_hide_secrets() -> None:
    server = McpServer.http("https://mcp.invalid/mcp", headers={"authorization": "Bearer s3cret"})
    assert "s3cret" not in repr(server)
    assert server.label == "https://mcp.invalid/mcp"
    with pytest.raises(ValueError, match="URL"):
        McpServer.http("ftp://x")
    with pytest.raises(ValueError, match="command"):
        McpServer.stdio("")
    with pytest.raises(TypeError, match="sequence"):
        McpServer.stdio("python", "server.py")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        McpServer.stdio("python", call_timeout_s=0)


def _ledger_rows(ledger: Path, table: str) -> list[tuple[str, str]]:
    with sqlite3.connect(ledger) as connection:
        return list(connection.execute(f"SELECT intent_id, title FROM {table} ORDER BY n"))
