"""The model-call contract: requests, responses, provider errors, the neutral message format."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Protocol

__all__ = [
    "CompletesRequests",
    "LlmRequest",
    "LlmResponse",
    "ModelClient",
    "ProviderError",
    "ProviderRequestError",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RateLimitError",
    "ServerError",
    "TokenUsage",
    "ToolCall",
    "as_model_client",
    "decode_plain",
    "decode_with",
]

# -- provider errors ------------------------------------------------------------------------


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
    """The call timed out or the connection broke off; retried."""

    retryable = True


class ProviderUnavailable(ProviderTimeout):
    """The provider could not be reached (refused, DNS failure, no route); a timeout, retried."""

    retryable = True


class ProviderRequestError(ProviderError):
    """The provider rejected the request itself (other HTTP 4xx, undecodable body); not retried."""

    retryable = False

    def __init__(self, message: str = "bad request", *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


# Built once: ``json.dumps`` with any non-default option builds a new encoder on every call.
_REQUEST_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)
_encode = _REQUEST_ENCODER.encode


def _messages_json(messages: Sequence[Mapping[str, Any]]) -> str:
    """``messages`` as :data:`_REQUEST_ENCODER` writes them, plain ones without it.

    A message of a role and a text is spelled at once: the encoder, set up anew per call and
    sorting every mapping, costs ten times as much.
    """
    parts = []
    for message in messages:
        if type(message) is not dict or len(message) != 2:
            return _encode(list(messages))
        role = message.get("role")
        content = message.get("content")
        if type(role) is not str or type(content) is not str:
            return _encode(list(messages))
        parts.append(f'{{"content":{encode_basestring(content)},"role":{encode_basestring(role)}}}')
    return f"[{','.join(parts)}]"


@dataclass(frozen=True, init=False)
class LlmRequest:
    """One model call: the model, the conversation, the tools offered and sampling settings.

    ``messages`` are neutral message mappings (``docs/models.md``); a plain string stands for
    a user message, and a lone string for a conversation of one. ``None`` for ``tools_schema``
    or ``sampling_params`` means none. The request keeps the normalized forms, so either
    spelling is sent, and keyed in the replay cache, alike.
    """

    model_id: str
    messages: Sequence[Mapping[str, Any]]
    tools_schema: Sequence[Mapping[str, Any]]
    sampling_params: Mapping[str, Any]

    def __init__(
        self,
        model_id: str,
        messages: str | Sequence[Mapping[str, Any] | str] = (),
        tools_schema: Sequence[Mapping[str, Any]] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
    ) -> None:
        object.__setattr__(self, "model_id", model_id)
        object.__setattr__(self, "messages", _neutral_messages(messages))
        object.__setattr__(self, "tools_schema", () if tools_schema is None else tools_schema)
        object.__setattr__(
            self, "sampling_params", {} if sampling_params is None else sampling_params
        )

    def canonical_json(self) -> str:
        """The request as canonical JSON (sorted keys, compact), the basis of its cache key."""
        model_id = self.model_id
        return "".join(
            (
                '{"messages":',
                _messages_json(self.messages),
                ',"model_id":',
                encode_basestring(model_id) if type(model_id) is str else _encode(model_id),
                ',"sampling_params":',
                _encode(dict(self.sampling_params)) if self.sampling_params else "{}",
                ',"tools_schema":',
                _encode(list(self.tools_schema)) if self.tools_schema else "[]",
                "}",
            )
        )

    def content_digest(self) -> str:
        """A SHA-256 hex digest of :meth:`canonical_json`."""
        return self.canonical_json_and_digest()[1]

    def canonical_json_and_digest(self) -> tuple[str, str]:
        """:meth:`canonical_json` and its :meth:`content_digest`, the JSON encoded once."""
        text = self.canonical_json()
        return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def user_message(text: str) -> dict[str, str]:
    """The neutral message a plain string in ``LlmRequest.messages`` stands for."""
    return {"role": "user", "content": text}


def tool_message(tool_call_id: str, content: str, is_error: bool = False) -> dict[str, Any]:
    """The neutral ``tool`` message answering the call ``tool_call_id``."""
    message: dict[str, Any] = {"role": "tool", "tool_call_id": tool_call_id, "content": content}
    if is_error:
        message["is_error"] = True
    return message


def _neutral_messages(
    messages: str | Sequence[Mapping[str, Any] | str],
) -> Sequence[Mapping[str, Any]]:
    if isinstance(messages, str):
        return [user_message(messages)]
    if not any(isinstance(message, str) for message in messages):
        return messages  # type: ignore[return-value]  # no strings: only mappings remain
    converted = [user_message(m) if isinstance(m, str) else m for m in messages]
    return converted if isinstance(messages, list) else tuple(converted)


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for: provider-assigned id, tool name and decoded arguments."""

    id: str
    name: str
    arguments: Mapping[str, Any]


