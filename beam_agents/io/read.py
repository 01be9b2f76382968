# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``ReadEnvelopes``: the effector's envelope log as a ``KV[bytes, AgentEnvelope]`` source.

A splittable DoFn over an unbounded offset range long-polls the effector's ``Read`` RPC. The
same shape is an unbounded source on a streaming runner and the single source that closes the
loop on a local runner; see ``beam_agents/io/README.md``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import grpc
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PBegin, PCollection
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from beam_agents._protos import AgentEnvelope, PublishRequest, ReadRequest, StatusRequest
from beam_agents.io.connection import (
    _MAX_MESSAGE_BYTES,
    EffectorConnection,
    _call_failure,
    _connection,
    _describe,
    _is_transient,
)
from beam_agents.io.local_runner import prefer_fn_api_runner

_log = logging.getLogger(__name__)

_METRICS_NAMESPACE = "beam_agents.io"
_LOG_END = 2**62
"""The restriction's end: beyond any offset the log will reach, so the range is unbounded."""
_PUBLISH_MAX_ENVELOPES = 500
_PUBLISH_MAX_BYTES = 4 * 1024 * 1024
_MAX_EVENT_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024
"""An event larger than this cannot be published at all (with room for the request's framing)."""
_RPC_TIMEOUT_S = 30.0
_MAX_POLL_WAIT_MS = 60_000
"""The effector waits at most this long in one Read."""
_RETRY_INITIAL_S = 0.1
_RETRY_MAX_S = 5.0


class _LogRestrictions(RestrictionProvider):
    """One unsplittable offset range per reader: the log is consumed in order."""

    def initial_restriction(self, start_offset: int) -> OffsetRange:
        """From the start offset to (practically) forever."""
        return OffsetRange(start_offset, _LOG_END)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        """Claims offsets in increasing order."""
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, start_offset: int, restriction: OffsetRange) -> int:
        """Unknown, and never split: report one unit of work."""
        return 1

    def split(self, start_offset: int, restriction: OffsetRange) -> Iterator[OffsetRange]:
        """Never split up front: one reader per log."""
        yield restriction


def _publish_chunks(events: list[bytes]) -> Iterator[list[AgentEnvelope]]:
    """Serialized events in Publish-sized chunks (bounded in count and in bytes)."""
    chunk: list[AgentEnvelope] = []
    size = 0
    for raw in events:
        if chunk and (len(chunk) == _PUBLISH_MAX_ENVELOPES or size + len(raw) > _PUBLISH_MAX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(AgentEnvelope.FromString(raw))
        size += len(raw)
    if chunk:
        yield chunk


class _PublishInitialEventsFn(beam.DoFn):
    """Publishes the initial events, then emits the offset the reader starts from."""

    def __init__(
        self, connection: EffectorConnection, events: list[bytes], start_offset: int | None
    ) -> None:
        self._connection = connection
        self._events = events
        self._start_offset = start_offset

    def process(self, _impulse: bytes) -> Iterator[int]:
        """Publish (if there are events) and emit the first offset to read."""
        first_published = 1
        if self._events:
            first_published = self._publish()
        yield first_published if self._start_offset is None else self._start_offset

    def _publish(self) -> int:
        metadata = self._connection.metadata()
        channel = self._connection.open_channel()
        offsets: list[int] = []
        try:
            stub = self._connection.stub(channel)
            for chunk in _publish_chunks(self._events):
                response = stub.Publish(
                    PublishRequest(envelopes=chunk), timeout=_RPC_TIMEOUT_S, metadata=metadata
                )
                offsets.extend(response.offsets)
        except grpc.RpcError as error:
            raise _call_failure(
                f"publishing the initial events ({len(offsets)} of {len(self._events)} done)",
                self._connection.target,
                error,
            ) from error
        finally:
            channel.close()
        return offsets[0]


_TRACKER: Any = beam.DoFn.RestrictionParam(_LogRestrictions())
_WATERMARK: Any = beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider())


