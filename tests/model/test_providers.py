"""The HTTP providers against a real local HTTP server: wire formats, errors, pickling."""

from __future__ import annotations

import asyncio
import email.utils
import json
import pickle
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import pytest

from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
    TokenUsage,
    ToolCall,
    decode_with,
)
from beam_agents.model.openai import OpenAIChatProvider
from beam_agents.model.resilience import Attempt, RetryPolicy, call_with_resilience
from beam_agents.model.transport import JsonHttpProvider

from .http_fixture import Reply, ScriptedHttpServer, json_reply, unused_local_port

SECRET = "test-secret-4d9a1f7c0b"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@dataclass(frozen=True)
class Wire:
    """What differs between the two providers, so shared behaviour is tested on both."""

    name: str
    path: str
    key_env: str
    make: Callable[..., JsonHttpProvider]
    text_body: Callable[[str], dict[str, Any]]
    tool_body: Callable[[list[ToolCall]], dict[str, Any]]
    bad_arguments_body: dict[str, Any]
    text_stop: str
    tool_stop: str

    def key_header(self, request_headers: dict[str, str]) -> str:
        if self.name == "openai":
            return request_headers["authorization"].removeprefix("Bearer ")
        return request_headers["x-api-key"]


def _openai_body(message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _openai_text(text: str) -> dict[str, Any]:
    return _openai_body({"role": "assistant", "content": text}, "stop")


def _openai_tools(calls: list[ToolCall]) -> dict[str, Any]:
    wire_calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in calls
    ]
    return _openai_body(
        {"role": "assistant", "content": None, "tool_calls": wire_calls}, "tool_calls"
    )


def _anthropic_body(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


def _anthropic_text(text: str) -> dict[str, Any]:
    return _anthropic_body([{"type": "text", "text": text}], "end_turn")


def _anthropic_tools(calls: list[ToolCall]) -> dict[str, Any]:
    blocks = [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        for call in calls
    ]
    return _anthropic_body(blocks, "tool_use")


OPENAI = Wire(
    name="openai",
    path="/v1/chat/completions",
    key_env="OPENAI_API_KEY",
    make=lambda base_url, **kw: OpenAIChatProvider(base_url=f"{base_url}/v1", **kw),
    text_body=_openai_text,
    tool_body=_openai_tools,
    bad_arguments_body=_openai_body(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
            ],
        },
        "tool_calls",
    ),
    text_stop="stop",
    tool_stop="tool_calls",
)
ANTHROPIC = Wire(
    name="anthropic",
    path="/v1/messages",
    key_env="ANTHROPIC_API_KEY",
    make=lambda base_url, **kw: AnthropicMessagesProvider(base_url=base_url, **kw),
    text_body=_anthropic_text,
    tool_body=_anthropic_tools,
    bad_arguments_body=_anthropic_body(
        [{"type": "tool_use", "id": "c1", "name": "f", "input": ["not", "an", "object"]}],
        "tool_use",
    ),
    text_stop="end_turn",
    tool_stop="tool_use",
)


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda wire: wire.name)
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Wire:
    chosen: Wire = request.param
    monkeypatch.setenv(chosen.key_env, SECRET)
    return chosen


@pytest.fixture
def server() -> Iterator[ScriptedHttpServer]:
    with ScriptedHttpServer() as running:
        yield running


