"""The bundled providers' HTTP transport, and what their JSON wire formats share."""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import re
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, ClassVar, Protocol, Self, TypedDict

import httpx

from beam_agents._protos import canonical_json_bytes
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
    TokenUsage,
    ToolCall,
    invalid_request,
)

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


class HttpOptions(TypedDict, total=False):
    """The options every HTTP provider takes besides its ``base_url`` and ``api_key_env``."""

    model: str
    """The model of requests whose ``model_id`` is empty (default ``""``: none)."""
    connect_timeout_s: float
    """Seconds to connect (default 10)."""
    read_timeout_s: float
    """Seconds to wait for the answer (default 120)."""


class JsonHttpProvider(ModelClient):
    """Base of the HTTP providers: configuration, a per-event-loop client, POST and error mapping.

    The key is read from ``api_key_env`` at call time and never stored. Each event loop gets
    its own ``httpx.AsyncClient``, closed with its loop or by :meth:`aclose`.
    """

    wire: ClassVar[WireFormat]
    """The provider's wire format: its names, and the decoder of its response bodies."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key_env: str | None,
        model: str = "",
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        if not isinstance(model, str):
            raise TypeError(f"model must be a string, got {type(model).__name__}")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
            raise ValueError("api_key_env must be a non-empty environment variable name or None")
        self.base_url = validate_base_url(base_url)
        self.model = model
        self.api_key_env = api_key_env
        self.connect_timeout_s = _positive_seconds("connect_timeout_s", connect_timeout_s)
        self.read_timeout_s = _positive_seconds("read_timeout_s", read_timeout_s)
        self._init_clients()

    def _init_clients(self) -> None:
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBoundClient]
        self._clients = weakref.WeakKeyDictionary()
        self._clients_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_clients"], state["_clients_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_clients()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r})"
        )

    @property
    def gen_ai_provider_name(self) -> str:
        """The wire format's ``gen_ai.provider.name``."""
        return self.wire.gen_ai_name

    @property
    @abstractmethod
    def url(self) -> str:
        """Return the full URL requests are POSTed to."""

    @abstractmethod
    def build_body(self, request: LlmRequest) -> dict[str, Any]:
        """Build the provider's JSON request body for ``request``; bad input raises clearly."""

    @abstractmethod
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Return the headers that authenticate (and version) a request."""

    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild the neutral :class:`LlmResponse` from a raw response body."""
        return self.wire.decode_response(raw)

    def model_for(self, request: LlmRequest) -> str:
        """Return the model a request goes to: its ``model_id``, else the provider's default."""
        model = request.model_id or self.model
        if not model:
            raise invalid_request(
                f"no model: set LlmRequest.model_id or pass model= to {type(self).__name__}"
            )
        return model

    def endpoint_key(self, request: LlmRequest) -> str:
        """Return the circuit-breaker key for ``request``: base URL plus model."""
        return f"{self.base_url}#{request.model_id or self.model}"

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Send ``request`` and decode the answer; failures raise typed ``ProviderError``s."""
        body = self.build_body(request)
        try:
            payload = canonical_json_bytes(body)
        except (TypeError, ValueError) as exc:
            raise invalid_request(f"the request body is not JSON-serialisable: {exc}") from None
        api_key = self._api_key()
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            **self.auth_headers(api_key),
        }
        raw = await self._post(payload, headers, api_key)
        return self.decode(raw)

    def _api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        api_key = os.environ.get(self.api_key_env)
        if not api_key:
            raise ProviderRequestError(
                f"{self.wire.name}: the API key environment variable {self.api_key_env!r} "
                "is not set (pass api_key_env=None for a server that needs no key)"
            )
        return api_key

    async def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            for stale in [known for known in self._clients if known.is_closed()]:
                del self._clients[stale]
            bound = self._clients.get(loop)
            if bound is not None:
                return bound.client
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(
                    connect=self.connect_timeout_s,
                    read=self.read_timeout_s,
                    write=self.read_timeout_s,
                    pool=self.connect_timeout_s,
                ),
                follow_redirects=False,
            )
            bound = _LoopBoundClient(client, _close_when_loop_ends(client))
            self._clients[loop] = bound
        # A started generator is closed by the loop's shutdown_asyncgens(), and the client with it.
        await anext(bound.closer)
        return client

    async def aclose(self) -> None:
        """Close the HTTP client of the running event loop, if one was made."""
        with self._clients_lock:
            bound = self._clients.pop(asyncio.get_running_loop(), None)
        if bound is not None:
            await bound.closer.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _post(self, payload: bytes, headers: dict[str, str], api_key: str | None) -> bytes:
        where = f"{self.wire.name} POST {self.url}"
        try:
            response = await (await self._client()).post(self.url, content=payload, headers=headers)
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{where} timed out ({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            detail = redact(os_error_of(exc), api_key)
            raise ProviderUnavailable(f"{where}: cannot connect to {self.url}: {detail}") from exc
        except httpx.TransportError as exc:
            detail = redact(str(exc), api_key)
            raise ProviderTimeout(f"{where} failed: {type(exc).__name__}: {detail}") from exc
        raw = response.content
        status = response.status_code
        if 200 <= status < 300:
            return raw
        excerpt = error_excerpt(raw, api_key)
        message = f"{where} returned HTTP {status}: {excerpt}"
        if status == 429:
            retry_after = parse_retry_after(response.headers, now=time.time())
            raise RateLimitError(message, retry_after_s=retry_after)
        if status >= 500:
            raise ServerError(message, status_code=status)
        if status == 408:
            # The server gave up waiting for us: a timeout, and as retryable as one.
            raise ProviderTimeout(message)
        raise ProviderRequestError(message, status_code=status)


def parse_retry_after(headers: httpx.Headers, *, now: float) -> float | None:
    """Seconds to wait per ``Retry-After`` (seconds, or an HTTP-date after ``now``)."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            seconds = float(milliseconds) / 1000.0
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            # RFC 9110: an HTTP-date is always GMT.
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def os_error_of(exc: BaseException) -> str:
    """The innermost operating-system error behind ``exc`` (its type and text), else ``exc``'s."""
    found: BaseException = exc
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError):
            found = cause
        cause = cause.__cause__ or cause.__context__
    return f"{type(found).__name__}: {found}"


def validate_base_url(base_url: str) -> str:
    """Check ``base_url`` is an absolute http(s) URL without credentials; strip a trailing /."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"base_url {base_url!r} is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an absolute http(s) URL, got {base_url!r}")
    if url.userinfo or url.query or url.fragment:
        raise ValueError(
            "base_url must not carry credentials, a query or a fragment; "
            "put the API key in the environment variable named by api_key_env"
        )
    return base_url.rstrip("/")


@dataclass(frozen=True)
class _LoopBoundClient:
    client: httpx.AsyncClient
    closer: AsyncGenerator[None, None]


async def _close_when_loop_ends(client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.aclose()


def _positive_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)
