"""The Pydantic AI adapter: the triage scenario, approvals, sessions, bounds, misuse, batches."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from beam_agents import (
    AgentConfig,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    ToolRegistry,
    intent_id_for,
    tool,
)
from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.adapters import AdapterUsageError, current_activation
from beam_agents.adapters.pydantic_ai import (
    BeamModel,
    BeamToolset,
    HistoryLimits,
    HistoryTooLargeError,
    PydanticAIAgent,
)
from beam_agents.model.client import ToolCall
from beam_agents.model.fake import match_any, respond_with_fn
from beam_agents.testing import EnvelopeStream
from tests.adapters import scenario
from tests.adapters.cases.pydantic_ai_case import triage_agent
from tests.core.harness import Outputs, SharedProvider, run_agent, streamed
from tests.semantics.gate_tools import apply_effect

KEY = b"acct-7"


def _config(provider: SharedProvider) -> AgentConfig:
    return AgentConfig(provider_factory=provider, tool_registry=scenario.triage_registry())


def _event(event_id: str, *, approval: bool = False) -> bytes:
    return scenario.event_payload(event_id, account="acct-7", amount=12, approval=approval)


def _run(stream: EnvelopeStream, provider: SharedProvider, agent: Any = triage_agent) -> Outputs:
    return run_agent(streamed(stream), agent, _config(provider), streaming=True)


def _tool_intents(outputs: Outputs) -> list[ToolIntent]:
    return [intent for intent in outputs.intents if intent.kind == ToolIntent.TOOL]


def _distinct_requests(fake: FakeLLM) -> int:
    return len({request.content_digest() for request in fake.requests})


APPLIED_PAYLOAD = b'{"applied":12,"event_id":"e1"}'


def test_triage_stages_one_intent_and_applies_on_resume() -> None:
    provider = SharedProvider(scenario.triage_model())
    apply_id = intent_id_for(KEY, 0, 2)  # steps 0 and 1 are the two model turns
    stream = (
        EnvelopeStream()
        .event(KEY, _event("e1"), at_ms=1_000)
        .result(KEY, apply_id, payload=APPLIED_PAYLOAD, at_ms=2_000)
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    intents = _tool_intents(outputs)
    assert [(i.tool_name, i.intent_id) for i in intents] == [("apply_effect", apply_id)]
    assert json.loads(intents[0].args_json) == {"event_id": "e1", "amount": 12}
    assert outputs.output == [b"APPLIED " + APPLIED_PAYLOAD]
    fake = provider.fake
    assert fake.call_count == 3 == _distinct_requests(fake)  # nothing repeated across the resume
    first = fake.requests[0]
    assert first.model_id == scenario.MODEL_ID
    assert first.messages[0] == {"role": "system", "content": scenario.SYSTEM_PROMPT}
    assert [tool["name"] for tool in first.tools_schema] == ["lookup_account", "apply_effect"]


def test_failed_intent_reaches_the_model_as_a_tool_error() -> None:
    provider = SharedProvider(scenario.triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, _event("e1"), at_ms=1_000)
        .result(
            KEY,
            intent_id_for(KEY, 0, 2),
            status=ToolResult.REJECTED,
            error_message="ledger closed",
            at_ms=2_000,
        )
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    assert outputs.output == [
        b"NOT APPLIED: apply_effect was rejected and did not run: ledger closed"
    ]
    last = provider.fake.requests[-1].messages[-1]
    assert last["role"] == "tool" and last["is_error"] is True


@pytest.mark.parametrize("approved", [True, False])
def test_approval_decides_whether_the_effect_is_staged(approved: bool) -> None:
    provider = SharedProvider(scenario.triage_model())
    approval_id = intent_id_for(KEY, 0, 2)
    apply_id = intent_id_for(KEY, 0, 3)
    stream = (
        EnvelopeStream()
        .event(KEY, _event("e1", approval=True), at_ms=1_000)
        .approval(KEY, approval_id, approved=approved, approver="dana", at_ms=2_000)
    )
    if approved:
        stream.result(KEY, apply_id, payload=APPLIED_PAYLOAD, at_ms=3_000)
    outputs = _run(stream, provider)
    assert outputs.errors == []
    approvals = [i for i in outputs.intents if i.kind == ToolIntent.APPROVAL]
    assert [i.intent_id for i in approvals] == [approval_id]
    assert json.loads(approvals[0].args_json) == {
        "tool": "apply_effect",
        "arguments": {"event_id": "e1", "amount": 12},
    }
    if approved:
        assert [i.intent_id for i in _tool_intents(outputs)] == [apply_id]
        assert outputs.output == [b"APPLIED " + APPLIED_PAYLOAD]
    else:
        assert _tool_intents(outputs) == []
        assert outputs.output == [b"NOT APPLIED: denied by dana"]
    assert provider.fake.call_count == 3 == _distinct_requests(provider.fake)


# -- sessions: the key's history across runs, bounded ---------------------------------------


def _chat_model() -> FakeLLM:
    """Answers ``turn <n>: <last user message>``; ``n`` counts the user messages it sees."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        users = [m["content"] for m in request.messages if m.get("role") == "user"]
        return fake.scripted_body(request, f"turn {len(users)}: {users[-1]}")

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def build_chat_agent() -> Agent[None, str]:
    return Agent(system_prompt="You chat.")


