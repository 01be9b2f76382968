"""Retry policy, circuit breaker and call_with_resilience, on a fake clock (no real sleeping)."""

from __future__ import annotations

import asyncio
import pickle
import random
from collections.abc import Awaitable, Callable
from typing import Any

import cloudpickle
import pytest

from beam_agents.model.client import (
    ProviderError,
    ProviderRequestError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
)
from beam_agents.model.resilience import (
    Attempt,
    CircuitBreaker,
    CircuitBreakers,
    CircuitOpenError,
    CircuitState,
    RetryPolicy,
    call_with_resilience,
)


class FakeTime:
    """A clock whose sleep advances it instantly, recording every wait."""

    def __init__(self) -> None:
        self.now = 500.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Script:
    """A call that raises or returns the scripted outcomes in order, taking ``cost_s`` each."""

    def __init__(self, clock: FakeTime, *outcomes: Any, cost_s: float = 0.0) -> None:
        self.clock = clock
        self.outcomes = list(outcomes)
        self.cost_s = cost_s
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        self.clock.now += self.cost_s
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def run(
    call: Callable[[], Awaitable[Any]],
    fake: FakeTime,
    *,
    policy: RetryPolicy | None = None,
    breaker: CircuitBreaker | None = None,
    budget_s: float | None = None,
    attempts: list[Attempt] | None = None,
) -> Any:
    return await call_with_resilience(
        call,
        policy=policy or RetryPolicy(),
        breaker=breaker,
        budget_s=budget_s,
        on_attempt=None if attempts is None else attempts.append,
        sleep=fake.sleep,
        clock=fake,
        rng=random.Random(42),
    )


# --- RetryPolicy ---------------------------------------------------------------------------


def test_policy_defaults_match_the_contract() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff_s, policy.max_backoff_s) == (4, 0.2, 10.0)
    assert (policy.multiplier, policy.jitter) == (2.0, "full")


def test_backoff_ceiling_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=5.0, multiplier=3.0)
    ceilings = [policy.backoff_ceiling_s(n) for n in range(5)]
    assert ceilings == pytest.approx([0.5, 1.5, 4.5, 5.0, 5.0])
    # Far past the cap the exponent would overflow a float; the ceiling just stays capped.
    assert policy.backoff_ceiling_s(10_000) == 5.0
    assert RetryPolicy(multiplier=1.0).backoff_ceiling_s(50) == 0.2
    assert RetryPolicy(initial_backoff_s=0.0, max_backoff_s=0.0).backoff_ceiling_s(3) == 0.0


def test_full_jitter_stays_within_the_ceiling_and_spreads_out() -> None:
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=8.0)
    rng = random.Random(3)
    draws = [policy.backoff_s(2, rng) for _ in range(500)]
    assert all(0.0 <= draw <= 4.0 for draw in draws)
    assert min(draws) < 0.5 and max(draws) > 3.5


