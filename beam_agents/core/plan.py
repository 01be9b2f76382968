"""``Plan``: what one element or timer firing does to one key, for the Beam glue to apply.

The activation core decides; ``core/dofn.py`` applies. A plan holds the key's staged state
writes (its :class:`~beam_agents.core.state.KeyState`), the timers to set or clear, and the
records to emit on each output.
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import ActivationRecord, AgentError, ToolIntent, TraceEvent
from beam_agents.core.errors import ErrorReason
from beam_agents.core.state import KeyState


class Plan:
    """State writes, timers and outputs of one ``process`` or timer call on one key."""

    __slots__ = (
        "deadline_ms",
        "early",
        "errors",
        "idle_ms",
        "intents",
        "outputs",
        "records",
        "state",
        "traces",
    )

    def __init__(self, state: KeyState) -> None:
        self.state = state
        self.outputs: list[bytes] = []
        self.intents: list[ToolIntent] = []
        self.traces: list[TraceEvent] = []
        self.errors: list[AgentError] = []
        self.records: Sequence[ActivationRecord] = ()
        """One per committed activation, when ``AgentConfig.record`` is on (a shared empty
        tuple when it is off: no list per plan)."""
        self.deadline_ms: int | None = None
        """``None``: leave the deadline timer as it is; ``0``: clear it; else set it (ms)."""
        self.idle_ms: int | None = None
        """``None``: leave the idle timer as it is; else set it (event time, ms)."""
        self.early = False
        """A deadline timer fired before its time and was re-armed: nothing else happened."""


def error_record(
    entity_key: bytes,
    reason: ErrorReason,
    detail: str,
    event_time_ms: int,
    envelope: bytes,
    seq: int,
    *,
    traceback: str = "",
) -> AgentError:
    """An ``.errors`` record.

    ``envelope``: the original envelope's bytes, if any; ``traceback``: that of the exception
    behind the record, if any (``failures.explain``).
    """
    return AgentError(
        entity_key=entity_key,
        reason=reason.value,
        detail=detail,
        event_time_ms=event_time_ms,
        envelope=envelope,
        seq=seq,
        traceback=traceback,
    )
