"""``ctx.call_model`` through the real HTTP providers inside RunAgent: resilience on that path.

A local HTTP server on 127.0.0.1 speaks each provider's wire format; the agent calls the model
through ``OpenAIChatProvider`` / ``AnthropicMessagesProvider`` built by ``provider_factory``,
with the API key in an environment variable the test sets.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from beam_agents import AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import AgentEnvelope, ModelCacheEntry, TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.core.model_calls import ModelGateway
from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import LlmRequest, ServerError, TokenUsage
from beam_agents.model.fake import (
    FakeLLM,
    Shape,
    fail_then_succeed,
    match_any,
    match_contains,
    raise_error,
    wire_body,
)
from beam_agents.model.openai import OpenAIChatProvider
from beam_agents.model.resilience import CircuitBreakers, CircuitOpenError, RetryPolicy
from beam_agents.testing import EnvelopeStream
from tests.core.harness import Outputs, created, event, run_agent, streamed

from .http_fixture import Reply, ScriptedHttpServer

KEY_ENV = "BEAM_AGENTS_TEST_MODEL_KEY"
SECRET = "test-key-0c5e2b9a"
FAST_RETRIES = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)
K = b"caller-1"


@dataclass(frozen=True)
class Wire:
    """One provider: how to build it against the server, and what its bodies look like."""

    shape: Shape
    provider_class: type[OpenAIChatProvider] | type[AnthropicMessagesProvider]
    base_suffix: str
    finish_reason: str

    def factory(self, server: ScriptedHttpServer, **options: Any) -> Any:
        return functools.partial(
            self.provider_class,
            base_url=server.base_url + self.base_suffix,
            model="default-model",
            api_key_env=KEY_ENV,
            **options,
        )

    def ok(self, text: str) -> Reply:
        body = wire_body(self.shape, text=text, usage=TokenUsage(11, 7), model="served-model")
        return Reply(body=body, headers={"content-type": "application/json"})


OPENAI = Wire("openai", OpenAIChatProvider, "/v1", "stop")
ANTHROPIC = Wire("anthropic", AnthropicMessagesProvider, "", "end_turn")


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda wire: wire.shape)
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Wire:
    monkeypatch.setenv(KEY_ENV, SECRET)
    chosen: Wire = request.param
    return chosen


@pytest.fixture
def server() -> Iterator[ScriptedHttpServer]:
    with ScriptedHttpServer() as running:
        yield running


async def ask(ctx: ActivationContext) -> Complete:
    answer = await ctx.call_model(
        LlmRequest(model_id="", messages=[{"role": "user", "content": ctx.event.decode()}])
    )
    return Complete(output=answer.text.encode())


def run_once(wire: Wire, server: ScriptedHttpServer, **config: Any) -> Outputs:
    options = {"model_retry": FAST_RETRIES, **config}
    read_timeout_s = options.pop("read_timeout_s", 5.0)
    return run_agent(
        created([event(K, b"hello there")]),
        ask,
        AgentConfig(
            provider_factory=wire.factory(server, read_timeout_s=read_timeout_s), **options
        ),
    )


def llm_call(outputs: Outputs) -> TraceEvent:
    [call] = [e for e in outputs.traces if e.event_type == TraceEvent.LLM_CALL]
    return call


def status(code: int, *, retry_after: str | None = None) -> Reply:
    headers = {"content-type": "application/json"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return Reply(status=code, body=b'{"error": {"message": "nope"}}', headers=headers)


def test_a_call_succeeds_with_gen_ai_trace_attributes_and_beam_metrics(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(wire.ok("Hi! How can I help?"))
    outputs = run_once(wire, server)
    assert outputs.errors == [] and outputs.output == [b"Hi! How can I help?"]
    [received] = server.requests
    assert SECRET in str(received.headers)
    assert received.json()["model"] == "default-model"
    assert dict(llm_call(outputs).attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": wire.shape,
        "gen_ai.request.model": "default-model",
        "gen_ai.response.model": "served-model",
        "gen_ai.usage.input_tokens": "11",
        "gen_ai.usage.output_tokens": "7",
        "gen_ai.response.finish_reasons": f'["{wire.finish_reason}"]',
        "beam_agents.cache_hit": "false",
        "beam_agents.attempts": "1",
    }
    assert outputs.counters == {
        "model_calls": 1,
        "model_input_tokens": 11,
        "model_output_tokens": 7,
    }


def test_a_rate_limit_with_retry_after_then_success_completes_normally(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(status(429, retry_after="0.2"), wire.ok("Done."))
    started = time.monotonic()
    outputs = run_once(wire, server)
    assert outputs.errors == [] and outputs.output == [b"Done."]
    assert len(server.requests) == 2
    assert time.monotonic() - started >= 0.2  # Retry-After is a floor on the wait
    assert llm_call(outputs).attributes["beam_agents.attempts"] == "2"
    assert outputs.counters["model_retries"] == 1 and outputs.counters["model_calls"] == 1


def test_server_errors_are_retried_until_success(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(status(500), status(503), wire.ok("Third time lucky."))
    outputs = run_once(wire, server)
    assert outputs.errors == [] and outputs.output == [b"Third time lucky."]
    assert len(server.requests) == 3
    assert llm_call(outputs).attributes["beam_agents.attempts"] == "3"
    assert outputs.counters["model_retries"] == 2


def check_model_error(outputs: Outputs, *details: str) -> None:
    assert outputs.output == [] and outputs.intents == []
    [error] = outputs.errors
    assert error.reason == "model_error" and error.entity_key == K
    envelope = AgentEnvelope.FromString(error.envelope)
    assert envelope == event(K, b"hello there")[1]  # the original, ready to re-drive
    for detail in details:
        assert detail in error.detail
    assert SECRET not in error.detail
    [trace] = outputs.traces
    assert trace.event_type == TraceEvent.ERROR
    assert trace.attributes["reason"] == "model_error"


def test_a_bad_request_is_not_retried_and_fails_the_activation(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(status(400))
    outputs = run_once(wire, server)
    check_model_error(outputs, "ProviderRequestError", "HTTP 400", "after 1 attempt(s)")
    assert len(server.requests) == 1
    assert outputs.counters["model_call_failures"] == 1


def test_a_malformed_body_is_not_retried(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(Reply(body=b"{this is not json", headers={"content-type": "application/json"}))
    outputs = run_once(wire, server)
    check_model_error(outputs, "ProviderRequestError", "not valid JSON", "after 1 attempt(s)")
    assert len(server.requests) == 1


def test_a_timed_out_attempt_is_retried(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(Reply(body=b"{}", delay_s=2.0), wire.ok("Back again."))
    outputs = run_once(wire, server, read_timeout_s=0.2)
    assert outputs.errors == [] and outputs.output == [b"Back again."]
    assert llm_call(outputs).attributes["beam_agents.attempts"] == "2"


def test_exhausted_retries_fail_the_activation_with_the_last_error(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(*(Reply(body=b"{}", delay_s=2.0) for _ in range(2)))
    outputs = run_once(
        wire, server, read_timeout_s=0.2, model_retry=RetryPolicy(2, initial_backoff_s=0.01)
    )
    check_model_error(outputs, "ProviderTimeout", "timed out", "after 2 attempt(s)")
    assert len(server.requests) == 2
    assert outputs.counters["model_retries"] == 1


def test_no_retry_waits_past_the_activation_budget(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(status(429, retry_after="30"))
    started = time.monotonic()
    outputs = run_once(wire, server, activation_timeout_s=5.0)
    assert time.monotonic() - started < 5.0
    check_model_error(outputs, "RateLimitError", "HTTP 429", "after 1 attempt(s)")


def test_retries_can_be_turned_off(wire: Wire, server: ScriptedHttpServer) -> None:
    server.script(status(503))
    outputs = run_once(wire, server, model_retry=None)
    check_model_error(outputs, "ServerError", "after 1 attempt(s)")
    assert len(server.requests) == 1


async def ask_then_ship(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks on resume: the call made before the suspension is replayed from the cache."""
    answer = await ctx.call_model(
        LlmRequest(model_id="", messages=[{"role": "user", "content": "plan"}])
    )
    ctx.act("ship", {"plan": answer.text})
    return Complete(output=answer.text.encode()) if ctx.is_resume else Suspend()


