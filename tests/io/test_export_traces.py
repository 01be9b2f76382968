# mypy: disallow-untyped-calls=False
"""``ExportTraces`` against a local OTLP/HTTP receiver: attributes, durations, ids once.

The receiver is a small ``http.server`` on 127.0.0.1 that decodes each POST to ``/v1/traces``
as an ``ExportTraceServiceRequest``. Pipelines run on the default runner: each key's agent
calls a FakeLLM (with latency), runs a read-only tool, stages an intent and suspends; its tool
result resumes it (the model call is replayed from the cache, the tool runs again) to complete.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from beam_agents import AgentConfig, Complete, ExportTraces, RunAgent, Suspend, intent_id_for
from beam_agents._protos import TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import trace_id_for
from beam_agents.model.client import LlmRequest, TokenUsage
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.testing import EnvelopeStream, FailFirstCommit
from beam_agents.tools import ToolRegistry
from tests.io.test_otlp_spans import BAD_IDS
from tests.seed import freeze_account, risk_band

KEYS = [b"cust-1", b"cust-9"]
MODEL = "triage-model"
LATENCY_MS = 40
NS_PER_MS = 1_000_000
SPANS_PER_KEY = 9  # start, chat, tool, intent, suspended; start, chat (replayed), tool, end


def make_fake() -> FakeLLM:
    usage = TokenUsage(input_tokens=11, output_tokens=3)
    return FakeLLM([(match_any(), respond_with(b"freeze", latency_ms=LATENCY_MS, usage=usage))])


async def triage(ctx: ActivationContext) -> Complete | Suspend:
    """Ask the model, look up the band, stage a freeze; on resume re-walk it and complete."""
    customer = ctx.entity_key.decode()
    await ctx.call_model(LlmRequest(model_id=MODEL, messages=[f"triage {customer}"]))
    band = await ctx.run_tool("risk_band", {"customer_id": customer})
    ctx.act("freeze_account", {"customer_id": customer})
    if not ctx.is_resume:
        return Suspend()
    return Complete(output=f"{customer}:{band}".encode())


@dataclass(frozen=True)
class Received:
    """One span as the collector decoded it (ids in hex)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int
    service: str

    @property
    def ids(self) -> tuple[str, str]:
        return self.trace_id, self.span_id

    @property
    def event_type(self) -> str:
        return str(self.attributes["beam_agents.event_type"])

    def content(self) -> tuple[Any, ...]:
        """Everything but the wall-clock times."""
        return (self.ids, self.parent_span_id, self.name, sorted(self.attributes.items()))


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which else None


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1; answers 503 to the first ``fail_first``."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.fail_first = 0
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.posts += 1
                    refuse = receiver.posts <= receiver.fail_first
                    if not refuse and self.path == "/v1/traces":
                        receiver.take(ExportTraceServiceRequest.FromString(body))
                code = 503 if refuse else 200 if self.path == "/v1/traces" else 404
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Received(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=span.status.code,
                            service=str(resource["service.name"]),
                        )
                    )

    def drain(self) -> list[Received]:
        with self._lock:
            spans, self.spans = self.spans, []
        return spans

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def run_pipeline(
    endpoint: str, before_commit: FailFirstCommit | None = None, **export: Any
) -> None:
    """The triage stream for every key through ``RunAgent`` into ``ExportTraces``."""
    stream = EnvelopeStream()
    for index, key in enumerate(KEYS):
        stream.event(key, b"order", at_ms=1_000 + index)
    for index, key in enumerate(KEYS):
        intent_id = intent_id_for(key, 0, 1)
        stream.result(key, intent_id, payload=b'"frozen"', at_ms=2_000 + index)
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    config = AgentConfig(
        provider_factory=make_fake,
        tool_registry=ToolRegistry([risk_band, freeze_account]),
        before_commit=before_commit,
    )
    with beam.Pipeline(options=options) as pipeline:  # the default runner; raises on failure
        outputs = pipeline | stream.build() | RunAgent(triage, config=config)
        _ = outputs.traces | ExportTraces(endpoint, **export)


def by_type(spans: list[Received], key: bytes, event_type: str) -> list[Received]:
    """The key's spans of ``event_type``, in run order (span ids encode the position)."""
    text = key.decode()
    found = [
        s
        for s in spans
        if s.attributes["beam_agents.entity_key"] == text and s.event_type == event_type
    ]
    return sorted(found, key=lambda s: s.span_id)


