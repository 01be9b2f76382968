"""What an activation tells the outside: traces, failure explanations, logs and records."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import itertools
import logging
import os
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from pydantic_core import PydanticSerializationError, to_jsonable_python

from beam_agents._protos import (
    MAX_ATTRIBUTE_NAME_CHARS,
    MAX_ATTRIBUTES,
    MAX_JSON_DEPTH,
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    MemoryState,
    RecordedMemory,
    RecordedModelCall,
    RecordedSlot,
    RecordedToolCall,
    ToolIntent,
    TraceEvent,
    bounded_attribute_name,
    bounded_attribute_value,
    canonical_json,
)
from beam_agents.core.agent import Outcome, Suspend
from beam_agents.core.config import RecordOptions
from beam_agents.core.state import KeyState, MemorySlots
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    as_model_client,
    underlying,
)

# -- trace events: deterministic identity, wall-clock latency ---------------------------------
# Every field but the wall-clock times is a pure function of key, run and position, so a
# retried or replayed run emits the same spans (identity_of is what such runs share).

_START = TraceEvent.ACTIVATION_START
_PARENTLESS = frozenset((_START, TraceEvent.ERROR))
_CLOSING = frozenset((TraceEvent.SUSPENDED, TraceEvent.ACTIVATION_END))

DEADLINE_ATTRIBUTE = "beam_agents.deadline_ms"
"""A ``SUSPENDED`` event's processing-time deadline: read from a clock, so not identity."""
NAMESPACE_ATTRIBUTE = "beam_agents.namespace"
"""The run namespace (``AgentConfig.namespace``) on an activation's first event, if it has one."""
_SHORT_VALUE_CHARS = 2 * MAX_JSON_DEPTH
"""An attribute value this long or shorter is within every limit: recorded without a check."""
_KEPT_ATTRIBUTES = MAX_ATTRIBUTES - 1
"""The most attributes an event keeps of those it is given: one more is the run's namespace."""
MEMORY_SLOTS_ATTRIBUTE = "beam_agents.memory.slots"
"""The key's memory slot sizes after the activation: a canonical JSON object name -> bytes."""


def identity_of(event: TraceEvent) -> bytes:
    """``event`` serialized without what a retry or replay may change: its wall-clock times."""
    kept = TraceEvent()
    kept.CopyFrom(event)
    kept.ClearField("wall_start_unix_nano")
    kept.ClearField("wall_end_unix_nano")
    kept.attributes.pop(DEADLINE_ATTRIBUTE, None)
    return kept.SerializeToString(deterministic=True)


_TRACE_PERSON = b"beam-agents.tr"
"""The BLAKE2b personalization of trace ids."""


def trace_id_for(entity_key: bytes, seq: int, namespace: str | None = None) -> str:
    """The trace id of run ``seq`` of ``entity_key`` in ``namespace`` (``AgentConfig.namespace``).

    32 hex digits: the BLAKE2b-128 digest of ``f"{seq}|{len(key)}|"``, the key, and
    ``"|" + namespace`` if the run has one, personalized ``beam-agents.tr``.
    """
    name = b"%d|%d|%s" % (seq, len(entity_key), entity_key)
    if namespace is not None:
        name += b"|" + namespace.encode()
    return hashlib.blake2b(name, digest_size=16, person=_TRACE_PERSON).hexdigest()


def span_salt_for(trace_id: str, namespace: str | None) -> int:
    """What a run's span ids are XORed with: 0 without a namespace, else from its trace id."""
    return 0 if namespace is None else int(trace_id[16:32], 16)


def span_id_for(sequence: int, event_type: int, salt: int = 0) -> str:
    """The span id of the event at ``sequence`` (of type ``event_type``) in its trace.

    ``salt`` (:func:`span_salt_for`) keeps a namespaced run's span ids apart from any other's.
    """
    if not salt:
        return _unsalted_span_id(sequence, event_type)
    return f"{((sequence << 16) | event_type) ^ salt:016x}"


