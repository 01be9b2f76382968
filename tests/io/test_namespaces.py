"""Two agents over the same keys, sharing one effector: namespaces keep their intents apart.

Every event is handled by two ``RunAgent`` transforms reading the same ``ReadEnvelopes``
source and submitting to the same effector, on Beam's FnApiRunner. With a namespace each,
every intent of both agents is accepted and executes exactly once. Without, both agents mint
the same ids for the same keys: the second intent of each pair is rejected as a conflict
(dead-lettered, and logged by the effector with the namespace hint), and only one executes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import pytest
from effector_harness import BackgroundEffector
from effector_test_tools import read_ledger

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import AgentEnvelope, AgentError, IntentDeadLetter, ToolResult
from beam_agents.core.agent import Complete, Suspend, intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from effector.observability import CONFLICT_HINT
from tests.io.io_harness import Collector, counter, run_pipeline, started

KEYS = (b"acct-1", b"acct-2", b"acct-3")
EVENTS_PER_KEY = 2
EVENTS = [
    AgentEnvelope(
        entity_key=key,
        event_time_ms=1_000 * (1 + index * len(KEYS) + position),
        external_event=f"transfer-{index}".encode(),
    )
    for index in range(EVENTS_PER_KEY)
    for position, key in enumerate(KEYS)
]
AGENTS = ("screening", "ledger")


async def screen(ctx: ActivationContext) -> Complete | Suspend:
    """Records the event through the effector, then completes with the result."""
    return await _record_then_complete("screening", ctx)


async def book(ctx: ActivationContext) -> Complete | Suspend:
    """Like :func:`screen`, for the other agent: its intents carry other arguments."""
    return await _record_then_complete("ledger", ctx)


async def _record_then_complete(agent: str, ctx: ActivationContext) -> Complete | Suspend:
    if not ctx.is_resume:
        ctx.act("record", {"note": f"{agent}:{ctx.event.decode()}"})
        return Suspend(snapshot=ctx.event)
    result = ctx.resume_result
    assert result is not None and result.status == ToolResult.OK, result
    note = json.loads(result.payload)["note"]
    return Complete(output=f"{agent} {ctx.entity_key.decode()} {note}".encode())


@dataclass
class Run:
    outputs: dict[str, list[bytes]]
    errors: dict[str, list[AgentError]]
    dead_letters: list[IntentDeadLetter]
    accepted: int


def run_two_agents(target: str, namespaces: dict[str, str | None]) -> Run:
    """Both agents over the same keyed events, both submitting to ``target``."""
    functions = {"screening": screen, "ledger": book}
    outputs = {agent: Collector.new() for agent in AGENTS}
    errors = {agent: Collector.new() for agent in AGENTS}
    letters = Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        keyed = pipeline | ReadEnvelopes(
            target, events=EVENTS, stop_when_idle_s=1.0, poll_wait_ms=50
        )
        dead = []
        for agent in AGENTS:
            config = AgentConfig(namespace=namespaces[agent])
            ran = keyed | f"Run {agent}" >> RunAgent(functions[agent], config=config)
            ran.output | f"Output {agent}" >> outputs[agent].sink()
            ran.errors | f"Errors {agent}" >> errors[agent].sink()
            submitted = ran.intents | f"Submit {agent}" >> SubmitIntents(target)
            dead.append(submitted.dead_letter)
        tuple(dead) | beam.Flatten() | "Dead letters" >> letters.sink()

    result = run_pipeline(build)
    return Run(
        outputs={agent: outputs[agent].values() for agent in AGENTS},
        errors={agent: errors[agent].values() for agent in AGENTS},
        dead_letters=letters.values(),
        accepted=counter(result, "intents_accepted"),
    )


def minted(namespace: str | None) -> set[str]:
    """The ids an agent in ``namespace`` mints for the events (one intent per run)."""
    return {intent_id_for(key, seq, 0, namespace) for key in KEYS for seq in range(EVENTS_PER_KEY)}


def test_two_agents_with_their_own_namespaces_share_an_effector_cleanly(
    effector: BackgroundEffector, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    namespaces: dict[str, str | None] = {"screening": "screening", "ledger": "ledger-v1"}
    caplog.set_level(logging.WARNING)
    run = run_two_agents(effector.address, namespaces)

    assert run.dead_letters == []
    assert run.accepted == 2 * len(EVENTS)
    for agent in AGENTS:
        assert sorted(run.outputs[agent]) == sorted(
            f"{agent} {e.entity_key.decode()} {agent}:{e.external_event.decode()}".encode()
            for e in EVENTS
        )
    executions = Counter(started(read_ledger(ledger)))
    assert set(executions.values()) == {1}  # every effect exactly once
    assert set(executions) == minted("screening") | minted("ledger-v1")
    assert len(executions) == 2 * len(EVENTS)
    loud = {"effector.audit", "beam_agents.io.effector_link"}
    assert [r.getMessage() for r in caplog.records if r.name in loud] == []
    # Both agents read the whole log, so each is also handed the other's results, which it
    # refuses as not its own: the only errors either agent reports.
    for agent, other in (("screening", "ledger-v1"), ("ledger", "screening")):
        refused = {
            AgentEnvelope.FromString(e.envelope).tool_result.intent_id for e in run.errors[agent]
        }
        assert {e.reason for e in run.errors[agent]} == {"orphaned_result"}
        assert refused == minted(other)


def test_without_namespaces_the_same_agents_conflict(
    effector: BackgroundEffector, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    run = run_two_agents(effector.address, {"screening": None, "ledger": None})

    # One intent of each pair is rejected as a conflict: the other agent's work is lost.
    assert len(run.dead_letters) == len(EVENTS)
    assert {letter.intent.intent_id for letter in run.dead_letters} == minted(None)
    assert {letter.outcome for letter in run.dead_letters} == {"REJECTED"}
    assert all(letter.reason.startswith("conflict: intent ") for letter in run.dead_letters)
    assert all(CONFLICT_HINT in letter.reason for letter in run.dead_letters)
    assert run.accepted == len(EVENTS)
    executions = Counter(started(read_ledger(ledger)))
    assert set(executions) == minted(None) and set(executions.values()) == {1}
    # The effector logs each conflict, saying what differs; SubmitIntents each dead letter.
    conflicts = [r.getMessage() for r in caplog.records if r.name == "effector.audit"]
    assert len(conflicts) == len(EVENTS)
    assert all(CONFLICT_HINT in line and "args_json: recorded" in line for line in conflicts)
    letters = [r.getMessage() for r in caplog.records if r.name == "beam_agents.io.effector_link"]
    assert len(letters) == len(EVENTS)
    assert all("dead letter for intent" in line and "conflict" in line for line in letters)