# The responses and usages below are built once per model call: each sets its fields with one
# call instead of the one ``object.__setattr__`` per field of a generated frozen ``__init__``.
_set_fields = object.__setattr__


@dataclass(frozen=True, init=False)
class TokenUsage:
    """Tokens the provider reports for one call."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __init__(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        _set_fields(
            self, "__dict__", {"input_tokens": input_tokens, "output_tokens": output_tokens}
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


_NO_USAGE = TokenUsage()
"""The usage of a response that reports none."""


@dataclass(frozen=True, init=False)
class LlmResponse:
    """A provider's answer: the raw body (what the replay cache stores) and its decoded parts."""

    response: bytes
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = ""
    usage: TokenUsage = _NO_USAGE
    model: str = ""

    def __init__(
        self,
        response: bytes,
        text: str = "",
        tool_calls: tuple[ToolCall, ...] = (),
        stop_reason: str = "",
        usage: TokenUsage = _NO_USAGE,
        model: str = "",
    ) -> None:
        _set_fields(
            self,
            "__dict__",
            {
                "response": response,
                "text": text,
                "tool_calls": tool_calls,
                "stop_reason": stop_reason,
                "usage": usage,
                "model": model,
            },
        )


def decode_plain(raw: bytes) -> LlmResponse:
    """Decode a raw body that is plain text: the default :meth:`ModelClient.decode`."""
    return LlmResponse(response=raw, text=raw.decode("utf-8", errors="replace"))


class ModelClient(ABC):
    """The base of model clients: every hook the runtime uses, each with its default.

    Only :meth:`complete` is required; any object with ``async complete(request)`` also serves.
    """

    needs_asyncio_task: bool = True
    """Whether :meth:`complete` must run inside an ``asyncio.Task``, as HTTP clients must."""

    model: str = ""
    """The model a request with an empty ``model_id`` goes to. Default ``""``."""

    @property
    def gen_ai_provider_name(self) -> str:
        """The ``gen_ai.provider.name`` the runtime traces calls with. Default: the class name."""
        return type(self).__name__

    @abstractmethod
    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Send ``request`` to the model and return its decoded response. Required."""

    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild a response from its stored raw body (replays). Default: :func:`decode_plain`."""
        return decode_plain(raw)

    def endpoint_key(self, request: LlmRequest) -> str:
        """The circuit-breaker key of ``request``. Default: ``{class qualname}#{model_id}``."""
        return f"{type(self).__qualname__}#{request.model_id}"

    async def aclose(self) -> None:
        """Release what the client holds (connections) at teardown. Default: nothing to do."""
        return


class CompletesRequests(Protocol):
    """A model client as ``AgentConfig.provider_factory`` returns it (``async complete``)."""

    async def complete(self, request: LlmRequest, /) -> LlmResponse:
        """Send ``request`` to the model and return its decoded response."""
        ...


def as_model_client(client: object) -> ModelClient:
    """``client`` itself if it is a :class:`ModelClient` with sound hooks, else adapted to one."""
    if isinstance(client, ModelClient):
        _check_hook(client, "needs_asyncio_task", bool)
        _check_hook(client, "gen_ai_provider_name", str)
        return client
    if not callable(getattr(client, "complete", None)):
        raise TypeError(f"{type(client).__name__} has no `async complete(request)` method")
    return _AdaptedClient(client)


