# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; the agents are driven through AgentDoFn directly.)
"""Benchmark: what each framework adapter costs per activation, net of the framework itself.

One conversation (two model calls, one read-only tool) played four ways inside ``AgentDoFn``
(the plain ``ctx`` agent and the LangGraph, Pydantic AI and ADK adapters), and by each
framework on its own, outside beam-agents; ``DEFINITION`` says exactly what is timed.
"""

from __future__ import annotations

import functools
import gc
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from beam_agents._protos import AgentEnvelope
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import AgentDoFn
from benchmarks.adapter_variants import (
    ADAPTERS,
    ALONE,
    FINAL_PREFIX,
    FRAMEWORKS,
    Alone,
    Events,
    account_of,
    event_payload,
    make_config,
)
from benchmarks.harness import (
    Hotspot,
    findings,
    profile_call,
    summarize_profile,
    total_seconds,
)
from benchmarks.report import BenchmarkResult, Figure, Goal, ProfileOutput, Target
from tests.core.harness import InMemoryKeyState

TITLE = "Framework adapters: per-activation overhead against the plain ctx agent"

DEFINITION = """\
One conversation, the same in every variant: a system prompt and the event (`{"id",
"account"}` JSON) as the user message; the model's first answer calls the read-only tool
`lookup_account(account)`, its second (once the tool result is in the conversation) is the final
text `DONE <tool result>`; no intents, so no effector. **Per activation**: CPU time (this
process's, `time.process_time`, so other processes on the shared machine do not count) of
`AgentDoFn.process` (driven directly in this process over in-memory state cells, no runner,
as `tests/core/harness.py` does) for one event on a fresh key, divided over N keys (200 full,
4 quick), model calls answered by a scripted `FakeLLM` through `AgentConfig.provider_factory`,
the tool run inline by `ctx.run_tool`. The variants: the plain `ctx` agent (the floor: builds
the neutral messages itself and calls `ctx.call_model` / `ctx.run_tool`), and
`LangGraphAgent` (agent → `ToolNode(beam_tools)` → agent graph with `BeamChatModel`),
`PydanticAIAgent` (`Agent(system_prompt=..., output_type=str)` with the default
`BeamToolset`) and `AdkAgent` (`LlmAgent` with `beam_tools`). **Alone, per conversation**:
the same conversation run by the framework with nothing of beam-agents: the same LangGraph
graph with an in-process fake LangChain chat model, run with `ainvoke` on a thread of its own
per conversation in LangGraph's `InMemorySaver` (where a LangGraph thread keeps its state,
written when the run exits, as the adapter runs it: the adapter keeps the same state in the
key's memory); a Pydantic AI `Agent` on a `FunctionModel` with the tool as `tool_plain`; an ADK
`Runner` over an `InMemorySessionService` (one new session per conversation) with an
in-process fake `BaseLlm` and the tool as a `FunctionTool`. All fakes answer the same script
from their own framework's messages; each alone variant runs its N conversations in one event
loop. **Adapter's own work** = (adapter per activation - framework alone per conversation),
divided by the plain agent per activation (ratio rows; target at most 2x). It is everything
around the framework: beam-agents' own per-activation work (admission, the model path of the
two calls, the tool, the commit: what the plain agent costs, less its own message building),
plus what the adapter adds (translating messages, tools and answers, the bridge, an asyncio
task per activation where the plain agent completes inline, the checkpoint, history or session
kept in working memory); so a ratio of 1 would mean the
adapter adds nothing but the runtime. Every variant warms up on a quarter as many keys first;
then the seven take turns (each round in the reverse order of the one before, a `gc.collect()`
before each batch) for 7 rounds (1 quick), and each figure is the median of its rounds; the
adapter's own work is the median over rounds of the difference within each round (adapter minus
framework alone, measured back to back), which cancels drift between rounds."""

