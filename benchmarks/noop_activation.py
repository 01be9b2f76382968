# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 1: per-element cost of a no-op agent through ``RunAgent``, against its floor."""

from __future__ import annotations

from apache_beam.pvalue import PCollection

from beam_agents import AgentConfig, RunAgent
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from benchmarks.harness import Hotspot, findings, profile_call, summarize_profile, total_seconds
from benchmarks.pipelines import (
    Element,
    bare_stateful,
    keyed_events,
    run_pipeline,
    seconds_per_element,
    source_only,
)
from benchmarks.report import BenchmarkResult, Figure, Goal, ProfileOutput, Target

TITLE = "No-op activation: RunAgent vs a bare stateful DoFn"

DEFINITION = """\
Wall time of a whole pipeline `Create(elements) | stage` on a fresh `FnApiRunner` object,
divided by the element count: 100,000 external events spread round-robin over 1,000 and over
10,000 keys. Our stage is `RunAgent` with an agent that returns `Complete()` at once; the floor
is a bare stateful `DoFn` doing the same state traffic (read the header cell, write it back) on
the same runner and input. Both include the source (`Create`), whose cost
alone is given below so the overhead can also be read net of it. The pipelines take turns
(source, floor, ours; three rounds at 1,000 keys, one at 10,000), after a warm-up run of each,
and the best round of each counts, so load from elsewhere on the shared machine hits them alike
and is filtered out. Target: at most 1.5x the floor."""

TARGET = Target(Goal.RATIO_AT_MOST, 1.5)


async def noop_agent(ctx: ActivationContext) -> Complete:
    """Finish at once: what remains is the runtime's own cost per activation."""
    return Complete()


def run_agent(keyed: PCollection[Element]) -> None:
    """The stage under test."""
    keyed | "Agent" >> RunAgent(noop_agent, config=AgentConfig())


def run(quick: bool) -> BenchmarkResult:
    """Measure both key counts (one tiny size when ``quick``)."""
    sizes = [(2_000, 100, 1)] if quick else [(100_000, 1_000, 3), (100_000, 10_000, 1)]
    figures, details = [], []
    for count, keys, rounds in sizes:
        elements = keyed_events(count, keys)
        best = seconds_per_element(
            elements,
            {"source": source_only, "floor": bare_stateful, "ours": run_agent},
            rounds=rounds,
        )
        source, floor, ours = (best[name] * 1e6 for name in ("source", "floor", "ours"))
        figures.append(
            Figure(
                name=f"no-op activation, {keys:,} keys",
                unit="µs/element",
                ours=ours,
                samples=count,
                floor=floor,
                floor_label="bare stateful DoFn",
                target=TARGET,
            )
        )
        net = f"{(ours - source) / (floor - source):.2f}x" if floor > source else "n/a"
        details.append(
            f"{keys:,} keys: the source alone costs {source:.1f} µs/element; net of it RunAgent "
            f"costs {ours - source:.1f} µs/element against the floor's {floor - source:.1f} "
            f"({net})."
        )
    return BenchmarkResult(
        name="noop_activation", title=TITLE, definition=DEFINITION, figures=figures, details=details
    )


HOTSPOTS = (
    Hotspot(
        "beam_agents/core/dofn.py",
        "process",
        "Everything RunAgent does per element, the state reads included.",
        "",
    ),
    Hotspot(
        "beam_agents/core/state.py",
        "header",
        "Reading the header cell (the floor reads it too).",
        "",
    ),
    Hotspot(
        "apache_beam/runners/worker/statecache.py",
        "get_deep_size",
        "Inside those reads and the commits: Beam's state cache weighing every value it caches "
        "with `objsize`, which walks the globals of every loaded module on each call. It is "
        "paid per cell, key and bundle, not per element, by the floor as much as by RunAgent "
        "(a key that is not suspended has only its header read, since the header says whether "
        "there is a continuation), which is why the ratio shrinks as keys get fewer elements "
        "each.",
        "",
    ),
    Hotspot(
        "apache_beam/transforms/core.py",
        "__eq__",
        "Beam matching each parameter of `process` against six special markers (element, key, "
        "window, ...) with a Python `__eq__`, on every element, before it looks up the "
        "parameter's state or timer object (booked to Beam): RunAgent's `process` takes seven "
        "state and timer parameters, the floor's one.",
        "fewer parameters: the replay cache lives exactly as long as the continuation and could "
        "be a field of it, one cell and one parameter fewer (not done: it changes the state "
        "layout of runs suspended across an upgrade).",
    ),
    Hotspot(
        "beam_agents/core/tracing.py",
        "record",
        "Building the two TraceEvent protos every activation emits (ACTIVATION_START and "
        "ACTIVATION_END); each then also costs Beam a tagged output, windowed and handed on "
        "even when nothing reads `.traces`, which this profile books to Beam.",
        "emit one message per activation carrying its events (or let `AgentConfig` turn "
        "per-event traces off or sample them), so an activation costs one tagged output, not "
        "two or more; build the events only at commit.",
    ),
    Hotspot(
        "beam_agents/core/tracing.py",
        "trace_id_for",
        "A uuid5 (SHA-1) trace id computed for every new run.",
        "derive it only when a trace is emitted, or from the intent-id hash the run needs anyway.",
    ),
    Hotspot(
        "beam_agents/core/activation.py",
        "_commit",
        "Planning the commit: the header and the outputs.",
        "",
    ),
    Hotspot(
        "beam_agents/core/dofn.py",
        "_applied",
        "Applying the plan: writing the header cell and tagging the outputs.",
        "",
    ),
    Hotspot(
        "beam_agents/core/context.py",
        "__init__",
        "Building the ActivationContext.",
        "",
    ),
    Hotspot(
        "beam_agents/core/bridge.py",
        "run",
        "Stepping the agent's coroutine (it finishes without waiting, so no event loop runs).",
        "",
    ),
)


def profile(quick: bool) -> ProfileOutput:
    """cProfile the RunAgent pipeline at 20,000 elements over 1,000 keys."""
    count, keys = (500, 50) if quick else (20_000, 1_000)
    elements = keyed_events(count, keys)
    stats = profile_call(lambda: run_pipeline(elements, run_agent))
    return ProfileOutput(
        findings=[
            f"Profiled: the RunAgent pipeline over {count:,} elements and {keys:,} keys; shares "
            "are of all profiled time.",
            *findings(stats, HOTSPOTS, busy_s=total_seconds(stats), unit="element", units=count),
        ],
        raw=summarize_profile(stats),
    )