def _check_hook(client: ModelClient, hook: str, kind: type) -> None:
    value = getattr(client, hook)
    if not isinstance(value, kind):
        raise TypeError(
            f"{type(client).__name__}.{hook} must be a {kind.__name__}, got {type(value).__name__}"
        )


def response_problem(response: object) -> str | None:
    """What is wrong with what ``complete`` returned (``None``: a sound :class:`LlmResponse`)."""
    if isinstance(response, LlmResponse):  # the usual answer, checked in one expression
        usage = response.usage
        if (
            isinstance(response.response, bytes)
            and isinstance(response.text, str)
            and isinstance(response.tool_calls, tuple)
            and isinstance(response.stop_reason, str)
            and isinstance(response.model, str)
            and isinstance(usage, TokenUsage)
            and type(usage.input_tokens) is int
            and type(usage.output_tokens) is int
        ):
            return None
    return _field_problem(response)


def _field_problem(response: object) -> str | None:
    if not isinstance(response, LlmResponse):
        return f"{type(response).__name__}, not an LlmResponse"
    for name, kind in _RESPONSE_FIELDS:
        value = getattr(response, name)
        if not isinstance(value, kind):
            return f"an LlmResponse whose {name} is {type(value).__name__}, not {kind.__name__}"
    usage = response.usage
    for name in ("input_tokens", "output_tokens"):
        count = getattr(usage, name)
        if isinstance(count, bool) or not isinstance(count, int):
            return f"an LlmResponse whose usage.{name} is {type(count).__name__}, not int"
    return None


_RESPONSE_FIELDS = (
    ("response", bytes),
    ("text", str),
    ("tool_calls", tuple),
    ("stop_reason", str),
    ("usage", TokenUsage),
    ("model", str),
)


def underlying(client: ModelClient) -> object:
    """The object :func:`as_model_client` adapted into ``client``, or ``client`` itself."""
    return client.wrapped if isinstance(client, _AdaptedClient) else client


def decode_with(client: object, raw: bytes) -> LlmResponse:
    """Rebuild an :class:`LlmResponse` from a stored raw body using ``client``'s decoder."""
    adapted = client if isinstance(client, ModelClient) else _AdaptedClient(client)
    response = adapted.decode(raw)
    if not isinstance(response, LlmResponse):
        raise TypeError(f"{type(underlying(adapted)).__name__}.decode must return an LlmResponse")
    return response


