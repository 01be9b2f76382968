"""A key's runs as the keys page draws them: one span waterfall per run, plus its memory.

A run is one ``seq`` of a key. Bars are placed by the spans' wall-clock times, else by event
time, else one after another.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from beam_agents._protos import TraceEvent
from effector.console.views import duration, when

_MIN_WIDTH = 0.5
"""The narrowest bar, in per cent of the run, so that an instant still shows."""

_STATUS_BY_LAST_EVENT = {
    TraceEvent.ACTIVATION_END: "completed",
    TraceEvent.SUSPENDED: "suspended",
    TraceEvent.ERROR: "failed",
}
MEMORY_SLOTS = "beam_agents.memory.slots"
DEADLINE = "beam_agents.deadline_ms"


@dataclass(frozen=True, slots=True)
class Span:
    """One row of a waterfall."""

    kind: str
    """Its CSS class: activation, llm, tool, intent, suspended, wait, end or error."""
    label: str
    detail: str
    offset: float
    """Where the bar starts, in per cent of the run."""
    width: float
    took: str
    """Its duration as text; empty when it was not measured."""
    attributes: str
    """Every attribute, one ``name=value`` per line (the bar's tooltip)."""
    intent_id: str = ""


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a key, with its waterfall."""

    seq: int
    trace_id: str
    status: str
    """``completed``, ``suspended``, ``failed`` or ``running`` (by its newest event)."""
    started: str
    took: str
    timing: str
    """How its bars are placed: ``wall clock``, ``event time`` or ``order``."""
    spans: list[Span]


def group_runs(events: Iterable[TraceEvent]) -> list[list[TraceEvent]]:
    """Events grouped by run (seq), newest run first, each run's events in sequence order."""
    by_seq: dict[int, list[TraceEvent]] = {}
    for event in events:
        by_seq.setdefault(event.seq, []).append(event)
    return [
        sorted(by_seq[seq], key=lambda event: event.sequence)
        for seq in sorted(by_seq, reverse=True)
    ]


def build_runs(events: Iterable[TraceEvent]) -> list[Run]:
    """The waterfall of every run in ``events``, newest run first."""
    return [_run(run) for run in group_runs(events)]


def memory_slots(events: Sequence[TraceEvent]) -> list[tuple[str, int]] | None:
    """The memory slots and sizes reported last (on an activation's closing event), or ``None``."""
    for event in sorted(events, key=lambda e: (e.seq, e.sequence), reverse=True):
        if MEMORY_SLOTS in event.attributes:
            try:
                slots = json.loads(event.attributes[MEMORY_SLOTS])
            except ValueError:
                return None
            if not isinstance(slots, dict):
                return None
            return sorted((str(name), _int(size)) for name, size in slots.items())
    return None


def _int(value: object) -> int:
    """``value`` as a whole number (from JSON or an attribute's text); 0 if it is not one."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _times(events: Sequence[TraceEvent]) -> tuple[str, list[tuple[float, float]]]:
    """How the run is timed, and each event's (start, end) in epoch milliseconds."""
    if not any(event.wall_start_unix_nano for event in events):
        return "event time", [(e.start_ms, max(e.start_ms, e.end_ms)) for e in events]
    times: list[tuple[float, float]] = []
    previous = min(e.wall_start_unix_nano for e in events if e.wall_start_unix_nano) / 1e6
    for event in events:
        if event.wall_start_unix_nano:  # an unmeasured span sits where the one before ended
            start = event.wall_start_unix_nano / 1e6
            previous = max(start, event.wall_end_unix_nano / 1e6)
            times.append((start, previous))
        else:
            times.append((previous, previous))
    return "wall clock", times


def _run(events: list[TraceEvent]) -> Run:
    timing, times = _times(events)
    first = min(start for start, _ in times)
    total = max(end for _, end in times) - first
    if total <= 0:
        timing = "order"

    def place(index: float, start: float, end: float) -> tuple[float, float]:
        if timing == "order":
            return round(index / len(events) * 100, 3), round(100 / len(events), 3)
        offset = min((start - first) / total * 100, 100 - _MIN_WIDTH)
        width = min(max((end - start) / total * 100, _MIN_WIDTH), 100 - offset)
        return round(offset, 3), round(width, 3)

    def took(start: float, end: float) -> str:
        return duration(end - start) if end > start else ""

    spans: list[Span] = []
    for index, (event, (start, end)) in enumerate(zip(events, times, strict=True)):
        found = dict(event.attributes)
        kind, label, detail = _describe(event, found)
        spans.append(
            Span(
                kind,
                label,
                detail,
                *place(index, start, end),
                took(start, end),
                "\n".join(f"{name}={found[name]}" for name in sorted(found)),
                found.get("intent_id", "") if kind == "intent" else "",
            )
        )
        if event.event_type == TraceEvent.SUSPENDED and index + 1 < len(events):
            resumed = times[index + 1][0]
            what = events[index + 1].attributes.get("trigger", "")
            spans.append(
                Span(
                    "wait",
                    "waiting",
                    f"until resumed by {what}" if what else "until resumed",
                    *place(index + 0.5, end, resumed),
                    took(end, resumed) if timing != "order" else "",
                    "",
                )
            )
    return Run(
        seq=events[0].seq,
        trace_id=events[0].trace_id,
        status=_STATUS_BY_LAST_EVENT.get(events[-1].event_type, "running"),
        started=when(int(first)),
        took=duration(total) if timing == "wall clock" else "-",
        timing=timing,
        spans=spans,
    )


def _describe(event: TraceEvent, found: Mapping[str, str]) -> tuple[str, str, str]:
    """The kind, label and detail of one event, from whichever attributes it carries."""
    if event.event_type == TraceEvent.ACTIVATION_START:
        return "activation", f"activation ({found.get('trigger', '?')})", f"step {event.step_index}"
    if event.event_type == TraceEvent.LLM_CALL:
        model = found.get("gen_ai.request.model", "")
        tokens = [
            f"{found[name]} {word}"
            for name, word in (
                ("gen_ai.usage.input_tokens", "in"),
                ("gen_ai.usage.output_tokens", "out"),
            )
            if name in found
        ]
        provider = found.get("gen_ai.provider.name", "")
        detail = " / ".join(tokens) + " tokens" if tokens else ""
        cached = " (replayed)" if found.get("beam_agents.cache_hit") == "true" else ""
        return "llm", f"model {model}".strip(), f"{detail} {provider}{cached}".strip()
    if event.event_type == TraceEvent.TOOL_CALL:
        name = found.get("gen_ai.tool.name") or found.get("tool_name", "")
        status = found.get("status", "")
        call = found.get("gen_ai.tool.call.id", "")
        return "tool", f"tool {name}".strip(), " ".join(part for part in (status, call) if part)
    if event.event_type == TraceEvent.INTENT_EMITTED:
        label = f"intent {found.get('tool_name', '')}".strip()
        return "intent", label, found.get("kind", "").lower()
    if event.event_type == TraceEvent.SUSPENDED:
        detail = f"{found.get('pending', '?')} pending"
        if found.get(DEADLINE):
            detail += f", deadline {when(_int(found[DEADLINE]))}"
        return "suspended", "suspended", detail
    if event.event_type == TraceEvent.ACTIVATION_END:
        detail = found.get("route", "") or (
            f"{found['output_bytes']} output bytes" if "output_bytes" in found else ""
        )
        return "end", "completed", detail
    if event.event_type == TraceEvent.ERROR:
        return "error", "error", found.get("reason", "") or found.get("error", "")
    return "other", TraceEvent.EventType.Name(event.event_type).lower(), ""
