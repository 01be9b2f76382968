# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""``AgentConfig(record=...)``: one deterministic record per committed activation, on ``.records``.

Records are written by ``WriteRecords`` and read back by ``beam_agents.replay.inputs``, which
refuses a corrupt file; recording is off by default; a retried bundle emits identical records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_agents import AgentConfig, RunAgent, canonical_json_bytes
from beam_agents._protos import ActivationRecord
from beam_agents.core.config import RecordOptions
from beam_agents.replay.inputs import (
    RecordFileError,
    by_key,
    encode_records,
    parse_records,
    read_records,
)
from beam_agents.testing import FailFirstCommit
from tests.replay import agents
from tests.replay.recording import PAIR, record


def test_each_committed_activation_is_recorded_with_what_it_did(tmp_path: Path) -> None:
    items = agents.payments(6, 3)
    recording = record(tmp_path / "records", agents.envelopes(items))
    assert sorted(recording) == [b"acct-000", b"acct-001", b"acct-002"]
    assert sum(len(records) for records in recording.values()) == 6
    first, second = recording[b"acct-000"]  # account 0 is high risk: flagged
    assert (first.seq, second.seq, first.trigger) == (0, 1, "event")
    assert first.envelope.external_event == canonical_json_bytes(items[0])
    [call] = first.model_calls
    assert call.step_index == 0 and call.response == b"flag" and call.model == agents.MODEL_ID
    assert json.loads(call.request_json)["messages"][0]["content"] == (
        f"screen p-00000 amount={items[0]['amount']} risk=high"
    )
    assert call.request_digest == hashlib.sha256(call.request_json.encode()).hexdigest()
    assert call.input_tokens > 0 and call.output_tokens == 1
    [lookup] = first.tool_calls
    assert (lookup.tool_name, lookup.args_json, lookup.result_json) == (
        "risk",
        '{"account":"acct-000"}',
        '"high"',
    )
    assert lookup.position == 0 and call.position == 1
    [intent] = first.intents
    assert (intent.tool_name, intent.step_index, intent.args_json) == (
        "record",
        1,
        '{"note":"p-00000"}',
    )
    assert first.outcome == ActivationRecord.COMPLETE
    assert json.loads(first.output) == {"id": "p-00000", "decision": "flagged"}
    assert first.memory_before.known and not first.memory_before.slots
    [slot] = first.memory_after.slots
    assert slot.key == "amounts" and list(slot.slot.ring.items) == [
        str(items[0]["amount"]).encode()
    ]
    assert slot.digest == hashlib.sha256(slot.slot.SerializeToString(deterministic=True)).digest()
    assert second.memory_before == first.memory_after
    low = recording[b"acct-001"][0]
    assert not low.intents and json.loads(low.output)["decision"] == "ok"


def test_recording_is_off_by_default(tmp_path: Path) -> None:
    off = dataclasses.replace(agents.make_config(), record=False)
    events = agents.envelopes(agents.payments(3, 3))
    with beam.Pipeline() as pipeline:
        keyed = pipeline | beam.Create([(e.entity_key, e) for e in events]).with_output_types(PAIR)
        outputs = keyed | RunAgent(agents.screen, config=off)
        assert_that(outputs.records, equal_to([]), label="NoRecords")
        assert_that(outputs.output | beam.combiners.Count.Globally(), equal_to([3]))
    assert AgentConfig().record is False
    with pytest.raises(ValueError, match=r"AgentConfig\.record must be a bool or a RecordOptions"):
        AgentConfig(record="yes")  # type: ignore[arg-type]


def _big_memory_config() -> AgentConfig:
    return dataclasses.replace(agents.make_config(), record=RecordOptions(max_value_bytes=8))


def test_a_slot_over_the_value_limit_is_recorded_by_digest_only(tmp_path: Path) -> None:
    recording = record(
        tmp_path / "records",
        agents.envelopes(agents.payments(2, 1)),
        config=_big_memory_config,
    )
    first, second = recording[b"acct-000"]
    [small] = first.memory_after.slots  # one amount of up to three digits: 7 to 9 bytes
    [large] = second.memory_after.slots  # two amounts: over 8 bytes
    assert not large.HasField("slot") and large.size_bytes > 8 and len(large.digest) == 32
    assert small.HasField("slot") == (small.size_bytes <= 8)  # whole exactly when within it


def _retry_config(directory: str) -> AgentConfig:
    retry = FailFirstCommit(directory, entity_key=b"acct-001")
    return dataclasses.replace(agents.make_config(), before_commit=retry)


def test_a_retried_bundle_emits_identical_records(tmp_path: Path) -> None:
    events = agents.envelopes(agents.payments(8, 4))
    plain = record(tmp_path / "plain", events)
    markers = tmp_path / "markers"
    markers.mkdir()
    retried = record(tmp_path / "retried", events, config=lambda: _retry_config(str(markers)))
    assert list(markers.iterdir()), "no commit was failed and retried"
    as_bytes = {
        key: [r.SerializeToString(deterministic=True) for r in records]
        for key, records in plain.items()
    }
    assert {
        key: [r.SerializeToString(deterministic=True) for r in records]
        for key, records in retried.items()
    } == as_bytes


def test_records_files_round_trip_and_a_corrupt_one_is_refused(tmp_path: Path) -> None:
    recording = record(tmp_path / "records", agents.envelopes(agents.payments(4, 2)))
    records = [r for rs in recording.values() for r in rs]
    data = encode_records(records)
    assert parse_records(data) == records
    assert by_key(records + parse_records(data)) == recording  # a twin written twice: kept once
    with pytest.raises(RecordFileError, match="corrupt at byte"):
        parse_records(data[:-5], "cut.records")
    with pytest.raises(RecordFileError, match="not a beam-agents records file"):
        parse_records(b"hello", "hello.records")
    # A directory's records files are found at any depth: the parent of WriteRecords' one too.
    assert by_key(read_records([str(tmp_path)])) == recording
    bad = tmp_path / "bad.records"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordFileError, match=r"bad\.records is corrupt"):
        read_records([str(bad)])
    with pytest.raises(RecordFileError, match="no such file or directory"):
        read_records([str(tmp_path / "missing")])


def test_records_are_a_tagged_output_of_run_agent(tmp_path: Path) -> None:
    with beam.Pipeline() as pipeline:
        keyed = pipeline | beam.Create([]).with_output_types(PAIR)
        outputs = keyed | RunAgent(agents.screen, config=agents.make_config())
        assert outputs.records.element_type is not None
        assert outputs._fields == ("output", "intents", "traces", "errors", "records")