def test_a_replayed_call_is_decoded_by_the_provider_and_traced_deterministically(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(wire.ok("Ship by boat."))
    stream = (
        EnvelopeStream().event(K, b"go", at_ms=1_000).result(K, intent_id_for(K, 0, 1), at_ms=2_000)
    )
    outputs = run_agent(
        streamed(stream),
        ask_then_ship,
        AgentConfig(provider_factory=wire.factory(server)),
        streaming=True,
    )
    assert outputs.errors == [] and outputs.output == [b"Ship by boat."]
    assert len(server.requests) == 1
    first, replayed = [e for e in outputs.traces_for(K) if e.event_type == TraceEvent.LLM_CALL]
    assert replayed.attributes["beam_agents.cache_hit"] == "true"
    assert replayed.attributes["beam_agents.attempts"] == "0"
    unchanged = {key: value for key, value in first.attributes.items() if "beam_agents." not in key}
    assert {key: replayed.attributes[key] for key in unchanged} == unchanged


def test_the_circuit_opens_after_the_threshold_and_then_fails_fast(
    wire: Wire, server: ScriptedHttpServer
) -> None:
    server.script(status(500), status(500))
    outputs = run_agent(
        created([event(b"caller-%d" % n, b"hello there") for n in range(4)]),
        ask,
        AgentConfig(
            provider_factory=wire.factory(server),
            model_retry=None,
            circuit_failure_threshold=2,
        ),
    )
    assert len(server.requests) == 2  # the last two calls never reached the server
    details = sorted(error.detail for error in outputs.errors)
    assert [error.reason for error in outputs.errors] == ["model_error"] * 4
    assert sum("CircuitOpenError" in detail for detail in details) == 2
    assert sum("ServerError" in detail for detail in details) == 2


def test_the_gateway_breaker_is_per_endpoint_and_counts_only_reaching_attempts() -> None:
    fake = FakeLLM([(match_any(), raise_error(ServerError("down")))])
    gateway = ModelGateway(
        fake, retry_policy=RetryPolicy(max_attempts=1), breakers=CircuitBreakers(2, 60.0)
    )
    request = LlmRequest(model_id="a")

    async def attempt(model_request: LlmRequest) -> BaseException:
        try:
            await gateway.complete(model_request)
        except Exception as exc:
            return exc
        raise AssertionError("the call was expected to fail")

    failures = [asyncio.run(attempt(request)) for _ in range(3)]
    assert [type(failure) for failure in failures] == [ServerError, ServerError, CircuitOpenError]
    assert "after 0 attempt(s)" in str(failures[2].__notes__)
    assert fake.call_count == 2
    # Another model is another endpoint, with a breaker of its own.
    assert isinstance(asyncio.run(attempt(LlmRequest(model_id="b"))), ServerError)
    assert fake.call_count == 3


@dataclass
class CountingMetrics:
    counts: dict[str, int]

    def inc(self, name: str, value: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + value


def test_the_gateway_counts_calls_retries_failures_hits_and_tokens() -> None:
    fake = FakeLLM(
        [
            (match_contains("flaky"), fail_then_succeed(ServerError("blip"), 1, b"two words")),
            (match_any(), raise_error(ServerError("down"))),
        ]
    )
    metrics = CountingMetrics({})
    gateway = ModelGateway(
        fake, retry_policy=RetryPolicy(2, initial_backoff_s=0.0), metrics=metrics
    )
    flaky = LlmRequest(model_id="m", messages=[{"role": "user", "content": "flaky one"}])
    answer = asyncio.run(gateway.complete(flaky))
    assert answer.attempts == 2 and answer.response.text == "two words"
    with pytest.raises(ServerError):
        asyncio.run(gateway.complete(LlmRequest(model_id="m")))
    entry = ModelCacheEntry(response=b"stored", input_tokens=3, output_tokens=4)
    assert gateway.replay(entry).usage == TokenUsage(3, 4)
    assert metrics.counts == {
        "model_calls": 2,
        "model_retries": 2,
        "model_call_failures": 1,
        "model_input_tokens": 2,
        "model_output_tokens": 2,
        "model_cache_hits": 1,
    }
