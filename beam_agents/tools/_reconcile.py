"""``Reconciled`` and the reconciler's shape: asking the outside world whether an effect happened.

A side-effecting tool may register a reconciler with ``@some_tool.reconciler``. When the
effector finds an intent whose execution started but has no recorded result (its process
crashed, or its lease ran out), it calls the reconciler before it would execute the tool again:
``Reconciled(value)`` means the effect already happened and ``value`` is recorded as the
tool's result; ``None`` means it did not, and the tool is executed. See
``beam_agents/tools/README.md`` and ``effector/README.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from beam_agents.tools._intent import IntentInfo
from beam_agents.tools.errors import ToolDefinitionError


@dataclass(frozen=True, slots=True)
class Reconciled:
    """The effect of an intent already happened; ``value`` is what the tool would have returned.

    ``value`` must be JSON-encodable, like a tool's return value: the effector records its
    canonical JSON as the intent's OK result, without executing the tool.
    """

    value: Any = None


Reconciler = Callable[
    [IntentInfo, dict[str, Any]], "Reconciled | Awaitable[Reconciled | None] | None"
]
"""``(intent, args) -> Reconciled | None``, sync or async; ``args`` are the validated arguments."""


def checked_reconciler(function: object, tool_name: str) -> Reconciler:
    """Return ``function`` if it can be called as ``function(intent, args)``; else raise.

    Raises ``ToolDefinitionError`` naming the tool when ``function`` is not callable or its
    signature cannot take two positional arguments.
    """
    if not callable(function):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: a reconciler must be a function, got {type(function).__name__}",
            tool_name=tool_name,
        )
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: a reconciler is called as reconciler(intent, args); "
            f"{getattr(function, '__qualname__', function)!r} cannot take those two arguments",
            tool_name=tool_name,
        ) from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    return function
