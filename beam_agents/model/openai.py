"""A model client for OpenAI-compatible Chat Completions servers (OpenAI, vLLM, llama.cpp, Ollama).

``OpenAIChatProvider`` POSTs to ``{base_url}/chat/completions`` with the key from the
environment as a bearer token. Requests use the neutral message format documented in
:mod:`beam_agents.model._http`; since that format is modelled on Chat Completions, the
translation is small: assistant tool calls get the ``{"type": "function", "function": {...}}``
wrapper with their arguments as a JSON string, tool results become ``tool`` messages (the
neutral ``is_error`` flag has no wire equivalent and is dropped), and tools are offered as
``{"type": "function", "function": {"name", "description", "parameters"}}``.

The decoded response takes the first choice: its text, its tool calls (arguments decoded to a
dict), ``finish_reason`` as the stop reason, and ``usage.prompt_tokens``/``completion_tokens``.
"""

from __future__ import annotations

from typing import Any

from beam_agents._json import canonical_json
from beam_agents.model._http import (
    JsonHttpProvider,
    SystemTurn,
    ToolResultTurn,
    Turn,
    UserTurn,
    decode_arguments,
    error_excerpt,
    load_json_object,
    malformed_response,
    merge_sampling_params,
    parse_messages,
    parse_tools,
    token_count,
)
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, ToolCall

_PROVIDER = "OpenAI-compatible"


def _wire_message(turn: Turn) -> dict[str, Any]:
    if isinstance(turn, SystemTurn):
        return {"role": "system", "content": turn.text}
    if isinstance(turn, UserTurn):
        return {"role": "user", "content": turn.text}
    if isinstance(turn, ToolResultTurn):
        return {"role": "tool", "tool_call_id": turn.tool_call_id, "content": turn.text}
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": canonical_json(call.arguments)},
            }
            for call in turn.tool_calls
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
    raise malformed_response(_PROVIDER, f"message content is {type(content).__name__}")


def _tool_call(raw: Any, index: int) -> ToolCall:
    where = f"tool_calls[{index}]"
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise malformed_response(_PROVIDER, f"{where} has no 'function' object")
    call_id, name = raw.get("id"), function.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str) or not name:
        raise malformed_response(_PROVIDER, f"{where} needs a string 'id' and 'function.name'")
    arguments = decode_arguments(function.get("arguments", ""), _PROVIDER, where)
    return ToolCall(id=call_id, name=name, arguments=arguments)


class OpenAIChatProvider(JsonHttpProvider):
    """A model client for any server speaking the OpenAI Chat Completions API.

    ``model`` is used when a request's ``model_id`` is empty. ``api_key_env`` names the
    environment variable holding the key (``None`` for servers that need none, such as a
    local vLLM or Ollama). Picklable; create it in Beam's ``provider_factory``.
    """

    provider_name = _PROVIDER

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        model: str = "",
        api_key_env: str | None = "OPENAI_API_KEY",
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
        )

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
            "messages": [_wire_message(turn) for turn in parse_messages(request.messages)],
        }
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = [
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
        return merge_sampling_params(body, request.sampling_params, _PROVIDER)

    def decode(self, raw: bytes) -> LlmResponse:
        """Decode a Chat Completions response body (the first choice)."""
        data = load_json_object(raw, _PROVIDER)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            detail = error_excerpt(raw, None) if "error" in data else "no choices"
            raise malformed_response(_PROVIDER, detail)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise malformed_response(_PROVIDER, "choices[0] has no 'message' object")
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise malformed_response(_PROVIDER, "message.tool_calls is not a list")
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        stop_reason = choice.get("finish_reason")
        model = data.get("model")
        return LlmResponse(
            response=raw,
            text=_content_text(message.get("content")),
            tool_calls=tuple(_tool_call(call, n) for n, call in enumerate(raw_calls)),
            stop_reason=stop_reason if isinstance(stop_reason, str) else "",
            usage=TokenUsage(
                input_tokens=token_count(usage, "prompt_tokens", "input_tokens"),
                output_tokens=token_count(usage, "completion_tokens", "output_tokens"),
            ),
            model=model if isinstance(model, str) else "",
        )
