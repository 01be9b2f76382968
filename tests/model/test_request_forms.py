"""The short forms of ``LlmRequest``: ``None`` for no tools or settings, strings as user messages.

Each short form is normalized when the request is built, so it is equal to the request spelled
out in full and has its cache key: a call made one way is replayed when re-made the other way.
"""

from __future__ import annotations

import asyncio
import pickle

from beam_agents import ActivationContext, AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import TraceEvent
from beam_agents.core.model_calls import replay_cache_key
from beam_agents.model import FakeLLM, LlmRequest, match_contains, respond_with_text
from beam_agents.model.client import UserTurn, parse_messages
from beam_agents.testing import EnvelopeStream
from tests.core.harness import SharedProvider, run_agent, streamed

HI = {"role": "user", "content": "hi"}
TOOLS = [{"name": "ship", "description": "Ship it.", "parameters": {"type": "object"}}]
K = b"traveller-1"


def test_none_means_no_tools_and_no_sampling_params() -> None:
    request = LlmRequest("m", [HI], None, None)
    assert request.tools_schema == () and request.sampling_params == {}
    assert request == LlmRequest("m", [HI]) == LlmRequest("m", [HI], (), {})
    assert request.canonical_json() == LlmRequest("m", [HI], [], {}).canonical_json()
    assert request.content_digest() == LlmRequest("m", [HI], [], {}).content_digest()
    bare = LlmRequest("m", (), None, None)
    assert bare.content_digest() == LlmRequest("m").content_digest()


def test_given_tools_and_sampling_params_are_kept() -> None:
    request = LlmRequest("m", [HI], TOOLS, {"temperature": 0})
    assert request.tools_schema == TOOLS and request.sampling_params == {"temperature": 0}
    assert request.content_digest() != LlmRequest("m", [HI]).content_digest()


def test_a_plain_string_is_a_user_message() -> None:
    mixed = LlmRequest("m", ["hi", {"role": "assistant", "content": "hello"}, "ship it"])
    assert mixed.messages == [
        HI,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "ship it"},
    ]
    assert LlmRequest("m", ["hi"]) == LlmRequest("m", [HI])
    assert LlmRequest("m", "hi").messages == [HI]  # a lone string: one user message
    assert LlmRequest("m", ("hi",)).messages == (HI,)  # a tuple stays a tuple
    assert parse_messages(LlmRequest("m", ["hi"]).messages) == [UserTurn("hi")]


def test_string_messages_have_the_cache_key_of_their_mappings() -> None:
    short = LlmRequest("m", ["hi"], None, None)
    full = LlmRequest("m", [HI], [], {})
    assert short.canonical_json() == full.canonical_json()
    assert replay_cache_key(short, K, 3, 1) == replay_cache_key(full, K, 3, 1)
    assert replay_cache_key(LlmRequest("m", "hi"), K, 3, 1) == replay_cache_key(full, K, 3, 1)


def test_mapping_messages_are_kept_as_given_and_the_request_pickles() -> None:
    messages = [HI]
    request = LlmRequest("m", messages, None, None)
    assert request.messages is messages
    assert pickle.loads(pickle.dumps(LlmRequest("m", "hi", None, None))) == LlmRequest("m", [HI])


def test_a_fake_llm_answers_string_messages() -> None:
    fake = FakeLLM([(match_contains("hi"), respond_with_text("hello"))])
    response = asyncio.run(fake.complete(LlmRequest("m", ["hi"], None, None)))
    assert response.text == "hello"


async def plan_short_then_full(ctx: ActivationContext) -> Complete | Suspend:
    """Calls the model with the short forms, and re-makes the call spelled out when resumed."""
    if ctx.is_resume:
        request = LlmRequest("planner", [{"role": "user", "content": "plan the trip"}], [], {})
    else:
        request = LlmRequest("planner", ["plan the trip"], None, None)
    answer = await ctx.call_model(request)
    ctx.act("ship", {"plan": answer.text})
    return Complete(output=answer.text.encode()) if ctx.is_resume else Suspend()


def test_short_forms_go_through_call_model_and_replay_as_the_full_forms() -> None:
    provider = SharedProvider(FakeLLM([(match_contains("plan"), respond_with_text("by boat"))]))
    stream = (
        EnvelopeStream().event(K, b"go", at_ms=1_000).result(K, intent_id_for(K, 0, 1), at_ms=2_000)
    )
    outputs = run_agent(
        streamed(stream),
        plan_short_then_full,
        AgentConfig(provider_factory=provider),
        streaming=True,
    )
    assert outputs.errors == [] and outputs.output == [b"by boat"]
    calls = [e for e in outputs.traces_for(K) if e.event_type == TraceEvent.LLM_CALL]
    assert [call.attributes["beam_agents.cache_hit"] for call in calls] == ["false", "true"]
    assert provider.fake.call_count == 1
