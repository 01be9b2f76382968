# mypy: disallow-untyped-calls=False
"""The Google ADK adapter: the triage scenario, confirmations, the session, its bounds, misuse.

Every run goes through ``RunAgent`` on the streaming runner (``run_agent``), the events,
results and approvals played by an ``EnvelopeStream``; intent ids are the runtime's
deterministic ones (``intent_id_for(key, seq, step)``), so a stream can answer them up front.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import socket
from collections.abc import Iterator
from typing import Any, cast

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest as AdkLlmRequest
from google.adk.models.llm_response import LlmResponse as AdkLlmResponse
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from beam_agents import AgentConfig, FakeLLM, LlmRequest, ToolRegistry, intent_id_for, tool
from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.adapters import AdapterUsageError
from beam_agents.adapters.adk import (
    AdkAgent,
    AdkSessionTooLargeError,
    BeamLlm,
    BeamTool,
    SessionLimits,
    beam_tools,
    neutral_request,
    trim_events,
)
from beam_agents.adapters.adk._calls import adk_response
from beam_agents.adapters.base import FrameworkAgent
from beam_agents.model.client import LlmResponse, TokenUsage, ToolCall
from beam_agents.model.fake import match_any, respond_with_fn
from beam_agents.testing import EnvelopeStream
from beam_agents.tools.errors import ToolNotFoundError
from tests.adapters import scenario
from tests.adapters.cases.adk_case import build_triage, event_state, triage_agent
from tests.core.harness import Outputs, SharedProvider, run_agent, streamed

KEY = b"acct-key"
APPLIED_PAYLOAD = b'{"applied":5,"event_id":"e1"}'


def _config(provider: SharedProvider) -> AgentConfig:
    return AgentConfig(provider_factory=provider, tool_registry=scenario.triage_registry())


def _event(approval: bool = False) -> bytes:
    return scenario.event_payload("e1", account="acct-1", amount=5, approval=approval)


def _run(stream: EnvelopeStream, provider: SharedProvider, agent: Any = triage_agent) -> Outputs:
    return run_agent(streamed(stream), agent, _config(provider), streaming=True)


def _tool_intents(outputs: Outputs) -> list[ToolIntent]:
    return [intent for intent in outputs.intents if intent.kind == ToolIntent.TOOL]


def _assert_no_repeated_call(fake: FakeLLM) -> None:
    digests = [request.content_digest() for request in fake.requests]
    assert len(digests) == len(set(digests)), "a provider call was repeated across activations"


# -- (a) the triage scenario ------------------------------------------------------------------


def test_triage_stages_one_effect_runs_the_lookup_inline_and_answers_from_the_result() -> None:
    provider = SharedProvider(scenario.triage_model())
    effect_id = intent_id_for(KEY, 0, 2)  # model, model, then apply_effect
    stream = (
        EnvelopeStream()
        .event(KEY, _event(), at_ms=1_000)
        .result(KEY, effect_id, payload=APPLIED_PAYLOAD, at_ms=2_000)
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    assert [(i.intent_id, i.tool_name) for i in outputs.intents] == [(effect_id, "apply_effect")]
    assert json.loads(outputs.intents[0].args_json) == {"event_id": "e1", "amount": 5}
    assert outputs.output == [b"APPLIED " + APPLIED_PAYLOAD]
    fake = provider.fake
    assert len(fake.requests) == 3  # two before the suspension, one after; none repeated
    _assert_no_repeated_call(fake)
    lookup = [m for m in fake.requests[1].messages if m.get("role") == "tool"]
    assert json.loads(lookup[0]["content"])["account"] == "acct-1"  # ran inline
    assert fake.requests[0].tools_schema == scenario.triage_registry().tools_schema


def test_a_failed_effect_reaches_the_model_as_an_error() -> None:
    provider = SharedProvider(scenario.triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, _event(), at_ms=1_000)
        .result(
            KEY,
            intent_id_for(KEY, 0, 2),
            status=ToolResult.ERROR,
            error_message="ledger down",
            at_ms=2_000,
        )
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    [output] = outputs.output
    assert output.startswith(b"NOT APPLIED") and b"ledger down" in output


# -- (b) confirmations: approval intents, and the confirmed tool staged once -----------------


def test_a_confirmed_tool_is_staged_once_across_every_activation() -> None:
    provider = SharedProvider(scenario.triage_model())
    approval_id = intent_id_for(KEY, 0, 2)
    effect_id = intent_id_for(KEY, 0, 3)
    stream = (
        EnvelopeStream()
        .event(KEY, _event(approval=True), at_ms=1_000)
        .approval(KEY, approval_id, approved=True, at_ms=2_000)
        .result(KEY, effect_id, payload=APPLIED_PAYLOAD, at_ms=3_000)
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    kinds = [(ToolIntent.Kind.Name(i.kind), i.intent_id, i.tool_name) for i in outputs.intents]
    assert kinds[0][:2] == ("APPROVAL", approval_id)
    assert kinds[1:] == [("TOOL", effect_id, "apply_effect")]  # one effect, one id
    asked = json.loads(outputs.intents[0].args_json)
    assert asked["tool"] == "apply_effect" and asked["call_id"] == "apply-e1"
    assert outputs.output == [b"APPLIED " + APPLIED_PAYLOAD]
    assert len(provider.fake.requests) == 3
    _assert_no_repeated_call(provider.fake)


def test_a_denied_confirmation_stages_no_effect_and_reaches_the_model_as_denied() -> None:
    provider = SharedProvider(scenario.triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, _event(approval=True), at_ms=1_000)
        .approval(KEY, intent_id_for(KEY, 0, 2), approved=False, at_ms=2_000)
    )
    outputs = _run(stream, provider)
    assert outputs.errors == []
    assert [ToolIntent.Kind.Name(i.kind) for i in outputs.intents] == ["APPROVAL"]
    [output] = outputs.output
    assert output.startswith(b"NOT APPLIED") and b"denied by tester" in output
    _assert_no_repeated_call(provider.fake)


# -- bad arguments from the model: its to handle, nothing staged ------------------------------


def _bad_arguments_model() -> FakeLLM:
    """Calls both tools with arguments their schemas refuse, then reports what came back."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if results:
            return fake.scripted_body(request, " | ".join(results))
        calls = (
            ToolCall("lookup-bad", "lookup_account", {"account": ["not", "text"]}),
            ToolCall("apply-bad", "apply_effect", {"event_id": "e1", "amount": "lots"}),
        )
        return fake.scripted_body(request, "", calls)

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def build_unconfirmed() -> LlmAgent:
    """Both registry tools, no confirmation rule (the arguments are checked by ``ctx``)."""
    return LlmAgent(name="loose", model="loose-model", tools=beam_tools(scenario.triage_registry()))