class _AdaptedClient(ModelClient):
    """A client that does not subclass :class:`ModelClient`, seen through its hooks."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        declared = getattr(wrapped, "gen_ai_provider_name", None)
        self._provider_name = (
            declared if isinstance(declared, str) and declared else type(wrapped).__name__
        )
        self.needs_asyncio_task = getattr(wrapped, "needs_asyncio_task", True) is not False
        decode = getattr(wrapped, "decode", None)
        self._decode: Callable[[bytes], LlmResponse] = decode if callable(decode) else decode_plain
        endpoint_key = getattr(wrapped, "endpoint_key", None)
        self._endpoint_key: Callable[[LlmRequest], str] | None = (
            endpoint_key if callable(endpoint_key) else None
        )

    @property
    def gen_ai_provider_name(self) -> str:
        return self._provider_name

    @property
    def model(self) -> str:
        model = getattr(self.wrapped, "model", "")
        return model if isinstance(model, str) else ""

    @model.setter
    def model(self, value: str) -> None:
        self.wrapped.model = value

    def complete(self, request: LlmRequest) -> Coroutine[Any, Any, LlmResponse]:
        return self.wrapped.complete(request)  # type: ignore[no-any-return]

    def decode(self, raw: bytes) -> LlmResponse:
        return self._decode(raw)

    def endpoint_key(self, request: LlmRequest) -> str:
        if self._endpoint_key is not None:
            return self._endpoint_key(request)
        return f"{type(self.wrapped).__qualname__}#{request.model_id}"

    async def aclose(self) -> None:
        aclose = getattr(self.wrapped, "aclose", None)
        if callable(aclose):
            await aclose()


# -- the neutral message format ------------------------------------------------------------
@dataclass(frozen=True)
class SystemTurn:
    text: str


@dataclass(frozen=True)
class UserTurn:
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


def invalid_request(message: str) -> ProviderRequestError:
    """The error for a request that cannot be sent as it is."""
    return ProviderRequestError(f"invalid request: {message}")


def parse_messages(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """Validate neutral messages and turn them into typed turns; bad shapes raise clearly."""
    turns: list[Turn] = []
    for where, message in _dicts(messages, "messages"):
        role = message.get("role")
        allowed = _ALLOWED_KEYS.get(role) if isinstance(role, str) else None
        if allowed is None:
            raise invalid_request(
                f"{where}.role must be one of {sorted(_ALLOWED_KEYS)}, got {role!r}"
            )
        _refuse_unknown_keys(message, allowed, f"{where} ({role})")
        if role == "system":
            turns.append(SystemTurn(_text_field(message, "content", where, optional=False)))
        elif role == "user":
            turns.append(UserTurn(_text_field(message, "content", where, optional=False)))
        elif role == "assistant":
            turns.append(_assistant_turn(message, where))
        else:
            turns.append(_tool_result_turn(message, where))
    return turns


def parse_tools(tools_schema: Sequence[Mapping[str, Any]]) -> list[ToolSpec]:
    """Validate neutral ``{"name", "description", "parameters"}`` tool entries."""
    specs: list[ToolSpec] = []
    for where, tool in _dicts(tools_schema, "tools_schema"):
        _refuse_unknown_keys(tool, _TOOL_KEYS, where)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"{where}.name must be a non-empty string")
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise invalid_request(f"{where}.description must be a string")
        parameters = tool.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, Mapping):
            raise invalid_request(f"{where}.parameters must be a JSON Schema object")
        specs.append(ToolSpec(name, description, parameters))
    return specs


def _dicts(entries: Sequence[Any], name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for index, entry in enumerate(entries):
        where = f"{name}[{index}]"
        if not isinstance(entry, Mapping):
            raise invalid_request(f"{where} must be a dict, got {type(entry).__name__}")
        yield where, entry


def _refuse_unknown_keys(entry: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = set(entry) - allowed
    if unknown:
        raise invalid_request(f"{where} has unsupported keys {sorted(unknown)}")


def _text_field(message: Mapping[str, Any], key: str, where: str, *, optional: bool) -> str:
    value = message.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise invalid_request(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _assistant_turn(message: Mapping[str, Any], where: str) -> AssistantTurn:
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, str | bytes):
        raise invalid_request(f"{where}.tool_calls must be a list")
    calls = tuple(
        _parse_tool_call(call, f"{where}.tool_calls[{n}]") for n, call in enumerate(raw_calls)
    )
    return AssistantTurn(_text_field(message, "content", where, optional=bool(calls)), calls)


def _tool_result_turn(message: Mapping[str, Any], where: str) -> ToolResultTurn:
    call_id = _text_field(message, "tool_call_id", where, optional=False)
    if not call_id:
        raise invalid_request(f"{where}.tool_call_id must not be empty")
    is_error = message.get("is_error", False)
    if not isinstance(is_error, bool):
        raise invalid_request(f"{where}.is_error must be a bool")
    return ToolResultTurn(call_id, _text_field(message, "content", where, optional=False), is_error)


def _parse_tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, Mapping) or set(raw) != {"id", "name", "arguments"}:
        raise invalid_request(f"{where} must be a dict with exactly 'id', 'name' and 'arguments'")
    call_id, name, arguments = raw["id"], raw["name"], raw["arguments"]
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"{where}.id must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{where}.name must be a non-empty string")
    if not isinstance(arguments, Mapping):
        raise invalid_request(f"{where}.arguments must be a JSON object (a dict), not a string")
    return ToolCall(id=call_id, name=name, arguments=dict(arguments))
