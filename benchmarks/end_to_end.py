# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark: the whole local loop through a real effector, in activations per second.

``ReadEnvelopes`` → ``RunAgent`` → ``SubmitIntents`` → effector → results → ``RunAgent``, on
Beam's default runner, against the same loop with a bare stateful ``DoFn`` in place of
``RunAgent``; rates are marginal (N and 2N events), so start-up and the idle stop cancel out.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statecache

from beam_agents import AgentConfig, RunAgent, intent_id_for
from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from benchmarks.harness import seconds_per_call, sqlite_effector
from benchmarks.pipelines import HEADER_STATE, Element, advance_header
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.tools import make_registry

TITLE = "End to end: the local loop through an effector"

DEFINITION = """\
The whole loop on Beam's default runner (`beam.Pipeline()`, as the README's local loop), against
one effector started as a subprocess (`python -m effector serve --tools
benchmarks.tools:make_registry --store sqlite:///...`): `ReadEnvelopes(target, events=...,
stop_when_idle_s=0.3)` → `RunAgent` → `.intents | SubmitIntents(target)` → the effector runs the
intent → its result comes back through `ReadEnvelopes` → `RunAgent` resumes the run. The agent
stages one `noop` intent and suspends; on the result it completes: two activations per event.
Every event has a key of its own (fresh in every run, so nothing is a duplicate for the
effector), so no key waits for another's run. The floor is the same pipeline with `RunAgent`
replaced by a bare stateful `DoFn` that reads and writes a header cell for every element, emits
one `noop` intent per event and only consumes the result: the same two elements per event, the
same intents, the same effector work. To keep start-up and the idle stop out, each is run over N and
over 2N events, for 2 rounds after a warm-up run of ours (the floor's pipeline differs only in its
DoFn), taking turns (ours then the floor at N, the floor then ours at 2N, so a drift of the shared
machine falls on both); the rate is the 2N activations of the N extra events divided by the
difference of the best times (the marginal rate). N is 250 for the floor and 100 for ours, whose
events cost over twice as much (twice the state-cache weighing, see the details), so that the N
extra events take about as long in both and stand as far above the runs' jitter. **Ours = RunAgent's
activations/s; floor = the bare DoFn's elements/s; ratio below 1 is slower.** (The `--quick` smoke
run times N events once, start-up included.) Target: —."""

EVENTS = {"ours": 100, "floor": 250}
"""N per variant: ours cost over twice as much per event as the floor's."""
QUICK_EVENTS = {"ours": 30, "floor": 30}
ROUNDS, QUICK_ROUNDS = 2, 1
IDLE_S = 0.3
NAMESPACE = "end_to_end"
RESUMED = "resumed"
"""The counter of results consumed (by ours and the floor alike): every run must see them all."""


class _Resumed:
    """This process's counter of results consumed (looked up once, not per element)."""

    counter: Any = None


def _note_resumed() -> None:
    """Count one result consumed."""
    if _Resumed.counter is None:
        _Resumed.counter = Metrics.counter(NAMESPACE, RESUMED)
    _Resumed.counter.inc()


async def act_then_finish(ctx: ActivationContext) -> Complete | Suspend:
    """Stage one ``noop`` intent and suspend; complete when its result comes back."""
    if ctx.is_resume:
        _note_resumed()
        return Complete()
    ctx.act("noop", {})
    return Suspend(snapshot=b"-")


class BareIntentDoFn(beam.DoFn):
    """The floor: the header's traffic per element; one intent per event; results consumed."""

    def process(self, element: Element, header: Any = HEADER_STATE) -> Iterator[ToolIntent]:
        key, envelope = element
        seq = advance_header(header, envelope.event_time_ms)
        if envelope.WhichOneof("payload") != "external_event":
            _note_resumed()
            return
        yield ToolIntent(
            intent_id=intent_id_for(key, seq, 0),
            entity_key=key,
            seq=seq,
            tool_name="noop",
            args_json="{}",
            created_at_ms=int(time.time() * 1000),
            kind=ToolIntent.TOOL,
            trace_id=key.hex(),
        )


def fresh_events(count: int) -> list[AgentEnvelope]:
    """``count`` external events, each on a key of its own that no earlier run used."""
    run = uuid.uuid4().hex[:12]
    return [
        AgentEnvelope(
            entity_key=f"{run}-{index}".encode(), event_time_ms=1_000 + index, external_event=b"e"
        )
        for index in range(count)
    ]


