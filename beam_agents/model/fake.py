"""``FakeLLM``: a scripted, offline model client for tests and examples.

A ``FakeLLM`` holds rules ``(matcher, behavior)``; each request is answered by the first rule
whose matcher accepts it, and every request is recorded (``.requests``, ``.call_count``)
whether it is answered or not. A request no rule matches raises ``ProviderRequestError``.

Matchers: :func:`match_any`, :func:`match_contains`, :func:`match_model_id` (or any picklable
``LlmRequest -> bool`` callable). Behaviors: :func:`respond_with`, :func:`raise_error`,
:func:`fail_then_succeed`, :func:`respond_with_tool_calls`.

Raw bodies: ``respond_with(payload)`` answers with ``payload`` itself as the raw body (decoded
as UTF-8 text). Scripted tool calls are answered with a canonical JSON body that starts with
``{"fake_llm":``; :meth:`FakeLLM.decode` turns either back into the same ``LlmResponse``, which
is what the replay cache relies on. Token usage is a word count: input tokens are the words in
the messages' text, output tokens the words of the answer.

A ``FakeLLM`` pickles (Beam pickles the ``provider_factory`` that returns it). Its call
counters and recorded requests belong to the instance, so a pickled copy counts separately.
"""

from __future__ import annotations

import asyncio
import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from beam_agents._json import canonical_json_bytes
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ProviderRequestError,
    TokenUsage,
    ToolCall,
)

Matcher: TypeAlias = Callable[[LlmRequest], bool]
"""Decides whether a rule applies to a request."""

_TOOL_CALL_BODY_PREFIX = b'{"fake_llm":'


def _message_text(message: Mapping[str, Any]) -> Iterable[str]:
    content = message.get("content", "")
    if isinstance(content, str):
        yield content
    elif isinstance(content, Sequence):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def _request_text(request: LlmRequest) -> Iterable[str]:
    for message in request.messages:
        yield from _message_text(message)


@dataclass(frozen=True, slots=True)
class _MatchAny:
    def __call__(self, request: LlmRequest) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _MatchContains:
    text: str

    def __call__(self, request: LlmRequest) -> bool:
        return any(self.text in text for text in _request_text(request))


@dataclass(frozen=True, slots=True)
class _MatchModelId:
    model_id: str

    def __call__(self, request: LlmRequest) -> bool:
        return request.model_id == self.model_id


def match_any() -> Matcher:
    """A matcher that accepts every request."""
    return _MatchAny()


def match_contains(text: str) -> Matcher:
    """A matcher for requests with a message whose text contains ``text``.

    A message's text is its ``content`` when that is a string, or the ``text`` of each part
    when ``content`` is a list of parts.
    """
    if not isinstance(text, str):
        raise TypeError(f"match_contains expects str, got {type(text).__name__}")
    return _MatchContains(text)


def match_model_id(model_id: str) -> Matcher:
    """A matcher for requests to exactly ``model_id``."""
    if not isinstance(model_id, str):
        raise TypeError(f"match_model_id expects str, got {type(model_id).__name__}")
    return _MatchModelId(model_id)


class Behavior(ABC):
    """How a rule answers a request it matched."""

    @abstractmethod
    async def respond(self, fake: FakeLLM, request: LlmRequest, earlier_matches: int) -> bytes:
        """The raw body for ``request``; ``earlier_matches`` counts this rule's earlier uses."""


@dataclass(frozen=True, slots=True)
class _RespondWith(Behavior):
    payload: bytes
    latency_ms: int

    async def respond(self, fake: FakeLLM, request: LlmRequest, earlier_matches: int) -> bytes:
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        return self.payload


@dataclass(frozen=True, slots=True)
class _RaiseError(Behavior):
    error: Exception

    async def respond(self, fake: FakeLLM, request: LlmRequest, earlier_matches: int) -> bytes:
        # A fresh copy each time, so repeated raises do not pile tracebacks onto one instance.
        raise copy.copy(self.error).with_traceback(None)


@dataclass(frozen=True, slots=True)
class _FailThenSucceed(Behavior):
    error: Exception
    times: int
    payload: bytes

    async def respond(self, fake: FakeLLM, request: LlmRequest, earlier_matches: int) -> bytes:
        if earlier_matches < self.times:
            raise copy.copy(self.error).with_traceback(None)
        return self.payload


@dataclass(frozen=True, slots=True)
class _RespondWithToolCalls(Behavior):
    body: bytes

    async def respond(self, fake: FakeLLM, request: LlmRequest, earlier_matches: int) -> bytes:
        return self.body


