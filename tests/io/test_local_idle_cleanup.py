"""Idle-key cleanup on the local loop: the FnApiRunner's early timers wipe no waiting run."""

from __future__ import annotations

import time
from pathlib import Path

import apache_beam as beam

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolRegistry,
    tool,
)
from effector import EffectorThread
from tests.io.io_harness import Collector


@tool(side_effect=True)
def ship(order: str) -> str:
    """Ship an order (run by the effector)."""
    return f"shipped {order}"


async def ships_then_completes(ctx: ActivationContext) -> Complete | Suspend:
    """Ship, wait for the effector's result, complete."""
    if ctx.is_resume:
        return Complete(output=b"done " + ctx.snapshot)
    ctx.act("ship", {"order": ctx.entity_key.decode()})
    return Suspend(snapshot=ctx.entity_key, timeout_ms=600_000)


def test_a_run_waiting_on_the_local_loop_outlives_the_runners_early_idle_timers(
    tmp_path: Path,
) -> None:
    """Found by a trial: with ttl_ms set, every waiting run was wiped about a second in."""
    registry = ToolRegistry([ship])
    now_ms = int(time.time() * 1000)
    events = [
        AgentEnvelope(entity_key=f"order-{n}".encode(), event_time_ms=now_ms, external_event=b"o")
        for n in range(3)
    ]
    outputs, errors = Collector.new(), Collector.new()
    started = time.monotonic()
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, registry) as effector, beam.Pipeline() as pipeline:
        read = pipeline | ReadEnvelopes(effector.address, events=events, stop_when_idle_s=1.0)
        config = AgentConfig(tool_registry=registry, ttl_ms=600_000)
        ran = read | RunAgent(ships_then_completes, config=config)
        ran.intents | SubmitIntents(effector.address)
        ran.output | "Outputs" >> outputs.sink()
        ran.errors | "Errors" >> errors.sink()
    assert sorted(outputs.values()) == [b"done order-0", b"done order-1", b"done order-2"]
    assert errors.values() == []
    assert time.monotonic() - started < 60  # and the pipeline ends, keys kept