def run_loop(target: str, events: int, *, floor: bool) -> None:
    """One run of the loop over ``events`` fresh events; checks every result came back."""
    pipeline = beam.Pipeline(options=PipelineOptions(flags=[]))
    keyed = pipeline | "Loop" >> ReadEnvelopes(
        target, events=fresh_events(events), stop_when_idle_s=IDLE_S
    )
    if floor:
        intents = keyed | "Floor" >> beam.ParDo(BareIntentDoFn())
    else:
        config = AgentConfig(tool_registry=make_registry())
        intents = (keyed | "Agent" >> RunAgent(act_then_finish, config=config)).intents
    intents | "Submit" >> SubmitIntents(target)
    result = pipeline.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(RESUMED))
    resumed = int(sum(metric.committed for metric in found["counters"]))
    if resumed != events:
        raise RuntimeError(f"{resumed} of {events} runs got their result back")


@dataclass
class Timings:
    """One variant's runs: the best time at each size and Beam's state-cache weighing in all."""

    best_s: dict[int, float] = field(default_factory=dict)
    total_s: float = 0.0
    events: int = 0
    weigh_s: float = 0.0
    weigh_calls: int = 0

    def marginal_rate(self, events: int) -> float:
        """2N activations / (best time of 2N events - best time of N)."""
        extra_s = self.best_s[2 * events] - self.best_s[events]
        if extra_s <= 0:
            raise RuntimeError(f"{2 * events} events ran no slower than {events}")
        return 2 * events / extra_s


@contextlib.contextmanager
def weighing(timings: Timings) -> Iterator[None]:
    """Count, into ``timings``, the calls and time of Beam's state cache weighing its values.

    ``statecache.get_deep_size`` (``objsize``) sizes every value the runner's state cache
    loads or is given; the local runner runs in this process, so wrapping it here sees them all.
    """
    original = statecache.get_deep_size

    def weigh(*values: Any) -> int:
        started = time.perf_counter()
        try:
            return original(*values)
        finally:
            timings.weigh_calls += 1
            timings.weigh_s += time.perf_counter() - started

    statecache.get_deep_size = weigh
    try:
        yield
    finally:
        statecache.get_deep_size = original


def time_loops(
    target: str, events: Mapping[str, int], multiples: Sequence[int], rounds: int
) -> dict[str, Timings]:
    """Run ours and the floor over each multiple of their ``events`` for ``rounds`` rounds,
    swapping their order each time.

    The order goes ours, floor, floor, ours, ... so a drift of the machine falls on both.
    """
    timings = {"ours": Timings(), "floor": Timings()}
    turn = 0
    for _ in range(rounds):
        for multiple in multiples:
            for name in ("ours", "floor")[:: -1 if turn % 2 else 1]:
                size = multiple * events[name]
                measured = timings[name]
                with weighing(measured):
                    seconds = seconds_per_call(
                        functools.partial(run_loop, target, size, floor=name == "floor")
                    )
                measured.best_s[size] = min(measured.best_s.get(size, float("inf")), seconds)
                measured.total_s += seconds
                measured.events += size
            turn += 1
    return timings


def run(quick: bool) -> BenchmarkResult:
    """Start an effector on a fresh SQLite store and time both loops over N and 2N events.

    A quick run times N events once each, start-up included: 2N activations / its time.
    """
    events, rounds = (QUICK_EVENTS, QUICK_ROUNDS) if quick else (EVENTS, ROUNDS)
    multiples = (1,) if quick else (1, 2)
    with sqlite_effector() as target:
        if not quick:
            run_loop(target, max(events["ours"] // 10, 5), floor=False)  # warm-up
        timings = time_loops(target, events, multiples, rounds)
    rates = {
        name: (
            2 * events[name] / measured.best_s[events[name]]
            if quick
            else measured.marginal_rate(events[name])
        )
        for name, measured in timings.items()
    }
    figure = Figure(
        name="the loop, activations/s",
        unit="activations/s",
        ours=rates["ours"],
        samples=2 * sum(multiples) * events["ours"] * rounds,
        floor=rates["floor"],
        floor_label="the loop with a bare stateful DoFn, elements/s",
    )
    details = [
        f"{label}, best of {rounds} run(s), start-up and the {IDLE_S} s idle stop included: "
        + ", ".join(
            f"{seconds:.2f} s over {size:,} events ({2 * size / seconds:,.0f} activations/s)"
            for size, seconds in timings[name].best_s.items()
        )
        + f". Beam's state cache weighing its values (`statecache.get_deep_size`, which walks "
        f"the globals of every loaded module on each call) took "
        f"{100 * timings[name].weigh_s / timings[name].total_s:.0f}% of all its runs' time: "
        f"{timings[name].weigh_calls / timings[name].events:.1f} calls per event, "
        f"{1000 * timings[name].weigh_s / max(timings[name].weigh_calls, 1):.2f} ms each."
        for name, label in (("ours", "RunAgent"), ("floor", "The floor"))
    ]
    return BenchmarkResult(
        name="end_to_end", title=TITLE, definition=DEFINITION, figures=[figure], details=details
    )
