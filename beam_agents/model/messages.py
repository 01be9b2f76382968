"""The provider-neutral message format of ``LlmRequest.messages`` and ``tools_schema``.

:func:`parse_messages` and :func:`parse_tools` validate the neutral dicts and turn them into
typed turns and tool specs, which each wire format encodes; a bad shape raises
``ProviderRequestError`` before a byte is sent. The format itself is described in
``beam_agents/model/README.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from beam_agents.model.client import ToolCall
from beam_agents.model.errors import ProviderRequestError


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
    """Each of ``entries`` with where it stands (``name[index]``); a non-dict raises."""
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
