"""The console's pure parts: waterfalls from trace events, formatting, sessions and CSRF.

None of these needs a server: each takes trace events, values or a clock and returns what a
page shows, so positions, fallbacks and token checks are asserted exactly.
"""

from __future__ import annotations

import json

import pytest

import effector.console.views as views
from beam_agents._protos import TraceEvent
from effector.console.runs import build_runs, memory_slots
from effector.console.security import SESSION_LIFETIME_S, Sessions, local_path
from effector.observability import display_key
from tests.console.runs_data import MEMORY, MS, agent_run

START_NS = 1_767_225_600_000 * MS


def test_a_waterfall_places_spans_by_their_wall_clock_times() -> None:
    [run] = build_runs(agent_run(b"k", 4, START_NS, waited_ms=1_569))
    assert (run.seq, run.status, run.timing) == (4, "completed", "wall clock")
    assert run.took == "2.3 s"  # 431 ms active, 1,569 ms waiting, 260 ms resumed
    kinds = [span.kind for span in run.spans]
    assert kinds == [
        "activation",
        "llm",
        "tool",
        "intent",
        "suspended",
        "wait",
        "activation",
        "llm",
        "intent",
        "end",
    ]
    first, model, tool = run.spans[:3]
    assert first.offset == 0 and first.width == pytest.approx(431 / 2260 * 100, abs=1e-3)
    assert model.offset == pytest.approx(3 / 2260 * 100, abs=1e-3) and model.took == "362 ms"
    assert model.detail == "816 in / 100 out tokens anthropic"  # seq 4
    assert (tool.label, tool.detail) == ("tool lookup_order", "ok call_0004")
    wait = run.spans[5]
    assert wait.offset == pytest.approx(431 / 2260 * 100, abs=1e-3)
    assert wait.width == pytest.approx(1569 / 2260 * 100, abs=1e-3) and wait.took == "1.6 s"
    assert wait.detail == "until resumed by approval"
    assert run.spans[3].intent_id and run.spans[3].label == "intent approval"
    assert all(span.offset >= 0 and span.offset + span.width <= 100 + 1e-9 for span in run.spans)


def test_runs_are_newest_first_and_a_suspended_run_says_so() -> None:
    events = agent_run(b"k", 0, START_NS) + agent_run(b"k", 1, START_NS, completed=False)
    runs = build_runs(reversed(events))  # however the events arrive
    assert [(run.seq, run.status) for run in runs] == [(1, "suspended"), (0, "completed")]
    suspended = runs[0].spans[-1]
    assert suspended.kind == "suspended" and suspended.detail.startswith("1 pending, deadline ")


def test_without_wall_clock_times_spans_fall_back_to_event_time_then_to_order() -> None:
    untimed = agent_run(b"k", 0, START_NS, timed=False)
    [run] = build_runs(untimed)  # every event has the same event time
    assert run.timing == "order" and run.took == "-"
    assert [span.offset for span in run.spans[:2]] == pytest.approx(
        [0, 100 / len(untimed)], abs=1e-3
    )
    assert all(span.took == "" for span in run.spans)
    for event in untimed[5:]:
        event.start_ms = event.end_ms = event.start_ms + 30_000  # resumed half a minute later
    [by_event_time] = build_runs(untimed)
    assert by_event_time.timing == "event time"
    assert by_event_time.spans[5].took == "30.0 s" and by_event_time.spans[6].offset == 100 - 0.5


def test_an_unmeasured_span_in_a_measured_run_sits_where_the_one_before_ended() -> None:
    events = agent_run(b"k", 0, START_NS)
    events[2].wall_start_unix_nano = events[2].wall_end_unix_nano = 0
    [run] = build_runs(events)
    model, tool = run.spans[1], run.spans[2]
    assert tool.offset == pytest.approx(model.offset + model.width, abs=1e-3) and tool.took == ""


def test_spans_render_whatever_attributes_they_carry() -> None:
    legacy = TraceEvent(
        seq=0,
        sequence=1,
        event_type=TraceEvent.TOOL_CALL,
        attributes={"tool_name": "lookup", "status": "error"},
    )
    bare = TraceEvent(seq=0, sequence=2, event_type=TraceEvent.LLM_CALL)
    failed = TraceEvent(
        seq=0, sequence=3, event_type=TraceEvent.ERROR, attributes={"reason": "activation_error"}
    )
    [run] = build_runs([legacy, bare, failed])
    assert [(s.label, s.detail) for s in run.spans] == [
        ("tool lookup", "error"),
        ("model", ""),
        ("error", "activation_error"),
    ]
    assert run.status == "failed"


