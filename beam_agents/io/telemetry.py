# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``WriteTraces`` and ``WriteErrors``: store ``.traces`` and ``.errors`` in the effector.

Items go in batches per bundle, sent without stopping the bundle and awaited at its end;
transient failures are retried (safe: the effector stores each span id and error digest once).
Telemetry never fails the pipeline: what cannot be stored (a batch that failed, items the
effector refused as invalid) is counted and logged, one WARNING per bundle with the first
reason. A wrong token fails it, as it does ``SubmitIntents``.
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import grpc
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection
from google.protobuf.message import Message

from beam_agents._protos import (
    AgentError,
    RecordErrorsRequest,
    RecordErrorsResponse,
    RecordTracesRequest,
    RecordTracesResponse,
    TraceEvent,
)
from beam_agents.io.connection import (
    _MAX_MESSAGE_BYTES,
    EffectorConnection,
    _connection,
    _describe,
)
from beam_agents.io.submit import (
    _Backoff,
    _call_with_retries,
    _CallFailedError,
    _check_call_settings,
)

_log = logging.getLogger(__name__)

_METRICS_NAMESPACE = "beam_agents.io"
_MAX_BATCH_SIZE = 1_000
"""The most items one RecordTraces or RecordErrors may carry (the effector's limit)."""
_MAX_BATCH_BYTES = 4 * 1024 * 1024
"""A batch is cut before it grows past this, so requests stay well under the message limit."""
_MAX_ITEM_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024
_MAX_IN_FLIGHT = 4
"""Calls a bundle keeps going while it goes on; it waits for the oldest beyond that."""
_SERVICE = RecordTracesRequest.DESCRIPTOR.file.services_by_name["Effector"].full_name


@dataclass(frozen=True)
class _Sink:
    """What differs between the two sinks: the item type, the RPC and how they are named."""

    transform: str
    item_type: type[Message]
    rpc: str
    """The ``Effector`` stub method."""
    request_type: type[Message]
    field: str
    """The request's repeated field."""
    response_type: type[Message]
    noun: str
    """The items, in log lines (``trace event(s)``)."""
    metric: str
    """The prefix of the sink's counters."""


_TRACES = _Sink(
    transform="WriteTraces",
    item_type=TraceEvent,
    rpc="RecordTraces",
    request_type=RecordTracesRequest,
    field="events",
    response_type=RecordTracesResponse,
    noun="trace event",
    metric="traces",
)
_ERRORS = _Sink(
    transform="WriteErrors",
    item_type=AgentError,
    rpc="RecordErrors",
    request_type=RecordErrorsRequest,
    field="errors",
    response_type=RecordErrorsResponse,
    noun="error record",
    metric="errors",
)


def _varint(value: int) -> bytes:
    """``value`` as a protobuf base-128 varint."""
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


class _RecordFn(beam.DoFn):
    """Buffers items into batches, records each batch, and counts (and logs) what it drops."""

    def __init__(
        self,
        sink: _Sink,
        connection: EffectorConnection,
        batch_size: int,
        backoff: _Backoff,
        rpc_timeout_s: float,
    ) -> None:
        self._sink = sink
        self._connection = connection
        self._batch_size = batch_size
        self._backoff = backoff
        self._rpc_timeout_s = rpc_timeout_s
        self._recorded, self._duplicates, self._dropped, self._retries = (
            Metrics.counter(_METRICS_NAMESPACE, f"{sink.metric}_{name}")
            for name in ("recorded", "duplicate", "dropped", "retries")
        )

    def setup(self) -> None:
        """Open the channel and resolve the token (from the worker's environment, if so told)."""
        self._metadata = self._connection.metadata()
        self._channel = self._connection.open_channel()
        # Requests go as bytes: each item is serialized once, in ``process``, and a batch is
        # the concatenation of its items as entries of the request's repeated field.
        self._call = self._channel.unary_unary(
            f"/{_SERVICE}/{self._sink.rpc}",
            request_serializer=None,
            response_deserializer=self._sink.response_type.FromString,
        )
        field = self._sink.request_type.DESCRIPTOR.fields_by_name[self._sink.field]
        self._tag = _varint(field.number << 3 | 2)  # a length-delimited field
        self._options = {"timeout": self._rpc_timeout_s, "metadata": self._metadata}

    def teardown(self) -> None:
        """Close the channel."""
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()

    def start_bundle(self) -> None:
        """Start an empty batch, no calls in flight and a clean count of drops."""
        self._batch: list[bytes] = []
        self._batch_bytes = 0
        self._in_flight: collections.deque[tuple[int, bytes, grpc.Future]] = collections.deque()
        self._bundle_dropped = 0
        self._drop_reason = ""

    def process(self, item: Any) -> None:
        """Add ``item`` to the batch; send the batch first if it is full."""
        if not isinstance(item, self._sink.item_type):
            self._drop(1, f"not a {self._sink.item_type.__name__}: {type(item).__name__}")
            return
        data = item.SerializeToString()
        size = len(data)
        if size > _MAX_ITEM_BYTES:
            self._drop(1, f"a {self._sink.noun} of {size} bytes is over {_MAX_ITEM_BYTES} bytes")
            return
        if self._batch and self._batch_bytes + size > _MAX_BATCH_BYTES:
            self._send()
        self._batch.append(data)
        self._batch_bytes += size
        if len(self._batch) >= self._batch_size:
            self._send()

    def finish_bundle(self) -> None:
        """Send the rest, wait for every call; log one WARNING if the bundle dropped anything."""
        self._send()
        while self._in_flight:
            self._settle(*self._in_flight.popleft())
        if self._bundle_dropped:
            _log.warning(
                "%s to %s: dropped %d %s(s) that could not be stored; the first: %s",
                self._sink.transform,
                self._connection.target,
                self._bundle_dropped,
                self._sink.noun,
                self._drop_reason,
            )

    def _send(self) -> None:
        """Send the batch without waiting (the bundle goes on meanwhile), a few calls at most."""
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        tag = self._tag
        request = b"".join(part for data in batch for part in (tag, _varint(len(data)), data))
        self._in_flight.append((len(batch), request, self._call.future(request, **self._options)))
        while len(self._in_flight) > _MAX_IN_FLIGHT:
            self._settle(*self._in_flight.popleft())

    def _settle(self, count: int, request: bytes, call: grpc.Future) -> None:
        """Wait for one call; retry it if it failed transiently, count it dropped if it fails."""
        try:
            response = call.result()
        except grpc.RpcError as error:
            try:
                response = self._retry(request, error)
            except _CallFailedError as failure:
                self._drop(count, failure.reason)
                return
        self._recorded.inc(response.recorded)
        self._duplicates.inc(response.duplicates)
        if response.rejected:
            self._drop(response.rejected, f"refused by the effector: {response.first_problem}")

    def _drop(self, count: int, reason: str) -> None:
        """Count ``count`` items dropped; the bundle's WARNING gives its first reason."""
        self._dropped.inc(count)
        self._bundle_dropped += count
        if not self._drop_reason:
            self._drop_reason = reason

    def _retry(self, request: bytes, error: grpc.RpcError) -> Any:
        """Call again while the call fails transiently; ``_CallFailedError`` once it cannot."""

        def note_retry(attempts: int, error: grpc.RpcError, delay: float) -> None:
            self._retries.inc()
            _log.debug(
                "%s: %s failed (attempt %d: %s); retrying in %.2f s",
                self._sink.transform,
                self._sink.rpc,
                attempts,
                _describe(error),
                delay,
            )

        return _call_with_retries(
            lambda: self._call(request, **self._options),
            self._backoff,
            f"recording {self._sink.noun}s",
            self._connection.target,
            note_retry,
            error,
        )


