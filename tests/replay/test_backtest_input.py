"""``beam-agents backtest``'s exit contract: bad input and a failing pipeline exit 2 with one
line (never 1, which means decisions changed), and drift counts even when the agent catches it.
"""

from __future__ import annotations

from pathlib import Path

from beam_agents.replay.inputs import parse_records
from beam_agents.replay.replay import continue_with
from tests.replay import agents
from tests.replay.recording import command, record_direct

AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")


def _one_line_exit_2(argv: list[str], expected: str) -> None:
    status, out, err = command("backtest", *argv)
    assert (status, out) == (2, ""), (status, out, err)
    assert len(err.splitlines()) == 1 and expected in err, err
    assert "Traceback" not in err


def test_a_corrupt_records_file_is_refused_before_the_pipeline(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.records"
    corrupt.write_bytes(b"BEAM-AGENTS-RECORDS/1\n\x05abc")
    out = tmp_path / "out"
    _one_line_exit_2(
        [str(corrupt), "--agent", f"{AGENTS}:screen", *CONFIG, "--out", str(out)],
        "corrupt.records is corrupt at byte 22",
    )
    assert not out.exists()  # nothing ran


def test_a_pipeline_that_cannot_run_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "screen.records"
    record_direct(path, agents.envelopes(agents.payments(2, 1)))
    argv = [str(path), "--agent", f"{AGENTS}:screen", *CONFIG, "--out", str(tmp_path / "out")]
    _one_line_exit_2([*argv, "--runner", "NopeRunner"], "Unexpected pipeline runner: NopeRunner")
    _one_line_exit_2(argv[:3] + argv[5:], "pass --config")  # no decoder for the bodies


def test_a_caught_unanswerable_call_is_drift(tmp_path: Path) -> None:
    path = tmp_path / "screen.records"
    record_direct(path, agents.envelopes(agents.payments(3, 1)))
    records = parse_records(path.read_bytes())
    config = agents.make_config()
    _, _, drift = continue_with(records, agents.screen, config, None, strict=True)
    assert not drift
    runs, _, drift = continue_with(records, agents.screen_asks_again, config, None, strict=True)
    assert drift and len(runs) == 3
    assert all(run.candidate.activations == 1 for run in runs)  # every activation committed
