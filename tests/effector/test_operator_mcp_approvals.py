"""The operator MCP endpoint with named tokens: digests, quorums, channel limits and edits."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, make_intent, running_effector
from test_operator_mcp import call, mcp_client, refused

from beam_agents._protos import ToolIntent, approval_digest
from effector.server import ServerSettings
from effector.service import parse_tokens

TOKENS = "alice:tok-a\nbob:tok-b:desk\ncarol:tok-c\n"


@pytest.mark.asyncio
async def test_named_approvers_vote_edit_and_are_held_to_their_channels(tmp_path: Path) -> None:
    tokens = parse_tokens(TOKENS, "tokens")
    settings = ServerSettings(
        token=tokens.primary, tokens=tokens, mcp_listen="127.0.0.1:0", worker=FAST_WORKER
    )
    quorum = make_intent("approval", {"n": 1}, key=b"q", kind=ToolIntent.APPROVAL)
    quorum.required_approvals, quorum.channel = 2, "payments"
    gated = make_intent("approval", {"note": "draft"}, key=b"g", kind=ToolIntent.APPROVAL)
    gated.gated_tool = "record"
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        await effector.client.submit([quorum, gated])
        url = effector.server.mcp_url
        assert url is not None
        async with mcp_client(url, "tok-a") as alice:
            listed = await call(alice, "list_pending_approvals")
            shown = {a["intent_id"]: a for a in listed["approvals"]}[quorum.intent_id]
            assert shown["args_digest"] == approval_digest(quorum.args_json)
            assert shown["required_approvals"] == 2
            stale = await refused(
                alice, "approve", intent_id=quorum.intent_id, reason="ok", args_digest="0" * 64
            )
            assert "stale decision" in stale
            vote = await call(
                alice,
                "approve",
                intent_id=quorum.intent_id,
                reason="ok",
                args_digest=shown["args_digest"],
            )
            assert vote["approver"] == "alice" and "1 of 2" in vote["quorum"]
        async with mcp_client(url, "tok-b") as bob:
            limited = await refused(bob, "approve", intent_id=quorum.intent_id, reason="ok")
            assert "'bob' may not decide approvals on channel 'payments'" in limited
        async with mcp_client(url, "tok-c") as carol:
            decided = await call(carol, "approve", intent_id=quorum.intent_id, reason="fine")
            assert (decided["approver"], decided["quorum"]) == ("carol", None)
            edited = await call(
                carol,
                "approve",
                intent_id=gated.intent_id,
                reason="tightened",
                edited_args={"note": "final"},
            )
            assert edited["approver"] == "carol"
        record = await effector.client.get_intent(quorum.intent_id)
        assert '"approvers":["alice","carol"]' in record.result.payload.decode()
        assert (
            b'"edited_args":{"note":"final"}'
            in (await effector.client.get_intent(gated.intent_id)).result.payload
        )
