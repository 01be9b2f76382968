"""Every console page renders whatever the store holds, however odd (DESIGN.md invariant 9).

The rows are written straight into a real SQLite store, past the API that would refuse most of
them: times of INT64_MIN and INT64_MAX, 2**62 and year 10000, a 200,000-deep JSON attribute and
argument, multi-MB values, bidi and control characters. Each page must answer 200, show the
impossible times as text, cut the huge values with a link to their raw bytes, and show the
hiding characters as marks.
"""

from __future__ import annotations

import html
import json
import time

from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    ToolIntent,
    ToolResult,
    TraceEvent,
    withdrawal_id_for,
)
from beam_agents.core.agent import intent_id_for
from effector.launch import EffectorThread
from effector.store.intents import NewIntent
from tests.console.harness import client_for, csrf_of
from tests.console.runs_data import agent_run, approval_intent, now_ms, submit

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
YEAR_10000_MS = 253_402_300_800_000
DEEP = "[" * 200_000 + "]" * 200_000
HUGE = "x" * (3 * 1024 * 1024)
KEY = b"hostile-1"
EVIL = "acct-\u202e4321-evil"


def _hostile_events() -> list[TraceEvent]:
    events = agent_run(KEY, 0, time.time_ns())
    events[0].start_ms, events[0].end_ms = INT64_MIN, INT64_MAX
    events[1].wall_start_unix_nano, events[1].wall_end_unix_nano = INT64_MAX, INT64_MIN
    events[2].attributes["deep"] = DEEP
    events[2].attributes["huge"] = HUGE
    events[2].attributes["bidi"] = EVIL + "\x1b[31m"
    events[4].attributes["beam_agents.deadline_ms"] = str(2**62)
    events[-1].attributes["beam_agents.memory.slots"] = DEEP
    untimed = agent_run(KEY, 5, time.time_ns(), timed=False)
    untimed[0].start_ms = INT64_MIN
    untimed[-1].end_ms = INT64_MAX
    return events + untimed


def _hostile_intents() -> list[ToolIntent]:
    far = approval_intent(KEY, 0, {"to": EVIL}, now_ms())
    far.expires_at_ms = 2**62
    deep = ToolIntent(
        intent_id=intent_id_for(KEY, 1, 0),
        entity_key=KEY,
        seq=1,
        tool_name="pay\u202etool",
        args_json=DEEP,
        created_at_ms=YEAR_10000_MS,
        expires_at_ms=0,
        kind=ToolIntent.TOOL,
    )
    huge = approval_intent(KEY, 2, {"note": HUGE}, INT64_MIN + 1)
    huge.expires_at_ms = INT64_MAX
    return [far, deep, huge]


def _unknown_kind() -> ToolIntent:
    """An intent of a kind this effector does not know (recorded REJECTED)."""
    return ToolIntent(
        intent_id=intent_id_for(KEY, 3, 0),
        entity_key=KEY,
        seq=3,
        tool_name="t",
        args_json="{}",
        created_at_ms=now_ms(),
        kind=99,  # type: ignore[arg-type]
    )


def _hostile_error() -> AgentError:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=INT64_MAX, external_event=HUGE.encode())
    return AgentError(
        entity_key=KEY,
        reason="activation_error\u202e",
        detail="boom\x07" + HUGE,
        event_time_ms=INT64_MIN,
        envelope=envelope.SerializeToString(),
        seq=0,
        traceback="Traceback\n\x1b[2J" + DEEP,
    )


