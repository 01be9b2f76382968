"""What an agent is and what it returns.

An agent is a module-level ``async def agent(ctx: ActivationContext) -> Complete | Suspend``.
It returns :class:`Complete` when it is done, or :class:`Suspend` to wait for the results of
the intents it staged (and for approvals). ``intent_id_for`` and ``FallbackContext`` are
re-exported here from ``core.ids`` and ``beam_agents.hitl``, where they live.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from beam_agents.core.ids import INTENT_NAMESPACE, intent_id_for
from beam_agents.hitl import FallbackContext

if TYPE_CHECKING:
    from beam_agents.core.context import ActivationContext

__all__ = [
    "INTENT_NAMESPACE",
    "AgentFn",
    "Complete",
    "FallbackContext",
    "Outcome",
    "Suspend",
    "intent_id_for",
]


@dataclass(frozen=True, slots=True)
class Complete:
    """The run is finished; a non-empty ``output`` is emitted on ``RunAgentOutputs.output``."""

    output: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.output, bytes):
            raise TypeError(
                f"Complete.output must be bytes, got {type(self.output).__name__}; "
                "encode text with .encode() or structured data with canonical_json_bytes() "
                "(`from beam_agents import canonical_json_bytes`)"
            )


@dataclass(frozen=True, slots=True)
class Suspend:
    """Persist the run and wait for results of the intents it is waiting on.

    ``snapshot`` comes back as ``ctx.snapshot`` when the run resumes; ``adapter`` names the
    framework adapter that wrote it (empty for plain agents). ``timeout_ms`` overrides the
    HITL policy's timeout: after that much processing time without being resumed, the policy's
    timeout route is taken (with no policy, the run is dropped to ``.errors``).
    """

    snapshot: bytes = b""
    adapter: str = ""
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot, bytes):
            raise TypeError(f"Suspend.snapshot must be bytes, got {type(self.snapshot).__name__}")
        if not isinstance(self.adapter, str):
            raise TypeError(f"Suspend.adapter must be str, got {type(self.adapter).__name__}")
        if self.timeout_ms is not None and (
            isinstance(self.timeout_ms, bool)
            or not isinstance(self.timeout_ms, int)
            or self.timeout_ms <= 0
        ):
            raise ValueError(
                f"Suspend.timeout_ms must be a positive int of milliseconds or None, "
                f"got {self.timeout_ms!r}"
            )


Outcome: TypeAlias = Complete | Suspend
"""What an agent returns."""

AgentFn: TypeAlias = Callable[["ActivationContext"], Coroutine[Any, Any, Outcome]]
"""The shape of an agent: ``async def agent(ctx) -> Complete | Suspend``."""


def is_agent(candidate: object) -> bool:
    """Whether ``candidate`` is an agent: ``async def agent(ctx)``, or an object calling as one.

    The object form is how framework adapters (``beam_agents.adapters``) are passed.
    """
    if inspect.iscoroutinefunction(candidate):
        return True
    if isinstance(candidate, type):
        return False
    return inspect.iscoroutinefunction(getattr(candidate, "__call__", None))  # noqa: B004
