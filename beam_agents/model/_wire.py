"""What the JSON wire formats share: ``WireFormat``, sampling fields, decoding, error excerpts.

Errors in a response body become ``ProviderRequestError`` (not retried); error excerpts are
short and have API keys redacted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from beam_agents.model.client import LlmResponse, TokenUsage, ToolCall
from beam_agents.model.errors import ProviderRequestError
from beam_agents.model.messages import invalid_request

_EXCERPT_LIMIT = 200
# Provider keys (OpenAI ``sk-...``, Anthropic ``sk-ant-...``) some servers echo in error text.
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")
_REDACTED = "[redacted]"


class ResponseEncoder(Protocol):
    """Builds the response body a server of the wire format answers with."""

    def __call__(
        self, *, text: str, tool_calls: Sequence[ToolCall], usage: TokenUsage, model: str
    ) -> bytes:
        """The body carrying ``text``, ``tool_calls``, ``usage`` and ``model``."""
        ...


@dataclass(frozen=True)
class WireFormat:
    """One wire format's names and response codec, shared by its provider and ``FakeLLM``."""

    name: str
    """How error messages name the provider."""
    gen_ai_name: str
    """Its ``gen_ai.provider.name`` in traces."""
    decode_response: Callable[[bytes], LlmResponse]
    """Decodes a response body."""
    encode_response: ResponseEncoder
    """Builds a response body (what ``FakeLLM`` answers with in this shape)."""


def merge_sampling_params(
    body: dict[str, Any], sampling_params: Mapping[str, Any], provider: str
) -> dict[str, Any]:
    """Add provider-native sampling fields to ``body``; they may not replace what it holds."""
    clash = sorted(key for key in sampling_params if key in body)
    if clash:
        raise invalid_request(f"sampling_params may not set {clash}: the {provider} provider does")
    body.update(sampling_params)
    return body


def load_json_object(raw: bytes, provider: str) -> dict[str, Any]:
    """Decode a provider's response body, which must be a JSON object."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ProviderRequestError(
            f"{provider} response is not valid JSON ({exc}): {error_excerpt(raw, None)!r}",
            status_code=200,
        ) from None
    if not isinstance(data, dict):
        raise ProviderRequestError(
            f"{provider} response is JSON {type(data).__name__}, expected an object",
            status_code=200,
        )
    return data


def malformed_response(provider: str, problem: str) -> ProviderRequestError:
    """Build the error for a well-formed JSON body that lacks the documented shape."""
    return ProviderRequestError(f"malformed {provider} response: {problem}", status_code=200)


def decode_arguments(arguments: Any, provider: str, where: str) -> dict[str, Any]:
    """Decode a tool call's arguments (a JSON string or an object) into a dict."""
    if isinstance(arguments, str):
        if not arguments.strip():
            # Some OpenAI-compatible servers send "" for a call to a tool without parameters.
            return {}
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise malformed_response(provider, f"{where} arguments are not JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise malformed_response(
            provider, f"{where} arguments must be a JSON object, got {type(arguments).__name__}"
        )
    return arguments


def token_count(usage: Mapping[str, Any], *names: str) -> int:
    """Return the first of ``names`` that ``usage`` holds as a non-negative int, else 0."""
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def usage_object(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``usage`` object of a decoded response body (empty when it has none)."""
    usage = data.get("usage")
    return usage if isinstance(usage, dict) else {}


def string_field(data: Mapping[str, Any], key: str) -> str:
    """``data[key]`` when it is a string, else ``""``."""
    value = data.get(key)
    return value if isinstance(value, str) else ""


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` and anything shaped like a provider key replaced."""
    if secret:
        text = text.replace(secret, _REDACTED)
    return _KEY_LIKE.sub(_REDACTED, text)


def error_excerpt(raw: bytes, secret: str | None) -> str:
    """Return a short, secret-free excerpt of an error body, preferring its message field."""
    text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str):
            text = error
        elif isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            kind = error.get("type")
            if isinstance(message, str):
                text = f"{kind}: {message}" if isinstance(kind, str) and kind else message
    text = " ".join(redact(text, secret).split())
    return text if len(text) <= _EXCERPT_LIMIT else text[:_EXCERPT_LIMIT] + "..."
