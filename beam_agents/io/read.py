"""``ReadEnvelopes``: the effector's envelope log as a ``KV[bytes, AgentEnvelope]`` source.

The log is read by a splittable DoFn that long-polls the effector's ``Read`` RPC and defers its
remainder between polls. That one shape serves both topologies in DESIGN.md: on a streaming
runner it is an unbounded source to flatten with the event source; on the DirectRunner it is the
single source that emits the initial events (published to the effector first) and then every
re-injected result and approval, and stops once the effector is idle.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PBegin, PCollection
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from beam_agents._protos import AgentEnvelope, PublishRequest, ReadRequest, StatusRequest
from beam_agents.io.connection import EffectorConnection

# The restriction's end: far beyond any offset the log will reach, so the range is unbounded.
_LOG_END = 2**62
_PUBLISH_CHUNK = 500


class _LogRestrictions(RestrictionProvider):  # type: ignore[misc]
    """One unsplittable offset range per reader: the log is consumed in order."""

    def initial_restriction(self, start_offset: int) -> OffsetRange:
        return OffsetRange(start_offset, _LOG_END)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, start_offset: int, restriction: OffsetRange) -> int:
        return 1

    def split(self, start_offset: int, restriction: OffsetRange) -> Iterator[OffsetRange]:
        yield restriction


class _PublishInitialEventsFn(beam.DoFn):  # type: ignore[misc]
    """Publishes the initial events, then emits the offset the reader starts from."""

    def __init__(
        self, connection: EffectorConnection, events: list[bytes], start_offset: int | None
    ) -> None:
        self._connection = connection
        self._events = events
        self._start_offset = start_offset

    def process(self, _impulse: bytes) -> Iterator[int]:
        if not self._events:
            yield self._start_offset if self._start_offset is not None else 1
            return
        channel = self._connection.open_channel()
        try:
            stub = self._connection.stub(channel)
            metadata = self._connection.metadata()
            first_offset: int | None = None
            for start in range(0, len(self._events), _PUBLISH_CHUNK):
                chunk = [
                    AgentEnvelope.FromString(raw)
                    for raw in self._events[start : start + _PUBLISH_CHUNK]
                ]
                response = stub.Publish(PublishRequest(envelopes=chunk), metadata=metadata)
                if first_offset is None and response.offsets:
                    first_offset = response.offsets[0]
        finally:
            channel.close()
        assert first_offset is not None
        yield first_offset if self._start_offset is None else self._start_offset


@beam.DoFn.unbounded_per_element()
class _ReadLogFn(beam.DoFn):  # type: ignore[misc]
    """Long-polls the envelope log from the restriction's start; defers between polls."""

    def __init__(
        self,
        connection: EffectorConnection,
        max_batch: int,
        poll_wait_ms: int,
        stop_when_idle_s: float | None,
        watermark_lag_s: float,
    ) -> None:
        self._connection = connection
        self._max_batch = max_batch
        self._poll_wait_ms = poll_wait_ms
        self._stop_when_idle_s = stop_when_idle_s
        self._watermark_lag = Duration.of(watermark_lag_s)
        self._read = Metrics.counter("beam_agents.io", "envelopes_read")

    def setup(self) -> None:
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)
        self._metadata = self._connection.metadata()
        self._idle_since: float | None = None

    def teardown(self) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def process(
        self,
        start_offset: int,
        tracker: Any = beam.DoFn.RestrictionParam(_LogRestrictions()),
        watermark: Any = beam.DoFn.WatermarkEstimatorParam(
            ManualWatermarkEstimator.default_provider()
        ),
    ) -> Iterator[Any]:
        position = tracker.current_restriction().start
        response = self._stub.Read(
            ReadRequest(
                from_offset=position, max_batch=self._max_batch, wait_ms=self._poll_wait_ms
            ),
            metadata=self._metadata,
        )
        newest: Timestamp | None = None
        for record in response.records:
            if not tracker.try_claim(record.offset):
                return
            envelope = record.envelope
            timestamp = Timestamp.of(envelope.event_time_ms / 1000.0)
            newest = timestamp if newest is None else max(newest, timestamp)
            self._read.inc()
            yield TimestampedValue((envelope.entity_key, envelope), timestamp)
        if newest is not None:
            self._idle_since = None
            self._advance_watermark(watermark, newest - self._watermark_lag)
        elif self._effector_is_idle():
            tracker.try_claim(_LOG_END)
            return
        tracker.defer_remainder(Duration.of(0))

    def _advance_watermark(self, watermark: Any, candidate: Timestamp) -> None:
        current = watermark.current_watermark()
        if current is None or candidate > current:
            watermark.set_watermark(candidate)

    def _effector_is_idle(self) -> bool:
        """Whether to stop: told to, nothing arrived for long enough, and nothing in flight."""
        if self._stop_when_idle_s is None:
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
            return False
        if now - self._idle_since < self._stop_when_idle_s:
            return False
        status = self._stub.Status(StatusRequest(), metadata=self._metadata)
        if status.in_flight > 0:
            return False
        return True


