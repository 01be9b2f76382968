"""Rule family: resume. A suspended run resumes on its results, and events wait their turn.

Results re-enter on the key and resume the run with its seq, snapshot and cursor; a fan-out
completes once every result is in; events arriving meanwhile are buffered (up to a limit) and
run in order after. Which answers are refused is admission's rule (test_admission.py).
"""

from __future__ import annotations

import json

from beam_agents import AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import AgentEnvelope, ToolResult, TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import trace_id_for
from beam_agents.testing import EnvelopeStream
from tests.core.harness import fan_out, run_agent, streamed

K = b"acct-7"


def names(events: list[TraceEvent]) -> list[str]:
    return [TraceEvent.EventType.Name(event.event_type) for event in events]


async def charge_then_report(ctx: ActivationContext) -> Complete | Suspend:
    """Stage one charge and wait; on the result, stage a receipt and report what it saw."""
    if not ctx.is_resume:
        ctx.act("charge", {"amount": int(ctx.event)})
        return Suspend(snapshot=b"amount=" + ctx.event)
    result = ctx.resume_result
    assert result is not None
    receipt = ctx.act("send_receipt", {"charge": result.intent_id})
    report = {
        "seq": ctx.seq,
        "snapshot": ctx.snapshot.decode(),
        "status": ToolResult.Status.Name(result.status),
        "payload": json.loads(result.payload),
        "pending": sorted(ctx.pending_intent_ids),
        "receipt": receipt,
        "event": ctx.event.decode(),
    }
    return Complete(output=json.dumps(report, sort_keys=True).encode())


def test_a_suspended_run_resumes_with_its_result_seq_snapshot_and_continued_cursor() -> None:
    charge = intent_id_for(K, 0, 0)
    stream = (
        EnvelopeStream()
        .event(K, b"25", at_ms=1_000)
        .result(K, charge, payload=b'{"charged": 25}', at_ms=2_000)
        .event(K, b"30", at_ms=3_000)
    )
    outputs = run_agent(streamed(stream), charge_then_report, streaming=True)
    assert outputs.errors == []
    [report] = [json.loads(raw) for raw in outputs.output]
    assert report == {
        "seq": 0,
        "snapshot": "amount=25",
        "status": "OK",
        "payload": {"charged": 25},
        "pending": [intent_id_for(K, 0, 1)],
        "receipt": intent_id_for(K, 0, 1),
        "event": "",
    }
    intents = sorted((i.seq, i.step_index, i.tool_name) for i in outputs.intents)
    assert intents == [(0, 0, "charge"), (0, 1, "send_receipt"), (1, 0, "charge")]
    run = [event for event in outputs.traces_for(K) if event.seq == 0]
    assert names(run) == [
        "ACTIVATION_START",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_START",
        "INTENT_EMITTED",
        "ACTIVATION_END",
    ]
    assert {event.trace_id for event in run} == {trace_id_for(K, 0)}
    assert [event.sequence for event in run] == list(range(6))
    resumed_start = run[3]
    assert resumed_start.parent_span_id == run[0].span_id
    assert resumed_start.attributes["trigger"] == "tool_result"
    assert run[5].parent_span_id == resumed_start.span_id


def fan_out_stream(order: list[int]) -> EnvelopeStream:
    stream = EnvelopeStream().event(K, b"go", at_ms=1_000)
    for position, step in enumerate(order):
        stream.result(K, intent_id_for(K, 0, step), payload=b'"r%d"' % step, at_ms=2_000 + position)
    return stream


def test_fan_out_completes_once_after_results_in_reverse_order() -> None:
    outputs = run_agent(streamed(fan_out_stream([2, 1, 0])), fan_out, streaming=True)
    assert outputs.errors == []
    [answers] = [json.loads(raw) for raw in outputs.output]
    assert answers == {intent_id_for(K, 0, step): f'"r{step}"' for step in range(3)}
    assert names(outputs.traces_for(K)) == [
        "ACTIVATION_START",
        "INTENT_EMITTED",
        "INTENT_EMITTED",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_START",
        "SUSPENDED",
        "ACTIVATION_START",
        "SUSPENDED",
        "ACTIVATION_START",
        "ACTIVATION_END",
    ]
    assert len(outputs.intents) == 3


async def count_runs(ctx: ActivationContext) -> Complete | Suspend:
    """An event "wait" suspends on one intent; any other event completes at once."""
    if ctx.is_resume:
        return Complete(output=b"resumed seq %d" % ctx.seq)
    if ctx.event == b"wait":
        ctx.act("slow", {})
        return Suspend()
    return Complete(output=b"%s seq %d" % (ctx.event, ctx.seq))


def test_events_arriving_while_suspended_wait_and_then_run_in_order() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"wait", at_ms=1_000)
        .event(K, b"second", at_ms=1_100)
        .event(K, b"third", at_ms=1_200)
        .result(K, intent_id_for(K, 0, 0), at_ms=2_000)
        .event(K, b"fourth", at_ms=3_000)
    )
    outputs = run_agent(streamed(stream), count_runs, streaming=True)
    assert outputs.errors == []
    completed = sorted(outputs.output, key=lambda raw: raw.split(b"seq ")[1])
    assert completed == [b"resumed seq 0", b"second seq 1", b"third seq 2", b"fourth seq 3"]


def test_a_full_event_buffer_sends_the_overflow_to_errors() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"wait", at_ms=1_000)
        .event(K, b"kept", at_ms=1_100)
        .event(K, b"overflow", at_ms=1_200)
        .result(K, intent_id_for(K, 0, 0), at_ms=2_000)
    )
    outputs = run_agent(
        streamed(stream), count_runs, AgentConfig(max_buffered_events=1), streaming=True
    )
    assert sorted(outputs.output) == [b"kept seq 1", b"resumed seq 0"]
    [error] = outputs.errors
    assert error.reason == "buffer_overflow"
    assert AgentEnvelope.FromString(error.envelope).external_event == b"overflow"
    assert "max_buffered_events" in error.detail
