"""WriteTraces and WriteErrors: a real pipeline's telemetry stored once, drops, a wrong token.

Pipelines run on Beam's default runner against an effector serving from a thread on
127.0.0.1; what they stored is read back from its store.
"""

from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.runner import PipelineResult

from beam_agents import AgentConfig, RunAgent, WriteErrors, WriteTraces
from beam_agents._protos import AgentEnvelope, AgentError, TraceEvent
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.tools import ToolRegistry, tool
from effector.launch import EffectorThread, free_port
from effector.server import ServerSettings
from effector.store.intents import error_id_for
from tests.io.io_harness import Collector, counter, run_pipeline

TOKEN = "telemetry-io-token-1234"
KEYS = [f"order-{n}".encode() for n in range(5)]


@tool
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: the order's key.
    """
    return f"found {order}"


async def looks_up_or_fails(ctx: ActivationContext) -> Complete:
    if ctx.event == b"fail":
        raise RuntimeError("the agent failed on purpose")
    found = await ctx.run_tool("lookup", {"order": ctx.entity_key.decode()})
    return Complete(output=str(found).encode())


CONFIG = AgentConfig(tool_registry=ToolRegistry([lookup]))


def events() -> list[tuple[bytes, AgentEnvelope]]:
    pairs = [(key, b"go") for key in KEYS] + [(b"broken", b"fail")]
    return [
        (key, AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=event))
        for key, event in pairs
    ]


def run_agents(
    traces_sink: beam.PTransform, errors_sink: beam.PTransform
) -> tuple[PipelineResult, list[TraceEvent], list[AgentError]]:
    """Run the agents on the default runner, their telemetry into the sinks; what they emitted."""
    traces, errors = Collector.new(), Collector.new()
    pipeline = beam.Pipeline()
    outputs = pipeline | beam.Create(events()) | RunAgent(looks_up_or_fails, config=CONFIG)
    outputs.traces | traces_sink
    outputs.errors | errors_sink
    outputs.traces | "CollectTraces" >> traces.sink()
    outputs.errors | "CollectErrors" >> errors.sink()
    result = pipeline.run()
    result.wait_until_finish()
    return result, traces.values(), errors.values()


def span_ids(events: list[TraceEvent]) -> set[tuple[str, str]]:
    return {(event.trace_id, event.span_id) for event in events}


def test_telemetry_is_stored_once_however_often_the_pipeline_runs(tmp_path: Path) -> None:
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:
        store = effector.server.store
        first, traces, errors = run_agents(
            WriteTraces(effector.address, batch_size=4), WriteErrors(effector.address)
        )
        assert len(traces) == 3 * len(KEYS) + 1  # start, tool call, end; one ERROR
        assert [error.reason for error in errors] == ["activation_error"]
        every_key = [*KEYS, b"broken"]
        stored = [e for key in every_key for e in effector.run(store.traces_for_key(key, 9))]
        assert span_ids(stored) == span_ids(traces) and len(stored) == len(traces)
        assert {event.event_type for event in stored} >= {TraceEvent.TOOL_CALL, TraceEvent.ERROR}
        [record] = effector.run(store.list_errors(None, 10))
        assert (record.error, record.error_id) == (errors[0], error_id_for(errors[0]))
        assert counter(first, "traces_recorded") == len(traces)
        assert counter(first, "errors_recorded") == 1

        again, traces_again, _ = run_agents(
            WriteTraces(effector.address), WriteErrors(effector.address)
        )
        assert span_ids(traces_again) == span_ids(traces)
        assert [counter(again, f"traces_{name}") for name in ("recorded", "duplicate")] == [
            0,
            len(traces),
        ]
        assert [counter(again, f"errors_{name}") for name in ("recorded", "duplicate")] == [0, 1]
        assert len(effector.run(store.list_errors(None, 10))) == 1


def test_an_unreachable_effector_drops_telemetry_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.io.sinks")
    nowhere = f"127.0.0.1:{free_port()}"
    quick = {"max_attempts": 2, "initial_backoff_s": 0.01, "max_backoff_s": 0.01}
    result, traces, errors = run_agents(
        WriteTraces(nowhere, **quick), WriteErrors(nowhere, **quick)
    )
    assert counter(result, "traces_dropped") == len(traces) > 0
    assert counter(result, "errors_dropped") == len(errors) == 1
    assert counter(result, "traces_retries") > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"WriteTraces to {nowhere}: dropped" in line and "UNAVAILABLE" in line for line in warnings
    )
    assert any(f"WriteErrors to {nowhere}: dropped 1 error record(s)" in line for line in warnings)


def trace_event(n: int, **ids: str) -> TraceEvent:
    values = {"trace_id": f"{n + 1:032x}", "span_id": f"{n + 1:016x}", **ids}
    return TraceEvent(entity_key=b"k", seq=n, **values)


def test_items_the_effector_refuses_are_dropped_alone_with_the_first_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.io.sinks")
    items: list[object] = [
        "not an event",
        trace_event(0),
        trace_event(1, trace_id="A" * 32),  # upper case: the effector refuses it
        trace_event(2),
        trace_event(3, span_id="short"),
    ]
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:

        def build(pipeline: beam.Pipeline) -> None:
            created = pipeline | beam.Create(items, reshuffle=False)
            _ = created | WriteTraces(effector.address, batch_size=2)

        result = run_pipeline(build)
        stored = effector.run(effector.server.store.traces_for_key(b"k", 10))
    assert stored == [trace_event(0), trace_event(2)]
    assert (counter(result, "traces_recorded"), counter(result, "traces_dropped")) == (2, 3)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "beam_agents.io.sinks"]
    assert "dropped 3 trace event(s)" in warning
    assert warning.endswith("the first: not a TraceEvent: str"), warning


def test_a_wrong_token_fails_the_pipeline(tmp_path: Path) -> None:
    settings = ServerSettings(token=TOKEN)
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry(), settings) as effector:
        with pytest.raises(PermissionError, match=r"recording trace events .* \(check the token\)"):
            run_agents(
                WriteTraces(effector.address, token="wrong-token"),
                WriteErrors(effector.address, token=TOKEN),
            )
        result, traces, _ = run_agents(
            WriteTraces(effector.address, token=TOKEN), WriteErrors(effector.address, token=TOKEN)
        )
        assert counter(result, "traces_recorded") == len(traces)


def test_settings_are_checked_when_the_pipeline_is_built() -> None:
    with pytest.raises(ValueError, match="batch_size must be between 1 and 1000"):
        WriteTraces("127.0.0.1:1", batch_size=0)
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        WriteErrors("127.0.0.1:1", max_attempts=0)
    with pytest.raises(ValueError, match="HOST:PORT"):
        WriteTraces("nowhere")
