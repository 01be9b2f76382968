"""RunAgent on the FnApiRunner: outputs, traces, identity, the model path and configuration.

Bad input is refused by admission (test_admission.py); a failed activation commits nothing
(test_commit.py).
"""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_agents import AgentConfig, Complete, RunAgent, intent_id_for
from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    ToolIntent,
    TraceEvent,
)
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import identity_of, trace_id_for
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_contains, respond_with
from tests.core.harness import (
    SharedProvider,
    created,
    event,
    make_registry,
    risk_band,
    run_agent,
    tally,
)
from tests.seed import make_provider


async def assess(ctx: ActivationContext) -> Complete:
    customer = ctx.event.decode()
    band = await ctx.run_tool("risk_band", {"customer_id": customer})
    if band == "high":
        ctx.act("freeze_account", {"customer_id": customer}, ttl_ms=60_000)
        return Complete(output=b"freeze-requested:" + customer.encode())
    return Complete(output=b"cleared:" + customer.encode())


def test_read_only_tools_run_inline_and_side_effects_become_intents() -> None:
    outputs = run_agent(
        created([event(b"c-9", b"cust-9"), event(b"c-1", b"cust-1")]),
        assess,
        AgentConfig(provider_factory=make_provider, tool_registry=make_registry()),
    )
    assert sorted(outputs.output) == [b"cleared:cust-1", b"freeze-requested:cust-9"]
    assert [intent.tool_name for intent in outputs.intents] == ["freeze_account"]
    intent = outputs.intents[0]
    assert intent.intent_id == intent_id_for(b"c-9", 0, 0)
    assert json.loads(intent.args_json) == {"customer_id": "cust-9"}
    assert (intent.created_at_ms, intent.expires_at_ms) == (1_000, 61_000)
    assert outputs.event_types(b"c-9") == [
        "ACTIVATION_START",
        "TOOL_CALL",
        "INTENT_EMITTED",
        "ACTIVATION_END",
    ]
    assert outputs.event_types(b"c-1") == ["ACTIVATION_START", "TOOL_CALL", "ACTIVATION_END"]
    assert outputs.errors == []


def test_trace_fields_are_derived_from_key_seq_and_position() -> None:
    outputs = run_agent(
        created([event(b"c-9", b"cust-9", at_ms=7_000)]),
        assess,
        AgentConfig(tool_registry=make_registry()),
    )
    events = outputs.traces_for(b"c-9")
    root = events[0]
    assert {event.trace_id for event in events} == {trace_id_for(b"c-9", 0)}
    assert [event.sequence for event in events] == [0, 1, 2, 3]
    assert root.parent_span_id == ""
    assert all(event.parent_span_id == root.span_id for event in events[1:])
    assert len({event.span_id for event in events}) == 4
    assert {(event.start_ms, event.end_ms) for event in events} == {(7_000, 7_000)}
    assert [event.step_index for event in events] == [0, 0, 0, 1]


def test_many_keys_each_get_their_own_first_run() -> None:
    keys = [b"key-%d" % index for index in range(40)]
    outputs = run_agent(created([event(key, b"e") for key in keys]), tally)
    assert sorted(outputs.output) == sorted(key + b":0" for key in keys)
    assert len(outputs.traces) == 2 * len(keys)


async def count_in_memory(ctx: ActivationContext) -> Complete:
    ctx.memory.append("events", ctx.event)
    return Complete(output=b"%d:%d" % (ctx.seq, len(ctx.memory.ring("events"))))


def test_several_events_on_one_key_each_see_the_previous_commits() -> None:
    elements = [event(b"same", b"e%d" % index, at_ms=index) for index in range(6)]
    outputs = run_agent(created(elements), count_in_memory)
    assert sorted(outputs.output) == [b"%d:%d" % (seq, seq + 1) for seq in range(6)]


async def stage_two(ctx: ActivationContext) -> Complete:
    await ctx.run_tool("risk_band", {"customer_id": ctx.event.decode()})
    ctx.act("freeze_account", {"customer_id": ctx.event.decode()})
    ctx.request_approval({"customer_id": ctx.event.decode()}, channel="ops")
    return Complete(output=b"done")


def serialized(messages: list[ToolIntent]) -> list[bytes]:
    return sorted(message.SerializeToString(deterministic=True) for message in messages)


