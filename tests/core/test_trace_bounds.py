"""Trace attributes within the effector's limits: whatever a run records, the effector stores.

``TraceRecorder`` keeps at most ``MAX_ATTRIBUTES`` attributes, cuts long names, and cuts values
over ``MAX_ATTRIBUTE_VALUE_BYTES`` (UTF-8) at a character boundary with a visible marker; a
JSON-shaped value nested too deeply is marked the same way, so it is no longer JSON-shaped.
End to end: runs whose error text is 1 MiB reach a real effector and its key page as
completed or failed, never "running".
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from beam_agents import AgentConfig, AgentEnvelope, RunAgent
from beam_agents._protos import (
    MAX_ATTRIBUTE_NAME_CHARS,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    TRUNCATED_MARKER,
    TraceEvent,
    attribute_value_problem,
)
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import NAMESPACE_ATTRIBUTE, TraceRecorder, trace_id_for
from beam_agents.io import WriteTraces
from beam_agents.tools import ToolRegistry, tool
from tests.console.harness import client_for, start_effector

MIB = 1024 * 1024
HugeError: type[Exception] = type("Huge" + "E" * MIB, (Exception,), {})
"""An exception whose type name, which the trace records as its error text, is 1 MiB."""


def recorder(namespace: str | None = None) -> TraceRecorder:
    return TraceRecorder(b"k", 0, trace_id_for(b"k", 0), 0, 1_000, namespace=namespace)


def test_every_recorded_attribute_is_within_the_effectors_limits() -> None:
    trace = recorder("v2")
    attributes = {f"a{n}": "v" for n in range(MAX_ATTRIBUTES + 50)}
    attributes["n" * 10_000] = "long name"
    trace.record(TraceEvent.ACTIVATION_START, 0, attributes)
    [event] = trace.events
    assert len(event.attributes) == MAX_ATTRIBUTES
    assert event.attributes[NAMESPACE_ATTRIBUTE] == "v2"
    assert all(len(name) <= MAX_ATTRIBUTE_NAME_CHARS for name in event.attributes)


def test_a_long_value_is_cut_at_a_character_boundary_with_a_marker() -> None:
    values = {
        "ascii": "x" * (MAX_ATTRIBUTE_VALUE_BYTES + 1),
        "accents": "é" * MAX_ATTRIBUTE_VALUE_BYTES,
        "emoji": "a" + "\U0001f600" * (MAX_ATTRIBUTE_VALUE_BYTES // 4),  # 4 bytes, off by one
        "bidi": "\u202e" * MIB,
    }
    trace = recorder()
    trace.record(TraceEvent.TOOL_CALL, 1, values)
    kept = trace.events[0].attributes
    for name, value in values.items():
        bounded = kept[name]
        assert bounded.endswith(TRUNCATED_MARKER), name
        assert value.startswith(bounded.removesuffix(TRUNCATED_MARKER)), name
        size = len(bounded.encode())
        assert MAX_ATTRIBUTE_VALUE_BYTES - 4 < size <= MAX_ATTRIBUTE_VALUE_BYTES, (name, size)
        assert attribute_value_problem(name, bounded) is None


def test_deep_json_is_marked_and_plain_text_and_small_values_are_kept_as_they_are() -> None:
    deep = "[" * 100 + "]" * 100
    plain = "[" * 5_000 + " not JSON"
    shallow = '{"a": [[1, 2], {"b": "[[[[[["}]}'
    trace = recorder()
    trace.record(TraceEvent.TOOL_CALL, 1, {"deep": deep, "plain": plain, "shallow": shallow})
    kept = trace.events[0].attributes
    assert kept["deep"] == deep + TRUNCATED_MARKER
    assert (kept["plain"], kept["shallow"]) == (plain, shallow)
    assert all(attribute_value_problem(name, value) is None for name, value in kept.items())


@tool
def explode(reason: str) -> str:
    """A read-only tool that fails with an error whose type name is 1 MiB."""
    raise HugeError(reason)


async def agent(ctx: ActivationContext) -> Complete:
    """Run the failing tool; an event saying ``fail`` fails the activation the same way."""
    try:
        await ctx.run_tool("explode", {"reason": ctx.event.decode()})
    except HugeError:
        if ctx.event == b"fail":
            raise
    return Complete(output=b"done")


def test_runs_with_a_megabyte_of_error_text_show_completed_and_failed(tmp_path: Path) -> None:
    with start_effector(tmp_path) as effector:
        config = AgentConfig(tool_registry=ToolRegistry([explode]))
        envelopes = [
            (key, AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=event))
            for key, event in ((b"tool-failed", b"ok"), (b"run-failed", b"fail"))
        ]
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            ran = pipeline | beam.Create(envelopes) | RunAgent(agent, config=config)
            ran.traces | WriteTraces(effector.address)
        with client_for(effector) as client:
            pages = {key: client.get(f"/keys/{key.hex()}").text for key, _ in envelopes}
        stored = {
            key: effector.run(effector.server.store.traces_for_key(key, 10)) for key, _ in envelopes
        }
    assert '<span class="status completed">completed</span>' in pages[b"tool-failed"]
    assert '<span class="status failed">failed</span>' in pages[b"run-failed"]
    assert "running" not in pages[b"tool-failed"] + pages[b"run-failed"]
    [tool_call] = [e for e in stored[b"tool-failed"] if e.event_type == TraceEvent.TOOL_CALL]
    assert tool_call.attributes["error"].startswith("HugeEEE")
    assert tool_call.attributes["error"].endswith(TRUNCATED_MARKER)
    [failure] = stored[b"run-failed"]
    assert failure.event_type == TraceEvent.ERROR
    assert failure.attributes["error"].endswith(TRUNCATED_MARKER)
