# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Loop benchmarks: pipelines that run intents through a real effector subprocess.

``ReadEnvelopes`` -> ``RunAgent`` -> ``SubmitIntents`` -> the effector (SQLite, fsynced) -> its
results back through ``ReadEnvelopes``.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.runner import PipelineResult

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolIntent,
    ToolRegistry,
    ToolResult,
    WriteTraces,
    canonical_json_bytes,
    intent_id_for,
    tool,
)
from benchmarks.harness import make_registry, percentile, seconds_per_call, sqlite_effector
from benchmarks.pipelines import HEADER_STATE, Element, advance_header
from benchmarks.report import Figure, Goal, Result, Target

NAMESPACE = "benchmarks"


def fresh_events(count: int, keys: int | None = None) -> list[AgentEnvelope]:
    """``count`` external events on keys no earlier run used (each its own key by default)."""
    run = uuid.uuid4().hex[:12]
    return [
        AgentEnvelope(
            entity_key=f"{run}-{index if keys is None else index % keys}".encode(),
            event_time_ms=1_000 + index,
            external_event=b"e",
        )
        for index in range(count)
    ]


def counted(result: PipelineResult, name: str) -> int:
    """The committed value of this module's counter ``name`` in a finished pipeline."""
    query = MetricsFilter().with_namespace(NAMESPACE).with_name(name)
    return int(sum(metric.committed for metric in result.metrics().query(query)["counters"]))


# -- suspend to resume ------------------------------------------------------------------------


async def round_trip_agent(ctx: ActivationContext) -> Complete | Suspend:
    """Stage a ``stamp`` intent and suspend; on resume, output the round trip's timestamps."""
    if not ctx.is_resume:
        ctx.act("stamp", {})
        return Suspend(snapshot=b"%d" % time.monotonic_ns())
    resumed_ns = time.monotonic_ns()
    result = ctx.resume_result
    assert result is not None and result.status == ToolResult.OK, result
    stamps = json.loads(result.payload)
    tool_ns = stamps["ended_ns"] - stamps["started_ns"]
    return Complete(canonical_json_bytes({"ns": resumed_ns - int(ctx.snapshot) - tool_ns}))


_round_trips: list[float] = []


class _Collect(beam.DoFn):
    """Keeps the round trips in this process (the local runner runs in-process)."""

    def process(self, element: bytes) -> None:
        _round_trips.append(json.loads(element)["ns"] / 1e6)


def suspend_resume(quick: bool) -> Result:
    """Round trips from ``Suspend`` to the resumed agent starting, through the effector."""
    count = 5 if quick else 600
    _round_trips.clear()
    config = AgentConfig(tool_registry=make_registry(), max_buffered_events=count)
    with (
        sqlite_effector() as target,
        beam.Pipeline(options=PipelineOptions(flags=[])) as pipeline,
    ):
        events = [
            AgentEnvelope(entity_key=b"chain", event_time_ms=1_000 + index, external_event=b"go")
            for index in range(count)
        ]
        keyed = pipeline | ReadEnvelopes(target, events=events, stop_when_idle_s=0.5)
        outputs = keyed | RunAgent(round_trip_agent, config=config)
        outputs.intents | SubmitIntents(target)
        outputs.output | beam.ParDo(_Collect())
    if len(_round_trips) != count:
        raise RuntimeError(f"{len(_round_trips)} of {count} round trips completed")
    return Result(
        "suspend_resume",
        "Suspend-to-resume round trip through a real effector",
        """\
600 events on one key: the agent stages a `stamp` intent and suspends; the result resumes it.
Round trip: from `Suspend` to the resumed agent starting, less the tool's own time.
It covers the commit, `SubmitIntents`, the effector's fsynced record, execution and result,
the reader's long-poll and the runner scheduling the next bundle. No floor.""",
        [
            Figure(
                "round trip p50",
                "ms",
                percentile(_round_trips, 0.5),
                None,
                Target(Goal.AT_MOST, 5.0),
            ),
            Figure("round trip p99", "ms", percentile(_round_trips, 0.99)),
        ],
    )


# -- WriteTraces --------------------------------------------------------------------------------


@tool
def lookup(item: int) -> int:
    """Look an item up.

    Args:
        item: which item.
    """
    return item + 1


async def look_up_and_act(ctx: ActivationContext) -> Complete | Suspend:
    """One inline tool call and one intent; completes when its result comes back."""
    if ctx.is_resume:
        return Complete()
    await ctx.run_tool("lookup", {"item": ctx.seq})
    ctx.act("noop", {})
    return Suspend(snapshot=b"-")


def traced_loop(target: str, events: int, *, traces: bool) -> None:
    """One run of the loop over fresh events on 100 keys, storing its traces if ``traces``."""
    registry = make_registry().merge(ToolRegistry([lookup]))
    config = AgentConfig(tool_registry=registry, max_buffered_events=events)
    pipeline = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(flags=[]))
    envelopes = fresh_events(events, keys=100)
    keyed = pipeline | ReadEnvelopes(target, events=envelopes, stop_when_idle_s=0.3)
    outputs = keyed | RunAgent(look_up_and_act, config=config)
    outputs.intents | SubmitIntents(target)
    if traces:
        outputs.traces | WriteTraces(target)
    pipeline.run().wait_until_finish()


