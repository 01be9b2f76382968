# mypy: disallow-untyped-calls=False
"""The LangGraph adapter: re-walks, intents, approvals and the thread's checkpoint.

Each test runs a graph through ``RunAgent`` on the streaming runner with a TestStream and
asserts on what the pipeline emitted and what the scripted model was asked.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from beam_agents import AgentConfig, FakeLLM, LlmRequest
from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.adapters.langgraph import (
    MEMORY_SLOT,
    AdapterUsageError,
    BeamChatModel,
    BeamCheckpointSaver,
    LangGraphAgent,
    beam_tools,
    stage,
    thread_id_for,
)
from beam_agents.core.dofn import AgentDoFn
from beam_agents.core.memory import WorkingMemory
from beam_agents.model.fake import match_any, respond_with_fn
from beam_agents.testing import EnvelopeStream
from tests.adapters.cases.langgraph_case import triage, triage_agent
from tests.adapters.scenario import (
    APPLIED,
    MODEL_ID,
    NOT_APPLIED,
    event_payload,
    triage_model,
    triage_registry,
)
from tests.core.harness import InMemoryKeyState, Outputs, SharedProvider, run_agent, streamed

KEY = b"acct-key"


def _config(fake: FakeLLM) -> tuple[AgentConfig, SharedProvider]:
    provider = SharedProvider(fake)
    return AgentConfig(provider_factory=provider, tool_registry=triage_registry()), provider


def _tool_intents(outputs: Outputs, name: str) -> list[ToolIntent]:
    return [i for i in outputs.intents if i.kind == ToolIntent.TOOL and i.tool_name == name]


def _approvals(outputs: Outputs) -> list[ToolIntent]:
    return [i for i in outputs.intents if i.kind == ToolIntent.APPROVAL]


def _run(stream: EnvelopeStream, agent: Any, config: AgentConfig) -> Outputs:
    return run_agent(streamed(stream), agent, config, streaming=True)


def _first_activation(agent: Any, config: AgentConfig, payload: bytes) -> Outputs:
    return _run(EnvelopeStream().event(KEY, payload, at_ms=1_000), agent, config)


# -- (a) the scenario: event -> intent -> result -> APPLIED ---------------------------------


def test_triage_stages_the_effect_and_completes_on_its_result() -> None:
    payload = event_payload("e1", account="acct-ann", amount=11)
    config, provider = _config(triage_model())
    first = _first_activation(triage_agent, config, payload)
    assert first.errors == [] and first.output == []
    (effect,) = _tool_intents(first, "apply_effect")
    assert json.loads(effect.args_json) == {"amount": 11, "event_id": "e1"}
    assert _tool_intents(first, "lookup_account") == []  # read-only: ran inline
    assert provider.fake.call_count == 2  # lookup turn, apply turn

    config, provider = _config(triage_model())
    result = b'{"applied": 11, "event_id": "e1"}'
    stream = (
        EnvelopeStream()
        .event(KEY, payload, at_ms=1_000)
        .result(KEY, effect.intent_id, payload=result, at_ms=2_000)
    )
    outputs = _run(stream, triage_agent, config)
    assert outputs.errors == []
    assert [i.intent_id for i in _tool_intents(outputs, "apply_effect")] == [effect.intent_id]
    (answer,) = outputs.output
    assert answer.decode() == f'{APPLIED} {{"applied":11,"event_id":"e1"}}'
    # Three distinct model turns; the resume re-walked the first two from the replay cache.
    assert provider.fake.call_count == 3
    lookups = [r for r in provider.fake.requests if "lookup-e1" in str(r.messages)]
    assert len(lookups) == 2  # the apply turn and the final turn, each asked once


def test_triage_denied_approval_reaches_the_model_as_a_tool_error() -> None:
    payload = event_payload("e2", account="acct-dee", amount=44, approval=True)
    config, _ = _config(triage_model())
    first = _first_activation(triage_agent, config, payload)
    (asked,) = _approvals(first)
    assert json.loads(asked.args_json) == {
        "arguments": {"amount": 44, "event_id": "e2"},
        "tool": "apply_effect",
    }
    assert _tool_intents(first, "apply_effect") == []  # nothing staged before the decision

    config, provider = _config(triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, payload, at_ms=1_000)
        .approval(KEY, asked.intent_id, approved=False, approver="ops", at_ms=2_000)
    )
    outputs = _run(stream, triage_agent, config)
    assert outputs.errors == [] and _tool_intents(outputs, "apply_effect") == []
    (answer,) = outputs.output
    assert answer.decode().startswith(f"{NOT_APPLIED}: denied by ops")
    last = provider.fake.requests[-1].messages[-1]
    assert last["role"] == "tool" and last.get("is_error") is True


def test_triage_approved_applies_after_the_decision_and_the_result() -> None:
    payload = event_payload("e3", account="acct-cid", amount=33, approval=True)
    config, _ = _config(triage_model())
    (asked,) = _approvals(_first_activation(triage_agent, config, payload))

    config, _ = _config(triage_model())
    approved = (
        EnvelopeStream()
        .event(KEY, payload, at_ms=1_000)
        .approval(KEY, asked.intent_id, approved=True, at_ms=2_000)
    )
    (effect,) = _tool_intents(_run(approved, triage_agent, config), "apply_effect")

    config, provider = _config(triage_model())
    stream = approved.result(KEY, effect.intent_id, payload=b'{"applied": 33}', at_ms=3_000)
    outputs = _run(stream, triage_agent, config)
    assert outputs.errors == []
    assert [i.intent_id for i in _approvals(outputs)] == [asked.intent_id]
    assert [i.intent_id for i in _tool_intents(outputs, "apply_effect")] == [effect.intent_id]
    assert outputs.output == [f'{APPLIED} {{"applied":33}}'.encode()]
    assert provider.fake.call_count == 3


# -- (b) a side effect before interrupt() runs once across the resume -----------------------


class Notes(TypedDict):
    """A state with messages only."""

    messages: Annotated[list[AnyMessage], add_messages]


def build_effect_then_ask() -> Any:
    """One node: stage apply_effect, then ask a person; the node reruns on resume."""

    async def act_then_ask(state: Notes) -> dict[str, Any]:
        stage("apply_effect", {"event_id": "n1", "amount": 5})
        decision = interrupt({"question": "was the effect right?"})
        return {"messages": [AIMessage(content=f"approved={decision['approved']}")]}

    graph = StateGraph(Notes)
    graph.add_node("act_then_ask", act_then_ask)
    graph.add_edge(START, "act_then_ask")
    return graph


def build_tool_then_ask() -> Any:
    """The same through the LangChain tool, which waits for the effect's result."""
    apply_tool = {tool.name: tool for tool in beam_tools(triage_registry())}["apply_effect"]

    async def call_then_ask(state: Notes) -> dict[str, Any]:
        value = await apply_tool.ainvoke({"event_id": "n1", "amount": 5})
        decision = interrupt({"question": f"applied {value}?"})
        return {"messages": [AIMessage(content=f"approved={decision['approved']}")]}

    graph = StateGraph(Notes)
    graph.add_node("call_then_ask", call_then_ask)
    graph.add_edge(START, "call_then_ask")
    return graph