TARGET = Target(Goal.RATIO_AT_MOST, 2.0)
REMAINING = """\
An adapter's own work is the difference of two figures each many times larger, so a few
percent of drift between them moves the ratio by tenths; the profile findings below name where
the adapter's time goes beyond the framework's. For ADK, the adapter's two model calls go through
the runtime's model path (request digest over ADK's larger requests, gateway, replay-cache entry,
trace) where ADK alone calls an in-process fake directly, and the session is encoded into working
memory once per run; the next changes are the model path's bookkeeping (benchmark 1) and encoding
the session's new events only."""
KEYS, QUICK_KEYS = 200, 4
ROUNDS, QUICK_ROUNDS = 7, 1
WARM_UP_KEYS = 3
WARM_UP_SHARE = 4
"""A full run warms each variant up on a quarter of its keys (a quick one on three)."""

# -- timing ---------------------------------------------------------------------------------------


def answered(event: tuple[str, bytes], text: str) -> bool:
    """Whether ``text`` is the final answer to ``event``: the tool's result, reported.

    Each framework words the tool result its own way, so only its gist is checked.
    """
    return text.startswith(FINAL_PREFIX) and account_of(event[1].decode("utf-8")) in text


def _as_list(events: Events) -> Any:
    return list(events)


@dataclass
class Batch:
    """One variant: ``run(prepare(events))`` runs the conversations, returns the final texts.

    ``prepare`` builds, outside the timed part, what the run takes (state cells, envelopes).
    """

    run: Callable[[Any], list[str]]
    close: Callable[[], None]
    prepare: Callable[[Events], Any] = _as_list


def dofn_batch(agent: AgentFn) -> Batch:
    """``agent`` in a set-up ``AgentDoFn``; each conversation is one event on its own key."""
    dofn = AgentDoFn(agent, make_config())
    dofn.setup()

    def prepare(events: Events) -> list[tuple[InMemoryKeyState, bytes, AgentEnvelope]]:
        return [
            (
                InMemoryKeyState(),
                key.encode(),
                AgentEnvelope(entity_key=key.encode(), event_time_ms=1_000, external_event=event),
            )
            for key, event in events
        ]

    def run(work: list[tuple[InMemoryKeyState, bytes, AgentEnvelope]]) -> list[str]:
        texts: list[str] = []
        for cells, key, envelope in work:
            outputs = cells.process(dofn, key, envelope)
            texts.extend(item.decode() for item in outputs if isinstance(item, bytes))
        return texts

    return Batch(run, dofn.teardown, prepare)


def alone_batch(alone: Alone) -> Batch:
    """A framework alone."""
    return Batch(alone.run, alone.close)


def _batches() -> dict[str, Batch]:
    batches = {name: dofn_batch(make()) for name, make in ADAPTERS.items()}
    batches.update({f"{name} alone": alone_batch(make()) for name, make in ALONE.items()})
    return batches


_serial = iter(range(10**9))


def fresh_events(count: int) -> list[tuple[str, bytes]]:
    """``count`` events on keys (and with ids) no earlier batch used."""
    events = []
    for _ in range(count):
        event_id = f"e{next(_serial)}"
        events.append((f"key-{event_id}", event_payload(event_id)))
    return events


def timed_batch(batch: Batch, count: int) -> float:
    """Seconds per conversation of one batch of ``count`` fresh conversations (checked)."""
    events = fresh_events(count)
    work = batch.prepare(events)
    gc.collect()
    started = time.process_time()
    texts = batch.run(work)
    seconds = time.process_time() - started
    if len(texts) != len(events) or not all(map(answered, events, texts)):
        raise AssertionError(f"a variant answered {texts[:1]!r} to {events[:1]!r}")
    return seconds / count


