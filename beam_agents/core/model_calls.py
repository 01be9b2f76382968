"""Model calls: the replay cache, the retry memo and the gateway every call goes through."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast

from beam_agents._protos import ModelCache, ModelCacheEntry, canonical_json
from beam_agents.core.agent import enter_task
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderError,
    TokenUsage,
    as_model_client,
    decode_with,
    response_problem,
)
from beam_agents.model.resilience import (
    Attempt,
    CircuitBreaker,
    CircuitBreakers,
    CircuitOpenError,
    RetryPolicy,
    check_budget,
    retry_after_failure,
)

# -- the replay cache: a run's committed calls, replayed by position --------------------------
CACHE_SCHEMA_VERSION = 1
"""The ``ModelCache.schema_version`` this code writes and the newest it reads."""

DEFAULT_MAX_ENTRIES = 64
"""Default bound on the number of cached calls per key."""

DEFAULT_MAX_BYTES = 512 * 1024
"""Default bound on a key's serialized replay cache, in bytes."""


ENTITY_KEY_SPELLED_MAX = 16
"""Entity keys up to this many bytes are spelled out in a cache key; longer ones by a hash."""


def replay_cache_key(request: LlmRequest, entity_key: bytes, seq: int, step_index: int) -> str:
    """The cache key of ``request`` made by run ``seq`` of ``entity_key`` at ``step_index``."""
    return cache_key_for_digest(request.content_digest(), entity_key, seq, step_index)


def cache_key_for_digest(request_digest: str, entity_key: bytes, seq: int, step_index: int) -> str:
    """:func:`replay_cache_key` for a request whose ``content_digest()`` is already known.

    The digest followed by the position, with no second hash: ``{digest}:{seq}:{step}:`` and
    the key in hex, or ``#`` and a BLAKE2b-128 of a key longer than
    :data:`ENTITY_KEY_SPELLED_MAX` bytes. The memo is shared by a ``RunAgent``'s keys, so the
    key is part of it.
    """
    if len(entity_key) <= ENTITY_KEY_SPELLED_MAX:
        return f"{request_digest}:{seq}:{step_index}:{entity_key.hex()}"
    return f"{request_digest}:{seq}:{step_index}#{_long_key_digest(entity_key)}"


@functools.lru_cache(maxsize=256)
def _long_key_digest(entity_key: bytes) -> str:
    return hashlib.blake2b(entity_key, digest_size=16).hexdigest()


def replayed_response(client: object, entry: ModelCacheEntry) -> LlmResponse:
    """Rebuild the response stored in ``entry``, with the token usage recorded at the call."""
    response = decode_with(client, entry.response)
    usage = TokenUsage(input_tokens=entry.input_tokens, output_tokens=entry.output_tokens)
    return dataclasses.replace(response, usage=usage)


