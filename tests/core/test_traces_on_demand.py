"""Trace events are built only when a transform of the pipeline reads ``.traces``."""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pytest

from beam_agents import AgentConfig, Complete, RunAgent, Suspend
from beam_agents._protos import ToolIntent, TraceEvent
from beam_agents.core import observability
from beam_agents.core.context import ActivationContext
from tests.core.harness import Outputs, created, event, run_agent

KEYS = [b"acct-1", b"acct-2"]


async def remember_and_act(ctx: ActivationContext) -> Complete | Suspend:
    """Writes memory and stages an intent on every other run: traces, intents and state."""
    ctx.memory.set("last", ctx.event)
    if ctx.seq % 2:
        ctx.act("freeze", {"account": ctx.entity_key.decode()})
        return Suspend(snapshot=ctx.event)
    return Complete(output=ctx.event)


EVENTS = [event(key, b"e%d" % index, 1_000 + index) for index in range(4) for key in KEYS]


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many trace events the runs build (the pipeline runs in this process)."""
    count = [0]

    def counted() -> TraceEvent:
        count[0] += 1
        return TraceEvent()

    # The module's global, not a method: the compiled build calls its methods directly.
    monkeypatch.setattr(observability, "TraceEvent", counted)
    yield count


def _intents(outputs: Outputs) -> list[ToolIntent]:
    return sorted(outputs.intents, key=lambda intent: intent.intent_id)


def test_unread_traces_are_never_built_and_nothing_else_changes(built: list[int]) -> None:
    read = run_agent(created(EVENTS), remember_and_act)
    assert built[0] > 0 and read.traces
    built[0] = 0
    unread = run_agent(created(EVENTS), remember_and_act, read=("output", "intents", "errors"))
    assert built[0] == 0
    assert sorted(unread.output) == sorted(read.output)
    assert _intents(unread) == _intents(read)  # trace ids on intents included
    assert unread.errors == read.errors == []


def test_traces_read_as_a_side_input_are_built(built: list[int]) -> None:
    with beam.Pipeline() as pipeline:
        keyed = pipeline | beam.Create(EVENTS)
        outputs = keyed | RunAgent(remember_and_act, config=AgentConfig())
        _ = outputs.output | beam.Map(
            lambda output, traces: (output, len(traces)), traces=beam.pvalue.AsList(outputs.traces)
        )
    assert built[0] > 0


def test_a_pipeline_reading_nothing_but_outputs_builds_no_trace(built: list[int]) -> None:
    with beam.Pipeline() as pipeline:
        keyed = pipeline | beam.Create(EVENTS)
        outputs = keyed | RunAgent(remember_and_act, config=AgentConfig())
        _ = outputs.output | beam.Map(len)
    assert built[0] == 0


def test_the_config_can_force_traces_on_or_off(built: list[int]) -> None:
    silenced = run_agent(created(EVENTS), remember_and_act, AgentConfig(traces=False))
    assert built[0] == 0 and silenced.traces == [] and silenced.output
    unread = ("output", "intents", "errors")
    run_agent(created(EVENTS), remember_and_act, AgentConfig(traces=True), read=unread)
    assert built[0] > 0


def test_the_traces_switch_takes_only_a_bool_or_none() -> None:
    with pytest.raises(ValueError, match=r"AgentConfig\.traces must be True, False or None"):
        AgentConfig(traces="yes")  # type: ignore[arg-type]
