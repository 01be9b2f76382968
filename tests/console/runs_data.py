"""Realistic telemetry for the console's tests, benchmark and screenshot.

:func:`agent_run` builds the trace events one run of a refund agent emits, as the pipeline's
tracer does (deterministic trace and span ids, GenAI attributes, wall-clock times): a model
call, a read-only tool, an approval, the suspension, the resume on the decision, a payment
intent and the end with the memory's slots. The helpers below put intents and errors in a store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from beam_agents._protos import AgentEnvelope, AgentError, ToolIntent, TraceEvent
from beam_agents.core.agent import intent_id_for
from beam_agents.core.observability import span_id_for, trace_id_for
from effector.store.intents import NewIntent
from effector.store.sql import SqlStore

MS = 1_000_000
"""Nanoseconds per millisecond."""
MEMORY = {"history": 2_048, "customer_profile": 311, "open_refunds": 96}


def _event(
    key: bytes,
    seq: int,
    sequence: int,
    event_type: TraceEvent.EventType,
    attributes: Mapping[str, str],
    *,
    start_ns: int,
    took_ms: float,
    step: int,
    event_ms: int,
) -> TraceEvent:
    root = span_id_for(0, TraceEvent.ACTIVATION_START)
    return TraceEvent(
        trace_id=trace_id_for(key, seq),
        span_id=span_id_for(sequence, event_type),
        parent_span_id="" if event_type == TraceEvent.ACTIVATION_START else root,
        entity_key=key,
        seq=seq,
        step_index=step,
        event_type=event_type,
        attributes=dict(attributes),
        start_ms=event_ms,
        end_ms=event_ms,
        sequence=sequence,
        wall_start_unix_nano=start_ns,
        wall_end_unix_nano=start_ns + int(took_ms * MS),
    )


def agent_run(
    key: bytes,
    seq: int,
    start_ns: int,
    *,
    waited_ms: float = 2_300.0,
    completed: bool = True,
    timed: bool = True,
    memory: Mapping[str, int] = MEMORY,
) -> list[TraceEvent]:
    """The events of run ``seq`` of ``key``; without ``completed`` it ends suspended."""
    event_ms = start_ns // MS
    approval_id = intent_id_for(key, seq, 2)
    plan: list[tuple[TraceEvent.EventType, dict[str, str], float, float, int]] = [
        (TraceEvent.ACTIVATION_START, {"trigger": "event"}, 0, 431, 0),
        (
            TraceEvent.LLM_CALL,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": "claude-sonnet-4",
                "gen_ai.usage.input_tokens": str(812 + seq % 7),
                "gen_ai.usage.output_tokens": str(96 + seq % 11),
            },
            3,
            362,
            0,
        ),
        (
            TraceEvent.TOOL_CALL,
            {
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.id": f"call_{seq:04d}",
                "status": "ok",
            },
            367,
            41,
            1,
        ),
        (
            TraceEvent.INTENT_EMITTED,
            {"intent_id": approval_id, "tool_name": "approval", "kind": "APPROVAL"},
            410,
            1,
            2,
        ),
        (
            TraceEvent.SUSPENDED,
            {"pending": "1", "beam_agents.deadline_ms": str(event_ms + 3_600_000)},
            413,
            18,
            3,
        ),
    ]
    if completed:
        resumed = 431 + waited_ms
        plan += [
            (TraceEvent.ACTIVATION_START, {"trigger": "approval"}, resumed, 260, 3),
            (
                TraceEvent.LLM_CALL,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "anthropic",
                    "gen_ai.request.model": "claude-sonnet-4",
                    "gen_ai.usage.input_tokens": "1024",
                    "gen_ai.usage.output_tokens": "57",
                },
                resumed + 2,
                221,
                3,
            ),
            (
                TraceEvent.INTENT_EMITTED,
                {
                    "intent_id": intent_id_for(key, seq, 4),
                    "tool_name": "pay_refund",
                    "kind": "TOOL",
                },
                resumed + 225,
                1,
                4,
            ),
            (
                TraceEvent.ACTIVATION_END,
                {"output_bytes": "38", "beam_agents.memory.slots": json.dumps(dict(memory))},
                resumed + 228,
                32,
                5,
            ),
        ]
    return [
        _event(
            key,
            seq,
            sequence,
            event_type,
            attributes,
            start_ns=start_ns + int(offset_ms * MS) if timed else 0,
            took_ms=took if timed else 0,
            step=step,
            event_ms=event_ms,
        )
        for sequence, (event_type, attributes, offset_ms, took, step) in enumerate(plan)
    ]


def key_runs(key: bytes, runs: int, *, start_ns: int | None = None) -> list[TraceEvent]:
    """``runs`` completed runs of ``key``, a minute apart, ending now (or at ``start_ns``)."""
    first = (time.time_ns() if start_ns is None else start_ns) - runs * 60_000 * MS
    return [
        event
        for seq in range(runs)
        for event in agent_run(key, seq, first + seq * 60_000 * MS, waited_ms=900 + seq % 5 * 700)
    ]


def approval_intent(key: bytes, seq: int, args: Mapping[str, object], now_ms: int) -> ToolIntent:
    """An approval intent as ``ctx.request_approval`` stages it (step 2, one hour to decide)."""
    return ToolIntent(
        intent_id=intent_id_for(key, seq, 2),
        entity_key=key,
        seq=seq,
        step_index=2,
        tool_name="approval",
        args_json=json.dumps(dict(args), sort_keys=True, separators=(",", ":")),
        created_at_ms=now_ms,
        expires_at_ms=now_ms + 3_600_000,
        kind=ToolIntent.APPROVAL,
        channel="refund-reviewers",
    )


async def submit(store: SqlStore, *intents: ToolIntent) -> None:
    """Record ``intents`` as a Submit would (they must all be accepted)."""
    answers = await store.submit([NewIntent(intent) for intent in intents], now_ms())
    assert all(answer.outcome.value == "accepted" for answer in answers), answers


def failed_event(key: bytes, payload: bytes, *, seq: int = 0) -> AgentError:
    """An ``activation_error`` record carrying the external event that caused it."""
    envelope = AgentEnvelope(entity_key=key, event_time_ms=now_ms(), external_event=payload)
    return AgentError(
        entity_key=key,
        reason="activation_error",
        detail="KeyError: 'order_id'",
        event_time_ms=envelope.event_time_ms,
        envelope=envelope.SerializeToString(),
        seq=seq,
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "refunds.py", line 41, in refunds\n'
            '    order = event["order_id"]\n'
            "KeyError: 'order_id'"
        ),
    )


def timer_error(key: bytes) -> AgentError:
    """A deadline route that failed: no envelope caused it, so nothing can be re-driven."""
    return AgentError(
        entity_key=key,
        reason="timeout_route_error",
        detail="RuntimeError: route failed",
        event_time_ms=now_ms(),
        seq=3,
    )


def now_ms() -> int:
    return time.time_ns() // MS
