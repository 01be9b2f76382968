# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 5: suspend-to-resume round trip through a real effector on the local loop."""

from __future__ import annotations

import json
import time
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    IntentDeadLetter,
    ToolResult,
    canonical_json_bytes,
)
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import ActivationContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from benchmarks.harness import percentile, sqlite_effector
from benchmarks.report import BenchmarkResult, Figure, Goal, Target
from benchmarks.tools import make_registry

TITLE = "Suspend-to-resume round trip through a real effector"

DEFINITION = """\
One pipeline on `FnApiRunner`: `ReadEnvelopes(target, events=..., stop_when_idle_s=0.5)` →
`RunAgent` → `.intents | SubmitIntents(target)`, against an effector started as a subprocess
(`python -m effector serve --tools benchmarks.tools:make_registry --store sqlite:///... --listen
127.0.0.1:0`, default `synchronous=FULL`: every intent and result is fsynced before it is
acknowledged or published). The agent stages one intent for the `stamp` tool (a no-op that
returns the system-wide monotonic clock at its entry and exit) and suspends, putting the clock
in its snapshot; on resume it reads the clock again. All events are for one key and published
up front, so `RunAgent` buffers them and each completed run starts the next: the round trips
form one chain, each measured alone. **Round trip = resume start - suspension - the tool's own
execution time**: from the agent returning `Suspend` (the commit follows at once) to the
resumed agent starting, covering the rest of the bundle, `SubmitIntents` (one Submit at bundle
end), the effector recording the intent, claiming and executing it, recording and publishing
the result, the reader's long-poll returning it, the runner scheduling the next bundle, and
`RunAgent` admitting the result and rebuilding the context. Out = suspension to tool start,
back = tool end to resume start. Target: p50 under 30 ms."""

ROUND_TRIPS = 600
QUICK_ROUND_TRIPS = 5
TARGET = Target(Goal.BELOW, 30.0)

_samples: list[dict[str, Any]] = []
_problems: list[str] = []


async def round_trip_agent(ctx: ActivationContext) -> Complete | Suspend:
    """Stage a ``stamp`` intent and suspend; on resume, report the round trip's timestamps."""
    if not ctx.is_resume:
        ctx.act("stamp", {})
        return Suspend(snapshot=b"%d" % time.monotonic_ns())
    resumed_ns = time.monotonic_ns()
    result = ctx.resume_result
    assert result is not None
    if result.status != ToolResult.OK:
        return Complete(output=canonical_json_bytes({"failed": result.error_message}))
    stamps = json.loads(result.payload)
    return Complete(
        output=canonical_json_bytes(
            {
                "suspended_ns": int(ctx.snapshot),
                "tool_started_ns": stamps["started_ns"],
                "tool_ended_ns": stamps["ended_ns"],
                "resumed_ns": resumed_ns,
            }
        )
    )


class _Collect(beam.DoFn):
    """Keeps round-trip samples and problems in this process (FnApiRunner runs in-process)."""

    def process(self, element: bytes | AgentError | IntentDeadLetter) -> None:
        if isinstance(element, bytes):
            sample = json.loads(element)
            if "failed" in sample:
                _problems.append(f"tool failed: {sample['failed']}")
            else:
                _samples.append(sample)
        elif isinstance(element, AgentError):
            _problems.append(f"agent error {element.reason}: {element.detail}")
        else:
            _problems.append(f"intent dead-lettered: {element.reason}")


def _events(count: int) -> list[AgentEnvelope]:
    now_ms = int(time.time() * 1000)
    return [
        AgentEnvelope(entity_key=b"chain", event_time_ms=now_ms + index, external_event=b"go")
        for index in range(count)
    ]


def measure(target: str, count: int) -> list[dict[str, Any]]:
    """Run the loop for ``count`` round trips; return their samples."""
    _samples.clear()
    _problems.clear()
    with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(flags=[])) as pipeline:
        keyed = pipeline | "Envelopes" >> ReadEnvelopes(
            target, events=_events(count), stop_when_idle_s=0.5
        )
        outputs = keyed | "Agent" >> RunAgent(
            round_trip_agent,
            config=AgentConfig(tool_registry=make_registry(), max_buffered_events=count),
        )
        submitted = outputs.intents | "Submit" >> SubmitIntents(target)
        for name, collection in (
            ("Samples", outputs.output),
            ("Errors", outputs.errors),
            ("DeadLetters", submitted.dead_letter),
        ):
            collection | f"Collect{name}" >> beam.ParDo(_Collect())
    if _problems or len(_samples) != count:
        raise RuntimeError(
            f"{len(_samples)} of {count} round trips completed; problems: {_problems[:5]}"
        )
    return list(_samples)


def run(quick: bool) -> BenchmarkResult:
    """Start an effector on a fresh SQLite store and time the round trips."""
    count = QUICK_ROUND_TRIPS if quick else ROUND_TRIPS
    with sqlite_effector() as target:
        samples = measure(target, count)
    round_trips, outbound, inbound, tool = [], [], [], []
    for sample in samples:
        tool_ns = sample["tool_ended_ns"] - sample["tool_started_ns"]
        round_trips.append((sample["resumed_ns"] - sample["suspended_ns"] - tool_ns) / 1e6)
        outbound.append((sample["tool_started_ns"] - sample["suspended_ns"]) / 1e6)
        inbound.append((sample["resumed_ns"] - sample["tool_ended_ns"]) / 1e6)
        tool.append(tool_ns / 1e6)
    figures = [
        Figure(
            name=f"round trip {label}",
            unit="ms",
            ours=percentile(round_trips, fraction),
            samples=len(round_trips),
            target=TARGET if label == "p50" else None,
        )
        for label, fraction in (("p50", 0.5), ("p99", 0.99))
    ]
    details = [
        f"Out (suspension to tool start): p50 {percentile(outbound, 0.5):.2f} ms, p99 "
        f"{percentile(outbound, 0.99):.2f} ms. Back (tool end to resume start): p50 "
        f"{percentile(inbound, 0.5):.2f} ms, p99 {percentile(inbound, 0.99):.2f} ms. The tool "
        f"itself: p50 {percentile(tool, 0.5) * 1000:.1f} µs (subtracted)."
    ]
    return BenchmarkResult(
        name="suspend_resume", title=TITLE, definition=DEFINITION, figures=figures, details=details
    )