@beam.DoFn.unbounded_per_element()
class _ReadLogFn(beam.DoFn):
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
        self._read = Metrics.counter(_METRICS_NAMESPACE, "envelopes_read")
        self._retries = Metrics.counter(_METRICS_NAMESPACE, "read_retries")

    def setup(self) -> None:
        """Open the channel; reset the idle clock and the failure count."""
        self._metadata = self._connection.metadata()
        self._channel = self._connection.open_channel()
        self._stub = self._connection.stub(self._channel)
        # Kept on the instance across the deferred remainders it processes: stopping when idle
        # is meant for local runs, where one instance reads the whole log.
        self._idle_since: float | None = None
        self._failures = 0

    def teardown(self) -> None:
        """Close the channel."""
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def process(
        self,
        start_offset: int,
        tracker: Any = _TRACKER,
        watermark: Any = _WATERMARK,
    ) -> Iterator[Any]:
        """One poll: emit what arrived, then defer the rest of the log (or stop when idle)."""
        position = tracker.current_restriction().start
        try:
            response = self._stub.Read(
                ReadRequest(
                    from_offset=position, max_batch=self._max_batch, wait_ms=self._poll_wait_ms
                ),
                timeout=_RPC_TIMEOUT_S + self._poll_wait_ms / 1000,
                metadata=self._metadata,
            )
            stop = not response.records and self._idle_and_drained(position)
        except grpc.RpcError as error:
            self._back_off(error)
            tracker.defer_remainder()
            return
        self._failures = 0
        if stop:
            tracker.try_claim(_LOG_END)
            return
        if response.records:
            self._idle_since = None
        newest: Timestamp | None = None
        for record in response.records:
            if not tracker.try_claim(record.offset):
                return
            envelope = record.envelope
            timestamp = Timestamp(micros=envelope.event_time_ms * 1000)
            newest = timestamp if newest is None else max(newest, timestamp)
            self._read.inc()
            yield TimestampedValue((envelope.entity_key, envelope), timestamp)
        # With nothing to read the reader is at the head of the log, so the watermark may
        # follow the clock; otherwise it follows the newest event time read.
        self._advance_watermark(watermark, (newest or Timestamp.now()) - self._watermark_lag)
        tracker.defer_remainder()

    def _advance_watermark(self, watermark: Any, candidate: Timestamp) -> None:
        current = watermark.current_watermark()
        if current is None or candidate > current:
            watermark.set_watermark(candidate)

    def _idle_and_drained(self, position: int) -> bool:
        """Whether to stop: told to, idle for long enough, nothing in flight, nothing unread."""
        if self._stop_when_idle_s is None:
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self._stop_when_idle_s:
            return False
        status = self._stub.Status(StatusRequest(), timeout=_RPC_TIMEOUT_S, metadata=self._metadata)
        # The store counts before it reads the head, so a result published after the counts
        # shows in the head and is read before stopping.
        return bool(status.in_flight == 0 and status.head_offset < position)

    def _back_off(self, error: grpc.RpcError) -> None:
        if not _is_transient(error):
            raise _call_failure(
                "reading the envelope log", self._connection.target, error
            ) from error
        self._retries.inc()
        delay = min(_RETRY_MAX_S, _RETRY_INITIAL_S * 2**self._failures)
        self._failures += 1
        _log.warning(
            "reading the envelope log at %s failed (%s); retrying in %.1f s",
            self._connection.target,
            _describe(error),
            delay,
        )
        # Slept here rather than requested as a resume delay: local runners resume at once.
        time.sleep(delay)