def test_history_carries_the_session_and_is_bounded() -> None:
    provider = SharedProvider(_chat_model())
    chat = PydanticAIAgent(build_chat_agent, model_id="chat", toolsets=(), history_max_messages=2)
    stream = EnvelopeStream()
    for n, text in enumerate(["hello", "again", "third"]):
        stream.event(KEY, text.encode(), at_ms=1_000 + n)
    outputs = _run(stream, provider, chat.run)
    assert outputs.errors == []
    assert outputs.output == [b"turn 1: hello", b"turn 2: again", b"turn 2: third"]
    second, third = (list(request.messages) for request in provider.fake.requests[1:])
    assert second == [
        {"role": "system", "content": "You chat."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "turn 1: hello"},
        {"role": "user", "content": "again"},
    ]
    # Two messages kept: the second turn only, with the system prompt carried over.
    assert third == [
        {"role": "system", "content": "You chat."},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "turn 2: again"},
        {"role": "user", "content": "third"},
    ]


def _turn(n: int, *, with_tool: bool) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(f"question {n}")])]
    if with_tool:
        call = ToolCallPart("lookup_account", {"account": "a"}, tool_call_id=f"c{n}")
        messages.append(ModelResponse(parts=[call]))
        messages.append(ModelRequest(parts=[ToolReturnPart("lookup_account", "x" * 50, f"c{n}")]))
    messages.append(ModelResponse(parts=[TextPart(f"answer {n}")]))
    return messages


def _decoded(blob: bytes) -> list[dict[str, Any]]:
    return list(json.loads(blob))


def test_history_cuts_only_at_turn_boundaries() -> None:
    first = _turn(1, with_tool=True)
    first[0] = ModelRequest(parts=[SystemPromptPart("sys"), *first[0].parts])
    messages = [*first, *_turn(2, with_tool=True), *_turn(3, with_tool=False)]
    kept = _decoded(HistoryLimits(max_messages=5).encode(messages))
    # The 4-message turn 2 does not fit beside turn 3 within 5: only turn 3, system prompt first.
    assert len(kept) == 2
    assert [p["part_kind"] for p in kept[0]["parts"]] == ["system-prompt", "user-prompt"]
    assert kept[0]["parts"][1]["content"] == "question 3"
    # A turn longer than max_messages is kept whole (its call stays with its return).
    whole = _decoded(HistoryLimits(max_messages=1).encode(_turn(1, with_tool=True)))
    assert len(whole) == 4
    # Bytes bound the history too; past them even for the latest turn is an error.
    small = HistoryLimits(max_bytes=len(HistoryLimits().encode(messages)) - 1).encode(messages)
    assert len(_decoded(small)) < len(messages)
    with pytest.raises(HistoryTooLargeError, match="history_max_bytes=100"):
        HistoryLimits(max_bytes=100).encode(_turn(1, with_tool=True))
    with pytest.raises(ValueError, match="history_max_bytes"):
        HistoryLimits(max_bytes=2 << 20)


# -- misuse ----------------------------------------------------------------------------------


