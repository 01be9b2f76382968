"""Activation records: what ``AgentConfig(record=...)`` makes ``RunAgent`` emit on ``.records``.

An :class:`ActivationRecorder` rides on one activation's staged record and collects what that
record cannot tell afterwards: each fresh model call's request and raw response, each inline
tool call's arguments and result. :meth:`ActivationRecorder.finish` builds the
``ActivationRecord`` at commit from it and from what the activation staged. Recording is off by
default and then costs one attribute check per activation. See ``beam_agents/replay/README.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_core import PydanticSerializationError, to_jsonable_python

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    MemoryState,
    RecordedMemory,
    RecordedModelCall,
    RecordedSlot,
    RecordedToolCall,
    ToolIntent,
    canonical_json,
)
from beam_agents.core.memory import WorkingMemory
from beam_agents.core.state import KeyState
from beam_agents.core.tracing import TraceRecorder
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    as_model_client,
    underlying,
)

RECORD_SCHEMA_VERSION = 1
"""The ``ActivationRecord.schema_version`` this code writes and the newest it reads."""

PLAIN_DECODER = "plain"
"""``RecordedModelCall.decoder`` of a client that decodes raw bodies as plain text."""

DEFAULT_MAX_VALUE_BYTES = 16 * 1024
"""Memory slots up to this size (encoded) are recorded whole; larger ones by digest only."""


@dataclass(frozen=True)
class RecordOptions:
    """How activations are recorded (``AgentConfig(record=RecordOptions(...))``).

    ``max_value_bytes``: a memory slot whose encoding is larger is recorded by its digest and
    size only, so a replay cannot rebuild it.
    """

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    def __post_init__(self) -> None:
        value = self.max_value_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"RecordOptions.max_value_bytes must be an int >= 0, got {value!r}")


def record_options(record: object) -> RecordOptions | None:
    """``AgentConfig.record`` as options: ``None`` when recording is off."""
    if record is True:
        return RecordOptions()
    if record is False or record is None:
        return None
    if isinstance(record, RecordOptions):
        return record
    raise ValueError(
        f"AgentConfig.record must be a bool or a RecordOptions, got {type(record).__name__}"
    )


def _type_name(value: object) -> str:
    """A stand-in for a value with no JSON form: its type (never its ``repr``: no addresses)."""
    return f"<{type(value).__qualname__}>"


def jsonable(value: object) -> str:
    """``value`` as canonical JSON, Pydantic models and other rich values converted first.

    A part with no JSON form becomes ``"<TypeName>"`` (deterministic, unlike its ``repr``).
    """
    return canonical_json(to_jsonable_python(value, fallback=_type_name))


def result_json(value: object) -> str | None:
    """A tool's return value as canonical JSON (Pydantic's serialization); ``None``: it has none."""
    try:
        return canonical_json(to_jsonable_python(value))
    except (PydanticSerializationError, TypeError, ValueError):
        return None


def decoder_name(client: object) -> str:
    """How ``client`` decodes raw bodies (``RecordedModelCall.decoder``).

    Its wire shape's name, :data:`PLAIN_DECODER` for the default decoding, else its
    ``gen_ai_provider_name``.
    """
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
    memory: WorkingMemory | None
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
        """Record a call that reached the provider (``model``: the gateway that made it).

        ``request_json`` and ``request_digest``: the request as the call encoded it.
        """
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
        self, entity_key: bytes, seq: int, staged: StagedView, outcome: object, state: KeyState
    ) -> ActivationRecord:
        """The activation's record; called at commit, before any of its state is written.

        ``outcome`` is the agent's ``Complete`` or ``Suspend`` (told apart by its ``snapshot``:
        this module stays below ``core.agent`` in the import graph).
        """
        trace = staged.trace
        record = ActivationRecord(
            schema_version=RECORD_SCHEMA_VERSION,
            entity_key=entity_key,
            seq=seq,
            trigger=self.trigger,
            envelope=self.envelope,
            first_step=self.first_step,
            trace_sequence=trace.events[0].sequence if trace.events else 0,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            intents=staged.intents,
            intent_namespace=staged.namespace or "",
        )
        continuation = state.continuation
        if continuation is not None and self.trigger != "event":
            # Without its cache: that is rebuilt from the run's earlier records
            # (``replay.harness.cells_for``), so each response is recorded once.
            record.continuation_before.CopyFrom(continuation)
            record.continuation_before.ClearField("replay_cache")
        snapshot = getattr(outcome, "snapshot", None)
        if snapshot is None:
            record.outcome = ActivationRecord.COMPLETE
            record.output = getattr(outcome, "output", b"")
        else:
            record.outcome = ActivationRecord.SUSPEND
            record.snapshot = snapshot
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
