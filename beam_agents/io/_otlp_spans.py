# mypy: disallow-untyped-calls=False
# (The OpenTelemetry exporter's shutdown is unannotated.)
"""Spans for ``ExportTraces``, imported on workers only: importing ``beam_agents`` loads no SDK."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from beam_agents._protos import TraceEvent

_SCOPE = InstrumentationScope("beam_agents")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NS_PER_MS = 1_000_000
_EVENT_NAMES = TraceEvent.EventType.Name
_LOWER_HEX = re.compile(r"[0-9a-f]+")

# Attribute values the runtime stores as text but OpenTelemetry types: ints, a bool, an array.
_INT_ATTRIBUTES = frozenset(
    {
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "beam_agents.attempts",
        "beam_agents.deadline_ms",
        "output_bytes",
        "pending",
    }
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
"""The range of an OTLP integer attribute; a count outside it stays text."""
_BOOL_ATTRIBUTES = frozenset({"beam_agents.cache_hit"})
_ARRAY_ATTRIBUTES = frozenset({"gen_ai.response.finish_reasons"})


def _typed(name: str, value: str) -> AttributeValue:
    """``value`` as the type OpenTelemetry gives attribute ``name`` (text when it is not)."""
    try:
        if name in _INT_ATTRIBUTES:
            number = int(value)
            return number if _INT64_MIN <= number <= _INT64_MAX else value
        if name in _ARRAY_ATTRIBUTES:
            return [str(item) for item in json.loads(value)]
    except (TypeError, ValueError):
        return value
    if name in _BOOL_ATTRIBUTES:
        return value == "true"
    return value


def _key_text(entity_key: bytes) -> str:
    """The key as text if it is printable UTF-8, else its hex."""
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        return entity_key.hex()
    return text if text.isprintable() else entity_key.hex()


def _outcome(event: TraceEvent) -> str:
    """``beam_agents.outcome``: how the event's work ended (empty: it has none)."""
    kind, attributes = event.event_type, event.attributes
    if kind == TraceEvent.ACTIVATION_END:
        return attributes.get("route", "complete")
    if kind == TraceEvent.SUSPENDED:
        return "suspended"
    if kind == TraceEvent.ERROR:
        return attributes.get("reason", "error")
    if kind == TraceEvent.TOOL_CALL:
        return attributes.get("status", "")
    return ""


def _tool_name(attributes: Mapping[str, str]) -> str:
    """The tool a tool call or tool intent names: ``gen_ai.tool.name``, else ``tool_name``."""
    return attributes.get("gen_ai.tool.name") or attributes.get("tool_name", "")


def _error_type(event: TraceEvent) -> str:
    """``error.type`` of a failed event (its exception's type, else its reason); ``""`` if none."""
    attributes = event.attributes
    failed = event.event_type == TraceEvent.ERROR or (
        event.event_type == TraceEvent.TOOL_CALL and attributes.get("status") == "error"
    )
    if not failed:
        return ""
    error = attributes.get("error", "").split(":", 1)[0].strip()
    return error or attributes.get("reason", "") or "_OTHER"


def _span_name(event: TraceEvent) -> str:
    """The span's name, after the GenAI conventions where they name one."""
    kind, attributes = event.event_type, event.attributes
    if kind == TraceEvent.LLM_CALL:
        return f"chat {attributes.get('gen_ai.request.model', '')}".rstrip()
    if kind == TraceEvent.TOOL_CALL:
        return f"execute_tool {_tool_name(attributes)}".rstrip()
    if kind == TraceEvent.ACTIVATION_START:
        return "invoke_agent"
    return _EVENT_NAMES(kind)


def _span_attributes(event: TraceEvent) -> dict[str, AttributeValue]:
    """The event's attributes, typed, plus ``beam_agents.*`` ones from its fields."""
    attributes: dict[str, AttributeValue] = {
        name: _typed(name, value) for name, value in event.attributes.items()
    }
    attributes["beam_agents.entity_key"] = _key_text(event.entity_key)
    attributes["beam_agents.seq"] = event.seq
    attributes["beam_agents.step"] = event.step_index
    attributes["beam_agents.event_type"] = _EVENT_NAMES(event.event_type)
    if event.event_type == TraceEvent.ACTIVATION_START:
        attributes.setdefault("gen_ai.operation.name", "invoke_agent")
    intent_id = event.attributes.get("intent_id")
    if intent_id:
        attributes["beam_agents.intent_id"] = intent_id
        if event.event_type == TraceEvent.INTENT_EMITTED and event.attributes.get("kind") == "TOOL":
            attributes.setdefault("gen_ai.tool.name", _tool_name(event.attributes))
            attributes.setdefault("gen_ai.tool.call.id", intent_id)
    outcome = _outcome(event)
    if outcome:
        attributes["beam_agents.outcome"] = outcome
    error_type = _error_type(event)
    if error_type:
        attributes["error.type"] = error_type
    return attributes


