"""Deterministic trace events for activations.

Every field of a ``TraceEvent`` is a pure function of the key, the run and the event's
position, so a retried or replayed run emits byte-identical traces (ids, parents and times are
described in ``core/README.md``, "Trace events").
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping

from beam_agents._protos import TraceEvent
from beam_agents.core.ids import uuid5_hex

TRACE_NAMESPACE = uuid.UUID("d14e16df-be50-59e9-a710-702fd4f47bff")
"""The uuid5 namespace of trace ids: ``uuid5(NAMESPACE_URL, "urn:beam-agents:trace")``."""

_START = TraceEvent.ACTIVATION_START
_PARENTLESS = frozenset((_START, TraceEvent.ERROR))


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
        "_entity_key",
        "_first_sequence",
        "_now_ms",
        "_root_span",
        "_seq",
        "_trace_id",
        "events",
    )

    def __init__(
        self, entity_key: bytes, seq: int, trace_id: str, first_sequence: int, now_ms: int
    ) -> None:
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

    @property
    def next_sequence(self) -> int:
        """The sequence the run's next event will get."""
        return self._first_sequence + len(self.events)

    def _event(
        self, event_type: int, sequence: int, step_index: int, attributes: Mapping[str, str]
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
        return event

    def record(
        self, event_type: int, step_index: int, attributes: Mapping[str, str] | None = None
    ) -> None:
        """Append an event of ``event_type`` at ``step_index``."""
        events = self.events
        events.append(
            self._event(
                event_type, self._first_sequence + len(events), step_index, attributes or {}
            )
        )

    def failure(self, step_index: int, attributes: Mapping[str, str]) -> TraceEvent:
        """The single ``ERROR`` event that replaces everything a failed activation recorded."""
        return self._event(TraceEvent.ERROR, self._first_sequence, step_index, attributes)