@functools.lru_cache(maxsize=1024)
def _unsalted_span_id(sequence: int, event_type: int) -> str:
    """The span ids of runs without a namespace: the same positions recur in every run."""
    return f"{sequence:012x}{event_type:04x}"


class TraceRecorder:
    """Collects one activation's trace events; they are emitted only if it commits.

    A disabled recorder (the pipeline reads no ``.traces``) records nothing but its failure
    event. The trace id is derived on first use: a run with nothing to trace never needs it.
    """

    __slots__ = (
        "_activation_span",
        "_clock",
        "_enabled",
        "_entity_key",
        "_first_sequence",
        "_namespace",
        "_now_ms",
        "_opened",
        "_root_span",
        "_salt",
        "_seq",
        "_skipped",
        "_trace_id",
        "events",
    )

    def __init__(
        self,
        entity_key: bytes,
        seq: int,
        trace_id: str | None,
        first_sequence: int,
        now_ms: int,
        clock: Callable[[], int] = time.time_ns,
        *,
        namespace: str | None = None,
        enabled: bool = True,
    ) -> None:
        self._clock = clock
        self._enabled = enabled
        self._opened: TraceEvent | None = None
        self._entity_key = entity_key
        self._seq = seq
        self._trace_id = trace_id
        self._first_sequence = first_sequence
        self._now_ms = now_ms
        self._namespace = namespace
        self._salt: int | None = None
        self._activation_span = self._root_span = ""
        self._skipped = 0
        """Events a disabled recorder did not build: they take their sequences all the same."""
        self.events: list[TraceEvent] = []

    @property
    def trace_id(self) -> str:
        """The run's trace id."""
        trace_id = self._trace_id
        if trace_id is None:
            trace_id = self._trace_id = trace_id_for(self._entity_key, self._seq, self._namespace)
        return trace_id

    def _span_salt(self) -> int:
        """The run's span salt; the first call also derives the activation's parent spans."""
        salt = self._salt
        if salt is None:
            salt = self._salt = span_salt_for(self.trace_id, self._namespace)
            root_span = span_id_for(0, _START, salt)
            first_sequence = self._first_sequence
            self._activation_span = (
                root_span if first_sequence == 0 else span_id_for(first_sequence, _START, salt)
            )
            self._root_span = "" if first_sequence == 0 else root_span
        return salt

    @property
    def entity_key(self) -> bytes:
        """The key of the activation whose events this records."""
        return self._entity_key

    @property
    def seq(self) -> int:
        """The run's seq."""
        return self._seq

    @property
    def now_ms(self) -> int:
        """The activation's event time, the time of every event."""
        return self._now_ms

    def wall_ns(self) -> int:
        """The wall clock now, in Unix nanoseconds: where a timed event starts."""
        return self._clock()

    @property
    def next_sequence(self) -> int:
        """The sequence the run's next event will get."""
        return self._first_sequence + len(self.events) + self._skipped

    @property
    def enabled(self) -> bool:
        """Whether events are built (the pipeline reads ``.traces``)."""
        return self._enabled

    @property
    def first_sequence(self) -> int:
        """The sequence of the activation's first event."""
        return self._first_sequence

    def _event(
        self,
        event_type: int,
        sequence: int,
        step_index: int,
        attributes: Mapping[str, str],
        started_ns: int,
        ended_ns: int,
    ) -> TraceEvent:
        # Field by field rather than by keyword: about three times cheaper for these messages,
        # and zero-valued scalars are skipped (proto3 serializes them identically either way).
        event = TraceEvent()
        event.trace_id = self.trace_id
        event.span_id = span_id_for(sequence, event_type, self._span_salt())
        parent = self._root_span if event_type in _PARENTLESS else self._activation_span
        if parent:
            event.parent_span_id = parent
        event.entity_key = self._entity_key
        event.seq = self._seq
        if step_index:
            event.step_index = step_index
        event.event_type = event_type  # type: ignore[assignment]
        if attributes:
            # Item by item: the map's inherited ``update`` is a slow pure-Python loop.
            event_attributes = event.attributes
            items: Iterable[tuple[str, str]] = attributes.items()
            if len(attributes) > _KEPT_ATTRIBUTES:
                items = itertools.islice(items, _KEPT_ATTRIBUTES)
            for name, value in items:
                if len(name) > MAX_ATTRIBUTE_NAME_CHARS:
                    name = bounded_attribute_name(name)
                # Only a value longer than the deepest allowed JSON can be over a limit.
                if len(value) > _SHORT_VALUE_CHARS:
                    value = bounded_attribute_value(value)
                event_attributes[name] = value
        event.start_ms = event.end_ms = self._now_ms
        if sequence:
            event.sequence = sequence
        event.wall_start_unix_nano = started_ns
        event.wall_end_unix_nano = ended_ns
        return event

    def record(
        self,
        event_type: int,
        step_index: int,
        attributes: Mapping[str, str] | None = None,
        started_ns: int = 0,
    ) -> None:
        """Append an event of ``event_type`` at ``step_index`` spanning ``started_ns`` to now."""
        if not self._enabled:
            self._skipped += 1
            return
        events = self.events
        now = self._clock()
        event = self._event(
            event_type,
            self._first_sequence + len(events),
            step_index,
            attributes or {},
            started_ns or now,
            now,
        )
        events.append(event)
        if event_type == _START:
            self._opened = event
            if self._namespace:
                event.attributes[NAMESPACE_ATTRIBUTE] = self._namespace
        elif event_type in _CLOSING and self._opened is not None:
            self._opened.wall_end_unix_nano = now

    def record_tool_call(self, name: str, step_index: int, started_ns: int, error: str) -> None:
        """Append a ``TOOL_CALL`` of the inline tool ``name`` (``error``: its failure's type)."""
        if not self._enabled:
            self._skipped += 1
            return
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": f"call_{self.trace_id}_{self.next_sequence}",
            "tool_name": name,
            "status": "error" if error else "ok",
        }
        if error:
            attributes["error"] = error
        self.record(TraceEvent.TOOL_CALL, step_index, attributes, started_ns)

    def failure(self, step_index: int, attributes: Mapping[str, str]) -> TraceEvent:
        """The single ``ERROR`` event that replaces everything a failed activation recorded."""
        now = self._clock()
        opened = self._opened
        started_ns = now if opened is None else opened.wall_start_unix_nano
        event = self._event(
            TraceEvent.ERROR, self._first_sequence, step_index, attributes, started_ns, now
        )
        if self._namespace:
            event.attributes[NAMESPACE_ATTRIBUTE] = self._namespace
        return event


