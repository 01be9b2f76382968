"""The runtime's own Python per activation, without Beam: ``AgentDoFn.process`` on plain cells.

It splits a pipeline figure in two: what our code costs when nothing else runs (this), and
what the pipeline adds around it (Beam handing over the element, binding state and timer
parameters, tagging outputs, its state cache). Best of several rounds of thread CPU time.
"""

from __future__ import annotations

import time
from typing import Any

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import AgentDoFn
from benchmarks.pipelines import keyed_events


class _Cell:
    """A value cell: what Beam's ``ReadModifyWriteState`` offers the DoFn."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Bag(_Cell):
    """A bag cell (the buffer): reads as a list."""

    def read(self) -> Any:
        return self.value or []

    def add(self, value: Any) -> None:
        self.value = [*(self.value or []), value]


class _Timer:
    """A timer that is never fired here."""

    def set(self, timestamp: Any) -> None:
        """Ignore the time."""

    def clear(self) -> None:
        """Nothing to clear."""


def core_microseconds(
    agent: AgentFn, config: AgentConfig, *, keys: int, activations: int, rounds: int = 5
) -> float:
    """Best thread CPU time per activation of ``agent`` over ``keys`` keys, in microseconds."""
    dofn = AgentDoFn(agent, config)
    dofn.setup()
    cells: dict[bytes, tuple[_Cell, _Cell, _Cell, _Cell, _Bag]] = {}
    timer = _Timer()
    elements = keyed_events(activations, keys)

    def run_all() -> None:
        for element in elements:
            key = element[0]
            state = cells.get(key)
            if state is None:
                state = cells[key] = (_Cell(), _Cell(), _Cell(), _Cell(), _Bag())
            dofn.process(element, *state, timer, timer)

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