effect_then_ask = LangGraphAgent(build_effect_then_ask)
tool_then_ask = LangGraphAgent(build_tool_then_ask)


def test_a_node_stages_its_effect_once_across_the_interrupt_resume() -> None:
    config, _ = _config(triage_model())
    first = _first_activation(effect_then_ask.run, config, b"go")
    (effect,) = _tool_intents(first, "apply_effect")
    (asked,) = _approvals(first)

    config, _ = _config(triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .approval(KEY, asked.intent_id, approved=True, at_ms=2_000)
        .result(KEY, effect.intent_id, payload=b'{"applied": 5}', at_ms=3_000)
    )
    outputs = _run(stream, effect_then_ask.run, config)
    assert outputs.errors == []
    assert [i.intent_id for i in _tool_intents(outputs, "apply_effect")] == [effect.intent_id]
    assert [i.intent_id for i in _approvals(outputs)] == [asked.intent_id]
    assert outputs.output == [b"approved=True"]


def test_a_tool_call_before_interrupt_is_one_intent_across_result_and_approval() -> None:
    config, _ = _config(triage_model())
    first = _first_activation(tool_then_ask.run, config, b"go")
    (effect,) = _tool_intents(first, "apply_effect")
    assert _approvals(first) == []  # the tool waits for its result before the node goes on

    config, _ = _config(triage_model())
    with_result = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .result(KEY, effect.intent_id, payload=b'{"applied": 5}', at_ms=2_000)
    )
    second = _run(with_result, tool_then_ask.run, config)
    (asked,) = _approvals(second)

    config, _ = _config(triage_model())
    stream = with_result.approval(KEY, asked.intent_id, approved=False, at_ms=3_000)
    outputs = _run(stream, tool_then_ask.run, config)
    assert outputs.errors == []
    assert [i.intent_id for i in _tool_intents(outputs, "apply_effect")] == [effect.intent_id]
    assert [i.intent_id for i in _approvals(outputs)] == [asked.intent_id]
    assert outputs.output == [b"approved=False"]


