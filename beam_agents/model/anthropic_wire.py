"""The Anthropic Messages wire format: neutral turns and tools out, response bodies in.

Used by ``AnthropicMessagesProvider`` to talk to the API and by ``FakeLLM(shape="anthropic")``
to answer like it (:func:`encode_response`). How neutral messages map onto the wire is
described in ``beam_agents/model/README.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import beam_agents.model._wire as _wire
from beam_agents._protos import canonical_json_bytes
from beam_agents.model.client import LlmResponse, TokenUsage, ToolCall
from beam_agents.model.messages import (
    AssistantTurn,
    SystemTurn,
    ToolResultTurn,
    ToolSpec,
    Turn,
    UserTurn,
)

PROVIDER = "Anthropic"
"""How errors name this wire format."""

_INPUT_TOKEN_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The API counts cache-creation and cache-read input tokens apart from ``input_tokens``."""


def encode_conversation(turns: Sequence[Turn]) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text (system turns hoisted, joined) and ``messages`` of a request body.

    Consecutive turns of one role are merged, since the API wants user and assistant to
    alternate (so the results of parallel tool calls travel together).
    """
    system_texts: list[str] = []
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if isinstance(turn, SystemTurn):
            system_texts.append(turn.text)
            continue
        role, blocks = _role_and_blocks(turn)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    return "\n\n".join(system_texts), messages


def encode_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` of a request body, each with its JSON Schema as ``input_schema``."""
    return [
        {"name": spec.name, "description": spec.description, "input_schema": dict(spec.parameters)}
        for spec in tools
    ]


def encode_response(
    *, text: str, tool_calls: Sequence[ToolCall], usage: TokenUsage, model: str
) -> bytes:
    """The response body the Messages API answers with, carrying these parts."""
    return canonical_json_bytes(
        {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _content_blocks(text, tool_calls),
            "stop_reason": "tool_use" if tool_calls else "end_turn",
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        }
    )


def decode_response(raw: bytes) -> LlmResponse:
    """Decode a Messages response body: text blocks joined, ``tool_use`` blocks as calls."""
    data = _wire.load_json_object(raw, PROVIDER)
    content = data.get("content")
    if not isinstance(content, list):
        detail = _wire.error_excerpt(raw, None) if "error" in data else "no content list"
        raise _wire.malformed_response(PROVIDER, detail)
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise _wire.malformed_response(PROVIDER, f"content[{index}] is not an object")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block, index))
        # Other block kinds (thinking, server tools) carry nothing the neutral response holds.
    usage = _wire.usage_object(data)
    return LlmResponse(
        response=raw,
        text="".join(texts),
        tool_calls=tuple(calls),
        stop_reason=_wire.string_field(data, "stop_reason"),
        usage=TokenUsage(
            input_tokens=sum(_wire.token_count(usage, name) for name in _INPUT_TOKEN_FIELDS),
            output_tokens=_wire.token_count(usage, "output_tokens"),
        ),
        model=_wire.string_field(data, "model"),
    )


def _role_and_blocks(turn: UserTurn | AssistantTurn | ToolResultTurn) -> tuple[str, list[Any]]:
    if isinstance(turn, ToolResultTurn):
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": turn.tool_call_id,
            "content": turn.text,
        }
        if turn.is_error:
            block["is_error"] = True
        return "user", [block]
    if isinstance(turn, UserTurn):
        return "user", _content_blocks(turn.text, ())
    return "assistant", _content_blocks(turn.text, turn.tool_calls)


def _content_blocks(text: str, tool_calls: Sequence[ToolCall]) -> list[Any]:
    # The API rejects empty text blocks; an assistant turn that only calls tools has none.
    blocks: list[Any] = [{"type": "text", "text": text}] if text else []
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        for call in tool_calls
    )
    return blocks


def _tool_call(block: dict[str, Any], index: int) -> ToolCall:
    where = f"content[{index}] (tool_use)"
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str) or not name:
        raise _wire.malformed_response(PROVIDER, f"{where} needs a string 'id' and 'name'")
    arguments = _wire.decode_arguments(block.get("input", {}), PROVIDER, where)
    return ToolCall(id=call_id, name=name, arguments=arguments)


FORMAT = _wire.WireFormat(PROVIDER, "anthropic", decode_response, encode_response)
"""This wire format, as its provider and ``FakeLLM`` use it."""
