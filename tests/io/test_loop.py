"""The loop through the effector without the agent runtime, and redelivery when it is replayed.

ReadEnvelopes(events) → a stateful DoFn that turns each external event into a ToolIntent with
a deterministic id → SubmitIntents; the effector executes the intents and their results come
back through ReadEnvelopes, on Beam's FnApiRunner, until the reader stops when idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.runners.runner import PipelineResult
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from effector_harness import FAST_WORKER, BackgroundEffector, make_intent, self_signed_certificate
from effector_test_tools import read_ledger

from beam_agents._protos import AgentEnvelope, SubmitAck, ToolIntent, ToolResult
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents
from effector.server import ServerSettings
from tests.io.io_harness import Collector, counter, run_pipeline, started

EVENTS = [
    AgentEnvelope(entity_key=f"k{n}".encode(), event_time_ms=1_000 * n, external_event=b"go")
    for n in (1, 2, 3)
]
_SEQ = ReadModifyWriteStateSpec("seq", VarIntCoder())


class _IntentPerEvent(beam.DoFn):
    """Each external event of a key becomes one ``record`` intent; other envelopes end here."""

    def process(
        self,
        element: tuple[bytes, AgentEnvelope],
        seq: Any = beam.DoFn.StateParam(_SEQ),  # noqa: B008
    ) -> Any:
        key, envelope = element
        if envelope.WhichOneof("payload") != "external_event":
            return
        count = seq.read() or 0
        seq.write(count + 1)
        # Everything is derived from the event, so a replay mints byte-identical intents.
        yield make_intent(
            "record",
            {"note": key.decode()},
            key=key,
            seq=count,
            created_at_ms=envelope.event_time_ms,
        )


def run_loop(
    connection: EffectorConnection, *, redeliver_results: bool = True
) -> tuple[list[AgentEnvelope], list[SubmitAck], PipelineResult]:
    read, acks = Collector.new(), Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        envelopes = pipeline | ReadEnvelopes(
            connection, events=EVENTS, stop_when_idle_s=0.5, poll_wait_ms=50
        )
        envelopes | "Read" >> read.sink()
        submitted = (
            envelopes
            | beam.ParDo(_IntentPerEvent()).with_output_types(ToolIntent)
            | SubmitIntents(connection, redeliver_results=redeliver_results)
        )
        submitted.acks | "Acks" >> acks.sink()

    result = run_pipeline(build)
    return [envelope for _, envelope in read.values()], acks.values(), result


def results_of(envelopes: list[AgentEnvelope]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for envelope in envelopes:
        if envelope.HasField("tool_result"):
            result = envelope.tool_result
            assert result.status == ToolResult.OK, result.error_message
            assert result.intent_id not in found, "a result was read twice"
            found[result.intent_id] = envelope.SerializeToString()
    return found


def intent_ids() -> list[str]:
    return sorted(make_intent("record", key=event.entity_key).intent_id for event in EVENTS)


def test_intents_execute_once_and_results_come_back_and_a_replay_redelivers_them(
    effector: BackgroundEffector, ledger: Path
) -> None:
    connection = EffectorConnection(effector.address)
    envelopes, acks, result = run_loop(connection)
    assert [e.external_event for e in envelopes[:3]] == [b"go"] * 3
    first_results = results_of(envelopes)
    assert sorted(first_results) == intent_ids()
    assert len(envelopes) == 6
    assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
    assert counter(result, "envelopes_read") == 6
    assert sorted(started(read_ledger(ledger))) == intent_ids()

    # The same pipeline over the same events, from fresh state: nothing executes again, and
    # the results the replayed intents wait for are read again, byte for byte.
    envelopes, acks, _ = run_loop(connection)
    assert [e.external_event for e in envelopes[:3]] == [b"go"] * 3
    assert results_of(envelopes) == first_results
    assert len(envelopes) == 6
    assert {ack.outcome for ack in acks} == {SubmitAck.DUPLICATE}
    assert len(acks) == 3

    # Without redelivery a replay sees only its events.
    envelopes, acks, _ = run_loop(connection, redeliver_results=False)
    assert [e.WhichOneof("payload") for e in envelopes] == ["external_event"] * 3
    assert {ack.outcome for ack in acks} == {SubmitAck.DUPLICATE}
    assert sorted(started(read_ledger(ledger))) == intent_ids()


def test_the_loop_over_tls_with_a_token(store_url: str, ledger: Path, tmp_path: Path) -> None:
    certificate, key = self_signed_certificate()
    (tmp_path / "root.pem").write_bytes(certificate)
    settings = ServerSettings(tls_cert=certificate, tls_key=key, token="t0ken", worker=FAST_WORKER)
    with BackgroundEffector(store_url, settings) as effector:
        connection = EffectorConnection(
            effector.address, token="t0ken", tls_root_cert=tmp_path / "root.pem"
        )
        envelopes, acks, _ = run_loop(connection)
    assert sorted(results_of(envelopes)) == intent_ids()
    assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
    assert sorted(started(read_ledger(ledger))) == intent_ids()
