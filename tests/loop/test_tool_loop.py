"""The tool-calling loop through real RunAgent pipelines: inline tools, intents, resumes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from beam_agents import AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import AgentEnvelope, ToolResult, TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.loop import LOOP_ADAPTER, run_tool_loop
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, ToolCall
from beam_agents.model.fake import FakeLLM, Shape, match_any, respond_with_fn, wire_body
from beam_agents.testing import EnvelopeStream, FailFirstCommit
from beam_agents.tools import ToolRegistry, tool
from tests.core.harness import Outputs, SharedProvider, created, event, run_agent, streamed
from tests.core.test_context import make_context

K = b"acct-1"
MODEL = "treasurer"


@tool
def account_balance(account: str) -> int:
    """The balance of an account (read-only)."""
    return {"acct-1": 120, "acct-2": 40}.get(account, 0)


@tool
def fx_rate(currency: str) -> float:
    """The exchange rate of a currency to EUR (read-only)."""
    return {"USD": 0.5, "GBP": 2.0}.get(currency, 1.0)


@tool
def flaky_lookup(account: str) -> int:
    """A read-only tool whose backend is down."""
    raise ConnectionError(f"ledger unreachable for {account}")


@tool(side_effect=True)
def transfer(account: str, amount: int) -> str:
    """Move money (side-effecting: the effector runs it)."""
    return f"moved {amount} from {account}"


def all_tools() -> ToolRegistry:
    return ToolRegistry([account_balance, fx_rate, flaky_lookup, transfer])


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


@dataclass(frozen=True)
class Script:
    """A model that answers turn ``n`` (counted by earlier assistant turns) with ``turns[n]``."""

    shape: Shape
    turns: tuple[tuple[str, tuple[ToolCall, ...]], ...]

    def __call__(self, request: LlmRequest) -> bytes:
        turn = sum(1 for message in request.messages if message["role"] == "assistant")
        text, calls = self.turns[min(turn, len(self.turns) - 1)]
        return wire_body(
            self.shape,
            text=text,
            tool_calls=calls,
            usage=TokenUsage(10, 5),
            model=request.model_id,
        )


def scripted(*turns: tuple[str, tuple[ToolCall, ...]], shape: Shape = "openai") -> SharedProvider:
    return SharedProvider(
        FakeLLM([(match_any(), respond_with_fn(Script(shape, turns)))], shape=shape)
    )


def question(ctx: ActivationContext) -> LlmRequest:
    return LlmRequest(
        model_id=MODEL,
        messages=[
            {"role": "system", "content": "You move money carefully."},
            {"role": "user", "content": ctx.event.decode()},
        ],
    )


async def treasurer(ctx: ActivationContext) -> Complete | Suspend:
    loop = await run_tool_loop(ctx, question(ctx), max_iterations=4)
    return loop.outcome


def config(provider: SharedProvider, **overrides: Any) -> AgentConfig:
    return AgentConfig(provider_factory=provider, tool_registry=all_tools(), **overrides)


def llm_calls(outputs: Outputs) -> list[tuple[int, str]]:
    return [
        (e.step_index, e.attributes["beam_agents.cache_hit"])
        for e in outputs.traces_for(K)
        if e.event_type == TraceEvent.LLM_CALL
    ]


def tool_messages(request: LlmRequest) -> list[Mapping[str, Any]]:
    return [message for message in request.messages if message["role"] == "tool"]


TRANSFER_CONVERSATION = (
    (
        "",
        (
            call("c1", "account_balance", account="acct-1"),
            call("c2", "fx_rate", currency="USD"),
        ),
    ),
    ("Moving it now.", (call("c3", "transfer", account="acct-1", amount=50),)),
    ("Moved 50; 70 left.", ()),
)
TRANSFER_PAYLOAD = b'"moved 50 from acct-1"'


def transfer_stream() -> EnvelopeStream:
    # Steps: model call 0, two inline tools (no step), model call 1, the transfer intent 2.
    return (
        EnvelopeStream()
        .event(K, b"Move 50 USD out of acct-1 if it can afford it.", at_ms=1_000)
        .result(K, intent_id_for(K, 0, 2), payload=TRANSFER_PAYLOAD, at_ms=2_000)
    )


def check_transfer_conversation(outputs: Outputs, fake: FakeLLM) -> None:
    assert outputs.errors == []
    assert outputs.output == [b"Moved 50; 70 left."]
    [intent] = outputs.intents
    assert (intent.intent_id, intent.tool_name, json.loads(intent.args_json)) == (
        intent_id_for(K, 0, 2),
        "transfer",
        {"account": "acct-1", "amount": 50},
    )
    final = fake.requests[-1]
    assert [message["role"] for message in final.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(final)] == [
        ("c1", "120"),
        ("c2", "0.5"),
        ("c3", TRANSFER_PAYLOAD.decode()),
    ]
    assert final.tools_schema == all_tools().tools_schema


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_a_conversation_with_inline_tools_and_an_intent_reaches_its_final_answer(
    shape: Shape,
) -> None:
    provider = scripted(*TRANSFER_CONVERSATION, shape=shape)
    outputs = run_agent(streamed(transfer_stream()), treasurer, config(provider), streaming=True)
    check_transfer_conversation(outputs, provider.fake)
    # Each distinct request reached the provider once: the resume re-walked the first two
    # turns from the replay cache and got the same intent id back without staging it again.
    assert sorted(provider.fake.calls_per_request().values()) == [1, 1, 1]
    assert llm_calls(outputs) == [
        (0, "false"),
        (1, "false"),
        (0, "true"),
        (1, "true"),
        (3, "false"),
    ]
    assert outputs.event_types(K).count("TOOL_CALL") == 4  # inline reads run again on resume


def test_a_retried_resume_repeats_no_committed_turn(tmp_path: Path) -> None:
    provider = scripted(*TRANSFER_CONVERSATION)
    forced = FailFirstCommit(tmp_path / "markers", trigger="tool_result")
    outputs = run_agent(
        streamed(transfer_stream()),
        treasurer,
        config(provider, before_commit=forced),
        streaming=True,
    )
    assert forced.forced() == [f"{K.hex()}-0-tool_result-3"]
    check_transfer_conversation(outputs, provider.fake)
    counts = provider.fake.calls_per_request()
    [first, second, final] = [
        request.content_digest() for request in provider.fake.requests[:2]
    ] + [provider.fake.requests[-1].content_digest()]
    # The two turns committed with the suspension are never asked again; the final turn, asked
    # by the failed attempt, which committed nothing, is answered to the retry by the memo.
    assert (counts[first], counts[second], counts[final]) == (1, 1, 1)
    assert len(counts) == 3


PARALLEL_CONVERSATION = (
    (
        "Splitting it three ways.",
        tuple(call(f"t{n}", "transfer", account=f"acct-{n}", amount=10 * n) for n in range(1, 4)),
    ),
    ("All three moved.", ()),
)


def test_parallel_tool_calls_become_parallel_intents_resumed_as_results_arrive() -> None:
    provider = scripted(*PARALLEL_CONVERSATION)
    ids = [intent_id_for(K, 0, step) for step in (1, 2, 3)]
    stream = EnvelopeStream().event(K, b"Pay the three of them.", at_ms=1_000)
    for position, (intent_id, n) in enumerate(zip(reversed(ids), (3, 2, 1), strict=True)):
        stream.result(
            K, intent_id, payload=b'"moved %d from acct-%d"' % (10 * n, n), at_ms=2_000 + position
        )
    outputs = run_agent(streamed(stream), treasurer, config(provider), streaming=True)
    assert outputs.errors == []
    assert outputs.output == [b"All three moved."]
    assert sorted((i.step_index, i.intent_id) for i in outputs.intents) == list(
        zip((1, 2, 3), ids, strict=True)
    )
    assert outputs.event_types(K) == [
        "ACTIVATION_START",
        "LLM_CALL",
        "INTENT_EMITTED",
        "INTENT_EMITTED",
        "INTENT_EMITTED",
        "SUSPENDED",
        *("ACTIVATION_START", "LLM_CALL", "SUSPENDED") * 2,
        "ACTIVATION_START",
        "LLM_CALL",
        "LLM_CALL",
        "ACTIVATION_END",
    ]
    assert sorted(provider.fake.calls_per_request().values()) == [1, 1]
    # Results arrived in reverse; the model reads them in the order it made the calls.
    final = provider.fake.requests[-1]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(final)] == [
        (f"t{n}", f'"moved {10 * n} from acct-{n}"') for n in (1, 2, 3)
    ]


def test_failed_expired_and_rejected_results_are_fed_back_as_errors() -> None:
    provider = scripted(*PARALLEL_CONVERSATION)
    ids = [intent_id_for(K, 0, step) for step in (1, 2, 3)]
    stream = (
        EnvelopeStream()
        .event(K, b"Pay the three of them.", at_ms=1_000)
        .result(K, ids[0], status=ToolResult.ERROR, error_message="bank down", at_ms=2_000)
        .result(K, ids[1], status=ToolResult.EXPIRED, at_ms=2_001)
        .result(K, ids[2], status=ToolResult.REJECTED, error_message="no such tool", at_ms=2_002)
    )
    outputs = run_agent(streamed(stream), treasurer, config(provider), streaming=True)
    assert outputs.errors == [] and outputs.output == [b"All three moved."]
    replies = tool_messages(provider.fake.requests[-1])
    assert [(m["tool_call_id"], m.get("is_error")) for m in replies] == [
        ("t1", True),
        ("t2", True),
        ("t3", True),
    ]
    assert replies[0]["content"] == "transfer failed: bank down"
    assert replies[1]["content"] == "transfer expired before it could run"
    assert replies[2]["content"] == "transfer was rejected and did not run: no such tool"


def test_unknown_tools_bad_arguments_and_failing_tools_are_fed_back_not_raised() -> None:
    provider = scripted(
        (
            "",
            (
                call("u1", "delete_everything"),
                call("u2", "transfer", account="acct-1", amount="lots"),
                call("u3", "flaky_lookup", account="acct-1"),
                call("u4", "fx_rate", currency="GBP"),
            ),
        ),
        ("I could only read the GBP rate: 2.0.", ()),
    )
    outputs = run_agent(created([event(K, b"Do things.")]), treasurer, config(provider))
    assert outputs.errors == [] and outputs.intents == []
    assert outputs.output == [b"I could only read the GBP rate: 2.0."]
    replies = {m["tool_call_id"]: m for m in tool_messages(provider.fake.requests[-1])}
    assert (
        replies["u1"]["is_error"] and "unknown tool 'delete_everything'" in replies["u1"]["content"]
    )
    assert "fx_rate" in replies["u1"]["content"]
    assert replies["u2"]["is_error"] and "amount" in replies["u2"]["content"]
    assert replies["u3"]["content"] == (
        "flaky_lookup failed: ConnectionError: ledger unreachable for acct-1"
    )
    assert replies["u4"] == {"role": "tool", "tool_call_id": "u4", "content": "2.0"}


def test_a_model_that_never_stops_calling_tools_hits_the_iteration_limit() -> None:
    provider = scripted(("", (call("r", "fx_rate", currency="USD"),)))
    outputs = run_agent(created([event(K, b"Loop forever.")]), treasurer, config(provider))
    assert outputs.output == [] and outputs.intents == []
    [error] = outputs.errors
    assert error.reason == "activation_error"
    assert "ToolLoopLimitError" in error.detail and "after 4 model calls" in error.detail
    assert AgentEnvelope.FromString(error.envelope).external_event == b"Loop forever."
    assert provider.fake.call_count == 4


READ_ONLY_ONLY = ToolRegistry([fx_rate])


async def narrow_loop(ctx: ActivationContext) -> Complete | Suspend:
    loop = await run_tool_loop(ctx, question(ctx), registry=READ_ONLY_ONLY)
    assert loop.done and loop.iterations == 1
    return Complete(output=json.dumps([m["role"] for m in loop.messages]).encode())


def test_a_narrower_registry_must_be_runnable_by_run_tool() -> None:
    provider = scripted(("Hi.", ()))
    ok = run_agent(created([event(K, b"Hello.")]), narrow_loop, config(provider))
    assert ok.errors == [] and ok.output == [b'["system", "user", "assistant"]']
    assert provider.fake.requests[0].tools_schema == READ_ONLY_ONLY.tools_schema
    refused = run_agent(
        created([event(K, b"Hello.")]),
        narrow_loop,
        AgentConfig(provider_factory=scripted(("Hi.", ()))),
    )
    [error] = refused.errors
    assert "ToolLoopConfigError" in error.detail and "['fx_rate']" in error.detail


async def outcome_parts(ctx: ActivationContext) -> Complete | Suspend:
    loop = await run_tool_loop(ctx, None if ctx.is_resume else question(ctx))
    if loop.suspend is not None:
        assert loop.suspend.adapter == LOOP_ADAPTER and not loop.done
        assert loop.pending_intent_ids == (intent_id_for(K, 0, 2),) and loop.text == ""
        return loop.suspend
    assert isinstance(loop.response, LlmResponse) and loop.iterations == 3
    return Complete(output=b"%d turns: %s" % (len(loop.messages), loop.text.encode()))


def test_the_outcome_carries_what_the_agent_needs_and_a_resume_needs_no_request() -> None:
    provider = scripted(*TRANSFER_CONVERSATION)
    outputs = run_agent(
        streamed(transfer_stream()), outcome_parts, config(provider), streaming=True
    )
    assert outputs.errors == []
    assert outputs.output == [b"8 turns: Moved 50; 70 left."]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("arguments", "error", "text"),
    [
        ({"request": None}, ValueError, "needs an LlmRequest"),
        ({"max_iterations": 0}, ValueError, "max_iterations"),
        ({"max_iterations": "3"}, TypeError, "max_iterations"),
        ({"registry": [fx_rate]}, TypeError, "ToolRegistry"),
    ],
)
async def test_bad_loop_arguments_are_typed_errors(
    arguments: dict[str, Any], error: type[Exception], text: str
) -> None:
    ctx = make_context(provider=FakeLLM([]))
    with pytest.raises(error, match=text):
        await run_tool_loop(ctx, **{"request": question(ctx), **arguments})


def test_a_scripted_fake_refuses_an_answer_that_is_not_a_function() -> None:
    with pytest.raises(TypeError, match="respond_with_text"):
        FakeLLM.scripted("ok")  # type: ignore[arg-type]
