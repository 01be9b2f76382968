"""``beam-agents backtest --envelopes``: a candidate over envelope files, with no recording.

Envelopes are keyed and run in event-time order from a new key, as production would; every
model call goes to the candidate's provider (``--strict``: drift); a run that waits on an
intent waits on a new effect; the report lists the candidate's decisions, with no baseline.
Envelope files are written by ``write_envelopes`` and by ``WriteEnvelopes`` in a pipeline.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pytest

from beam_agents._protos import AgentEnvelope, ToolResult
from beam_agents.replay.inputs import (
    EnvelopeFileError,
    WriteEnvelopes,
    encode_envelopes,
    encode_records,
    envelope_files,
    read_envelope_file,
    write_envelopes,
)
from tests.replay import agents
from tests.replay.recording import backtest_twice, command, command_json, run_console

AGENTS = "tests.replay.agents"
CONFIG = ("--config", f"{AGENTS}:make_config")
ITEMS = agents.payments(120, 12, seed=5)
SHARD = r"envelopes-\d{5}-of-\d{5}\.envelopes"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The payments as envelopes in two files, out of event-time order."""
    directory = tmp_path_factory.mktemp("envelopes")
    envelopes = agents.envelopes(ITEMS)
    write_envelopes(str(directory / "b.envelopes"), envelopes[::2][::-1])
    write_envelopes(str(directory / "a.envelopes"), envelopes[1::2])
    return directory


def test_envelope_files_round_trip_and_pipelines_write_them_in_shards(tmp_path: Path) -> None:
    envelopes = agents.envelopes(ITEMS[:10])
    data = encode_envelopes(envelopes)
    (tmp_path / "one.envelopes").write_bytes(data)
    assert [e for _, e in read_envelope_file(str(tmp_path / "one.envelopes"))] == envelopes
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create(envelopes).with_output_types(AgentEnvelope)
            | WriteEnvelopes(str(tmp_path / "sharded"))
        )
    files = envelope_files([str(tmp_path / "sharded")])
    assert files and all(re.fullmatch(SHARD, Path(f).name) for f in files), files
    written = [e for f in files for _, e in read_envelope_file(f)]
    assert sorted(e.event_time_ms for e in written) == [e.event_time_ms for e in envelopes]
    assert sorted(written, key=lambda e: e.event_time_ms) == envelopes


