"""Effect policies against clients that try to go around them, and races on two replicas."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, make_intent, make_withdrawal, running_effector
from effector_test_tools import read_ledger
from test_effect_policies import POLICY, _policy_file, _record

from beam_agents._protos import IntentState, SubmitAck, ToolIntent, ToolResult, canonical_json
from effector.policy import Outcome, Verdict, gate_for
from effector.server import ServerSettings
from effector.store import open_store
from effector.store.intents import NewIntent, gate_id_for


def _settings(tmp_path: Path, text: str = POLICY) -> ServerSettings:
    return ServerSettings(worker=FAST_WORKER, policy_file=str(_policy_file(tmp_path, text)))


@pytest.mark.asyncio
async def test_a_client_cannot_forge_a_gate_or_take_its_id(tmp_path: Path, ledger: Path) -> None:
    held = _record("big refund", key=b"victim")
    forged = make_intent(
        "approval", {"note": "big refund"}, key=b"attacker", kind=ToolIntent.APPROVAL
    )
    forged.channel = "self-serve"
    forged.policy_gate_for = held.intent_id
    squatter = make_intent("approval", {}, key=b"victim2", kind=ToolIntent.APPROVAL)
    target = _record("big too", key=b"victim2")
    squatter.intent_id = gate_id_for(target.intent_id)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=_settings(tmp_path)) as run:
        client = run.client
        await client.submit([held])
        [refused] = await client.submit([forged])
        assert refused.outcome == SubmitAck.REJECTED
        assert "set by the effector's policy, never by a client" in refused.reason
        # An approval recorded under the id the policy would give the gate: fail closed.
        assert (await client.submit([squatter]))[0].outcome == SubmitAck.ACCEPTED
        [closed] = await client.submit([target])
        assert closed.state == IntentState.DONE
        assert closed.result.status == ToolResult.REJECTED
        assert "is recorded already; refused closed" in closed.result.error_message
        approved = await client.decide(squatter.intent_id, approved=True, approver="mallory")
        assert approved.applied
        await asyncio.sleep(0.3)
        assert (await client.get_intent(held.intent_id)).state == IntentState.AWAITING_DECISION
    assert read_ledger(ledger) == []


@pytest.mark.asyncio
async def test_withdrawing_a_gate_leaves_it_and_its_intent_held(tmp_path: Path) -> None:
    held = _record("big refund", key=b"k")
    gate_id = gate_id_for(held.intent_id)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=_settings(tmp_path)) as run:
        client = run.client
        await client.submit([held])
        gate = (await client.get_intent(gate_id)).intent
        await client.submit([make_withdrawal(gate)])
        assert (await client.get_intent(gate_id)).state == IntentState.AWAITING_DECISION
        for approver in ("alice", "bob"):
            assert (await client.decide(gate_id, approved=True, approver=approver)).applied
        for _ in range(200):
            if (await client.get_intent(held.intent_id)).state == IntentState.DONE:
                break
            await asyncio.sleep(0.05)
        assert (await client.get_intent(held.intent_id)).result.status == ToolResult.OK


@pytest.mark.asyncio
async def test_an_edit_the_policy_would_deny_is_not_recorded(tmp_path: Path, ledger: Path) -> None:
    held = _record("big refund", key=b"k")
    gate_id = gate_id_for(held.intent_id)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=_settings(tmp_path)) as run:
        client = run.client
        await client.submit([held])
        shout = canonical_json({"note": "SHOUT it out"})
        refused = await client.decide(gate_id, approved=True, approver="a", edited_args_json=shout)
        assert not refused.applied
        assert "would be denied by effect policy: rule 'no-shouting'" in refused.reason
        assert (await client.get_intent(gate_id)).votes == []
    assert read_ledger(ledger) == []


@pytest.mark.asyncio
async def test_concurrent_submits_and_duplicates_count_exactly(tmp_path: Path) -> None:
    quota = POLICY.replace("counters.records_per_tenant >= 3", "counters.records_per_tenant >= 3")
    intents = [_record(f"r{n}", key=f"acme/c{n}".encode()) for n in range(20)]
    async with running_effector(
        sqlite_url(tmp_path / "s.db"), settings=_settings(tmp_path, quota)
    ) as run:
        client = run.client
        acks = await asyncio.gather(*(client.submit([intent]) for intent in intents))
        outcomes = [ack.outcome for [ack] in acks]
        assert outcomes.count(SubmitAck.ACCEPTED) == 3  # one Submit at a time counts
        accepted = [
            i for i, [a] in zip(intents, acks, strict=True) if a.outcome == SubmitAck.ACCEPTED
        ]
        # A resubmitted batch is counted once: its duplicates are not new effects.
        again = await client.submit(accepted[:2])
        assert [ack.outcome for ack in again] == [SubmitAck.DUPLICATE] * 2
    other = [_record(f"o{n}", key=f"globex/c{n}".encode()) for n in range(3)]
    async with running_effector(
        sqlite_url(tmp_path / "t.db"), settings=_settings(tmp_path, quota)
    ) as run:
        client = run.client
        first = await client.submit(other[:2])
        mixed = await client.submit([*other[:2], other[2]])
        assert [ack.outcome for ack in first] == [SubmitAck.ACCEPTED] * 2
        assert [ack.outcome for ack in mixed] == [
            SubmitAck.DUPLICATE,
            SubmitAck.DUPLICATE,
            SubmitAck.ACCEPTED,
        ]


@pytest.mark.asyncio
async def test_tenant_is_the_text_before_the_separator(tmp_path: Path) -> None:
    text = POLICY + (
        '\n[[rules]]\nname = "acme-only"\nwhen = \'tool == "add" && tenant != "acme"\'\n'
        'outcome = "deny"\nreason = "adds are for acme"\n'
    )
    text = text.replace('[[rules]]\nname = "adds-are-fine"', '[[rules]]\nname = "adds-are-fine-x"')
    text = text.replace(
        'name = "adds-are-fine-x"\nwhen = \'tool == "add"\'',
        "name = \"adds-are-fine-x\"\nwhen = 'false'",
    )
    async with running_effector(
        sqlite_url(tmp_path / "s.db"), settings=_settings(tmp_path, text)
    ) as run:
        acks = await run.client.submit(
            [
                make_intent("add", {"a": 1, "b": 2}, key=b"acme/c1"),
                make_intent("add", {"a": 1, "b": 2}, key=b"acmecorp/c1"),
                make_intent("add", {"a": 1, "b": 2}, key=b"acme"),
            ]
        )
    assert [ack.outcome for ack in acks] == [
        SubmitAck.ACCEPTED,
        SubmitAck.REJECTED,
        SubmitAck.ACCEPTED,  # a key without the separator is its own tenant
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("held", [False, True])
async def test_an_intent_and_its_withdrawal_meet_on_two_replicas(
    postgres: object, held: bool
) -> None:
    url = postgres.create_database("effector")  # type: ignore[attr-defined]
    first, second = await open_store(url), await open_store(url)
    try:
        intent = make_intent("record", {"note": "big"}, key=b"race")
        verdict = Verdict(Outcome.REQUIRE_APPROVAL, "two-eyes", "", "finance", 1)
        new = (
            NewIntent(
                intent,
                None,
                policy_rule="two-eyes",
                policy_outcome="require_approval",
                gate=gate_for(intent, verdict),
            )
            if held
            else NewIntent(intent)
        )
        inside, go = threading.Event(), threading.Event()
        now = int(time.time() * 1000)

        def submit_and_wait(tx: object) -> object:
            answer = first._submit(tx, [new], now, [False])  # type: ignore[arg-type]
            inside.set()
            go.wait(10)
            return answer

        recording = asyncio.ensure_future(first._run(submit_and_wait))
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 10)
        withdrawing = asyncio.ensure_future(
            second.submit([NewIntent(make_withdrawal(intent))], now + 1)
        )
        await asyncio.wait({withdrawing}, timeout=1)
        go.set()
        await recording
        await withdrawing
        assert (await first.get_intent(intent.intent_id)).state == IntentState.WITHDRAWN
        if held:
            gate = await first.get_intent(gate_id_for(intent.intent_id))
            assert gate is not None and gate.state == IntentState.WITHDRAWN
    finally:
        await first.close()
        await second.close()
