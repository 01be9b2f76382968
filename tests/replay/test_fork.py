"""``beam-agents replay --fork-at SEQ --candidate M:F``: a key's history, then a candidate.

The runs before ``SEQ`` replay as ``same``; from ``SEQ`` on the candidate continues on their state
and each of its runs is reported beside the recorded one.
"""

from __future__ import annotations

from pathlib import Path

from tests.replay import agents
from tests.replay.recording import command, command_json, record

AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")


def test_a_fork_replays_the_history_and_reports_what_the_candidate_does_next(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "records"
    record(directory, agents.envelopes(agents.payments(12, 4)))
    fork = ("replay", str(directory), "--agent", f"{AGENTS}:screen", *CONFIG, "--key", "acct-000")
    calls = agents.PROVIDER.call_count
    status, report = command_json(*fork, "--fork-at", "1", "--candidate", f"{AGENTS}:screen")
    assert status == 0
    assert report["history"] == [{"seq": 0, "status": "same"}]
    assert [run["seq"] for run in report["runs"]] == [1, 2]
    assert all(run["changes"] == [] for run in report["runs"])
    assert report["model_calls"] == {"reused": 2, "new": 0}
    assert agents.PROVIDER.call_count == calls

    candidate = f"{AGENTS}:screen_without_act"
    status, report = command_json(*fork, "--fork-at", "1", "--candidate", candidate)
    assert status == 1
    assert [run["changes"] for run in report["runs"]] == [["intent removed: record"]] * 2
    assert report["runs"][0]["recorded"]["intents"] == [
        {"tool": "record", "args": '{"note":"p-00004"}'}
    ]
    assert report["runs"][0]["candidate"]["intents"] == []

    status, out, _ = command(*fork, "--fork-at", "2", "--candidate", candidate)
    assert status == 1
    assert out.splitlines()[0] == "acct-000: history before seq 2: 2 runs, 2 same"
    assert "acct-000 seq 2 (candidate): intent removed: record" in out


def test_a_fork_past_the_history_or_without_a_key_is_bad_input(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    record(directory, agents.envelopes(agents.payments(4, 2)))
    base = ("replay", str(directory), "--agent", f"{AGENTS}:screen", *CONFIG)
    status, _, err = command(
        *base, "--key", "acct-000", "--fork-at", "9", "--candidate", f"{AGENTS}:screen"
    )
    assert status == 2 and "no recorded run at or after seq 9" in err
    status, _, err = command(*base, "--fork-at", "1", "--candidate", f"{AGENTS}:screen")
    assert status == 2 and "--fork-at needs --candidate and --key" in err
