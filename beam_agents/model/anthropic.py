"""``AnthropicMessagesProvider``: a model client for the Anthropic Messages API.

It POSTs to ``{base_url}/v1/messages`` with the ``x-api-key`` and ``anthropic-version``
headers. ``max_tokens``, which the API requires, comes from ``sampling_params`` or else the
provider's ``max_tokens``. The wire format is in :mod:`beam_agents.model.anthropic_wire`.
"""

from __future__ import annotations

from typing import Any, Unpack

import beam_agents.model.anthropic_wire as anthropic_wire
from beam_agents.model._wire import merge_sampling_params
from beam_agents.model.client import LlmRequest
from beam_agents.model.messages import parse_messages, parse_tools
from beam_agents.model.transport import HttpOptions, JsonHttpProvider


class AnthropicMessagesProvider(JsonHttpProvider):
    """A model client for the Anthropic Messages API.

    ``max_tokens`` applies to a request whose ``sampling_params`` do not set one. Picklable;
    create it in Beam's ``provider_factory``.
    """

    wire = anthropic_wire.FORMAT

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
        system, messages = anthropic_wire.encode_conversation(parse_messages(request.messages))
        body: dict[str, Any] = {"model": self.model_for(request), "messages": messages}
        if "max_tokens" not in request.sampling_params:
            body["max_tokens"] = self.max_tokens
        if system:
            body["system"] = system
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = anthropic_wire.encode_tools(tools)
        return merge_sampling_params(body, request.sampling_params, self.wire.name)
