"""Retries with backoff and circuit breaking for model calls, bounded by the caller's budget.

Nothing is global: the caller owns the breakers, the clock, the sleep and the random source.
"""

from __future__ import annotations

import asyncio
import enum
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from beam_agents.model.client import ProviderError, RateLimitError

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[object]]


class CircuitOpenError(ProviderError):
    """The endpoint's circuit is open: the call was refused without reaching the provider."""

    retryable = False

    def __init__(
        self,
        message: str = "circuit open",
        *,
        endpoint: str = "",
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.endpoint = endpoint
        self.retry_after_s = retry_after_s


def _check_number(name: str, value: float, *, minimum: float, inclusive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    in_range = value >= minimum if inclusive else value > minimum
    if not (math.isfinite(value) and in_range):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a retryable provider error.

    The wait before retry ``n`` (0-based) is at most ``initial_backoff_s * multiplier**n``,
    capped at ``max_backoff_s``. ``jitter="full"`` draws it uniformly below that ceiling.
    A rate limit's ``retry_after_s`` is a lower bound on the wait.
    ``max_attempts`` counts the first call.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    multiplier: float = 2.0
    jitter: Literal["full", "none"] = "full"

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int, got {type(self.max_attempts).__name__}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        _check_number("initial_backoff_s", self.initial_backoff_s, minimum=0.0)
        _check_number("max_backoff_s", self.max_backoff_s, minimum=self.initial_backoff_s)
        _check_number("multiplier", self.multiplier, minimum=1.0)
        if self.jitter not in ("full", "none"):
            raise ValueError(f"jitter must be 'full' or 'none', got {self.jitter!r}")

    def backoff_ceiling_s(self, retry_index: int) -> float:
        """Return the longest wait before retry ``retry_index`` (0 for the first retry)."""
        if self.initial_backoff_s == 0.0:
            return 0.0
        if self.multiplier > 1.0:
            # Past this exponent the ceiling is max_backoff_s; stop before floats overflow.
            cap_index = math.log(self.max_backoff_s / self.initial_backoff_s, self.multiplier)
            if retry_index >= cap_index:
                return self.max_backoff_s
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**retry_index)

    def backoff_s(self, retry_index: int, rng: random.Random) -> float:
        """Return the wait before retry ``retry_index``, jittered per the policy."""
        ceiling = self.backoff_ceiling_s(retry_index)
        return rng.uniform(0.0, ceiling) if self.jitter == "full" else ceiling


class CircuitState(enum.Enum):
    """Where a circuit breaker is in its cycle."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Fails fast for an endpoint that keeps failing, and probes it again after a cool-down.

    ``failure_threshold`` consecutive failures open it; after ``reset_timeout_s`` one trial
    call goes through, and its outcome closes or reopens it. Not thread-safe.
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout_s: float = 30.0,
        *,
        endpoint: str = "",
        clock: Clock = time.monotonic,
    ) -> None:
        if isinstance(failure_threshold, bool) or not isinstance(failure_threshold, int):
            raise TypeError("failure_threshold must be an int")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        _check_number("reset_timeout_s", reset_timeout_s, minimum=0.0)
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = float(reset_timeout_s)
        self.endpoint = endpoint
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._consecutive_failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False

    def __repr__(self) -> str:
        return f"CircuitBreaker(endpoint={self.endpoint!r}, state={self.state.value})"

    @property
    def state(self) -> CircuitState:
        """The current state; an open circuit whose cool-down has passed reads half-open."""
        if self._state is CircuitState.OPEN and self._cooldown_left() <= 0.0:
            return CircuitState.HALF_OPEN
        return self._state

    @property
    def closed(self) -> bool:
        """Whether calls go through without asking: :meth:`allow` would let any call in."""
        return self._state is CircuitState.CLOSED

    @property
    def consecutive_failures(self) -> int:
        """Failures since the last success."""
        return self._consecutive_failures

    def _cooldown_left(self) -> float:
        return self._opened_at + self.reset_timeout_s - self._clock()

    def allow(self) -> None:
        """Let a call through (then record its outcome), or raise :class:`CircuitOpenError`."""
        state = self.state
        if state is CircuitState.CLOSED:
            return
        if state is CircuitState.HALF_OPEN and not self._trial_in_flight:
            self._state = CircuitState.HALF_OPEN
            self._trial_in_flight = True
            return
        retry_after = max(0.0, self._cooldown_left())
        reason = (
            "a trial call is in flight"
            if state is CircuitState.HALF_OPEN
            else (f"retry in {retry_after:.1f}s")
        )
        raise CircuitOpenError(
            f"circuit open for {self.endpoint or 'this endpoint'} after "
            f"{self._consecutive_failures} consecutive failures; {reason}",
            endpoint=self.endpoint,
            retry_after_s=retry_after,
        )

    def record_success(self) -> None:
        """Record that the allowed call succeeded (the endpoint answered): close the circuit."""
        self._state = CircuitState.CLOSED
        self._consecutive_failures = 0
        self._trial_in_flight = False

    def record_failure(self) -> None:
        """Record that the allowed call failed in a way that says the endpoint is unhealthy."""
        self._consecutive_failures += 1
        if self._trial_in_flight or self._consecutive_failures >= self.failure_threshold:
            self._state = CircuitState.OPEN
            self._opened_at = self._clock()
        self._trial_in_flight = False

    def release(self) -> None:
        """Record that the allowed call ended without a verdict (cancelled, or a local bug)."""
        self._trial_in_flight = False


class CircuitBreakers:
    """A registry of circuit breakers keyed by endpoint, owned by its caller (no globals)."""

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout_s: float = 30.0,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        CircuitBreaker(failure_threshold, reset_timeout_s)
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def for_endpoint(self, endpoint: str) -> CircuitBreaker:
        """Return the breaker for ``endpoint`` (e.g. base URL plus model), made on first use."""
        breaker = self._breakers.get(endpoint)
        if breaker is None:
            breaker = CircuitBreaker(
                self.failure_threshold, self.reset_timeout_s, endpoint=endpoint, clock=self._clock
            )
            self._breakers[endpoint] = breaker
        return breaker

    def __len__(self) -> int:
        return len(self._breakers)


AttemptOutcome = Literal["ok", "retry", "failed"]


@dataclass(frozen=True)
class Attempt:
    """One try of a call (``number`` from 1), as reported to ``on_attempt``."""

    number: int
    outcome: AttemptOutcome
    error: ProviderError | None = None
    backoff_s: float = 0.0
    elapsed_s: float = 0.0


def check_budget(budget_s: float | None) -> None:
    """Refuse a NaN ``budget_s`` (``None`` means no limit)."""
    if budget_s is not None and math.isnan(budget_s):
        raise ValueError("budget_s must be a number of seconds or None, not NaN")


async def call_with_resilience(
    call: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breaker: CircuitBreaker | None = None,
    budget_s: float | None = None,
    on_attempt: Callable[[Attempt], object] | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """Run ``call`` with retries, backoff and circuit breaking; return its result.

    ``budget_s`` is the time left for the whole thing: a wait that would reach it is not taken.
    Only retryable errors count as breaker failures; a bad request means the endpoint answered.
    """
    check_budget(budget_s)
    started = clock()
    if breaker is not None:
        _allow(breaker, 1, on_attempt, None)
    try:
        result = await call()
    except ProviderError as error:
        failed = error
    except BaseException:
        if breaker is not None:
            breaker.release()
        raise
    else:
        _succeeded(breaker, on_attempt, 1, clock() - started)
        return result
    return await retry_after_failure(
        call,
        failed,
        started=started,
        policy=policy,
        breaker=breaker,
        budget_s=budget_s,
        on_attempt=on_attempt,
        sleep=sleep,
        clock=clock,
        rng=rng,
    )


async def retry_after_failure(
    call: Callable[[], Awaitable[T]],
    error: ProviderError,
    *,
    started: float,
    policy: RetryPolicy,
    breaker: CircuitBreaker | None = None,
    budget_s: float | None = None,
    on_attempt: Callable[[Attempt], object] | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """:func:`call_with_resilience` after a first attempt that began at ``started`` and raised.

    ``error`` is what it raised; the breaker, if any, let it through and has not yet heard it.
    """
    rng = rng if rng is not None else random.Random()
    deadline = None if budget_s is None else started + budget_s
    number = 1
    while True:
        elapsed = clock() - started
        if breaker is not None:
            if error.retryable:
                breaker.record_failure()
            else:
                breaker.record_success()
        wait = _wait_before_retry(error, number, policy, rng, deadline, clock)
        if wait is None:
            _report(on_attempt, Attempt(number, "failed", error, elapsed_s=elapsed))
            raise error
        _report(on_attempt, Attempt(number, "retry", error, wait, elapsed))
        await sleep(wait)
        number += 1
        started = clock()
        if breaker is not None:
            _allow(breaker, number, on_attempt, error)
        try:
            result = await call()
        except ProviderError as next_error:
            error = next_error
            continue
        except BaseException:
            if breaker is not None:
                breaker.release()
            raise
        _succeeded(breaker, on_attempt, number, clock() - started)
        return result


def _allow(
    breaker: CircuitBreaker,
    number: int,
    on_attempt: Callable[[Attempt], object] | None,
    cause: ProviderError | None,
) -> None:
    """Let attempt ``number`` through ``breaker``, or report and raise its refusal."""
    try:
        breaker.allow()
    except CircuitOpenError as refused:
        _report(on_attempt, Attempt(number, "failed", refused))
        raise refused from cause


def _succeeded(
    breaker: CircuitBreaker | None,
    on_attempt: Callable[[Attempt], object] | None,
    number: int,
    elapsed_s: float,
) -> None:
    if breaker is not None:
        breaker.record_success()
    _report(on_attempt, Attempt(number, "ok", elapsed_s=elapsed_s))


def _wait_before_retry(
    error: ProviderError,
    number: int,
    policy: RetryPolicy,
    rng: random.Random,
    deadline: float | None,
    clock: Clock,
) -> float | None:
    """Return the wait before the next attempt, or ``None`` to give up with ``error``."""
    if not error.retryable or number >= policy.max_attempts:
        return None
    wait = policy.backoff_s(number - 1, rng)
    if isinstance(error, RateLimitError) and error.retry_after_s is not None:
        wait = max(wait, error.retry_after_s)
    if deadline is not None and clock() + wait >= deadline:
        return None
    return wait


def _report(on_attempt: Callable[[Attempt], object] | None, attempt: Attempt) -> None:
    if on_attempt is not None:
        on_attempt(attempt)
