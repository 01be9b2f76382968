"""What ``adapter_overhead``'s profile looks for: each adapter's own hot spots, by package."""

from __future__ import annotations

import pstats
from typing import Any

from benchmarks.harness import Hotspot

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
            'The checkpoint LangGraph writes when the run exits (`durability="exit"`) into '
            "the adapter's `BeamCheckpointSaver` (an `InMemorySaver`: every channel "
            "serialized); the graph alone writes the same one into its own `InMemorySaver`.",
            "",
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


def top_areas(stats: pstats.Stats, busy: float) -> list[str]:
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
