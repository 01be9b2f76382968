"""ReadEnvelopes against a real effector: order, timestamps, start offset, stopping when idle."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import apache_beam as beam
import pytest
from effector_harness import FAST_WORKER, BackgroundEffector, make_intent

from beam_agents._protos import AgentEnvelope, ToolIntent, ToolResult
from beam_agents.io import ReadEnvelopes
from effector.client import EffectorClient
from effector.launch import free_port
from effector.server import ServerSettings
from tests.io.io_harness import Collector, counter, run_pipeline

IDLE_S = 0.3


def read_all(transform: ReadEnvelopes) -> tuple[Collector, beam.runners.runner.PipelineResult]:
    collector = Collector.new()
    result = run_pipeline(lambda pipeline: pipeline | transform | collector.sink())
    return collector, result


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def hold_a_tool(client: EffectorClient, tmp_path: Path) -> Callable[[], None]:
    gate = tmp_path / "gate"
    client.submit([make_intent("gate", {"path": str(gate)}, key=b"held")])
    return gate.touch


def hold_an_approval(client: EffectorClient, tmp_path: Path) -> Callable[[], None]:
    approval = make_intent("", {"amount": 5}, key=b"held", kind=ToolIntent.APPROVAL)
    client.submit([approval])

    def decide() -> None:
        assert client.decide(approval.intent_id, approved=True, approver="ann").applied

    return decide


@pytest.mark.parametrize("hold", [hold_a_tool, hold_an_approval], ids=["tool", "approval"])
def test_events_then_later_results_in_offset_order_and_no_stop_while_in_flight(
    effector: BackgroundEffector,
    tmp_path: Path,
    hold: Callable[[EffectorClient, Path], Callable[[], None]],
) -> None:
    events = [
        AgentEnvelope(entity_key=b"e1", event_time_ms=1_000, external_event=b"one"),
        AgentEnvelope(entity_key=b"e2", event_time_ms=2_000, external_event=b"two"),
    ]
    collector = Collector.new()
    # Wide enough that a loaded machine's lag between the reader reading the result and the
    # test seeing it stays well inside the idle time (0.5 s once failed in CI).
    idle_s = 2.0
    transform = ReadEnvelopes(
        effector.address, events=events, stop_when_idle_s=idle_s, poll_wait_ms=50
    )
    with EffectorClient(effector.address) as client, ThreadPoolExecutor(max_workers=1) as pool:
        release = hold(client, tmp_path)
        running = pool.submit(run_pipeline, lambda p: p | transform | collector.sink())
        wait_for(lambda: len(collector.values()) == 2)
        time.sleep(1.5 * idle_s)
        assert not running.done(), "the reader stopped while an intent was in flight"
        release()
        # The result restarts the idle clock (which ran out long ago), so an event arriving
        # within the idle time after it is read too.
        wait_for(lambda: len(collector.values()) == 3)
        client.publish([AgentEnvelope(entity_key=b"e3", event_time_ms=3_000, external_event=b"3")])
        result = running.result(timeout=60)
        log = [record.envelope for record in client.read(1).records]

    assert [envelope.external_event for envelope in log[:2]] == [b"one", b"two"]
    assert log[3].external_event == b"3"
    assert len(log) == 4
    assert collector.values() == [(envelope.entity_key, envelope) for envelope in log]
    assert [micros for _, micros in collector.timestamped()] == [
        envelope.event_time_ms * 1000 for envelope in log
    ]
    assert [micros for _, micros in collector.timestamped()][:2] == [1_000_000, 2_000_000]
    last = log[2]
    assert last.entity_key == b"held"
    assert last.WhichOneof("payload") in ("tool_result", "approval")
    if last.HasField("tool_result"):
        assert last.tool_result.status == ToolResult.OK
    assert counter(result, "envelopes_read") == 4


def test_start_offset_and_stopping_when_idle_with_nothing_in_flight(
    effector: BackgroundEffector,
) -> None:
    with EffectorClient(effector.address) as client:
        offsets = client.publish(
            [
                AgentEnvelope(entity_key=b"k", external_event=bytes([n]), event_time_ms=n)
                for n in (1, 2)
            ]
            # Left at 0, the event time is stamped by the effector when it is published.
            + [AgentEnvelope(entity_key=b"k", external_event=b"stamped")]
        )
        log = [record.envelope for record in client.read(1).records]
    assert offsets == [1, 2, 3]
    started = time.monotonic()
    collector, _ = read_all(
        ReadEnvelopes(effector.address, start_offset=2, stop_when_idle_s=IDLE_S)
    )
    assert time.monotonic() - started >= IDLE_S
    assert collector.values() == [(b"k", log[1]), (b"k", log[2])]
    stamped = log[2].event_time_ms
    assert stamped > 0
    assert [micros for _, micros in collector.timestamped()] == [2_000, stamped * 1000]

    everything, _ = read_all(ReadEnvelopes(effector.address, stop_when_idle_s=IDLE_S))
    assert everything.values() == [(b"k", envelope) for envelope in log]


def test_a_wrong_token_fails_the_pipeline_clearly(store_url: str) -> None:
    settings = ServerSettings(token="right-token", worker=FAST_WORKER)
    with BackgroundEffector(store_url, settings) as effector:
        for transform in (
            ReadEnvelopes(effector.address, token="wrong-token", stop_when_idle_s=IDLE_S),
            ReadEnvelopes(
                effector.address,
                token="wrong-token",
                events=[AgentEnvelope(entity_key=b"k", external_event=b"x")],
            ),
        ):
            with pytest.raises(PermissionError, match="UNAUTHENTICATED") as failure:
                read_all(transform)
            assert "wrong-token" not in str(failure.value)


def test_publishing_to_an_unreachable_effector_fails_the_pipeline_clearly() -> None:
    target = f"127.0.0.1:{free_port()}"
    transform = ReadEnvelopes(target, events=[AgentEnvelope(entity_key=b"k", external_event=b"x")])
    with pytest.raises(
        ConnectionError, match=f"publishing the initial events .* at {target} failed"
    ):
        read_all(transform)
