# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 1's split of each row's gap above its floor, and Beam's cost of the parameters.

Per activation, at the rows' 100 events per key: our code without Beam, and ``process`` inside
the pipeline for ours and the floor with Beam's state calls within it (thread CPU, net of the
timing's own cost, in rounds so the spread shows), and what Beam charges for binding RunAgent's
parameters (interleaved rounds of two pipelines).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import apache_beam as beam

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from benchmarks.core_only import core_microseconds
from benchmarks.harness import seconds_per_call
from benchmarks.in_pipeline import InPipeline, in_rounds
from benchmarks.in_pipeline import agent as timed_agent
from benchmarks.pipelines import (
    WARM_UP_ELEMENTS,
    Element,
    Stage,
    bare_stateful,
    keyed_events,
    run_pipeline,
    runagent_parameters,
)

PER_KEY = 100
"""Events per key in the split, the parameters' cost and the profiles, as in the rows."""
SPLIT_KEYS = 500
"""Keys in the split: half the rows' 1,000, at their 100 events per key, so that two rounds of
four pipelines fit the suite's time (per-key costs are spread over as many events as in the row)."""
SPLIT_ROUNDS = 2
OWN_EVENTS = 10_000
"""Events (at :data:`PER_KEY` a key) over which our code is timed without Beam, best of three."""
PARAMETER_ROUNDS = 3
PARAMETER_EVENTS = 20_000
"""The parameters' cost is a difference of two close figures: smaller runs, in more rounds."""


def rounds_of(count: int) -> str:
    """``1 round``, ``2 rounds``."""
    return f"{count} round{'' if count == 1 else 's'}"


def span(values: Sequence[float], digits: int = 1, sign: str = "") -> str:
    """``values`` as ``low to high`` (or the one value), e.g. ``1.2 to 3.4``, ``+1.2 to +3.4``."""
    low, high = (f"{{:{sign}.{digits}f}}".format(value) for value in (min(values), max(values)))
    return low if low == high else f"{low} to {high}"


@dataclass(frozen=True)
class Split:
    """One activation's cost taken apart in this run (µs per activation, thread CPU)."""

    own_us: float
    """Our code without Beam (``core_only``)."""
    ours: list[InPipeline]
    """RunAgent's ``process`` in the pipeline, and Beam's state calls within it, each round."""
    floor: list[InPipeline]
    """The floor's ``process`` in the pipeline, and its state calls, each round."""

    @property
    def code(self) -> list[float]:
        """Our code beyond the floor's own, each round."""
        return [o.code_us - f.code_us for o, f in zip(self.ours, self.floor, strict=True)]

    @property
    def state(self) -> list[float]:
        """Beam's state calls beyond the floor's, each round."""
        return [o.state_us - f.state_us for o, f in zip(self.ours, self.floor, strict=True)]

    def rest(self, gap: float) -> list[float]:
        """What of the row's ``gap`` is outside ``process``, each round, from the figures as
        the text shows them (to 0.1 µs), so that the printed parts add up to the printed gap."""
        return [
            round(round(gap, 1) - round(code, 1) - round(state, 1), 1)
            for code, state in zip(self.code, self.state, strict=True)
        ]

    @property
    def slower(self) -> list[float]:
        """Our code in the pipeline over its time without Beam, each round (timing taken off)."""
        return [o.code_us / self.own_us for o in self.ours]

    @property
    def slower_timed(self) -> list[float]:
        """The same with the timing's own cost left in, as it was booked."""
        return [(o.code_us + o.timing_us - o.timing_state_us) / self.own_us for o in self.ours]


Case = tuple[str, AgentFn, AgentConfig, Callable[[], beam.DoFn]]
"""An activation: name, agent, config and the floor timed in the pipeline."""


def measure(cases: Sequence[Case], quick: bool) -> tuple[int, int, list[Split]]:
    """Each case's split: keys, rounds and the splits, ours and its floor taking turns."""
    keys, rounds = (20, 1) if quick else (SPLIT_KEYS, SPLIT_ROUNDS)
    own_events = keyed_events(
        2_000 if quick else OWN_EVENTS, (2_000 if quick else OWN_EVENTS) // PER_KEY
    )
    makes = {}
    for name, agent_fn, config, floor in cases:
        makes[f"{name} ours"] = timed_agent(agent_fn, config)
        makes[f"{name} floor"] = floor
    inside = in_rounds(makes, keyed_events(keys * PER_KEY, keys), rounds)
    splits = [
        Split(
            core_microseconds(agent_fn, config, own_events, rounds=3),
            inside[f"{name} ours"],
            inside[f"{name} floor"],
        )
        for name, agent_fn, config, _ in cases
    ]
    return keys, rounds, splits


