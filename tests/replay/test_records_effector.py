"""Records in the effector: ``WriteRecordsToEffector``, then ``beam-agents replay --effector``.

A recorded pipeline closing its loop through a real effector (127.0.0.1) also stores its
records there; replaying each key from the effector reports every run "same", and the records
read back are exactly those the files hold. The sink behaves as ``WriteTraces``: stored once
however often the pipeline runs, drops counted and logged for an unreachable effector, refused
records dropped alone, a wrong token fails the pipeline.
"""

from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import grpc
import pytest
from apache_beam.runners.runner import PipelineResult
from effector_harness import BackgroundEffector

from beam_agents import RunAgent, WriteRecordsToEffector
from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    EffectorStub,
    ListRecordsRequest,
    ListRecordsResponse,
    RecordActivationsRequest,
)
from beam_agents.io import EffectorConnection
from beam_agents.replay import inputs
from beam_agents.replay.inputs import by_key
from beam_agents.tools import ToolRegistry
from effector.launch import EffectorThread, free_port
from effector.server import ServerSettings
from effector.service import (
    MAX_MESSAGE_BYTES,
    MAX_READ_BYTES,
    MAX_RECORD_BYTES,
    MAX_TELEMETRY_BATCH,
)
from tests.io.io_harness import counter, run_pipeline
from tests.replay import agents
from tests.replay.recording import command, record_loop, run_console

AGENTS = "tests.replay.agents"
REPLAY = ("--agent", f"{AGENTS}:screen", "--config", f"{AGENTS}:make_config")
TOKEN = "records-effector-token-1234"
PAIR = tuple[bytes, AgentEnvelope]
BATCH = MAX_MESSAGE_BYTES // 2
"""The most record bytes one RecordActivations request of these tests carries."""
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def test_records_stored_in_the_effector_replay_every_run_as_same(
    effector: BackgroundEffector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "PAGE_RUNS", 2)  # a key's records come in several pages
    items = agents.payments(24, 4, seed=4, wait=True)
    recording = record_loop(
        tmp_path / "records", effector.address, agents.envelopes(items), to_effector=True
    )
    resumed = [p for p in items if agents.decision(p) == "flagged"]
    assert sum(r.trigger == "tool_result" for rs in recording.values() for r in rs) > 0
    connection = EffectorConnection(effector.address)
    calls = agents.PROVIDER.call_count
    for key, records in recording.items():
        assert by_key(inputs.read_stored(connection, key)) == {key: records}
        status, out, err = command(
            "replay", "--effector", effector.address, "--key", key.decode(), *REPLAY
        )
        assert (status, err) == (0, ""), out
        runs = len({record.seq for record in records})
        assert out.splitlines()[-1] == f"replay: {runs} runs: {runs} same, 0 divergent, 0 drift"
    assert agents.PROVIDER.call_count == calls
    status, out, _ = command("replay", str(tmp_path / "records"), *REPLAY)
    assert status == 0 and out.count("same (2 activations)") == len(resumed) > 0


def _stored(result: PipelineResult) -> tuple[int, int]:
    """How many records the sink stored anew, and how many the effector already had."""
    return counter(result, "records_recorded"), counter(result, "records_duplicate")


def _record_events(sink: beam.PTransform) -> tuple[PipelineResult, int]:
    """Run ``screen`` over a few payments, its records into ``sink``; the result and count."""
    events = agents.envelopes(agents.payments(10, 3, seed=2))

    def build(pipeline: beam.Pipeline) -> None:
        keyed = pipeline | beam.Create([(e.entity_key, e) for e in events]).with_output_types(PAIR)
        outputs = keyed | RunAgent(agents.screen, config=agents.make_config())
        outputs.records | sink

    return run_pipeline(build), len(events)


def test_records_are_stored_once_however_often_the_pipeline_runs(tmp_path: Path) -> None:
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:
        first, count = _record_events(WriteRecordsToEffector(effector.address, batch_size=4))
        assert _stored(first) == (count, 0)
        again, _ = _record_events(WriteRecordsToEffector(effector.address))
        assert _stored(again) == (0, count)
        store = effector.server.store
        keys = [f"acct-{n:03d}".encode() for n in range(3)]
        stored_records = [r for key in keys for r in effector.run(store.records_for_key(key, 99))]
        assert len(stored_records) == count


