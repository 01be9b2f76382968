# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 4: the cost of committing working memory, from 1 KiB to 1 MiB per activation."""

from __future__ import annotations

import functools

import apache_beam as beam
from apache_beam.pvalue import PCollection

from beam_agents import AgentConfig, RunAgent
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.core.memory import MEMORY_CAP_BYTES
from benchmarks.harness import seconds_per_call
from benchmarks.pipelines import BareMemoryDoFn, Element, keyed_events, memory_value, run_pipeline
from benchmarks.report import BenchmarkResult, Figure

TITLE = "State commit cost against working-memory size"

DEFINITION = """\
An agent that, on every activation, sets one working-memory slot to a fresh value of S bytes
(the value changes every time, so every commit writes the memory cell) and completes. The floor
is a bare stateful `DoFn` that does the no-op state traffic and also reads the memory cell and
writes a fresh value of the same S bytes. Both run on `FnApiRunner` over 10 keys. To keep
pipeline start-up out of the figure, each is run over N and over 2N activations, three times
each in turn, and the cost per activation is the difference of the best times divided by N
(the marginal cost), with N from 10,000 at 1 KiB
down to 400 at the largest size. The largest size is 1 MiB less 1 KiB, because working memory
is capped at 1 MiB serialized. (The `--quick` smoke run times N activations once, start-up
included.) No target from the issue: the figure to watch is how the ratio
moves with S (the runtime re-encodes the whole memory, so its cost is linear in S, as the
floor's copy is)."""

KEYS = 10
SIZES = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, MEMORY_CAP_BYTES - (1 << 10))
QUICK_SIZES = (1 << 10, 1 << 16)
BYTES_PER_RUN = 400 << 20
"""How many bytes of memory the N-activation run writes (bounds N at large sizes)."""
ROUNDS = 3
"""Runs of N and of 2N activations each, alternating; the best of each counts."""


async def rewrite_memory(ctx: ActivationContext) -> Complete:
    """Set the slot ``blob`` to a fresh value of the size the event names."""
    ctx.memory.set("blob", memory_value(ctx.seq, int(ctx.event)))
    return Complete()


def _events(count: int, size: int) -> list[Element]:
    elements = keyed_events(count, KEYS)
    for _, envelope in elements:
        envelope.external_event = b"%d" % size
    return elements


def _agent(keyed: PCollection[Element]) -> None:
    keyed | "Agent" >> RunAgent(rewrite_memory, config=AgentConfig())


def _seconds_per_activation(size: int, count: int, *, floor: bool, quick: bool) -> float:
    """(best time of 2N activations - best time of N) / N; in a quick run, time of N / N."""

    def stage(keyed: PCollection[Element]) -> None:
        if floor:
            keyed | "Floor" >> beam.ParDo(BareMemoryDoFn(size))
        else:
            _agent(keyed)

    if quick:
        return seconds_per_call(lambda: run_pipeline(_events(count, size), stage)) / count
    best = {count: float("inf"), 2 * count: float("inf")}
    for _ in range(ROUNDS):
        for activations in best:
            elements = _events(activations, size)
            seconds = seconds_per_call(functools.partial(run_pipeline, elements, stage))
            best[activations] = min(best[activations], seconds)
    if best[2 * count] <= best[count]:
        raise RuntimeError(f"{2 * count} activations ran no slower than {count}: too noisy")
    return (best[2 * count] - best[count]) / count


def _activations(size: int, quick: bool) -> int:
    if quick:
        return 20
    return max(100, min(10_000, BYTES_PER_RUN // size))


def _label(size: int) -> str:
    return f"{size >> 10} KiB"


def run(quick: bool) -> BenchmarkResult:
    """Measure every size, ours then the floor."""
    figures = []
    for size in QUICK_SIZES if quick else SIZES:
        count = _activations(size, quick)
        floor = _seconds_per_activation(size, count, floor=True, quick=quick) * 1e6
        ours = _seconds_per_activation(size, count, floor=False, quick=quick) * 1e6
        figures.append(
            Figure(
                name=f"commit, memory value of {_label(size)}",
                unit="µs/activation",
                ours=ours,
                samples=count,
                floor=floor,
                floor_label="bare DoFn writing the same bytes",
            )
        )
    return BenchmarkResult(name="state_commit", title=TITLE, definition=DEFINITION, figures=figures)
