"""Where benchmark 4's activation grows with the memory's size: our code, state calls, or Beam.

Also its paired rounds' arithmetic (the fixed cost and the growth, round by round) and what
benchmark 1's named changes could save this agent's activation.

The timed DoFns of :mod:`benchmarks.in_pipeline` run RunAgent and the floor at the smallest
and the largest size; what each grew inside ``process`` (thread CPU), split into the DoFn's own
code and Beam's state calls, against what the figures say each grew in all, places the growth
that ours shows beyond the floor's: in our code, in the state calls, or outside ``process``
(Beam handing over the element and the outputs; the bundle's commit cancels out of the figures).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from beam_agents import AgentConfig
from benchmarks import memory_runs
from benchmarks.core_only import core_microseconds
from benchmarks.in_pipeline import InPipeline
from benchmarks.memory_runs import FLOOR, KEYS, OURS, SIZES, Paired, rewrite_memory
from benchmarks.noop_profile import Ranking, part_costs, rank_without_beam
from benchmarks.report import Figure

MEMORY_PARTS = ("the memory write", "the activation's path")
"""Benchmark 1's named parts for its model-call activation, which writes memory as this one."""
RANKED_EVENTS = 4_000
"""Activations (at the smallest size) profiled to size those parts here: well under a second."""


def signed(us: float) -> str:
    """``us`` rounded to whole µs with its sign, a rounded zero as ``+0`` (never ``-0``)."""
    return f"{round(us):+d}"


def whole(values: Sequence[float]) -> str:
    """``values`` rounded to whole µs as ``low to high`` (or the one value), never ``-0``."""
    low, high = round(min(values)), round(max(values))
    return f"{low}" if low == high else f"{low} to {high}"


@dataclass(frozen=True)
class Growth:
    """One size against the smallest, round by round (round i against round i), µs."""

    fixed: list[float]
    """Ours less the floor at the smallest size: the fixed cost of an activation."""
    beyond: list[float]
    """What ours less the floor grew from the smallest size: ours' growth beyond the floor's."""
    floor: list[float]
    """What the floor grew from the smallest size."""


def growth(smallest: Paired, size: Paired) -> Growth:
    """The paired rounds of ``size`` set against those of ``smallest``, in µs."""
    pairs = list(zip(smallest.rounds, size.rounds, strict=True))
    return Growth(
        fixed=[(small.ours - small.floor) * 1e6 for small, _ in pairs],
        beyond=[
            ((big.ours - big.floor) - (small.ours - small.floor)) * 1e6 for small, big in pairs
        ],
        floor=[(big.floor - small.floor) * 1e6 for small, big in pairs],
    )


def grew(values: list[float], what: str) -> str:
    """``what`` grew by ``values`` round by round; below the rounds' noise if its median is not
    above zero (writing more bytes cannot cost less)."""
    if statistics.median(values) <= 0:
        return (
            f"{what} is below the rounds' noise (no growth measurable: {whole(values)} µs round "
            "by round)"
        )
    return f"{what} ran {whole(values)} µs round by round (median {statistics.median(values):.0f})"


def memory_ranking(quick: bool) -> Ranking:
    """Benchmark 1's profile of our code without Beam, for this agent at the smallest size."""
    count = 400 if quick else RANKED_EVENTS
    events = memory_runs.events(count, SIZES[0])
    return rank_without_beam("memory", rewrite_memory, AgentConfig(), events, KEYS)


def named_saving(ranking: Ranking, cuts: dict[str, float]) -> str:
    """What benchmark 1's named changes to :data:`MEMORY_PARTS` could save, against ``cuts``
    (the µs each size's worst round must lose)."""
    costs = {cost.part.label: ranking.unprofiled(cost.us) for cost in part_costs(ranking)}
    parts = {label: costs.get(label, 0.0) for label in MEMORY_PARTS}
    most = sum(parts.values())
    against = ", ".join(
        f"{over:.1f} µs at {size} ({'within' if most >= over else 'more than'} that)"
        for size, over in cuts.items()
    )
    return (
        "Benchmark 1's named changes for an activation that writes memory, to "
        + " and ".join(f"{label} (~{us:.1f} µs)" for label, us in parts.items())
        + f", take ~{most:.1f} µs of this agent's activation at {memory_runs.label(SIZES[0])} "
        f"without Beam (profiled here, {ranking.activations:,} activations on "
        f"{ranking.keys} keys; ~ is a part's share of the time without the profiler): removed "
        f"entirely they would remove at most that, against the cut the worst round needs: "
        f"{against}."
    )


@dataclass(frozen=True)
class Placement:
    """``process`` at the smallest and the largest size, ours and the floor's (µs/activation)."""

    ours: tuple[InPipeline, InPipeline]
    floor: tuple[InPipeline, InPipeline]
    alone: tuple[float, float]
    """Our code at both sizes without Beam (:mod:`benchmarks.core_only`)."""


def account(
    placement: Placement, smallest: Figure, largest: Figure, labels: tuple[str, str]
) -> str:
    """A sentence placing the growth ours shows beyond the floor's, from the figures and splits."""
    assert smallest.floor is not None and largest.floor is not None
    beyond = (largest.ours - largest.floor) - (smallest.ours - smallest.floor)
    (ours_small, ours_large), (floor_small, floor_large) = placement.ours, placement.floor
    code = (ours_large.code_us - ours_small.code_us) - (floor_large.code_us - floor_small.code_us)
    state = (ours_large.state_us - ours_small.state_us) - (
        floor_large.state_us - floor_small.state_us
    )
    outside = beyond - code - state
    alone = placement.alone[1] - placement.alone[0]
    own = alone - (floor_large.code_us - floor_small.code_us)
    small, large = labels
    return (
        f"From {small} to {large} ours grew {beyond:.0f} µs beyond the floor's growth; placed in "
        f"the pipeline (thread CPU of `process`, `benchmarks/in_pipeline.py`, at both sizes): "
        f"{signed(code)} µs in our code beyond the floor's own code (which makes the same value), "
        f"{signed(state)} in Beam's state calls beyond the floor's, and {signed(outside)} outside "
        "`process` (Beam handing over the element and our outputs; the commit at the bundle's "
        f"end cancels out of the figures; noise lands here too). Inside `process` ours took "
        f"{ours_small.process_us:.0f} and {ours_large.process_us:.0f} µs "
        f"({ours_small.state_us:.0f} and {ours_large.state_us:.0f} in state calls), the floor "
        f"{floor_small.process_us:.0f} "
        f"and {floor_large.process_us:.0f} ({floor_small.state_us:.0f} and "
        f"{floor_large.state_us:.0f}). Without Beam (`benchmarks/core_only.py`, the same events) "
        f"our code grew {alone:.0f} µs, {signed(own)} beyond the growth of the floor's code in "
        "the pipeline (the floor makes the same value and little else): that much is our own "
        f"work with the value; the other {signed(code - own)} µs our code grew beyond the "
        "floor's in the pipeline are not placed by this run."
    )


def at_the_ends(inside: dict[int, dict[str, InPipeline]]) -> Placement:
    """The in-pipeline split at the smallest and the largest size, and our code without Beam."""
    small, large = SIZES[0], SIZES[-1]
    alone = [
        core_microseconds(
            rewrite_memory, AgentConfig(), memory_runs.events(memory_runs.inside_count(size), size)
        )
        for size in (small, large)
    ]
    return Placement(
        ours=(inside[small][OURS], inside[large][OURS]),
        floor=(inside[small][FLOOR], inside[large][FLOOR]),
        alone=(alone[0], alone[1]),
    )
