# mypy: disallow-untyped-calls=False
"""The LangGraph adapter: re-walks, intents, approvals and the thread's checkpoint.

Each test runs a graph through ``RunAgent`` on the streaming runner with a TestStream and
asserts on what the pipeline emitted and what the scripted model was asked.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from beam_agents import AgentConfig, FakeLLM, LlmRequest, tool
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
from beam_agents.core.context import WorkingMemory
from beam_agents.io.run_agent import AgentDoFn
from beam_agents.model.fake import match_any, respond_with_fn
from beam_agents.testing import EnvelopeStream
from tests.adapters.cases.langgraph_case import sync_triage, triage, triage_agent
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


@pytest.mark.parametrize("triage_agent", [triage, sync_triage], ids=["async", "sync"])
def test_triage_stages_the_effect_and_completes_on_its_result(triage_agent: Any) -> None:
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


@pytest.mark.parametrize("triage_agent", [triage, sync_triage], ids=["async", "sync"])
def test_triage_denied_approval_reaches_the_model_as_a_tool_error(triage_agent: Any) -> None:
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


def build_sync_tool_then_ask() -> Any:
    """:func:`build_tool_then_ask` as a sync ``def`` node calling ``invoke``."""
    apply_tool = {tool.name: tool for tool in beam_tools(triage_registry())}["apply_effect"]

    def call_then_ask(state: Notes) -> dict[str, Any]:
        value = apply_tool.invoke({"event_id": "n1", "amount": 5})
        decision = interrupt({"question": f"applied {value}?"})
        return {"messages": [AIMessage(content=f"approved={decision['approved']}")]}

    graph = StateGraph(Notes)
    graph.add_node("call_then_ask", call_then_ask)
    graph.add_edge(START, "call_then_ask")
    return graph


effect_then_ask = LangGraphAgent(build_effect_then_ask)
tool_then_ask = LangGraphAgent(build_tool_then_ask)
sync_tool_then_ask = LangGraphAgent(build_sync_tool_then_ask)


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


@pytest.mark.parametrize(
    "tool_then_ask", [tool_then_ask, sync_tool_then_ask], ids=["async", "sync"]
)
def test_a_tool_call_before_interrupt_is_one_intent_across_result_and_approval(
    tool_then_ask: LangGraphAgent,
) -> None:
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
            memory = WorkingMemory(cells.memory.values)
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

    assert triage.graph() is triage.built()
    copy = cloudpickle.loads(cloudpickle.dumps(triage))
    assert copy._built is None
    assert copy.graph() is not triage.graph()


# -- (f) parallel branches: the re-walk takes the same steps in the same order ---------------


class Branches(TypedDict):
    """The messages the two branches add."""

    messages: Annotated[list[AnyMessage], add_messages]


def _slow_echo_model() -> FakeLLM:
    def respond(request: LlmRequest) -> bytes:
        return b"echo " + str(request.messages[-1]["content"]).encode()

    return FakeLLM([(match_any(), respond_with_fn(respond, latency_ms=50))])


def build_branches() -> Any:
    """START fans out to ``a`` (a model call, then an effect) and ``b`` (a lookup, an effect)."""
    model = BeamChatModel(model_id=MODEL_ID)

    async def a(state: Branches) -> dict[str, Any]:
        reply = await model.ainvoke([HumanMessage(content="x")])
        stage("apply_effect", {"event_id": "x", "amount": 1})
        return {"messages": [reply]}

    async def b(state: Branches) -> dict[str, Any]:
        await asyncio.sleep(0.01)  # a read-only lookup, faster than the model's first answer
        stage("apply_effect", {"event_id": "y", "amount": 2})
        return {"messages": [AIMessage(content="b done")]}

    graph = StateGraph(Branches)
    graph.add_node("a", a)
    graph.add_node("b", b)
    graph.add_edge(START, "a")
    graph.add_edge(START, "b")
    return graph


def _branch_output(state: Any) -> object:
    return sorted(m.text for m in state["messages"] if isinstance(m, AIMessage))


branches = LangGraphAgent(build_branches, output=_branch_output)


def test_parallel_branches_rewalk_in_the_same_order() -> None:
    config, _ = _config(_slow_echo_model())
    first = _first_activation(branches, config, b"go")
    assert first.errors == []
    effects = {json.loads(i.args_json)["event_id"]: i for i in _tool_intents(first, "apply_effect")}
    assert sorted(effects) == ["x", "y"]

    config, provider = _config(_slow_echo_model())
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .result(KEY, effects["x"].intent_id, payload=b'{"applied": 1}', at_ms=2_000)
        .result(KEY, effects["y"].intent_id, payload=b'{"applied": 2}', at_ms=3_000)
    )
    outputs = _run(stream, branches, config)
    assert outputs.errors == []
    assert sorted(i.intent_id for i in _tool_intents(outputs, "apply_effect")) == sorted(
        i.intent_id for i in effects.values()
    )
    assert outputs.output == [b'["b done","echo x"]']
    assert provider.fake.call_count == 1  # the re-walks answered from the replay cache


def test_a_max_concurrency_other_than_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        LangGraphAgent(build_chat, config={"max_concurrency": 4})
    LangGraphAgent(build_chat, config={"max_concurrency": 1})


# -- (g) sync calls on the event loop; registry errors that are not the model's --------------


def build_sync_call_in_async_node() -> Any:
    """An async node calling the model synchronously, which would block the loop."""
    model = BeamChatModel(model_id=MODEL_ID)

    async def chat(state: Notes) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(Notes)
    graph.add_node("chat", chat)
    graph.add_edge(START, "chat")
    return graph


def test_a_sync_model_call_on_the_event_loop_fails_the_activation() -> None:
    agent = LangGraphAgent(build_sync_call_in_async_node)
    config, provider = _config(_echo_model())
    outputs = _first_activation(agent, config, b"hi")
    assert outputs.output == []
    (error,) = outputs.errors
    assert "AdapterUsageError" in error.detail and "event loop" in error.detail
    assert provider.fake.call_count == 0


@tool
def unregistered_lookup(account: str) -> dict[str, Any]:
    """A read-only tool missing from the pipeline's registry.

    Args:
        account: The account id.
    """
    return {"account": account}


@tool
def apply_effect(event_id: str, amount: int) -> dict[str, Any]:
    """A read-only tool named like the pipeline's side-effecting ``apply_effect``.

    Args:
        event_id: The event.
        amount: The amount.
    """
    return {"event_id": event_id, "amount": amount}


def _calling(beam_tool: Any, arguments: dict[str, Any]) -> Any:
    def build() -> Any:
        (langchain_tool,) = beam_tools([beam_tool])

        async def call(state: Notes) -> dict[str, Any]:
            value = await langchain_tool.ainvoke(arguments)
            return {"messages": [AIMessage(content=str(value))]}

        graph = StateGraph(Notes)
        graph.add_node("call", call)
        graph.add_edge(START, "call")
        return graph

    return LangGraphAgent(build)


@pytest.mark.parametrize(
    ("beam_tool", "arguments", "error_type"),
    [
        (unregistered_lookup, {"account": "a"}, "ToolNotFoundError"),
        (apply_effect, {"event_id": "e", "amount": 1}, "SideEffectToolError"),
    ],
    ids=["not-found", "side-effect"],
)
def test_a_registry_tool_error_fails_the_activation(
    beam_tool: Any, arguments: dict[str, Any], error_type: str
) -> None:
    config, _ = _config(_echo_model())
    outputs = _first_activation(_calling(beam_tool, arguments), config, b"go")
    assert outputs.output == [] and outputs.intents == []
    (error,) = outputs.errors
    assert error_type in error.detail


@tool
def greeting(name: str) -> str:
    """Say hello (read-only; returns plain text).

    Args:
        name: Who to greet.
    """
    return f"hello {name}"


def test_a_tool_returning_text_reaches_the_model_as_that_text() -> None:
    from langgraph.prebuilt import ToolNode, tools_condition

    from beam_agents import ToolRegistry
    from beam_agents.adapters.langgraph import BeamChatModel, LangGraphAgent, beam_tools
    from beam_agents.model.client import ToolCall

    registry = ToolRegistry([greeting])

    def build() -> StateGraph[Any, Any, Any, Any]:
        tools = beam_tools(registry)
        model = BeamChatModel(model_id="m").bind_tools(tools)

        async def agent(state: Notes) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(Notes)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph

    fake: FakeLLM

    def answer(request: LlmRequest) -> bytes:
        said = [m["content"] for m in request.messages if m["role"] == "tool"]
        if not said:
            return fake.scripted_body(request, "", [ToolCall("c", "greeting", {"name": "ann"})])
        return fake.scripted_body(request, f"the tool said [{said[0]}]")

    fake = FakeLLM([(match_any(), respond_with_fn(answer))])
    stream = EnvelopeStream().event(b"k", b"greet ann", at_ms=1)
    config = AgentConfig(provider_factory=SharedProvider(fake), tool_registry=registry)
    outputs = run_agent(streamed(stream), LangGraphAgent(build), config, streaming=True)
    assert outputs.output == [b"the tool said [hello ann]"]  # not the JSON string '"hello ann"'
