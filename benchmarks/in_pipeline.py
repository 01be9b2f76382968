# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""What a DoFn's ``process`` costs inside a real pipeline, and Beam's state calls within it.

Thread CPU of ``process`` on FnApiRunner, with the state objects Beam passes wrapped so that
their calls are timed too. Run for RunAgent and for its floor, it splits the time between them
into our code once it runs between Beam's, the state calls, and what Beam does outside
``process`` (binding its parameters, handing over the element and the outputs). The timing
costs something itself (a clock read is a system call): it is measured on stubs right after
each timed run (:func:`calibrate`) and taken off the figures.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping
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

_now = time.thread_time_ns


class _Clock:
    """Thread CPU ns spent in ``process`` and, within it, in Beam's state calls (this process)."""

    process_ns = 0
    state_ns = 0
    calls = 0
    state_calls = 0

    @classmethod
    def reset(cls) -> None:
        cls.process_ns = cls.state_ns = cls.calls = cls.state_calls = 0


def _timed(method: Callable[..., Any], *args: Any) -> Any:
    """``method(*args)``, its thread CPU added to the state calls'."""
    started = _now()
    try:
        return method(*args)
    finally:
        _Clock.state_ns += _now() - started
        _Clock.state_calls += 1


def _listed(read: Callable[[], Any]) -> list[Any]:
    return list(read())


class _TimedCell:
    """A Beam state object whose every call is timed into :class:`_Clock`.

    The calls our code makes are methods of their own, so a call builds no closure.
    """

    __slots__ = ("_bag", "_cell")

    def __init__(self, cell: Any) -> None:
        self._cell = cell
        # A bag's ``read`` returns a lazy iterable: Beam fetches (and its state cache weighs)
        # the elements when they are iterated, so the elements are listed inside the timing.
        self._bag = hasattr(cell, "add")

    def read(self) -> Any:
        return _timed(_listed, self._cell.read) if self._bag else _timed(self._cell.read)

    def write(self, value: Any) -> None:
        _timed(self._cell.write, value)

    def add(self, value: Any) -> None:
        _timed(self._cell.add, value)

    def clear(self) -> None:
        _timed(self._cell.clear)

    def __getattr__(self, name: str) -> Any:
        """Any other call, timed too."""
        return functools.partial(_timed, getattr(self._cell, name))


def _timing(process: Callable[..., Any]) -> Callable[..., Any]:
    """``process`` timed; Beam passes its parameters in order and reads them from its signature.

    The state objects are wrapped before the clock starts, so wrapping them is not booked.
    """

    @functools.wraps(process)
    def timed(self: Any, element: Any, *params: Any) -> Any:
        cells = [_TimedCell(param) if hasattr(param, "read") else param for param in params]
        started = _now()
        try:
            return process(self, element, *cells)
        finally:
            _Clock.process_ns += _now() - started
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
class Calibration:
    """What the timing itself adds inside ``process``, ns per call, measured on stubs."""

    state_call_ns: float
    """A timed state call beyond the same call untimed: all of it inside ``process``'s clock."""
    state_inner_ns: float
    """The part of it inside the state call's own clock (booked to the state calls)."""
    process_ns: float
    """The ``process`` wrapper's part inside ``process``'s clock."""


class _Stub:
    """A state cell and a DoFn that do nothing, for :func:`calibrate`."""

    def write(self, value: Any) -> None:
        """Nothing."""

    def process(self, element: Any, header: Any) -> None:
        """Nothing."""


CALIBRATION_CALLS = 20_000
CALIBRATION_ROUNDS = 5


def _calibration_round(calls: int) -> Calibration:
    """One round of :func:`calibrate`: each loop timed as a whole, so its clock reads vanish."""
    stub, cell, plain, timed = _Stub(), _TimedCell(_Stub()), _Stub.process, _timing(_Stub.process)
    started = _now()
    for _ in range(calls):
        pass
    empty = _now() - started
    started = _now()
    for _ in range(calls):
        stub.write(b"")
    direct = _now() - started
    _Clock.reset()
    started = _now()
    for _ in range(calls):
        cell.write(b"")
    wrapped = _now() - started
    inner = _Clock.state_ns
    started = _now()
    for _ in range(calls):
        plain(stub, None, None)
    direct_process = _now() - started
    for _ in range(calls):
        timed(stub, None, None)
    return Calibration(
        state_call_ns=(wrapped - direct) / calls,
        state_inner_ns=(inner - (direct - empty)) / calls,
        process_ns=(_Clock.process_ns - (direct_process - empty)) / calls,
    )


