"""Shared plumbing for the HTTP model providers: the neutral message format, transport, errors.

The neutral message format
--------------------------
``LlmRequest.messages`` is a list of plain dicts, one per conversation turn, in the shape a
tool-calling loop produces. Both providers accept exactly this and translate it to their wire
format; any other shape is refused with :class:`ProviderRequestError` before a byte is sent.

- ``{"role": "system", "content": str}``: instructions. OpenAI keeps them in place; Anthropic
  hoists every system message, in order and joined by a blank line, into its ``system`` field.
- ``{"role": "user", "content": str}``: what the user (or the event) says.
- ``{"role": "assistant", "content": str | None, "tool_calls": [...]}``: an earlier model
  answer. ``tool_calls`` is optional; each entry is ``{"id": str, "name": str,
  "arguments": {...}}``, i.e. a :class:`~beam_agents.model.client.ToolCall` as a dict, with the
  arguments as a JSON object (not a JSON string). ``content`` may be empty or ``None`` when
  the turn only calls tools.
- ``{"role": "tool", "tool_call_id": str, "content": str, "is_error": bool}``: the result of
  one tool call, fed back after the assistant turn that asked for it. ``tool_call_id`` is the
  ``ToolCall.id`` it answers; ``content`` is text (serialise structured results with canonical
  JSON); ``is_error`` (optional, default false) marks a failed call. ``name`` (the tool name)
  is accepted and ignored. One ``tool`` message per call: parallel calls get consecutive
  ``tool`` messages.

So a tool round trip is: the model answers with ``LlmResponse.tool_calls``; the loop appends
``{"role": "assistant", "content": response.text, "tool_calls": [{"id": c.id, "name": c.name,
"arguments": dict(c.arguments)} for c in response.tool_calls]}``, then one ``tool`` message
per call, and calls the model again.

``LlmRequest.tools_schema`` is a list of ``{"name", "description", "parameters"}`` dicts (what
``Tool.schema`` and ``ToolRegistry.tools_schema`` give), ``parameters`` being a JSON Schema
object. ``LlmRequest.sampling_params`` are provider-native body fields (``temperature``,
``max_tokens``, ``stop`` or ``stop_sequences``, ``tool_choice``, ...) and are passed through
unchanged; they may not override the fields the provider builds itself.
"""

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
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Self

import httpx

from beam_agents._json import canonical_json_bytes
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ProviderRequestError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    ToolCall,
)

_EXCERPT_LIMIT = 200
# Provider keys (OpenAI ``sk-...``, Anthropic ``sk-ant-...``) some servers echo in error text.
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")
_REDACTED = "[redacted]"


@dataclass(frozen=True)
class SystemTurn:
    """A neutral ``system`` message."""

    text: str


@dataclass(frozen=True)
class UserTurn:
    """A neutral ``user`` message."""

    text: str


@dataclass(frozen=True)
class AssistantTurn:
    """A neutral ``assistant`` message: its text and the tool calls it made."""

    text: str
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class ToolResultTurn:
    """A neutral ``tool`` message: the result of the tool call ``tool_call_id``."""

    tool_call_id: str
    text: str
    is_error: bool


Turn = SystemTurn | UserTurn | AssistantTurn | ToolResultTurn


@dataclass(frozen=True)
class ToolSpec:
    """One tool offered to the model, from a neutral ``tools_schema`` entry."""

    name: str
    description: str
    parameters: Mapping[str, Any]


_ALLOWED_KEYS = {
    "system": frozenset({"role", "content"}),
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name", "is_error"}),
}
_TOOL_KEYS = frozenset({"name", "description", "parameters"})
_EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def _bad_request(message: str) -> ProviderRequestError:
    return ProviderRequestError(f"invalid request: {message}")


def _text_field(message: Mapping[str, Any], key: str, where: str, *, optional: bool) -> str:
    value = message.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise _bad_request(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _parse_tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, Mapping) or set(raw) != {"id", "name", "arguments"}:
        raise _bad_request(f"{where} must be a dict with exactly 'id', 'name' and 'arguments'")
    call_id, name, arguments = raw["id"], raw["name"], raw["arguments"]
    if not isinstance(call_id, str) or not call_id:
        raise _bad_request(f"{where}.id must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise _bad_request(f"{where}.name must be a non-empty string")
    if not isinstance(arguments, Mapping):
        raise _bad_request(f"{where}.arguments must be a JSON object (a dict), not a string")
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))


