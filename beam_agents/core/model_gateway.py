"""The single point where an activation reaches the model provider.

:meth:`ModelGateway.complete` wraps a cache-missing call in the runtime's resilience (retries
within the activation's time budget, a circuit breaker per endpoint) and names what is
measured: Beam counters (:data:`MODEL_COUNTERS`) and OpenTelemetry GenAI trace attributes.
It reaches the client only through the hooks ``ModelClient`` declares. Beam-free.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Protocol

from beam_agents._protos import ModelCacheEntry, canonical_json
from beam_agents.core.bridge import enter_task
from beam_agents.core.retry_memo import AnswerMemo
from beam_agents.model.cache import replayed_response
from beam_agents.model.client import LlmRequest, LlmResponse, ProviderError, as_model_client
from beam_agents.model.resilience import (
    Attempt,
    CircuitBreakers,
    CircuitOpenError,
    RetryPolicy,
    call_with_resilience,
)

METRICS_NAMESPACE = "beam_agents"
"""The namespace of the runtime's Beam metrics."""

MODEL_CALLS = "model_calls"
"""Counter: model calls that missed the replay cache and went to the provider (one per call,
whatever its number of attempts, failed calls included)."""
MODEL_CACHE_HITS = "model_cache_hits"
"""Counter: model calls served from the replay cache."""
MODEL_RETRIES = "model_retries"
"""Counter: provider attempts beyond the first of each call."""
MODEL_CALL_FAILURES = "model_call_failures"
"""Counter: model calls that failed after their retries (or at once, when not retryable)."""
MODEL_INPUT_TOKENS = "model_input_tokens"
"""Counter: input tokens the provider reported (replayed calls spend none)."""
MODEL_OUTPUT_TOKENS = "model_output_tokens"
"""Counter: output tokens the provider reported (replayed calls spend none)."""

MODEL_COUNTERS = (
    MODEL_CALLS,
    MODEL_CACHE_HITS,
    MODEL_RETRIES,
    MODEL_CALL_FAILURES,
    MODEL_INPUT_TOKENS,
    MODEL_OUTPUT_TOKENS,
)
"""Every counter the gateway increments."""

_SINGLE_ATTEMPT = RetryPolicy(max_attempts=1)