def test_model_and_tools_outside_an_adapter_run_raise() -> None:
    agent = Agent(system_prompt="x")
    with pytest.raises(AdapterUsageError):
        agent.run_sync("hi", model=BeamModel("m"))

    def call_lookup(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        call = ToolCallPart("lookup_account", {"account": "a"}, tool_call_id="c1")
        return ModelResponse(parts=[call])

    toolset = BeamToolset(scenario.triage_registry())
    with pytest.raises(AdapterUsageError):
        agent.run_sync("hi", model=FunctionModel(call_lookup), toolsets=[toolset])


def test_an_agent_that_does_not_pickle_asks_for_a_builder() -> None:
    with pytest.raises(TypeError, match="zero-argument function"):
        PydanticAIAgent(Agent(system_prompt="x"), model_id="m")
    with pytest.raises(TypeError, match="pydantic_ai Agent"):
        PydanticAIAgent("not an agent", model_id="m")  # type: ignore[arg-type]


_BUILDS: list[int] = []


def build_counted_agent() -> Agent[None, str]:
    _BUILDS.append(1)
    return Agent(system_prompt="x")


def test_the_agent_is_built_once_and_pickles_without_it() -> None:
    from apache_beam.internal import pickler

    wrapper = PydanticAIAgent(build_counted_agent, model_id="m")
    _BUILDS.clear()
    built = wrapper.agent()
    assert wrapper.agent() is built and len(_BUILDS) == 1
    copy = pickler.loads(pickler.dumps(wrapper))  # type: ignore[no-untyped-call]
    assert len(_BUILDS) == 1  # the copy carries no built agent ...
    assert copy.agent() is not built and len(_BUILDS) == 2  # ... and builds its own


def test_importing_beam_agents_does_not_import_pydantic_ai() -> None:
    code = "import sys, beam_agents, beam_agents.adapters; print('pydantic_ai' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# -- a turn with two side-effecting calls ------------------------------------------------------


def _parallel_model() -> FakeLLM:
    """Asks for two ``apply_effect`` calls in one turn, then reports both results."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if results:
            return fake.scripted_body(request, "done " + " | ".join(results))
        calls = (
            ToolCall("p1", "apply_effect", {"event_id": "a", "amount": 1}),
            ToolCall("p2", "apply_effect", {"event_id": "b", "amount": 2}),
        )
        return fake.scripted_body(request, "", calls)

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def test_parallel_calls_are_all_staged_before_suspending() -> None:
    provider = SharedProvider(_parallel_model())
    agent = PydanticAIAgent(build_chat_agent, model_id="parallel")
    first, second = intent_id_for(KEY, 0, 1), intent_id_for(KEY, 0, 2)
    stream = (
        EnvelopeStream()
        .event(KEY, b"apply both", at_ms=1_000)
        .result(KEY, second, payload=b'"b done"', at_ms=2_000)
        .result(KEY, first, payload=b'"a done"', at_ms=3_000)
    )
    outputs = _run(stream, provider, agent.run)
    assert outputs.errors == []
    intents = _tool_intents(outputs)
    assert [i.intent_id for i in intents] == [first, second]  # in the model's order
    assert [json.loads(i.args_json)["event_id"] for i in intents] == ["a", "b"]
    assert outputs.output == [b"done a done | b done"]
    assert provider.fake.call_count == 2 == _distinct_requests(provider.fake)


# -- tool call ids a provider reuses across turns ----------------------------------------------


def _reusing_model() -> FakeLLM:
    """Calls ``apply_effect`` once per turn, twice in all, each time with the id ``call_0``."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if len(results) == 2:
            return fake.scripted_body(request, "done " + " | ".join(results))
        event_id = "ab"[len(results)]
        call = ToolCall("call_0", "apply_effect", {"event_id": event_id, "amount": 1})
        return fake.scripted_body(request, "", (call,))

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def test_a_reused_call_id_in_a_later_turn_is_a_new_intent() -> None:
    provider = SharedProvider(_reusing_model())
    agent = PydanticAIAgent(build_chat_agent, model_id="reuse")
    first, second = intent_id_for(KEY, 0, 1), intent_id_for(KEY, 0, 3)  # steps 0, 2, 4: model
    stream = (
        EnvelopeStream()
        .event(KEY, b"apply twice", at_ms=1_000)
        .result(KEY, first, payload=b'"a done"', at_ms=2_000)
        .result(KEY, second, payload=b'"b done"', at_ms=3_000)
    )
    outputs = _run(stream, provider, agent)
    assert outputs.errors == []
    intents = _tool_intents(outputs)
    assert [i.intent_id for i in intents] == [first, second]
    assert [json.loads(i.args_json)["event_id"] for i in intents] == ["a", "b"]
    assert outputs.output == [b"done a done | b done"]


def test_a_reused_call_id_needing_approval_asks_again() -> None:
    provider = SharedProvider(_reusing_model())
    agent = PydanticAIAgent(
        build_chat_agent,
        model_id="reuse",
        toolsets=[BeamToolset(approval_required={"apply_effect"})],
    )
    # Steps: 0 model, 1 approval a, 2 apply a, 3 model, 4 approval b (denied), 5 model.
    ask_a, apply_a, ask_b = (intent_id_for(KEY, 0, step) for step in (1, 2, 4))
    stream = (
        EnvelopeStream()
        .event(KEY, b"apply twice", at_ms=1_000)
        .approval(KEY, ask_a, approved=True, approver="dana", at_ms=2_000)
        .result(KEY, apply_a, payload=b'"a done"', at_ms=3_000)
        .approval(KEY, ask_b, approved=False, approver="erin", at_ms=4_000)
    )
    outputs = _run(stream, provider, agent)
    assert outputs.errors == []
    approvals = [i for i in outputs.intents if i.kind == ToolIntent.APPROVAL]
    assert [i.intent_id for i in approvals] == [ask_a, ask_b]
    assert [json.loads(i.args_json)["arguments"]["event_id"] for i in approvals] == ["a", "b"]
    assert [i.intent_id for i in _tool_intents(outputs)] == [apply_a]
    assert outputs.output == [b"done a done | denied by erin"]


def test_a_call_without_an_id_is_named_by_its_request_not_the_response_bytes() -> None:
    model = BeamModel("m")
    body = LlmResponse(b"same body", tool_calls=(ToolCall("", "apply_effect", {}),))
    one, two = LlmRequest("m", ["turn one"]), LlmRequest("m", ["turn two"])

    def call_id(request: LlmRequest) -> str:
        [part] = model.model_response(body, request).parts
        assert isinstance(part, ToolCallPart)
        return part.tool_call_id

    assert call_id(one) == call_id(one) != call_id(two)


# -- tools the registry does not hold ------------------------------------------------------------


def _calls_then_answers(tool_name: str, arguments: dict[str, Any]) -> FakeLLM:
    """Calls ``tool_name`` once, then answers with the tool's result."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if results:
            return fake.scripted_body(request, "got " + results[0])
        return fake.scripted_body(request, "", (ToolCall("c1", tool_name, arguments),))

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


@tool(name="apply_effect")
def apply_effect_read_only(event_id: str, amount: int) -> str:
    """A read-only stand-in for the side-effecting ``apply_effect``."""
    return "applied in the pipeline"


@pytest.mark.parametrize(
    ("tool_name", "offered", "error"),
    [
        # The toolset offers lookup_account, the run's AgentConfig does not hold it.
        ("lookup_account", scenario.triage_registry(), "ToolNotFoundError"),
        # The toolset calls apply_effect inline, the run's AgentConfig says it has effects.
        ("apply_effect", ToolRegistry([apply_effect_read_only]), "SideEffectToolError"),
    ],
)
def test_a_registry_error_fails_the_activation(
    tool_name: str, offered: ToolRegistry, error: str
) -> None:
    arguments = (
        {"account": "a"} if tool_name == "lookup_account" else {"event_id": "e", "amount": 1}
    )
    provider = SharedProvider(_calls_then_answers(tool_name, arguments))
    agent = PydanticAIAgent(build_chat_agent, model_id="m", toolsets=[BeamToolset(offered)])
    config = AgentConfig(provider_factory=provider, tool_registry=ToolRegistry([apply_effect]))
    stream = EnvelopeStream().event(KEY, b"do it", at_ms=1_000)
    outputs = run_agent(streamed(stream), agent, config, streaming=True)
    assert outputs.output == []
    [failure] = outputs.errors
    assert failure.reason == "activation_error"
    assert error in failure.detail
    assert provider.fake.call_count == 1  # the model never read the failure as a tool result


def build_clock_agent() -> Agent[None, str]:
    agent = Agent(system_prompt="You tell the time.")

    @agent.tool_plain
    def local_clock_for_warning_test() -> str:
        return "noon"

    return agent


def test_a_tool_outside_the_registry_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    provider = SharedProvider(_calls_then_answers("local_clock_for_warning_test", {}))
    agent = PydanticAIAgent(build_clock_agent, model_id="m")
    stream = (
        EnvelopeStream().event(KEY, b"time?", at_ms=1_000).event(KEY, b"time again?", at_ms=2_000)
    )
    with caplog.at_level(logging.WARNING, logger="beam_agents.adapters.pydantic_ai"):
        outputs = _run(stream, provider, agent)
    assert outputs.errors == []
    assert outputs.output == [b"got noon", b"got noon"]
    warnings = [
        r.getMessage() for r in caplog.records if "local_clock_for_warning_test" in r.getMessage()
    ]
    assert warnings == [
        "tool 'local_clock_for_warning_test' is not in AgentConfig.tool_registry: it runs in the "
        "pipeline on every activation of the run; make it a registry tool (side_effect=True if "
        "it has effects)"
    ]


# -- the history is saved only when the run completes ------------------------------------------


def build_noting_agent() -> Agent[None, str]:
    """A tool stages an effect through the adapter activation and does not wait for it."""
    agent = Agent(system_prompt="You take notes.")

    @agent.tool_plain
    def note() -> str:
        current_activation().act("apply_effect", {"event_id": "n", "amount": 1})
        return "noted"

    return agent


def test_history_is_saved_only_when_the_activation_completes() -> None:
    provider = SharedProvider(_calls_then_answers("note", {}))
    agent = PydanticAIAgent(build_noting_agent, model_id="m")
    staged = intent_id_for(KEY, 0, 1)
    stream = (
        EnvelopeStream()
        .event(KEY, b"take a note", at_ms=1_000)
        .result(KEY, staged, payload=b'"ok"', at_ms=2_000)
    )
    outputs = _run(stream, provider, agent)
    assert outputs.errors == []
    assert [i.intent_id for i in _tool_intents(outputs)] == [staged]
    assert outputs.output == [b"got noted"]
    # The resumed activation re-walks from the same (empty) history: nothing new is asked.
    assert provider.fake.call_count == 2 == _distinct_requests(provider.fake)


def test_an_empty_tool_registry_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    provider = SharedProvider(scenario.triage_model())
    stream = EnvelopeStream().event(b"no-tools", _event("no-tools"), at_ms=1_000)
    config = AgentConfig(provider_factory=provider)  # the registry was forgotten
    with caplog.at_level(logging.WARNING, logger="beam_agents.adapters.pydantic_ai._calls"):
        run_agent(streamed(stream), triage_agent, config, streaming=True)
    assert any("offers the model no tools" in r.getMessage() for r in caplog.records)


def test_a_call_needing_approval_with_arguments_the_tool_refuses_asks_nobody() -> None:
    provider = SharedProvider(_calls_then_answers("apply_effect", {"event_id": "e", "amount": "x"}))
    agent = PydanticAIAgent(
        build_chat_agent,
        model_id="m",
        toolsets=[BeamToolset(approval_required={"apply_effect"})],
    )
    stream = EnvelopeStream().event(KEY, b"do it", at_ms=1_000)
    outputs = run_agent(streamed(stream), agent, _config(provider), streaming=True)
    assert outputs.errors == [] and outputs.intents == []  # no approval, no effect
    [output] = outputs.output
    assert output.startswith(b"got ") and b"apply_effect" in output and b"amount" in output


# -- the framework's own test model ------------------------------------------------------------


def build_test_model_agent() -> Agent[None, str]:
    """An agent on Pydantic AI's ``TestModel``: it calls every tool once, then answers."""
    return Agent(TestModel(), system_prompt=scenario.SYSTEM_PROMPT)


def test_an_agent_on_the_frameworks_test_model_runs_with_it() -> None:
    provider = SharedProvider(FakeLLM([]))  # answers nothing: every model call is TestModel's
    agent = PydanticAIAgent(build_test_model_agent, model_id="unused")
    apply_id = intent_id_for(KEY, 0, 0)  # no ctx.call_model step comes before it
    stream = (
        EnvelopeStream()
        .event(KEY, _event("e1"), at_ms=1_000)
        .result(KEY, apply_id, payload=APPLIED_PAYLOAD, at_ms=2_000)
    )
    outputs = _run(stream, provider, agent)
    assert outputs.errors == []
    assert provider.fake.call_count == 0
    [intent] = _tool_intents(outputs)
    assert (intent.tool_name, intent.intent_id) == ("apply_effect", apply_id)
    assert json.loads(intent.args_json) == {"event_id": "a", "amount": 0}  # TestModel's values
    [output] = outputs.output
    # TestModel's final answer is every tool's return: the inline lookup and the effect's result.
    assert json.loads(output) == {
        "lookup_account": scenario.lookup_account.unwrap()("a"),
        "apply_effect": json.loads(APPLIED_PAYLOAD),
    }