def parse_messages(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """Validate neutral messages and turn them into typed turns; bad shapes raise clearly."""
    turns: list[Turn] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise _bad_request(f"{where} must be a dict, got {type(message).__name__}")
        role = message.get("role")
        allowed = _ALLOWED_KEYS.get(role) if isinstance(role, str) else None
        if allowed is None:
            raise _bad_request(f"{where}.role must be one of {sorted(_ALLOWED_KEYS)}, got {role!r}")
        unknown = set(message) - allowed
        if unknown:
            raise _bad_request(f"{where} ({role}) has unsupported keys {sorted(unknown)}")
        if role == "system":
            turns.append(SystemTurn(_text_field(message, "content", where, optional=False)))
        elif role == "user":
            turns.append(UserTurn(_text_field(message, "content", where, optional=False)))
        elif role == "assistant":
            raw_calls = message.get("tool_calls") or []
            if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, str | bytes):
                raise _bad_request(f"{where}.tool_calls must be a list")
            calls = tuple(
                _parse_tool_call(call, f"{where}.tool_calls[{n}]")
                for n, call in enumerate(raw_calls)
            )
            text = _text_field(message, "content", where, optional=bool(calls))
            turns.append(AssistantTurn(text, calls))
        else:
            call_id = _text_field(message, "tool_call_id", where, optional=False)
            if not call_id:
                raise _bad_request(f"{where}.tool_call_id must not be empty")
            is_error = message.get("is_error", False)
            if not isinstance(is_error, bool):
                raise _bad_request(f"{where}.is_error must be a bool")
            text = _text_field(message, "content", where, optional=False)
            turns.append(ToolResultTurn(call_id, text, is_error))
    return turns


def parse_tools(tools_schema: Sequence[Mapping[str, Any]]) -> list[ToolSpec]:
    """Validate neutral ``{"name", "description", "parameters"}`` tool entries."""
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools_schema):
        where = f"tools_schema[{index}]"
        if not isinstance(tool, Mapping):
            raise _bad_request(f"{where} must be a dict, got {type(tool).__name__}")
        unknown = set(tool) - _TOOL_KEYS
        if unknown:
            raise _bad_request(f"{where} has unsupported keys {sorted(unknown)}")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad_request(f"{where}.name must be a non-empty string")
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise _bad_request(f"{where}.description must be a string")
        parameters = tool.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, Mapping):
            raise _bad_request(f"{where}.parameters must be a JSON Schema object")
        specs.append(ToolSpec(name, description, parameters))
    return specs


def merge_sampling_params(
    body: dict[str, Any], sampling_params: Mapping[str, Any], provider: str
) -> dict[str, Any]:
    """Add provider-native sampling fields to ``body``; they may not replace what it holds."""
    clash = sorted(key for key in sampling_params if key in body)
    if clash:
        raise _bad_request(f"sampling_params may not set {clash}: the {provider} provider does")
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


def parse_retry_after(headers: httpx.Headers, *, now: float) -> float | None:
    """Seconds to wait per ``Retry-After`` (seconds or HTTP-date) or ``retry-after-ms``.

    ``now`` is the wall-clock time (``time.time()``) an HTTP-date is measured against.
    Returns ``None`` when the headers say nothing usable.
    """
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


def _redact(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, _REDACTED)
    return _KEY_LIKE.sub(_REDACTED, text)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_LIMIT else text[:_EXCERPT_LIMIT] + "..."


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
    return _shorten(_redact(text, secret))


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


class JsonHttpProvider(ABC):
    """Base of the HTTP providers: configuration, a per-event-loop client, POST and error mapping.

    The API key is read from the environment at call time and never stored, so it cannot end
    up in a pickle, a ``repr`` or an error message. The ``httpx.AsyncClient`` is created lazily
    for the running event loop and is never pickled; each loop gets its own, closed by
    :meth:`aclose` or when ``asyncio.run`` shuts that loop down, so an instance is safe to
    reuse across loops and processes.
    """

    provider_name: str = ""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None,
        connect_timeout_s: float,
        read_timeout_s: float,
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
    @abstractmethod
    def url(self) -> str:
        """Return the full URL requests are POSTed to."""

    @abstractmethod
    def build_body(self, request: LlmRequest) -> dict[str, Any]:
        """Build the provider's JSON request body for ``request``; bad input raises clearly."""

    @abstractmethod
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Return the headers that authenticate (and version) a request."""

    @abstractmethod
    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild the neutral :class:`LlmResponse` from a raw response body."""

    def model_for(self, request: LlmRequest) -> str:
        """Return the model a request goes to: its ``model_id``, else the provider's default."""
        model = request.model_id or self.model
        if not model:
            raise _bad_request(
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
            raise _bad_request(f"the request body is not JSON-serialisable: {exc}") from None
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
                f"{self.provider_name}: the API key environment variable {self.api_key_env!r} "
                "is not set (pass api_key_env=None for a server that needs no key)"
            )
        return api_key

    async def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            # A client's connections belong to the loop it first ran on; one per live loop.
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
        # Starting the generator registers it with the loop's async-generator hooks, so
        # asyncio.run() (loop.shutdown_asyncgens()) closes the client when the loop ends.
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
        where = f"{self.provider_name} POST {self.url}"
        try:
            response = await (await self._client()).post(self.url, content=payload, headers=headers)
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{where} timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            detail = _redact(str(exc), api_key)
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
