"""Where benchmark 4's activation grows with the memory's size: our code, state calls, or Beam.

The timed DoFns of :mod:`benchmarks.in_pipeline` run RunAgent and the floor at the smallest
and the largest size; what each grew inside ``process`` (thread CPU), split into the DoFn's own
code and Beam's state calls, against what the figures say each grew in all, places the growth
that ours shows beyond the floor's: in our code, in the state calls, or outside ``process``
(Beam handing over the element and the outputs; the bundle's commit cancels out of the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from beam_agents import AgentConfig
from benchmarks import memory_runs
from benchmarks.core_only import core_microseconds
from benchmarks.in_pipeline import InPipeline
from benchmarks.memory_runs import FLOOR, OURS, SIZES, rewrite_memory
from benchmarks.report import Figure


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
        f"{code:+.0f} µs in our code beyond the floor's own code (which makes the same value), "
        f"{state:+.0f} in Beam's state calls beyond the floor's, and {outside:+.0f} outside "
        "`process` (Beam handing over the element and our outputs; the commit at the bundle's "
        f"end cancels out of the figures; noise lands here too). Inside `process` ours took "
        f"{ours_small.process_us:.0f} and {ours_large.process_us:.0f} µs "
        f"({ours_small.state_us:.0f} and {ours_large.state_us:.0f} in state calls), the floor "
        f"{floor_small.process_us:.0f} "
        f"and {floor_large.process_us:.0f} ({floor_small.state_us:.0f} and "
        f"{floor_large.state_us:.0f}). Without Beam (`benchmarks/core_only.py`, the same events) "
        f"our code grew {alone:.0f} µs, {own:+.0f} beyond the growth of the floor's code in the "
        "pipeline (the floor makes the same value and little else): that much is our own work "
        f"with the value; the other {code - own:+.0f} µs our code grew beyond the floor's in "
        "the pipeline come from running between Beam's code at this size (the allocator and "
        "the caches they share)."
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