@pytest.mark.parametrize(
    ("builder", "approval", "registered"),
    [
        (build_unconfirmed, False, True),
        (build_triage, True, True),  # the event asks for a person's confirmation
        (build_unconfirmed, False, False),  # ctx.act cannot check an unregistered effect
    ],
    ids=["registered", "confirming", "effect-unregistered"],
)
def test_arguments_a_tool_refuses_reach_the_model_as_errors_and_stage_nothing(
    builder: Any, approval: bool, registered: bool
) -> None:
    provider = SharedProvider(_bad_arguments_model())
    registry = scenario.triage_registry()
    if not registered:
        registry = ToolRegistry([scenario.lookup_account])
    stream = EnvelopeStream().event(KEY, _event(approval=approval), at_ms=1_000)
    config = AgentConfig(provider_factory=provider, tool_registry=registry)
    agent = AdkAgent(builder, prompt=scenario.user_prompt, state=event_state)
    outputs = run_agent(streamed(stream), agent, config, streaming=True)
    assert outputs.errors == []
    assert outputs.intents == []  # no effect, and no person asked about refused arguments
    [output] = outputs.output
    lookup, apply = (json.loads(part) for part in output.decode().split(" | "))
    assert "lookup_account" in lookup["error"] and "account" in lookup["error"]
    assert "apply_effect" in apply["error"] and "amount" in apply["error"]


@tool(name="apply_effect", side_effect=True)
def apply_effect_loosely(event_id: str, amount: str) -> str:
    """The pipeline's ``apply_effect``, laxer than the adapter's: any text for the amount."""
    return f"{event_id}:{amount}"


def build_gated_loose() -> LlmAgent:
    """Both tools behind a confirmation, with arguments the adapter's ``apply_effect`` refuses."""
    tools = beam_tools(scenario.triage_registry(), require_confirmation=True)
    return LlmAgent(name="gated", model="gated-model", tools=tools)


