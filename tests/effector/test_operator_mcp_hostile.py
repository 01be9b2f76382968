"""The operator MCP endpoint answers for whatever the store holds, on one labelled clock.

Rows are written straight into a real SQLite store: an approval whose arguments hold a
right-to-left override, one nested 200,000 deep, one of 3 MB, impossible times, and a withdrawn
approval. Every tool answers (never an internal error), flags what an approver must look at,
and refuses to decide the withdrawn approval, saying why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, make_intent, make_withdrawal, running_effector
from test_operator_mcp import call, mcp_client, refused

from beam_agents._protos import ToolIntent
from effector.server import ServerSettings
from effector.store.intents import NewIntent

DEEP = "[" * 200_000 + "]" * 200_000
HUGE = "x" * (3 * 1024 * 1024)


@pytest.mark.asyncio
async def test_hostile_rows_are_listed_flagged_and_withdrawn_ones_refused(tmp_path: Path) -> None:
    settings = ServerSettings(mcp_listen="127.0.0.1:0", worker=FAST_WORKER)
    evil = make_intent("", {"to": "acct-\u202e4321-evil"}, key=b"a", kind=ToolIntent.APPROVAL)
    evil.expires_at_ms = 2**62
    deep = make_intent("", DEEP, key=b"b", kind=ToolIntent.APPROVAL)
    deep.created_at_ms = -(2**63)
    huge = make_intent("", {"note": HUGE}, key=b"c", kind=ToolIntent.APPROVAL)
    gone = make_intent("", {"refund": "r-1"}, key=b"d", kind=ToolIntent.APPROVAL)
    withdrawal = make_withdrawal(gone)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as running:
        now = int(time.time() * 1000)
        intents = [evil, deep, huge, gone]
        await running.store.submit([NewIntent(intent) for intent in intents], now)
        await running.store.submit([NewIntent(withdrawal)], now)
        odd = make_intent("t", key=b"e")
        odd.kind = ToolIntent.Kind.ValueType(99)
        await running.store.submit([NewIntent(odd, rejection="unknown kind 99")], now)
        url = running.server.mcp_url
        assert url is not None
        async with mcp_client(url, None) as client:
            listed = await call(client, "list_pending_approvals", limit=10)
            assert listed["clock"] == "the effector's wall clock, ms since the epoch (UTC)"
            by_id = {a["intent_id"]: a for a in listed["approvals"]}
            assert set(by_id) == {evil.intent_id, deep.intent_id, huge.intent_id}
            for approval in by_id.values():
                assert "created_at_ms" not in approval
                assert abs(approval["received_at_ms"] - now) < 60_000
            assert by_id[evil.intent_id]["deadline"].startswith("out of range (")
            assert by_id[evil.intent_id]["args"] == {"to": "acct-\u202e4321-evil"}
            assert by_id[evil.intent_id]["warnings"] == ["holds U+202E RIGHT-TO-LEFT OVERRIDE"]
            assert by_id[deep.intent_id]["args"] == DEEP[:65_536]
            assert any("cut:" in w for w in by_id[deep.intent_id]["warnings"])
            assert any("cut:" in w for w in by_id[huge.intent_id]["warnings"])
            status = await call(client, "intent_status", intent_id=deep.intent_id)
            assert status["created_at_ms"] == -(2**63)
            unknown = await call(client, "intent_status", intent_id=odd.intent_id)
            assert (unknown["kind"], unknown["result"]["status"]) == ("UNKNOWN (99)", "REJECTED")
            withdrawn = await call(client, "intent_status", intent_id=gone.intent_id)
            assert (withdrawn["state"], withdrawn["result"]["status"]) == ("WITHDRAWN", "WITHDRAWN")
            assert "the run took its deadline route" in withdrawn["result"]["error"]
            why = await refused(client, "approve", intent_id=gone.intent_id, reason="ok")
            assert "withdrawn" in why and "the run took its deadline route" in why


@pytest.mark.asyncio
async def test_an_mcp_decision_logs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = ServerSettings(mcp_listen="127.0.0.1:0", worker=FAST_WORKER)
    asked = make_intent("", {"refund": "r-2"}, key=b"f", kind=ToolIntent.APPROVAL)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as running:
        await running.store.submit([NewIntent(asked)], int(time.time() * 1000))
        assert running.server.mcp_url is not None
        async with mcp_client(running.server.mcp_url, None) as client:
            await call(client, "approve", intent_id=asked.intent_id, reason="fine")
    lines = [line for line in caplog.messages if asked.intent_id in line]
    assert lines == [
        (
            f"DECISION approve intent {asked.intent_id} by 'mcp-operator' "
            "via the operator MCP endpoint: applied"
        )
    ]
