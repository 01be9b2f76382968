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
from benchmarks.pipelines import Element
from tests.core.harness import InMemoryKeyState


def core_microseconds(
    agent: AgentFn, config: AgentConfig, elements: list[Element], *, rounds: int = 5
) -> float:
    """Best thread CPU time per activation of ``agent`` over the keyed ``elements``, in µs."""
    dofn = AgentDoFn(agent, config)
    dofn.setup()
    cells: dict[bytes, InMemoryKeyState] = {}

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
    return best / len(elements) * 1e6