def test_an_unreachable_effector_drops_records_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.io.sinks")
    nowhere = f"127.0.0.1:{free_port()}"
    sink = WriteRecordsToEffector(nowhere, max_attempts=2, initial_backoff_s=0.01)
    result, count = _record_events(sink)
    assert counter(result, "records_dropped") == count
    assert counter(result, "records_retries") > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"WriteRecordsToEffector to {nowhere}: dropped" in line and "activation record" in line
        for line in warnings
    ), warnings


def test_a_record_the_effector_refuses_is_dropped_alone(tmp_path: Path) -> None:
    good = ActivationRecord(schema_version=1, entity_key=b"k", seq=0, trigger="event")
    bad = ActivationRecord(schema_version=1, entity_key=b"", seq=1, trigger="event")
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:

        def build(pipeline: beam.Pipeline) -> None:
            created = pipeline | beam.Create([good, bad], reshuffle=False)
            _ = created | WriteRecordsToEffector(effector.address)

        result = run_pipeline(build)
        assert effector.run(effector.server.store.records_for_key(b"k", 9)) == [good]
        with (
            grpc.insecure_channel(effector.address) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            EffectorStub(channel).ListRecords(ListRecordsRequest(), timeout=10)
    assert (counter(result, "records_recorded"), counter(result, "records_dropped")) == (1, 1)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_wrong_token_fails_the_pipeline_and_the_replay(tmp_path: Path) -> None:
    settings = ServerSettings(token=TOKEN)
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry(), settings) as effector:
        with pytest.raises(
            PermissionError, match=r"recording activation records .* \(check the token\)"
        ):
            _record_events(WriteRecordsToEffector(effector.address, token="wrong-token"))
        result, count = _record_events(WriteRecordsToEffector(effector.address, token=TOKEN))
        assert counter(result, "records_recorded") == count
        replay = ("replay", "--effector", effector.address, "--key", "acct-001", *REPLAY)
        status, _, err = command(*replay, "--token-env", "RECORDS_TEST_TOKEN")
        assert status == 2 and "RECORDS_TEST_TOKEN (the effector token) is not set" in err
        completed = run_console(*replay)
        assert completed.returncode == 2
        [line] = completed.stderr.splitlines()
        assert "cannot read records from the effector" in line and "UNAUTHENTICATED" in line


def test_replay_from_the_effector_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:
        cases = {
            "no records for key 'acct-999'": ["--effector", effector.address, "--key", "acct-999"],
            "--effector reads one --key's records": ["--effector", effector.address],
            "nothing to replay": [],
            f"cannot read records from the effector at {nowhere}: UNAVAILABLE": [
                "--effector",
                nowhere,
                "--key",
                "k",
            ],
        }
        for expected, argv in cases.items():
            completed = run_console("replay", *argv, *REPLAY)
            assert completed.returncode == 2, completed.stderr
            [line] = completed.stderr.splitlines()
            assert expected in line and line.startswith("beam-agents replay: "), line


def stored_record(
    key: bytes, seq: int, position: int, output: bytes = b"done", namespace: str = ""
) -> ActivationRecord:
    """A record of run ``seq`` of ``key`` at ``position`` in it."""
    return ActivationRecord(
        schema_version=1,
        entity_key=key,
        seq=seq,
        trigger="event" if position == 0 else "tool_result",
        trace_sequence=position,
        envelope=AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=b"e"),
        outcome=ActivationRecord.COMPLETE,
        output=output,
        intent_namespace=namespace,
    )


