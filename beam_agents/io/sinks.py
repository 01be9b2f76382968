# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Sinks for ``RunAgent``'s ``.traces``, ``.errors`` and ``.records``: OTLP, the effector, files."""

from __future__ import annotations

import collections
import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

import apache_beam as beam
import grpc
from apache_beam.io import fileio
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection
from apache_beam.transforms.window import FixedWindows
from google.protobuf.message import Message

from beam_agents._protos import (
    ActivationRecord,
    AgentError,
    RecordActivationsRequest,
    RecordActivationsResponse,
    RecordErrorsRequest,
    RecordErrorsResponse,
    RecordTracesRequest,
    RecordTracesResponse,
    TraceEvent,
)
from beam_agents.core.state import varint
from beam_agents.io.effector_link import (
    _MAX_BATCH_BYTES,
    _MAX_ITEM_BYTES,
    _METRICS_NAMESPACE,
    EffectorConnection,
    _Backoff,
    _call_with_retries,
    _CallFailedError,
    _check_call_settings,
    _connection,
    _describe,
)

if TYPE_CHECKING:
    from beam_agents.io._otlp_spans import SpanExporter


# -- ExportTraces: spans with the events' own deterministic ids, over OTLP/HTTP ---------------
@dataclass(frozen=True)
class ExportSettings:
    """What ``ExportTraces`` was given, for the OpenTelemetry SDK's exporter."""

    endpoint: str
    headers: dict[str, str] | None
    service_name: str
    timeout_s: float


_log = logging.getLogger(__name__)


class _ExportTracesFn(beam.DoFn):
    """Turns trace events into spans and exports them in batches, cut within and at bundle ends."""

    def __init__(self, settings: ExportSettings, max_batch: int) -> None:
        self._settings = settings
        self._endpoint = settings.endpoint
        self._max_batch = max_batch
        self._exported = Metrics.counter(_METRICS_NAMESPACE, "otlp_spans_exported")
        self._dropped = Metrics.counter(_METRICS_NAMESPACE, "otlp_spans_dropped")
        self._exporter: SpanExporter | None = None

    def setup(self) -> None:
        """Create the exporter (the OpenTelemetry SDK is imported here, on the worker)."""
        from beam_agents.io._otlp_spans import SpanExporter

        settings = self._settings
        self._exporter = SpanExporter(
            settings.endpoint, settings.headers, settings.service_name, settings.timeout_s
        )

    def teardown(self) -> None:
        """Shut the exporter down."""
        exporter, self._exporter = self._exporter, None
        if exporter is not None:
            exporter.shutdown()

    def start_bundle(self) -> None:
        """Start an empty batch; nothing dropped yet."""
        self._batch: list[Any] = []
        self._bundle_dropped = 0
        self._failure = ""
        self._export_failure = ""

    def process(self, event: TraceEvent) -> None:
        """Add ``event``'s span to the batch; export the batch when it is full."""
        assert self._exporter is not None
        try:
            span = self._exporter.span(event)
        except (AttributeError, TypeError, ValueError) as exc:
            self._drop(1, f"not a well-formed TraceEvent ({type(exc).__name__}: {exc})")
            return
        self._batch.append(span)
        if len(self._batch) >= self._max_batch:
            self._flush()

    def finish_bundle(self) -> None:
        """Export the rest; log one WARNING if any span of the bundle was dropped."""
        self._flush()
        if self._bundle_dropped:
            _log.warning(
                "ExportTraces to %s: dropped %d span(s) of this bundle: %s. The pipeline goes "
                "on; the counter %s/otlp_spans_dropped counts every dropped span",
                self._endpoint,
                self._bundle_dropped,
                self._failure,
                _METRICS_NAMESPACE,
            )

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        if self._export_failure:
            # One failed export per bundle at most: the exporter already retried it for up
            # to ``timeout_s``, so the collector is down; waiting again would stall the bundle.
            self._drop(len(batch), self._export_failure)
            return
        assert self._exporter is not None
        reason, sent = self._exporter.export(batch)
        if not reason:
            self._exported.inc(len(batch))
            return
        if sent:  # the collector is down or refusing (a batch never sent says nothing of it)
            self._export_failure = reason
        self._drop(len(batch), reason)

    def _drop(self, count: int, reason: str) -> None:
        """Count ``count`` spans dropped; the bundle's WARNING gives its first reason."""
        self._dropped.inc(count)
        self._bundle_dropped += count
        if not self._failure:
            self._failure = reason


