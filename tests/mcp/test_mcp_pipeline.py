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
already filed, and restarts it on the same store.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:  # the effector harness imports its tools as top-level
    sys.path.insert(0, _EFFECTOR_TESTS)

import apache_beam as beam  # noqa: E402
import pytest  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner  # noqa: E402
from effector_harness import EffectorProcess, cli_environment  # noqa: E402

from beam_agents import AgentConfig, Complete, RunAgent, Suspend  # noqa: E402
from beam_agents._json import canonical_json_bytes  # noqa: E402
from beam_agents._protos import (  # noqa: E402
    AgentEnvelope,
    AgentError,
    IntentDeadLetter,
    SubmitAck,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.context import ActivationContext  # noqa: E402
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents  # noqa: E402
from beam_agents.testing import EnvelopeStream, FailFirstCommit  # noqa: E402
from beam_agents.tools import ToolRegistry  # noqa: E402
from beam_agents.tools.mcp import load_mcp_tools  # noqa: E402
from effector import launch  # noqa: E402
from effector.launch import free_port  # noqa: E402
from tests.adapters.conformance import logged_envelopes  # noqa: E402
from tests.core.harness import created, event, run_agent  # noqa: E402
from tests.io.io_harness import Collector, run_pipeline  # noqa: E402
from tests.mcp.mcp_registry import SCRIPT, TRANSPORT_ENV, URL_ENV, ticket_server  # noqa: E402
from tests.semantics.loop import Sidecar  # noqa: E402

TRANSPORTS = ["stdio", "http"]
REGISTRY_SPEC = "tests.mcp.mcp_registry:REGISTRY"
BASE_MS = 1_767_225_600_000
IDLE_S = 1.5
"""The loop's read stops once the effector has had nothing in flight for this long."""
RUNBOOK = "Restart the primary, then page the database on-call."
TICKET_EVENT = {"kind": "ticket", "title": "db down", "runbook": "runbooks/db.md", "priority": 2}
TICKET_TITLE = f"db down: {RUNBOOK}"
REFUSE_EVENT = {"kind": "refuse", "reason": "nobody is on call"}


# -- the agent -------------------------------------------------------------------------------


async def ticket_agent(ctx: ActivationContext) -> Complete | Suspend:
    """Read runbooks inline; file a ticket (or call ``refuse``) through the effector.

    ``read``: list the runbooks under a prefix, read each, and report them with the pid of the
    server that answered. ``ticket``: read the runbook inline, file a ticket titled after it,
    and suspend until the effector's result resumes the run. ``refuse``: the same with the
    tool that always answers ``isError``. The output is one JSON report.
    """
    payload = json.loads(ctx.snapshot if ctx.is_resume else ctx.event)
    report: dict[str, Any] = {"key": ctx.entity_key.decode()}
    if payload["kind"] == "read":
        listing = await ctx.run_tool("list_files", {"prefix": payload["prefix"]})
        report["files"] = {
            path: (await ctx.run_tool("read_file", {"path": path}))["result"]
            for path in listing["paths"]
        }
        report["server_pid"] = (await ctx.run_tool("pid", {}))["result"]
        return Complete(output=canonical_json_bytes(report))
    if payload["kind"] == "ticket":
        runbook = await ctx.run_tool("read_file", {"path": payload["runbook"]})
        tool_name = "file_ticket"
        arguments = {
            "title": f"{payload['title']}: {runbook['result']}",
            "priority": payload["priority"],
        }
    else:
        tool_name, arguments = "refuse", {"reason": payload["reason"]}
    intent_id = ctx.act(tool_name, arguments)
    result = ctx.results.get(intent_id)
    if result is None:  # the effector's result resumes the run
        return Suspend(snapshot=canonical_json_bytes(payload))
    report.update(
        intent_id=intent_id,
        status=ToolResult.Status.Name(result.status),
        attempt=result.attempt,
    )
    if result.status == ToolResult.OK:
        report["result"] = json.loads(result.payload)
    else:
        report["error"] = result.error_message
    return Complete(output=canonical_json_bytes(report))


def envelope(key: str, payload: Mapping[str, Any], index: int = 0) -> AgentEnvelope:
    return AgentEnvelope(
        entity_key=key.encode(),
        event_time_ms=BASE_MS + 1_000 * index,
        external_event=canonical_json_bytes(dict(payload)),
    )


# -- the ticket server and its ledger --------------------------------------------------------


def create_ledger(path: Path) -> Path:
    """The server's ledger, with its tables, so it can be read before the first call."""
    with closing(sqlite3.connect(path)) as connection, connection:
        for table in ("calls", "tickets"):
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {table} "
                "(n INTEGER PRIMARY KEY, intent_id TEXT, title TEXT)"
            )
    return path


