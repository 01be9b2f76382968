"""Where benchmark 4's commit grows with the memory's size: our code, Beam's state calls, or Beam.

The timed DoFns of :mod:`benchmarks.in_pipeline` run RunAgent and the floor at the smallest
and the largest size; what each grew inside ``process`` (thread CPU), split into the DoFn's own
code and Beam's state calls, against what the figures say each grew in all, places the growth
that ours shows beyond the floor's: in our code, in the state calls, or outside ``process``
(Beam committing the state at the bundle's end and handing over the outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import apache_beam as beam

from beam_agents import AgentConfig
from beam_agents.core.agent import AgentFn
from benchmarks.core_only import core_microseconds
from benchmarks.in_pipeline import InPipeline, in_pipeline
from benchmarks.in_pipeline import agent as timed_agent
from benchmarks.pipelines import Element
from benchmarks.report import Figure


@dataclass(frozen=True)
class Placement:
    """``process`` at the smallest and the largest size, ours and the floor's (µs/activation)."""

    ours: tuple[InPipeline, InPipeline]
    floor: tuple[InPipeline, InPipeline]
    alone: tuple[float, float]
    """Our code at both sizes without Beam (:mod:`benchmarks.core_only`)."""


def place(
    sizes: tuple[int, int],
    events: Callable[[int, int], list[Element]],
    counts: tuple[int, int],
    agent: AgentFn,
    floor: Callable[[int], beam.DoFn],
) -> Placement:
    """Time ``process`` of ours and of the floor at both sizes (``counts`` activations each)."""
    ours = timed_agent(agent, AgentConfig())

    def timed(make: Callable[[], beam.DoFn], size: int, count: int) -> InPipeline:
        return in_pipeline(make, events(count, size))

    def alone(size: int, count: int) -> float:
        return core_microseconds(agent, AgentConfig(), events(count, size))

    pairs = list(zip(sizes, counts, strict=True))
    return Placement(
        ours=(timed(ours, *pairs[0]), timed(ours, *pairs[1])),
        floor=(
            timed(lambda: floor(sizes[0]), *pairs[0]),
            timed(lambda: floor(sizes[1]), *pairs[1]),
        ),
        alone=(alone(*pairs[0]), alone(*pairs[1])),
    )


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
        "`process` (Beam committing the state at the bundle's end and handing over our "
        f"outputs; noise between the runs lands here too). Inside `process` ours took "
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