def write_traces(quick: bool) -> Result:
    """The loop with and without ``.traces | WriteTraces(target)``, in interleaved rounds."""
    events, rounds = (20, 1) if quick else (400, 3)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    with sqlite_effector() as target:
        for traces in () if quick else (False, True):
            traced_loop(target, events // 10, traces=traces)  # warm-up
        for round_ in range(rounds):
            for traces in (False, True)[:: -1 if round_ % 2 else 1]:
                run = functools.partial(traced_loop, target, events, traces=traces)
                seconds[traces].append(seconds_per_call(run) / events)
    ms = {traces: statistics.median(values) * 1e3 for traces, values in seconds.items()}
    return Result(
        "write_traces",
        "Overhead of WriteTraces on the loop",
        """\
The loop over 400 events on 100 fresh keys: one inline tool call, one `noop` intent, suspend,
complete on the result. Ours stores `.traces` through `WriteTraces(target)`; floor: without.
Median seconds per event over 3 rounds taking turns, the 0.3 s idle stop included in both.""",
        [
            Figure(
                "the loop with WriteTraces, per event",
                "ms",
                ms[True],
                ms[False],
                Target(Goal.RATIO_AT_MOST, 1.15),
            )
        ],
    )


# -- end to end ---------------------------------------------------------------------------------


class _Resumed:
    """This process's counter of results consumed (looked up once, not per element)."""

    counter: Any = None

    @classmethod
    def inc(cls) -> None:
        if cls.counter is None:
            cls.counter = Metrics.counter(NAMESPACE, "resumed")
        cls.counter.inc()


async def act_then_finish(ctx: ActivationContext) -> Complete | Suspend:
    """Stage one ``noop`` intent and suspend; complete when its result comes back."""
    if ctx.is_resume:
        _Resumed.inc()
        return Complete()
    ctx.act("noop", {})
    return Suspend(snapshot=b"-")


class BareIntentDoFn(beam.DoFn):
    """The floor: the header's traffic per element; one intent per event; results consumed."""

    def process(self, element: Element, header: Any = HEADER_STATE) -> Iterator[ToolIntent]:
        key, envelope = element
        seq = advance_header(header, envelope.event_time_ms)
        if envelope.WhichOneof("payload") != "external_event":
            _Resumed.inc()
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


def run_loop(target: str, events: int, *, floor: bool) -> None:
    """One run of the loop on Beam's default runner over ``events`` fresh events."""
    pipeline = beam.Pipeline(options=PipelineOptions(flags=[]))
    keyed = pipeline | ReadEnvelopes(target, events=fresh_events(events), stop_when_idle_s=0.3)
    if floor:
        intents = keyed | beam.ParDo(BareIntentDoFn())
    else:
        config = AgentConfig(tool_registry=make_registry())
        intents = (keyed | RunAgent(act_then_finish, config=config)).intents
    intents | SubmitIntents(target)
    result = pipeline.run()
    result.wait_until_finish()
    resumed = counted(result, "resumed")
    if resumed != events:
        raise RuntimeError(f"{resumed} of {events} runs got their result back")


def end_to_end(quick: bool) -> Result:
    """The local loop's marginal activations/s (N and 2N events), against a bare DoFn's."""
    events = {"ours": 30, "floor": 30} if quick else {"ours": 150, "floor": 400}
    multiples, rounds = ((1,), 1) if quick else ((1, 2), 3)
    best: dict[tuple[str, int], float] = {}
    with sqlite_effector() as target:
        if not quick:
            run_loop(target, 10, floor=False)  # warm-up
        turn = 0
        for _ in range(rounds):
            for multiple in multiples:
                for name in ("ours", "floor")[:: -1 if turn % 2 else 1]:
                    size = multiple * events[name]
                    run = functools.partial(run_loop, target, size, floor=name == "floor")
                    seconds = seconds_per_call(run)
                    best[name, size] = min(best.get((name, size), float("inf")), seconds)
                turn += 1
    rates = {}
    for name, n in events.items():
        extra_s = best[name, n] if quick else best[name, 2 * n] - best[name, n]
        if extra_s <= 0:
            raise RuntimeError(f"{name}: {2 * n} events ran no slower than {n}")
        rates[name] = 2 * n / extra_s
    return Result(
        "end_to_end",
        "End to end: the local loop through an effector",
        """\
The README's loop on Beam's default runner: one `noop` intent and a suspend per event, each
event on a fresh key, then completion on the result: two activations per event.
Floor: the same pipeline with a bare DoFn that writes the header, emits the intent and consumes
the result. Marginal rate: 2N activations over the best time of 2N events less that of N
(N = 150 for ours, 400 for the floor), 3 rounds taking turns.""",
        [Figure("the loop, activations/s", "activations/s", rates["ours"], rates["floor"])],
    )