class ReadEnvelopes(beam.PTransform):  # type: ignore[misc]
    """Read the effector's envelope log as ``KV[bytes, AgentEnvelope]``, timestamped by event time.

    - ``events``: initial events to publish to the effector before reading; the reader then
      starts at the first of them, so the output is those events followed by every envelope
      appended after them (tool results, approvals). This is the DirectRunner's single-source
      shape.
    - ``start_offset``: where to start reading (default: the first published event, or 1 when
      there are no events). On streaming runners the reader's position is checkpointed by the
      runner; across pipeline restarts pass the offset to resume from.
    - ``stop_when_idle_s``: stop once nothing new arrived for this long and the effector has
      nothing in flight (no pending, running or awaiting-decision intents). ``None`` (default)
      reads forever, as a streaming source should.
    - ``watermark_lag_s``: the watermark trails the newest event time read by this much.

    A duplicate delivery (after a retry or a redelivered result) is harmless: ``RunAgent``
    refuses a result it has already applied.
    """

    def __init__(
        self,
        target: str | EffectorConnection,
        *,
        events: Iterable[AgentEnvelope] | None = None,
        start_offset: int | None = None,
        stop_when_idle_s: float | None = None,
        max_batch: int = 500,
        poll_wait_ms: int = 200,
        watermark_lag_s: float = 60.0,
        token: str | None = None,
        token_env: str | None = None,
        tls_root_cert: str | None = None,
    ) -> None:
        super().__init__()
        if start_offset is not None and start_offset < 1:
            raise ValueError(f"start_offset counts from 1, got {start_offset}")
        if stop_when_idle_s is not None and stop_when_idle_s <= 0:
            raise ValueError("stop_when_idle_s must be positive (or None to read forever)")
        if max_batch < 1 or poll_wait_ms < 0:
            raise ValueError("need max_batch >= 1 and poll_wait_ms >= 0")
        encoded: list[bytes] = []
        for envelope in events or ():
            if not isinstance(envelope, AgentEnvelope):
                raise ValueError(f"events must be AgentEnvelopes, got {type(envelope).__name__}")
            if not envelope.entity_key:
                raise ValueError("every event needs a non-empty entity_key")
            encoded.append(envelope.SerializeToString())
        self._connection = (
            target
            if isinstance(target, EffectorConnection)
            else EffectorConnection(
                target, token=token, token_env=token_env, tls_root_cert=tls_root_cert
            )
        )
        self._events = encoded
        self._start_offset = start_offset
        self._read_fn = _ReadLogFn(
            self._connection, max_batch, poll_wait_ms, stop_when_idle_s, watermark_lag_s
        )

    def expand(self, pbegin: PBegin) -> PCollection[tuple[bytes, AgentEnvelope]]:
        return (
            pbegin
            | "Start" >> beam.Impulse()
            | "Publish"
            >> beam.ParDo(
                _PublishInitialEventsFn(self._connection, self._events, self._start_offset)
            )
            | "ReadLog"
            >> beam.ParDo(self._read_fn).with_output_types(tuple[bytes, AgentEnvelope])
        )