# -- (c) state across runs: the thread's checkpoint in memory --------------------------------


def _echo_model() -> FakeLLM:
    def respond(request: LlmRequest) -> bytes:
        users = [m["content"] for m in request.messages if m["role"] == "user"]
        return " | ".join(users).encode()

    return FakeLLM([(match_any(), respond_with_fn(respond))])


def build_chat() -> Any:
    """One model node over the messages: the thread's conversation grows run by run."""
    model = BeamChatModel(model_id=MODEL_ID)

    async def chat(state: Notes) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(Notes)
    graph.add_node("chat", chat)
    graph.add_edge(START, "chat")
    return graph


chat = LangGraphAgent(build_chat)


def test_the_second_run_continues_the_threads_conversation() -> None:
    config, provider = _config(_echo_model())
    stream = EnvelopeStream().event(KEY, b"first", at_ms=1_000).event(KEY, b"second", at_ms=2_000)
    outputs = _run(stream, chat.run, config)
    assert outputs.errors == []
    assert sorted(outputs.output) == [b"first", b"first | second"]
    second = provider.fake.requests[-1]
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    assert second.messages[1] == {"role": "assistant", "content": "first"}


def test_memory_holds_only_the_latest_checkpoint() -> None:
    config, _ = _config(_echo_model())
    dofn = AgentDoFn(chat.run, config)
    dofn.setup()
    cells = InMemoryKeyState()
    sizes: list[int] = []
    blob: bytes | None = None
    try:
        for n, text in enumerate((b"one", b"two", b"three")):
            envelope = AgentEnvelope(entity_key=KEY, event_time_ms=1_000 + n, external_event=text)
            cells.process(dofn, KEY, envelope)
            memory = WorkingMemory(cells.memory.value)
            blob = memory.get(MEMORY_SLOT)
            assert blob is not None and list(memory.keys()) == [MEMORY_SLOT]
            sizes.append(len(blob))
    finally:
        dofn.teardown()
    saver = BeamCheckpointSaver(thread_id_for(KEY))
    saver.load(blob)
    (stored,) = saver.list(None)  # one checkpoint: the latest, no history
    messages = stored.checkpoint["channel_values"]["messages"]
    assert [m.content for m in messages] == [
        "one",
        "one",
        "two",
        "one | two",
        "three",
        "one | two | three",
    ]
    assert sizes[0] < sizes[1] < sizes[2]


# -- (d) a checkpoint over its limit fails the activation loudly -----------------------------


def test_a_checkpoint_over_its_limit_fails_the_activation() -> None:
    tiny = LangGraphAgent(build_chat, checkpoint_max_bytes=64)
    config, _ = _config(_echo_model())
    outputs = _run(EnvelopeStream().event(KEY, b"hello", at_ms=1_000), tiny.run, config)
    assert outputs.output == []
    (error,) = outputs.errors
    assert "CheckpointTooLargeError" in error.detail or "checkpoint_max_bytes" in error.detail


# -- (e) the model and tools outside an adapter run ------------------------------------------


@pytest.mark.asyncio
async def test_model_and_tools_outside_a_run_raise_adapter_usage_error() -> None:
    with pytest.raises(AdapterUsageError):
        await BeamChatModel(model_id=MODEL_ID).ainvoke([HumanMessage(content="hi")])
    (lookup, apply_tool) = beam_tools(triage_registry())
    with pytest.raises(AdapterUsageError):
        await lookup.ainvoke({"account": "a"})
    with pytest.raises(AdapterUsageError):
        await apply_tool.ainvoke({"event_id": "e", "amount": 1})


def test_the_agent_pickles_without_its_built_graph() -> None:
    import cloudpickle

    triage.graph()
    copy = cloudpickle.loads(cloudpickle.dumps(triage))
    assert copy._graph is None
    assert copy.graph() is not triage.graph()
