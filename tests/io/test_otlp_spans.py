# mypy: disallow-untyped-calls=False
"""``ExportTraces``' worker side without a pipeline: span ids and attributes, dropped batches.

``_to_span`` is called directly, and ``_ExportTracesFn`` drives a stub exporter whose answers
the test chooses; ``test_export_traces.py`` runs real pipelines against a receiver.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from beam_agents._protos import TraceEvent
from beam_agents.core.observability import TraceRecorder, trace_id_for
from beam_agents.io._otlp_spans import _to_span
from beam_agents.io.sinks import ExportSettings, _ExportTracesFn

BAD_IDS = [
    {"trace_id": "0" * 32},  # all zeros: an invalid OpenTelemetry id
    {"trace_id": "f" * 33},  # one digit too many: it would not fit the exporter's 16 bytes
    {"trace_id": "AB" * 16},  # upper case
    {"trace_id": "0x" + "1" * 30},  # int() would read it
    {"span_id": "0" * 16},
    {"span_id": "1_23456789abcdef"},  # and this
    {"span_id": "1" * 15},
    {"parent_span_id": "0" * 16},
    {"parent_span_id": " " + "1" * 15},
]


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda bad: f"{bad}")
def test_a_span_needs_valid_ids(bad: dict[str, str]) -> None:
    good = {"trace_id": "a" * 32, "span_id": "b" * 16, "parent_span_id": "c" * 16}
    resource = Resource.create({})
    span = _to_span(TraceEvent(**good), resource)
    assert span.context is not None and span.parent is not None
    assert (span.context.trace_id, span.context.span_id, span.parent.span_id) == (
        int("a" * 32, 16),
        int("b" * 16, 16),
        int("c" * 16, 16),
    )
    with pytest.raises(ValueError, match=next(iter(bad))):
        _to_span(TraceEvent(**{**good, **bad}), resource)


def test_failures_carry_error_type_and_tools_are_named_by_their_gen_ai_name() -> None:
    ids = {"trace_id": "a" * 32, "span_id": "b" * 16}
    resource = Resource.create({})
    tool = TraceEvent(
        event_type=TraceEvent.TOOL_CALL,
        attributes={"gen_ai.tool.name": "lookup", "tool_name": "old", "status": "error",
                    "error": "TimeoutError: took too long"},
        **ids,
    )  # fmt: skip
    span = _to_span(tool, resource)
    assert (span.name, span.attributes["error.type"], span.status.status_code) == (
        "execute_tool lookup",
        "TimeoutError",
        StatusCode.ERROR,
    )
    legacy = TraceEvent(event_type=TraceEvent.TOOL_CALL, attributes={"tool_name": "old"}, **ids)
    legacy_span = _to_span(legacy, resource)
    assert legacy_span.name == "execute_tool old" and "error.type" not in legacy_span.attributes
    failed = TraceEvent(event_type=TraceEvent.ERROR, attributes={"reason": "budget"}, **ids)
    assert _to_span(failed, resource).attributes["error.type"] == "budget"
    approval = TraceEvent(
        event_type=TraceEvent.INTENT_EMITTED,
        attributes={"intent_id": "i-1", "tool_name": "approval", "kind": "APPROVAL"},
        **ids,
    )
    assert "gen_ai.tool.call.id" not in _to_span(approval, resource).attributes


class StubExporter:
    """Answers each batch with the next of ``outcomes``: ``(reason, sent)``."""

    def __init__(self, outcomes: list[tuple[str, bool]]) -> None:
        self.outcomes = outcomes
        self.batches: list[int] = []

    def span(self, event: TraceEvent) -> TraceEvent:
        return event

    def export(self, batch: list[Any]) -> tuple[str, bool]:
        self.batches.append(len(batch))
        return self.outcomes.pop(0)


def test_only_a_batch_the_collector_failed_gives_up_on_the_rest_of_the_bundle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fn = _ExportTracesFn(ExportSettings("http://127.0.0.1:9/v1/traces", None, "s", 1.0), 1)
    stub = StubExporter([("cannot encode it", False), ("", True), ("HTTP 503", True)])
    fn._exporter = stub  # type: ignore[assignment]
    fn.start_bundle()
    with caplog.at_level(logging.WARNING, logger="beam_agents.io.sinks"):
        for n in range(5):
            fn.process(TraceEvent(span_id=f"{n + 1:016x}"))
        fn.finish_bundle()
    # Never sent, delivered, failed by the collector; the last two are not tried.
    assert stub.batches == [1, 1, 1]
    [warning] = [r.getMessage() for r in caplog.records if r.name == "beam_agents.io.sinks"]
    assert "dropped 4 span(s) of this bundle: cannot encode it." in warning


def test_runs_of_two_namespaces_on_one_key_export_spans_that_share_no_id() -> None:
    """The OTLP export of run 0 of one key, without a namespace and in ``v2``."""
    contexts = []
    for namespace in (None, "v2"):
        trace = TraceRecorder(
            b"acct-1", 0, trace_id_for(b"acct-1", 0, namespace), 0, 1_000, namespace=namespace
        )
        trace.record(TraceEvent.ACTIVATION_START, 0, {"trigger": "event"})
        trace.record(TraceEvent.INTENT_EMITTED, 0, {"intent_id": "i", "tool_name": "t"})
        trace.record(TraceEvent.ACTIVATION_END, 1)
        spans = [_to_span(event, Resource.create({})) for event in trace.events]
        assert all(span.parent.span_id == spans[0].context.span_id for span in spans[1:])
        contexts.append({(span.context.trace_id, span.context.span_id) for span in spans})
    plain, v2 = contexts
    assert {trace for trace, _ in plain}.isdisjoint({trace for trace, _ in v2})
    assert {span for _, span in plain}.isdisjoint({span for _, span in v2})
