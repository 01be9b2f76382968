# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 7: what ``.traces | WriteTraces(target)`` adds to the local loop.

The loop through a real effector runs with and without storing its traces, in interleaved
rounds; an open pipeline (nothing read back) is measured alongside, for the details.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping
from itertools import count

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import PCollection
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import AgentEnvelope
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes, SubmitIntents, WriteTraces
from beam_agents.tools import ToolRegistry, tool
from benchmarks.harness import sqlite_effector
from benchmarks.pipelines import Element
from benchmarks.report import BenchmarkResult, Figure, Goal, Target
from benchmarks.tools import make_registry

TITLE = "Overhead of WriteTraces on the loop"

DEFINITION = """\
The local loop on `FnApiRunner`, with and without its traces stored: `ReadEnvelopes(target,
events=..., stop_when_idle_s=0.3)` → `RunAgent` → `.intents | SubmitIntents(target)`, and in
the second variant also `.traces | WriteTraces(target)`, against one effector started as a
subprocess (`python -m effector serve --tools benchmarks.tools:make_registry --store
sqlite:///...`, default `synchronous=FULL`). The agent runs one read-only tool call inline
(`ctx.run_tool`), stages one `noop` intent and suspends, and completes when the result comes
back through the effector (the details count the trace events per event). Events are spread
over 100 keys, so a key's later events wait for its earlier runs; every run uses keys no
earlier run used, so nothing is a duplicate for the effector. After a warm-up run of each, the
variants take turns for 3 rounds (in alternating order, so a drift of the machine falls on
both); run-to-run noise on a 2-core machine is about ±15%, so the medians count. **Ours =
median seconds per event with `WriteTraces` (the idle stop included, in both); floor = the
median of the same loop without it.** Target: at most 1.15x. The details give the median of the
rounds' own ratios (each round's two runs, one after the other) with their spread, and the same
comparison on an open pipeline (`beam.Create` → `RunAgent` → `SubmitIntents`, nothing read
back: the agent completes at once after staging its intent; 3 rounds), where nothing hides the
sink's cost, and a DoFn that only discards the traces."""

LOOP_EVENTS, QUICK_LOOP_EVENTS = 400, 20
OPEN_EVENTS, QUICK_OPEN_EVENTS = 2_000, 60
ROUNDS, QUICK_ROUNDS = 3, 1
OPEN_ROUNDS = 3
IDLE_S = 0.3
KEYS = 100
TARGET = Target(Goal.RATIO_AT_MOST, 1.15)

_runs = count()


@tool
def lookup(item: int) -> int:
    """Look an item up.

    Args:
        item: which item.
    """
    return item + 1


async def look_up_and_act(ctx: ActivationContext) -> Complete | Suspend:
    """One inline tool call and one intent; on the loop, waits for its result to complete."""
    if ctx.is_resume:
        return Complete()
    await ctx.run_tool("lookup", {"item": ctx.seq})
    ctx.act("noop", {})
    return Suspend(snapshot=b"-") if ctx.event == b"wait" else Complete()


def _config(events: int) -> AgentConfig:
    registry = make_registry().merge(ToolRegistry([lookup]))
    return AgentConfig(tool_registry=registry, max_buffered_events=events)


def fresh_events(events: int, payload: bytes) -> list[AgentEnvelope]:
    """``events`` external events over :data:`KEYS` keys no earlier run used."""
    run = next(_runs)
    return [
        AgentEnvelope(
            entity_key=b"run-%d-key-%d" % (run, index % KEYS),
            event_time_ms=1_000 + index,
            external_event=payload,
        )
        for index in range(events)
    ]


class _Discard(beam.DoFn):
    def process(self, element: object) -> None:
        """Drop the element."""


