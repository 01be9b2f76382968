# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 4's runs: the agents, the inputs and the timing of one pipeline at one size."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.pvalue import PCollection

from beam_agents import AgentConfig, RunAgent
from beam_agents.core.agent import AgentFn, Complete
from beam_agents.core.context import ActivationContext
from beam_agents.core.memory import MEMORY_CAP_BYTES
from benchmarks import in_pipeline
from benchmarks.in_pipeline import InPipeline
from benchmarks.pipelines import (
    BareMemoryDoFn,
    Element,
    Stage,
    keyed_events,
    memory_value,
    run_pipeline,
)
from benchmarks.runner_commit import CommitClock, KeyCommit, per_key

KEYS = 10
SIZES = (1 << 10, 1 << 16, 1 << 18, MEMORY_CAP_BYTES - (1 << 10))
QUICK_SIZES = (1 << 10, 1 << 16)
BESIDE = (1 << 10, (1 << 18) - (1 << 10))
"""The variant row: a slot of this many bytes changes beside an untouched one of that many."""
BYTES_PER_RUN = 2 << 30
"""How many bytes of memory the N-activation run writes (bounds N at large sizes)."""
MAX_ACTIVATIONS = 8_000
"""N at the small sizes (at 4,000 the medians still swung by a third under load)."""
ROUNDS = 5
"""Rounds of a run of N activations and one of 2N; the median of the rounds' costs counts."""
MAX_ROUNDS = 7
"""Rounds allowed while the median stays below the DoFn's own CPU inside ``process``."""
PLAUSIBLE = 0.9
"""A larger size's cost below this share of the same pipeline's at the smallest is noise."""
INSIDE_ACTIVATIONS = 2_000
"""Activations over which ``process`` is timed inside the pipeline, at each size."""


async def rewrite_memory(ctx: ActivationContext) -> Complete:
    """Set the slot ``blob`` to a fresh value of the size the event names."""
    ctx.memory.set("blob", memory_value(ctx.seq, int(ctx.event)))
    return Complete()


async def rewrite_beside_untouched(ctx: ActivationContext) -> Complete:
    """Set ``blob`` as :func:`rewrite_memory` does, beside a slot ``base`` it never changes."""
    memory = ctx.memory
    if "base" not in memory.slot_sizes:
        memory.set("base", bytes(BESIDE[1]))
    memory.set("blob", memory_value(ctx.seq, int(ctx.event)))
    return Complete()


def events(count: int, size: int) -> list[Element]:
    elements = keyed_events(count, KEYS)
    for _, envelope in elements:
        envelope.external_event = b"%d" % size
    return elements


def agent_stage(agent: AgentFn) -> Stage:
    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Agent" >> RunAgent(agent, config=AgentConfig())

    return stage


def floor_stage(memory_bytes: int) -> Stage:
    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Floor" >> beam.ParDo(BareMemoryDoFn(memory_bytes))

    return stage


@dataclass(frozen=True)
class Measured:
    """One pipeline at one size: its cost per activation, and Beam's commit per key."""

    seconds: float
    """Marginal process CPU per activation, the median of the rounds'."""
    commit: KeyCommit
    """Beam's commit of a key's state at the bundle's end (median over the runs)."""
    runs: int
    """Pipeline runs timed (each commits every key once)."""
    settled: bool
    """Whether the cost reached the pipeline's own CPU inside ``process`` at this size."""


def measure(
    size: int,
    count: int,
    stage: Stage,
    clock: CommitClock,
    *,
    quick: bool,
    at_least: float = 0.0,
    notes: list[str] | None = None,
    name: str = "",
) -> Measured:
    """Median over rounds of (process CPU of 2N activations - of N) / N; quick: one run of N.

    Rounds continue (up to :data:`MAX_ROUNDS`) while the median stays below ``at_least``, a
    cost the pipeline cannot come in under (see :func:`lower_bound`); ``notes`` says what the
    extra rounds did. Every run's user-state commit is timed too.
    """
    commits: list[KeyCommit] = []

    def timed(activations: int) -> float:
        elements = events(activations, size)
        clock.reset()
        started = time.process_time()
        run_pipeline(elements, stage)
        seconds = time.process_time() - started
        commits.append(per_key(clock, KEYS))
        return seconds

    if quick:
        return Measured(timed(count) / count, commits[0], 1, True)
    marginals: list[float] = []
    for round_ in range(MAX_ROUNDS):
        single = timed(count)
        marginals.append((timed(2 * count) - single) / count)
        middle = statistics.median(marginals)
        if round_ + 1 >= ROUNDS and middle >= at_least:
            break
    if middle <= 0:
        raise RuntimeError(f"{2 * count} activations cost no more than {count}: too noisy")
    settled = middle >= at_least
    if notes is not None and round_ + 1 > ROUNDS:
        notes.append(
            f"{name} at {label(size)}: {round_ + 1} rounds, "
            + ("reached" if settled else "still under")
            + f" its lower bound ({at_least * 1e6:.1f} µs), {middle * 1e6:.1f} µs "
            + ("reported." if settled else "reported, not judged against the target.")
        )
    commit = KeyCommit(
        statistics.median(c.commit_us for c in commits),
        statistics.median(c.weigh_us for c in commits),
    )
    return Measured(middle, commit, len(commits), settled)


def lower_bound(inside: InPipeline, smallest: float) -> float:
    """The least an activation can cost, in seconds.

    Its DoFn's CPU inside ``process``, or :data:`PLAUSIBLE` of the same pipeline's cost at the
    smallest size (writing more bytes cannot cost less), whichever is more.
    """
    return max(inside.process_us / 1e6, PLAUSIBLE * smallest)


def activations(size: int, quick: bool) -> int:
    if quick:
        return 20
    return max(100, min(MAX_ACTIVATIONS, BYTES_PER_RUN // size))


def inside_count(size: int) -> int:
    return min(INSIDE_ACTIVATIONS, activations(size, False))


def label(size: int) -> str:
    return f"{size >> 10} KiB"


def inside(size: int, count: int) -> dict[str, InPipeline]:
    """Thread CPU of ``process`` per activation at ``size``: ours and the floor's."""
    elements = events(count, size)
    return {
        "the floor": in_pipeline.in_pipeline(
            functools.partial(in_pipeline.TimedMemoryFloor, size), elements
        ),
        "ours": in_pipeline.in_pipeline(in_pipeline.agent(rewrite_memory, AgentConfig()), elements),
    }
