"""Where benchmark 4's activation grows with the memory's size: our code, state calls, or Beam.

Also its paired rounds' arithmetic (the fixed cost and the growth, round by round), one rule
for when a round-by-round range is noise, and the profile of this agent without Beam at both
end sizes that :mod:`benchmarks.commit_findings` reads.

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
from benchmarks.noop_profile import Ranking, rank_without_beam
from benchmarks.report import tenth

RANKED_EVENTS = 4_000
"""Activations profiled without Beam at each end size: about two seconds for both."""


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


def measurable(values: Sequence[float]) -> bool:
    """Whether ``values`` (µs, round by round) are all above zero once rounded as printed."""
    return round(min(values)) > 0


def grew(values: list[float], what: str) -> str:
    """``what`` grew by ``values`` round by round; not measurable if their range holds zero.

    One rule everywhere: a round-by-round range (rounded as printed) that contains zero is
    noise, a range above zero is growth, and one below zero fell in every round.
    """
    middle = statistics.median(values)
    if measurable(values):
        return f"{what} ran {whole(values)} µs round by round (median {middle:.0f})"
    if round(max(values)) < 0:
        return (
            f"{what} fell in every round ({whole(values)} µs round by round, median {middle:.0f})"
        )
    return f"{what} is not measurable (noise: {whole(values)} µs round by round)"


def memory_rankings(quick: bool) -> tuple[Ranking, Ranking]:
    """Benchmark 1's profile of our code without Beam, for this agent at both end sizes."""
    count = 400 if quick else RANKED_EVENTS
    return tuple(  # type: ignore[return-value]
        rank_without_beam(
            "memory", rewrite_memory, AgentConfig(), memory_runs.events(count, size), KEYS
        )
        for size in (SIZES[0], SIZES[-1])
    )


def tenths(total: float, *parts: float) -> tuple[float, ...]:
    """``parts`` rounded to 0.1 and the rest of ``total`` (itself rounded) after them, last.

    The printed parts then add up to the printed total exactly.
    """
    rounded = [tenth(part) for part in parts]
    return (*rounded, tenth(tenth(total) - sum(rounded)))


def shown(inside: InPipeline) -> tuple[float, float, float]:
    """``process``, its state calls and our code (the difference) as printed, to 0.1 µs.

    Every difference the text prints is taken from these, so the reader's arithmetic on the
    printed figures gives the printed results.
    """
    process, state = tenth(inside.process_us), tenth(inside.state_us)
    return process, state, tenth(process - state)


@dataclass(frozen=True)
class Placement:
    """``process`` at the smallest and the largest size, ours and the floor's (µs/activation)."""

    ours: tuple[InPipeline, InPipeline]
    floor: tuple[InPipeline, InPipeline]
    alone: tuple[float, float]
    """Our code at both sizes without Beam (:mod:`benchmarks.core_only`)."""


def account(placement: Placement, beyond: Sequence[float], labels: tuple[str, str]) -> str:
    """A sentence placing the growth ours shows beyond the floor's (``beyond``, µs round by
    round) in our code, Beam's state calls and outside ``process``; its parts add up."""
    middle = statistics.median(beyond)
    (ours_small, ours_large), (floor_small, floor_large) = (
        tuple(map(shown, placement.ours)),
        tuple(map(shown, placement.floor)),
    )
    ours_code, floor_code = (
        tenth(ours_large[2] - ours_small[2]),
        tenth(floor_large[2] - floor_small[2]),
    )
    code, state, outside = tenths(
        middle,
        ours_code - floor_code,
        (ours_large[1] - ours_small[1]) - (floor_large[1] - floor_small[1]),
    )
    alone = tenth(placement.alone[1] - placement.alone[0])
    small, large = labels
    return (
        f"From {small} to {large} "
        + grew(list(beyond), "what ours grew beyond the floor's growth")
        + f"; its median, {middle:+.1f} µs, placed in the pipeline (thread CPU of `process`, "
        f"`benchmarks/in_pipeline.py`, one run at each size): {code:+.1f} µs in our code beyond "
        f"the floor's own code (which makes the same value), {state:+.1f} in Beam's state calls "
        f"beyond the floor's, and the rest, {outside:+.1f}, outside `process` (Beam handing over "
        "the element and our outputs; the commit at the bundle's end cancels out of the "
        f"figures; noise lands here too). Inside `process` ours took {ours_small[0]:.1f} and "
        f"{ours_large[0]:.1f} µs ({ours_small[1]:.1f} and {ours_large[1]:.1f} in state calls), "
        f"the floor {floor_small[0]:.1f} and {floor_large[0]:.1f} ({floor_small[1]:.1f} and "
        f"{floor_large[1]:.1f}): our code grew {ours_code:.1f} µs there, the floor's "
        f"{floor_code:.1f}. Without Beam (`benchmarks/core_only.py`, the same events) our code "
        f"grew {alone:.1f} µs; this run does not time the floor's code without Beam, so the "
        f"two cannot be set side by side there: how much of our code's {code:+.1f} beyond the "
        "floor's is work with the value, and what causes it, is not identified by this run."
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