def measure(keys: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per conversation of every variant, per round (interleaved, after a warm-up)."""
    batches = _batches()
    try:
        for batch in batches.values():
            timed_batch(batch, max(WARM_UP_KEYS, keys // WARM_UP_SHARE))
        seconds: dict[str, list[float]] = {name: [] for name in batches}
        order = list(batches)
        for round_ in range(rounds):
            for name in order[:: -1 if round_ % 2 else 1]:
                seconds[name].append(timed_batch(batches[name], keys))
        return seconds
    finally:
        for batch in batches.values():
            batch.close()


def run(quick: bool) -> BenchmarkResult:
    """Measure the four agents and the three frameworks alone in interleaved rounds."""
    keys, rounds = (QUICK_KEYS, QUICK_ROUNDS) if quick else (KEYS, ROUNDS)
    seconds = measure(keys, rounds)
    ms = {name: 1e3 * statistics.median(values) for name, values in seconds.items()}
    samples = keys * rounds
    plain = ms["plain"]
    figures = [
        Figure(name="plain ctx agent, per activation", unit="ms", ours=plain, samples=samples)
    ]
    details = []
    for name, label in FRAMEWORKS.items():
        adapter, alone = ms[name], ms[f"{name} alone"]
        own = 1e3 * statistics.median(
            mine - theirs
            for mine, theirs in zip(seconds[name], seconds[f"{name} alone"], strict=True)
        )
        figures += [
            Figure(
                name=f"{label} adapter, per activation",
                unit="ms",
                ours=adapter,
                samples=samples,
                floor=plain,
                floor_label="plain ctx agent, per activation",
            ),
            Figure(name=f"{label} alone, per conversation", unit="ms", ours=alone, samples=samples),
            Figure(
                name=f"{label} adapter's own work over the plain-ctx agent",
                unit="ms",
                # A non-positive difference would be noise: report it as a microsecond.
                ours=max(own, 1e-3),
                samples=samples,
                floor=plain,
                floor_label="plain ctx agent, per activation",
                target=TARGET,
            ),
        ]
        spread = _spread(seconds[name]), _spread(seconds[f"{name} alone"])
        details.append(
            f"{label}: the adapter costs {adapter:.2f} ms per activation ({adapter / plain:.1f}x "
            f"the plain agent), the framework alone {alone:.2f} ms per conversation; the "
            f"adapter's own work is {own:.2f} ms, {own / plain:.2f}x the plain agent's "
            f"{plain:.2f} ms. Round-to-round spread (max/min): adapter {spread[0]}, "
            f"alone {spread[1]}."
        )
    details.append(
        f"Plain ctx agent: {plain:.3f} ms per activation, spread {_spread(seconds['plain'])}."
    )
    return BenchmarkResult(
        name="adapter_overhead",
        title=TITLE,
        definition=DEFINITION,
        figures=figures,
        details=details,
        remaining=REMAINING,
    )


def _spread(values: Sequence[float]) -> str:
    return f"{max(values) / min(values):.2f}x"


_CALL_MODEL = Hotspot(
    "beam_agents/adapters/_bridge.py",
    "call_model",
    "`ctx.call_model` for the framework's two model calls: the runtime's model path "
    "(gateway, FakeLLM, cache, trace), which the plain agent pays too.",
    "",
)

HOTSPOTS: dict[str, tuple[Hotspot, ...]] = {
    "langgraph": (
        Hotspot(
            "langgraph/checkpoint/memory/__init__.py",
            "put",
            "The checkpoint LangGraph writes after every super-step into the adapter's "
            "`BeamCheckpointSaver` (an `InMemorySaver`: every channel serialized); the graph "
            "alone runs without a checkpointer.",
            "keep the run's checkpoints unserialized until the run completes, and serialize "
            "only the one `export` keeps.",
        ),
        Hotspot(
            "langgraph/pregel/main.py",
            "aget_state",
            "Reading the state back after `ainvoke`, to find interrupts and the final values.",
            "take the final values from `ainvoke`'s result and read the state only when the "
            "run stopped on an interrupt.",
        ),
        Hotspot(
            "beam_agents/adapters/_langgraph_checkpoint.py",
            "export",
            "Encoding the latest checkpoint for working memory when the run completes.",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_langgraph_model.py",
            "request",
            "Translating LangChain messages and bound tools into the neutral request.",
            "",
        ),
        _CALL_MODEL,
    ),
    "pydantic_ai": (
        Hotspot(
            "beam_agents/adapters/_pydantic_ai_history.py",
            "save",
            "Encoding the run's messages (Pydantic AI's JSON) into working memory as the key's "
            "history, once per completed run.",
            "encode the history once: `encode` dumps each message on its own to measure it, "
            "then the kept ones again.",
        ),
        Hotspot(
            "beam_agents/adapters/_pydantic_ai_history.py",
            "load",
            "Reading the key's history back (empty here: every key is new).",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_pydantic_ai_model.py",
            "llm_request",
            "Translating Pydantic AI messages and tool definitions into the neutral request.",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_pydantic_ai_model.py",
            "model_response",
            "Translating the answer back into a Pydantic AI `ModelResponse`.",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_pydantic_ai_tools.py",
            "get_tools",
            "`BeamToolset` listing the registry's tools for each model step.",
            "",
        ),
        _CALL_MODEL,
    ),
    "adk": (
        Hotspot(
            "google/adk/workflow/utils/_workflow_graph_utils.py",
            "build_node",
            "ADK's own: building the agent's workflow node on every invocation, which tries "
            "to import its remote A2A agent and fails (the optional `a2a` package is not "
            "installed), so the module is loaded and run again each time. The framework alone "
            "pays it too.",
            "",
        ),
        Hotspot(
            "google/adk/runners.py",
            "__init__",
            "Building a `Runner` (and its plugin manager) for every activation; the framework "
            "alone builds one and reuses it.",
            "build the `Runner` once per adapter and give it a session service whose session "
            "is swapped per activation.",
        ),
        Hotspot(
            "beam_agents/adapters/_adk_session.py",
            "save_session",
            "Trimming the session and encoding it (Pydantic JSON) into working memory.",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_adk_session.py",
            "load_session",
            "Reading the key's session back (a new, empty one here).",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_adk_model.py",
            "neutral_request",
            "Translating the ADK request (genai contents, function declarations) into the "
            "neutral request.",
            "",
        ),
        Hotspot(
            "beam_agents/adapters/_adk_model.py",
            "adk_response",
            "Building the ADK `LlmResponse` (genai types, validated by Pydantic) from the answer.",
            "",
        ),
        _CALL_MODEL,
    ),
}
"""What each adapter adds around its framework, for the profile's findings.

Cumulative times of coroutines are only right when they do not wait; these do not (the fake
model answers at once), except ``aget_state`` whose saver is in memory."""


def profile(quick: bool) -> ProfileOutput:
    """cProfile each adapter over its own batch: where its time goes."""
    keys = QUICK_KEYS if quick else 100
    found: list[str] = []
    raw: list[str] = []
    for name, label in FRAMEWORKS.items():
        batch = dofn_batch(ADAPTERS[name]())
        try:
            timed_batch(batch, max(WARM_UP_KEYS, keys // WARM_UP_SHARE))
            work = batch.prepare(fresh_events(keys))
            stats = profile_call(functools.partial(batch.run, work))
        finally:
            batch.close()
        busy = total_seconds(stats) or 1.0
        found.append(
            f"{label} adapter, {keys} activations profiled ({1e3 * busy / keys:.1f} ms each "
            "under the profiler); self time by package: " + ", ".join(_top_areas(stats, busy)) + "."
        )
        found += findings(stats, HOTSPOTS[name], busy_s=busy, unit="activation", units=keys)
        raw += [f"-- {label} adapter --", *summarize_profile(stats, top=10)]
    return ProfileOutput(findings=found, raw=raw)


_PACKAGES = (
    ("beam_agents/adapters/", "the adapter"),
    ("beam_agents/", "the rest of beam_agents"),
    ("/langgraph/", "langgraph"),
    ("/langchain_core/", "langchain_core"),
    ("/pydantic_ai/", "pydantic_ai"),
    ("/google/adk/", "google.adk"),
    ("/google/genai/", "google.genai"),
    ("/pydantic/", "pydantic"),
    ("/opentelemetry/", "opentelemetry"),
    ("/asyncio/", "asyncio"),
    ("site-packages/", "other packages"),
    ("/python3.", "the rest of the standard library"),
)


def _top_areas(stats: pstats.Stats, busy: float) -> list[str]:
    """Self time by package, largest first (C builtins, Pydantic's validators among them, apart)."""
    by_package: dict[str, float] = {}
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), entry in entries.items():
        if filename == "~":
            area = "C builtins"
        else:
            area = next((name for marker, name in _PACKAGES if marker in filename), "other")
        by_package[area] = by_package.get(area, 0.0) + entry[2]
    ranked = sorted(by_package.items(), key=lambda item: -item[1])
    return [f"{name} {100 * value / busy:.0f}%" for name, value in ranked[:7]]
