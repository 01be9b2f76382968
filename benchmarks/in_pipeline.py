# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""What a DoFn's ``process`` costs inside a real pipeline, and Beam's state calls within it.

Thread CPU of ``process`` on FnApiRunner, with the state objects Beam passes wrapped so that
their calls are timed too. Run for RunAgent and for its floor, it splits the time between them
into our code once it runs between Beam's, the state calls, and what Beam does outside
``process`` (binding its parameters, handing over the element and the outputs).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.pvalue import PCollection

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import (
    ERRORS_TAG,
    INTENTS_TAG,
    OUTPUT_TAG,
    RECORDS_TAG,
    TRACES_TAG,
    AgentDoFn,
)
from benchmarks.pipelines import (
    BareMemoryDoFn,
    BareStatefulDoFn,
    Element,
    run_pipeline,
)


class _Clock:
    """Thread CPU ns spent in ``process`` and, within it, in Beam's state calls (this process)."""

    process_ns = 0
    state_ns = 0
    calls = 0


class _TimedCell:
    """A Beam state object whose every call is timed into :class:`_Clock`."""

    def __init__(self, cell: Any) -> None:
        self._cell = cell

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._cell, name)
        # A bag's ``read`` returns a lazy iterable: Beam fetches (and its state cache weighs)
        # the elements when they are iterated, so the elements are listed inside the timing.
        lazy = name == "read" and hasattr(self._cell, "add")

        def timed(*args: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return list(method(*args)) if lazy else method(*args)
            finally:
                _Clock.state_ns += time.thread_time_ns() - started

        return timed


def _timing(process: Callable[..., Any]) -> Callable[..., Any]:
    """``process`` timed; Beam passes its parameters in order and reads them from its signature."""

    @functools.wraps(process)
    def timed(self: Any, element: Any, *params: Any) -> Any:
        cells = [_TimedCell(param) if hasattr(param, "read") else param for param in params]
        started = time.thread_time_ns()
        try:
            return process(self, element, *cells)
        finally:
            _Clock.process_ns += time.thread_time_ns() - started
            _Clock.calls += 1

    return timed


class TimedAgentDoFn(AgentDoFn):
    """``AgentDoFn``, timed."""

    process = _timing(AgentDoFn.process)


class TimedStatefulFloor(BareStatefulDoFn):
    """The no-op floor, timed."""

    process = _timing(BareStatefulDoFn.process)


class TimedMemoryFloor(BareMemoryDoFn):
    """The model-call floor, timed."""

    process = _timing(BareMemoryDoFn.process)


@dataclass(frozen=True)
class InPipeline:
    """Microseconds per activation: all of ``process``, and Beam's state calls within it."""

    process_us: float
    state_us: float

    @property
    def code_us(self) -> float:
        """The DoFn's own code inside the pipeline: ``process`` less the state calls."""
        return self.process_us - self.state_us


def in_pipeline(make: Callable[[], beam.DoFn], elements: list[Element]) -> InPipeline:
    """Run the DoFn ``make`` gives over the keyed ``elements``, after a warm-up on a twentieth."""

    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Timed" >> beam.ParDo(make()).with_outputs(
            INTENTS_TAG, TRACES_TAG, ERRORS_TAG, RECORDS_TAG, main=OUTPUT_TAG
        )

    activations = len(elements)
    run_pipeline(elements[: activations // 20], stage)
    _Clock.process_ns = _Clock.state_ns = _Clock.calls = 0
    run_pipeline(elements, stage)
    if _Clock.calls != activations:
        raise RuntimeError(f"timed {_Clock.calls} activations, expected {activations}")
    return InPipeline(_Clock.process_ns / activations / 1000, _Clock.state_ns / activations / 1000)


def agent(agent_fn: AgentFn, config: AgentConfig) -> Callable[[], beam.DoFn]:
    """A maker of the timed RunAgent DoFn."""
    return functools.partial(TimedAgentDoFn, agent_fn, config)
