"""``OpenAIChatProvider`` and the OpenAI Chat Completions wire format (any compatible server)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from beam_agents._protos import canonical_json, canonical_json_bytes
from beam_agents.model.client import (
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

PROVIDER = "OpenAI-compatible"
"""How errors name this wire format."""


def encode_messages(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """The ``messages`` of a request body (``is_error`` has no wire equivalent and is dropped)."""
    return [_wire_message(turn) for turn in turns]


def encode_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` of a request body: each a ``{"type": "function", "function": ...}``."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in tools
    ]


def encode_response(
    *, text: str, tool_calls: Sequence[ToolCall], usage: TokenUsage, model: str
) -> bytes:
    """The response body a Chat Completions server answers with, carrying these parts."""
    return canonical_json_bytes(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _assistant_message(text, tool_calls),
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
            },
        }
    )


def decode_response(raw: bytes) -> LlmResponse:
    """Decode a Chat Completions response body (the first choice)."""
    data = load_json_object(raw, PROVIDER)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        detail = error_excerpt(raw, None) if "error" in data else "no choices"
        raise malformed_response(PROVIDER, detail)
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise malformed_response(PROVIDER, "choices[0] has no 'message' object")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise malformed_response(PROVIDER, "message.tool_calls is not a list")
    usage = usage_object(data)
    return LlmResponse(
        response=raw,
        text=_content_text(message.get("content")),
        tool_calls=tuple(_tool_call(call, n) for n, call in enumerate(raw_calls)),
        stop_reason=string_field(choice, "finish_reason"),
        usage=TokenUsage(
            input_tokens=token_count(usage, "prompt_tokens", "input_tokens"),
            output_tokens=token_count(usage, "completion_tokens", "output_tokens"),
        ),
        model=string_field(data, "model"),
    )


def _wire_message(turn: Turn) -> dict[str, Any]:
    if isinstance(turn, SystemTurn):
        return {"role": "system", "content": turn.text}
    if isinstance(turn, UserTurn):
        return {"role": "user", "content": turn.text}
    if isinstance(turn, ToolResultTurn):
        return {"role": "tool", "tool_call_id": turn.tool_call_id, "content": turn.text}
    return _assistant_message(turn.text, turn.tool_calls)


def _assistant_message(text: str, tool_calls: Sequence[ToolCall]) -> dict[str, Any]:
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
    return message


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Some compatible servers answer with content parts rather than a string.
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    raise malformed_response(PROVIDER, f"message content is {type(content).__name__}")


def _tool_call(raw: Any, index: int) -> ToolCall:
    where = f"tool_calls[{index}]"
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise malformed_response(PROVIDER, f"{where} has no 'function' object")
    call_id, name = raw.get("id"), function.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str) or not name:
        raise malformed_response(PROVIDER, f"{where} needs a string 'id' and 'function.name'")
    arguments = decode_arguments(function.get("arguments", ""), PROVIDER, where)
    return ToolCall(id=call_id, name=name, arguments=arguments)


FORMAT = WireFormat(PROVIDER, "openai", decode_response, encode_response)
"""This wire format, as its provider and ``FakeLLM`` use it."""


class OpenAIChatProvider(JsonHttpProvider):
    """A model client for any server speaking the OpenAI Chat Completions API.

    ``api_key_env=None`` suits a server that needs no key, such as a local vLLM or Ollama.
    """

    wire = FORMAT

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str | None = "OPENAI_API_KEY",
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env, **options)

    @property
    def url(self) -> str:
        """Return ``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Return a bearer token header, when there is a key."""
        return {} if api_key is None else {"authorization": f"Bearer {api_key}"}

    def build_body(self, request: LlmRequest) -> dict[str, Any]:
        """Build the Chat Completions body: model, messages, tools and sampling parameters."""
        body: dict[str, Any] = {
            "model": self.model_for(request),
            "messages": encode_messages(parse_messages(request.messages)),
        }
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = encode_tools(tools)
        return merge_sampling_params(body, request.sampling_params, self.wire.name)