def calibrate(calls: int = CALIBRATION_CALLS, rounds: int = CALIBRATION_ROUNDS) -> Calibration:
    """The timing's own cost: the median of ``rounds`` rounds of ``calls`` calls (clock reset)."""
    measured = [_calibration_round(calls) for _ in range(rounds)]
    _Clock.reset()
    return Calibration(
        *(
            statistics.median(getattr(one, field) for one in measured)
            for field in ("state_call_ns", "state_inner_ns", "process_ns")
        )
    )


@dataclass(frozen=True)
class InPipeline:
    """Microseconds per activation: all of ``process``, and Beam's state calls within it.

    Both are net of what the timing itself added (``timing_us`` and ``timing_state_us``).
    """

    process_us: float
    state_us: float
    state_calls: float = 0.0
    """Timed state calls per activation."""
    timing_us: float = 0.0
    """What the timing added inside ``process`` (taken off ``process_us``)."""
    timing_state_us: float = 0.0
    """Of it, what it added inside the state calls' clocks (taken off ``state_us``)."""
    calibration: Calibration | None = None
    """What the timing costs a call, measured right after the run."""

    @property
    def code_us(self) -> float:
        """The DoFn's own code inside the pipeline: ``process`` less the state calls."""
        return self.process_us - self.state_us


def _measured(activations: int, calibration: Calibration) -> InPipeline:
    """:class:`_Clock`'s figures per activation, net of ``calibration``."""
    if _Clock.calls != activations:
        raise RuntimeError(f"timed {_Clock.calls} activations, expected {activations}")
    state_calls = _Clock.state_calls / activations
    timing_state = state_calls * calibration.state_inner_ns / 1000
    timing = (state_calls * calibration.state_call_ns + calibration.process_ns) / 1000
    return InPipeline(
        process_us=_Clock.process_ns / activations / 1000 - timing,
        state_us=_Clock.state_ns / activations / 1000 - timing_state,
        state_calls=state_calls,
        timing_us=timing,
        timing_state_us=timing_state,
        calibration=calibration,
    )


def _stage(make: Callable[[], beam.DoFn]) -> Callable[[PCollection[Element]], None]:
    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Timed" >> beam.ParDo(make()).with_outputs(
            INTENTS_TAG, TRACES_TAG, ERRORS_TAG, RECORDS_TAG, main=OUTPUT_TAG
        )

    return stage


def in_rounds(
    makes: Mapping[str, Callable[[], beam.DoFn]], elements: list[Element], rounds: int
) -> dict[str, list[InPipeline]]:
    """Each DoFn over the keyed ``elements``, taking turns for ``rounds`` rounds: every round's.

    Each first runs once on a twentieth of them; each timed run is calibrated right after.
    """
    for make in makes.values():
        run_pipeline(elements[: len(elements) // 20], _stage(make))
    measured: dict[str, list[InPipeline]] = {name: [] for name in makes}
    for _ in range(rounds):
        for name, make in makes.items():
            _Clock.reset()
            run_pipeline(elements, _stage(make))
            clock = (_Clock.process_ns, _Clock.state_ns, _Clock.calls, _Clock.state_calls)
            calibration = calibrate()
            _Clock.process_ns, _Clock.state_ns, _Clock.calls, _Clock.state_calls = clock
            measured[name].append(_measured(len(elements), calibration))
    return measured


def in_pipeline(make: Callable[[], beam.DoFn], elements: list[Element]) -> InPipeline:
    """Run the DoFn ``make`` gives over the keyed ``elements``, after a warm-up on a twentieth."""
    return in_rounds({"timed": make}, elements, rounds=1)["timed"][0]


def agent(agent_fn: AgentFn, config: AgentConfig) -> Callable[[], beam.DoFn]:
    """A maker of the timed RunAgent DoFn."""
    return functools.partial(TimedAgentDoFn, agent_fn, config)
