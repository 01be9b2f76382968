"""``FakeLLM``: a scripted, offline model client for tests and examples.

A ``FakeLLM`` answers each request from the first rule ``(matcher, behavior)`` that matches it
and records every request. Its ``shape`` picks the raw bodies it answers with: its own
(``"fake"``), or a real provider's (``"openai"``, ``"anthropic"``), encoded and decoded by that
provider's wire module. Details in ``beam_agents/model/README.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderRequestError,
    TokenUsage,
    ToolCall,
)
from beam_agents.model.fake_behaviors import (
    Behavior,
    FailThenSucceed,
    RaiseError,
    Responder,
    RespondWith,
    RespondWithFn,
    Scripted,
    simulate_latency,
)
from beam_agents.model.fake_wire import (
    FAKE_BODY_PREFIX,
    Shape,
    check_shape,
    decode_body,
    request_texts,
    scripted_answer,
    wire_body,
    word_count_usage,
)

__all__ = [
    "Behavior",
    "FakeLLM",
    "Matcher",
    "Responder",
    "Shape",
    "fail_then_succeed",
    "match_any",
    "match_contains",
    "match_model_id",
    "raise_error",
    "respond_with",
    "respond_with_fn",
    "respond_with_text",
    "respond_with_tool_calls",
    "simulate_latency",
    "wire_body",
    "word_count_usage",
]

Matcher: TypeAlias = Callable[[LlmRequest], bool]
"""Decides whether a rule applies to a request."""


@dataclass(frozen=True, slots=True)
class _MatchAny:
    def __call__(self, request: LlmRequest) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _MatchContains:
    text: str

    def __call__(self, request: LlmRequest) -> bool:
        return any(self.text in text for text in request_texts(request))


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


def _check_usage(usage: object) -> TokenUsage | None:
    if usage is not None and not isinstance(usage, TokenUsage):
        raise TypeError(f"usage must be a TokenUsage or None, got {type(usage).__name__}")
    return usage


def respond_with(
    payload: bytes, latency_ms: int = 0, *, usage: TokenUsage | None = None
) -> Behavior:
    """Answer with ``payload`` as the raw body, after ``latency_ms`` of (asyncio) sleep.

    ``usage`` overrides the token usage the answer reports.
    """
    return RespondWith(
        _check_payload(payload), _check_count("latency_ms", latency_ms), _check_usage(usage)
    )


def respond_with_text(
    text: str, *, usage: TokenUsage | None = None, latency_ms: int = 0
) -> Behavior:
    """Answer with ``text`` and no tool calls, as a body in the fake's shape."""
    return respond_with_tool_calls((), text=text, usage=usage, latency_ms=latency_ms)