# -- failures: what an exception that failed an activation says on .errors --------------------
# The runtime's own frames are dropped from the traceback, except the innermost one; the detail
# names the innermost frame of the agent's code. Called only on the failure path.
MAX_FRAMES = 20
"""Frames kept per exception of a chain (the innermost ones)."""
MAX_CHARS = 8192
"""The traceback's size bound, in characters (its end is kept)."""

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # beam_agents/
_RUNTIME_DIRS = (
    _PACKAGE_DIR + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
)
_BEAM_DIR = f"{os.sep}apache_beam{os.sep}"
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.abspath(path) + os.sep
            for name in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(name))
        }
    )
)


def explain(failure: BaseException, agent: object = None) -> tuple[str, str]:
    """``(detail, traceback)`` for ``failure``; the detail names the agent's file and line."""
    summary = traceback.TracebackException.from_exception(failure, lookup_lines=False)
    where = _agent_frame(summary.stack, _source_file(agent))
    head = f"{type(failure).__name__}: {failure}"
    if where is not None:
        head += f" (at {os.path.basename(where.filename)}:{where.lineno} in {where.name})"
    notes = getattr(failure, "__notes__", None) or ()
    for link in _chain(summary):
        link.stack = traceback.StackSummary.from_list(_kept(link.stack))
    return "; ".join([head, *notes]), _bounded("".join(summary.format()))


