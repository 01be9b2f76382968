"""A key's runs as the keys page draws them: one span waterfall per run, plus its memory.

A run is one trace of a key: its ``seq`` and its trace id, which differ between namespaces
sharing a key and seq. Bars are placed by the spans' wall-clock times, else by event time,
else one after another. A run shows at most :data:`SPANS_PER_PAGE` spans at a time; its
further spans are on pages of their own, read from the store a page at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from beam_agents._protos import TraceEvent
from effector.console.views import duration, when
from effector.readable import cut, enum_name, parsed_json
from effector.store.intents import ErrorRecord
from effector.store.sql import SqlStore
from effector.store.telemetry import RunHead

_MIN_WIDTH = 0.5
"""The narrowest bar, in per cent of the run, so that an instant still shows."""

_STATUS_BY_LAST_EVENT: dict[int, str] = {
    TraceEvent.ACTIVATION_END: "completed",
    TraceEvent.SUSPENDED: "suspended",
    TraceEvent.ERROR: "failed",
}
MEMORY_SLOTS = "beam_agents.memory.slots"
DEADLINE = "beam_agents.deadline_ms"
NAMESPACE = "beam_agents.namespace"
"""The attribute naming the run's ``AgentConfig.namespace``, where the pipeline records it."""
SPANS_PER_PAGE = 200
"""Spans of one run drawn at a time; the rest are on the run's further pages."""
KEY_PAGE_SPANS = 5_000
"""Spans a key's page draws in all: its runs share them, each drawing 20 at least."""
_FEWEST_SPANS = 20
ATTRIBUTE_CHARS = 2_000
"""The most characters of one attribute value a span's tooltip shows."""
_MEMORY_SCAN = 20
_CLOSING = (TraceEvent.ACTIVATION_END, TraceEvent.SUSPENDED, TraceEvent.ERROR)
"""The events that close an activation, where the memory's slots are reported."""
"""Closing events (newest first) searched for the memory's slots."""


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
    """One run of a key (one trace), with its waterfall: one page of its spans."""

    seq: int
    trace_id: str
    status: str
    """``completed``, ``suspended``, ``failed`` or ``running`` (by its newest event)."""
    started: str
    took: str
    timing: str
    """How its bars are placed: ``wall clock``, ``event time`` or ``order``."""
    spans: list[Span]
    namespace: str = ""
    """The run's namespace, where its spans name it."""
    anchor: str = ""
    """The id of its section on the key's page: ``run-SEQ``, plus the trace when seqs repeat."""
    span_count: int = 0
    """How many spans the run has in all."""
    page: int = 1
    shown: int = 0
    """How many of its spans this page draws."""
    errors: list[ErrorRecord] = field(default_factory=list)

    @property
    def pages(self) -> int:
        """How many pages its spans fill."""
        return max(-(-self.span_count // SPANS_PER_PAGE), 1)

    @property
    def first_shown(self) -> int:
        """The position (from 1) of the first span on this page."""
        return (self.page - 1) * SPANS_PER_PAGE + 1

    @property
    def last_shown(self) -> int:
        """The position of the last span on this page."""
        return self.first_shown + self.shown - 1

    @property
    def next_page(self) -> int:
        """The run page that goes on from here (0: none); page 1 again if this one drew few."""
        if self.last_shown >= self.span_count:
            return 0
        return self.page + 1 if self.shown >= SPANS_PER_PAGE else self.page


def group_runs(events: Iterable[TraceEvent]) -> list[list[TraceEvent]]:
    """Events grouped by run (seq and trace), newest run first, each in sequence order."""
    by_run: dict[tuple[int, str], list[TraceEvent]] = {}
    for event in events:
        by_run.setdefault((event.seq, event.trace_id), []).append(event)
    return [
        sorted(by_run[run], key=lambda event: event.sequence)
        for run in sorted(by_run, key=lambda run: (-run[0], run[1]))
    ]


def build_runs(events: Iterable[TraceEvent]) -> list[Run]:
    """The waterfall of every run in ``events``, newest run first."""
    return [_run(run) for run in group_runs(events)]


def _anchor(head: RunHead, heads: Sequence[RunHead]) -> str:
    shared = sum(1 for other in heads if other.seq == head.seq) > 1
    return f"run-{head.seq}-{head.trace_id}" if shared else f"run-{head.seq}"


def _errors_of(
    head: RunHead, heads: Sequence[RunHead], errors: Sequence[ErrorRecord]
) -> list[ErrorRecord]:
    """The errors of one run: by trace id, or by seq when the error names no trace."""
    alone = sum(1 for other in heads if other.seq == head.seq) == 1
    return [
        record
        for record in errors
        if record.error.trace_id == head.trace_id
        or (not record.error.trace_id and alone and record.error.seq == head.seq)
    ]


def page_of_run(
    head: RunHead,
    heads: Sequence[RunHead],
    events: Sequence[TraceEvent],
    page: int,
    errors: Sequence[ErrorRecord] = (),
) -> Run:
    """The waterfall of one page of a run's spans, with its place among the key's runs."""
    drawn = _run(list(events)) if events else _empty_run(head)
    namespace = next((e.attributes[NAMESPACE] for e in events if NAMESPACE in e.attributes), "")
    return Run(
        seq=head.seq,
        trace_id=head.trace_id,
        status=_STATUS_BY_LAST_EVENT.get(head.last_event, "running"),
        started=drawn.started,
        took=drawn.took,
        timing=drawn.timing,
        spans=drawn.spans,
        namespace=namespace,
        anchor=_anchor(head, heads),
        span_count=head.spans,
        page=page,
        shown=len(events),
        errors=_errors_of(head, heads, errors),
    )


def _empty_run(head: RunHead) -> Run:
    return Run(head.seq, head.trace_id, "running", "-", "-", "order", [])


def spans_per_run(runs: int) -> int:
    """How many spans each of ``runs`` runs draws on a key's page (its share of the budget)."""
    return min(SPANS_PER_PAGE, max(_FEWEST_SPANS, KEY_PAGE_SPANS // max(runs, 1)))


async def run_spans(
    store: SqlStore, entity_key: bytes, head: RunHead, page: int, limit: int = SPANS_PER_PAGE
) -> list[TraceEvent]:
    """Page ``page`` of a run's spans in sequence order, its first ``limit`` at most."""
    return await store.run_spans(entity_key, head, (page - 1) * SPANS_PER_PAGE, limit)


async def closing_events(store: SqlStore, entity_key: bytes) -> list[TraceEvent]:
    """The key's newest closing events (where the memory's slots are reported)."""
    return await store.newest_events_of_types(entity_key, _CLOSING, _MEMORY_SCAN)


def memory_slots(events: Sequence[TraceEvent]) -> list[tuple[str, int]] | None:
    """The memory slots and sizes reported last (on an activation's closing event), or ``None``."""
    for event in sorted(events, key=lambda e: (e.seq, e.sequence), reverse=True):
        if MEMORY_SLOTS in event.attributes:
            slots = parsed_json(event.attributes[MEMORY_SLOTS])
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
                _tooltip(found),
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


def _tooltip(found: Mapping[str, str]) -> str:
    """Every attribute as ``name=value`` lines, each value cut to :data:`ATTRIBUTE_CHARS`."""
    lines = []
    for name in sorted(found):
        value, left_out = cut(found[name], ATTRIBUTE_CHARS)
        lines.append(f"{name}={value}" + (f"… ({left_out} more characters)" if left_out else ""))
    return "\n".join(lines)


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
    return "other", enum_name(TraceEvent.EventType, event.event_type).lower(), ""
