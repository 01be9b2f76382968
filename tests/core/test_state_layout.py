"""RunAgent's state layout: the state cells and timers its DoFn declares and binds."""

from __future__ import annotations

import inspect
from typing import Any

from apache_beam.transforms.userstate import get_dofn_specs

from beam_agents import AgentConfig, Complete
from beam_agents._protos import AgentEnvelope
from beam_agents.core.context import ActivationContext
from beam_agents.io import run_agent as dofn
from tests.core.harness import InMemoryKeyState

KEY = b"acct-1"


async def _done(ctx: ActivationContext) -> Complete:
    return Complete()


def _layout(fn: Any) -> tuple[list[tuple[str, str]], list[str]]:
    states, timers = get_dofn_specs(fn)
    return sorted((spec.name, type(spec).__name__) for spec in states), sorted(
        spec.name for spec in timers
    )


def test_process_binds_the_idle_timer_only_under_a_ttl_and_the_layout_stays() -> None:
    plain = dofn.agent_dofn(_done, AgentConfig())
    expiring = dofn.agent_dofn(_done, AgentConfig(ttl_ms=60_000))
    assert "idle" not in inspect.signature(plain.process).parameters
    assert "idle" in inspect.signature(expiring.process).parameters
    layout = (
        [("header", "BagStateSpec"), ("memory", "BagStateSpec")],
        ["ts-deadline", "ts-idle"],  # Beam prefixes timer names
    )
    assert _layout(plain) == _layout(expiring) == layout


def test_an_agent_dofn_built_directly_arms_the_idle_timer_under_a_ttl() -> None:
    built = dofn.AgentDoFn(_done, AgentConfig(ttl_ms=60_000))
    assert "idle" in inspect.signature(built.process).parameters
    built.setup()
    cells = InMemoryKeyState()
    try:
        envelope = AgentEnvelope(entity_key=KEY, event_time_ms=1_000, external_event=b"e")
        cells.process(built, KEY, envelope)
    finally:
        built.teardown()
    assert cells.idle.at is not None  # armed for the key's first activity