class ReplayCache:
    """A key's replay cache as one activation sees it: committed entries plus staged ones.

    Committed entries are indexed only once a key's bytes occur in the serialized cache (a
    replay): indexing them up front would cost more than the rest of a call's bookkeeping.
    """

    __slots__ = (
        "_absent",
        "_committed",
        "_committed_blob",
        "_index",
        "_max_bytes",
        "_max_entries",
        "_staged",
        "_superseded",
    )

    def __init__(
        self,
        committed: ModelCache | None,
        *,
        max_entries: int,
        max_bytes: int,
        serialized: bytes | None = None,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._committed = committed if committed is not None and committed.entries else None
        self._committed_blob = serialized
        self._index: dict[str, int] | None = None
        self._absent: set[str] = set()
        """Keys the byte test ruled out (a miss is looked up, then recorded)."""
        self._superseded: set[int] = set()
        """Positions of committed entries replaced by a staged one with the same key."""
        self._staged: dict[str, ModelCacheEntry] = {}

    def _committed_position(self, cache_key: str) -> int | None:
        committed = self._committed
        if committed is None:
            return None
        if self._index is None:
            if cache_key in self._absent:
                return None
            if self._committed_blob is None:
                self._committed_blob = committed.SerializeToString()
            if cache_key.encode() not in self._committed_blob:
                self._absent.add(cache_key)
                return None
            self._index = {entry.cache_key: at for at, entry in enumerate(committed.entries)}
        return self._index.get(cache_key)

    def lookup(self, cache_key: str) -> ModelCacheEntry | None:
        """The entry stored under ``cache_key``, or ``None``."""
        staged = self._staged.get(cache_key)
        if staged is not None:
            return staged
        position = self._committed_position(cache_key)
        if position is None or self._committed is None:
            return None
        return self._committed.entries[position]

    def record(self, entry: ModelCacheEntry) -> None:
        """Stage ``entry`` as the newest one."""
        cache_key = entry.cache_key
        self._staged.pop(cache_key, None)
        self._staged[cache_key] = entry
        position = self._committed_position(cache_key)
        if position is not None:
            self._superseded.add(position)

    @property
    def changed(self) -> bool:
        """Whether this activation recorded anything."""
        return bool(self._staged)

    def __len__(self) -> int:
        committed = self._committed
        kept = 0 if committed is None else len(committed.entries) - len(self._superseded)
        return kept + len(self._staged)

    def encode(self) -> bytes:
        """The serialized, bounded ``ModelCache``; ``b""`` when nothing is kept."""
        cache = ModelCache()
        if self._committed is not None:
            # One copy in C, then trimmed in place: far cheaper than rebuilding the message
            # from Python objects for every committed entry.
            cache.CopyFrom(self._committed)
            for position in sorted(self._superseded, reverse=True):
                del cache.entries[position]
        cache.schema_version = CACHE_SCHEMA_VERSION
        entries = cache.entries
        staged = list(self._staged.values())
        excess = len(entries) + len(staged) - self._max_entries
        if excess > 0:
            dropped = min(excess, len(entries))
            del entries[:dropped]
            staged = staged[excess - dropped :]
        entries.extend(staged)
        if not entries:
            return b""
        blob = cache.SerializeToString(deterministic=True)
        if len(blob) <= self._max_bytes:
            return blob
        while entries and cache.ByteSize() > self._max_bytes:
            del entries[0]
        if not entries:
            return b""
        return cache.SerializeToString(deterministic=True)


# -- the retry memo: provider answers kept in the worker process ------------------------------
# A retried bundle committed nothing, its cache entries included. The memo keeps each fresh
# answer by its replay-cache key, scoped to one RunAgent, so the retried activation gets the
# same answer without calling the provider again (a retry on another worker calls it).
class _Answer(Protocol):
    @property
    def response(self) -> LlmResponse: ...


_A = TypeVar("_A", bound=_Answer)

MEMO_MAX_ENTRIES = 1_024
"""Answers one ``RunAgent`` keeps per process, oldest dropped first."""
MEMO_MAX_BYTES = 16 << 20
"""Raw response bytes one ``RunAgent`` keeps per process, oldest dropped first."""


class AnswerMemo(Generic[_A]):
    """A bounded, thread-safe map from replay-cache key to the provider's answer."""

    def __init__(self, max_entries: int = MEMO_MAX_ENTRIES, max_bytes: int = MEMO_MAX_BYTES):
        self._answers: OrderedDict[str, _A] = OrderedDict()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, cache_key: str) -> _A | None:
        """The answer kept for ``cache_key``, if any."""
        return self._answers.get(cache_key)  # one C call: atomic without the lock

    def put(self, cache_key: str, answer: _A) -> None:
        """Keep ``answer``; drop the oldest answers past the bounds."""
        size = len(answer.response.response)
        if size > self._max_bytes:
            return
        with self._lock:
            previous = self._answers.pop(cache_key, None)
            if previous is not None:
                self._bytes -= len(previous.response.response)
            self._answers[cache_key] = answer
            self._bytes += size
            while len(self._answers) > self._max_entries or self._bytes > self._max_bytes:
                _, dropped = self._answers.popitem(last=False)
                self._bytes -= len(dropped.response.response)

    def __len__(self) -> int:
        return len(self._answers)


MEMO_MAX_SCOPES = 8
"""``RunAgent``s a process keeps memos for, the least recently set up dropped first."""

_MEMOS: OrderedDict[str, AnswerMemo[Any]] = OrderedDict()
_MEMOS_LOCK = threading.Lock()


def answer_memo(scope: str) -> AnswerMemo[Any]:
    """The process's memo for ``scope`` (one per ``RunAgent``), created on first use."""
    with _MEMOS_LOCK:
        memo = _MEMOS.pop(scope, None)
        if memo is None:
            memo = AnswerMemo()
        _MEMOS[scope] = memo
        while len(_MEMOS) > MEMO_MAX_SCOPES:
            _MEMOS.popitem(last=False)
        return memo


# -- the gateway: the single point where an activation reaches the provider -------------------
METRICS_NAMESPACE = "beam_agents"
"""The namespace of the runtime's Beam metrics."""

# Counters: calls that missed the replay cache (one per call, whatever its attempts), calls
# served from it, attempts beyond the first, calls failed for good, and reported tokens.
MODEL_CALLS = "model_calls"
MODEL_CACHE_HITS = "model_cache_hits"
MODEL_RETRIES = "model_retries"
MODEL_CALL_FAILURES = "model_call_failures"
MODEL_INPUT_TOKENS = "model_input_tokens"
MODEL_OUTPUT_TOKENS = "model_output_tokens"

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