def _status(event: TraceEvent) -> Status:
    attributes = event.attributes
    if event.event_type == TraceEvent.ERROR:
        detail = f"{attributes.get('reason', '')}: {attributes.get('error', '')}"
        return Status(StatusCode.ERROR, detail)
    if _error_type(event):
        return Status(StatusCode.ERROR, attributes.get("error", ""))
    return Status(StatusCode.UNSET)


def _id(name: str, value: str, digits: int) -> int:
    """An id as OpenTelemetry's integer: exactly ``digits`` lowercase hex digits, not all 0."""
    if len(value) != digits or not _LOWER_HEX.fullmatch(value) or not int(value, 16):
        raise ValueError(f"{name} {value[:64]!r} is not {digits} lowercase hex digits, not all 0")
    return int(value, 16)


def _to_span(event: TraceEvent, resource: Resource) -> ReadableSpan:
    """``event`` as an OpenTelemetry span; ``ValueError`` if its ids are not valid ones."""
    trace_id = _id("trace_id", event.trace_id, 32)
    span_id = _id("span_id", event.span_id, 16)
    parent = None
    if event.parent_span_id:
        parent_id = _id("parent_span_id", event.parent_span_id, 16)
        parent = SpanContext(trace_id, parent_id, False, _SAMPLED)
    if event.wall_start_unix_nano:
        start = event.wall_start_unix_nano
        end = max(start, event.wall_end_unix_nano)
    else:
        start = event.start_ms * _NS_PER_MS
        end = max(start, event.end_ms * _NS_PER_MS)
    return ReadableSpan(
        name=_span_name(event),
        context=SpanContext(trace_id, span_id, False, _SAMPLED),
        parent=parent,
        resource=resource,
        attributes=_span_attributes(event),
        kind=SpanKind.CLIENT if event.event_type == TraceEvent.LLM_CALL else SpanKind.INTERNAL,
        status=_status(event),
        start_time=start,
        end_time=end,
        instrumentation_scope=_SCOPE,
    )


class _RecordingSession(requests.Session):
    """The exporter's HTTP session; it remembers how the requests of one batch ended."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0
        self.last = ""

    def request(
        self, method: str, url: str | bytes, *args: Any, **kwargs: Any
    ) -> requests.Response:
        """Send the request; count it and keep its status or error."""
        self.attempts += 1
        try:
            response = super().request(method, url, *args, **kwargs)
        except Exception as exc:
            self.last = f"{type(exc).__name__}: {exc}"
            raise
        self.last = f"HTTP {response.status_code} {response.reason}"
        return response


class _ExporterLog(logging.Filter):
    """Takes what the SDK's exporter logs on this thread while it sends a batch, for the WARNING."""

    def __init__(self) -> None:
        super().__init__()
        self._thread: int | None = None
        self.messages: list[str] = []
        self.session = _RecordingSession()

    def start(self) -> None:
        """Start taking this thread's records (and counting the session's requests afresh)."""
        self.messages = []
        self._thread = threading.get_ident()
        self.session.attempts, self.session.last = 0, ""

    def stop(self) -> None:
        """Let every record pass again."""
        self._thread = None

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep (and pass on nothing of) this thread's WARNING or worse records."""
        if record.thread != self._thread or record.levelno < logging.WARNING:
            return True
        self.messages.append(record.getMessage())
        return False

    def reason(self) -> str:
        """Why the batch failed: how its last request ended, else what the exporter said."""
        session = self.session
        if session.attempts:
            return f"{session.attempts} attempt(s) failed, the last with {session.last}"
        if self.messages:
            return self.messages[-1]
        return "the OTLP exporter reported a failure"


_EXPORTER_LOGGER = logging.getLogger(OTLPSpanExporter.__module__)


class SpanExporter:
    """One worker's OTLP exporter: turns events into spans and sends batches of them."""

    def __init__(
        self, endpoint: str, headers: dict[str, str] | None, service_name: str, timeout_s: float
    ) -> None:
        self._resource = Resource.create({"service.name": service_name})
        self._log = _ExporterLog()
        self._exporter = OTLPSpanExporter(
            endpoint=endpoint,
            headers=headers,
            timeout=timeout_s,
            session=self._log.session,
        )
        _EXPORTER_LOGGER.addFilter(self._log)

    def span(self, event: TraceEvent) -> ReadableSpan:
        """``event`` as a span; ``ValueError`` (or ``TypeError``) for a malformed event."""
        return _to_span(event, self._resource)

    def export(self, batch: list[Any]) -> tuple[str, bool]:
        """Send ``batch``: why it failed (``""`` once delivered) and whether it was sent at all."""
        self._log.start()
        try:
            result = self._exporter.export(batch)
            reason = "" if result is SpanExportResult.SUCCESS else self._log.reason()
        except Exception as exc:  # the SDK catches its own; anything else must not fail us
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            self._log.stop()
        return reason, self._log.session.attempts > 0

    def shutdown(self) -> None:
        """Stop taking the exporter's log records and shut it down."""
        _EXPORTER_LOGGER.removeFilter(self._log)
        self._exporter.shutdown()
