"""The committed generated code matches the protos, and the wire names match API.md."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

from beam_agents._protos import AgentEnvelope, Approval, ToolIntent, ToolResult, TraceEvent

REPO = Path(__file__).resolve().parent.parent
GENERATED = REPO / "beam_agents" / "_protos"


def test_regenerating_the_protos_changes_nothing(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = tmp_path / "beam_agents" / "_protos"
    fresh_files = sorted(path.name for path in fresh.iterdir() if path.is_file())
    committed_files = sorted(
        path.name
        for path in GENERATED.iterdir()
        if path.name.endswith((".py", ".pyi")) and "_pb2" in path.name
    )
    assert fresh_files == committed_files, "run `make proto` and commit the result"
    _, mismatch, errors = filecmp.cmpfiles(fresh, GENERATED, fresh_files, shallow=False)
    assert mismatch == [] and errors == [], f"stale generated code: {mismatch or errors}"


def test_status_enum_has_an_unspecified_zero_and_the_four_outcomes() -> None:
    assert ToolResult.STATUS_UNSPECIFIED == 0
    assert {ToolResult.OK, ToolResult.ERROR, ToolResult.EXPIRED, ToolResult.REJECTED} == {
        1,
        2,
        3,
        4,
    }


def test_envelope_payload_is_a_oneof_of_event_result_and_approval() -> None:
    envelope = AgentEnvelope(entity_key=b"k", event_time_ms=5, external_event=b"x")
    assert envelope.WhichOneof("payload") == "external_event"
    envelope.approval.CopyFrom(Approval(intent_id="i", approved=True))
    assert envelope.WhichOneof("payload") == "approval"
    assert not envelope.HasField("external_event")


def test_intent_and_trace_enums_match_the_api_contract() -> None:
    assert ToolIntent.TOOL != ToolIntent.APPROVAL
    names = {TraceEvent.EventType.Name(value) for value in TraceEvent.EventType.values()}
    assert names == {
        "EVENT_TYPE_UNSPECIFIED",
        "ACTIVATION_START",
        "LLM_CALL",
        "TOOL_CALL",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_END",
        "ERROR",
    }