def split_line(name: str, split: Split, keys: int, rounds: int, floor_net: float | None) -> str:
    """The detail line for one activation's split."""
    ours, floor = split.ours, split.floor
    timing = ours[0]
    code = [_less(o.process_us, o.state_us) for o in ours]
    net = (
        f" (in the row the whole floor costs {floor_net:.1f} µs/element above the source alone)"
        if floor_net is not None
        else ""
    )
    return (
        f"The {name} activation, thread CPU per activation, at {PER_KEY} events per key as in the "
        f"rows: without Beam (`AgentDoFn.process` on plain in-memory cells, "
        f"{OWN_EVENTS // PER_KEY:,} keys, best of three rounds, `benchmarks/core_only.py`) our "
        f"code took {split.own_us:.1f} µs; in the pipeline ({keys:,} keys, "
        f"{keys * PER_KEY:,} activations, {rounds_of(rounds)} taking turns with the floor, ranges "
        "over the rounds; `benchmarks/in_pipeline.py`: `process` on FnApiRunner, with the state "
        "objects Beam passes wrapped so their calls, a bag's lazy read included, are timed) "
        f"`process` took {span([o.process_us for o in ours])} µs, "
        f"{span([o.state_us for o in ours])} of it in Beam's "
        f"{timing.state_calls:g} state calls, so our code took {span(code)} "
        f"({span(split.slower, 2)}x its time without Beam); the floor's `process` took "
        f"{span([f.process_us for f in floor])}{net}, {span([f.state_us for f in floor])} of it "
        f"in its {floor[0].state_calls:g} state calls. These are net of the timing's own cost "
        f"(its clock reads are system calls), measured right after each timed run on stubs "
        f"({_per_call(ours + floor)}): per activation {span([o.timing_us for o in ours])} µs "
        "for ours "
        f"({span([o.timing_state_us for o in ours])} of it inside the state calls' clocks) and "
        f"{span([f.timing_us for f in floor])} for the floor; with it left in, our code ran at "
        f"{span(split.slower_timed, 2)}x its time without Beam."
    )


def _less(whole: float, part: float) -> float:
    """``whole`` less ``part`` as the text shows them, to 0.1."""
    return round(round(whole, 1) - round(part, 1), 1)


def _per_call(runs: Sequence[InPipeline]) -> str:
    """The calibrations of ``runs``: what the timing costs a state call and a ``process``."""
    measured = [run.calibration for run in runs if run.calibration is not None]
    if not measured:
        return "not calibrated"
    call = span([c.state_call_ns for c in measured], 0)
    inner = span([c.state_inner_ns for c in measured], 0)
    process = span([c.process_ns for c in measured], 0)
    return f"{call} ns a state call, {inner} of it inside its own clock, and {process} a `process`"


@dataclass(frozen=True)
class Parameters:
    """What Beam charges for binding RunAgent's parameters beyond the floor's, µs/element."""

    rounds: list[float]
    """Each round's difference, declared less the floor in the same round."""
    keys: int
    events: int

    @property
    def median(self) -> float:
        """The median of the rounds' paired differences: the estimate."""
        return statistics.median(self.rounds)

    def without(self, ours: float, floor: float) -> list[float]:
        """The ratio ``ours`` over ``floor`` would be without the binding, each round's, from
        the figures as the text shows them (to 0.1 µs)."""
        return [(round(ours, 1) - round(cost, 1)) / round(floor, 1) for cost in self.rounds]


def rounds_per_element(
    elements: list[Element], stages: Mapping[str, Stage], rounds: int
) -> dict[str, list[float]]:
    """Every round's µs per element of ``Create(elements) | stage``, the stages taking turns.

    Each first runs once on a few elements, as :func:`benchmarks.pipelines.seconds_per_element`.
    """
    for stage in stages.values():
        run_pipeline(elements[:WARM_UP_ELEMENTS], stage)
    timed: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(rounds):
        for name, stage in stages.items():
            seconds = seconds_per_call(functools.partial(run_pipeline, elements, stage))
            timed[name].append(seconds / len(elements) * 1e6)
    return timed


def parameters_cost(quick: bool) -> tuple[Parameters, str]:
    """What Beam charges for binding the four parameters beyond the floor's, and its detail line.

    The no-op floor and the same floor declaring RunAgent's five state and timer parameters
    take turns, :data:`PARAMETER_ROUNDS` rounds, at :data:`PER_KEY` events per key.
    """
    count, rounds = (2_000, 1) if quick else (PARAMETER_EVENTS, PARAMETER_ROUNDS)
    keys = count // PER_KEY
    stages = {"floor": bare_stateful, "runagent parameters": runagent_parameters}
    us = rounds_per_element(keyed_events(count, keys), stages, rounds)
    floor, declared = us["floor"], us["runagent parameters"]
    cost = Parameters(
        rounds=[_less(d, f) for d, f in zip(declared, floor, strict=True)],
        keys=keys,
        events=count,
    )
    return cost, (
        f"{keys:,} keys, {count:,} events ({PER_KEY} a key, as in the rows), "
        f"{rounds_of(rounds)}, taking turns: the no-op floor declaring RunAgent's five state and "
        f"timer parameters (touching only the header, as the floor does) costs {span(declared)} "
        "µs/element against the "
        f"floor's {span(floor)}: Beam binding the other four parameters, before our code runs, "
        f"comes to {span(cost.rounds, sign='+')} µs/element round by round (declared less the "
        f"floor in the same round), median {cost.median:.1f}."
    )


def parameters_estimate(no_op_gap: float, cost: Parameters) -> str:
    """What fewer ``process`` parameters would save, as an estimate with this run's spread."""
    spread = span(cost.rounds, sign="+")
    if max(cost.rounds) <= 0:
        return (
            f"Fewer `process` parameters: this run measured {spread} µs/element for all four "
            "beyond the floor's, round by round: nothing measurable to save."
        )
    share = (
        f" ({round(cost.median, 1) / round(no_op_gap, 1):.0%} of the no-op activation's gap)"
        if no_op_gap > 0
        else ""
    )
    return (
        f"Fewer `process` parameters: Beam's binding of the four beyond the floor's is estimated "
        f"at {cost.median:.1f} µs/element, the median of the rounds' paired differences{share}, "
        f"{spread} round by round "
        f"({cost.events:,} events on {cost.keys:,} keys, a difference of two close figures)."
    )
