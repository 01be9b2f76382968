"""A model client for the Anthropic Messages API.

``AnthropicMessagesProvider`` POSTs to ``{base_url}/v1/messages`` with the ``x-api-key`` and
``anthropic-version`` headers. Requests use the neutral message format documented in
:mod:`beam_agents.model._http`, translated as the Messages API wants it: system messages are
hoisted into ``system``; assistant tool calls become ``tool_use`` content blocks; each tool
result becomes a ``tool_result`` block (``is_error`` kept) in a user turn; consecutive turns of
the same role are merged into one, since the API wants user and assistant to alternate (so the
results of parallel tool calls travel together); tools are offered with their JSON Schema as
``input_schema``. ``max_tokens`` is required by the API: it comes from ``sampling_params`` or
else the provider's ``max_tokens``.

The decoded response joins the text blocks, lists the ``tool_use`` blocks as tool calls, and
counts ``usage.input_tokens`` (plus cache-creation and cache-read input tokens, which the API
reports separately) and ``usage.output_tokens``.
"""

from __future__ import annotations

from typing import Any

from beam_agents.model._http import (
    AssistantTurn,
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

_PROVIDER = "Anthropic"


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
    # The API rejects empty text blocks; an assistant turn that only calls tools has none.
    blocks: list[Any] = [{"type": "text", "text": turn.text}] if turn.text else []
    if isinstance(turn, UserTurn):
        return "user", blocks
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        for call in turn.tool_calls
    )
    return "assistant", blocks


def _wire_conversation(turns: list[Turn]) -> tuple[str, list[dict[str, Any]]]:
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


def _tool_call(block: dict[str, Any], index: int) -> ToolCall:
    where = f"content[{index}] (tool_use)"
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str) or not name:
        raise malformed_response(_PROVIDER, f"{where} needs a string 'id' and 'name'")
    arguments = decode_arguments(block.get("input", {}), _PROVIDER, where)
    return ToolCall(id=call_id, name=name, arguments=arguments)


class AnthropicMessagesProvider(JsonHttpProvider):
    """A model client for the Anthropic Messages API.

    ``model`` is used when a request's ``model_id`` is empty; ``max_tokens`` when its
    ``sampling_params`` do not set one. ``api_key_env`` names the environment variable holding
    the key. Picklable; create it in Beam's ``provider_factory``.
    """

    provider_name = _PROVIDER

    def __init__(
        self,
        *,
        base_url: str = "https://api.anthropic.com",
        model: str = "",
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        anthropic_version: str = "2023-06-01",
        max_tokens: int = 1024,
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
        system, messages = _wire_conversation(parse_messages(request.messages))
        body: dict[str, Any] = {"model": self.model_for(request), "messages": messages}
        if "max_tokens" not in request.sampling_params:
            body["max_tokens"] = self.max_tokens
        if system:
            body["system"] = system
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": dict(spec.parameters),
                }
                for spec in tools
            ]
        return merge_sampling_params(body, request.sampling_params, _PROVIDER)

    def decode(self, raw: bytes) -> LlmResponse:
        """Decode a Messages response body."""
        data = load_json_object(raw, _PROVIDER)
        content = data.get("content")
        if not isinstance(content, list):
            detail = error_excerpt(raw, None) if "error" in data else "no content list"
            raise malformed_response(_PROVIDER, detail)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index, block in enumerate(content):
            if not isinstance(block, dict):
                raise malformed_response(_PROVIDER, f"content[{index}] is not an object")
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use":
                calls.append(_tool_call(block, index))
            # Other block kinds (thinking, server tools) carry nothing the neutral response holds.
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        input_tokens = sum(
            token_count(usage, name)
            for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        stop_reason = data.get("stop_reason")
        model = data.get("model")
        return LlmResponse(
            response=raw,
            text="".join(texts),
            tool_calls=tuple(calls),
            stop_reason=stop_reason if isinstance(stop_reason, str) else "",
            usage=TokenUsage(
                input_tokens=input_tokens, output_tokens=token_count(usage, "output_tokens")
            ),
            model=model if isinstance(model, str) else "",
        )
