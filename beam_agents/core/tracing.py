"""Trace events for activations: deterministic identity, wall-clock latency.

Every field of a ``TraceEvent`` but its wall-clock times is a pure function of the key, the
run and the event's position, so a retried or replayed run emits the same spans;
:func:`identity_of` is what such runs share. Ids, parents and times are described in
``core/README.md``, "Trace events".
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping

from beam_agents._protos import TraceEvent
from beam_agents.core.ids import uuid5_hex

TRACE_NAMESPACE = uuid.UUID("d14e16df-be50-59e9-a710-702fd4f47bff")
"""The uuid5 namespace of trace ids: ``uuid5(NAMESPACE_URL, "urn:beam-agents:trace")``."""

_START = TraceEvent.ACTIVATION_START
_PARENTLESS = frozenset((_START, TraceEvent.ERROR))
_CLOSING = frozenset((TraceEvent.SUSPENDED, TraceEvent.ACTIVATION_END))

WallClock = Callable[[], int]
"""Reads the wall clock in Unix nanoseconds (default ``time.time_ns``; tests pass a fixed one)."""

DEADLINE_ATTRIBUTE = "beam_agents.deadline_ms"
"""A ``SUSPENDED`` event's processing-time deadline: read from a clock, so not identity."""
MEMORY_SLOTS_ATTRIBUTE = "beam_agents.memory.slots"
"""The key's memory slot sizes after the activation: a canonical JSON object name -> bytes."""


def identity_of(event: TraceEvent) -> bytes:
    """``event`` serialized without what a retry or replay may change: its wall-clock times.

    That is the two ``wall_*_unix_nano`` fields and :data:`DEADLINE_ATTRIBUTE` (a deadline
    is placed on the processing clock). Equal identities mean the same span, same content.
    """
    kept = TraceEvent()
    kept.CopyFrom(event)
    kept.ClearField("wall_start_unix_nano")
    kept.ClearField("wall_end_unix_nano")
    kept.attributes.pop(DEADLINE_ATTRIBUTE, None)
    return kept.SerializeToString(deterministic=True)


def trace_id_for(entity_key: bytes, seq: int) -> str:
    """The trace id of run ``seq`` of ``entity_key``."""
    return uuid5_hex(TRACE_NAMESPACE, f"{entity_key.hex()}|{seq}")


@functools.lru_cache(maxsize=1024)
def span_id_for(sequence: int, event_type: int) -> str:
    """The span id of the event at ``sequence`` (of type ``event_type``) in its trace.

    Cached: runs are short, so the same few (sequence, type) pairs recur in every trace, and a
    lookup costs a third of formatting the digits.
    """
    return f"{sequence:012x}{event_type:04x}"


_ROOT_SPAN = span_id_for(0, _START)


class TraceRecorder:
    """Collects one activation's trace events; they are emitted only if it commits."""

    __slots__ = (
        "_activation_span",
        "_clock",
        "_entity_key",
        "_first_sequence",
        "_now_ms",
        "_opened",
        "_root_span",
        "_seq",
        "_trace_id",
        "events",
    )

    def __init__(
        self,
        entity_key: bytes,
        seq: int,
        trace_id: str,
        first_sequence: int,
        now_ms: int,
        clock: WallClock = time.time_ns,
    ) -> None:
        self._clock = clock
        self._opened: TraceEvent | None = None
        self._entity_key = entity_key
        self._seq = seq
        self._trace_id = trace_id
        self._first_sequence = first_sequence
        self._now_ms = now_ms
        self._activation_span = (
            _ROOT_SPAN if first_sequence == 0 else span_id_for(first_sequence, _START)
        )
        self._root_span = "" if first_sequence == 0 else _ROOT_SPAN
        self.events: list[TraceEvent] = []

    @property
    def trace_id(self) -> str:
        """The run's trace id."""
        return self._trace_id

    @property
    def entity_key(self) -> bytes:
        """The key of the activation whose events this records."""
        return self._entity_key

    @property
    def seq(self) -> int:
        """The run's seq."""
        return self._seq

    @property
    def now_ms(self) -> int:
        """The activation's event time, the time of every event."""
        return self._now_ms

    def wall_ns(self) -> int:
        """The wall clock now, in Unix nanoseconds: where a timed event starts."""
        return self._clock()

    @property
    def next_sequence(self) -> int:
        """The sequence the run's next event will get."""
        return self._first_sequence + len(self.events)

    def _event(
        self,
        event_type: int,
        sequence: int,
        step_index: int,
        attributes: Mapping[str, str],
        started_ns: int,
        ended_ns: int,
    ) -> TraceEvent:
        # Field by field rather than by keyword: about three times cheaper for these messages,
        # and zero-valued scalars are skipped (proto3 serializes them identically either way).
        event = TraceEvent()
        event.trace_id = self._trace_id
        event.span_id = span_id_for(sequence, event_type)
        parent = self._root_span if event_type in _PARENTLESS else self._activation_span
        if parent:
            event.parent_span_id = parent
        event.entity_key = self._entity_key
        event.seq = self._seq
        if step_index:
            event.step_index = step_index
        event.event_type = event_type  # type: ignore[assignment]
        if attributes:
            # Item by item: the map's inherited ``update`` is a slow pure-Python loop.
            event_attributes = event.attributes
            for name, value in attributes.items():
                event_attributes[name] = value
        event.start_ms = event.end_ms = self._now_ms
        if sequence:
            event.sequence = sequence
        event.wall_start_unix_nano = started_ns
        event.wall_end_unix_nano = ended_ns
        return event

    def record(
        self,
        event_type: int,
        step_index: int,
        attributes: Mapping[str, str] | None = None,
        started_ns: int = 0,
    ) -> None:
        """Append an event of ``event_type`` at ``step_index``, ending now.

        It spans ``started_ns`` (a :meth:`wall_ns` reading) to now; without one it is an
        instant. ``ACTIVATION_START`` stays open until ``SUSPENDED`` or ``ACTIVATION_END``.
        """
        events = self.events
        now = self._clock()
        event = self._event(
            event_type,
            self._first_sequence + len(events),
            step_index,
            attributes or {},
            started_ns or now,
            now,
        )
        events.append(event)
        if event_type == _START:
            self._opened = event
        elif event_type in _CLOSING and self._opened is not None:
            self._opened.wall_end_unix_nano = now

    def record_tool_call(self, name: str, step_index: int, started_ns: int, error: str) -> None:
        """Append a ``TOOL_CALL`` of the inline tool ``name`` (``error``: its failure's type).

        Its ``gen_ai.tool.call.id`` is the trace id and the event's position in the run.
        """
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": f"call_{self._trace_id}_{self.next_sequence}",
            "tool_name": name,
            "status": "error" if error else "ok",
        }
        if error:
            attributes["error"] = error
        self.record(TraceEvent.TOOL_CALL, step_index, attributes, started_ns)

    def failure(self, step_index: int, attributes: Mapping[str, str]) -> TraceEvent:
        """The single ``ERROR`` event that replaces everything a failed activation recorded.

        It spans the failed activation: from its ``ACTIVATION_START`` to now.
        """
        now = self._clock()
        opened = self._opened
        started_ns = now if opened is None else opened.wall_start_unix_nano
        return self._event(
            TraceEvent.ERROR, self._first_sequence, step_index, attributes, started_ns, now
        )