def test_a_gated_call_the_adapters_tool_refuses_is_neither_asked_nor_staged() -> None:
    # The gate asked nobody (the adapter's tool refuses "lots"); the pipeline's looser tool of
    # the same name would accept it, so run_async must refuse with the adapter's tool too.
    provider = SharedProvider(_bad_arguments_model())
    registry = ToolRegistry([scenario.lookup_account, apply_effect_loosely])
    config = AgentConfig(provider_factory=provider, tool_registry=registry)
    stream = EnvelopeStream().event(KEY, _event(), at_ms=1_000)
    agent = AdkAgent(build_gated_loose, prompt=scenario.user_prompt)
    outputs = run_agent(streamed(stream), agent, config, streaming=True)
    assert outputs.errors == [] and outputs.intents == []
    [output] = outputs.output
    apply = json.loads(output.decode().split(" | ")[1])
    assert "apply_effect" in apply["error"] and "amount" in apply["error"]


# -- a provider that reuses call ids: every call is its own intent ---------------------------

APPLY_ARGS = {"event_id": "e1", "amount": 5}


def _twice_model() -> FakeLLM:
    """Calls ``apply_effect`` with the same arguments in two turns, both times as ``call_0``."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        if len(results) < 2:
            return fake.scripted_body(
                request, "", (ToolCall("call_0", "apply_effect", APPLY_ARGS),)
            )
        return fake.scripted_body(request, " | ".join(results))

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def build_twice(confirm: bool = False) -> LlmAgent:
    """An agent that may apply the same effect twice (``confirm``: each call asks first)."""
    tools = beam_tools(
        scenario.triage_registry(), names={"apply_effect"}, require_confirmation=confirm
    )
    return LlmAgent(name="twice", model="twice-model", tools=tools)


def build_twice_confirmed() -> LlmAgent:
    """:func:`build_twice` with a confirmation before each call."""
    return build_twice(confirm=True)


def _twice(stream: EnvelopeStream, builder: Any) -> tuple[Outputs, FakeLLM]:
    provider = SharedProvider(_twice_model())
    return _run(stream, provider, AdkAgent(builder)), provider.fake


def test_a_reused_call_id_with_the_same_arguments_is_a_second_effect() -> None:
    first, second = intent_id_for(KEY, 0, 1), intent_id_for(KEY, 0, 3)  # model, act, model, act
    stream = (
        EnvelopeStream()
        .event(KEY, b"apply it twice", at_ms=1_000)
        .result(KEY, first, payload=b'{"applied":1}', at_ms=2_000)
        .result(KEY, second, payload=b'{"applied":2}', at_ms=3_000)
    )
    outputs, fake = _twice(stream, build_twice)
    assert outputs.errors == []
    assert [(i.intent_id, i.tool_name) for i in _tool_intents(outputs)] == [
        (first, "apply_effect"),
        (second, "apply_effect"),
    ]
    assert outputs.output == [b'{"applied":1} | {"applied":2}']
    _assert_no_repeated_call(fake)


def test_a_reused_call_id_with_the_same_arguments_is_asked_for_again() -> None:
    # model, approval, act; model, approval, act; model
    ids = [intent_id_for(KEY, 0, step) for step in (1, 2, 4, 5)]
    stream = (
        EnvelopeStream()
        .event(KEY, b"apply it twice", at_ms=1_000)
        .approval(KEY, ids[0], approved=True, at_ms=2_000)
        .result(KEY, ids[1], payload=b'{"applied":1}', at_ms=3_000)
        .approval(KEY, ids[2], approved=True, at_ms=4_000)
        .result(KEY, ids[3], payload=b'{"applied":2}', at_ms=5_000)
    )
    outputs, fake = _twice(stream, build_twice_confirmed)
    assert outputs.errors == []
    kinds = [(ToolIntent.Kind.Name(i.kind), i.intent_id) for i in outputs.intents]
    assert kinds == list(zip(["APPROVAL", "TOOL", "APPROVAL", "TOOL"], ids, strict=True))
    assert outputs.output == [b'{"applied":1} | {"applied":2}']
    _assert_no_repeated_call(fake)


# -- misconfiguration fails loudly; tools outside the registry are warned of ----------------


def test_a_beam_tool_missing_from_the_pipeline_registry_fails_the_activation() -> None:
    provider = SharedProvider(scenario.triage_model())
    config = AgentConfig(
        provider_factory=provider,
        tool_registry=ToolRegistry([scenario.triage_registry().get("apply_effect")]),
    )
    agent = AdkAgent(
        build_triage, app_name="triage", prompt=scenario.user_prompt, state=event_state
    )
    stream = EnvelopeStream().event(KEY, _event(), at_ms=1_000)
    outputs = run_agent(streamed(stream), agent, config, streaming=True)
    assert outputs.output == [] and outputs.intents == []
    [error] = outputs.errors
    assert error.reason == "activation_error"
    assert ToolNotFoundError.__name__ in error.detail and "lookup_account" in error.detail
    assert len(provider.fake.requests) == 1  # the model was not told of the failure


def adk_test_note_a(text: str) -> str:
    """A plain ADK tool: Python that runs in the pipeline."""
    return text


def adk_test_note_b(text: str) -> str:
    """Another plain ADK tool, wrapped as a ``FunctionTool``."""
    return text


def build_with_plain_tools() -> LlmAgent:
    """Registry tools and two plain ADK tools (one in a sub-agent)."""
    helper = LlmAgent(name="helper", model="m", tools=[FunctionTool(adk_test_note_b)])
    return LlmAgent(
        name="mixed",
        model="m",
        tools=[adk_test_note_a, *beam_tools(scenario.triage_registry())],
        sub_agents=[helper],
    )


def test_tools_outside_the_registry_are_warned_of_once_per_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="beam_agents.adapters.adk"):
        for _ in range(2):  # two builds in one process
            assert isinstance(AdkAgent(build_with_plain_tools).agent, LlmAgent)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"tool {name} is not in AgentConfig.tool_registry: it runs in the pipeline on every "
        "activation of the run; make it a registry tool (side_effect=True if it has effects)"
        for name in ("adk_test_note_a", "adk_test_note_b")
    ]


# -- (c) and (d): the session across runs, and its bounds ------------------------------------


def _chat_model() -> FakeLLM:
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        asked = [m["content"] for m in request.messages if m.get("role") == "user"]
        return fake.scripted_body(request, f"answer to {asked[-1]}")

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def build_chat() -> LlmAgent:
    """A tool-less agent that only talks."""
    return LlmAgent(name="chat", model="chat-model", instruction="Answer briefly.")


def _chat(limits: SessionLimits | None = None, events: int = 2) -> tuple[Outputs, FakeLLM]:
    provider = SharedProvider(_chat_model())
    stream = EnvelopeStream()
    for n in range(events):
        stream.event(KEY, f"question {n}".encode(), at_ms=1_000 * (n + 1))
    agent = AdkAgent(build_chat, session_limits=limits).run
    outputs = run_agent(
        streamed(stream), agent, AgentConfig(provider_factory=provider), streaming=True
    )
    return outputs, provider.fake


def _turns(request: LlmRequest) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in request.messages if m["role"] != "system"]


def test_the_next_run_on_the_key_continues_the_committed_session() -> None:
    outputs, fake = _chat()
    assert outputs.errors == []
    assert sorted(outputs.output) == [b"answer to question 0", b"answer to question 1"]
    assert _turns(fake.requests[1]) == [
        ("user", "question 0"),
        ("assistant", "answer to question 0"),
        ("user", "question 1"),
    ]


def test_the_session_keeps_only_the_latest_turns_within_its_limits() -> None:
    outputs, fake = _chat(SessionLimits(max_events=2), events=3)
    assert outputs.errors == []
    assert _turns(fake.requests[2]) == [
        ("user", "question 1"),
        ("assistant", "answer to question 1"),
        ("user", "question 2"),
    ]


def test_a_session_over_the_hard_limit_fails_the_run_with_a_typed_error() -> None:
    outputs, _ = _chat(SessionLimits(max_bytes=100, hard_max_bytes=200), events=1)
    assert outputs.output == []
    [error] = outputs.errors
    assert error.reason == "activation_error"
    assert AdkSessionTooLargeError.__name__ in error.detail


def _event_of(author: str, part: types.Part) -> Event:
    return Event(author=author, content=types.Content(role="user", parts=[part]))


def test_trimming_cuts_at_user_messages_so_calls_keep_their_responses() -> None:
    call = types.Part(function_call=types.FunctionCall(id="c", name="t", args={}))
    response = types.Part(function_response=types.FunctionResponse(id="c", name="t", response={}))
    events = [
        _event_of("user", types.Part(text="one")),
        _event_of("agent", call),
        _event_of("agent", response),
        _event_of("agent", types.Part(text="done")),
        _event_of("user", types.Part(text="two")),
        _event_of("agent", call),
        _event_of("user", response),  # a confirmation answer is no turn boundary
        _event_of("agent", types.Part(text="done")),
    ]
    assert trim_events(events, SessionLimits(max_events=5)) == events[4:]
    assert trim_events(events, SessionLimits(max_events=8)) == events
    assert trim_events(events, SessionLimits(max_events=1)) == events[4:]  # latest turn kept
    with pytest.raises(ValueError, match="hard_max_bytes"):
        SessionLimits(hard_max_bytes=2 << 20)


# -- the model translation ------------------------------------------------------------------


def test_an_answer_becomes_the_adk_response_the_validating_constructor_builds() -> None:
    request = LlmRequest("m", "hi")
    answer = LlmResponse(
        b"{}",
        tool_calls=(ToolCall("c1", "t", {"n": 1}), ToolCall("", "t", {})),
        usage=TokenUsage(input_tokens=3, output_tokens=2),
        model="m-1",
    )
    built = adk_response(answer, request)
    calls = [
        types.Part(function_call=types.FunctionCall(id="c1", name="t", args={"n": 1})),
        types.Part(function_call=built.content.parts[1].function_call),  # type: ignore[index,union-attr]
    ]
    expected = AdkLlmResponse(
        content=types.Content(role="model", parts=calls),
        model_version="m-1",
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=3, candidates_token_count=2, total_token_count=5
        ),
    )
    assert built == expected and built.model_fields_set == expected.model_fields_set
    assert built.model_dump_json() == expected.model_dump_json()
    derived = built.content.parts[1].function_call.id  # type: ignore[index,union-attr]
    assert derived is not None and derived.startswith("beam-")  # never ADK's random one
    assert adk_response(LlmResponse(b"ok", text="ok"), request).model_version is None


def test_the_neutral_request_carries_the_conversation_and_never_adk_ids() -> None:
    adk = AdkLlmRequest(
        contents=[
            types.Content(role="user", parts=[types.Part(text="hi")]),
            types.Content(
                role="model",
                parts=[types.Part(function_call=types.FunctionCall(id="c1", name="t", args={}))],
            ),
            types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id="c1", name="t", response={"error": "no"}
                        )
                    )
                ],
            ),
        ],
        config=types.GenerateContentConfig(system_instruction="sys", temperature=0.5),
    )
    request = neutral_request(adk, "m")
    assert request.model_id == "m" and request.sampling_params == {"temperature": 0.5}
    assert list(request.messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "t", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"error":"no"}', "is_error": True},
    ]


# -- misuse, pickling, no network ----------------------------------------------------------


def test_the_model_and_tools_refuse_to_run_outside_an_adapter_run() -> None:
    async def call_model() -> None:
        async for _ in BeamLlm(model="m").generate_content_async(AdkLlmRequest()):
            pass

    with pytest.raises(AdapterUsageError):
        asyncio.run(call_model())
    [tool] = beam_tools(scenario.triage_registry(), names={"apply_effect"})
    assert isinstance(tool, BeamTool)
    with pytest.raises(AdapterUsageError):
        asyncio.run(
            tool.run_async(args={"event_id": "e", "amount": 1}, tool_context=cast(Any, None))
        )


def test_the_agent_pickles_without_its_built_adk_agent() -> None:
    agent = AdkAgent(build_chat)
    assert isinstance(agent, FrameworkAgent)  # built once per process, by the shared base
    built = agent.agent
    assert isinstance(built, LlmAgent) and isinstance(built.model, BeamLlm)
    assert built.model.model == "chat-model"  # the name is kept as the model id
    copy = pickle.loads(pickle.dumps(agent))
    assert copy._built is None
    assert isinstance(copy.agent, LlmAgent) and isinstance(copy.agent.model, BeamLlm)
    assert pickle.loads(pickle.dumps(agent.run)).__self__.app_name == agent.app_name


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Refuse (and record) every connection to anything but this machine."""
    attempts: list[object] = []
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if isinstance(address, tuple) and host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"network refused in tests: {address!r}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield attempts


def test_a_run_never_reaches_the_network(loopback_only: list[object]) -> None:
    provider = SharedProvider(scenario.triage_model())
    stream = (
        EnvelopeStream()
        .event(KEY, _event(), at_ms=1_000)
        .result(KEY, intent_id_for(KEY, 0, 2), payload=APPLIED_PAYLOAD, at_ms=2_000)
    )
    outputs = _run(stream, provider)
    assert outputs.output == [b"APPLIED " + APPLIED_PAYLOAD]
    assert loopback_only == []
