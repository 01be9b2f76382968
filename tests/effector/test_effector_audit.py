"""The effector is loud: conflicts, rejections, expiries and tool errors each log one line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, make_intent, running_effector, wait_done
from effector_test_tools import make_registry

from beam_agents._protos import SubmitAck, ToolIntent, ToolResult
from beam_agents.tools import ToolRegistry, tool
from effector.observability import CONFLICT_HINT, escape_text
from effector.readable import is_hiding
from effector.server import ServerSettings

AUDIT = "effector.audit"


def audit_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == AUDIT and r.levelno == level]


def audit_lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in audit_records(caplog, level)]


@tool(side_effect=True)
def look_up(name: str) -> str:
    """Look a name up in an empty table: raises ``KeyError``."""
    table: dict[str, str] = {}
    return table[name]


@pytest.mark.asyncio
async def test_a_conflict_is_rejected_logged_with_what_differs_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_intent("add", {"a": 1}, key=b"acct-1", created_at_ms=1_000)
    changed = ToolIntent()
    changed.CopyFrom(first)
    changed.args_json = '{"a":2}'
    changed.created_at_ms = 2_000
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        caplog.set_level(logging.INFO, logger=AUDIT)
        [accepted] = await effector.client.submit([first])
        [refused] = await effector.client.submit([changed])
        # Twice in one batch: the first of the batch is recorded, the second conflicts with it.
        twin = make_intent("add", {"a": 5}, key=b"acct-2")
        other = ToolIntent()
        other.CopyFrom(twin)
        other.tool_name = "noop"
        other.args_json = "{}"
        acks = await effector.client.submit([twin, other])
        metrics = effector.server.metrics.registry
        conflicts = metrics.get_sample_value(
            "effector_intents_rejected_total", {"cause": "conflict"}
        )
    assert accepted.outcome == SubmitAck.ACCEPTED
    assert refused.outcome == SubmitAck.REJECTED
    assert refused.reason.startswith(f"conflict: intent {first.intent_id}")
    assert CONFLICT_HINT in refused.reason
    assert [ack.outcome for ack in acks] == [SubmitAck.ACCEPTED, SubmitAck.REJECTED]
    assert conflicts == 2
    lines = audit_lines(caplog)
    assert len(lines) == 2
    assert lines[0] == (
        f"REJECTED intent {first.intent_id} (key acct-1, tool 'add'): conflict, its id is "
        "already recorded with different content (args_json: recorded '{\"a\":1}', submitted "
        "'{\"a\":2}'; created_at_ms: recorded 1000, submitted 2000); the first submission is "
        f"kept. Two agents or pipelines minting the same ids? {CONFLICT_HINT}"
    )
    assert f"intent {twin.intent_id} (key acct-2, tool 'noop')" in lines[1]
    assert "tool_name: recorded 'add', submitted 'noop'" in lines[1]
    assert "args_json: recorded '{\"a\":5}', submitted '{}'" in lines[1]


@pytest.mark.asyncio
async def test_every_rejection_logs_one_warning_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = make_intent("missing", key=b"k1")
    invalid = make_intent("add", {"a": "not a number"}, key=b"k2")
    malformed = make_intent("add", {"a": 1}, key=b"k3")
    malformed.intent_id = "order-17"
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        caplog.set_level(logging.INFO, logger=AUDIT)
        acks = await effector.client.submit([unknown, invalid, malformed])
        # Resubmitted, the recorded rejections are DUPLICATEs: nothing more is logged.
        again = await effector.client.submit([unknown, invalid])
    assert [ack.outcome for ack in acks] == [SubmitAck.REJECTED] * 3
    assert [ack.outcome for ack in again] == [SubmitAck.DUPLICATE] * 2
    lines = sorted(audit_lines(caplog), key=lambda line: line.split(" (key ")[1])
    assert len(lines) == 3
    assert lines[0] == f"REJECTED intent {unknown.intent_id} (key k1, tool 'missing'): " + (
        acks[0].reason
    )
    assert lines[1].startswith(f"REJECTED intent {invalid.intent_id} (key k2, tool 'add'): ")
    assert acks[1].reason in lines[1]
    assert lines[2] == f"REJECTED intent order-17 (key k3, tool 'add'): {acks[2].reason}"
    assert "not a UUID" in lines[2]


@pytest.mark.asyncio
async def test_a_tool_error_logs_its_type_and_message_and_the_traceback_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = ToolRegistry([look_up])
    failing = make_intent("look_up", {"name": "missing"}, key=b"acct-9")
    caplog.set_level(logging.DEBUG, logger=AUDIT)
    async with running_effector(sqlite_url(tmp_path / "s.db"), registry) as effector:
        await effector.client.submit([failing])
        done = await wait_done(effector.client, [failing.intent_id])
    result = done[failing.intent_id].result
    assert (result.status, result.error_message) == (ToolResult.ERROR, "KeyError: 'missing'")
    assert audit_lines(caplog) == [
        f"ERROR intent {failing.intent_id} (key acct-9, tool 'look_up'), attempt 1: "
        "KeyError: 'missing'"
    ]
    [debug] = audit_records(caplog, logging.DEBUG)
    assert debug.exc_info is not None and debug.exc_info[0] is KeyError
    assert "return table[name]" in caplog.text  # the traceback reaches the tool's own line


@pytest.mark.asyncio
async def test_expiries_log_one_line_each(
    tmp_path: Path, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The key is busy long enough for the intent behind it to outlive its 1 ms TTL.
    busy = make_intent("slow", {"seconds": 0.3}, key=b"busy", step=0)
    late = make_intent("add", {"a": 1}, key=b"busy", step=1, ttl_ms=1)
    unanswered = make_intent("", {"n": 1}, key=b"ask", kind=ToolIntent.APPROVAL, ttl_ms=1)
    decided_late = make_intent("", {"n": 2}, key=b"ask2", kind=ToolIntent.APPROVAL, ttl_ms=50)
    settings = ServerSettings(worker=FAST_WORKER)
    registry = make_registry()
    async with running_effector(sqlite_url(tmp_path / "s.db"), registry, settings) as effector:
        caplog.set_level(logging.INFO, logger=AUDIT)
        await effector.client.submit([busy, late, decided_late])
        await asyncio.sleep(0.06)
        decision = await effector.client.decide(decided_late.intent_id, approved=True)
        await effector.client.submit([unanswered])
        done = await wait_done(effector.client, [late.intent_id, unanswered.intent_id])
    assert not decision.applied
    assert done[late.intent_id].result.status == ToolResult.EXPIRED
    assert done[unanswered.intent_id].result.status == ToolResult.EXPIRED
    assert audit_lines(caplog) == [
        f"EXPIRED intent {late.intent_id} (key busy, tool 'add'): its TTL ran out before it was run"
    ]
    expiries = [line for line in audit_lines(caplog, logging.INFO) if line.startswith("EXPIRED")]
    assert sorted(expiries) == sorted(
        f"EXPIRED intent {intent.intent_id} (key {key}, tool ''): no decision before its deadline"
        for intent, key in ((unanswered, "ask"), (decided_late, "ask2"))
    )


HIDDEN_ON_PAGES = "\u00ad\u180e\ufff9\ufffa\ufffb\ue000\U000f0000\u202e\x1b\n\u2028"
"""Soft hyphen, Mongolian vowel separator, interlinear annotation marks, private use, bidi,
ESC, newline, line separator: characters pages mark as hidden (``readable.is_hiding``)."""


@pytest.mark.asyncio
async def test_a_logged_value_escapes_every_character_a_page_marks_as_hidden(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    malformed = make_intent("add", {"a": 1}, key=b"k-hidden")
    malformed.intent_id = f"order{HIDDEN_ON_PAGES}17"
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        caplog.set_level(logging.INFO, logger=AUDIT)
        [ack] = await effector.client.submit([malformed])
    assert ack.outcome == SubmitAck.REJECTED
    [line] = [line for line in audit_lines(caplog) if "k-hidden" in line]
    assert not [char for char in line if is_hiding(char)], repr(line)
    escaped = "".join(ascii(char)[1:-1] for char in HIDDEN_ON_PAGES)
    assert f"REJECTED intent order{escaped}17 (key k-hidden" in line


def test_logs_and_pages_share_one_definition_of_a_hidden_character() -> None:
    for code_point in range(0x110000):
        char = chr(code_point)
        assert (escape_text(char) != char) == is_hiding(char), f"U+{code_point:04X}"
    assert escape_text(f"a{HIDDEN_ON_PAGES}b\u00e9\u4e2d") == (
        "a\\xad\\u180e\\ufff9\\ufffa\\ufffb\\ue000\\U000f0000\\u202e\\x1b\\n\\u2028b\u00e9\u4e2d"
    )