def record_all(stub: EffectorStub, records: list[ActivationRecord]) -> None:
    """Store ``records`` through RecordActivations, in requests that fit one message."""
    batch: list[ActivationRecord] = []
    for record in [*records, None]:
        full = len(batch) == MAX_TELEMETRY_BATCH
        if record is None or full or sum(r.ByteSize() for r in batch) + record.ByteSize() > BATCH:
            answer = stub.RecordActivations(RecordActivationsRequest(records=batch), timeout=60)
            assert (answer.recorded, answer.rejected) == (len(batch), 0), answer
            batch = []
        if record is not None:
            batch.append(record)


def walk_pages(stub: EffectorStub, key: bytes) -> list[ListRecordsResponse]:
    """Every ListRecords page of ``key``, newest first, following ``next_before``."""
    request, pages = ListRecordsRequest(entity_key=key), []
    while True:
        page = stub.ListRecords(request, timeout=60)
        pages.append(page)
        if not page.HasField("next_before"):
            return pages
        assert page.records, "a page with a next one but no records: no progress"
        request.before.CopyFrom(page.next_before)


def test_a_run_of_huge_records_or_of_many_small_ones_reads_back_in_pages(tmp_path: Path) -> None:
    room = MAX_RECORD_BYTES - 1_024  # what a record's output may take and the record still fit
    huge = [stored_record(b"huge", 0, n, bytes([n]) * room) for n in range(5)]
    many = [stored_record(b"many", 0, n, b"x" * 2_000) for n in range(6_000)]
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:
        with grpc.insecure_channel(effector.address, options=CHANNEL_OPTIONS) as channel:
            stub = EffectorStub(channel)  # type: ignore[no-untyped-call]
            record_all(stub, [*huge, *many])
            for key, records in ((b"huge", huge), (b"many", many)):
                pages = walk_pages(stub, key)
                assert len(pages) > 1 and all(p.ByteSize() <= MAX_READ_BYTES for p in pages)
                assert [r for p in reversed(pages) for r in p.records] == records
                assert all(p.next_before_seq == 0 for p in pages)  # one run: seq 0 is the oldest
        connection = EffectorConnection(effector.address)
        assert inputs.read_stored(connection, b"huge") == huge
        assert inputs.read_stored(connection, b"many") == many
        _, _, err = command("replay", "--effector", effector.address, "--key", "huge", *REPLAY)
    assert "cannot read records" not in err, err


def test_replay_from_the_effector_replays_the_configs_namespace_of_a_shared_key(
    effector: BackgroundEffector, tmp_path: Path
) -> None:
    events = agents.envelopes(agents.payments(4, 1, seed=9))
    [key] = {event.entity_key for event in events}
    for name, config in (("plain", agents.make_config), ("prod", agents.make_config_in_namespace)):
        recorded = record_loop(
            tmp_path / name, effector.address, events, to_effector=True, config=config
        )
        runs = len({record.seq for record in recorded[key]})
        status, out, err = command(
            "replay",
            "--effector",
            effector.address,
            "--key",
            key.decode(),
            "--agent",
            f"{AGENTS}:screen",
            "--config",
            f"{AGENTS}:{config.__name__}",
        )
        assert (status, err) == (0, ""), out
        assert out.splitlines()[-1] == f"replay: {runs} runs: {runs} same, 0 divergent, 0 drift"


def test_replay_reads_one_namespaces_records_of_a_shared_key(tmp_path: Path) -> None:
    default = [stored_record(b"shared", 0, n, b"plain") for n in (0, 5)]
    other = [stored_record(b"shared", 0, n, b"v2", namespace="v2") for n in (0, 5, 10)]
    with EffectorThread(f"sqlite:///{tmp_path}/effector.db", ToolRegistry()) as effector:
        with grpc.insecure_channel(effector.address) as channel:
            stub = EffectorStub(channel)  # type: ignore[no-untyped-call]
            record_all(stub, [*other, *default])
        connection = EffectorConnection(effector.address)
        assert inputs.read_stored(connection, b"shared", "v2") == other
        assert inputs.read_stored(connection, b"shared", "") == default
        assert inputs.read_stored(connection, b"shared", "v3") == []
        everything = inputs.read_stored(connection, b"shared")
    assert everything == [*default, *other]  # each namespace's run whole, one after the other
    assert by_key(everything) == {b"shared": [*default, *other]}