class ExportTraces(beam.PTransform[PCollection[TraceEvent], PCollection[Any]]):
    """Export ``RunAgent(...).traces`` to an OTLP/HTTP endpoint; returns an empty output.

    ``endpoint`` is the collector's full traces URL (``http://host:4318/v1/traces``).
    ``headers`` are sent with every request. Each event is one span with the event's own ids,
    so a retried bundle or a replayed run re-sends identical ids. Batches hold at most
    ``max_batch`` spans; the exporter retries transient failures for up to ``timeout_s``. A
    batch that still fails is dropped with the rest of its bundle, and the pipeline goes on.
    Each bundle that dropped spans logs one WARNING. Beam metrics (namespace
    ``beam_agents.io``): ``otlp_spans_exported``, ``otlp_spans_dropped``. Span names and
    attributes: ``docs/operations.md``.
    """

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        *,
        service_name: str = "beam-agents",
        timeout_s: float = 10.0,
        max_batch: int = 512,
    ) -> None:
        super().__init__()
        if urlsplit(endpoint).scheme not in ("http", "https"):
            raise ValueError(
                f"ExportTraces needs the collector's http(s) URL, such as "
                f"http://localhost:4318/v1/traces; got {endpoint!r}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        headers_sent = None if headers is None else dict(headers)
        settings = ExportSettings(endpoint, headers_sent, service_name, timeout_s)
        self._fn = _ExportTracesFn(settings, max_batch)

    def expand(self, traces: PCollection[TraceEvent]) -> PCollection[Any]:
        """Export ``traces``; the result holds no elements."""
        exported: PCollection[Any] = traces | "ExportSpans" >> beam.ParDo(self._fn)
        return exported


# -- WriteTraces, WriteErrors, WriteRecordsToEffector: the effector's store -------------------
_MAX_IN_FLIGHT = 4
"""Calls a bundle keeps going while it goes on; it waits for the oldest beyond that."""
_SERVICE = RecordTracesRequest.DESCRIPTOR.file.services_by_name["Effector"].full_name


@dataclass(frozen=True)
class _Sink:
    """What differs between the sinks: the item type, the RPC, its repeated field and names."""

    transform: str
    item_type: type[Message]
    rpc: str
    request_type: type[Message]
    field: str
    response_type: type[Message]
    noun: str
    metric: str


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
_RECORDS = _Sink(
    transform="WriteRecordsToEffector",
    item_type=ActivationRecord,
    rpc="RecordActivations",
    request_type=RecordActivationsRequest,
    field="records",
    response_type=RecordActivationsResponse,
    noun="activation record",
    metric="records",
)


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
        self._tag = varint(field.number << 3 | 2)  # a length-delimited field
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
        request = b"".join(part for data in batch for part in (tag, varint(len(data)), data))
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
            batch_size, max_attempts, initial_backoff_s, max_backoff_s, rpc_timeout_s
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

    Events go in batches of at most ``batch_size`` (and a few MiB). A call that fails
    transiently is retried with backoff as :class:`SubmitIntents` retries. Retrying, and running
    a pipeline again, is safe: the effector stores each ``(trace_id, span_id)`` once. A batch
    that still fails is dropped, and so is an event the effector refuses; the pipeline goes on.
    Each bundle that dropped anything logs one WARNING. A wrong token fails the pipeline with
    ``PermissionError``.

    ``target``, ``token``, ``token_env`` and ``tls_root_cert`` as for ``SubmitIntents``. Beam
    metrics (namespace ``beam_agents.io``): ``traces_recorded``, ``traces_duplicate``,
    ``traces_dropped``, ``traces_retries``.
    """

    _sink = _TRACES


class WriteErrors(_WriteTelemetry):
    """Store ``RunAgent(...).errors`` in the effector, where its console can re-drive them.

    Behaves as :class:`WriteTraces` does, with the same arguments. The effector stores each
    record once under its ``error_id_for`` digest, so a retry or a replay stores nothing new.
    Beam metrics: ``errors_recorded``, ``errors_duplicate``, ``errors_dropped``,
    ``errors_retries``.
    """

    _sink = _ERRORS


MAGIC = b"BEAM-AGENTS-RECORDS/1\n"
"""The first bytes of every records file (format version 1)."""

SUFFIX = ".records"
"""The file name suffix of records files; a directory is read as its ``*.records`` files."""


# -- WriteRecords: record files ---------------------------------------------------------------
# MAGIC, then each record framed as a varint of its length and its deterministic bytes;
# beam_agents.replay reads them back and writes envelope files with WriteFramed.
def frame(message: Message) -> bytes:
    """``message`` as it is stored in a framed file: varint length, then the message."""
    body = message.SerializeToString(deterministic=True)
    return varint(len(body)) + body


class _FramedFileSink(fileio.FileSink):
    """Writes the format's header, then one framed message per element."""

    def __init__(self, magic: bytes) -> None:
        self._magic = magic

    def open(self, fh: BinaryIO) -> None:
        """Start a file."""
        self._file = fh
        fh.write(self._magic)

    def write(self, message: Message) -> None:
        """Append one message."""
        self._file.write(frame(message))

    def flush(self) -> None:
        """Flush the file."""
        self._file.flush()


def _sink_for(magic: bytes, destination: object) -> _FramedFileSink:
    return _FramedFileSink(magic)


class WriteFramed(beam.PTransform[PCollection[Message], Any]):
    """Write messages to ``path`` (a directory; local or any Beam filesystem), framed.

    Subclasses name the format: :attr:`MAGIC`, :attr:`PREFIX` and :attr:`SUFFIX`. Unbounded
    input is windowed into fixed ``window_s`` event-time windows, so files are finished as the
    stream goes. ``shards``: files per window (Beam's default when ``None``).
    """

    MAGIC = MAGIC
    PREFIX = "records"
    SUFFIX = SUFFIX

    def __init__(self, path: str, *, shards: int | None = None, window_s: int = 60) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(path, str) or not path:
            raise ValueError(f"{name} needs a directory path, got {path!r}")
        if window_s <= 0:
            raise ValueError(f"{name} window_s must be positive, got {window_s!r}")
        self._path = path
        self._shards = shards
        self._window_s = window_s

    def expand(self, messages: PCollection[Message]) -> Any:
        """Window unbounded input, then write the files."""
        if not messages.is_bounded:
            messages = messages | "Window" >> beam.WindowInto(FixedWindows(self._window_s))
        return messages | "Files" >> fileio.WriteToFiles(
            self._path,
            file_naming=fileio.default_file_naming(self.PREFIX, self.SUFFIX),
            sink=functools.partial(_sink_for, self.MAGIC),
            shards=self._shards,
        )


class WriteRecords(WriteFramed):
    """Write ``ActivationRecord``s to ``path`` as ``records-SSSSS-of-NNNNN.records`` files.

    Arguments as for :class:`WriteFramed`.
    """


class WriteRecordsToEffector(_WriteTelemetry):
    """Store ``RunAgent(...).records`` in the effector, for ``beam-agents replay --effector``.

    Behaves as :class:`WriteTraces` does, with the same arguments. The effector stores each
    ``(entity_key, seq, trace_sequence)`` once. Beam metrics: ``records_recorded``,
    ``records_duplicate``, ``records_dropped``, ``records_retries``.
    """

    _sink = _RECORDS