def test_two_runs_of_the_same_pipeline_emit_byte_identical_intents_and_traces() -> None:
    elements = [event(b"k-%d" % index, b"cust-%d" % index, at_ms=index) for index in range(10)]
    config = AgentConfig(tool_registry=make_registry())
    first = run_agent(created(elements), stage_two, config)
    second = run_agent(created(elements), stage_two, config)
    assert len(first.intents) == 20
    assert serialized(first.intents) == serialized(second.intents)
    assert sorted(map(identity_of, first.traces)) == sorted(map(identity_of, second.traces))
    for intent in first.intents:
        assert intent.intent_id == intent_id_for(intent.entity_key, 0, intent.step_index)
    kinds = sorted((intent.step_index, intent.kind) for intent in first.intents)
    assert set(kinds) == {(0, ToolIntent.TOOL), (1, ToolIntent.APPROVAL)}


async def ask_twice(ctx: ActivationContext) -> Complete:
    request = LlmRequest(model_id="m", messages=[{"role": "user", "content": "same"}])
    first = await ctx.call_model(request)
    second = await ctx.call_model(request)
    return Complete(output=(first.text + "|" + second.text).encode())


def test_identical_requests_in_one_activation_are_separate_provider_calls() -> None:
    provider = SharedProvider(FakeLLM([(match_contains("same"), respond_with(b"answer"))]))
    outputs = run_agent(
        created([event(b"k", b"e")]),
        ask_twice,
        AgentConfig(provider_factory=provider, model_cache_max_entries=1),
    )
    assert outputs.output == [b"answer|answer"]
    assert provider.fake.call_count == 2
    llm_calls = [e for e in outputs.traces if e.event_type == TraceEvent.LLM_CALL]
    assert sorted(e.step_index for e in llm_calls) == [0, 1]
    assert {e.attributes["beam_agents.cache_hit"] for e in llm_calls} == {"false"}


# -- bad configuration --------------------------------------------------------------------


def not_async(ctx: ActivationContext) -> Complete:
    return Complete()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ttl_ms": 0}, "ttl_ms"),
        ({"activation_timeout_s": 0}, "activation_timeout_s"),
        ({"activation_timeout_s": float("inf")}, "activation_timeout_s"),
        ({"provider_factory": "openai"}, "provider_factory"),
        ({"tool_registry": [risk_band]}, "tool_registry"),
        ({"hitl_policy": "ask"}, "hitl_policy"),
        ({"intent_ttl_ms": 0}, "intent_ttl_ms"),
        ({"max_buffered_events": 0}, "max_buffered_events"),
        ({"model_cache_max_bytes": -1}, "model_cache_max_bytes"),
        ({"model_retry": {"max_attempts": 3}}, "model_retry"),
        ({"circuit_failure_threshold": 0}, "circuit_failure_threshold"),
        ({"circuit_reset_timeout_s": -1.0}, "circuit_reset_timeout_s"),
        ({"max_tokens_per_run": 0}, "max_tokens_per_run"),
        ({"max_tokens_per_run": True}, "max_tokens_per_run"),
    ],
)
def test_bad_configuration_is_refused_with_the_field_named(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AgentConfig(**settings)  # type: ignore[arg-type]


def test_run_agent_needs_an_async_agent_and_an_agent_config() -> None:
    with pytest.raises(ValueError, match="async def"):
        RunAgent(not_async)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="AgentConfig"):
        RunAgent(tally, config={"ttl_ms": 5})  # type: ignore[arg-type]


def test_outputs_use_deterministic_coders() -> None:
    pipeline = beam.Pipeline(runner=FnApiRunner())
    keyed = pipeline | beam.Create([event(b"k", b"e")]).with_output_types(
        tuple[bytes, AgentEnvelope]
    )
    outputs = keyed | RunAgent(tally)
    assert outputs.output.element_type is bytes
    assert outputs.intents.element_type is ToolIntent
    assert outputs.traces.element_type is TraceEvent
    assert outputs.errors.element_type is AgentError
    assert outputs.records.element_type is ActivationRecord
    coders = [beam.coders.registry.get_coder(pc.element_type) for pc in outputs]
    assert [type(coder) for coder in coders] == [
        beam.coders.BytesCoder,
        beam.coders.ProtoCoder,
        beam.coders.ProtoCoder,
        beam.coders.ProtoCoder,
        beam.coders.ProtoCoder,
    ]