def test_no_jitter_waits_exactly_the_ceiling() -> None:
    policy = RetryPolicy(jitter="none")
    assert [policy.backoff_s(n, random.Random()) for n in range(3)] == pytest.approx(
        [0.2, 0.4, 0.8]
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 2.5}, TypeError),
        ({"max_attempts": True}, TypeError),
        ({"initial_backoff_s": -1.0}, ValueError),
        ({"initial_backoff_s": float("nan")}, ValueError),
        ({"max_backoff_s": 0.1}, ValueError),
        ({"max_backoff_s": float("inf")}, ValueError),
        ({"multiplier": 0.5}, ValueError),
        ({"multiplier": "2"}, TypeError),
        ({"jitter": "equal"}, ValueError),
    ],
)
def test_policy_refuses_bad_settings(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_policy_is_frozen_and_pickles(dumps: Callable[[Any], bytes]) -> None:
    policy = RetryPolicy(max_attempts=7, jitter="none")
    assert pickle.loads(dumps(policy)) == policy
    with pytest.raises(AttributeError):
        policy.max_attempts = 3  # type: ignore[misc]


# --- call_with_resilience ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_success_on_the_first_try_does_not_sleep() -> None:
    fake = FakeTime()
    attempts: list[Attempt] = []
    call = Script(fake, "answer", cost_s=0.25)
    assert await run(call, fake, attempts=attempts) == "answer"
    assert fake.sleeps == []
    assert attempts == [Attempt(number=1, outcome="ok", elapsed_s=0.25)]


@pytest.mark.asyncio
async def test_retryable_errors_are_retried_until_max_attempts() -> None:
    fake = FakeTime()
    errors = [ServerError(status_code=502), ProviderTimeout("t"), ServerError(status_code=500)]
    call = Script(fake, *errors, ServerError(status_code=503), "never")
    attempts: list[Attempt] = []
    with pytest.raises(ServerError) as raised:
        await run(call, fake, policy=RetryPolicy(max_attempts=4), attempts=attempts)
    assert raised.value.status_code == 503
    assert call.calls == 4
    assert [attempt.outcome for attempt in attempts] == ["retry", "retry", "retry", "failed"]
    assert [attempt.number for attempt in attempts] == [1, 2, 3, 4]
    assert [attempt.backoff_s for attempt in attempts[:3]] == fake.sleeps
    for index, wait in enumerate(fake.sleeps):
        assert 0.0 <= wait <= RetryPolicy().backoff_ceiling_s(index)


@pytest.mark.asyncio
async def test_one_attempt_policy_never_retries() -> None:
    fake = FakeTime()
    call = Script(fake, ServerError(), "never")
    with pytest.raises(ServerError):
        await run(call, fake, policy=RetryPolicy(max_attempts=1))
    assert call.calls == 1 and fake.sleeps == []


@pytest.mark.asyncio
async def test_non_retryable_errors_are_raised_at_once() -> None:
    fake = FakeTime()
    call = Script(fake, ProviderRequestError("bad", status_code=400), "never")
    attempts: list[Attempt] = []
    with pytest.raises(ProviderRequestError):
        await run(call, fake, attempts=attempts)
    assert call.calls == 1 and fake.sleeps == []
    assert [attempt.outcome for attempt in attempts] == ["failed"]


@pytest.mark.asyncio
async def test_other_exceptions_propagate_untouched() -> None:
    fake = FakeTime()
    call = Script(fake, KeyError("bug"), "never")
    with pytest.raises(KeyError):
        await run(call, fake)
    assert call.calls == 1


@pytest.mark.asyncio
async def test_retry_after_is_a_lower_bound_on_the_wait() -> None:
    fake = FakeTime()
    call = Script(fake, RateLimitError(retry_after_s=3.0), RateLimitError(), "ok")
    assert await run(call, fake) == "ok"
    assert fake.sleeps[0] == 3.0
    assert 0.0 <= fake.sleeps[1] <= 0.4


@pytest.mark.asyncio
async def test_retries_stop_at_the_budget_with_the_last_error() -> None:
    fake = FakeTime()
    policy = RetryPolicy(max_attempts=50, initial_backoff_s=1.0, max_backoff_s=1.0, jitter="none")
    failures = [ProviderTimeout(f"attempt {n}") for n in range(1, 51)]
    call = Script(fake, *failures, cost_s=0.5)
    start = fake.now
    attempts: list[Attempt] = []
    with pytest.raises(ProviderTimeout, match=r"attempt 4$"):
        await run(call, fake, policy=policy, budget_s=6.0, attempts=attempts)
    # Each round is 0.5 s of call plus 1 s of wait: after the 4th call (5 s in), one more
    # wait would reach the 6 s budget, so it gives up instead of sleeping.
    assert call.calls == 4
    assert fake.sleeps == [1.0, 1.0, 1.0]
    assert fake.now - start == pytest.approx(5.0)
    assert attempts[-1].outcome == "failed"


@pytest.mark.asyncio
async def test_a_retry_after_beyond_the_budget_gives_up_at_once() -> None:
    fake = FakeTime()
    call = Script(fake, RateLimitError("slow", retry_after_s=60.0), "too late")
    with pytest.raises(RateLimitError, match="slow"):
        await run(call, fake, budget_s=30.0)
    assert call.calls == 1 and fake.sleeps == []


@pytest.mark.asyncio
async def test_nan_budget_is_refused() -> None:
    fake = FakeTime()
    with pytest.raises(ValueError, match="budget_s"):
        await run(Script(fake, "x"), fake, budget_s=float("nan"))


# --- CircuitBreaker ------------------------------------------------------------------------


def test_breaker_opens_after_the_threshold_and_fails_fast() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=3, reset_timeout_s=30.0, endpoint="e", clock=fake)
    for _ in range(2):
        breaker.allow()
        breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED and breaker.consecutive_failures == 2
    breaker.allow()
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    fake.now += 10.0
    with pytest.raises(CircuitOpenError) as raised:
        breaker.allow()
    assert raised.value.endpoint == "e"
    assert raised.value.retry_after_s == pytest.approx(20.0)
    assert "3 consecutive failures" in str(raised.value)
    assert isinstance(raised.value, ProviderError) and not raised.value.retryable


def test_a_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, clock=FakeTime())
    breaker.allow()
    breaker.record_failure()
    breaker.allow()
    breaker.record_success()
    breaker.allow()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED


def test_half_open_allows_one_trial_whose_success_closes() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=5.0, clock=fake)
    breaker.allow()
    breaker.record_failure()
    fake.now += 4.9
    assert breaker.state is CircuitState.OPEN
    fake.now += 0.1
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.allow()
    with pytest.raises(CircuitOpenError, match="trial call is in flight"):
        breaker.allow()
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED
    breaker.allow()
    breaker.allow()


