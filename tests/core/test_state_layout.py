"""Which state cells an element reads, and the header's record of whether a key is suspended."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import AgentEnvelope, AgentError, KeyHeader, ToolResult
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.dofn import AgentDoFn
from tests.core.harness import InMemoryKeyState

K = b"card-7"
TTL_MS = 60_000


async def hold_then_release(ctx: ActivationContext) -> Complete | Suspend:
    """Suspends on an event saying "hold" (one intent), completes on anything else."""
    if ctx.is_resume:
        return Complete(output=b"released")
    if ctx.event == b"hold":
        ctx.act("freeze", {"card": "7"})
        return Suspend()
    return Complete(output=b"done " + ctx.event)


@pytest.fixture
def dofn() -> Iterator[AgentDoFn]:
    runner = AgentDoFn(hold_then_release, AgentConfig(ttl_ms=TTL_MS))
    runner.setup()
    yield runner
    runner.teardown()


def event(payload: bytes, at_ms: int) -> AgentEnvelope:
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, external_event=payload)


def result_for(seq: int, step: int, at_ms: int) -> AgentEnvelope:
    answer = ToolResult(
        intent_id=intent_id_for(K, seq, step), entity_key=K, status=ToolResult.OK, payload=b"{}"
    )
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=answer)


def main_outputs(outputs: list[Any]) -> list[bytes]:
    return [output for output in outputs if isinstance(output, bytes)]


def errors(outputs: list[Any]) -> list[str]:
    return [
        output.value.reason
        for output in outputs
        if isinstance(output, TaggedOutput) and isinstance(output.value, AgentError)
    ]


def header_of(cells: InMemoryKeyState) -> KeyHeader:
    assert cells.header.value is not None
    return KeyHeader.FromString(cells.header.value)


def test_an_event_on_a_key_that_is_not_suspended_reads_only_the_header(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    assert main_outputs(cells.process(dofn, K, event(b"first", 1_000))) == [b"done first"]
    assert main_outputs(cells.process(dofn, K, event(b"second", 2_000))) == [b"done second"]
    # Beam's state cache weighs every cell a key first reads in a bundle: one cell, one weighing.
    assert cells.header.reads == 2
    assert cells.continuation.reads == 0
    assert header_of(cells).next_seq == 2 and not header_of(cells).suspended


def test_the_header_says_whether_the_key_is_suspended(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    assert cells.continuation.value is not None and header_of(cells).suspended
    # While suspended an event must see the continuation, to wait in the buffer.
    assert main_outputs(cells.process(dofn, K, event(b"later", 2_000))) == []
    assert cells.continuation.reads == 1 and cells.buffer.values
    # The resumed run completes, then the buffered event runs as a new run on the same key.
    outputs = main_outputs(cells.process(dofn, K, result_for(0, 0, 3_000)))
    assert outputs == [b"released", b"done later"]
    assert cells.continuation.value is None and not header_of(cells).suspended
    assert header_of(cells).next_seq == 2


def test_a_key_cleaned_up_while_suspended_is_no_longer_suspended(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    fired = Timestamp(micros=(1_000 + TTL_MS) * 1000)
    assert errors(dofn._on_idle(key=K, fired=fired, **cells.params())) == ["suspension_wiped"]
    assert cells.continuation.value is None and not header_of(cells).suspended
    reads = cells.continuation.reads
    assert main_outputs(cells.process(dofn, K, event(b"again", 70_000))) == [b"done again"]
    assert cells.continuation.reads == reads


def test_a_suspended_key_whose_header_predates_the_flag_still_resumes(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    # State written by a runtime whose header did not record suspensions.
    cells.header.value = KeyHeader(
        schema_version=1, next_seq=1, last_activity_ms=1_000
    ).SerializeToString()
    assert main_outputs(cells.process(dofn, K, result_for(0, 0, 2_000))) == [b"released"]
    assert cells.continuation.value is None
    assert header_of(cells).HasField("suspended") and not header_of(cells).suspended


def test_a_header_that_says_suspended_after_the_run_ended_is_corrected(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    # This runtime suspended the key; then, after a rollback, an earlier runtime's deadline timer
    # ended the run by clearing the continuation alone, leaving the header as it was.
    cells.header.value = KeyHeader(
        schema_version=1, next_seq=1, last_activity_ms=1_000, suspended=True
    ).SerializeToString()
    assert main_outputs(cells.process(dofn, K, event(b"next", 2_000))) == [b"done next"]
    assert cells.continuation.reads == 1
    assert header_of(cells).next_seq == 2 and not header_of(cells).suspended