class ModelMetrics(Protocol):
    """Where the gateway counts what it does (Beam counters in the runtime)."""

    def inc(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the counter ``name`` (one of :data:`MODEL_COUNTERS`)."""


class _Uncounted:
    """A :class:`ModelMetrics` that keeps nothing, for gateways used outside a pipeline."""

    def inc(self, name: str, value: int = 1) -> None:
        """Ignore the increment."""


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    """A provider's response and how many attempts reaching the provider it took."""

    response: LlmResponse
    attempts: int


class ModelGateway:
    """Calls one ``DoFn`` instance's model client with retries and circuit breaking.

    ``client`` is a ``ModelClient``, or any object with ``async complete(request)``, adapted
    by ``as_model_client``; :attr:`client` is the object as given. ``retry_policy`` ``None``
    makes one attempt per call; ``breakers`` ``None`` disables circuit breaking. Breakers are
    keyed by the client's ``endpoint_key(request)``. Each call first moves into an asyncio task
    (``bridge.enter_task``) unless the client says ``needs_asyncio_task = False``.
    """

    __slots__ = (
        "_breakers",
        "_client",
        "_memo",
        "_metrics",
        "_needs_task",
        "_policy",
        "_rng",
        "client",
        "provider_name",
    )

    def __init__(
        self,
        client: object,
        *,
        retry_policy: RetryPolicy | None = None,
        breakers: CircuitBreakers | None = None,
        metrics: ModelMetrics | None = None,
        memo: AnswerMemo[ProviderAnswer] | None = None,
    ) -> None:
        try:
            adapted = as_model_client(client)
        except TypeError:
            raise TypeError(
                f"provider_factory returned {type(client).__name__}, which has no "
                "`async complete(request)` method"
            ) from None
        self.client = client
        self._client = adapted
        self.provider_name = adapted.gen_ai_provider_name
        self._needs_task = adapted.needs_asyncio_task
        self._policy = _SINGLE_ATTEMPT if retry_policy is None else retry_policy
        self._breakers = breakers
        self._metrics: ModelMetrics = _Uncounted() if metrics is None else metrics
        # One source of backoff jitter per gateway, not one seeded per call.
        self._rng = random.Random()
        self._memo = memo

    async def _call_once(self, request: LlmRequest) -> LlmResponse:
        response = await self._client.complete(request)
        if not isinstance(response, LlmResponse):
            raise TypeError(
                f"{type(self.client).__name__}.complete returned "
                f"{type(response).__name__}, not an LlmResponse"
            )
        return response

    async def complete(
        self, request: LlmRequest, *, budget_s: float | None = None, memo_key: str = ""
    ) -> ProviderAnswer:
        """Send ``request`` to the provider, retrying retryable errors within ``budget_s``.

        A ``ProviderError`` that ends the call (retries exhausted, not retryable, or the
        circuit open) propagates with a note saying how many attempts were made. With a
        ``memo_key`` (the call's replay-cache key) and a memo, an answer this process already
        got for that key is returned as it was (``core/retry_memo.py``).
        """
        memo = self._memo
        if memo is not None and memo_key:
            kept = memo.get(memo_key)
            if kept is not None:
                return kept
            answer = await self._call(request, budget_s)
            memo.put(memo_key, answer)
            return answer
        return await self._call(request, budget_s)

    async def _call(self, request: LlmRequest, budget_s: float | None) -> ProviderAnswer:
        if self._needs_task:
            await enter_task()
        attempts: list[Attempt] = []
        breaker = None
        if self._breakers is not None:
            breaker = self._breakers.for_endpoint(self._client.endpoint_key(request))
        metrics = self._metrics
        metrics.inc(MODEL_CALLS)
        try:
            response = await call_with_resilience(
                lambda: self._call_once(request),
                policy=self._policy,
                breaker=breaker,
                budget_s=budget_s,
                on_attempt=attempts.append,
                rng=self._rng,
            )
        except ProviderError as error:
            reached = _reached_provider(attempts)
            metrics.inc(MODEL_CALL_FAILURES)
            if reached > 1:
                metrics.inc(MODEL_RETRIES, reached - 1)
            error.add_note(
                f"the model call to {request.model_id or 'the default model'} failed after "
                f"{reached} attempt(s) reaching the provider"
            )
            raise
        reached = _reached_provider(attempts)
        if reached > 1:
            metrics.inc(MODEL_RETRIES, reached - 1)
        metrics.inc(MODEL_INPUT_TOKENS, response.usage.input_tokens)
        metrics.inc(MODEL_OUTPUT_TOKENS, response.usage.output_tokens)
        return ProviderAnswer(response, reached)

    def replay(self, entry: ModelCacheEntry) -> LlmResponse:
        """The response recorded in ``entry``, decoded by this gateway's client."""
        self._metrics.inc(MODEL_CACHE_HITS)
        return replayed_response(self._client, entry)

    async def aclose(self) -> None:
        """Close the client through its ``aclose`` hook, inside an asyncio task."""
        await enter_task()
        await self._client.aclose()

    def trace_attributes(
        self, request: LlmRequest, response: LlmResponse, *, attempts: int, cache_hit: bool
    ) -> dict[str, str]:
        """The ``LLM_CALL`` attributes: OpenTelemetry GenAI names plus ``beam_agents.*``.

        Every value is a function of the request and the (possibly replayed) response, never
        of the wall clock, so traces stay deterministic. ``finish_reasons`` is a JSON array.
        """
        requested = request.model_id or self._client.model
        usage = response.usage
        reason: object = response.stop_reason  # typed str, but a client may break the type
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider_name,
            "gen_ai.request.model": requested,
            "gen_ai.response.model": response.model,
            "gen_ai.usage.input_tokens": str(usage.input_tokens),
            "gen_ai.usage.output_tokens": str(usage.output_tokens),
            "gen_ai.response.finish_reasons": _finish_reasons(reason)
            if isinstance(reason, str)
            else canonical_json([reason] if reason else []),
            "beam_agents.cache_hit": "true" if cache_hit else "false",
            "beam_agents.attempts": str(attempts),
        }


@functools.lru_cache(maxsize=64)
def _finish_reasons(stop_reason: str) -> str:
    """``gen_ai.response.finish_reasons``: a JSON array (providers use a handful of reasons)."""
    return canonical_json([stop_reason] if stop_reason else [])


def _reached_provider(attempts: list[Attempt]) -> int:
    """How many of ``attempts`` reached the provider (an open circuit refuses without it)."""
    return sum(1 for attempt in attempts if not isinstance(attempt.error, CircuitOpenError))
