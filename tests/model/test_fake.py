"""FakeLLM: rule matching, recorded requests, behaviors, scripted tool calls, pickling."""

from __future__ import annotations

import asyncio
import pickle
import time

import cloudpickle
import dill
import pytest

from beam_agents.model.client import (
    LlmRequest,
    ProviderRequestError,
    RateLimitError,
    ServerError,
    ToolCall,
    decode_with,
)
from beam_agents.model.fake import (
    FakeLLM,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
    respond_with_tool_calls,
)


def ask(text: str, model_id: str = "m") -> LlmRequest:
    return LlmRequest(model_id=model_id, messages=[{"role": "user", "content": text}])


def test_the_first_matching_rule_answers_and_every_request_is_recorded() -> None:
    fake = FakeLLM(
        [
            (match_contains("refund"), respond_with(b"refund policy")),
            (match_model_id("big"), respond_with(b"big model")),
            (match_any(), respond_with(b"fallback")),
        ]
    )
    assert asyncio.run(fake.complete(ask("a refund please", "big"))).text == "refund policy"
    assert asyncio.run(fake.complete(ask("hello", "big"))).text == "big model"
    answer = asyncio.run(fake.complete(ask("hello")))
    assert (answer.text, answer.response, answer.model) == ("fallback", b"fallback", "m")
    assert fake.call_count == 3
    assert [request.messages[0]["content"] for request in fake.requests] == [
        "a refund please",
        "hello",
        "hello",
    ]


def test_match_contains_reads_text_parts_too() -> None:
    fake = FakeLLM([(match_contains("needle"), respond_with(b"found"))])
    parts = LlmRequest(
        model_id="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "a needle here"}]}],
    )
    assert asyncio.run(fake.complete(parts)).text == "found"
    with pytest.raises(ProviderRequestError, match="no rule matches"):
        asyncio.run(fake.complete(LlmRequest(model_id="needle")))
    assert fake.call_count == 2


def test_usage_is_a_word_count() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"three word answer"))])
    usage = asyncio.run(fake.complete(ask("one two"))).usage
    assert (usage.input_tokens, usage.output_tokens) == (2, 3)


def test_latency_is_an_asyncio_sleep() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"slow", latency_ms=30))])
    started = time.monotonic()
    assert asyncio.run(fake.complete(ask("x"))).text == "slow"
    assert time.monotonic() - started >= 0.03


def test_raise_error_raises_a_fresh_copy_every_time() -> None:
    original = RateLimitError("slow down", retry_after_s=2.5)
    fake = FakeLLM([(match_any(), raise_error(original))])
    raised = []
    for _ in range(2):
        with pytest.raises(RateLimitError, match="slow down") as caught:
            asyncio.run(fake.complete(ask("x")))
        raised.append(caught.value)
    assert raised[0] is not raised[1] and raised[0] is not original
    assert raised[0].retry_after_s == 2.5
    assert fake.call_count == 2


def test_fail_then_succeed_fails_the_given_number_of_times_per_rule() -> None:
    fake = FakeLLM(
        [
            (match_contains("a"), fail_then_succeed(ServerError("down"), 2, b"up")),
            (match_contains("b"), respond_with(b"b")),
        ]
    )
    outcomes = []
    for text in ("a", "b", "a", "a", "a"):
        try:
            outcomes.append(asyncio.run(fake.complete(ask(text))).text)
        except ServerError:
            outcomes.append("error")
    assert outcomes == ["error", "b", "error", "up", "up"]


def test_scripted_tool_calls_round_trip_through_the_raw_body() -> None:
    fake = FakeLLM(
        [
            (
                match_any(),
                respond_with_tool_calls(
                    [("lookup", {"id": 7}), ToolCall(id="c-9", name="freeze", arguments={})],
                    text="checking",
                ),
            )
        ]
    )
    response = asyncio.run(fake.complete(ask("x")))
    assert response.text == "checking" and response.stop_reason == "tool_use"
    assert [(c.id, c.name, dict(c.arguments)) for c in response.tool_calls] == [
        ("call_0", "lookup", {"id": 7}),
        ("c-9", "freeze", {}),
    ]
    replayed = decode_with(fake, response.response)
    assert replayed.tool_calls == response.tool_calls and replayed.text == response.text


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps, dill.dumps])
def test_a_fake_pickles_with_its_rules_and_counts_separately(dumps: object) -> None:
    fake = FakeLLM(
        [
            (match_contains("x"), fail_then_succeed(ServerError("down"), 1, b"ok")),
            (match_any(), respond_with(b"other")),
        ]
    )
    copy = pickle.loads(dumps(fake))  # type: ignore[operator]
    with pytest.raises(ServerError):
        asyncio.run(copy.complete(ask("x")))
    assert asyncio.run(copy.complete(ask("x"))).text == "ok"
    assert asyncio.run(copy.complete(ask("y"))).text == "other"
    assert (copy.call_count, fake.call_count) == (3, 0)


def test_bad_rules_and_behaviors_are_type_errors() -> None:
    with pytest.raises(TypeError, match="bytes"):
        respond_with("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency_ms"):
        respond_with(b"x", latency_ms=-1)
    with pytest.raises(TypeError, match="exception instance"):
        raise_error(RateLimitError)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times"):
        fail_then_succeed(ServerError(), -1, b"x")
    with pytest.raises(TypeError, match="pair"):
        FakeLLM([match_any()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="behavior"):
        FakeLLM([(match_any(), b"answer")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="str"):
        match_contains(b"bytes")  # type: ignore[arg-type]
