# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""MCP tools in the local loop: read a runbook inline, file a ticket once through the effector.

``mcp_ticket_server.py`` is an MCP server (the ``mcp`` SDK, over stdio). ``load_mcp_tools``
lists its tools into a registry: ``read_runbook`` is annotated read-only, so the agent runs it
inline with ``ctx.run_tool``; ``file_ticket`` is not, so it is side-effecting: the run stages an
intent, and only the effector (a separate process started with ``--tools
mcp_tickets:effector_tools``) calls it, over its own MCP session, with the intent id in
``_meta`` for the server to deduplicate on. A scripted ``FakeLLM`` drives the tool loop.

Run it:  python examples/mcp_tickets.py   (it starts an effector of its own for the run)
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolRegistry,
)
from beam_agents.loop import run_tool_loop
from beam_agents.model import ToolCall
from beam_agents.tools.mcp import McpServer, load_mcp_tools
from effector import EffectorProcess, child_environment

import apache_beam as beam

EXAMPLES = Path(__file__).resolve().parent
TICKETS_DB = "TICKETS_DB"


def ticket_server() -> McpServer:
    """The MCP server, spawned over stdio by each process that connects to it."""
    return McpServer.stdio(
        sys.executable,
        [str(EXAMPLES / "mcp_ticket_server.py")],
        env={TICKETS_DB: os.environ[TICKETS_DB]},
    )


def pipeline_tools() -> ToolRegistry:
    """Every tool of the server: read-only ones run inline, the rest become intents."""
    return load_mcp_tools(ticket_server())


def effector_tools() -> ToolRegistry:
    """What the effector executes: the server's side-effecting tools."""
    return ToolRegistry(tool for tool in pipeline_tools() if tool.side_effect)


def answer(request: LlmRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """The scripted model: read the runbook, file a ticket, then report the ticket."""
    alert = json.loads(request.messages[1]["content"])
    results = [m["content"] for m in request.messages if m["role"] == "tool"]
    if not results:
        return "", (ToolCall("rb", "read_runbook", {"service": alert["service"]}),)
    if len(results) == 1:
        summary = f"{alert['alert']}. Runbook: {json.loads(results[0])}"
        ticket_call = ToolCall(
            "t", "file_ticket", {"service": alert["service"], "summary": summary}
        )
        return "", (ticket_call,)
    ticket = json.loads(results[1])
    return f"{alert['service']}: filed {ticket['ticket']}", ()


def make_model() -> FakeLLM:
    """The provider: a ``FakeLLM`` answering with :func:`answer`."""
    return FakeLLM.scripted(answer)


async def on_call(ctx: ActivationContext) -> Complete | Suspend:
    """The agent: one tool loop over the MCP tools."""
    request = LlmRequest(
        model_id="ops-model",
        messages=[
            {"role": "system", "content": "Read the runbook, then file a ticket."},
            {"role": "user", "content": ctx.event.decode()},
        ],
    )
    return (await run_tool_loop(ctx, request, max_iterations=4)).outcome


ALERTS = ({"service": "db", "alert": "p99 latency 4s"}, {"service": "web", "alert": "5xx at 9%"})


def run(target: str, answers: Path) -> None:
    """One pipeline: alerts in, the loop closed through the effector at ``target``."""
    events = [
        AgentEnvelope(
            entity_key=alert["service"].encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps(alert).encode(),
        )
        for n, alert in enumerate(ALERTS)
    ]
    config = AgentConfig(provider_factory=make_model, tool_registry=pipeline_tools())
    with beam.Pipeline() as pipeline:
        inputs = pipeline | ReadEnvelopes(target, events=events, stop_when_idle_s=1.0)
        outputs = inputs | RunAgent(on_call, config=config)
        outputs.intents | SubmitIntents(target)
        texts = outputs.output | beam.Map(bytes.decode)
        texts | beam.io.WriteToText(str(answers), shard_name_template="")


def main() -> None:
    """Run the loop twice against one effector; the second run files nothing new."""
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        os.environ[TICKETS_DB] = str(workdir / "tickets.db")
        with EffectorProcess(
            "--tools", "mcp_tickets:effector_tools",
            "--store", f"sqlite:///{workdir / 'effector.db'}",
            "--listen", "127.0.0.1:0",
            env=child_environment(EXAMPLES),
            log=workdir / "effector.log",
            stop_timeout_s=15,
        ) as effector:  # fmt: skip
            run(effector.address, workdir / "first")
            run(effector.address, workdir / "again")
        first = sorted((workdir / "first").read_text().splitlines())
        again = sorted((workdir / "again").read_text().splitlines())
        with sqlite3.connect(workdir / "tickets.db") as db:
            tickets = db.execute("SELECT count(*) FROM tickets").fetchone()[0]
    for line in first:
        print(f"mcp_tickets: {line}")
    assert again == first, (first, again)
    print(f"mcp_tickets: replayed, the same answers; {tickets} tickets filed in all")
    print("mcp_tickets: ok")


if __name__ == "__main__":
    main()