def ledger_rows(ledger: Path, table: str) -> list[tuple[str, str]]:
    """``(intent_id, title)`` of every row of ``table`` (``calls`` or ``tickets``), in order."""
    assert table in ("calls", "tickets")
    with closing(sqlite3.connect(ledger, timeout=30)) as connection:
        rows = connection.execute(f"SELECT intent_id, title FROM {table} ORDER BY n").fetchall()
    return [(str(intent_id), str(title)) for intent_id, title in rows]


@dataclass
class Tickets:
    """One ticket server setup: its ledger and hold file, and how each side reaches it."""

    transport: str
    ledger: Path
    hold: Path
    server_env: dict[str, str]
    """``TICKET_*``: the HTTP server's environment, or what a stdio server is spawned with."""
    url: str = ""
    http_pid: int = 0

    def registry(self) -> ToolRegistry:
        """The pipeline's registry: this process's session(s) to the server."""
        return load_mcp_tools(ticket_server(self.transport, url=self.url, env=self.server_env))

    def effector_env(self) -> dict[str, str]:
        """What ``tests.mcp.mcp_registry`` reads in the effector process."""
        return {TRANSPORT_ENV: self.transport, URL_ENV: self.url, **self.server_env}

    def calls(self) -> list[tuple[str, str]]:
        return ledger_rows(self.ledger, "calls")

    def tickets(self) -> list[tuple[str, str]]:
        return ledger_rows(self.ledger, "tickets")


