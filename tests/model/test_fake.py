"""FakeLLM: rule matching, recorded requests, behaviors, scripted tool calls, pickling."""

from __future__ import annotations

import asyncio
import json
import pickle
import time

import cloudpickle
import dill
import pytest

from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ProviderRequestError,
    RateLimitError,
    ServerError,
    TokenUsage,
    ToolCall,
    decode_with,
)
from beam_agents.model.fake import (
    FakeLLM,
    Shape,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
    respond_with_fn,
    respond_with_text,
    respond_with_tool_calls,
    wire_body,
)
from beam_agents.model.openai import OpenAIChatProvider


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


@pytest.mark.parametrize("latency_ms", [1, 2, 30])
def test_latency_is_never_shorter_than_configured(latency_ms: int) -> None:
    # Short waits are all spin (below the timer margin); 30 ms is mostly timer.
    fake = FakeLLM([(match_any(), respond_with(b"slow", latency_ms=latency_ms))])
    started = time.perf_counter()
    assert asyncio.run(fake.complete(ask("x"))).text == "slow"
    assert time.perf_counter() - started >= latency_ms / 1000


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


# -- shapes, callable responders, usage, latency -------------------------------------------

PROVIDER_DECODERS = {
    "openai": OpenAIChatProvider(base_url="http://127.0.0.1:9", api_key_env=None),
    "anthropic": AnthropicMessagesProvider(base_url="http://127.0.0.1:9", api_key_env=None),
}


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_a_shaped_fake_answers_with_the_provider_wire_body(shape: Shape) -> None:
    fake = FakeLLM(
        [
            (match_contains("tools"), respond_with_tool_calls([("lookup", {"id": 7})], text="t")),
            (match_any(), respond_with_text("just text")),
        ],
        shape=shape,
    )
    answer = asyncio.run(fake.complete(ask("use tools please")))
    decoded = PROVIDER_DECODERS[shape].decode(answer.response)
    assert decoded == answer
    assert [(c.id, c.name, dict(c.arguments)) for c in answer.tool_calls] == [
        ("call_0", "lookup", {"id": 7})
    ]
    assert answer.stop_reason == {"openai": "tool_calls", "anthropic": "tool_use"}[shape]
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.model) == (3, 1, "m")
    plain = asyncio.run(fake.complete(ask("hello")))
    assert plain.text == "just text" and plain.tool_calls == ()
    assert decode_with(fake, plain.response) == plain
    assert json.loads(plain.response)["model"] == "m"


def test_wire_body_refuses_an_unknown_shape() -> None:
    with pytest.raises(ValueError, match="shape"):
        wire_body("grpc", text="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        FakeLLM([], shape="xml")  # type: ignore[arg-type]


def echo_last_message(request: LlmRequest) -> bytes:
    return b"echo: " + str(request.messages[-1]["content"]).encode()


def typed_answer(request: LlmRequest) -> LlmResponse:
    return LlmResponse(response=b"typed", text="typed", usage=TokenUsage(1, 2))


def not_an_answer(request: LlmRequest) -> str:
    return "text is not bytes"


def test_respond_with_fn_answers_with_bytes_or_a_response() -> None:
    fake = FakeLLM(
        [
            (match_contains("echo"), respond_with_fn(echo_last_message)),
            (match_contains("typed"), respond_with_fn(typed_answer)),
            (match_any(), respond_with_fn(not_an_answer)),  # type: ignore[arg-type]
        ]
    )
    echoed = asyncio.run(fake.complete(ask("echo me")))
    assert (echoed.text, echoed.usage.input_tokens, echoed.usage.output_tokens) == (
        "echo: echo me",
        2,
        3,
    )
    typed = asyncio.run(fake.complete(ask("typed")))
    assert (typed.text, typed.usage, typed.model) == ("typed", TokenUsage(1, 2), "m")
    with pytest.raises(TypeError, match="must return bytes or an LlmResponse"):
        asyncio.run(fake.complete(ask("other")))
    with pytest.raises(TypeError, match="callable"):
        respond_with_fn(b"not callable")  # type: ignore[arg-type]


def test_usage_can_be_scripted_per_behavior() -> None:
    usage = TokenUsage(input_tokens=1_000, output_tokens=250)
    fake = FakeLLM(
        [
            (match_contains("a"), respond_with(b"plain", usage=usage)),
            (match_contains("b"), respond_with_tool_calls([("t", {})], usage=usage)),
            (match_any(), respond_with_text("c", usage=usage)),
        ],
        shape="fake",
    )
    for text in ("a", "b", "c"):
        assert asyncio.run(fake.complete(ask(text))).usage == usage
    with pytest.raises(TypeError, match="TokenUsage"):
        respond_with(b"x", usage=(1, 2))  # type: ignore[arg-type]


def test_latency_yields_to_the_event_loop() -> None:
    fake = FakeLLM([(match_any(), respond_with_text("slow", latency_ms=200))])

    async def three_at_once() -> float:
        started = time.monotonic()
        await asyncio.gather(*(fake.complete(ask(text)) for text in "xyz"))
        return time.monotonic() - started

    elapsed = asyncio.run(three_at_once())
    # Three 200 ms answers overlap only if the latency yields to the loop throughout (a
    # blocking wait would take 600 ms).
    assert 0.2 <= elapsed < 0.5


def test_calls_are_counted_per_distinct_request() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"ok"))])
    for text in ("x", "y", "x", "x"):
        asyncio.run(fake.complete(ask(text)))
    assert sorted(fake.calls_per_request().values()) == [1, 3]
    assert fake.calls_per_request()[ask("x").content_digest()] == 3


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps, dill.dumps])
def test_a_shaped_fake_with_a_responder_pickles(dumps: object) -> None:
    fake = FakeLLM([(match_any(), respond_with_fn(echo_last_message))], shape="anthropic")
    copy = pickle.loads(dumps(fake))  # type: ignore[operator]
    assert copy.shape == "anthropic"
    body = wire_body("anthropic", text="echo: hi", usage=TokenUsage(1, 2), model="m")
    assert copy.decode(body).text == "echo: hi"
