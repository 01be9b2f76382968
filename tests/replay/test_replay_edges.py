"""``beam-agents replay`` at its edges: caught errors, memory, decoders, namespaces, tool results.

Each test records with the core alone (``record_direct``: fast, no pipeline), then replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from beam_agents._protos import ActivationRecord
from beam_agents.replay.inputs import RecordFileError, encode_records
from beam_agents.replay.replay import ops_of
from tests.replay import agents, tool_agents
from tests.replay.recording import command, command_json, record_direct

AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[ActivationRecord]]:
    """Eight payments over two accounts (``acct-000`` is flagged), recorded."""
    path = tmp_path_factory.mktemp("edges") / "screen.records"
    records = record_direct(path, agents.envelopes(agents.payments(8, 2)))
    return str(path), records


def test_a_call_the_agent_catches_is_still_drift_with_its_step(
    recorded: tuple[str, list[ActivationRecord]],
) -> None:
    path, _ = recorded
    agent = f"{AGENTS}:screen_asks_again"
    status, report = command_json("replay", path, "--agent", agent, *CONFIG)
    assert status == 3
    assert {run["status"] for run in report["runs"]} == {"drift"}
    flagged = [run for run in report["runs"] if bytes.fromhex(run["key"]) == b"acct-000"]
    for run in report["runs"]:
        assert run["kind"] == "model" and "anything else?" in run["replayed"]
    # The extra call takes step 1 where nothing was flagged, step 2 after the flagged intent.
    assert {run["step"] for run in flagged} == {2}
    assert {run["step"] for run in report["runs"] if run not in flagged} == {1}
    assert all(run["recorded"] == "(nothing)" for run in report["runs"])
    status, out, _ = command("replay", path, "--agent", agent, *CONFIG, "--key", "acct-001")
    assert "acct-001 seq 0: drift at activation 0 (event), step 1: model" in out


def test_a_removed_memory_write_is_divergent_at_the_memory(
    recorded: tuple[str, list[ActivationRecord]],
) -> None:
    path, _ = recorded
    agent = f"{AGENTS}:screen_forgetful"
    status, report = command_json("replay", path, "--agent", agent, *CONFIG)
    assert status == 1
    assert [(run["status"], run["kind"]) for run in report["runs"]] == [("divergent", "memory")] * 8
    first = report["runs"][0]
    assert '"amounts"' in first["recorded"] and first["replayed"] == "{}"


def test_without_config_recorded_bodies_are_refused_not_misread(
    recorded: tuple[str, list[ActivationRecord]],
) -> None:
    path, records = recorded
    assert {call.decoder for r in records for call in r.model_calls} == {"fake"}
    status, out, err = command("replay", path, "--agent", f"{AGENTS}:screen")
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and "pass --config" in err and "'fake'" in err


def test_the_records_intent_namespace_is_used(tmp_path: Path) -> None:
    path = tmp_path / "ns.records"
    records = record_direct(
        path, agents.envelopes(agents.payments(4, 2)), config=agents.make_config_in_namespace
    )
    assert {r.intent_namespace for r in records} == {"prod-v1"}
    assert any(r.intents for r in records)
    status, report = command_json("replay", str(path), "--agent", f"{AGENTS}:screen", *CONFIG)
    assert status == 0 and {run["status"] for run in report["runs"]} == {"same"}
    other = ("--config", f"{AGENTS}:make_config_in_other_namespace")
    status, out, err = command("replay", str(path), "--agent", f"{AGENTS}:screen", *other)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and "'prod-v1'" in err and "'staging'" in err


def test_a_pydantic_tool_result_comes_back_as_the_model(tmp_path: Path) -> None:
    path = tmp_path / "scored.records"
    events = agents.envelopes(agents.payments(2, 2))
    records = record_direct(path, events, tool_agents.scored, tool_agents.make_config)
    assert records[0].tool_calls[0].result_json == '{"account":"acct-000","score":8}'
    config = ("--config", "tests.replay.tool_agents:make_config")
    status, report = command_json(
        "replay", str(path), "--agent", "tests.replay.tool_agents:scored", *config
    )
    assert status == 0 and {run["status"] for run in report["runs"]} == {"same"}


def test_a_tool_result_with_no_json_form_is_marked_and_cannot_be_replayed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.records"
    events = agents.envelopes(agents.payments(1, 1))
    [record] = record_direct(path, events, tool_agents.locked, tool_agents.make_config)
    [call] = record.tool_calls
    assert (call.result_json, call.unrecorded_result_type) == ("", "lock")
    again = record_direct(tmp_path / "again", events, tool_agents.locked, tool_agents.make_config)
    assert again == [record]  # deterministic: no repr, no address
    config = ("--config", "tests.replay.tool_agents:make_config")
    status, out, err = command(
        "replay", str(path), "--agent", "tests.replay.tool_agents:locked", *config
    )
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and "cannot replay this tool result" in err


def test_repeated_call_positions_are_a_corrupt_record(
    recorded: tuple[str, list[ActivationRecord]], tmp_path: Path
) -> None:
    _, records = recorded
    broken = ActivationRecord()
    broken.CopyFrom(records[0])
    broken.tool_calls[0].position = broken.model_calls[0].position
    with pytest.raises(RecordFileError, match="repeated or out of range"):
        ops_of(broken)
    path = tmp_path / "broken.records"
    path.write_bytes(encode_records([broken]))
    status, _, err = command("replay", str(path), "--agent", f"{AGENTS}:screen", *CONFIG)
    assert status == 2 and "repeated or out of range" in err


def test_memory_recorded_by_digest_only_cannot_be_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "big.records"
    events = agents.envelopes(agents.payments(3, 1))
    records = record_direct(path, events, config=agents.make_config_small_values)
    [lost] = records[2].memory_before.slots  # two amounts: over 8 bytes
    assert not lost.HasField("slot")
    first = min(
        r.seq for r in records if any(not s.HasField("slot") for s in r.memory_before.slots)
    )
    status, out, err = command("replay", str(path), "--agent", f"{AGENTS}:screen", *CONFIG)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and f"cannot rebuild memory for seq {first}:" in err
