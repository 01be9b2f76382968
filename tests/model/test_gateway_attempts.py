"""The gateway's attempts: a first one straight to the provider, the breaker told every outcome."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from beam_agents.core.model_calls import AnswerMemo, ModelGateway, ProviderAnswer
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderError,
    ProviderRequestError,
    RateLimitError,
    ServerError,
    TokenUsage,
)
from beam_agents.model.fake import FakeLLM, fail_then_succeed, match_any, respond_with
from beam_agents.model.resilience import (
    CircuitBreakers,
    CircuitOpenError,
    CircuitState,
    RetryPolicy,
)

REQUEST = LlmRequest("m", "hi")
NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff_s=0.0)
ENDPOINT = "Client#m"
"""The breaker key of ``REQUEST`` sent by a :class:`Client`."""


@dataclass
class Counts:
    counts: dict[str, int] = field(default_factory=dict)

    def inc(self, name: str, value: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + value


@dataclass
class Client:
    """A client answering each call from ``outcomes`` in turn, after ``latency_s``."""

    outcomes: list[object]
    latency_s: float = 0.0
    calls: int = 0

    async def complete(self, request: LlmRequest) -> LlmResponse:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]  # a non-response, for the type check


def answer(text: str) -> LlmResponse:
    return LlmResponse(response=text.encode(), text=text)


def test_a_first_attempt_success_clears_the_breakers_earlier_failures() -> None:
    breakers = CircuitBreakers(failure_threshold=3, reset_timeout_s=60.0)
    gateway = ModelGateway(
        Client([ServerError("one"), ServerError("two"), answer("ok")]),
        retry_policy=RetryPolicy(max_attempts=1),
        breakers=breakers,
    )
    for _ in range(2):
        with pytest.raises(ServerError):
            asyncio.run(gateway.complete(REQUEST))
    breaker = breakers.for_endpoint(ENDPOINT)
    assert breaker.consecutive_failures == 2 and breaker.closed
    assert asyncio.run(gateway.complete(REQUEST)).attempts == 1
    assert breaker.consecutive_failures == 0


def test_a_half_open_circuit_lets_one_trial_through_and_its_success_closes_it() -> None:
    breakers = CircuitBreakers(failure_threshold=1, reset_timeout_s=0.0)
    client = Client([ServerError("down"), answer("back")])
    gateway = ModelGateway(client, retry_policy=RetryPolicy(max_attempts=1), breakers=breakers)
    with pytest.raises(ServerError):
        asyncio.run(gateway.complete(REQUEST))
    breaker = breakers.for_endpoint(ENDPOINT)
    assert breaker.state is CircuitState.HALF_OPEN
    assert asyncio.run(gateway.complete(REQUEST)).response.text == "back"
    assert breaker.closed and client.calls == 2


def test_an_open_circuit_refuses_before_the_provider_and_counts_a_failure() -> None:
    counts = Counts()
    breakers = CircuitBreakers(failure_threshold=1, reset_timeout_s=60.0)
    client = Client([ServerError("down")])
    gateway = ModelGateway(
        client, retry_policy=RetryPolicy(max_attempts=1), breakers=breakers, metrics=counts
    )
    with pytest.raises(ServerError):
        asyncio.run(gateway.complete(REQUEST))
    with pytest.raises(CircuitOpenError) as refused:
        asyncio.run(gateway.complete(REQUEST))
    assert client.calls == 1
    assert "after 0 attempt(s)" in str(refused.value.__notes__)
    assert refused.value.__cause__ is None and refused.value.__context__ is None
    assert counts.counts == {"model_calls": 2, "model_call_failures": 2}


def test_a_cancelled_trial_call_lets_the_next_call_try() -> None:
    breakers = CircuitBreakers(failure_threshold=1, reset_timeout_s=0.0)
    client = Client([ServerError("down"), answer("late"), answer("next")], latency_s=0.05)
    gateway = ModelGateway(client, retry_policy=RetryPolicy(max_attempts=1), breakers=breakers)
    with pytest.raises(ServerError):
        asyncio.run(gateway.complete(REQUEST))

    async def cancel_the_trial() -> None:
        trial = asyncio.ensure_future(gateway.complete(REQUEST))
        await asyncio.sleep(0.01)
        trial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await trial

    asyncio.run(cancel_the_trial())
    assert asyncio.run(gateway.complete(REQUEST)).response.text == "next"


def test_a_client_returning_no_response_fails_without_a_retry_and_frees_the_trial() -> None:
    breakers = CircuitBreakers(failure_threshold=1, reset_timeout_s=0.0)
    client = Client([ServerError("down"), "not a response", answer("fine")])
    gateway = ModelGateway(client, retry_policy=RetryPolicy(max_attempts=1), breakers=breakers)
    with pytest.raises(ServerError):
        asyncio.run(gateway.complete(REQUEST))
    with pytest.raises(TypeError, match="returned str, not an LlmResponse"):
        asyncio.run(gateway.complete(REQUEST))
    assert client.calls == 2
    assert asyncio.run(gateway.complete(REQUEST)).response.text == "fine"


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (LlmResponse(response="text"), "response is str, not bytes"),  # type: ignore[arg-type]
        (LlmResponse(b"", model=None), "model is NoneType, not str"),  # type: ignore[arg-type]
        (LlmResponse(b"", usage=TokenUsage(1.0, 2)), "usage.input_tokens is float, not int"),  # type: ignore[arg-type]
        (LlmResponse(b"", usage=TokenUsage(1, True)), "usage.output_tokens is bool, not int"),
    ],
)
def test_a_response_with_a_field_of_the_wrong_type_is_refused_naming_it(
    response: LlmResponse, problem: str
) -> None:
    gateway = ModelGateway(Client([response, answer("fine")]))
    with pytest.raises(TypeError, match=f"Client.complete returned an LlmResponse whose {problem}"):
        asyncio.run(gateway.complete(REQUEST))
    assert asyncio.run(gateway.complete(REQUEST)).response.text == "fine"


class Hooked(ModelClient):
    """A client subclass whose hooks hold the values it is built with."""

    def __init__(self, needs_task: object, provider: object) -> None:
        self.needs_asyncio_task = needs_task  # type: ignore[assignment]
        self.provider = provider

    @property
    def gen_ai_provider_name(self) -> str:
        return self.provider  # type: ignore[return-value]

    async def complete(self, request: LlmRequest) -> LlmResponse:
        return answer("hooked")


@pytest.mark.parametrize(
    ("needs_task", "provider", "problem"),
    [
        (0, "p", "needs_asyncio_task must be a bool, got int"),
        (True, None, "gen_ai_provider_name must be a str, got NoneType"),
    ],
)
def test_a_client_hook_of_the_wrong_type_is_refused_when_the_gateway_is_built(
    needs_task: object, provider: object, problem: str
) -> None:
    with pytest.raises(TypeError, match=f"provider_factory returned Hooked: Hooked.{problem}"):
        ModelGateway(Hooked(needs_task, provider))
    assert asyncio.run(ModelGateway(Hooked(False, "p")).complete(REQUEST)).response.text == "hooked"


def test_a_nan_budget_is_refused_before_the_provider() -> None:
    client = Client([answer("never")])
    with pytest.raises(ValueError, match="budget_s"):
        asyncio.run(ModelGateway(client).complete(REQUEST, budget_s=float("nan")))
    assert client.calls == 0


def test_a_failed_first_attempt_is_retried_and_counted() -> None:
    counts = Counts()
    fake = FakeLLM([(match_any(), fail_then_succeed(ServerError("blip"), 2, b"third"))])
    gateway = ModelGateway(fake, retry_policy=NO_WAIT, metrics=counts)
    answered = asyncio.run(gateway.complete(REQUEST))
    assert (answered.response.text, answered.attempts, fake.call_count) == ("third", 3, 3)
    assert counts.counts["model_calls"] == 1 and counts.counts["model_retries"] == 2


def test_a_retried_error_is_not_chained_to_the_first_attempts() -> None:
    client = Client([ServerError("first"), ServerError("second"), ProviderRequestError("last")])
    with pytest.raises(ProviderError) as raised:
        asyncio.run(ModelGateway(client, retry_policy=NO_WAIT).complete(REQUEST))
    assert str(raised.value) == "last" and raised.value.__context__ is None
    assert "after 3 attempt(s)" in str(raised.value.__notes__)


def test_the_budget_runs_from_the_start_of_the_first_attempt() -> None:
    # The first attempt takes 0.2 s: a 0.15 s wait then ends past the 0.3 s budget.
    client = Client([RateLimitError("slow", retry_after_s=0.15), answer("too late")], 0.2)
    with pytest.raises(RateLimitError):
        asyncio.run(ModelGateway(client, retry_policy=NO_WAIT).complete(REQUEST, budget_s=0.3))
    assert client.calls == 1


def test_a_kept_answer_is_not_asked_for_again() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"once"))])
    memo: AnswerMemo[ProviderAnswer] = AnswerMemo()
    gateway = ModelGateway(fake, memo=memo)
    first = asyncio.run(gateway.complete(REQUEST, memo_key="k"))
    assert asyncio.run(gateway.complete(REQUEST, memo_key="k")) is first
    assert fake.call_count == 1