def test_a_failed_trial_reopens_for_a_fresh_cool_down() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=2, reset_timeout_s=5.0, clock=fake)
    for _ in range(2):
        breaker.allow()
        breaker.record_failure()
    fake.now += 5.0
    breaker.allow()
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN
    fake.now += 4.0
    with pytest.raises(CircuitOpenError):
        breaker.allow()
    fake.now += 1.0
    breaker.allow()
    assert breaker.state is CircuitState.HALF_OPEN


def test_a_released_trial_lets_another_trial_in() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=1.0, clock=fake)
    breaker.allow()
    breaker.record_failure()
    fake.now += 1.0
    breaker.allow()
    breaker.release()
    breaker.allow()
    assert breaker.state is CircuitState.HALF_OPEN


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"failure_threshold": 0}, ValueError),
        ({"failure_threshold": 1.5}, TypeError),
        ({"reset_timeout_s": -1.0}, ValueError),
        ({"reset_timeout_s": float("inf")}, ValueError),
    ],
)
def test_breaker_refuses_bad_settings(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        CircuitBreaker(**kwargs)
    with pytest.raises(error):
        CircuitBreakers(**kwargs)


def test_registry_keeps_one_breaker_per_endpoint_and_registries_are_independent() -> None:
    fake = FakeTime()
    breakers = CircuitBreakers(failure_threshold=1, reset_timeout_s=9.0, clock=fake)
    first = breakers.for_endpoint("http://a#m1")
    assert breakers.for_endpoint("http://a#m1") is first
    other = breakers.for_endpoint("http://a#m2")
    assert other is not first and len(breakers) == 2
    first.allow()
    first.record_failure()
    assert first.state is CircuitState.OPEN
    assert other.state is CircuitState.CLOSED
    assert CircuitBreakers().for_endpoint("http://a#m1").state is CircuitState.CLOSED
    assert (first.failure_threshold, first.reset_timeout_s, first.endpoint) == (
        1,
        9.0,
        "http://a#m1",
    )


# --- call_with_resilience with a breaker ---------------------------------------------------


@pytest.mark.asyncio
async def test_an_open_circuit_refuses_without_calling() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=30.0, clock=fake)
    breaker.allow()
    breaker.record_failure()
    call = Script(fake, "never")
    attempts: list[Attempt] = []
    with pytest.raises(CircuitOpenError):
        await run(call, fake, breaker=breaker, attempts=attempts)
    assert call.calls == 0 and fake.sleeps == []
    assert [attempt.outcome for attempt in attempts] == ["failed"]


@pytest.mark.asyncio
async def test_repeated_failures_trip_the_breaker_mid_retry() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=2, reset_timeout_s=30.0, clock=fake)
    call = Script(fake, ServerError("first"), ServerError("second"), "never")
    attempts: list[Attempt] = []
    with pytest.raises(CircuitOpenError) as raised:
        await run(call, fake, breaker=breaker, attempts=attempts)
    assert call.calls == 2
    assert isinstance(raised.value.__cause__, ServerError)
    assert str(raised.value.__cause__) == "second"
    assert [attempt.outcome for attempt in attempts] == ["retry", "retry", "failed"]


@pytest.mark.asyncio
async def test_after_the_cool_down_a_successful_trial_closes_the_circuit() -> None:
    fake = FakeTime()
    breakers = CircuitBreakers(failure_threshold=2, reset_timeout_s=30.0, clock=fake)
    breaker = breakers.for_endpoint("endpoint")
    policy = RetryPolicy(max_attempts=2)
    with pytest.raises(ServerError):
        await run(Script(fake, ServerError(), ServerError()), fake, policy=policy, breaker=breaker)
    assert breaker.state is CircuitState.OPEN
    fake.now += 30.0
    assert breaker.state is CircuitState.HALF_OPEN
    assert await run(Script(fake, "recovered"), fake, breaker=breaker) == "recovered"
    assert breaker.state is CircuitState.CLOSED


@pytest.mark.asyncio
async def test_bad_requests_do_not_count_against_the_endpoint() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=1, clock=fake)
    for _ in range(3):
        with pytest.raises(ProviderRequestError):
            await run(Script(fake, ProviderRequestError("bad")), fake, breaker=breaker)
    assert breaker.state is CircuitState.CLOSED


@pytest.mark.asyncio
async def test_a_cancelled_trial_does_not_wedge_the_breaker() -> None:
    fake = FakeTime()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=1.0, clock=fake)
    breaker.allow()
    breaker.record_failure()
    fake.now += 1.0
    started = asyncio.Event()

    async def hangs() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(run(hangs, fake, breaker=breaker))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await run(Script(fake, "trial"), fake, breaker=breaker) == "trial"
    assert breaker.state is CircuitState.CLOSED
