"""The runtime's own Python per activation, without Beam: ``AgentDoFn.process`` on plain cells.

It splits a pipeline figure in two: what our code costs when nothing else runs (this), and
what the pipeline adds around it (Beam handing over the element, binding state and timer
parameters, tagging outputs, its state cache). Best of several rounds of thread CPU time.
"""

from __future__ import annotations

import time

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import AgentDoFn
from benchmarks.pipelines import Element, keyed_events
from tests.core.harness import InMemoryKeyState


def core_microseconds(
    agent: AgentFn,
    config: AgentConfig,
    *,
    keys: int,
    activations: int,
    rounds: int = 5,
    elements: list[Element] | None = None,
) -> float:
    """Best thread CPU time per activation of ``agent`` over ``keys`` keys, in microseconds.

    ``elements`` replaces the events (``activations`` of them) where they must carry more.
    """
    dofn = AgentDoFn(agent, config)
    dofn.setup()
    cells: dict[bytes, InMemoryKeyState] = {}
    elements = keyed_events(activations, keys) if elements is None else elements

    def run_all() -> None:
        for key, envelope in elements:
            state = cells.get(key)
            if state is None:
                state = cells[key] = InMemoryKeyState()
            state.process(dofn, key, envelope)

    try:
        run_all()  # warm-up: every key gets its cells and first commit
        best = float("inf")
        for _ in range(rounds):
            started = time.thread_time()
            run_all()
            best = min(best, time.thread_time() - started)
    finally:
        dofn.teardown()
    return best / activations * 1e6
