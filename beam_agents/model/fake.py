"""``FakeLLM``: a scripted, offline model client for tests and examples."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

from beam_agents._protos import canonical_json_bytes
from beam_agents.model.anthropic import FORMAT as ANTHROPIC_FORMAT
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderRequestError,
    TokenUsage,
    ToolCall,
)
from beam_agents.model.openai import FORMAT as OPENAI_FORMAT
from beam_agents.model.transport import WireFormat

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

# -- the raw bodies of each shape ----------------------------------------------------------

Shape: TypeAlias = Literal["fake", "openai", "anthropic"]
"""The wire format of a ``FakeLLM``'s raw bodies."""

SHAPES: tuple[Shape, ...] = get_args(Shape)
FAKE_BODY_PREFIX = b'{"fake_llm":'  # a scripted "fake" body; other bytes are plain text


def check_shape(shape: Shape) -> Shape:
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    return shape


def wire_body(
    shape: Shape,
    *,
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    usage: TokenUsage | None = None,
    model: str = "",
) -> bytes:
    """A raw response body in ``shape`` carrying ``text``, ``tool_calls`` and ``usage``."""
    encode = _FORMATS[check_shape(shape)].encode_response
    return encode(text=text, tool_calls=tool_calls, usage=usage or TokenUsage(), model=model)


def word_count_usage(request: LlmRequest, answer_text: str) -> TokenUsage:
    """The fake's default token usage: words in the request's messages and in the answer."""
    words = 0
    for message in request.messages:
        content = message.get("content", "")
        if isinstance(content, str):  # the common case, without a generator per message
            words += len(content.split())
        else:
            words += sum(len(text.split()) for text in _message_text(message))
    return TokenUsage(input_tokens=words, output_tokens=len(answer_text.split()))


def _message_text(message: Mapping[str, Any]) -> Iterable[str]:
    content = message.get("content", "")
    if isinstance(content, str):
        yield content
    elif isinstance(content, Sequence):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def _encode_fake(
    *, text: str, tool_calls: Sequence[ToolCall], usage: TokenUsage, model: str
) -> bytes:
    calls = [{"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in tool_calls]
    counted = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    return canonical_json_bytes(
        {"fake_llm": {"model": model, "text": text, "tool_calls": calls, "usage": counted}}
    )


def _decode_fake(raw: bytes) -> LlmResponse:
    if not raw.startswith(FAKE_BODY_PREFIX):
        text = raw.decode("utf-8", errors="replace")
        return LlmResponse(
            response=raw, text=text, stop_reason="end_turn", usage=TokenUsage(0, len(text.split()))
        )
    scripted = json.loads(raw)["fake_llm"]
    calls = tuple(
        ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"])
        for call in scripted["tool_calls"]
    )
    usage = scripted.get("usage", {})
    return LlmResponse(
        response=raw,
        text=scripted["text"],
        tool_calls=calls,
        stop_reason="tool_use" if calls else "end_turn",
        usage=TokenUsage(usage.get("input_tokens", 0), usage.get("output_tokens", 0)),
        model=scripted.get("model", ""),
    )


_FORMATS: dict[str, WireFormat] = {
    "fake": WireFormat("FakeLLM", "fake", _decode_fake, _encode_fake),
    "openai": OPENAI_FORMAT,
    "anthropic": ANTHROPIC_FORMAT,
}


# -- behaviors ----------------------------------------------------------------------------
Responder: TypeAlias = Callable[[LlmRequest], "bytes | LlmResponse"]
"""What :func:`respond_with_fn` calls: a raw body (decoded in the fake's shape) or a response."""


class Behavior(ABC):
    """How a rule answers a request it matched."""

    @abstractmethod
    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """A raw body (decoded in the fake's shape) or a response; ``earlier_matches``: uses."""


_TIMER_LATENESS_S = 0.0015  # how late an asyncio timer fires: epoll counts whole ms
_TIMER_SLACK = 0.002  # the kernel lets a wait of T overrun by T / 1000; twice that


async def simulate_latency(latency_ms: int) -> None:
    """Yield to the event loop for ``latency_ms``, ending on time to within microseconds."""
    if not latency_ms:
        return
    latency_s = latency_ms / 1000
    deadline = time.perf_counter() + latency_s
    coarse_s = latency_s - _TIMER_LATENESS_S - latency_s * _TIMER_SLACK
    if coarse_s > 0:
        await asyncio.sleep(coarse_s)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class RespondWith(Behavior):
    """Answers with a fixed raw body (its usage replaced when ``usage`` is set)."""

    payload: bytes
    latency_ms: int
    usage: TokenUsage | None

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        if self.latency_ms:
            await simulate_latency(self.latency_ms)
        if self.usage is None:
            return self.payload
        return dataclasses.replace(fake.decode(self.payload), usage=self.usage)


@dataclass(frozen=True, slots=True)
class Scripted(Behavior):
    """Answers with scripted text and tool calls, as a body in the fake's shape."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage | None
    latency_ms: int

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        if self.latency_ms:
            await simulate_latency(self.latency_ms)
        return fake.scripted_body(request, self.text, self.tool_calls, self.usage)


@dataclass(frozen=True, slots=True)
class RespondWithFn(Behavior):
    """Answers with whatever a responder function returns for the request."""

    responder: Responder
    latency_ms: int

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        if self.latency_ms:
            await simulate_latency(self.latency_ms)
        answer = self.responder(request)
        if not isinstance(answer, bytes | LlmResponse):
            raise TypeError(
                f"the respond_with_fn function {self.responder!r} must return bytes or an "
                f"LlmResponse, got {type(answer).__name__}"
            )
        return answer


@dataclass(frozen=True, slots=True)
class RaiseError(Behavior):
    """Raises (a copy of) an error on every matching request."""

    error: Exception

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        # A fresh copy each time, so repeated raises do not pile tracebacks onto one instance.
        raise copy.copy(self.error).with_traceback(None)


@dataclass(frozen=True, slots=True)
class FailThenSucceed(Behavior):
    """Raises an error for the first ``times`` matches, then answers ``payload``."""

    error: Exception
    times: int
    payload: bytes

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        if earlier_matches < self.times:
            raise copy.copy(self.error).with_traceback(None)
        return self.payload


# -- matchers, behavior builders and the fake ---------------------------------------------
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
        messages = request.messages
        return any(self.text in text for message in messages for text in _message_text(message))


@dataclass(frozen=True, slots=True)
class _MatchModelId:
    model_id: str

    def __call__(self, request: LlmRequest) -> bool:
        return request.model_id == self.model_id


def match_any() -> Matcher:
    """A matcher that accepts every request."""
    return _MatchAny()


def match_contains(text: str) -> Matcher:
    """A matcher for requests with a message whose text (or a part's) contains ``text``."""
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
    """Answer with ``payload`` as the raw body after ``latency_ms``; ``usage`` replaces its own."""
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

    A ``(name, arguments)`` pair gets the id ``call_<position>``.
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
    """Answer with whatever ``responder(request)`` returns: a raw body, or an ``LlmResponse``.

    An ``LlmResponse``'s ``response`` bytes must decode to the same thing for replays to match.
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
        """The raw body, in this fake's shape, of a scripted answer to ``request``."""
        return wire_body(
            self.shape,
            text=text,
            tool_calls=tool_calls,
            usage=usage or word_count_usage(request, text),
            model=request.model_id,
        )

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
                    # A plain-text body: built at once, not decoded and then copied twice.
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
        return _FORMATS[self.shape].decode_response(raw)