def _check_payload(payload: object) -> bytes:
    if not isinstance(payload, bytes):
        raise TypeError(f"a FakeLLM payload must be bytes, got {type(payload).__name__}")
    return payload


def _check_error(error: object) -> Exception:
    if not isinstance(error, Exception):
        raise TypeError(f"expected an exception instance, got {error!r}")
    return error


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def respond_with(payload: bytes, latency_ms: int = 0) -> Behavior:
    """Answer with ``payload`` as the raw body, after ``latency_ms`` of (asyncio) sleep."""
    return _RespondWith(_check_payload(payload), _check_count("latency_ms", latency_ms))


def raise_error(error: Exception) -> Behavior:
    """Raise ``error`` (a copy of it) on every matching request."""
    return _RaiseError(_check_error(error))


def fail_then_succeed(error: Exception, times: int, payload: bytes) -> Behavior:
    """Raise ``error`` for the first ``times`` matching requests, then answer ``payload``."""
    return _FailThenSucceed(
        _check_error(error), _check_count("times", times), _check_payload(payload)
    )


def respond_with_tool_calls(
    calls: Sequence[ToolCall | tuple[str, Mapping[str, Any]]], text: str = ""
) -> Behavior:
    """Answer with scripted tool calls (and optional ``text``).

    Each call is a ``ToolCall`` or a ``(name, arguments)`` pair, whose id becomes
    ``call_<position>``.
    """
    normalized = []
    for position, call in enumerate(calls):
        if isinstance(call, ToolCall):
            normalized.append({"id": call.id, "name": call.name, "arguments": dict(call.arguments)})
        else:
            name, arguments = call
            normalized.append(
                {"id": f"call_{position}", "name": name, "arguments": dict(arguments)}
            )
    body = canonical_json_bytes({"fake_llm": {"text": text, "tool_calls": normalized}})
    return _RespondWithToolCalls(body)


class FakeLLM:
    """A model client that answers from scripted rules and records every request."""

    def __init__(self, rules: Sequence[tuple[Matcher, Behavior]]) -> None:
        checked: list[tuple[Matcher, Behavior]] = []
        for position, rule in enumerate(rules):
            if not (isinstance(rule, tuple) and len(rule) == 2):
                raise TypeError(f"FakeLLM rule {position} must be a (matcher, behavior) pair")
            matcher, behavior = rule
            if not callable(matcher):
                raise TypeError(f"FakeLLM rule {position}: the matcher must be callable")
            if not isinstance(behavior, Behavior):
                raise TypeError(
                    f"FakeLLM rule {position}: the behavior must come from respond_with, "
                    "raise_error, fail_then_succeed or respond_with_tool_calls"
                )
            checked.append((matcher, behavior))
        self._rules = checked
        self._matches = [0] * len(checked)
        self.requests: list[LlmRequest] = []

    @property
    def call_count(self) -> int:
        """How many requests this instance has received."""
        return len(self.requests)

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Answer ``request`` from the first matching rule."""
        self.requests.append(request)
        for position, (matcher, behavior) in enumerate(self._rules):
            if matcher(request):
                earlier = self._matches[position]
                self._matches[position] = earlier + 1
                raw = await behavior.respond(self, request, earlier)
                response = self.decode(raw)
                input_tokens = sum(len(text.split()) for text in _request_text(request))
                usage = TokenUsage(input_tokens, response.usage.output_tokens)
                return LlmResponse(
                    response=response.response,
                    text=response.text,
                    tool_calls=response.tool_calls,
                    stop_reason=response.stop_reason,
                    usage=usage,
                    model=request.model_id,
                )
        raise ProviderRequestError(
            f"FakeLLM: no rule matches a request to model {request.model_id!r}"
        )

    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild the response for a raw body this fake produced."""
        if raw.startswith(_TOOL_CALL_BODY_PREFIX):
            scripted = json.loads(raw)["fake_llm"]
            text = scripted["text"]
            calls = tuple(
                ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"])
                for call in scripted["tool_calls"]
            )
            stop_reason = "tool_use" if calls else "end_turn"
        else:
            text = raw.decode("utf-8", errors="replace")
            calls = ()
            stop_reason = "end_turn"
        return LlmResponse(
            response=raw,
            text=text,
            tool_calls=calls,
            stop_reason=stop_reason,
            usage=TokenUsage(0, len(text.split())),
        )