def test_spans_carry_gen_ai_attributes_real_durations_and_consistent_parents(
    receiver: Receiver,
) -> None:
    run_pipeline(receiver.endpoint, service_name="triage-test")
    spans = receiver.drain()
    assert len(spans) == len({s.ids for s in spans}) == SPANS_PER_KEY * len(KEYS)
    assert {s.service for s in spans} == {"triage-test"}
    for key in KEYS:
        trace_id = trace_id_for(key, 0)
        called, replayed = by_type(spans, key, "LLM_CALL")
        assert called.name == f"chat {MODEL}" and called.kind == Span.SPAN_KIND_CLIENT
        for chat in (called, replayed):
            assert chat.trace_id == trace_id
            assert chat.attributes["gen_ai.operation.name"] == "chat"
            assert chat.attributes["gen_ai.provider.name"] == "fake"
            assert chat.attributes["gen_ai.request.model"] == MODEL
            assert chat.attributes["gen_ai.usage.input_tokens"] == 11
            assert chat.attributes["gen_ai.usage.output_tokens"] == 3
            assert chat.attributes["beam_agents.step"] == 0
        assert (
            called.attributes["beam_agents.cache_hit"],
            replayed.attributes["beam_agents.cache_hit"],
        ) == (False, True)
        assert called.end_ns - called.start_ns >= LATENCY_MS * NS_PER_MS
        assert replayed.end_ns - replayed.start_ns < LATENCY_MS * NS_PER_MS

        tools = by_type(spans, key, "TOOL_CALL")
        assert [t.name for t in tools] == ["execute_tool risk_band"] * 2
        assert {t.attributes["gen_ai.operation.name"] for t in tools} == {"execute_tool"}
        assert {t.attributes["gen_ai.tool.name"] for t in tools} == {"risk_band"}
        call_ids = sorted(t.attributes["gen_ai.tool.call.id"] for t in tools)
        assert call_ids == [f"call_{trace_id}_2", f"call_{trace_id}_7"]
        assert {t.attributes["beam_agents.outcome"] for t in tools} == {"ok"}

        [intent] = by_type(spans, key, "INTENT_EMITTED")
        assert intent.attributes["beam_agents.intent_id"] == intent_id_for(key, 0, 1)
        assert intent.attributes["tool_name"] == "freeze_account"
        assert intent.attributes["gen_ai.tool.name"] == "freeze_account"
        assert intent.attributes["gen_ai.tool.call.id"] == intent_id_for(key, 0, 1)
        [end] = by_type(spans, key, "ACTIVATION_END")
        assert end.attributes["beam_agents.outcome"] == "complete"
        assert {s.attributes["beam_agents.seq"] for s in spans if s.trace_id == trace_id} == {0}

        starts = by_type(spans, key, "ACTIVATION_START")
        assert [s.name for s in starts] == ["invoke_agent"] * 2
        assert all(s.end_ns > s.start_ns for s in starts)
    assert {s.status for s in spans} == {Status.STATUS_CODE_UNSET}

    # Parents: one root per trace; every other span's parent is in its trace, and each span
    # under an activation's start lies within it.
    spans_by_id = {s.ids: s for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    assert sorted(s.trace_id for s in roots) == sorted(trace_id_for(k, 0) for k in KEYS)
    assert all(s.event_type == "ACTIVATION_START" for s in roots)
    for span in spans:
        if not span.parent_span_id:
            continue
        parent = spans_by_id[(span.trace_id, span.parent_span_id)]
        assert parent.event_type == "ACTIVATION_START"
        if span.event_type != "ACTIVATION_START":
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns


def test_a_forced_retry_and_a_full_replay_send_no_new_span_ids(
    receiver: Receiver, tmp_path: Path
) -> None:
    run_pipeline(receiver.endpoint)
    clean = receiver.drain()
    forced = FailFirstCommit(tmp_path / "markers")
    run_pipeline(receiver.endpoint, before_commit=forced)
    retried = receiver.drain()
    run_pipeline(receiver.endpoint)
    replayed = receiver.drain()
    # Every activation's first commit failed once, and its bundle ran again.
    assert len(forced.forced()) == 2 * len(KEYS)
    clean_ids = {s.ids for s in clean}
    assert len(clean_ids) == len(clean) == SPANS_PER_KEY * len(KEYS)
    assert {s.ids for s in retried} - clean_ids == set()
    assert {s.ids for s in retried} == clean_ids
    assert {s.ids for s in replayed} == clean_ids
    # The same spans, not just the same ids: only their wall-clock times differ.
    assert sorted(s.content() for s in retried) == sorted(s.content() for s in clean)
    assert sorted(s.content() for s in replayed) == sorted(s.content() for s in clean)


def test_a_transient_collector_failure_is_retried_by_the_exporter(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.fail_first = 1
    with caplog.at_level(logging.WARNING):
        run_pipeline(receiver.endpoint, timeout_s=10.0)
    spans = receiver.drain()
    assert len({s.ids for s in spans}) == SPANS_PER_KEY * len(KEYS)
    assert receiver.posts > 1
    assert not [r for r in caplog.records if r.name == "beam_agents.io.sinks"]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_collector_logs_a_warning_and_the_pipeline_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}/v1/traces"
    with caplog.at_level(logging.WARNING):
        run_pipeline(endpoint, timeout_s=1.0)
    warnings = [r.getMessage() for r in caplog.records if r.name == "beam_agents.io.sinks"]
    assert warnings and all(
        r.levelno == logging.WARNING for r in caplog.records if r.name == "beam_agents.io.sinks"
    )
    dropped = [
        re.search(r"dropped (\d+) span\(s\) of this bundle: (.+)\. The", m) for m in warnings
    ]
    assert all(dropped), warnings
    assert sum(int(match.group(1)) for match in dropped if match) == SPANS_PER_KEY * len(KEYS)
    assert all("refused" in match.group(2).lower() for match in dropped if match), warnings
    # The exporter's own failure lines are folded into that one WARNING per bundle.
    exporter_lines = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert exporter_lines == []


def sample_events() -> list[TraceEvent]:
    """Three well-formed events of one trace (the last an ``ERROR``) and one not well formed."""
    trace_id = trace_id_for(b"k", 0)
    events = [
        TraceEvent(trace_id=trace_id, span_id=f"{n:016x}", entity_key=b"\xff", sequence=n)
        for n in range(1, 4)
    ]
    events[2].event_type = TraceEvent.ERROR
    events[2].attributes.update({"reason": "activation_error", "error": "KeyError"})
    return [*events, TraceEvent(trace_id=trace_id, span_id="not-hex")]


def export_events(
    endpoint: str, events: list[TraceEvent] | None = None, max_batch: int = 2
) -> dict[str, int]:
    """Export ``events`` (:func:`sample_events`) on the FnApiRunner, whose metrics are complete."""
    pipeline = beam.Pipeline(runner=FnApiRunner())
    sent = sample_events() if events is None else events
    created = pipeline | beam.Create(sent).with_output_types(TraceEvent)
    _ = created | ExportTraces(endpoint, timeout_s=1.0, max_batch=max_batch)
    result = pipeline.run()
    result.wait_until_finish()
    query = result.metrics().query(MetricsFilter().with_namespace("beam_agents.io"))
    return {c.key.metric.name: c.committed for c in query["counters"]}


def test_exported_and_dropped_spans_are_counted(receiver: Receiver) -> None:
    assert export_events(receiver.endpoint) == {"otlp_spans_exported": 3, "otlp_spans_dropped": 1}
    spans = sorted(receiver.drain(), key=lambda s: s.span_id)
    assert [s.span_id for s in spans] == [f"{n:016x}" for n in range(1, 4)]
    assert [s.status for s in spans] == [Status.STATUS_CODE_UNSET] * 2 + [Status.STATUS_CODE_ERROR]
    assert (spans[2].name, spans[2].attributes["beam_agents.outcome"]) == (
        "ERROR",
        "activation_error",
    )
    assert (spans[2].attributes["error.type"], spans[2].attributes["error"]) == (
        "KeyError",
        "KeyError",
    )
    assert ["error.type" in s.attributes for s in spans] == [False, False, True]
    # Without wall-clock times a span has its event time; a key that is not text is hex.
    assert {(s.start_ns, s.end_ns, s.attributes["beam_agents.entity_key"]) for s in spans} == {
        (0, 0, "ff")
    }
    closed = f"http://127.0.0.1:{closed_port()}/v1/traces"
    assert export_events(closed) == {"otlp_spans_dropped": 4}


def test_events_with_bad_ids_are_dropped_alone_and_the_rest_of_their_batch_is_sent(
    receiver: Receiver,
) -> None:
    trace_id = trace_id_for(b"k", 0)
    good = [
        TraceEvent(trace_id=trace_id, span_id=f"{n:016x}", entity_key=b"k", sequence=n)
        for n in range(1, 6)
    ]
    bad = [TraceEvent(entity_key=b"k", **{"trace_id": trace_id, "span_id": "1" * 16, **ids})
           for ids in BAD_IDS]  # fmt: skip
    good[1].attributes["gen_ai.usage.input_tokens"] = "9" * 30  # past int64: sent as text
    events = [*good[:2], *bad, *good[2:]]  # one bundle, one batch
    assert export_events(receiver.endpoint, events, max_batch=100) == {
        "otlp_spans_exported": len(good),
        "otlp_spans_dropped": len(bad),
    }
    spans = sorted(receiver.drain(), key=lambda s: s.span_id)
    assert [s.span_id for s in spans] == [e.span_id for e in good]
    assert spans[1].attributes["gen_ai.usage.input_tokens"] == "9" * 30
    assert receiver.posts == 1


def test_the_endpoint_and_settings_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="http"):
        ExportTraces("127.0.0.1:4318")
    with pytest.raises(ValueError, match="timeout_s"):
        ExportTraces("http://127.0.0.1:4318/v1/traces", timeout_s=0)
    with pytest.raises(ValueError, match="max_batch"):
        ExportTraces("http://127.0.0.1:4318/v1/traces", max_batch=0)