def run_once(target: str, events: int, *, loop: bool, traces: str) -> int:
    """One run over fresh events; ``traces`` is ``none``, ``discard`` or ``write``.

    Returns how many trace events ``WriteTraces`` stored (0 unless it wrote them).
    """
    pipeline = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(flags=[]))
    envelopes = fresh_events(events, b"wait" if loop else b"go")
    if loop:
        keyed = pipeline | "Loop" >> ReadEnvelopes(
            target, events=envelopes, stop_when_idle_s=IDLE_S
        )
    else:
        pairs = [(envelope.entity_key, envelope) for envelope in envelopes]
        keyed = pipeline | "Events" >> beam.Create(pairs).with_output_types(Element)
    outputs = keyed | "Agent" >> RunAgent(look_up_and_act, config=_config(events))
    outputs.intents | "Submit" >> SubmitIntents(target)
    traced: PCollection[object] = outputs.traces
    if traces == "write":
        traced | "Traces" >> WriteTraces(target)
    elif traces == "discard":
        traced | "Discard" >> beam.ParDo(_Discard())
    result = pipeline.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_name("traces_recorded"))
    return int(sum(metric.committed for metric in found["counters"]))


def per_event_rounds(
    target: str, events: int, rounds: int, *, loop: bool, variants: Mapping[str, str]
) -> tuple[dict[str, list[float]], int]:
    """Seconds per event of each variant in each interleaved round; trace events per event.

    Each round runs the variants in the reverse order of the round before.
    """
    runs: dict[str, Callable[[int], int]] = {
        name: functools.partial(run_once, target, loop=loop, traces=traces)
        for name, traces in variants.items()
    }
    for run in runs.values():
        run(max(events // 10, 5))
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    stored = 0
    for round_ in range(rounds):
        for name in list(runs)[:: -1 if round_ % 2 else 1]:
            started = time.perf_counter()
            stored = max(stored, runs[name](events))
            seconds[name].append((time.perf_counter() - started) / events)
    if not stored:
        raise RuntimeError("WriteTraces stored no trace events")
    return seconds, stored // events


def ratio_note(seconds: Mapping[str, list[float]], name: str, base: str = "plain") -> str:
    """``name`` against ``base``: the median of the rounds' own ratios, and their spread."""
    ratios = [ours / floor for ours, floor in zip(seconds[name], seconds[base], strict=True)]
    return (
        f"{statistics.median(ratios):.2f}x median over {len(ratios)} round(s), "
        f"min {min(ratios):.2f}x, max {max(ratios):.2f}x"
    )


def run(quick: bool) -> BenchmarkResult:
    """Start an effector on a fresh SQLite store and time both pipelines with and without traces."""
    rounds = QUICK_ROUNDS if quick else ROUNDS
    with sqlite_effector() as target:
        events = QUICK_LOOP_EVENTS if quick else LOOP_EVENTS
        loop, spans = per_event_rounds(
            target, events, rounds, loop=True, variants={"plain": "none", "traced": "write"}
        )
        open_events = QUICK_OPEN_EVENTS if quick else OPEN_EVENTS
        variants = {"plain": "none", "discard": "discard", "traced": "write"}
        open_, open_spans = per_event_rounds(
            target, open_events, min(rounds, OPEN_ROUNDS), loop=False, variants=variants
        )
    median = {name: statistics.median(values) for name, values in loop.items()}
    open_median = {name: statistics.median(values) for name, values in open_.items()}
    figure = Figure(
        name="the loop with WriteTraces, per event",
        unit="ms",
        ours=median["traced"] * 1000,
        samples=events * rounds,
        floor=median["plain"] * 1000,
        floor_label="the loop without it",
        target=TARGET,
    )
    details = [
        f"The loop: {events} events per run, {rounds} round(s), {spans} trace events per event: "
        f"{median['traced'] * 1000:.2f} ms per event with WriteTraces, "
        f"{median['plain'] * 1000:.2f} ms without (medians); the rounds' own ratios: "
        f"{ratio_note(loop, 'traced')}.",
        f"The open pipeline ({open_events} events, {open_spans} trace events each, nothing read "
        f"back; medians): {open_median['plain'] * 1e6:.0f} µs per event without WriteTraces, "
        f"{open_median['traced'] * 1e6:.0f} µs with it ({ratio_note(open_, 'traced')}), "
        f"{open_median['discard'] * 1e6:.0f} µs with a DoFn that only discards the traces "
        f"({ratio_note(open_, 'discard')}: what consuming `.traces` at all costs in Beam).",
    ]
    return BenchmarkResult(
        name="write_traces", title=TITLE, definition=DEFINITION, figures=[figure], details=details
    )