def test_the_candidates_decisions_are_listed_with_no_baseline(inputs: Path, tmp_path: Path) -> None:
    calls = agents.PROVIDER.call_count
    status, report = command_json(
        "backtest", "--envelopes", str(inputs), "--agent", f"{AGENTS}:screen", *CONFIG,
        "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 0
    assert agents.PROVIDER.call_count == calls + len(ITEMS)
    assert (report["input"], report["baseline"]) == ("envelopes", False)
    assert (report["keys"], report["runs"], report["envelopes_skipped"]) == (12, 120, 0)
    assert report["activations"] == {"recorded": None, "candidate": 120}
    for compared in ("runs_changed", "keys_changed", "outputs_changed", "top_changes"):
        assert report[compared] is None
    assert report["model_calls"] == {"reused": 0, "new": 120}
    assert report["cost"]["recorded"] is None and report["tokens"]["recorded"] == {}
    decided = Counter(agents.decision(p) for p in ITEMS)
    assert 0 < decided["flagged"] < 120
    assert report["intents_by_tool"] == {"record": {"candidate": decided["flagged"]}}
    top = {entry["decision"]: entry["runs"] for entry in report["top_decisions"]}
    assert top['output.decision: "flagged"'] == top["intent: record"] == decided["flagged"]
    assert top['output.decision: "ok"'] == decided["ok"]
    assert not [line for line in top if line.startswith("output.id")]  # one run each: not common
    # Keyed as production: each key's runs take seqs 0, 1, ... in event-time order.
    for key in {str(p["account"]) for p in ITEMS}:
        runs = [run for run in report["candidate_runs"] if run["key"] == key]
        ids = [json.loads(run["candidate"]["outputs"][0])["id"] for run in runs]
        assert [run["seq"] for run in runs] == list(range(len(runs)))
        assert ids == [p["id"] for p in ITEMS if p["account"] == key]
    markdown = (tmp_path / "report.md").read_text()
    assert "Decisions changed: no baseline" in markdown
    assert "## Decisions changed per key\n\nNo baseline (a backtest over envelopes" in markdown
    assert "## Most common decisions" in markdown


def test_two_backtests_over_envelopes_give_byte_identical_reports(
    inputs: Path, tmp_path: Path
) -> None:
    reports = backtest_twice(
        tmp_path, [str(inputs)], f"{AGENTS}:screen_large_too", f"{AGENTS}:make_config",
        envelopes=True,
    )  # fmt: skip
    assert reports[0] == reports[1]
    flagged = sum(agents.decision(p, large=True) == "flagged" for p in ITEMS)
    assert json.loads(reports[0])["intents_by_tool"] == {"record": {"candidate": flagged}}


def test_strict_makes_every_model_call_drift(inputs: Path, tmp_path: Path) -> None:
    calls = agents.PROVIDER.call_count
    status, report = command_json(
        "backtest", "--envelopes", str(inputs), "--agent", f"{AGENTS}:screen", *CONFIG,
        "--strict", "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 3 and report["drift"]
    assert agents.PROVIDER.call_count == calls
    assert report["runs_failed"] == 120 and report["model_calls"]["new"] == 0


def test_a_run_waiting_on_an_intent_waits_on_a_new_effect(tmp_path: Path) -> None:
    items = agents.payments(40, 4, seed=8, wait=True)
    envelopes = agents.envelopes(items)
    answer = ToolResult(intent_id="not-known", status=ToolResult.OK, payload=b"{}")
    results = [AgentEnvelope(entity_key=e.entity_key, tool_result=answer) for e in envelopes[:3]]
    write_envelopes(str(tmp_path / "in.envelopes"), [*envelopes, *results])
    status, report = command_json(
        "backtest", str(tmp_path / "in.envelopes"), "--envelopes", "--agent",
        f"{AGENTS}:screen", *CONFIG, "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert status == 0
    assert (report["runs"], report["envelopes_skipped"]) == (40, 3)
    flagged = [p for p in items if agents.decision(p) == "flagged"]
    assert report["runs_waiting_on_new_effects"] == len(flagged) > 0
    waiting = {
        (run["key"], run["seq"])
        for run in report["candidate_runs"]
        if "waits on a new effect" in run["decisions"]
    }
    seqs = {str(p["account"]): -1 for p in items}
    expected = set()
    for payment in items:  # every event starts the key's next run, waiting or not
        key = str(payment["account"])
        seqs[key] += 1
        if agents.decision(payment) == "flagged":
            expected.add((key, seqs[key]))
    assert waiting == expected


def test_bad_envelope_input_exits_2_with_one_line(inputs: Path, tmp_path: Path) -> None:
    two = agents.envelopes(ITEMS[:2])
    corrupt = tmp_path / "corrupt.envelopes"
    corrupt.write_bytes(encode_envelopes(two)[:-3])
    second = len(encode_envelopes(two[:1]))  # where the cut envelope starts
    keyless = tmp_path / "keyless.envelopes"
    keyless.write_bytes(encode_envelopes([AgentEnvelope(external_event=b"{}")]))
    records = tmp_path / "some.envelopes"
    records.write_bytes(encode_records([]))
    (tmp_path / "empty").mkdir()
    cases = {
        f"corrupt.envelopes is corrupt at byte {second}": corrupt,
        "keyless.envelopes has an envelope at byte 24 with no entity_key": keyless,
        "some.envelopes is not a beam-agents envelopes file": records,
        "missing: no such file or directory": tmp_path / "missing",
        "empty: no envelopes files": tmp_path / "empty",
    }
    for expected, path in cases.items():
        completed = run_console(
            "backtest", "--envelopes", str(path), "--agent", f"{AGENTS}:screen", *CONFIG
        )
        assert completed.returncode == 2, completed.stderr
        lines = completed.stderr.splitlines()
        assert len(lines) == 1 and expected in lines[0], completed.stderr
        assert lines[0].startswith("beam-agents backtest: ")
    with pytest.raises(EnvelopeFileError, match="corrupt at byte"):
        envelope_files([str(inputs), str(corrupt)])
    status, _, err = command("backtest", str(inputs), "--agent", f"{AGENTS}:screen", *CONFIG)
    assert status == 2 and "no records files" in err  # envelope files are not records
