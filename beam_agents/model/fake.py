"""``FakeLLM``: a scripted, offline model client for tests and examples.

A ``FakeLLM`` holds rules ``(matcher, behavior)``; each request is answered by the first rule
whose matcher accepts it, and every request is recorded (``.requests``, ``.call_count``)
whether it is answered or not. A request no rule matches raises ``ProviderRequestError``.

Matchers: :func:`match_any`, :func:`match_contains`, :func:`match_model_id` (or any picklable
``LlmRequest -> bool`` callable). Behaviors: :func:`respond_with`, :func:`respond_with_text`,
:func:`respond_with_tool_calls`, :func:`respond_with_fn`, :func:`raise_error`,
:func:`fail_then_succeed`. Latency (``latency_ms``) yields to the event loop, as a network
call would, and ends on time (:func:`simulate_latency`).

Shapes: ``FakeLLM(rules, shape=...)`` chooses the raw bodies it answers with, and so the
decoder that turns them back into an ``LlmResponse`` (which the replay cache relies on):

- ``"fake"`` (the default): scripted answers are canonical JSON starting with
  ``{"fake_llm":``; ``respond_with(payload)`` answers with ``payload`` itself as the raw body,
  decoded as UTF-8 text.
- ``"openai"`` / ``"anthropic"``: scripted answers are real Chat Completions / Messages
  response bodies (see :func:`wire_body`), decoded by ``OpenAIChatProvider.decode`` /
  ``AnthropicMessagesProvider.decode``; ``respond_with(payload)`` must then be such a body.

Token usage is a word count unless a behavior says otherwise (``usage=``): input tokens are
the words in the messages' text, output tokens the words of the answer's text.

A ``FakeLLM`` pickles (Beam pickles the ``provider_factory`` that returns it) as long as its
matchers and ``respond_with_fn`` functions do (make them module level). Its call counters and
recorded requests belong to the instance, so a pickled copy counts separately.
"""

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

from beam_agents._json import canonical_json, canonical_json_bytes
from beam_agents.model.anthropic import AnthropicMessagesProvider
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ProviderRequestError,
    TokenUsage,
    ToolCall,
)
from beam_agents.model.openai import OpenAIChatProvider

Matcher: TypeAlias = Callable[[LlmRequest], bool]
"""Decides whether a rule applies to a request."""

Shape: TypeAlias = Literal["fake", "openai", "anthropic"]
"""The wire format of a ``FakeLLM``'s raw bodies."""

Responder: TypeAlias = Callable[[LlmRequest], "bytes | LlmResponse"]
"""What :func:`respond_with_fn` calls: a raw body (decoded in the fake's shape) or a response."""

_FAKE_BODY_PREFIX = b'{"fake_llm":'
# Any absolute URL does: the decoders never send anything.
_DECODER_URL = "http://127.0.0.1"


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


def word_count_usage(request: LlmRequest, answer_text: str) -> TokenUsage:
    """The fake's default token usage: words in the request's messages and in the answer."""
    return TokenUsage(
        input_tokens=sum(len(text.split()) for text in _request_text(request)),
        output_tokens=len(answer_text.split()),
    )


def _call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}


def wire_body(
    shape: Shape,
    *,
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    usage: TokenUsage | None = None,
    model: str = "",
) -> bytes:
    """A raw response body in ``shape`` carrying ``text``, ``tool_calls`` and ``usage``.

    For ``"openai"`` and ``"anthropic"`` this is the body the real API answers with (what a
    local test server can send to ``OpenAIChatProvider`` / ``AnthropicMessagesProvider``).
    """
    counted = usage or TokenUsage()
    if shape == "fake":
        return canonical_json_bytes(
            {
                "fake_llm": {
                    "model": model,
                    "text": text,
                    "tool_calls": [_call_dict(call) for call in tool_calls],
                    "usage": {
                        "input_tokens": counted.input_tokens,
                        "output_tokens": counted.output_tokens,
                    },
                }
            }
        )
    if shape == "openai":
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": canonical_json(call.arguments)},
                }
                for call in tool_calls
            ]
        return canonical_json_bytes(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": counted.input_tokens,
                    "completion_tokens": counted.output_tokens,
                    "total_tokens": counted.total_tokens,
                },
            }
        )
    if shape == "anthropic":
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
            for call in tool_calls
        )
        return canonical_json_bytes(
            {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": "tool_use" if tool_calls else "end_turn",
                "usage": {
                    "input_tokens": counted.input_tokens,
                    "output_tokens": counted.output_tokens,
                },
            }
        )
    raise ValueError(f"shape must be one of {get_args(Shape)}, got {shape!r}")


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
    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """A raw body (decoded in the fake's shape) or a finished response for ``request``.

        ``earlier_matches`` counts this rule's earlier uses.
        """


