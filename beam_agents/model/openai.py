"""``OpenAIChatProvider``: a model client for OpenAI-compatible Chat Completions servers.

OpenAI, vLLM, llama.cpp, Ollama and the like: it POSTs to ``{base_url}/chat/completions``
with the key from the environment as a bearer token. The wire format is in
:mod:`beam_agents.model.openai_wire`.
"""

from __future__ import annotations

from typing import Any, Unpack

import beam_agents.model.openai_wire as openai_wire
from beam_agents.model._wire import merge_sampling_params
from beam_agents.model.client import LlmRequest
from beam_agents.model.messages import parse_messages, parse_tools
from beam_agents.model.transport import HttpOptions, JsonHttpProvider


class OpenAIChatProvider(JsonHttpProvider):
    """A model client for any server speaking the OpenAI Chat Completions API.

    ``api_key_env`` is ``None`` for a server that needs no key, such as a local vLLM or
    Ollama. Picklable; create it in Beam's ``provider_factory``.
    """

    wire = openai_wire.FORMAT

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
            "messages": openai_wire.encode_messages(parse_messages(request.messages)),
        }
        tools = parse_tools(request.tools_schema)
        if tools:
            body["tools"] = openai_wire.encode_tools(tools)
        return merge_sampling_params(body, request.sampling_params, self.wire.name)
