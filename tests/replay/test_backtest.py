"""``beam-agents backtest``: a candidate over recorded history, as a Beam batch pipeline.

Over 1,000 recorded activations on 100 keys an unchanged candidate changes nothing and makes no
new model call; a changed decision rule changes exactly the keys computed here without it; two
backtests give byte-identical JSON reports. Against a recording made through a real effector,
recorded results resume the candidate's runs, and nothing is ever executed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from effector_harness import BackgroundEffector
from effector_test_tools import read_ledger

from beam_agents._protos import ActivationRecord, EffectorStub, StatusRequest
from beam_agents.replay.backtest import Price, run_backtest
from tests.io.io_harness import started
from tests.replay import agents
from tests.replay.recording import backtest_twice, command, command_json, record, record_loop

AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")
ITEMS = agents.payments(1_000, 100)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000 payments on 100 accounts, recorded."""
    directory = tmp_path_factory.mktemp("backtest") / "records"
    recording = record(directory, agents.envelopes(ITEMS))
    assert sum(len(records) for records in recording.values()) == 1_000
    assert len(recording) == 100
    return directory


def test_an_unchanged_candidate_changes_nothing_and_calls_no_model(
    history: Path, tmp_path: Path
) -> None:
    calls = agents.PROVIDER.call_count
    started = time.perf_counter()
    status, out, _ = command(
        "backtest", str(history), "--agent", f"{AGENTS}:screen", *CONFIG, "--out", str(tmp_path)
    )
    assert time.perf_counter() - started < 60
    assert status == 0, out
    assert agents.PROVIDER.call_count == calls
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["keys"], report["runs"]) == (100, 1_000)
    assert report["activations"] == {"recorded": 1_000, "candidate": 1_000}
    assert (report["runs_changed"], report["keys_changed"]) == (0, [])
    assert report["model_calls"] == {"reused": 1_000, "new": 0}
    assert report["tokens"]["recorded"] == report["tokens"]["candidate"]
    assert out.startswith("# Backtest report\n")
    assert "Runs whose decision changed: 0, on 0 keys" in out
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")


def test_a_changed_rule_changes_exactly_the_keys_it_should(history: Path, tmp_path: Path) -> None:
    expected_runs = [p for p in ITEMS if agents.decision(p) != agents.decision(p, large=True)]
    expected_keys = sorted({str(p["account"]) for p in expected_runs})
    assert 0 < len(expected_keys) < 100
    status, report = command_json(
        "backtest", str(history), "--agent", f"{AGENTS}:screen_large_too", *CONFIG,
        "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 1
    assert report["keys_changed"] == expected_keys
    assert report["runs_changed"] == len(expected_runs) == report["outputs_changed"]
    assert report["intents_by_tool"] == {"record": {"added": len(expected_runs), "removed": 0}}
    assert report["model_calls"] == {"reused": 1_000, "new": 0}
    top = report["top_changes"]
    assert [change["change"] for change in top] == [
        "intent added: record",
        'output.decision: "ok" -> "flagged"',
    ]
    assert top[0]["runs"] == len(expected_runs) and len(top[0]["examples"]) == 3


def test_two_backtests_of_the_same_inputs_give_byte_identical_reports(
    history: Path, tmp_path: Path
) -> None:
    prices = {agents.MODEL_ID: Price(3.0, 15.0)}
    reports = backtest_twice(
        tmp_path, [str(history)], f"{AGENTS}:screen_prompt_changed", f"{AGENTS}:make_config",
        prices=prices,
    )  # fmt: skip
    assert reports[0] == reports[1]
    report = json.loads(reports[0])
    assert report["model_calls"] == {"reused": 0, "new": 1_000}  # every prompt is new
    assert report["runs_changed"] == 0
    assert report["cost"]["recorded"] > 0 and report["cost"]["unpriced_models"] == []
    assert report["cost"]["delta"] == pytest.approx(
        report["cost"]["candidate"] - report["cost"]["recorded"]
    )


def test_strict_makes_a_new_model_request_drift(history: Path, tmp_path: Path) -> None:
    calls = agents.PROVIDER.call_count
    status, report = command_json(
        "backtest", str(history), "--agent", f"{AGENTS}:screen_prompt_changed", *CONFIG,
        "--strict", "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 3 and report["drift"]
    assert agents.PROVIDER.call_count == calls
    assert report["model_calls"]["new"] == 0
    # Every run failed on its first new request: failures, counted apart from changed decisions.
    assert (report["runs_failed"], report["runs_changed"], report["keys_changed"]) == (1_000, 0, [])
    assert report["outputs_changed"] == 0 and report["decisions_changed_per_key"] == []
    markdown = (tmp_path / "report.md").read_text()
    assert "- Runs whose decision changed: 0, on 0 keys; outputs changed: 0.\n" in markdown
    assert "- Runs with a failed activation: 1,000 (counted apart" in markdown
    assert "## Decisions changed per key\n\nNone." in markdown


def _store_status(target: str) -> str:
    with grpc.insecure_channel(target) as channel:
        return str(EffectorStub(channel).Status(StatusRequest(), timeout=10))


def _resumes(records: dict[bytes, list[ActivationRecord]]) -> int:
    return sum(r.trigger == "tool_result" for rs in records.values() for r in rs)


def test_results_come_from_the_record_and_no_intent_is_executed(
    effector: BackgroundEffector, ledger: Path, tmp_path: Path
) -> None:
    items = agents.payments(30, 10, seed=4, wait=True)
    recording = record_loop(tmp_path / "records", effector.address, agents.envelopes(items))
    flagged = [p for p in items if agents.decision(p) == "flagged"]
    assert _resumes(recording) == len(flagged) > 0
    executed, status_before = read_ledger(ledger), _store_status(effector.address)
    assert len(started(executed)) == len(flagged)

    report = run_backtest(
        [str(tmp_path / "records")], f"{AGENTS}:screen", f"{AGENTS}:make_config",
        out=str(tmp_path / "same"),
    )  # fmt: skip
    assert report["runs_changed"] == 0
    assert report["activations"] == {"recorded": 30 + len(flagged), "candidate": 30 + len(flagged)}
    status, out, _ = command(
        "replay", str(tmp_path / "records"), "--agent", f"{AGENTS}:screen", *CONFIG
    )
    assert status == 0 and out.count("same (2 activations)") == len(flagged), out  # resumed runs

    report = run_backtest(
        [str(tmp_path / "records")], f"{AGENTS}:screen_large_too", f"{AGENTS}:make_config",
        out=str(tmp_path / "changed"),
    )  # fmt: skip
    newly = [p for p in items if agents.decision(p) != agents.decision(p, large=True)]
    assert report["runs_changed"] == len(newly) > 0
    assert report["runs_waiting_on_new_effects"] == len(newly)
    assert [c["change"] for c in report["top_changes"]] == [
        "intent added: record",
        "output removed",
        "waits on a new effect",
    ]
    assert read_ledger(ledger) == executed
    assert _store_status(effector.address) == status_before


def test_a_candidate_without_a_provider_cannot_decode_the_recorded_calls(
    history: Path, tmp_path: Path
) -> None:
    status, out, err = command(
        "backtest", str(history), "--agent", f"{AGENTS}:screen_prompt_changed",
        "--config", f"{AGENTS}:make_config_without_provider", "--out", str(tmp_path),
    )  # fmt: skip
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and "'fake' bodies" in err and "pass --config" in err
    assert not (tmp_path / "report.json").exists()  # refused before the pipeline