_COMPILED_PREFIX = "beam_agents/"
"""How frames of the compiled core name their files: relative to the source root."""


def _is_runtime(filename: str) -> bool:
    return (
        filename.startswith(_RUNTIME_DIRS)
        or filename.startswith(_COMPILED_PREFIX)
        or _BEAM_DIR in filename
    )


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen ")


def _kept(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    last = len(stack) - 1
    kept = [frame for i, frame in enumerate(stack) if i == last or not _is_runtime(frame.filename)]
    return kept[-MAX_FRAMES:]


def _agent_frame(
    stack: traceback.StackSummary, agent_file: str | None
) -> traceback.FrameSummary | None:
    """The innermost frame of the agent's code in ``stack``, if there is one."""
    for frame in reversed(stack):
        filename = frame.filename
        if filename == agent_file or not (_is_runtime(filename) or _is_library(filename)):
            return frame
    return None


def _source_file(agent: object) -> str | None:
    """The file the agent function is defined in (through partials and decorators)."""
    while isinstance(agent, functools.partial):
        agent = agent.func
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__
        agent = inspect.unwrap(agent)  # type: ignore[arg-type]
    code = getattr(agent, "__code__", None)
    return None if code is None else str(code.co_filename)


def _chain(summary: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """``summary`` and every exception it carries: causes, contexts and group members."""
    pending, seen = [summary], set()
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        pending.extend(x for x in (link.__cause__, link.__context__) if x is not None)
        pending.extend(link.exceptions or ())


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    tail = text[len(text) - MAX_CHARS + 64 :]  # room for the line saying what was dropped
    cut = tail.find("\n") + 1  # start at a whole line when one is in reach
    dropped = len(text) - len(tail) + cut
    return f"[{dropped} characters of the traceback dropped]\n" + tail[cut:]


# -- loudness: every .errors record is logged, rate-limited -----------------------------------
logger = logging.getLogger(__name__)

LOG_LIMIT = 10
"""Records logged per interval by one ``DoFn`` instance (then summarized)."""
LOG_INTERVAL_S = 60.0
"""The rate limit's interval, in seconds."""
TRACEBACK_FRAMES = 3
"""Frames of a record's traceback shown in its log line (the innermost ones)."""
_EXPECTED_REASONS = frozenset({"orphaned_result"})
"""Logged at INFO: a late or duplicate answer is routine and changes nothing."""
_MAX_KEY_CHARS = 80
_MAX_DETAIL_CHARS = 1024


class LogBudget:
    """At most ``lines`` log lines per ``interval_s``; counts the lines it refuses."""

    def __init__(
        self,
        lines: int = LOG_LIMIT,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.interval_s = interval_s
        self._clock = clock
        self._window_start = clock()
        self._used = 0
        self.suppressed = 0
        """Lines refused since the last summary."""

    def _roll(self) -> bool:
        """Start a new window if the current one is over; whether it did."""
        now = self._clock()
        if now - self._window_start < self.interval_s:
            return False
        self._window_start, self._used = now, 0
        return True

    def allow(self) -> bool:
        """Whether one more line may be logged now (if not, it is counted as suppressed)."""
        self._roll()
        if self._used < self.lines:
            self._used += 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self, *, final: bool = False) -> int:
        """The suppressed count to summarize now (its window is over, or ``final``), reset."""
        if not self.suppressed or not (final or self._roll()):
            return 0
        count, self.suppressed = self.suppressed, 0
        return count


class ErrorLog:
    """Logs ``.errors`` records at WARNING, at most ``limit`` per ``interval_s`` seconds."""

    __slots__ = ("_budget",)

    def __init__(
        self,
        limit: int = LOG_LIMIT,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._budget = LogBudget(limit, interval_s, clock)

    @property
    def suppressed(self) -> int:
        """Records not logged in the current interval (reported when it is over)."""
        return self._budget.suppressed

    def report(self, errors: Iterable[AgentError]) -> None:
        """Log each record, or count it once this interval's lines are used up."""
        for error in errors:
            self.flush()
            if self._budget.allow():
                level = logging.INFO if error.reason in _EXPECTED_REASONS else logging.WARNING
                logger.log(level, "%s", log_line(error))

    def flush(self, *, final: bool = False) -> None:
        """Report the records left unlogged if the interval is over (or, ``final``, at once)."""
        count = self._budget.take_suppressed(final=final)
        if count:
            logger.warning(
                "%d more .errors records were not logged (at most %d are logged per %gs; "
                "every record is still emitted on .errors)",
                count,
                self._budget.lines,
                self._budget.interval_s,
            )


def log_line(error: AgentError) -> str:
    """One record as a log message: key, reason, seq, detail, the end of its traceback."""
    key = repr(error.entity_key)
    if len(key) > _MAX_KEY_CHARS:
        key = key[:_MAX_KEY_CHARS] + "..."
    detail = error.detail
    if len(detail) > _MAX_DETAIL_CHARS:
        detail = detail[:_MAX_DETAIL_CHARS] + "..."
    line = f".errors record {error.reason} for key {key} (seq {error.seq}): {detail}"
    if error.traceback:
        line += "\n" + traceback_tail(error.traceback, TRACEBACK_FRAMES)
    return line


def traceback_tail(text: str, frames: int) -> str:
    """The end of a formatted traceback, from its ``frames``-th last frame on."""
    lines = text.rstrip("\n").split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    first = starts[-frames] if len(starts) >= frames else (starts[0] if starts else 0)
    return "\n".join(lines[first:])


# -- progress: one short line now and then, visible without any logging set up ----------------
progress_log = logging.getLogger("beam_agents.progress")
"""Where progress lines go: ``ReadEnvelopes``' reads, runs waiting out their deadlines."""


def progress_line(text: str) -> None:
    """Log ``text`` at INFO on :data:`progress_log`, or write it to stderr if INFO is not shown."""
    if progress_log.isEnabledFor(logging.INFO):
        progress_log.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)


# -- activation records: what AgentConfig(record=...) emits on .records -----------------------
RECORD_SCHEMA_VERSION = 1
"""The ``ActivationRecord.schema_version`` this code writes and the newest it reads."""

PLAIN_DECODER = "plain"
"""``RecordedModelCall.decoder`` of a client that decodes raw bodies as plain text."""


def _type_name(value: object) -> str:
    """A stand-in for a value with no JSON form: its type (never its ``repr``: no addresses)."""
    return f"<{type(value).__qualname__}>"


def jsonable(value: object) -> str:
    """``value`` as canonical JSON; a part with no JSON form becomes ``"<TypeName>"``."""
    return canonical_json(to_jsonable_python(value, fallback=_type_name))


def result_json(value: object) -> str | None:
    """A tool's return value as canonical JSON (Pydantic's serialization); ``None``: it has none."""
    try:
        return canonical_json(to_jsonable_python(value))
    except (PydanticSerializationError, TypeError, ValueError):
        return None


def decoder_name(client: object) -> str:
    """How ``client`` decodes raw bodies (``RecordedModelCall.decoder``)."""
    adapted = as_model_client(client)
    inner = underlying(adapted)
    wire = getattr(getattr(inner, "wire", None), "gen_ai_name", None)
    shape = getattr(inner, "shape", None)
    for name in (wire, shape):
        if isinstance(name, str) and name:
            return name
    decode = getattr(inner, "decode", None)
    if decode is None or getattr(decode, "__func__", None) is ModelClient.decode:
        return PLAIN_DECODER
    return adapted.gen_ai_provider_name


class StagedView(Protocol):
    """What the recorder reads of an activation's staged record (``staging.Staged``)."""

    intents: list[ToolIntent]
    memory: MemorySlots | None
    namespace: str | None
    trace: TraceRecorder


class ActivationRecorder:
    """Collects one activation's fresh model calls and inline tool calls, in order."""

    __slots__ = ("envelope", "first_step", "model_calls", "options", "tool_calls", "trigger")

    def __init__(
        self, options: RecordOptions, envelope: AgentEnvelope, trigger: str, first_step: int
    ) -> None:
        self.options = options
        self.envelope = envelope
        self.trigger = trigger
        self.first_step = first_step
        self.model_calls: list[RecordedModelCall] = []
        self.tool_calls: list[RecordedToolCall] = []

    def position(self, intents: int) -> int:
        """The place of the activation's next call, after ``intents`` staged intents."""
        return len(self.model_calls) + len(self.tool_calls) + intents

    def model_call(
        self,
        step: int,
        request: LlmRequest,
        response: LlmResponse,
        model: object,
        intents: int,
        *,
        request_json: str,
        request_digest: str,
    ) -> None:
        """Record a call that reached the provider (``model``: the gateway that made it)."""
        client = getattr(model, "client", None)
        default_model = getattr(client, "model", "")
        self.model_calls.append(
            RecordedModelCall(
                step_index=step,
                request_json=request_json,
                request_digest=request_digest,
                response=response.response,
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
                model=request.model_id or (default_model if isinstance(default_model, str) else ""),
                position=self.position(intents),
                decoder=PLAIN_DECODER if client is None else decoder_name(client),
            )
        )

    def tool_call(
        self,
        name: str,
        args: Mapping[str, Any],
        result: object,
        error: BaseException | None,
        intents: int,
    ) -> None:
        """Record an inline tool call: its result, or the exception it raised."""
        call = RecordedToolCall(
            tool_name=name,
            args_json=jsonable(dict(args)),
            position=self.position(intents),
        )
        if error is None:
            recorded = result_json(result)
            if recorded is None:
                call.unrecorded_result_type = type(result).__qualname__
            else:
                call.result_json = recorded
        else:
            call.error_type = type(error).__name__
            call.error_message = str(error)
        self.tool_calls.append(call)

    def finish(
        self, entity_key: bytes, seq: int, staged: StagedView, outcome: Outcome, state: KeyState
    ) -> ActivationRecord:
        """The activation's record; called at commit, before any of its state is written."""
        trace = staged.trace
        record = ActivationRecord(
            schema_version=RECORD_SCHEMA_VERSION,
            entity_key=entity_key,
            seq=seq,
            trigger=self.trigger,
            envelope=self.envelope,
            first_step=self.first_step,
            trace_sequence=trace.first_sequence,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            intents=staged.intents,
            intent_namespace=staged.namespace or "",
        )
        continuation = state.continuation
        if continuation is not None and self.trigger != "event":
            # Without its cache: that is rebuilt from the run's earlier records
            # (``replay.offline.cells_for``), so each response is recorded once.
            record.continuation_before.CopyFrom(continuation)
            record.continuation_before.ClearField("replay_cache")
        if isinstance(outcome, Suspend):
            record.outcome = ActivationRecord.SUSPEND
            record.snapshot = outcome.snapshot
        else:
            record.outcome = ActivationRecord.COMPLETE
            record.output = outcome.output
        memory = staged.memory
        if memory is not None:
            before = b"".join(state.read_memory())
            limit = self.options.max_value_bytes
            described = memory_record(before, limit)
            record.memory_before.CopyFrom(described)
            if memory.changed:
                described = memory_record(b"".join(memory.encode()), limit)
            record.memory_after.CopyFrom(described)
        return record


def memory_record(blob: bytes, max_value_bytes: int) -> RecordedMemory:
    """A ``MemoryState`` blob as recorded: every slot's digest, small ones whole."""
    recorded = RecordedMemory(known=True)
    if not blob:
        return recorded
    for slot in MemoryState.FromString(blob).slots:
        encoded = slot.SerializeToString(deterministic=True)
        entry = RecordedSlot(
            key=slot.key, digest=hashlib.sha256(encoded).digest(), size_bytes=len(encoded)
        )
        if len(encoded) <= max_value_bytes:
            entry.slot.CopyFrom(slot)
        recorded.slots.append(entry)
    return recorded