class ReadEnvelopes(beam.PTransform[PBegin, PCollection[tuple[bytes, AgentEnvelope]]]):
    """Read the effector's envelope log as ``KV[bytes, AgentEnvelope]``, timestamped by event time.

    Each element is ``(envelope.entity_key, envelope)`` with the timestamp
    ``envelope.event_time_ms``, in log (offset) order.

    - ``events``: external events (``external_event`` envelopes, each with an ``entity_key``)
      to publish to the effector before reading; reading then starts at the first of them,
      so the output is those events followed by every envelope appended after them (tool
      results, approvals). This is the single-source shape local runners need to close a loop
      through the effector. They are published once per run of the pipeline.
    - ``start_offset``: where to start reading instead (default: the first published event,
      or 1, the start of the log, when there are no events). On streaming runners the
      reader's position is checkpointed by the runner; across pipeline restarts pass the
      offset to resume from.
    - ``stop_when_idle_s``: stop once nothing new has arrived for this long, the effector has
      nothing in flight (no pending, running or awaiting-decision intents: an approval still
      waiting for a decision keeps the reader going) and everything in the log has been read.
      ``None`` (default) reads forever, as a streaming source should.
    - ``max_batch``: envelopes per ``Read``; ``poll_wait_ms``: how long one ``Read`` waits for
      new envelopes (at most 60 000).
    - ``watermark_lag_s``: the watermark trails the newest event time read (or the wall clock,
      when the whole log has been read) by this much.
    - ``token``, ``token_env``, ``tls_root_cert``: as for :class:`EffectorConnection`; or pass
      an ``EffectorConnection`` as ``target``.

    Reading retries transient failures (the effector restarting) with backoff, indefinitely;
    a wrong token fails the pipeline with ``PermissionError``. A duplicate delivery (after a
    retry, or a redelivered result) is harmless: ``RunAgent`` refuses a result it has already
    applied. Publishing the events is not retried: a ``Publish`` cut off by a failure may
    have been applied, and publishing it again would make every event in it run twice (each
    as a new run, with new intents); the pipeline fails with ``ConnectionError`` instead, and
    running it again is safe (it reads from the events it publishes then, and the effector
    deduplicates the intents they lead to). An event too large for one effector request is
    refused when the transform is built.
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
        tls_root_cert: str | os.PathLike[str] | bytes | None = None,
    ) -> None:
        super().__init__()
        if start_offset is not None and start_offset < 1:
            raise ValueError(f"start_offset counts from 1, got {start_offset}")
        if stop_when_idle_s is not None and stop_when_idle_s <= 0:
            raise ValueError("stop_when_idle_s must be positive (or None to read forever)")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if not 0 <= poll_wait_ms <= _MAX_POLL_WAIT_MS:
            raise ValueError(f"poll_wait_ms must be between 0 and {_MAX_POLL_WAIT_MS}")
        if watermark_lag_s < 0:
            raise ValueError(f"watermark_lag_s must not be negative, got {watermark_lag_s}")
        connection = _connection(target, token, token_env, tls_root_cert)
        self._publish_fn = _PublishInitialEventsFn(
            connection, _encode_events(events or ()), start_offset
        )
        self._read_fn = _ReadLogFn(
            connection, max_batch, poll_wait_ms, stop_when_idle_s, watermark_lag_s
        )

    def expand(self, pbegin: PBegin) -> PCollection[tuple[bytes, AgentEnvelope]]:
        """Impulse → publish the events → read the log from the first one."""
        prefer_fn_api_runner(pbegin.pipeline)
        envelopes: PCollection[tuple[bytes, AgentEnvelope]] = (
            pbegin
            | "Start" >> beam.Impulse()
            | "Publish" >> beam.ParDo(self._publish_fn)
            | "ReadLog" >> beam.ParDo(self._read_fn).with_output_types(tuple[bytes, AgentEnvelope])
        )
        return envelopes


def _encode_events(events: Iterable[AgentEnvelope]) -> list[bytes]:
    encoded: list[bytes] = []
    for position, envelope in enumerate(events):
        if not isinstance(envelope, AgentEnvelope):
            raise ValueError(
                f"events must be AgentEnvelopes; event {position} is a {type(envelope).__name__}"
            )
        if not envelope.entity_key:
            raise ValueError(f"event {position} has an empty entity_key")
        if envelope.WhichOneof("payload") != "external_event":
            raise ValueError(
                f"event {position} is not an external_event envelope: only the effector "
                "publishes tool results and approvals"
            )
        raw = envelope.SerializeToString()
        if len(raw) > _MAX_EVENT_BYTES:
            raise ValueError(
                f"event {position} is {len(raw)} bytes, over the {_MAX_EVENT_BYTES}-byte limit "
                "of one effector request; keep large payloads elsewhere and send a reference"
            )
        encoded.append(raw)
    return encoded
