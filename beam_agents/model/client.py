"""The neutral model-call contract: ``LlmRequest``, ``LlmResponse`` and provider errors.

A model client is any object with ``async complete(request) -> LlmResponse``. Clients whose
raw bodies need provider-specific decoding also offer ``decode(raw: bytes) -> LlmResponse``,
which the replay cache uses to rebuild a response from the stored raw body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# Built once: ``json.dumps`` with any non-default option builds a new encoder on every call.
_REQUEST_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)


@dataclass(frozen=True)
class LlmRequest:
    """One model call: the model, the conversation, the tools offered and sampling settings."""

    model_id: str
    messages: Sequence[Mapping[str, Any]] = ()
    tools_schema: Sequence[Mapping[str, Any]] = ()
    sampling_params: Mapping[str, Any] = field(default_factory=dict)

    def canonical_json(self) -> str:
        """The request as canonical JSON (sorted keys, compact), the basis of its cache key."""
        return _REQUEST_ENCODER.encode(
            {
                "model_id": self.model_id,
                "messages": list(self.messages),
                "tools_schema": list(self.tools_schema),
                "sampling_params": dict(self.sampling_params),
            }
        )

    def content_digest(self) -> str:
        """A SHA-256 hex digest of :meth:`canonical_json`."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for: provider-assigned id, tool name and decoded arguments."""

    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class TokenUsage:
    """Tokens the provider reports for one call."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class LlmResponse:
    """A provider's answer: the raw body (what the replay cache stores) and its decoded parts."""

    response: bytes
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    usage: TokenUsage = field(default_factory=TokenUsage)
    model: str = ""


@runtime_checkable
class ModelClient(Protocol):
    """Anything that can answer an :class:`LlmRequest`."""

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Send ``request`` to the model and return its decoded response."""
        ...


def decode_plain(raw: bytes) -> LlmResponse:
    """Decode a raw body that is plain text: the fallback for clients without ``decode``."""
    return LlmResponse(response=raw, text=raw.decode("utf-8", errors="replace"))


def decode_with(client: object, raw: bytes) -> LlmResponse:
    """Rebuild an :class:`LlmResponse` from a stored raw body using ``client``'s decoder."""
    decode = getattr(client, "decode", None)
    if callable(decode):
        response = decode(raw)
        if not isinstance(response, LlmResponse):
            raise TypeError(f"{type(client).__name__}.decode must return an LlmResponse")
        return response
    return decode_plain(raw)


class ProviderError(Exception):
    """Base class for every failure of a model provider call."""

    retryable: bool = False


class RateLimitError(ProviderError):
    """The provider refused the call for rate limiting (HTTP 429); retried."""

    retryable = True

    def __init__(self, message: str = "rate limited", *, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(ProviderError):
    """The provider failed on its side (HTTP 5xx); retried."""

    retryable = True

    def __init__(self, message: str = "server error", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class ProviderTimeout(ProviderError):
    """The call timed out or the connection failed; retried."""

    retryable = True


class ProviderRequestError(ProviderError):
    """The provider rejected the request itself (other HTTP 4xx, undecodable body); not retried."""

    retryable = False

    def __init__(self, message: str = "bad request", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code
