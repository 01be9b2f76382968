# mypy: disallow-untyped-calls=False
"""What ``test_mcp_pipeline.py`` runs: the ticket agent, the ticket server setup, its effector.

- :func:`ticket_agent`: reads runbooks inline and files tickets through the effector.
- :func:`ticket_setup`: a fresh ledger of ``tests/mcp/ticket_server.py`` and, over HTTP, the
  one server both sides reach (:class:`Tickets` says how each side reaches it).
- :func:`mcp_sidecar`: the loop's :class:`~tests.semantics.loop.Sidecar`, serving the ticket
  server's tools (``tests.mcp.mcp_registry``) and seeing to the stdio servers a killed
  incarnation leaves behind.
- :func:`run_ticket_loop` and :func:`run_ticket_retries`: the conformance suite's loop and
  retried runs (``tests/adapters/conformance.py``) with the ticket agent.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:  # tests.semantics.loop imports the effector harness
    sys.path.insert(0, _EFFECTOR_TESTS)

from beam_agents import AgentConfig, Complete, Suspend  # noqa: E402
from beam_agents._protos import (  # noqa: E402
    AgentEnvelope,
    ToolResult,
    canonical_json_bytes,
)
from beam_agents.core.context import ActivationContext  # noqa: E402
from beam_agents.tools import ToolRegistry  # noqa: E402
from beam_agents.tools.mcp import load_mcp_tools  # noqa: E402
from effector import launch  # noqa: E402
from effector.launch import free_port  # noqa: E402
from tests.adapters.conformance import CaseRun, run_loop, run_with_retries  # noqa: E402
from tests.mcp.mcp_registry import (  # noqa: E402
    REGISTRY_SPEC,
    SCRIPT,
    TRANSPORT_ENV,
    URL_ENV,
    ticket_server,
)
from tests.semantics.loop import Sidecar, started  # noqa: E402

BASE_MS = 1_767_225_600_000
IDLE_S = 1.5
"""The loop's read stops once the effector has had nothing in flight for this long."""


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


def reports(run: CaseRun) -> list[dict[str, Any]]:
    """The ticket agent's reports in ``run``, by key."""
    return sorted((json.loads(output) for output in run.outputs), key=lambda o: o["key"])


def report(run: CaseRun, key: str) -> dict[str, Any]:
    """The one report of ``key`` in ``run``."""
    [found] = [found for found in reports(run) if found["key"] == key]
    return found


def intent_ids(run: CaseRun, tool_name: str) -> list[str]:
    return sorted(intent.intent_id for intent in run.tool_intents(tool_name))


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


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return [child for child in found if is_alive(child)]


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


def wait_gone(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Wait up to ``timeout_s`` for ``pids`` to exit; returns those still alive."""
    deadline = time.monotonic() + timeout_s
    while any(map(is_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if is_alive(pid)]


def end_orphans(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Wait for ``pids`` (orphaned ticket servers) to exit; SIGKILL those that do not.

    Returns the ones that had to be killed.
    """
    stuck = wait_gone(pids, timeout_s)
    for pid in stuck:
        os.kill(pid, signal.SIGKILL)
    return stuck


@dataclass
class McpSidecar(Sidecar):
    """The loop's :class:`Sidecar`, serving the ticket server's tools instead of the gate's.

    A stdio ticket server the effector spawned outlives a SIGKILL of the effector; ``kill``
    notes them in :attr:`orphans` and ``stop`` sees that every one has exited.
    """

    tools_spec: str = REGISTRY_SPEC
    orphans: list[int] = field(default_factory=list)

    def kill(self) -> None:
        self.orphans += ticket_server_children(self.pid)
        super().kill()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            end_orphans(self.orphans)


def mcp_sidecar(workdir: Path, tickets: Tickets) -> AbstractContextManager[McpSidecar]:
    """A started effector executing the ticket server's tools on a fresh store; stopped on exit."""
    return started(
        McpSidecar(
            f"sqlite:///{workdir / 'effector.db'}",
            free_port(),
            tickets.ledger,
            environment=tickets.effector_env(),
        )
    )


# -- pipelines -------------------------------------------------------------------------------


def run_ticket_loop(
    address: str,
    events: Sequence[AgentEnvelope],
    registry: ToolRegistry,
    *,
    during: Callable[[], None] | None = None,
) -> CaseRun:
    """``ReadEnvelopes(events) → RunAgent(ticket_agent) → SubmitIntents`` until idle.

    ``during`` runs in a thread alongside the pipeline; what it raises is raised here.
    """
    config = AgentConfig(tool_registry=registry)
    return run_loop(
        ticket_agent, config, address, events, idle_s=IDLE_S, approve=False, during=during
    )


def run_ticket_retries(
    address: str, envelopes: Sequence[AgentEnvelope], registry: ToolRegistry, markers: Path
) -> tuple[CaseRun, list[str]]:
    """``envelopes`` (a loop run's log) on the bundle-based runner, every commit failed once.

    Intents go to the effector at ``address``. Returns the run and the commits that were
    failed.
    """
    config = AgentConfig(tool_registry=registry)
    return run_with_retries(ticket_agent, config, address, envelopes, markers, advance_ms=1_000)