def test_every_page_renders_impossible_times_deep_and_huge_values(
    effector: EffectorThread,
) -> None:
    store = effector.server.store
    effector.run(store.record_traces(_hostile_events(), now_ms()))
    intents = _hostile_intents()
    effector.run(submit(store, *intents))
    odd = _unknown_kind()
    effector.run(store.submit([NewIntent(odd, rejection="unknown kind 99")], now_ms()))
    effector.run(store.record_errors([_hostile_error()], now_ms()))
    [error] = effector.run(store.list_errors(KEY, 10))
    pages = [
        "/",
        "/keys",
        f"/keys/{KEY.hex()}",
        "/intents",
        "/approvals",
        "/errors",
        f"/errors/{error.error_id}",
        f"/errors/{error.error_id}/redrive",
        *(f"/intents/{intent.intent_id}" for intent in (*intents, odd)),
        f"/intents?key={KEY.decode()}",
    ]
    with client_for(effector, timeout=60) as client:
        answers = {path: client.get(path) for path in pages}
        for path, answer in answers.items():
            assert answer.status_code in (200, 409), (path, answer.status_code)
            assert len(answer.content) < 2_000_000, (path, len(answer.content))
            assert "\u202e" not in answer.text and "\x1b" not in answer.text, path
        key_page = answers[f"/keys/{KEY.hex()}"].text
        assert f"out of range ({INT64_MIN} ms)" in key_page
        assert f"out of range ({2**62} ms)" in key_page
        far_page = html.unescape(answers[f"/intents/{intents[0].intent_id}"].text)
        assert "out of range (" in far_page and "acct-⟨U+202E⟩4321-evil" in far_page
        deep_page = html.unescape(answers[f"/intents/{intents[1].intent_id}"].text)
        assert f"out of range ({YEAR_10000_MS} ms)" in deep_page
        assert "pay⟨U+202E⟩tool" in deep_page
        assert f'href="/intents/{intents[1].intent_id}/raw/args"' in deep_page
        raw = client.get(f"/intents/{intents[1].intent_id}/raw/args")
        assert raw.status_code == 200 and raw.content == DEEP.encode()
        assert raw.headers["content-disposition"].startswith("attachment")
        huge_page = answers[f"/intents/{intents[2].intent_id}"].text
        assert "more characters are not shown" in huge_page
        assert json.loads(client.get(f"/intents/{intents[2].intent_id}/raw/args").content) == {
            "note": HUGE
        }
        error_page = html.unescape(answers[f"/errors/{error.error_id}"].text)
        assert f"out of range ({INT64_MIN} ms)" in error_page
        assert "boom⟨U+0007⟩" in error_page and "⟨U+001B⟩[2J" in error_page
        for what, expected in (
            ("detail", ("boom\x07" + HUGE).encode()),
            ("external_event", HUGE.encode()),
        ):
            assert client.get(f"/errors/{error.error_id}/raw/{what}").content == expected
        assert "UNKNOWN (99)" in answers[f"/intents/{odd.intent_id}"].text
        inbox = answers["/approvals"].text
        assert "out of range (" in inbox
        assert client.get(f"/intents/{intents[0].intent_id}/raw/nothing").status_code == 404


def test_an_approval_with_bidi_arguments_is_flagged_and_shows_what_the_digest_binds(
    effector: EffectorThread,
) -> None:
    asked = approval_intent(KEY, 0, {"to": EVIL, "cents": 5}, now_ms())
    effector.run(submit(effector.server.store, asked))
    with client_for(effector) as client:
        inbox = html.unescape(client.get("/approvals").text)
    assert '"to": "acct-⟨U+202E⟩4321-evil"' in inbox
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in inbox and "Look closely" in inbox


def test_a_run_of_100000_spans_gives_a_bounded_page_quickly_with_links_onwards(
    effector: EffectorThread,
) -> None:
    store = effector.server.store
    template = agent_run(KEY, 7, time.time_ns())[1]
    spans = []
    for sequence in range(100_000):
        event = TraceEvent()
        event.CopyFrom(template)
        event.sequence = sequence
        event.span_id = f"{sequence:016x}"
        spans.append(event)
    spans[-1].event_type = TraceEvent.ACTIVATION_END  # the run completed, 99,800 spans later
    for start in range(0, len(spans), 10_000):
        effector.run(store.record_traces(spans[start : start + 10_000], now_ms()), 120)
    with client_for(effector, timeout=60) as client:
        began = time.monotonic()
        page = client.get(f"/keys/{KEY.hex()}")
        took = time.monotonic() - began
        assert page.status_code == 200 and took < 3, took
        assert len(page.content) < 1_000_000, len(page.content)
        assert "spans 1-200 of 100000" in page.text and "page 1 of 500" in page.text
        assert 'class="status completed"' in page.text
        onwards = f"/keys/{KEY.hex()}/runs/{template.trace_id}?page=2"
        assert f'href="{onwards}"' in page.text
        last = client.get(f"/keys/{KEY.hex()}/runs/{template.trace_id}?page=500")
        assert last.status_code == 200 and "spans 99801-100000 of 100000" in last.text
        assert 'rel="next"' not in last.text and 'rel="prev"' in last.text


