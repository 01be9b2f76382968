# mypy: disallow-untyped-calls=False
# (Beam's Fn API state classes are unannotated.)
"""RunAgent's state layout across changes: the same state and timers, old memory still reads.

(The replay cache's move into the continuation: ``test_cache_in_continuation.py``.)

The memory cell became a bag: memory committed as the old one-value cell still reads. The test
runs Beam's own Fn API state code (the runtime states a worker builds for a DoFn's state specs,
over the in-memory state service of ``FnApiRunner``), so what is checked is how Beam addresses
and stores the two kinds of state, not a copy of it.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from apache_beam.coders import BytesCoder
from apache_beam.coders.coders import GlobalWindowCoder
from apache_beam.runners.portability.fn_api_runner.worker_handlers import StateServicer
from apache_beam.runners.worker.bundle_processor import FnApiUserStateContext
from apache_beam.runners.worker.sdk_worker import GlobalCachingStateHandler
from apache_beam.runners.worker.statecache import StateCache
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, get_dofn_specs
from apache_beam.transforms.window import GlobalWindow

from beam_agents import AgentConfig, Complete
from beam_agents._protos import AgentEnvelope, MemorySlot, MemoryState
from beam_agents.core import dofn
from beam_agents.core._memory_wire import LARGE_CONTENT_BYTES
from beam_agents.core.context import ActivationContext
from beam_agents.core.errors import StateSchemaError
from beam_agents.core.memory import WorkingMemory
from beam_agents.core.state import decode_versioned
from tests.core.harness import InMemoryKeyState

KEY = b"acct-1"
OLD_CELL = ReadModifyWriteStateSpec("memory", BytesCoder())
"""The memory cell's spec before it was a bag."""


def _context(service: StateServicer) -> FnApiUserStateContext:
    handler = GlobalCachingStateHandler(StateCache(0), service)
    return FnApiUserStateContext(handler, "RunAgent/Agent", BytesCoder(), GlobalWindowCoder())


def _state(service: StateServicer, spec: Any) -> Any:
    return _context(service).get_state(spec, KEY, GlobalWindow())


def test_memory_committed_by_the_old_cell_reads_and_rewrites_through_the_bag() -> None:
    big = b"B" * (2 * LARGE_CONTENT_BYTES)
    old_blob = MemoryState(
        schema_version=1,
        slots=[MemorySlot(key="big", value=big), MemorySlot(key="note", value=b"n")],
    ).SerializeToString(deterministic=True)
    service = StateServicer()
    with service.process_instruction_id("old"):
        old = _state(service, OLD_CELL)
        old.write(old_blob)
        old.commit()

    with service.process_instruction_id("new"):
        bag = _state(service, dofn._MEMORY)
        elements = list(bag.read())
        assert elements == [old_blob]
        memory = WorkingMemory(elements)
        assert memory.get("big") == big and memory.get("note") == b"n"
        memory.set("note", b"changed")
        bag.clear()
        for element in memory.encode():
            bag.add(element)
        bag.commit()

    with service.process_instruction_id("again"):
        written = list(_state(service, dofn._MEMORY).read())
        # A release before the bag reads the cell as one value, the first element, and parses
        # it as the newest version it knew, 1: it refuses the split memory as newer state
        # instead of misreading a slot cut in two.
        with pytest.raises(StateSchemaError, match="schema version 2"):
            decode_versioned(MemoryState, _state(service, OLD_CELL).read(), 1)
    assert len(written) == 4 and written[2] == big  # the large value is an element of its own
    expected = MemoryState(
        schema_version=2,
        slots=[MemorySlot(key="big", value=big), MemorySlot(key="note", value=b"changed")],
    ).SerializeToString(deterministic=True)
    assert b"".join(written) == expected
    assert WorkingMemory(written).get("note") == b"changed"


async def _done(ctx: ActivationContext) -> Complete:
    return Complete()


def _layout(fn: Any) -> tuple[list[tuple[str, str]], list[str]]:
    states, timers = get_dofn_specs(fn)
    return sorted((spec.name, type(spec).__name__) for spec in states), sorted(
        spec.name for spec in timers
    )


def test_process_binds_neither_idle_timer_nor_old_cache_cell_and_the_layout_stays() -> None:
    plain = dofn.agent_dofn(_done, AgentConfig())
    expiring = dofn.agent_dofn(_done, AgentConfig(ttl_ms=60_000))
    assert "idle" not in inspect.signature(plain.process).parameters
    assert "idle" in inspect.signature(expiring.process).parameters
    # The replay cache's old cell: declared and bound by the timer callbacks only.
    for fn in (plain, expiring):
        assert "cache" not in inspect.signature(fn.process).parameters
        assert "cache" in inspect.signature(fn._on_deadline).parameters
        assert "cache" in inspect.signature(fn._on_idle).parameters
    layout = (
        [
            ("buffer", "BagStateSpec"),
            ("cache", "ReadModifyWriteStateSpec"),
            ("continuation", "ReadModifyWriteStateSpec"),
            ("header", "ReadModifyWriteStateSpec"),
            ("memory", "BagStateSpec"),
        ],
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