class _WriteTelemetry(beam.PTransform[PCollection[Any], PCollection[Any]]):
    """The shared body of :class:`WriteTraces` and :class:`WriteErrors`."""

    _sink: _Sink

    def __init__(
        self,
        target: str | EffectorConnection,
        *,
        token: str | None = None,
        token_env: str | None = None,
        tls_root_cert: str | os.PathLike[str] | bytes | None = None,
        batch_size: int = 500,
        max_attempts: int = 5,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        super().__init__()
        _check_call_settings(
            batch_size,
            _MAX_BATCH_SIZE,
            max_attempts,
            initial_backoff_s,
            max_backoff_s,
            rpc_timeout_s,
        )
        self._fn = _RecordFn(
            self._sink,
            _connection(target, token, token_env, tls_root_cert),
            batch_size,
            _Backoff(max_attempts, initial_backoff_s, max_backoff_s),
            rpc_timeout_s,
        )

    def expand(self, items: PCollection[Any]) -> PCollection[Any]:
        """Record ``items``; the result holds no elements."""
        written: PCollection[Any] = items | self._sink.rpc >> beam.ParDo(self._fn)
        return written


class WriteTraces(_WriteTelemetry):
    """Store ``RunAgent(...).traces`` in the effector, for its console; returns an empty output.

    Events go in batches of at most ``batch_size`` (and a few MiB), cut within a bundle and
    at its end. A call that fails transiently is retried with exponential backoff and full
    jitter (``initial_backoff_s`` doubling up to ``max_backoff_s``, at most ``max_attempts``
    calls, each with a deadline of ``rpc_timeout_s``). Retrying, and running a pipeline again,
    is safe: the effector stores each ``(trace_id, span_id)`` once. A batch that still fails
    is dropped, and so is an event the effector refuses as invalid (the rest of its batch is
    stored), never failing the pipeline: the drops are counted and each bundle that dropped
    any logs one WARNING with the count and the first reason. A wrong token (UNAUTHENTICATED,
    PERMISSION_DENIED) fails the pipeline with ``PermissionError``.

    ``target``, ``token``, ``token_env`` and ``tls_root_cert`` as for ``SubmitIntents``. Beam
    metrics (namespace ``beam_agents.io``): ``traces_recorded``, ``traces_duplicate``,
    ``traces_dropped``, ``traces_retries``.
    """

    _sink = _TRACES


class WriteErrors(_WriteTelemetry):
    """Store ``RunAgent(...).errors`` in the effector, where its console can re-drive them.

    Behaves as :class:`WriteTraces` does (batches, retries, drops counted and logged, a wrong
    token fails), each record stored once under its ``error_id_for`` digest (of its key, seq,
    reason, event time and envelope: a retry or a replay stores nothing new). Beam metrics:
    ``errors_recorded``, ``errors_duplicate``, ``errors_dropped``, ``errors_retries``.
    """

    _sink = _ERRORS
