# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 4's runs: the agents, the inputs and the timing of one pipeline at one size."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Mapping
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
"""Paired rounds at each size, a fixed number (odd, so that the median round is one round)."""
PLAUSIBLE = 0.9
"""A larger size's cost below this share of the same pipeline's at the smallest is noise."""
INSIDE_ACTIVATIONS = 2_000
"""Activations over which ``process`` is timed inside the pipeline, at each size."""
FLOOR, OURS = "the floor", "ours"
"""The two pipelines' names."""


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
class Round:
    """One paired round: each pipeline's marginal process CPU per activation, in seconds."""

    floor: float
    ours: float

    @property
    def ratio(self) -> float:
        """Ours over the floor in this round."""
        return self.ours / self.floor


@dataclass(frozen=True)
class Side:
    """One pipeline over a size's rounds: its median cost and Beam's commit per key."""

    seconds: float
    """The median of its rounds' marginal process CPU per activation."""
    commit: KeyCommit
    """Beam's commit of a key's state at the bundle's end, and the weighing within (medians)."""
    net_us: float
    """The median over its runs of the commit less the weighing, µs per key."""
    runs: int
    """Pipeline runs timed (each commits every key once)."""


@dataclass(frozen=True)
class Paired:
    """The floor and ours at one size, timed in interleaved rounds."""

    rounds: tuple[Round, ...]
    floor: Side
    ours: Side

    @property
    def sides(self) -> dict[str, Side]:
        """The two pipelines by name."""
        return {FLOOR: self.floor, OURS: self.ours}

    @property
    def median(self) -> Round:
        """The round whose ratio is the median of the rounds' (their number is odd)."""
        ordered = sorted(self.rounds, key=lambda round_: round_.ratio)
        return ordered[len(ordered) // 2]

    @property
    def spread(self) -> tuple[float, float]:
        """The least and the most ratio over the rounds."""
        ratios = [round_.ratio for round_ in self.rounds]
        return min(ratios), max(ratios)

    def worst_excess(self, bound: float) -> float:
        """The most by which a round's ours exceeded ``bound`` times its floor, in seconds."""
        return max(round_.ours - bound * round_.floor for round_ in self.rounds)


def measure(
    size: int, count: int, stages: Mapping[str, Stage], clock: CommitClock, *, quick: bool
) -> Paired:
    """Time the floor and ours (``stages`` by :data:`FLOOR` and :data:`OURS`) in paired rounds.

    Each of :data:`ROUNDS` rounds runs each pipeline over N activations, then each over 2N, the
    floor first in even rounds and ours first in odd ones, and pairs their marginal costs,
    (process CPU of 2N - of N) / N; the number of rounds is fixed, whatever the costs come out.
    Quick: one run of N each, start-up included. Every run's user-state commit is timed too.
    """
    commits: dict[str, list[KeyCommit]] = {FLOOR: [], OURS: []}

    def timed(name: str, activations: int) -> float:
        elements = events(activations, size)
        clock.reset()
        started = time.process_time()
        run_pipeline(elements, stages[name])
        seconds = time.process_time() - started
        commits[name].append(per_key(clock, KEYS))
        return seconds

    rounds: list[Round] = []
    for index in range(1 if quick else ROUNDS):
        order = (FLOOR, OURS) if index % 2 == 0 else (OURS, FLOOR)
        single = {name: timed(name, count) for name in order}
        if quick:
            marginal = {name: seconds / count for name, seconds in single.items()}
        else:
            double = {name: timed(name, 2 * count) for name in order}
            marginal = {name: (double[name] - single[name]) / count for name in order}
        if min(marginal.values()) <= 0:
            raise RuntimeError(f"{2 * count} activations cost no more than {count}: too noisy")
        rounds.append(Round(marginal[FLOOR], marginal[OURS]))
    return Paired(
        tuple(rounds),
        _side([round_.floor for round_ in rounds], commits[FLOOR]),
        _side([round_.ours for round_ in rounds], commits[OURS]),
    )


def _side(marginals: list[float], commits: list[KeyCommit]) -> Side:
    return Side(
        seconds=statistics.median(marginals),
        commit=KeyCommit(
            statistics.median(c.commit_us for c in commits),
            statistics.median(c.weigh_us for c in commits),
        ),
        net_us=statistics.median(c.commit_us - c.weigh_us for c in commits),
        runs=len(commits),
    )


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
        FLOOR: in_pipeline.in_pipeline(
            functools.partial(in_pipeline.TimedMemoryFloor, size), elements
        ),
        OURS: in_pipeline.in_pipeline(in_pipeline.agent(rewrite_memory, AgentConfig()), elements),
    }
