"""The raw bodies a ``FakeLLM`` answers with, in each of its shapes, and their decoding.

``"fake"`` bodies are canonical JSON starting with ``{"fake_llm":`` (any other bytes decode as
plain text); ``"openai"`` and ``"anthropic"`` bodies are the real APIs' response bodies, made
and read by :mod:`~beam_agents.model.openai_wire` and :mod:`~beam_agents.model.anthropic_wire`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, get_args

import beam_agents.model.anthropic_wire as anthropic_wire
import beam_agents.model.openai_wire as openai_wire
from beam_agents._protos import canonical_json_bytes
from beam_agents.model._wire import WireFormat
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, ToolCall

Shape: TypeAlias = Literal["fake", "openai", "anthropic"]
"""The wire format of a ``FakeLLM``'s raw bodies."""

SHAPES: tuple[Shape, ...] = get_args(Shape)
"""Every :data:`Shape`."""

FAKE_BODY_PREFIX = b'{"fake_llm":'
"""How a scripted ``"fake"`` body starts; other bytes are a plain-text answer."""


def check_shape(shape: Shape) -> Shape:
    """``shape``, if it is one of :data:`SHAPES`; else ``ValueError``."""
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
    """A raw response body in ``shape`` carrying ``text``, ``tool_calls`` and ``usage``.

    For ``"openai"`` and ``"anthropic"`` this is the body the real API answers with (what a
    local test server can send to ``OpenAIChatProvider`` / ``AnthropicMessagesProvider``).
    """
    encode = _FORMATS[check_shape(shape)].encode_response
    return encode(text=text, tool_calls=tool_calls, usage=usage or TokenUsage(), model=model)


def scripted_answer(
    shape: Shape, request: LlmRequest, answer: tuple[str, Sequence[ToolCall], TokenUsage | None]
) -> bytes:
    """The body of the scripted ``(text, tool_calls, usage)`` answer to ``request``.

    Usage defaults to :func:`word_count_usage`; the model is the request's.
    """
    text, tool_calls, usage = answer
    return wire_body(
        shape,
        text=text,
        tool_calls=tool_calls,
        usage=usage or word_count_usage(request, text),
        model=request.model_id,
    )


def decode_body(shape: Shape, raw: bytes) -> LlmResponse:
    """Rebuild the response for a raw body in ``shape``."""
    return _FORMATS[shape].decode_response(raw)


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


def request_texts(request: LlmRequest) -> Iterable[str]:
    """The text of each message of ``request``: its string ``content``, or its parts' text."""
    for message in request.messages:
        yield from _message_text(message)


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
    "openai": openai_wire.FORMAT,
    "anthropic": anthropic_wire.FORMAT,
}
