"""``AnthropicMessagesProvider`` and the Anthropic Messages wire format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from beam_agents._protos import canonical_json_bytes
from beam_agents.model.client import (
    AssistantTurn,
    LlmRequest,
    LlmResponse,
    SystemTurn,
    TokenUsage,
    ToolCall,
    ToolResultTurn,
    ToolSpec,
    Turn,
    UserTurn,
    parse_messages,
    parse_tools,
)
from beam_agents.model.transport import (
    HttpOptions,
    JsonHttpProvider,
    WireFormat,
    decode_arguments,
    error_excerpt,
    load_json_object,
    malformed_response,
    merge_sampling_params,
    string_field,
    token_count,
    usage_object,
)

PROVIDER = "Anthropic"
"""How errors name this wire format."""

_INPUT_TOKEN_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""The API counts cache-creation and cache-read input tokens apart from ``input_tokens``."""


def encode_conversation(turns: Sequence[Turn]) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text and ``messages`` of a request body (one role's turns merged)."""
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
    data = load_json_object(raw, PROVIDER)
    content = data.get("content")
    if not isinstance(content, list):
        detail = error_excerpt(raw, None) if "error" in data else "no content list"
        raise malformed_response(PROVIDER, detail)
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise malformed_response(PROVIDER, f"content[{index}] is not an object")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block, index))
        # Other block kinds (thinking, server tools) carry nothing the neutral response holds.
    usage = usage_object(data)
    return LlmResponse(
        response=raw,
        text="".join(texts),
        tool_calls=tuple(calls),
        stop_reason=string_field(data, "stop_reason"),
        usage=TokenUsage(
            input_tokens=sum(token_count(usage, name) for name in _INPUT_TOKEN_FIELDS),
            output_tokens=token_count(usage, "output_tokens"),
        ),
        model=string_field(data, "model"),
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
        raise malformed_response(PROVIDER, f"{where} needs a string 'id' and 'name'")
    arguments = decode_arguments(block.get("input", {}), PROVIDER, where)
    return ToolCall(id=call_id, name=name, arguments=arguments)


FORMAT = WireFormat(PROVIDER, "anthropic", decode_response, encode_response)
"""This wire format, as its provider and ``FakeLLM`` use it."""


class AnthropicMessagesProvider(JsonHttpProvider):
    """A model client for the Anthropic Messages API; ``max_tokens`` unless the request sets it."""

    wire = FORMAT

    def __init__(
        self,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        anthropic_version: str = "2023-06-01",
        max_tokens: int = 1024,
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env, **options)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if not isinstance(anthropic_version, str) or not anthropic_version:
            raise ValueError("anthropic_version must be a non-empty string such as '2023-06-01'")
        self.anthropic_version = anthropic_version
        self.max_tokens = max_tokens

    @property
    def url(self) -> str:
        """Return ``{base_url}/v1/messages``."""
        return f"{self.base_url}/v1/messages"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Return ``anthropic-version`` and, when there is a key, ``x-api-key``."""
        headers = {"anthropic-version": self.anthropic_version}
        if api_key is not None:
            headers["x-api-key"] = api_key
        return headers

    def build_body(self, request: LlmRequest) -> dict[str, Any]:
        """Build the Messages body: model, max_tokens, system, messages, tools, sampling."""
        system, messages = encode_conversation(parse_messages(request.messages))
        body: dict[str, Any] = {"model": self.model_for(request), "messages": messages}
        if "max_tokens" not in request.sampling_params:
            body["max_tokens"] = self.max_tokens
        if system:
            body["system"] = system
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = encode_tools(tools)
        return merge_sampling_params(body, request.sampling_params, self.wire.name)