_TIMER_LATENESS_S = 0.0015
"""How late an asyncio timer may fire beyond the kernel's slack: epoll counts whole ms."""
_TIMER_SLACK = 0.002
"""The kernel lets a wait of T overrun by T / 1000; twice that, to be safe."""


async def simulate_latency(latency_ms: int) -> None:
    """Yield to the event loop for ``latency_ms``, ending on time to within microseconds.

    A plain ``asyncio.sleep`` wakes up to ~1 ms late plus 0.1% of the wait (see the constants),
    which a benchmark would count as the caller's overhead; a real provider's answer wakes the
    loop through its socket, with no timer. So the bulk of the wait is a timer that ends just
    early, and the last millisecond or two yields to the loop until the deadline.
    """
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
class _RespondWith(Behavior):
    payload: bytes
    latency_ms: int
    usage: TokenUsage | None

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        await simulate_latency(self.latency_ms)
        if self.usage is None:
            return self.payload
        return dataclasses.replace(fake.decode(self.payload), usage=self.usage)


@dataclass(frozen=True, slots=True)
class _Scripted(Behavior):
    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage | None
    latency_ms: int

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        await simulate_latency(self.latency_ms)
        return fake.scripted_body(request, self.text, self.tool_calls, self.usage)


@dataclass(frozen=True, slots=True)
class _RespondWithFn(Behavior):
    responder: Responder
    latency_ms: int

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        await simulate_latency(self.latency_ms)
        answer = self.responder(request)
        if not isinstance(answer, bytes | LlmResponse):
            raise TypeError(
                f"the respond_with_fn function {self.responder!r} must return bytes or an "
                f"LlmResponse, got {type(answer).__name__}"
            )
        return answer


@dataclass(frozen=True, slots=True)
class _RaiseError(Behavior):
    error: Exception

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        # A fresh copy each time, so repeated raises do not pile tracebacks onto one instance.
        raise copy.copy(self.error).with_traceback(None)


@dataclass(frozen=True, slots=True)
class _FailThenSucceed(Behavior):
    error: Exception
    times: int
    payload: bytes

    async def respond(
        self, fake: FakeLLM, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        if earlier_matches < self.times:
            raise copy.copy(self.error).with_traceback(None)
        return self.payload


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
    return _RespondWith(
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
    return _Scripted(text, normalized, _check_usage(usage), _check_count("latency_ms", latency_ms))


def respond_with_fn(responder: Responder, *, latency_ms: int = 0) -> Behavior:
    """Answer with whatever ``responder(request)`` returns.

    Bytes are a raw body, decoded in the fake's shape (build one with :func:`wire_body` or
    :meth:`FakeLLM.scripted_body`); an ``LlmResponse`` is returned as it is, so its
    ``response`` bytes must decode to the same thing for replays to match.
    """
    if not callable(responder):
        raise TypeError(f"respond_with_fn takes a callable, got {responder!r}")
    return _RespondWithFn(responder, _check_count("latency_ms", latency_ms))


def raise_error(error: Exception) -> Behavior:
    """Raise ``error`` (a copy of it) on every matching request."""
    return _RaiseError(_check_error(error))


def fail_then_succeed(error: Exception, times: int, payload: bytes) -> Behavior:
    """Raise ``error`` for the first ``times`` matching requests, then answer ``payload``."""
    return _FailThenSucceed(
        _check_error(error), _check_count("times", times), _check_payload(payload)
    )


class FakeLLM:
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
        if shape not in get_args(Shape):
            raise ValueError(f"shape must be one of {get_args(Shape)}, got {shape!r}")
        self.shape: Shape = shape
        self._decoder: OpenAIChatProvider | AnthropicMessagesProvider | None = None
        if shape == "openai":
            self._decoder = OpenAIChatProvider(base_url=_DECODER_URL, api_key_env=None)
        elif shape == "anthropic":
            self._decoder = AnthropicMessagesProvider(base_url=_DECODER_URL, api_key_env=None)
        self._rules = checked
        self._matches = [0] * len(checked)
        self.requests: list[LlmRequest] = []

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
                elif self.shape == "fake" and not answer.startswith(_FAKE_BODY_PREFIX):
                    # Built once with the request's usage and model, rather than decoded and
                    # then copied twice: this is the hot path of every benchmark.
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
        if self._decoder is not None:
            return self._decoder.decode(raw)
        if not raw.startswith(_FAKE_BODY_PREFIX):
            text = raw.decode("utf-8", errors="replace")
            return LlmResponse(
                response=raw,
                text=text,
                stop_reason="end_turn",
                usage=TokenUsage(0, len(text.split())),
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
