# mypy: disallow-untyped-calls=False
"""MCP tools in a real pipeline and a real effector, over stdio and streamable HTTP.

``tests/mcp/ticket_server.py`` is the MCP server. Read-only tools run inline in ``RunAgent``
on Beam's local runner; the destructive ``file_ticket`` (and the failing ``refuse``) run only
in an effector subprocess started with ``--tools tests.mcp.mcp_registry:REGISTRY``, which
reaches its own server session and sends the intent id in ``_meta``. The server's ledger
(``calls``: every ``file_ticket`` call with its intent id; ``tickets``: what was filed) is
the ground truth for "exactly once". Over stdio each process spawns its own server on the same
ledger; over HTTP the test starts one server on 127.0.0.1 that both reach.

The loop pipeline is the conformance suite's (``tests/adapters/conformance.py``):
``ReadEnvelopes(events) → RunAgent → SubmitIntents``, then a full replay from fresh state on
the same effector, then the first run's envelopes again on the bundle-based runner with every
commit failed once. The kill test SIGKILLs the effector while the server holds a call it has
already filed, and restarts it on the same store. The agent, the server setup and the effector
are in ``tests/mcp/pipeline_harness.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:  # the effector harness imports its tools as top-level
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402

pytest.register_assert_rewrite("tests.mcp.pipeline_harness")

from beam_agents import AgentConfig  # noqa: E402
from beam_agents._protos import TraceEvent, canonical_json_bytes  # noqa: E402
from tests.adapters.conformance import CaseRun, logged_envelopes  # noqa: E402
from tests.core.harness import created, event, run_agent  # noqa: E402
from tests.mcp.pipeline_harness import (  # noqa: E402
    McpSidecar,
    Tickets,
    envelope,
    intent_ids,
    mcp_sidecar,
    report,
    reports,
    run_ticket_loop,
    run_ticket_retries,
    ticket_agent,
    ticket_setup,
    wait_gone,
)

TRANSPORTS = ["stdio", "http"]
RUNBOOK = "Restart the primary, then page the database on-call."
TICKET_EVENT = {"kind": "ticket", "title": "db down", "runbook": "runbooks/db.md", "priority": 2}
TICKET_TITLE = f"db down: {RUNBOOK}"
REFUSE_EVENT = {"kind": "refuse", "reason": "nobody is on call"}


def filed_report(intent_id: str, attempt: int) -> dict[str, Any]:
    """The report of ``ticket-1`` once the effector filed its ticket on ``attempt``."""
    return {
        "key": "ticket-1",
        "intent_id": intent_id,
        "status": "OK",
        "attempt": attempt,
        "result": {"ticket": "T-1", "priority": 2},
    }


# -- (1) read-only tools inline --------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_read_only_tools_run_inline_in_the_pipeline(transport: str, tmp_path: Path) -> None:
    with ticket_setup(transport, tmp_path) as tickets:
        registry = tickets.registry()
        assert not registry.get("read_file").side_effect
        assert registry.get("file_ticket").side_effect
        outputs = run_agent(
            created(
                [event(b"read-1", canonical_json_bytes({"kind": "read", "prefix": "runbooks/"}))]
            ),
            ticket_agent,
            AgentConfig(tool_registry=registry),
        )
        assert outputs.errors == []
        assert outputs.intents == []
        [raw] = outputs.output
        read = json.loads(raw)
        assert read["files"] == {
            "runbooks/db.md": RUNBOOK,
            "runbooks/web.md": "Roll back the last deploy.",
        }
        tool_calls = [
            (trace.attributes["gen_ai.tool.name"], trace.attributes["status"])
            for trace in outputs.traces
            if trace.event_type == TraceEvent.TOOL_CALL
        ]
        assert tool_calls == [
            ("list_files", "ok"),
            ("read_file", "ok"),
            ("read_file", "ok"),
            ("pid", "ok"),
        ]
        assert outputs.event_types(b"read-1") == [
            "ACTIVATION_START",
            "TOOL_CALL",
            "TOOL_CALL",
            "TOOL_CALL",
            "TOOL_CALL",
            "ACTIVATION_END",
        ]
        # The answers came from a real server over the transport: over HTTP the one the
        # test started; over stdio one this (the pipeline's) process spawned, and the DoFn's
        # teardown closed it with its session.
        server_pid = read["server_pid"]
        if transport == "http":
            assert server_pid == tickets.http_pid
        else:
            assert server_pid != os.getpid()
            assert wait_gone([server_pid]) == [], "the pipeline's stdio server outlived it"
        assert tickets.calls() == []


# -- (2), (4), (5) the effector: once, on replay, across retries, and its failures ------------


@dataclass
class LoopRuns:
    tickets: Tickets
    first: CaseRun
    calls_after_first: list[tuple[str, str]]
    tickets_after_first: list[tuple[str, str]]
    replay: CaseRun
    calls_after_replay: list[tuple[str, str]]
    retried: CaseRun
    forced_commits: list[str]
    calls_after_retries: list[tuple[str, str]]
    tickets_after_retries: list[tuple[str, str]]


@pytest.fixture(scope="module", params=TRANSPORTS)
def loop_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoopRuns:
    transport = str(request.param)
    workdir = tmp_path_factory.mktemp(f"mcp-loop-{transport}")
    events = [envelope("ticket-1", TICKET_EVENT, 0), envelope("refuse-1", REFUSE_EVENT, 1)]
    with ticket_setup(transport, workdir) as tickets, mcp_sidecar(workdir, tickets) as effector:
        first = run_ticket_loop(effector.address, events, tickets.registry())
        calls_after_first, tickets_after_first = tickets.calls(), tickets.tickets()
        first_log = logged_envelopes(effector.address)
        replay = run_ticket_loop(effector.address, events, tickets.registry())
        calls_after_replay = tickets.calls()
        retried, forced = run_ticket_retries(
            effector.address, first_log, tickets.registry(), workdir / "markers"
        )
        return LoopRuns(
            tickets=tickets,
            first=first,
            calls_after_first=calls_after_first,
            tickets_after_first=tickets_after_first,
            replay=replay,
            calls_after_replay=calls_after_replay,
            retried=retried,
            forced_commits=forced,
            calls_after_retries=tickets.calls(),
            tickets_after_retries=tickets.tickets(),
        )


def test_every_loop_run_ends_without_errors(loop_runs: LoopRuns) -> None:
    for run in (loop_runs.first, loop_runs.replay, loop_runs.retried):
        assert [(e.reason, e.detail) for e in run.errors] == []
        assert run.dead_letters == []
        assert [output["key"] for output in reports(run)] == ["refuse-1", "ticket-1"]


def test_a_destructive_tool_runs_once_in_the_effector_and_its_result_resumes_the_agent(
    loop_runs: LoopRuns,
) -> None:
    first = loop_runs.first
    [intent_id] = intent_ids(first, "file_ticket")
    # The server saw exactly one call, carrying the intent id in _meta, and filed one ticket.
    assert loop_runs.calls_after_first == [(intent_id, TICKET_TITLE)]
    assert loop_runs.tickets_after_first == [(intent_id, TICKET_TITLE)]
    # Its structured content came back to the agent, which completed with it.
    assert report(first, "ticket-1") == filed_report(intent_id, attempt=1)
    # The pipeline ran only the read-only tool; the destructive one was an intent.
    inline = [
        (t.entity_key.decode(), t.attributes["gen_ai.tool.name"])
        for t in first.traces
        if t.event_type == TraceEvent.TOOL_CALL
    ]
    assert set(inline) == {("ticket-1", "read_file")}
    assert sorted(i.tool_name for i in first.intents) == ["file_ticket", "refuse"]
    assert first.acks == {"ACCEPTED": 2}


def test_an_is_error_result_is_recorded_as_error_and_the_agent_sees_it(
    loop_runs: LoopRuns,
) -> None:
    first = loop_runs.first
    [intent_id] = intent_ids(first, "refuse")
    refused = report(first, "refuse-1")
    assert refused["intent_id"] == intent_id
    assert refused["status"] == "ERROR"
    assert "McpToolError" in refused["error"]
    assert "refused: nobody is on call" in refused["error"]
    assert "result" not in refused
    assert all(call_intent != intent_id for call_intent, _ in loop_runs.calls_after_first)


def test_a_full_replay_from_fresh_state_executes_nothing_new(loop_runs: LoopRuns) -> None:
    replay = loop_runs.replay
    assert loop_runs.calls_after_replay == loop_runs.calls_after_first
    assert reports(replay) == reports(loop_runs.first)
    assert intent_ids(replay, "file_ticket") == intent_ids(loop_runs.first, "file_ticket")
    assert replay.acks == {"DUPLICATE": 2}


def test_forced_bundle_retries_execute_nothing_new(loop_runs: LoopRuns) -> None:
    retried = loop_runs.retried
    # Both keys' first activations and their resumes were each failed once, then retried.
    assert loop_runs.forced_commits == sorted(
        f"{key.encode().hex()}-0-{trigger}"
        for key in ("refuse-1", "ticket-1")
        for trigger in ("event-0", "tool_result-1")
    )
    assert reports(retried) == reports(loop_runs.first)
    assert sorted(i.SerializeToString(deterministic=True) for i in retried.intents) == sorted(
        i.SerializeToString(deterministic=True) for i in loop_runs.first.intents
    )
    assert loop_runs.calls_after_retries == loop_runs.calls_after_first
    assert loop_runs.tickets_after_retries == loop_runs.tickets_after_first


# -- (3) an effector killed between the effect and its record -------------------------------


def _kill_after_the_call(effector: McpSidecar, tickets: Tickets) -> None:
    """Once the server has filed (and holds) the call: SIGKILL, release the hold, restart."""
    try:
        deadline = time.monotonic() + 60
        while not tickets.calls():
            assert time.monotonic() < deadline, "the effector never called file_ticket"
            time.sleep(0.02)
        effector.kill()
    finally:
        tickets.hold.unlink(missing_ok=True)  # whatever happened, let the pipeline finish
    effector.start()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_effector_killed_between_effect_and_record_calls_again_with_the_same_intent_id(
    transport: str, tmp_path: Path
) -> None:
    events = [envelope("ticket-1", TICKET_EVENT)]
    with (
        ticket_setup(transport, tmp_path, dedup=True) as tickets,
        mcp_sidecar(tmp_path, tickets) as effector,
    ):
        tickets.hold.touch()
        run = run_ticket_loop(
            effector.address,
            events,
            tickets.registry(),
            during=lambda: _kill_after_the_call(effector, tickets),
        )
        assert len(effector.killed) == 1
        calls, filed = tickets.calls(), tickets.tickets()
    [intent_id] = intent_ids(run, "file_ticket")
    # The record was lost with the effector, so the restarted one ran the intent again: the
    # server saw the same intent id twice and, deduplicating on it, filed one ticket.
    assert calls == [(intent_id, TICKET_TITLE), (intent_id, TICKET_TITLE)]
    assert filed == [(intent_id, TICKET_TITLE)]
    assert run.errors == [] and run.dead_letters == []
    assert report(run, "ticket-1") == filed_report(intent_id, attempt=2)
    if transport == "stdio":  # the killed effector had spawned a server session of its own
        assert effector.orphans