class ProviderAnswer(NamedTuple):
    """A provider's response and how many attempts reaching the provider it took."""

    response: LlmResponse
    attempts: int


class ModelGateway:
    """Calls one ``DoFn`` instance's model client with retries and circuit breaking.

    ``client`` is anything with ``async complete(request)``; :attr:`client` is it as given.
    ``retry_policy`` ``None`` makes one attempt per call; ``breakers`` ``None`` disables
    circuit breaking.
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
        refusal = ""
        try:
            adapted: ModelClient | None = as_model_client(client)
        except TypeError as error:
            adapted, refusal = None, str(error)
        if adapted is None:  # raised here, not in the handler: nothing to chain
            raise TypeError(f"provider_factory returned {type(client).__name__}: {refusal}")
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
        return self._checked(await self._client.complete(request))

    def _checked(self, response: object) -> LlmResponse:
        """``response`` if its fields have their types; else a ``TypeError`` naming the client."""
        problem = response_problem(response)
        if problem is not None:
            raise TypeError(f"{type(self.client).__name__}.complete returned {problem}")
        return cast(LlmResponse, response)  # response_problem checked its type

    async def complete(
        self, request: LlmRequest, *, budget_s: float | None = None, memo_key: str = ""
    ) -> ProviderAnswer:
        """Send ``request`` to the provider, retrying retryable errors within ``budget_s``.

        A ``ProviderError`` that ends the call propagates with a note of the attempts made.
        An answer the memo kept for ``memo_key`` is returned as it was.
        """
        if memo_key and self._memo is not None:
            kept = self._memo.get(memo_key)
            if kept is not None:
                return kept
        if self._needs_task:
            await enter_task()
        breaker = None
        if self._breakers is not None:
            breaker = self._breakers.for_endpoint(self._client.endpoint_key(request))
        self._metrics.inc(MODEL_CALLS)
        check_budget(budget_s)
        started = time.monotonic()
        if breaker is not None and not breaker.closed:
            refused = None
            try:
                breaker.allow()  # an open circuit refuses; a half-open one lets a trial in
            except CircuitOpenError as error:
                refused = error
            if refused is not None:  # raised here, not in the handler: nothing to chain
                self._failed(refused, request, 0)
                raise refused
        # The first attempt goes straight to the provider: the retry machinery (attempt
        # records, backoff) is entered only if it raises a ProviderError.
        try:
            response = self._checked(await self._client.complete(request))
        except ProviderError as error:
            failed = error
        except BaseException:
            if breaker is not None:
                breaker.release()
            raise
        else:
            if breaker is not None:
                breaker.record_success()
            return self._answered(response, 1, memo_key)
        return await self._retry(request, failed, started, budget_s, breaker, memo_key)

    async def _retry(
        self,
        request: LlmRequest,
        error: ProviderError,
        started: float,
        budget_s: float | None,
        breaker: CircuitBreaker | None,
        memo_key: str,
    ) -> ProviderAnswer:
        """Go on after the first attempt, begun at ``started``, raised ``error``."""
        attempts: list[Attempt] = []

        def call() -> Awaitable[LlmResponse]:
            return self._call_once(request)

        try:
            response = await retry_after_failure(
                call,
                error,
                started=started,
                policy=self._policy,
                breaker=breaker,
                budget_s=budget_s,
                on_attempt=attempts.append,
                rng=self._rng,
            )
        except ProviderError as final:
            self._failed(final, request, _reached_provider(attempts))
            raise
        return self._answered(response, _reached_provider(attempts), memo_key)

    def _failed(self, error: ProviderError, request: LlmRequest, reached: int) -> None:
        """Count a call failed for good after ``reached`` attempts; note them on ``error``."""
        metrics = self._metrics
        metrics.inc(MODEL_CALL_FAILURES)
        if reached > 1:
            metrics.inc(MODEL_RETRIES, reached - 1)
        error.add_note(
            f"the model call to {request.model_id or 'the default model'} failed after "
            f"{reached} attempt(s) reaching the provider"
        )

    def _answered(self, response: LlmResponse, reached: int, memo_key: str) -> ProviderAnswer:
        """Count the retries and tokens of a call answered after ``reached`` attempts; keep it."""
        usage = response.usage
        metrics = self._metrics
        if reached > 1:
            metrics.inc(MODEL_RETRIES, reached - 1)
        metrics.inc(MODEL_INPUT_TOKENS, usage.input_tokens)
        metrics.inc(MODEL_OUTPUT_TOKENS, usage.output_tokens)
        answer = ProviderAnswer(response, reached)
        if memo_key and self._memo is not None:
            self._memo.put(memo_key, answer)
        return answer

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
        """The ``LLM_CALL`` attributes: GenAI names plus ``beam_agents.*``, never clock-based."""
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