def respond_with_tool_calls(
    calls: Sequence[ToolCall | tuple[str, Mapping[str, Any]]],
    text: str = "",
    *,
    usage: TokenUsage | None = None,
    latency_ms: int = 0,
) -> Behavior:
    """Answer with scripted tool calls (and optional ``text``), as a body in the fake's shape.

    Each call is a ``ToolCall`` or a ``(name, arguments)`` pair, whose id becomes
    ``call_<position>``. Several calls make one turn with parallel tool calls.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    normalized = tuple(
        call
        if isinstance(call, ToolCall)
        else ToolCall(id=f"call_{position}", name=call[0], arguments=dict(call[1]))
        for position, call in enumerate(calls)
    )
    return Scripted(text, normalized, _check_usage(usage), _check_count("latency_ms", latency_ms))


def respond_with_fn(responder: Responder, *, latency_ms: int = 0) -> Behavior:
    """Answer with whatever ``responder(request)`` returns.

    Bytes are a raw body, decoded in the fake's shape (build one with :func:`wire_body` or
    :meth:`FakeLLM.scripted_body`); an ``LlmResponse`` is returned as it is, so its
    ``response`` bytes must decode to the same thing for replays to match.
    """
    if not callable(responder):
        raise TypeError(f"respond_with_fn takes a callable, got {responder!r}")
    return RespondWithFn(responder, _check_count("latency_ms", latency_ms))


def raise_error(error: Exception) -> Behavior:
    """Raise ``error`` (a copy of it) on every matching request."""
    return RaiseError(_check_error(error))


def fail_then_succeed(error: Exception, times: int, payload: bytes) -> Behavior:
    """Raise ``error`` for the first ``times`` matching requests, then answer ``payload``."""
    return FailThenSucceed(
        _check_error(error), _check_count("times", times), _check_payload(payload)
    )


class FakeLLM(ModelClient):
    """A model client that answers from scripted rules and records every request."""

    gen_ai_provider_name = "fake"
    """The ``gen_ai.provider.name`` the runtime traces calls to this client with."""

    needs_asyncio_task = False
    """``complete`` is pure asyncio: the runtime may call it outside an ``asyncio.Task``."""

    def __init__(self, rules: Sequence[tuple[Matcher, Behavior]], *, shape: Shape = "fake") -> None:
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
                    "respond_with_text, respond_with_tool_calls, respond_with_fn, raise_error "
                    "or fail_then_succeed"
                )
            checked.append((matcher, behavior))
        self.shape: Shape = check_shape(shape)
        self._rules = checked
        self._matches = [0] * len(checked)
        self.requests: list[LlmRequest] = []

    @classmethod
    def scripted(
        cls,
        answer: Callable[[LlmRequest], tuple[str, Sequence[ToolCall]]],
        *,
        shape: Shape = "fake",
    ) -> FakeLLM:
        """A fake whose every answer is ``answer(request)``: the text and the tool calls."""
        if not callable(answer):
            raise TypeError(
                "FakeLLM.scripted takes a function of the request returning (text, tool_calls), "
                f"got {type(answer).__name__}; for a fixed text use "
                "FakeLLM([(match_any(), respond_with_text(text))])"
            )
        fake: FakeLLM

        def respond(request: LlmRequest) -> bytes:
            return fake.scripted_body(request, *answer(request))

        fake = cls([(match_any(), respond_with_fn(respond))], shape=shape)
        return fake

    @property
    def call_count(self) -> int:
        """How many requests this instance has received."""
        return len(self.requests)

    def calls_per_request(self) -> dict[str, int]:
        """How many times each distinct request (by content digest) was received."""
        counts: dict[str, int] = {}
        for request in self.requests:
            digest = request.content_digest()
            counts[digest] = counts.get(digest, 0) + 1
        return counts

    def scripted_body(
        self,
        request: LlmRequest,
        text: str,
        tool_calls: Sequence[ToolCall] = (),
        usage: TokenUsage | None = None,
    ) -> bytes:
        """The raw body, in this fake's shape, of a scripted answer to ``request``.

        Usage defaults to the word count of ``request`` and ``text``.
        """
        return scripted_answer(self.shape, request, (text, tool_calls, usage))

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Answer ``request`` from the first matching rule."""
        self.requests.append(request)
        for position, (matcher, behavior) in enumerate(self._rules):
            if matcher(request):
                earlier = self._matches[position]
                self._matches[position] = earlier + 1
                answer = await behavior.respond(self, request, earlier)
                if isinstance(answer, LlmResponse):
                    response = answer
                elif self.shape == "fake" and not answer.startswith(FAKE_BODY_PREFIX):
                    # A plain-text body: built once with the request's usage and model, rather
                    # than decoded and then copied twice.
                    text = answer.decode("utf-8", errors="replace")
                    return LlmResponse(
                        response=answer,
                        text=text,
                        stop_reason="end_turn",
                        usage=word_count_usage(request, text),
                        model=request.model_id,
                    )
                else:
                    response = self.decode(answer)
                if response.model:
                    return response
                return dataclasses.replace(response, model=request.model_id)
        raise ProviderRequestError(
            f"FakeLLM: no rule matches a request to model {request.model_id!r}"
        )

    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild the response for a raw body in this fake's shape."""
        return decode_body(self.shape, raw)
