"""ActivationContext on its own, without Beam: staging, the step cursor, tools and the model."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from beam_agents._protos import ModelCache, ToolIntent, ToolResult, TraceEvent
from beam_agents.core.agent import (
    MAX_DURATION_MS,
    ModelNotConfiguredError,
    ReadOnlyIntentError,
    intent_id_for,
)
from beam_agents.core.context import ActivationContext, WorkingMemory, staged
from beam_agents.core.model_calls import ModelGateway
from beam_agents.core.observability import TraceRecorder, trace_id_for
from beam_agents.core.staging import ActivationServices, Resumption
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.tools import ToolRegistry, ToolRunner, tool
from beam_agents.tools.errors import SideEffectToolError, ToolArgumentError, ToolNotFoundError

KEY = b"cust-1"


@tool
def lookup(customer_id: str) -> str:
    """Read-only lookup."""
    return f"band:{customer_id}"


@tool
async def double(number: int) -> int:
    """Read-only async tool."""
    return number * 2


@tool
def broken(number: int) -> int:
    """A read-only tool that fails."""
    raise RuntimeError(f"broken {number}")


@tool(side_effect=True)
def charge(amount: int, currency: str = "EUR") -> str:
    """Side-effecting."""
    return f"charged {amount} {currency}"


@tool(side_effect=True)
def notify(trip: str) -> str:
    """Side-effecting, too."""
    return f"notified {trip}"


def registry() -> ToolRegistry:
    return ToolRegistry([lookup, double, broken, charge, notify])


def make_services(tools: ToolRegistry, provider: FakeLLM | None = None) -> ActivationServices:
    return ActivationServices(
        model=None if provider is None else ModelGateway(provider),
        tool_registry=tools,
        tool_runner=ToolRunner(),
        intent_ttl_ms=60_000,
        approval_channel="ops",
        approval_ttl_ms=5_000,
        cache_max_entries=8,
        cache_max_bytes=100_000,
    )


def make_context(
    *,
    provider: FakeLLM | None = None,
    seq: int = 4,
    first_step: int = 0,
    memory_loader: Callable[[], list[bytes]] = list,
    cache: ModelCache | None = None,
    resumption: Resumption | None = None,
    services: ActivationServices | None = None,
    trace: TraceRecorder | None = None,
) -> ActivationContext:
    if services is None:
        services = make_services(registry(), provider)
    if trace is None:
        trace = TraceRecorder(KEY, seq, trace_id_for(KEY, seq), 0, 1_000)
    return ActivationContext(
        entity_key=KEY,
        seq=seq,
        now_ms=1_000,
        event=b"payload",
        first_step=first_step,
        trace=trace,
        services=services,
        load_memory=memory_loader,
        load_cache=lambda: None if cache is None else cache.SerializeToString(),
        resumption=resumption,
    )


def event_types(ctx: ActivationContext) -> list[str]:
    return [TraceEvent.EventType.Name(event.event_type) for event in staged(ctx).trace.events]


def test_act_stages_a_deterministic_intent_with_canonical_arguments() -> None:
    ctx = make_context(first_step=2)
    first = ctx.act("charge", '{ "currency": "USD",  "amount": 5 }')
    second = ctx.act("charge", {"amount": 5, "currency": "USD"}, ttl_ms=10)
    assert first == intent_id_for(KEY, 4, 2)
    assert second == intent_id_for(KEY, 4, 3)
    assert ctx.next_step == 4
    intent = staged(ctx).intents[0]
    assert intent.args_json == '{"amount":5,"currency":"USD"}' == staged(ctx).intents[1].args_json
    assert intent.kind == ToolIntent.TOOL and intent.tool_name == "charge"
    assert (intent.seq, intent.step_index, intent.entity_key) == (4, 2, KEY)
    assert (intent.created_at_ms, intent.expires_at_ms) == (1_000, 61_000)
    assert staged(ctx).intents[1].expires_at_ms == 1_010
    assert intent.trace_id == trace_id_for(KEY, 4)
    assert event_types(ctx) == ["INTENT_EMITTED", "INTENT_EMITTED"]
    assert staged(ctx).trace.events[0].attributes["intent_id"] == first
    assert ctx.pending_intent_ids == frozenset({first, second})


def test_act_refuses_a_tool_missing_from_a_registry_of_side_effecting_tools() -> None:
    ctx = make_context()
    with pytest.raises(ToolNotFoundError) as refused:
        ctx.act("chrage", {"amount": 1})
    message = str(refused.value)
    assert "no tool named 'chrage'" in message
    assert "side-effecting tools: charge, notify)" in message
    assert "did you mean 'charge'?" in message
    assert refused.value.tool_name == "chrage"
    with pytest.raises(ToolNotFoundError, match="send_email") as unlike:
        ctx.act("send_email", {"to": "x"})
    assert "did you mean" not in str(unlike.value)
    assert staged(ctx).intents == [] and ctx.next_step == 0


@pytest.mark.parametrize(
    "tools", [ToolRegistry(), ToolRegistry([lookup])], ids=["empty", "read-only"]
)
def test_act_without_side_effecting_tools_stages_unvalidated_and_warns_once_per_tool(
    tools: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.core.context")
    services = make_services(tools)  # shared by every activation of one runtime instance
    first = make_context(services=services)
    first.act("send_email", {"to": "x"})
    first.act("send_email", {"to": "y"})
    make_context(services=services, seq=5).act("send_email", {"to": "z"})
    make_context(services=services, seq=6).act("page_oncall", {})
    assert staged(first).intents[0].tool_name == "send_email"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("ctx.act('send_email', ...) stages intents whose arguments")
    assert "not validated" in warnings[0] and "page_oncall" in warnings[1]
    make_context(services=make_services(tools)).act("send_email", {})  # another instance
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"amount": "lots"}, "amount"),
        ({}, "amount"),
        ('{"amount": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (42, "must be a JSON object string or a mapping"),
        ({"amount": 1, "note": {1, 2}}, "not JSON-encodable"),
        ({"amount": float("nan")}, "not JSON-encodable"),
        ({"amount": 1, "note": "lone \ud800 surrogate"}, "not JSON-encodable"),
        ('{"amount": 1, "note": "\\ud800"}', "not JSON-encodable"),
    ],
)
def test_invalid_intent_arguments_raise_and_stage_nothing(args: Any, message: str) -> None:
    ctx = make_context()
    with pytest.raises(ToolArgumentError, match=message):
        ctx.act("charge", args)
    assert staged(ctx).intents == [] and ctx.next_step == 0 and staged(ctx).trace.events == []


def test_act_refuses_a_read_only_tool_and_bad_ttls() -> None:
    ctx = make_context()
    with pytest.raises(ReadOnlyIntentError, match="run_tool"):
        ctx.act("lookup", {"customer_id": "c"})
    with pytest.raises(ValueError, match="ttl_ms"):
        ctx.act("charge", {"amount": 1}, ttl_ms=0)
    with pytest.raises(ValueError, match="tool name"):
        ctx.act("", {})
    assert staged(ctx).intents == []


def test_request_approval_stages_an_approval_intent_on_the_policy_channel() -> None:
    ctx = make_context()
    default = ctx.request_approval({"amount": 12_500})
    routed = ctx.request_approval('{"amount": 1}', channel="finance", ttl_ms=99)
    assert [intent.kind for intent in staged(ctx).intents] == [ToolIntent.APPROVAL] * 2
    assert [intent.tool_name for intent in staged(ctx).intents] == ["approval", "approval"]
    assert [intent.channel for intent in staged(ctx).intents] == ["ops", "finance"]
    assert [intent.expires_at_ms for intent in staged(ctx).intents] == [6_000, 1_099]
    assert [default, routed] == [intent_id_for(KEY, 4, 0), intent_id_for(KEY, 4, 1)]


@pytest.mark.asyncio
async def test_run_tool_runs_read_only_tools_inline_without_taking_a_step() -> None:
    ctx = make_context()
    assert await ctx.run_tool("lookup", {"customer_id": "c9"}) == "band:c9"
    assert await ctx.run_tool("double", {"number": "21"}) == 42
    assert ctx.next_step == 0
    assert event_types(ctx) == ["TOOL_CALL", "TOOL_CALL"]
    assert staged(ctx).trace.events[0].attributes["tool_name"] == "lookup"


@pytest.mark.asyncio
async def test_refused_tool_calls_raise_typed_errors_and_are_not_traced() -> None:
    ctx = make_context()
    with pytest.raises(ToolNotFoundError, match="nope"):
        await ctx.run_tool("nope", {})
    with pytest.raises(SideEffectToolError, match=r"ctx\.act"):
        await ctx.run_tool("charge", {"amount": 1})
    with pytest.raises(ToolArgumentError):
        await ctx.run_tool("lookup", {})
    assert staged(ctx).trace.events == []


@pytest.mark.asyncio
async def test_a_tool_that_fails_is_traced_as_a_failed_call() -> None:
    ctx = make_context()
    with pytest.raises(RuntimeError, match="broken 3"):
        await ctx.run_tool("broken", {"number": 3})
    assert staged(ctx).trace.events[0].attributes["status"] == "error"


@pytest.mark.asyncio
async def test_two_identical_model_calls_are_two_provider_calls_at_two_steps() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"answer words"))])
    ctx = make_context(provider=fake)
    request = LlmRequest(model_id="m", messages=[{"role": "user", "content": "same question"}])
    first = await ctx.call_model(request)
    second = await ctx.call_model(request)
    assert fake.call_count == 2
    assert first.text == second.text == "answer words"
    assert ctx.next_step == 2
    assert [event.step_index for event in staged(ctx).trace.events] == [0, 1]
    assert [event.attributes["beam_agents.cache_hit"] for event in staged(ctx).trace.events] == [
        "false",
        "false",
    ]
    assert staged(ctx).cache is not None and len(staged(ctx).cache) == 2
    assert staged(ctx).tokens_used == 2 * (2 + 2)


@pytest.mark.asyncio
async def test_a_committed_call_at_the_same_position_is_replayed_without_the_provider() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"first answer"))])
    request = LlmRequest(model_id="m", messages=[{"role": "user", "content": "q"}])
    original = make_context(provider=fake)
    await original.call_model(request)
    assert staged(original).cache is not None
    committed = ModelCache.FromString(staged(original).cache.encode())

    again = FakeLLM([(match_any(), respond_with(b"a different answer"))])
    replay = make_context(provider=again, cache=committed)
    response = await replay.call_model(request)
    assert again.call_count == 0
    assert response.text == "first answer"
    assert staged(replay).trace.events[0].attributes["beam_agents.cache_hit"] == "true"
    # The same request one step later is a different position: a real call.
    assert (await replay.call_model(request)).text == "a different answer"
    assert again.call_count == 1


@pytest.mark.asyncio
async def test_calling_the_model_without_a_provider_is_a_typed_error() -> None:
    ctx = make_context()
    with pytest.raises(ModelNotConfiguredError, match="provider_factory"):
        await ctx.call_model(LlmRequest(model_id="m"))
    with pytest.raises(TypeError, match="LlmRequest"):
        await make_context(provider=FakeLLM([])).call_model({"model_id": "m"})  # type: ignore[arg-type]


def test_memory_is_loaded_only_when_used() -> None:
    loads = []
    committed = WorkingMemory(None)
    committed.set("seen", b"yes")
    elements = committed.encode()

    def loader() -> list[bytes]:
        loads.append(1)
        return elements

    ctx = make_context(memory_loader=loader)
    assert staged(ctx).memory is None and loads == []
    assert ctx.memory.get("seen") == b"yes"
    ctx.memory.set("new", b"1")
    assert loads == [1] and staged(ctx).memory is not None and staged(ctx).memory.changed


def test_a_new_run_has_no_resume_inputs() -> None:
    ctx = make_context()
    assert not ctx.is_resume
    assert ctx.resume_result is None and ctx.resume_approval is None
    assert ctx.snapshot == b"" and dict(ctx.results) == {} and ctx.pending_intent_ids == frozenset()
    assert ctx.event == b"payload"


def test_a_resumed_run_sees_its_result_snapshot_and_what_is_still_pending() -> None:
    answered = ToolResult(intent_id="a", status=ToolResult.OK, payload=b'"done"')
    resumption = Resumption(
        result=answered,
        approval=None,
        snapshot=b"state",
        results={"a": answered},
        pending=(("b", ToolIntent.TOOL),),
    )
    ctx = make_context(resumption=resumption, first_step=3)
    assert ctx.is_resume and ctx.resume_result == answered and ctx.resume_approval is None
    assert ctx.snapshot == b"state"
    assert json.loads(ctx.results["a"].payload) == "done"
    assert ctx.pending_intent_ids == frozenset({"b"})
    new_id = ctx.act("charge", {"amount": 1})
    assert new_id == intent_id_for(KEY, 4, 3)
    assert ctx.pending_intent_ids == frozenset({"b", new_id})
    assert staged(ctx).pending_after() == [("b", ToolIntent.TOOL), (new_id, ToolIntent.TOOL)]
    with pytest.raises(TypeError):
        ctx.results["x"] = answered  # type: ignore[index]


@pytest.mark.parametrize(
    ("stage", "problem"),
    [
        (lambda ctx: ctx.act("unregistered", {"note": "x" * (1 << 20)}), "bytes (at most"),
        (lambda ctx: ctx.act("unregistered", '{"a":' * 65 + "1" + "}" * 65), "nested too deeply"),
        (lambda ctx: ctx.act("charge", {"amount": 1}, ttl_ms=MAX_DURATION_MS), "out of range"),
        (lambda ctx: ctx.act("t" * 4_097, {}), "characters (at most 4096)"),
        (lambda ctx: ctx.request_approval({"note": "y" * (1 << 20)}), "bytes (at most"),
    ],
)
def test_an_intent_the_effector_could_not_record_fails_the_activation_untraced(
    stage: Callable[[ActivationContext], object], problem: str
) -> None:
    """Staged, it would be refused unrecorded and nothing would ever answer its run."""
    ctx = make_context(services=make_services(ToolRegistry()))
    with pytest.raises(ToolArgumentError, match="the effector would refuse it") as refused:
        stage(ctx)
    assert problem in str(refused.value)
    assert staged(ctx).intents == [] and event_types(ctx) == []
    assert ctx.act("charge", {"amount": 1}) in {i.intent_id for i in staged(ctx).intents}