def test_runs_of_two_namespaces_on_one_key_and_seq_show_apart_with_their_errors(
    effector: EffectorThread,
) -> None:
    store = effector.server.store
    plain = agent_run(KEY, 0, time.time_ns())
    other = agent_run(KEY, 0, time.time_ns(), completed=False)
    for event in other:
        event.trace_id = "f" * 32
        event.attributes["beam_agents.namespace"] = "v2"
    effector.run(store.record_traces(plain + other, now_ms()))
    failed = AgentError(
        entity_key=KEY, reason="activation_error", detail="v2 broke", seq=0, trace_id="f" * 32
    )
    effector.run(store.record_errors([failed], now_ms()))
    with client_for(effector) as client:
        page = client.get(f"/keys/{KEY.hex()}").text
    assert page.count('<section class="run"') == 2
    assert f'id="run-0-{plain[0].trace_id}"' in page and f'id="run-0-{"f" * 32}"' in page
    assert "namespace v2" in page
    assert "one of several runs 0, of different namespaces" in page  # the run naming none
    v2 = page[page.index(f'id="run-0-{"f" * 32}"') :]
    v2 = v2[: v2.index("</section>")]
    assert "Errors of this run" in v2 and 'class="status suspended"' in v2
    first = page[page.index(f'id="run-0-{plain[0].trace_id}"') :]
    assert "Errors of this run" not in first[: first.index("</section>")]


def test_withdrawn_intents_show_as_withdrawn_and_leave_the_inbox(
    effector: EffectorThread,
) -> None:
    store = effector.server.store
    asked = approval_intent(KEY, 3, {"refund": "r-1"}, now_ms())
    effector.run(submit(store, asked))
    withdrawal = ToolIntent(
        intent_id=withdrawal_id_for(asked.intent_id),
        entity_key=KEY,
        seq=3,
        step_index=9,
        kind=ToolIntent.WITHDRAWAL,
        withdraws_intent_id=asked.intent_id,
        args_json='{"reason":"the run took its deadline route"}',
        created_at_ms=now_ms(),
    )
    effector.run(store.submit([NewIntent(withdrawal)], now_ms()))
    record = effector.run(store.get_intent(asked.intent_id))
    assert record is not None and record.result is not None
    assert record.result.status == ToolResult.WITHDRAWN
    with client_for(effector) as client:
        inbox = client.get("/approvals").text
        assert asked.intent_id not in inbox and "Nothing awaits a decision" in inbox
        one = html.unescape(client.get(f"/intents/{asked.intent_id}").text)
        assert "WITHDRAWN" in one and "the run took its deadline route" in one
        assert "can no longer be decided" in one
        key_page = client.get(f"/keys/{KEY.hex()}").text
        assert 'id="withdrawn"' in key_page and asked.intent_id in key_page
        listed = client.get("/intents", params={"state": "WITHDRAWN"}).text
        assert asked.intent_id in listed
        effector.run(submit(store, approval_intent(b"other", 0, {"refund": "r-2"}, now_ms())))
        csrf = csrf_of(client.get("/approvals").text)
        form = {"csrf_token": csrf, "decision": "approve", "approver": "dana"}
        late = client.post(f"/approvals/{asked.intent_id}", data=form)
        assert late.status_code == 409
        assert "withdrawn" in late.text and "the run took its deadline route" in late.text
        overview = client.get("/").text
        assert 'WITHDRAWN</a></th><td class="num">1</td>' in overview


def test_many_runs_share_the_key_pages_span_budget(effector: EffectorThread) -> None:
    store = effector.server.store
    template = agent_run(KEY, 0, time.time_ns())[1]
    spans = []
    for seq in range(100):
        for sequence in range(300):
            event = TraceEvent()
            event.CopyFrom(template)
            event.seq, event.sequence = seq, sequence
            event.trace_id = f"{seq:032x}"
            event.span_id = f"{sequence:016x}"
            spans.append(event)
    effector.run(store.record_traces(spans, now_ms()), 120)
    with client_for(effector, timeout=60) as client:
        page = client.get(f"/keys/{KEY.hex()}", params={"runs": "100"})
    assert page.status_code == 200
    assert page.text.count('<section class="run"') == 100
    assert page.text.count('<tr class="llm">') == 100 * 50
    assert page.text.count("spans 1-50 of 300") == 100
    assert f'href="/keys/{KEY.hex()}/runs/{0:032x}?page=1">all its spans' in page.text
