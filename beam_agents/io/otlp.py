# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``ExportTraces``: send ``RunAgent(...).traces`` to an OpenTelemetry collector (OTLP/HTTP).

Each ``TraceEvent`` becomes one span with the event's own deterministic ids, so a retried
bundle or a replayed run sends the same spans again and the backend keeps one of each. Spans go
in batches per bundle through the OpenTelemetry SDK's exporter, which retries transient
failures; what still fails is dropped, counted and logged once per bundle, never failing the
pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import apache_beam as beam
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection

from beam_agents._protos import TraceEvent
from beam_agents.io._otlp_settings import ExportSettings

if TYPE_CHECKING:
    from beam_agents.io._otlp_spans import SpanExporter

_log = logging.getLogger(__name__)

_METRICS_NAMESPACE = "beam_agents.io"


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

        self._exporter = SpanExporter(self._settings)

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

    ``endpoint`` is the collector's full traces URL (``http://host:4318/v1/traces``) and
    ``headers`` are sent with every request (e.g. an ``authorization`` header). Each event is
    one span whose ids are the event's (``trace_id``, ``span_id``, ``parent_span_id``), so a
    retried bundle or a replayed run re-sends identical ids; times are the event's wall-clock
    ones (event time for events without them). Spans are sent with the OpenTelemetry SDK's
    ``OTLPSpanExporter`` in batches of at most ``max_batch``, cut within a bundle and at its
    end; the exporter retries transient failures (429, 502, 503, 504, connection errors) with
    backoff for up to ``timeout_s`` per batch. A batch the collector still fails is dropped,
    and so is the rest of its bundle (so an unreachable collector costs at most ``timeout_s``
    per bundle): the pipeline never fails for it. An event with invalid ids is dropped alone.
    Each bundle that dropped spans logs one WARNING with the count and the first reason. Beam
    metrics (namespace ``beam_agents.io``):
    ``otlp_spans_exported``, ``otlp_spans_dropped``. Names and attributes are listed in
    ``beam_agents/io/README.md``.
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
