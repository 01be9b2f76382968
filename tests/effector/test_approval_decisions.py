"""Approvals bound to arguments: stale digests, quorums, named tokens and channels, edits."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from conftest import sqlite_url
from effector_harness import (
    FAST_WORKER,
    TOOLS,
    EffectorProcess,
    make_intent,
    run_cli,
    running_effector,
)

from beam_agents._protos import (
    Approval,
    IntentState,
    ToolIntent,
    approval_digest,
    canonical_json,
)
from effector.cli import load_tokens
from effector.client import AsyncEffectorClient, EffectorClient
from effector.server import ServerSettings
from effector.service import parse_tokens
from effector.store.errors import ConfigurationError

TOKEN_FILE = """\
# approvers
alice:tok-alice
bob:tok-bob:payments,-
carol:tok-carol
"""


def _approval(
    args: dict[str, object],
    *,
    key: bytes = b"k",
    quorum: int = 0,
    channel: str = "",
    gated_tool: str = "",
) -> ToolIntent:
    intent = make_intent("approval", args, key=key, kind=ToolIntent.APPROVAL)
    intent.required_approvals = quorum
    intent.channel = channel
    intent.gated_tool = gated_tool
    return intent


async def _published(client: AsyncEffectorClient, intent_id: str) -> list[Approval]:
    records = (await client.read(1, wait_ms=0)).records
    return [r.envelope.approval for r in records if r.envelope.approval.intent_id == intent_id]


@pytest.mark.asyncio
async def test_a_stale_digest_is_refused_and_the_right_one_decides(tmp_path: Path) -> None:
    asked = _approval({"amount": 5})
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([asked])
        shown = await client.get_intent(asked.intent_id)
        assert shown.args_digest == approval_digest(asked.args_json)
        stale = approval_digest(canonical_json({"amount": 500}))
        refused = await client.decide(
            asked.intent_id, approved=True, approver="ann", args_digest=stale
        )
        assert not refused.applied
        assert refused.state == IntentState.AWAITING_DECISION
        assert "stale decision" in refused.reason and stale in refused.reason
        assert await _published(client, asked.intent_id) == []
        with pytest.raises(grpc.aio.AioRpcError) as malformed:
            await client.decide(asked.intent_id, approved=True, args_digest="xyz")
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        applied = await client.decide(
            asked.intent_id, approved=True, approver="ann", args_digest=shown.args_digest
        )
        assert applied.applied and applied.state == IntentState.DONE
        [approval] = await _published(client, asked.intent_id)
        assert approval.args_digest == shown.args_digest
        assert (approval.approved, approval.approver) == (True, "ann")


@pytest.mark.asyncio
async def test_a_decision_without_a_digest_is_accepted_and_published_with_one(
    tmp_path: Path,
) -> None:
    asked = _approval({"amount": 5})
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        await effector.client.submit([asked])
        assert (await effector.client.decide(asked.intent_id, approved=False)).applied
        [approval] = await _published(effector.client, asked.intent_id)
        assert approval.args_digest == approval_digest(asked.args_json)


@pytest.mark.asyncio
async def test_a_quorum_of_two_counts_distinct_approvers_and_a_deny_denies(
    tmp_path: Path,
) -> None:
    approved_one = _approval({"n": 1}, key=b"a", quorum=2)
    denied_one = _approval({"n": 2}, key=b"d", quorum=2)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([approved_one, denied_one])
        first = await client.decide(approved_one.intent_id, approved=True, approver="ann")
        assert (first.applied, first.state) == (True, IntentState.AWAITING_DECISION)
        assert "1 of 2" in first.reason
        again = await client.decide(approved_one.intent_id, approved=True, approver="ann")
        assert not again.applied and "already voted" in again.reason
        shown = await client.get_intent(approved_one.intent_id)
        assert [vote.approver for vote in shown.votes] == ["ann"]
        assert await _published(client, approved_one.intent_id) == []
        second = await client.decide(approved_one.intent_id, approved=True, approver="bob")
        assert (second.applied, second.state) == (True, IntentState.DONE)
        [approval] = await _published(client, approved_one.intent_id)
        assert approval.approved and list(approval.approvers) == ["ann", "bob"]
        assert json.loads(second.result.payload)["approvers"] == ["ann", "bob"]
        # A third approver: too late for the decided one; denies the other at once, after
        # one approval of its quorum of two.
        late = await client.decide(approved_one.intent_id, approved=False, approver="cy")
        assert (late.applied, late.reason) == (False, "already decided")
        await client.decide(denied_one.intent_id, approved=True, approver="ann")
        denied = await client.decide(denied_one.intent_id, approved=False, approver="cy")
        assert (denied.applied, denied.state) == (True, IntentState.DONE)
        [no] = await _published(client, denied_one.intent_id)
        assert (no.approved, no.approver, list(no.approvers)) == (False, "cy", ["cy"])
        assert (await client.get_intent(denied_one.intent_id)).votes == []


def test_token_files_parse_bare_and_named_tokens(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.write_text("  s3cret \n")
    tokens = load_tokens(None, str(bare))
    assert tokens is not None and not tokens.named and tokens.primary == "s3cret"
    named = parse_tokens(TOKEN_FILE, "file")
    assert named.named and named.primary == "tok-alice"
    bob = named.identify("tok-bob")
    assert bob is not None and bob.name == "bob" and bob.channels == {"payments", ""}
    assert named.identify_bearer(b"Bearer tok-carol").name == "carol"  # type: ignore[union-attr]
    assert named.identify("tok-nobody") is None
    # One line is one bare token, whatever it holds (a token file before named tokens).
    assert parse_tokens("s3cr3t:with-colon\n", "file").primary == "s3cr3t:with-colon"
    assert not parse_tokens("s3cr3t:with-colon\n", "file").named
    broken_files = ("alice:\nbob:b", "alice:a\nalice:b", "a:1\nb:1", "bad name:t\nb:u")
    for broken in (*broken_files, "x:t:\ny:u", "a:b:c:d\ne:f"):
        with pytest.raises(ConfigurationError):
            parse_tokens(broken, "file")
    with pytest.raises(ConfigurationError):
        load_tokens("t", str(bare))


@pytest.mark.asyncio
async def test_named_tokens_are_recorded_and_channel_limits_refused(tmp_path: Path) -> None:
    tokens = parse_tokens(TOKEN_FILE, "file")
    settings = ServerSettings(token=tokens.primary, tokens=tokens, worker=FAST_WORKER)
    payments = _approval({"n": 1}, key=b"p", channel="payments")
    ops = _approval({"n": 2}, key=b"o", channel="ops")
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        address = effector.server.address
        await effector.client.submit([payments, ops])
        async with AsyncEffectorClient(address, token="tok-bob") as bob:
            limited = await bob.decide(ops.intent_id, approved=True, approver="mallory")
            assert not limited.applied
            assert "'bob' may not decide approvals on channel 'ops'" in limited.reason
            allowed = await bob.decide(payments.intent_id, approved=True, approver="mallory")
            assert allowed.applied
        async with AsyncEffectorClient(address, token="tok-carol") as carol:
            assert (await carol.decide(ops.intent_id, approved=False, reason="no")).applied
        async with AsyncEffectorClient(address, token="tok-unknown") as stranger:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stranger.status()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        [by_bob] = await _published(effector.client, payments.intent_id)
        [by_carol] = await _published(effector.client, ops.intent_id)
        assert (by_bob.approver, by_carol.approver) == ("bob", "carol")


@pytest.mark.asyncio
async def test_approve_with_edit_is_validated_against_the_gated_tool(tmp_path: Path) -> None:
    gated = _approval({"note": "draft"}, key=b"g", gated_tool="record")
    free = _approval({"note": "draft"}, key=b"f")
    missing = _approval({"note": "draft"}, key=b"m", gated_tool="no_such_tool")
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([gated, free, missing])
        for intent, expected in (
            (free, "gates no tool"),
            (missing, "has no tool 'no_such_tool'"),
            (gated, "are invalid"),
        ):
            edit = '{"note": 5, "extra": 1}' if intent is gated else '{"note": "x"}'
            refused = await client.decide(intent.intent_id, approved=True, edited_args_json=edit)
            assert not refused.applied and expected in refused.reason, refused.reason
        for edit, problem in (("[1]", "JSON object"), ("{", "not valid JSON")):
            refused = await client.decide(gated.intent_id, approved=True, edited_args_json=edit)
            assert problem in refused.reason
        denied_edit = await client.decide(
            gated.intent_id, approved=False, edited_args_json='{"note": "final"}'
        )
        assert not denied_edit.applied and "not a denial" in denied_edit.reason
        edited = await client.decide(
            gated.intent_id,
            approved=True,
            approver="ed",
            edited_args_json='{ "note": "final" }',
            args_digest=approval_digest(gated.args_json),
        )
        assert edited.applied
        [approval] = await _published(client, gated.intent_id)
        assert approval.edited_args_json == '{"note":"final"}'
        assert json.loads(edited.result.payload)["edited_args"] == {"note": "final"}


def test_the_cli_shows_the_digest_votes_with_named_tokens_and_edits(tmp_path: Path) -> None:
    """``show`` prints the digest; ``approve --digest`` refuses a stale one; ``--edit``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN_FILE)
    ann_token = tmp_path / "ann"
    ann_token.write_text("tok-alice\n")
    carol_token = tmp_path / "carol"
    carol_token.write_text("tok-carol\n")
    store = sqlite_url(tmp_path / "s.db")
    serve = ["--tools", TOOLS, "--store", store, "--listen", "127.0.0.1:0"]
    quorum = _approval({"n": 1}, key=b"q", quorum=2)
    gated = _approval({"note": "draft"}, key=b"g", gated_tool="record")
    with EffectorProcess(*serve, "--token-file", str(tokens)) as effector:
        client = EffectorClient(effector.address, token="tok-alice")
        with client:
            client.submit([quorum, gated])
        target = ["--target", effector.address]
        as_alice = [*target, "--token-file", str(ann_token)]
        as_carol = [*target, "--token-file", str(carol_token)]
        shown = run_cli("show", quorum.intent_id, *as_alice)
        assert f"args_digest:  {approval_digest(quorum.args_json)}" in shown.stdout
        assert "quorum:       0 of 2 approvals" in shown.stdout
        stale = run_cli("approve", quorum.intent_id, *as_alice, "--digest", "0" * 64)
        assert stale.returncode == 1 and "stale decision" in stale.stderr
        voted = run_cli("approve", quorum.intent_id, *as_alice, "--approver", "mallory")
        assert voted.returncode == 0 and "1 of 2 approvals (alice)" in voted.stdout
        assert "vote:         alice: -" in run_cli("show", quorum.intent_id, *as_alice).stdout
        decided = run_cli("approve", quorum.intent_id, *as_carol)
        assert (decided.returncode, decided.stdout.strip()) == (0, f"approved {quorum.intent_id}")
        edited = run_cli("approve", gated.intent_id, *as_carol, "--edit", '{"note": "final"}')
        assert edited.returncode == 0, edited.stderr
        with EffectorClient(effector.address, token="tok-carol") as client:
            payload = json.loads(client.get_intent(gated.intent_id).result.payload)
    assert (payload["approver"], payload["edited_args"]) == ("carol", {"note": "final"})
