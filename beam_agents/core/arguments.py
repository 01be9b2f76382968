"""Checking what an agent hands ``act`` and ``request_approval``: TTLs, names and arguments.

Arguments come as JSON text or a mapping and are staged as canonical JSON; a tool name the
registry lacks is refused when it holds side-effecting tools (with a close match), else warned
about once. Split from ``context.py``, whose methods call these.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Mapping
from typing import Any

from beam_agents._protos import canonical_json
from beam_agents.core.errors import ReadOnlyIntentError
from beam_agents.tools import ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolNotFoundError

_log = logging.getLogger("beam_agents.core.context")


def check_ttl(ttl_ms: object) -> int:
    """``ttl_ms`` if it is a positive int; raises ``ValueError`` otherwise."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be a positive int of milliseconds, got {ttl_ms!r}")
    return ttl_ms


def check_unregistered(tool_name: str, registry: ToolRegistry, warned: set[str]) -> None:
    """Refuse ``act`` of a tool the registry lacks if it holds side-effecting ones; else warn.

    A registry without side-effecting tools (the default is empty) cannot say whether the name
    is right, so the intent is staged and its arguments are checked only by the effector; that
    is logged at WARNING once per tool name and runtime instance (``warned``).
    """
    side_effecting = sorted(tool.name for tool in registry if tool.side_effect)
    if side_effecting:
        close = difflib.get_close_matches(tool_name, side_effecting, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ToolNotFoundError(
            f"ctx.act({tool_name!r}, ...): AgentConfig.tool_registry has no tool named "
            f"{tool_name!r} (its side-effecting tools: {', '.join(side_effecting)}){hint}",
            tool_name=tool_name,
        )
    if tool_name not in warned:
        warned.add(tool_name)
        _log.warning(
            "ctx.act(%r, ...) stages intents whose arguments are not validated: "
            "AgentConfig.tool_registry holds no side-effecting tools, so the effector is the "
            "first to check them; register the tool (side_effect=True) to check them here",
            tool_name,
        )


def check_side_effect_call(
    tool_name: str, arguments: dict[str, Any], registry: ToolRegistry, warned: set[str]
) -> None:
    """Check a call ``act`` stages: a registered tool is side-effecting, its arguments valid.

    A read-only tool raises ``ReadOnlyIntentError`` (run it with ``run_tool``), invalid
    arguments ``ToolArgumentError``; a name the registry lacks goes to
    :func:`check_unregistered`.
    """
    if tool_name not in registry:
        check_unregistered(tool_name, registry, warned)
        return
    tool = registry.get(tool_name)
    if not tool.side_effect:
        raise ReadOnlyIntentError(
            f"tool {tool_name!r} is read-only; run it inline with "
            f"await ctx.run_tool({tool_name!r}, arguments) instead of staging an intent",
            tool_name=tool_name,
        )
    tool.validate_arguments(arguments)


def arguments_json(tool_name: str, args: object) -> tuple[dict[str, Any], str]:
    """Parse and canonicalize intent arguments given as JSON text or a mapping."""
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(
                f"arguments for {tool_name!r} are not valid JSON: {exc}", tool_name=tool_name
            ) from None
    elif isinstance(args, Mapping):
        parsed = dict(args)
    else:
        raise ToolArgumentError(
            f"arguments for {tool_name!r} must be a JSON object string or a mapping, "
            f"got {type(args).__name__}",
            tool_name=tool_name,
        )
    if not isinstance(parsed, dict):
        raise ToolArgumentError(
            f"arguments for {tool_name!r} must be a JSON object, got {type(parsed).__name__}",
            tool_name=tool_name,
        )
    try:
        return parsed, canonical_json(parsed)
    except (TypeError, ValueError) as exc:
        raise ToolArgumentError(
            f"arguments for {tool_name!r} are not JSON-encodable: {exc}", tool_name=tool_name
        ) from None
