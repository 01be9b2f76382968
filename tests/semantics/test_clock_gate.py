"""Clock gate: an old backlog is not mass-expired, and an intent held past its TTL is refused.

A backlog of events whose event times are two hours old replays through the full loop
(effector subprocess on SQLite, FnApiRunner pipeline). Every effect intent carries a one-hour
TTL in event time, so by event time all of them expired an hour ago; the effector anchors the
TTL window at its own first receipt, so it executes every one. A few events ask for an
approval with a TTL of a few seconds that nobody decides: the effector holds it past its TTL,
refuses it as ``EXPIRED``, and the agent takes its fallback, which its output says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from beam_agents._protos import IntentState, ToolIntent, ToolResult
from beam_agents.io import EffectorConnection
from effector.client import EffectorClient
from effector.launch import free_port
from effector.store.intents import wall_clock_ms
from tests.semantics.loop import (
    EFFECT_TTL_MS,
    check_effects,
    effect_intent_id,
    make_events,
    run_loop,
    sidecar,
)

N_EVENTS = 400
N_KEYS = 40
BACKLOG_AGE_MS = 2 * 3_600_000
APPROVAL_TTL_MS = 3_000
APPROVALS = (57, 222)
"""The events (on two different keys) that ask for an approval nobody gives."""


def test_an_old_backlog_executes_and_an_intent_held_past_its_ttl_takes_the_fallback(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    started_ms = wall_clock_ms()
    base_ms = started_ms - BACKLOG_AGE_MS
    events = make_events(
        N_EVENTS, N_KEYS, base_ms=base_ms, approvals=APPROVALS, approval_ttl_ms=APPROVAL_TTL_MS
    )
    newest_expiry_ms = events[-1].event_time_ms + EFFECT_TTL_MS
    # By event time, every intent of the backlog has been expired for about an hour.
    assert newest_expiry_ms < started_ms - 3_000_000
    approval_ids = {effect_intent_id(i, N_KEYS) for i in APPROVALS}
    effect_ids = {effect_intent_id(i, N_KEYS) for i in range(N_EVENTS)} - approval_ids

    with sidecar(f"sqlite:///{tmp_path / 'effector.db'}", free_port(), ledger) as effector:
        run = run_loop(EffectorConnection(effector.address), events)
        with EffectorClient(effector.address) as client:
            records = {i: client.get_intent(i) for i in approval_ids | effect_ids}

    assert run.errors == [] and run.dead_letters == []
    assert dict(run.acks) == {"ACCEPTED": N_EVENTS}
    assert set(run.outputs_by_event().values()) == {1} and len(run.outputs) == N_EVENTS
    by_intent = {str(output["intent_id"]): output for output in run.outputs}
    assert set(by_intent) == effect_ids | approval_ids

    # No mass expiry: every effect of the two-hour-old backlog was executed, once.
    for intent_id in effect_ids:
        assert (by_intent[intent_id]["status"], by_intent[intent_id]["outcome"]) == (
            "OK",
            "applied",
        )
        assert records[intent_id].result.status == ToolResult.OK
        assert records[intent_id].intent.expires_at_ms < started_ms
    figures = check_effects(ledger, effect_ids, killed=[])
    assert figures.invocations == len(effect_ids)

    # Held past its TTL at the effector (no decision came): refused as EXPIRED, never run,
    # and the agent fell back, as its output says.
    for intent_id in approval_ids:
        record = records[intent_id]
        assert record.intent.kind == ToolIntent.APPROVAL
        assert record.state == IntentState.DONE
        assert record.result.status == ToolResult.EXPIRED
        assert record.result.completed_at_ms >= started_ms + APPROVAL_TTL_MS
        assert (by_intent[intent_id]["status"], by_intent[intent_id]["outcome"]) == (
            "EXPIRED",
            "fallback",
        )
    outcomes = Counter(str(output["outcome"]) for output in run.outputs)
    expired = sum(record.result.status == ToolResult.EXPIRED for record in records.values())
    gate_report(
        "clock",
        f"events={N_EVENTS} keys={N_KEYS} backlog_age=2h intent_ttl=1h "
        f"expired_by_event_time={len(effect_ids)} executed={figures.invocations} "
        f"expired_at_effector={expired} "
        f"approval_ttl={APPROVAL_TTL_MS}ms fallbacks={outcomes['fallback']} "
        f"applied={outcomes['applied']} run={run.seconds:.1f}s",
    )
