"""``beam-agents replay``: recorded runs against the current agent code, offline.

An unchanged agent replays every run as ``same`` without a provider call; a changed prompt is
reported at its step with both requests; a removed ``act`` as a divergent intent; a call the
record cannot answer is drift (exit 3); bad input exits 2 with one line on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_agents._protos import ActivationRecord
from beam_agents.replay.inputs import encode_records
from tests.replay import agents
from tests.replay.recording import command, command_json, record, run_console

REPO = Path(__file__).resolve().parents[2]
AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, dict[bytes, list[ActivationRecord]]]:
    """Twelve payments over four accounts, recorded; the directory and the records by key."""
    directory = tmp_path_factory.mktemp("replay") / "records"
    recording = record(directory, agents.envelopes(agents.payments(12, 4)))
    return str(directory), recording


def test_an_unchanged_agent_replays_every_run_as_same_without_calling_the_provider(
    recorded: tuple[str, dict[bytes, list[ActivationRecord]]],
) -> None:
    directory, recording = recorded
    calls = agents.PROVIDER.call_count
    status, out, err = command("replay", directory, "--agent", f"{AGENTS}:screen", *CONFIG)
    assert (status, err) == (0, "")
    assert agents.PROVIDER.call_count == calls
    runs = sum(len(records) for records in recording.values())
    assert out.count(": same (1 activations)") == runs == 12
    assert out.splitlines()[-1] == "replay: 12 runs: 12 same, 0 divergent, 0 drift"
    status, report = command_json("replay", directory, "--agent", f"{AGENTS}:screen", *CONFIG)
    assert status == 0 and {run["status"] for run in report["runs"]} == {"same"}


def test_a_changed_prompt_is_reported_at_its_step_with_both_requests(
    recorded: tuple[str, dict[bytes, list[ActivationRecord]]],
) -> None:
    directory, _ = recorded
    agent = f"{AGENTS}:screen_prompt_changed"
    status, report = command_json(
        "replay", directory, "--agent", agent, *CONFIG, "--key", "acct-001"
    )
    assert status == 1
    assert [run["status"] for run in report["runs"]] == ["divergent"] * 3
    first = report["runs"][0]
    assert (first["kind"], first["step"], first["activation"]) == ("model", 0, 0)
    assert "amount=" in first["recorded"] and "amt=" in first["replayed"]
    removed = [line[1:].strip() for line in first["diff"] if line.startswith("-  ")]
    added = [line[1:].strip() for line in first["diff"] if line.startswith("+  ")]
    assert removed[0].startswith('"content": "screen p-00001 amount=')
    assert added[0].startswith('"content": "screen p-00001 amt=')
    status, out, _ = command("replay", directory, "--agent", agent, *CONFIG, "--key", "acct-001")
    assert "acct-001 seq 0: divergent at activation 0 (event), step 0: model" in out


def test_a_removed_act_is_reported_as_a_divergent_intent(
    recorded: tuple[str, dict[bytes, list[ActivationRecord]]],
) -> None:
    directory, _ = recorded
    agent = f"{AGENTS}:screen_without_act"
    status, report = command_json("replay", directory, "--agent", agent, *CONFIG)
    assert status == 1
    diverged = [run for run in report["runs"] if run["status"] != "same"]
    assert {bytes.fromhex(run["key"]) for run in diverged} == {b"acct-000"}  # risk: high
    for run in diverged:
        assert (run["kind"], run["step"]) == ("intent", 1)
        assert run["recorded"].startswith('intent \'record\' at step 1: {"note":"p-')
        assert run["replayed"] == "(nothing)"


def test_a_call_the_record_cannot_answer_is_drift(tmp_path: Path) -> None:
    recording = record(tmp_path / "records", agents.envelopes(agents.payments(4, 2)))
    records = [r for rs in recording.values() for r in rs]
    cut = records[0]
    del cut.model_calls[:]  # the record lost its model call
    (tmp_path / "cut.records").write_bytes(encode_records(records))
    status, report = command_json(
        "replay", str(tmp_path / "cut.records"), "--agent", f"{AGENTS}:screen", *CONFIG
    )
    assert status == 3
    drifted = [run for run in report["runs"] if run["status"] == "drift"]
    assert [(bytes.fromhex(r["key"]), r["seq"], r["kind"]) for r in drifted] == [
        (cut.entity_key, cut.seq, "model")
    ]
    assert drifted[0]["recorded"].startswith("intent 'record'")
    assert "amount=" in drifted[0]["replayed"]


def test_bad_input_exits_2_with_one_line(
    recorded: tuple[str, dict[bytes, list[ActivationRecord]]], tmp_path: Path
) -> None:
    directory, _ = recorded
    corrupt = tmp_path / "corrupt.records"
    corrupt.write_bytes(b"BEAM-AGENTS-RECORDS/1\n\x05abc")
    cases = {
        "corrupt.records is corrupt at byte 22": [str(corrupt), "--agent", f"{AGENTS}:screen"],
        "has no 'nope'": [directory, "--agent", f"{AGENTS}:nope"],
        "cannot import agent module": [directory, "--agent", "no_such_module_x:agent"],
        "is not an `async def agent(ctx)`": [directory, "--agent", f"{AGENTS}:not_an_agent"],
        "no records for key 'acct-999'": [
            directory,
            "--agent",
            f"{AGENTS}:screen",
            "--key",
            "acct-999",
        ],
    }
    for expected, argv in cases.items():
        completed = run_console("replay", *argv)
        assert completed.returncode == 2, completed.stderr
        assert completed.stdout == ""
        lines = completed.stderr.splitlines()
        assert len(lines) == 1 and expected in lines[0], completed.stderr
        assert lines[0].startswith("beam-agents replay: ")
    usage = run_console("replay", directory)
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1


def test_python_dash_m_runs_the_same_command(
    recorded: tuple[str, dict[bytes, list[ActivationRecord]]],
) -> None:
    directory, _ = recorded
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "beam_agents.replay", "replay", directory, "--agent",
         f"{AGENTS}:screen", *CONFIG, "--key", "acct-002"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "replay: 3 runs: 3 same, 0 divergent, 0 drift"