@contextmanager
def ticket_setup(transport: str, workdir: Path, *, dedup: bool = False) -> Iterator[Tickets]:
    """A fresh ledger; over HTTP, a ticket server on 127.0.0.1 stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    ledger = create_ledger(workdir / "tickets.db")
    hold = workdir / "hold"
    server_env = {"TICKET_LEDGER": str(ledger), "TICKET_HOLD": str(hold)}
    if dedup:
        server_env["TICKET_DEDUP"] = "1"
    if transport == "stdio":
        yield Tickets(transport, ledger, hold, server_env)
        return
    with launch.EffectorProcess(
        command=[sys.executable, SCRIPT, "http"],
        env={**os.environ, **server_env},
        ready_prefix="ready ",
        ready_timeout_s=30,
        stop_signal=signal.SIGTERM,
        stop_timeout_s=5,  # then SIGKILL: a session left open must not hold up the test
    ) as server:
        url = f"http://127.0.0.1:{server.address}/mcp"
        yield Tickets(transport, ledger, hold, server_env, url=url, http_pid=server.pid)


# -- processes -------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return [child for child in found if is_alive(child)]


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def ticket_server_children(pid: int) -> list[int]:
    """The ticket servers ``pid`` spawned over stdio."""
    found = []
    for child in children_of(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if SCRIPT.encode() in command:
            found.append(child)
    return found


def end_orphans(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Wait for ``pids`` (orphaned ticket servers) to exit; SIGKILL those that do not.

    Returns the ones that had to be killed.
    """
    deadline = time.monotonic() + timeout_s
    while any(map(is_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    stuck = [pid for pid in pids if is_alive(pid)]
    for pid in stuck:
        os.kill(pid, signal.SIGKILL)
    return stuck


@dataclass
class McpSidecar(Sidecar):
    """The loop's :class:`Sidecar`, serving the ticket server's tools instead of the gate's.

    A stdio ticket server the effector spawned outlives a SIGKILL of the effector; ``kill``
    notes them in :attr:`orphans` and ``stop`` sees that every one has exited.
    """

    environment: dict[str, str] = field(default_factory=dict)
    orphans: list[int] = field(default_factory=list)

    def start(self) -> None:
        assert self._process is None, "already running"
        self._process = EffectorProcess(
            *("--tools", REGISTRY_SPEC, "--store", self.store_url),
            *("--listen", self.address, *self.extra_args),
            env=cli_environment(**self.environment),
        )
        self.pids.append(self._process.process.pid)

    def kill(self) -> None:
        self.orphans += ticket_server_children(self.pid)
        super().kill()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            end_orphans(self.orphans)


@contextmanager
def mcp_sidecar(workdir: Path, tickets: Tickets) -> Iterator[McpSidecar]:
    """A started effector executing the ticket server's tools on a fresh store; stopped on exit."""
    running = McpSidecar(
        f"sqlite:///{workdir / 'effector.db'}",
        free_port(),
        tickets.ledger,
        environment=tickets.effector_env(),
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


# -- pipelines -------------------------------------------------------------------------------


@dataclass
class LoopRun:
    """What one loop (or retried) pipeline produced."""

    outputs: list[dict[str, Any]]
    intents: list[ToolIntent]
    traces: list[TraceEvent]
    errors: list[AgentError]
    dead_letters: list[IntentDeadLetter]
    acks: Counter[str]

    def output(self, key: str) -> dict[str, Any]:
        [found] = [output for output in self.outputs if output["key"] == key]
        return found

    def intent_ids(self, tool_name: str) -> list[str]:
        return sorted(i.intent_id for i in self.intents if i.tool_name == tool_name)


class _Sinks:
    """Collects what an agent and its submit produce (as ``tests/adapters/conformance.py``)."""

    def __init__(self) -> None:
        self.outputs, self.intents, self.traces, self.errors, self.letters, self.acks = (
            Collector.new() for _ in range(6)
        )

    def wire(self, agent: Any, connection: EffectorConnection) -> None:
        submitted = agent.intents | "ToEffector" >> SubmitIntents(connection)
        agent.output | "Outputs" >> self.outputs.sink()
        agent.intents | "Intents" >> self.intents.sink()
        agent.traces | "Traces" >> self.traces.sink()
        agent.errors | "Errors" >> self.errors.sink()
        submitted.dead_letter | "DeadLetters" >> self.letters.sink()
        submitted.acks | "Acks" >> self.acks.sink()

    def collected(self) -> LoopRun:
        return LoopRun(
            outputs=sorted(
                (json.loads(value) for value in self.outputs.values()), key=lambda o: o["key"]
            ),
            intents=self.intents.values(),
            traces=self.traces.values(),
            errors=self.errors.values(),
            dead_letters=self.letters.values(),
            acks=Counter(SubmitAck.Outcome.Name(ack.outcome) for ack in self.acks.values()),
        )


def run_loop(
    address: str,
    events: Sequence[AgentEnvelope],
    registry: ToolRegistry,
    *,
    during: Callable[[], None] | None = None,
) -> LoopRun:
    """``ReadEnvelopes(events) → RunAgent(ticket_agent) → SubmitIntents`` until idle.

    ``during`` runs in a thread alongside the pipeline; what it raises is raised here.
    """
    connection = EffectorConnection(address)
    sinks = _Sinks()

    def build(pipeline: beam.Pipeline) -> None:
        envelopes = pipeline | "Envelopes" >> ReadEnvelopes(
            connection, events=events, stop_when_idle_s=IDLE_S, poll_wait_ms=50
        )
        agent = envelopes | "Agent" >> RunAgent(
            ticket_agent, config=AgentConfig(tool_registry=registry)
        )
        sinks.wire(agent, connection)

    side = _Side(during) if during else None
    try:
        if side is not None:
            side.start()
        run_pipeline(build)
    finally:
        if side is not None:
            side.finish()
    return sinks.collected()


def run_with_retries(
    address: str, envelopes: Sequence[AgentEnvelope], registry: ToolRegistry, markers: Path
) -> tuple[LoopRun, list[str]]:
    """``envelopes`` (a loop run's log) on the bundle-based runner, every commit failed once.

    As ``run_case_with_retries``; intents go to the effector at ``address``. Returns the run
    and the commits that were failed.
    """
    stream = EnvelopeStream().envelopes(envelopes)
    stream.advance_processing_time(1_000)
    forcing = FailFirstCommit(markers)
    sinks = _Sinks()
    pipeline = beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(streaming=True)
    )
    agent = (
        pipeline
        | "Stream" >> stream.build()
        | "Agent"
        >> RunAgent(ticket_agent, config=AgentConfig(tool_registry=registry, before_commit=forcing))
    )
    sinks.wire(agent, EffectorConnection(address))
    pipeline.run().wait_until_finish()
    return sinks.collected(), forcing.forced()


class _Side(threading.Thread):
    """Runs a function beside the pipeline; :meth:`finish` re-raises what it raised."""

    def __init__(self, function: Callable[[], None]) -> None:
        super().__init__(daemon=True, name="mcp-pipeline-side")
        self._function = function
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._function()
        except BaseException as exc:
            self.failure = exc

    def finish(self) -> None:
        self.join(timeout=60)
        assert not self.is_alive(), "the side thread did not finish"
        if self.failure is not None:
            raise self.failure


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
        report = json.loads(raw)
        assert report["files"] == {
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
        server_pid = report["server_pid"]
        if transport == "http":
            assert server_pid == tickets.http_pid
        else:
            assert server_pid != os.getpid()
            assert _wait_gone(server_pid), "the pipeline's stdio server outlived the pipeline"
        assert tickets.calls() == []


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- (2), (4), (5) the effector: once, on replay, across retries, and its failures ------------


@dataclass
class LoopRuns:
    tickets: Tickets
    first: LoopRun
    calls_after_first: list[tuple[str, str]]
    tickets_after_first: list[tuple[str, str]]
    replay: LoopRun
    calls_after_replay: list[tuple[str, str]]
    retried: LoopRun
    forced_commits: list[str]
    calls_after_retries: list[tuple[str, str]]
    tickets_after_retries: list[tuple[str, str]]


@pytest.fixture(scope="module", params=TRANSPORTS)
def loop_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoopRuns:
    transport = str(request.param)
    workdir = tmp_path_factory.mktemp(f"mcp-loop-{transport}")
    events = [envelope("ticket-1", TICKET_EVENT, 0), envelope("refuse-1", REFUSE_EVENT, 1)]
    with ticket_setup(transport, workdir) as tickets, mcp_sidecar(workdir, tickets) as effector:
        first = run_loop(effector.address, events, tickets.registry())
        calls_after_first, tickets_after_first = tickets.calls(), tickets.tickets()
        first_log = logged_envelopes(effector.address)
        replay = run_loop(effector.address, events, tickets.registry())
        calls_after_replay = tickets.calls()
        retried, forced = run_with_retries(
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
        assert [output["key"] for output in run.outputs] == ["refuse-1", "ticket-1"]


def test_a_destructive_tool_runs_once_in_the_effector_and_its_result_resumes_the_agent(
    loop_runs: LoopRuns,
) -> None:
    first = loop_runs.first
    [intent_id] = first.intent_ids("file_ticket")
    # The server saw exactly one call, carrying the intent id in _meta, and filed one ticket.
    assert loop_runs.calls_after_first == [(intent_id, TICKET_TITLE)]
    assert loop_runs.tickets_after_first == [(intent_id, TICKET_TITLE)]
    # Its structured content came back to the agent, which completed with it.
    assert first.output("ticket-1") == {
        "key": "ticket-1",
        "intent_id": intent_id,
        "status": "OK",
        "attempt": 1,
        "result": {"ticket": "T-1", "priority": 2},
    }
    # The pipeline ran only the read-only tool; the destructive one was an intent.
    inline = [
        (t.entity_key.decode(), t.attributes["gen_ai.tool.name"])
        for t in first.traces
        if t.event_type == TraceEvent.TOOL_CALL
    ]
    assert set(inline) == {("ticket-1", "read_file")}
    assert sorted(i.tool_name for i in first.intents) == ["file_ticket", "refuse"]
    assert first.acks == Counter(ACCEPTED=2)


def test_an_is_error_result_is_recorded_as_error_and_the_agent_sees_it(
    loop_runs: LoopRuns,
) -> None:
    first = loop_runs.first
    [intent_id] = first.intent_ids("refuse")
    report = first.output("refuse-1")
    assert report["intent_id"] == intent_id
    assert report["status"] == "ERROR"
    assert "McpToolError" in report["error"]
    assert "refused: nobody is on call" in report["error"]
    assert "result" not in report
    assert all(call_intent != intent_id for call_intent, _ in loop_runs.calls_after_first)


def test_a_full_replay_from_fresh_state_executes_nothing_new(loop_runs: LoopRuns) -> None:
    replay = loop_runs.replay
    assert loop_runs.calls_after_replay == loop_runs.calls_after_first
    assert replay.outputs == loop_runs.first.outputs
    assert replay.intent_ids("file_ticket") == loop_runs.first.intent_ids("file_ticket")
    assert replay.acks == Counter(DUPLICATE=2)


def test_forced_bundle_retries_execute_nothing_new(loop_runs: LoopRuns) -> None:
    retried = loop_runs.retried
    # Both keys' first activations and their resumes were each failed once, then retried.
    assert loop_runs.forced_commits == sorted(
        f"{key.encode().hex()}-0-{trigger}"
        for key in ("refuse-1", "ticket-1")
        for trigger in ("event-0", "tool_result-1")
    )
    assert retried.outputs == loop_runs.first.outputs
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
        run = run_loop(
            effector.address,
            events,
            tickets.registry(),
            during=lambda: _kill_after_the_call(effector, tickets),
        )
        assert len(effector.killed) == 1
        calls, filed = tickets.calls(), tickets.tickets()
    [intent_id] = run.intent_ids("file_ticket")
    # The record was lost with the effector, so the restarted one ran the intent again: the
    # server saw the same intent id twice and, deduplicating on it, filed one ticket.
    assert calls == [(intent_id, TICKET_TITLE), (intent_id, TICKET_TITLE)]
    assert filed == [(intent_id, TICKET_TITLE)]
    assert run.errors == [] and run.dead_letters == []
    assert run.output("ticket-1") == {
        "key": "ticket-1",
        "intent_id": intent_id,
        "status": "OK",
        "attempt": 2,
        "result": {"ticket": "T-1", "priority": 2},
    }
    if transport == "stdio":  # the killed effector had spawned a server session of its own
        assert effector.orphans