class FakeTime:
    """A clock whose sleep advances it instantly, recording every wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def hello_request(model_id: str = "") -> LlmRequest:
    return LlmRequest(model_id=model_id, messages=[{"role": "user", "content": "hello"}])


# --- happy paths ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_text_response_is_decoded(wire: Wire, server: ScriptedHttpServer) -> None:
    reply = json_reply(wire.text_body("Hi there."))
    server.script(reply)
    async with wire.make(server.base_url, model="default-model") as provider:
        assert isinstance(provider, ModelClient)
        response = await provider.complete(hello_request())

    assert response.response == reply.body
    assert response.text == "Hi there."
    assert response.tool_calls == ()
    assert response.stop_reason == wire.text_stop
    assert response.usage == TokenUsage(input_tokens=11, output_tokens=7)
    assert response.model in ("gpt-test", "claude-test")
    (received,) = server.requests
    assert received.path == wire.path
    assert received.headers["content-type"] == "application/json"
    assert wire.key_header(received.headers) == SECRET
    assert received.json()["model"] == "default-model"


@pytest.mark.asyncio
async def test_request_model_id_overrides_the_default(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(json_reply(wire.text_body("ok")))
    async with wire.make(server.base_url, model="default-model") as provider:
        await provider.complete(hello_request("chosen-model"))
    assert server.requests[0].json()["model"] == "chosen-model"


@pytest.mark.asyncio
async def test_one_tool_call_is_decoded(wire: Wire, server: ScriptedHttpServer) -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
    server.script(json_reply(wire.tool_body([call])))
    async with wire.make(server.base_url, model="m") as provider:
        response = await provider.complete(hello_request())
    assert response.tool_calls == (call,)
    assert response.stop_reason == wire.tool_stop
    assert response.text == ""


@pytest.mark.asyncio
async def test_parallel_tool_calls_keep_their_order(wire: Wire, server: ScriptedHttpServer) -> None:
    calls = [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Paris"}),
        ToolCall(id="call_b", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_c", name="now", arguments={}),
    ]
    server.script(json_reply(wire.tool_body(calls)))
    async with wire.make(server.base_url, model="m") as provider:
        response = await provider.complete(hello_request())
    assert response.tool_calls == tuple(calls)


@pytest.mark.asyncio
async def test_decode_rebuilds_the_response_from_the_raw_body(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Rome"})
    server.script(json_reply(wire.tool_body([call])))
    async with wire.make(server.base_url, model="m") as provider:
        response = await provider.complete(hello_request())
        assert provider.decode(response.response) == response
        assert decode_with(provider, response.response) == response


# --- errors --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_rate_limit_with_retry_after_seconds_then_success(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(
        json_reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "7"}),
        json_reply(wire.text_body("done")),
    )
    fake = FakeTime()
    attempts: list[Attempt] = []
    async with wire.make(server.base_url, model="m") as provider:
        response = await call_with_resilience(
            lambda: provider.complete(hello_request()),
            policy=RetryPolicy(),
            on_attempt=attempts.append,
            sleep=fake.sleep,
            clock=fake,
            rng=random.Random(1),
        )
    assert response.text == "done"
    # The jittered backoff is at most 0.2 s, so the server's 7 s is what was waited.
    assert fake.sleeps == [7.0]
    assert [attempt.outcome for attempt in attempts] == ["retry", "ok"]
    first_error = attempts[0].error
    assert isinstance(first_error, RateLimitError)
    assert first_error.retry_after_s == 7.0
    assert "429" in str(first_error) and "slow down" in str(first_error)
    assert len(server.requests) == 2


@pytest.mark.asyncio
async def test_rate_limit_with_retry_after_http_date_then_success(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    retry_at = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.script(
        json_reply({"error": "busy"}, status=429, headers={"Retry-After": retry_at}),
        json_reply(wire.text_body("done")),
    )
    fake = FakeTime()
    attempts: list[Attempt] = []
    async with wire.make(server.base_url, model="m") as provider:
        response = await call_with_resilience(
            lambda: provider.complete(hello_request()),
            policy=RetryPolicy(),
            on_attempt=attempts.append,
            sleep=fake.sleep,
            clock=fake,
        )
    assert response.text == "done"
    error = attempts[0].error
    assert isinstance(error, RateLimitError) and error.retry_after_s is not None
    # The date has one-second resolution and some wall time passes before it is read.
    assert 27.0 < error.retry_after_s <= 30.0
    assert fake.sleeps == [error.retry_after_s]


@pytest.mark.asyncio
async def test_server_errors_are_retried_until_success(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(
        Reply(status=500, body=b"internal error"),
        json_reply({"error": {"type": "overloaded_error", "message": "busy"}}, status=503),
        json_reply(wire.text_body("third time lucky")),
    )
    fake = FakeTime()
    attempts: list[Attempt] = []
    async with wire.make(server.base_url, model="m") as provider:
        response = await call_with_resilience(
            lambda: provider.complete(hello_request()),
            policy=RetryPolicy(initial_backoff_s=0.5, multiplier=2.0),
            on_attempt=attempts.append,
            sleep=fake.sleep,
            clock=fake,
            rng=random.Random(7),
        )
    assert response.text == "third time lucky"
    assert [attempt.outcome for attempt in attempts] == ["retry", "retry", "ok"]
    statuses = [getattr(attempt.error, "status_code", None) for attempt in attempts]
    assert statuses == [500, 503, None]
    assert all(isinstance(attempt.error, ServerError) for attempt in attempts[:2])
    assert "overloaded_error: busy" in str(attempts[1].error)
    assert len(fake.sleeps) == 2
    assert 0.0 <= fake.sleeps[0] <= 0.5 and 0.0 <= fake.sleeps[1] <= 1.0
    assert len(server.requests) == 3


@pytest.mark.asyncio
async def test_slow_server_times_out(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(Reply(delay_s=30.0, body=b"{}"))
    started = time.monotonic()
    async with wire.make(server.base_url, model="m", read_timeout_s=0.3) as provider:
        with pytest.raises(ProviderTimeout, match="timed out"):
            await provider.complete(hello_request())
    assert time.monotonic() - started < 10.0


@pytest.mark.asyncio
async def test_refused_connection_is_provider_unavailable_naming_url_and_os_error(
    wire: Wire,
) -> None:
    base_url = f"http://127.0.0.1:{unused_local_port()}"
    fake = FakeTime()
    attempts: list[Attempt] = []
    async with wire.make(base_url, model="m", connect_timeout_s=2.0) as provider:
        with pytest.raises(ProviderUnavailable) as raised:
            await call_with_resilience(
                lambda: provider.complete(hello_request()),
                policy=RetryPolicy(max_attempts=3),
                on_attempt=attempts.append,
                sleep=fake.sleep,
                clock=fake,
            )
        message = str(raised.value)
        assert f"cannot connect to {provider.url}: ConnectionRefusedError: " in message
        assert "Connection refused" in message or "Connect call failed" in message
    # A kind of ProviderTimeout, retried exactly as before.
    assert isinstance(raised.value, ProviderTimeout) and raised.value.retryable
    assert [attempt.outcome for attempt in attempts] == ["retry", "retry", "failed"]
    assert all(isinstance(attempt.error, ProviderUnavailable) for attempt in attempts)


@pytest.mark.asyncio
async def test_bad_request_is_not_retried(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(
        json_reply(
            {"error": {"type": "invalid_request_error", "message": "messages: too long"}},
            status=400,
        )
    )
    fake = FakeTime()
    attempts: list[Attempt] = []
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError) as raised:
            await call_with_resilience(
                lambda: provider.complete(hello_request()),
                policy=RetryPolicy(),
                on_attempt=attempts.append,
                sleep=fake.sleep,
                clock=fake,
            )
    assert raised.value.status_code == 400
    assert "HTTP 400" in str(raised.value)
    assert "invalid_request_error: messages: too long" in str(raised.value)
    assert [attempt.outcome for attempt in attempts] == ["failed"]
    assert fake.sleeps == []
    assert len(server.requests) == 1


@pytest.mark.asyncio
async def test_long_error_bodies_are_cut_short(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(Reply(status=422, body=b"x" * 5000))
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError) as raised:
            await provider.complete(hello_request())
    assert raised.value.status_code == 422
    assert len(str(raised.value)) < 400


@pytest.mark.asyncio
async def test_malformed_json_body_is_a_request_error_and_not_retried(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(Reply(status=200, body=b'{"choices": [trunc'))
    fake = FakeTime()
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError, match="not valid JSON"):
            await call_with_resilience(
                lambda: provider.complete(hello_request()),
                policy=RetryPolicy(),
                sleep=fake.sleep,
                clock=fake,
            )
    assert fake.sleeps == []
    assert len(server.requests) == 1


@pytest.mark.asyncio
async def test_json_without_the_expected_shape_is_a_request_error(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(json_reply([1, 2, 3]), json_reply({"unexpected": True}))
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError, match="expected an object"):
            await provider.complete(hello_request())
        with pytest.raises(ProviderRequestError, match="malformed"):
            await provider.complete(hello_request())


@pytest.mark.asyncio
async def test_malformed_tool_arguments_are_a_request_error(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(json_reply(wire.bad_arguments_body))
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError, match="arguments"):
            await provider.complete(hello_request())


# --- the API key ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_api_key_never_leaks_into_errors_repr_or_pickles(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}; also sk-live-abcdef123"}}
    server.script(json_reply(echo, status=401))
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError) as raised:
            await provider.complete(hello_request())
        assert wire.key_header(server.requests[0].headers) == SECRET
        message = str(raised.value)
        assert "HTTP 401" in message and "Incorrect API key provided" in message
        assert SECRET not in message and "sk-live-abcdef123" not in message
        assert SECRET not in repr(provider)
        assert SECRET.encode() not in cloudpickle.dumps(provider)
        assert SECRET.encode() not in pickle.dumps(provider)


@pytest.mark.asyncio
async def test_missing_api_key_fails_before_sending(
    wire: Wire, server: ScriptedHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(wire.key_env)
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError, match=wire.key_env):
            await provider.complete(hello_request())
    assert server.requests == []


@pytest.mark.asyncio
async def test_api_key_env_name_is_configurable(
    wire: Wire, server: ScriptedHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_GATEWAY_KEY", "gateway-key-123")
    server.script(json_reply(wire.text_body("ok")))
    async with wire.make(server.base_url, model="m", api_key_env="MY_GATEWAY_KEY") as provider:
        await provider.complete(hello_request())
    assert wire.key_header(server.requests[0].headers) == "gateway-key-123"


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "complaint"),
    [
        ([{"role": "robot", "content": "hi"}], "role must be one of"),
        ([{"role": "user", "content": 42}], r"messages\[0\]\.content must be a string"),
        ([{"role": "user", "content": "hi", "colour": "red"}], "unsupported keys"),
        ([{"role": "tool", "content": "42"}], "tool_call_id"),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]}],
            "must be a JSON object",
        ),
        ([42], "must be a dict"),
    ],
)
@pytest.mark.asyncio
async def test_malformed_messages_are_refused_before_sending(
    wire: Wire, server: ScriptedHttpServer, messages: list[Any], complaint: str
) -> None:
    async with wire.make(server.base_url, model="m") as provider:
        with pytest.raises(ProviderRequestError, match=complaint):
            await provider.complete(LlmRequest(model_id="", messages=messages))
    assert server.requests == []


@pytest.mark.asyncio
async def test_missing_model_and_clashing_sampling_params_are_refused(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    async with wire.make(server.base_url) as provider:
        with pytest.raises(ProviderRequestError, match="no model"):
            await provider.complete(hello_request())
        clash = LlmRequest(model_id="m", messages=[], sampling_params={"messages": []})
        with pytest.raises(ProviderRequestError, match="sampling_params may not set"):
            await provider.complete(clash)
        not_json = LlmRequest(model_id="m", sampling_params={"temperature": float("nan")})
        with pytest.raises(ProviderRequestError, match="JSON"):
            await provider.complete(not_json)
    assert server.requests == []


@pytest.mark.parametrize(
    ("base_url", "kwargs", "error"),
    [
        ("ftp://example.invalid", {}, ValueError),
        ("not a url", {}, ValueError),
        ("http://user:password@127.0.0.1:1", {}, ValueError),
        ("http://127.0.0.1:1", {"read_timeout_s": 0}, ValueError),
        ("http://127.0.0.1:1", {"connect_timeout_s": "5"}, TypeError),
        ("http://127.0.0.1:1", {"api_key_env": ""}, ValueError),
    ],
)
def test_bad_configuration_is_refused_at_construction(
    wire: Wire, base_url: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        wire.make(base_url, **kwargs)


# --- pickling and event loops --------------------------------------------------------------


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_a_used_provider_pickles_and_works_on_another_loop(
    wire: Wire, server: ScriptedHttpServer, dumps: Callable[[Any], bytes]
) -> None:
    server.script(json_reply(wire.text_body("first")), json_reply(wire.text_body("second")))
    provider = wire.make(server.base_url, model="m", read_timeout_s=5.0)

    async def ask(client: JsonHttpProvider) -> LlmResponse:
        async with client:
            return await client.complete(hello_request())

    assert asyncio.run(ask(provider)).text == "first"
    clone = pickle.loads(dumps(provider))
    assert type(clone) is type(provider) and repr(clone) == repr(provider)
    assert asyncio.run(ask(clone)).text == "second"


def test_one_instance_survives_its_event_loop_closing(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(json_reply(wire.text_body("one")), json_reply(wire.text_body("two")))
    provider = wire.make(server.base_url, model="m")

    async def ask() -> str:
        # No aclose(): the loop ends with the client still open, as a crashed bundle's would.
        return (await provider.complete(hello_request())).text

    assert asyncio.run(ask()) == "one"
    assert server.wait_until_idle(), "the client must be closed when its loop shuts down"
    assert asyncio.run(ask()) == "two"
    assert server.wait_until_idle()


def test_repr_names_the_configuration(wire: Wire) -> None:
    provider = wire.make("http://127.0.0.1:9", model="m", api_key_env="SOME_KEY")
    assert "127.0.0.1:9" in repr(provider) and "SOME_KEY" in repr(provider)


def test_endpoint_key_is_base_url_plus_model(wire: Wire) -> None:
    provider = wire.make("http://127.0.0.1:9", model="default")
    assert provider.endpoint_key(hello_request()) == f"{provider.base_url}#default"
    assert provider.endpoint_key(hello_request("other")) == f"{provider.base_url}#other"


def test_trailing_slash_of_the_base_url_is_ignored() -> None:
    provider = OpenAIChatProvider(base_url="http://127.0.0.1:9/v1/")
    assert provider.url == "http://127.0.0.1:9/v1/chat/completions"


# --- wire translation: OpenAI --------------------------------------------------------------

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris"}},
            {"id": "call_b", "name": "get_weather", "arguments": {"city": "Oslo"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": '{"c":18}'},
    {"role": "tool", "tool_call_id": "call_b", "content": "station offline", "is_error": True},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "Cannot say."},
]


@pytest.mark.asyncio
async def test_openai_request_body_translation(
    server: ScriptedHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.script(json_reply(_openai_text("ok")))
    request = LlmRequest(
        model_id="gpt-test",
        messages=CONVERSATION,
        tools_schema=[WEATHER_TOOL],
        sampling_params={"temperature": 0.2, "max_tokens": 64},
    )
    async with OpenAIChatProvider(base_url=f"{server.base_url}/v1") as provider:
        await provider.complete(request)

    (received,) = server.requests
    assert received.headers["authorization"] == f"Bearer {SECRET}"
    assert received.json() == {
        "model": "gpt-test",
        "temperature": 0.2,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": '{"c":18}'},
            {"role": "tool", "tool_call_id": "call_b", "content": "station offline"},
            {"role": "user", "content": "And tomorrow?"},
            {"role": "assistant", "content": "Cannot say."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": WEATHER_TOOL["parameters"],
                },
            }
        ],
    }


@pytest.mark.asyncio
async def test_openai_without_a_key_sends_no_authorization(server: ScriptedHttpServer) -> None:
    server.script(json_reply(_openai_text("local")))
    async with OpenAIChatProvider(
        base_url=f"{server.base_url}/v1", model="llama", api_key_env=None
    ) as provider:
        response = await provider.complete(hello_request())
    assert response.text == "local"
    assert "authorization" not in server.requests[0].headers
    assert "tools" not in server.requests[0].json()


def test_openai_decodes_compatible_server_variants() -> None:
    provider = OpenAIChatProvider(base_url="http://127.0.0.1:9/v1")
    body = _openai_body(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "now", "arguments": ""}}
            ],
        },
        "tool_calls",
    )
    body["usage"] = {"input_tokens": 3, "output_tokens": 4}
    raw = json.dumps(body).encode()
    assert provider.decode(raw) == LlmResponse(
        response=raw,
        text="ab",
        tool_calls=(ToolCall(id="c1", name="now", arguments={}),),
        stop_reason="tool_calls",
        usage=TokenUsage(input_tokens=3, output_tokens=4),
        model="gpt-test",
    )


def test_openai_error_body_in_a_200_is_a_request_error() -> None:
    provider = OpenAIChatProvider(base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ProviderRequestError, match="model not loaded"):
        provider.decode(b'{"error": {"message": "model not loaded"}}')


# --- wire translation: Anthropic -----------------------------------------------------------


@pytest.mark.asyncio
async def test_anthropic_request_body_translation(
    server: ScriptedHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.script(json_reply(_anthropic_text("ok")))
    request = LlmRequest(
        model_id="",
        messages=CONVERSATION,
        tools_schema=[WEATHER_TOOL],
        sampling_params={"temperature": 0.2, "stop_sequences": ["END"]},
    )
    async with AnthropicMessagesProvider(
        base_url=server.base_url, model="claude-test", max_tokens=321
    ) as provider:
        await provider.complete(request)

    (received,) = server.requests
    assert received.headers["x-api-key"] == SECRET
    assert received.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in received.headers
    assert received.json() == {
        "model": "claude-test",
        "max_tokens": 321,
        "temperature": 0.2,
        "stop_sequences": ["END"],
        "system": "You are terse.\n\nUse tools.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_a",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "call_b",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_a", "content": '{"c":18}'},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_b",
                        "content": "station offline",
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Cannot say."}]},
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "input_schema": WEATHER_TOOL["parameters"],
            }
        ],
    }


@pytest.mark.asyncio
async def test_anthropic_max_tokens_from_sampling_params_wins(
    server: ScriptedHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.script(json_reply(_anthropic_text("ok")))
    request = LlmRequest(model_id="claude-test", sampling_params={"max_tokens": 9})
    async with AnthropicMessagesProvider(
        base_url=server.base_url, anthropic_version="2099-01-01"
    ) as provider:
        await provider.complete(request)
    body = server.requests[0].json()
    assert body["max_tokens"] == 9 and "system" not in body and "tools" not in body
    assert server.requests[0].headers["anthropic-version"] == "2099-01-01"


def test_anthropic_decode_mixed_blocks_and_cache_usage() -> None:
    provider = AnthropicMessagesProvider(base_url="http://127.0.0.1:9")
    body = _anthropic_body(
        [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Checking "},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
            {"type": "text", "text": "now."},
        ],
        "tool_use",
    )
    body["usage"] = {
        "input_tokens": 5,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 20,
        "output_tokens": 9,
    }
    response = provider.decode(json.dumps(body).encode())
    assert response.text == "Checking now."
    assert response.tool_calls == (
        ToolCall(id="t1", name="get_weather", arguments={"city": "Oslo"}),
    )
    assert response.usage == TokenUsage(input_tokens=125, output_tokens=9)


@pytest.mark.parametrize("max_tokens", [0, -5, True, 2.5])
def test_anthropic_max_tokens_must_be_a_positive_int(max_tokens: Any) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicMessagesProvider(base_url="http://127.0.0.1:9", max_tokens=max_tokens)