def test_memory_slots_come_from_the_newest_run_that_reports_them() -> None:
    older = agent_run(b"k", 0, START_NS, memory={"history": 10})
    newer = agent_run(b"k", 1, START_NS, memory=MEMORY)
    assert memory_slots(newer + older) == sorted(MEMORY.items())
    assert memory_slots(agent_run(b"k", 2, START_NS, completed=False)) is None
    broken = agent_run(b"k", 3, START_NS)
    broken[-1].attributes["beam_agents.memory.slots"] = "not json"
    assert memory_slots(broken) is None
    empty = agent_run(b"k", 3, START_NS, memory={})
    assert memory_slots(empty) == []
    suspended = agent_run(b"k", 4, START_NS, completed=False)
    suspended[-1].attributes["beam_agents.memory.slots"] = '{"draft": 7}'
    assert memory_slots(newer + suspended) == [("draft", 7)]  # a suspension reports them too
    assert json.loads(newer[-1].attributes["beam_agents.memory.slots"]) == MEMORY


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("customer-1", b"customer-1"),
        ("0x00ff", b"\x00\xff"),
        ("0xnothex", b"0xnothex"),
        (" a ", b"a"),
    ],
)
def test_a_search_means_text_or_hex(text: str, key: bytes) -> None:
    assert views.key_from_search(text) == key


def test_keys_times_and_durations_read_well() -> None:
    assert display_key(b"order-9") == "order-9"
    assert display_key(b"\x00\x01") == "0x0001"
    assert views.key_from_hex("zz") is None
    assert views.when(1_767_225_600_123) == "2026-01-01 00:00:00.123 UTC"
    assert views.when(0) == "-"
    assert [views.duration(ms) for ms in (0.25, 0.9999999, 4.5, 362, 1_569, 300_000, None)] == [
        "250 µs",
        "1 ms",
        "4.5 ms",
        "362 ms",
        "1.6 s",
        "5 min",
        "-",
    ]
    assert views.age(1_000, 61_000) == "60.0 s ago" and views.age(5_000, 1_000) == "in 4.0 s"
    assert views.pretty_json('{"b":1,"a":[2]}').text == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}'
    assert views.pretty_json(b"\xff\x00").text == "0xff00" and views.pretty_json("").text == "-"
    approved = json.dumps({"approved": True, "approver": "dana", "reason": "fine"}).encode()
    assert views.decision(approved) == "approved by dana: fine"


def test_charts_scale_bars_to_the_peak() -> None:
    chart = views.chart([(0, 0), (60_000, 5), (120_000, 10)], "executed")
    assert (chart.peak, chart.total, chart.latest) == (10, 15, 10)
    assert [bar.height for bar in chart.bars] == [0.0, 50.0, 100.0]
    assert chart.bars[1].x == pytest.approx(100 / 3, abs=1e-3) and chart.bars[1].label.endswith(
        "5 executed"
    )
    assert views.chart([], "executed").bars == []


def test_sessions_are_hmacs_that_expire_and_bind_the_csrf_token() -> None:
    now = [1_000_000.0]
    sessions = Sessions("secret-token", clock=lambda: now[0])
    session = sessions.new()
    assert "secret-token" not in session and sessions.is_valid(session)
    assert not Sessions("other-token").is_valid(session)
    assert not sessions.is_valid(session.replace(session[-1], "0" if session[-1] != "0" else "1"))
    assert not sessions.is_valid(None) and not sessions.is_valid("a.b")
    csrf = sessions.csrf_token(session)
    assert sessions.csrf_matches(session, csrf)
    assert not sessions.csrf_matches(sessions.new(), csrf)
    assert sessions.login("secret-token") is not None and sessions.login("secret") is None
    now[0] += SESSION_LIFETIME_S
    assert not sessions.is_valid(session)
    assert Sessions(None).login("") is None and not Sessions(None).login_required


def test_only_local_paths_are_redirect_targets() -> None:
    assert local_path("/keys?q=a") == "/keys?q=a"
    assert [local_path(t) for t in ("//evil", "http://evil", "/\\evil", None, "")] == ["/"] * 5
