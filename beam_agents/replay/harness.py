"""Running an agent over recorded envelopes through the Beam-free core, on in-memory state.

:class:`KeyCells` is one key's state cells in memory (what the ``DoFn``'s Beam state holds);
:func:`cells_for` rebuilds them from a record: the key's next seq, its memory, the suspended
run's continuation and replay cache. :class:`Harness` runs the ``Activator`` over them with a
model client and tool runner that answer from records, recording every activation, on the
processing clock that starts at the epoch (a recorded deadline is never past).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    Continuation,
    KeyHeader,
    MemoryState,
    ModelCache,
    ModelCacheEntry,
    RecordedMemory,
)
from beam_agents.core.activation import Activator
from beam_agents.core.agent import AgentFn
from beam_agents.core.bridge import CoroutineDriver
from beam_agents.core.clocks import epoch_clock
from beam_agents.core.config import AgentConfig
from beam_agents.core.context import ActivationContext, staged
from beam_agents.core.memory import WHOLE_VERSION
from beam_agents.core.model_gateway import ModelGateway
from beam_agents.core.plan import Plan
from beam_agents.core.services import activation_services
from beam_agents.core.staging import Staged
from beam_agents.core.state import (
    CONTINUATION,
    HEADER,
    HEADER_SCHEMA_VERSION,
    MEMORY,
    KeyState,
    continuation_version,
)
from beam_agents.model.cache import CACHE_SCHEMA_VERSION, cache_key_for_digest
from beam_agents.model.client import ModelClient
from beam_agents.replay.answers import Progress
from beam_agents.replay.loading import BadInput
from beam_agents.tools import ToolRunner

TRIGGER_EVENT = "event"
CLOSE_TIMEOUT_S = 30.0


class _Cell:
    """A value cell (bytes or ``None``; the memory's: its elements), readable as Beam's state is."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def read(self) -> Any:
        return self.value


class _MemoryBag(_Cell):
    """The memory's cell: a bag, whose elements :attr:`value` holds (``None``: empty)."""

    def read(self) -> list[bytes]:
        return list(self.value or ())


class _Bag:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def read(self) -> list[bytes]:
        return list(self.items)


class KeyCells:
    """One key's state cells, in memory: header, memory, continuation and buffer.

    The replay cache is in the continuation; the old ``cache`` cell keeps its number, unused.
    """

    def __init__(self) -> None:
        self.cells = (_Cell(), _MemoryBag(), _Cell(), _Cell())  # numbered as state.HEADER, ...
        self.buffer = _Bag()

    def state(self) -> KeyState:
        """A fresh ``KeyState`` over the cells, for one element (as ``process`` binds them)."""
        header, memory, _, continuation = self.cells
        return KeyState(header, memory, None, continuation, self.buffer)

    def apply(self, state: KeyState) -> None:
        """Write what ``state`` recorded (what the ``DoFn`` does with a plan's state)."""
        for cell, value in state.writes.items():
            self.cells[cell].value = value
        if state.buffer_reset:
            self.buffer.items = []
        self.buffer.items.extend(state.buffer_added)

    @property
    def continuation(self) -> Continuation | None:
        """The suspended run's continuation, if any."""
        return self.state().continuation

    def set_header(self, next_seq: int, suspended: bool) -> None:
        """Store a header saying the key's next seq and whether it is suspended."""
        header = KeyHeader(
            schema_version=HEADER_SCHEMA_VERSION, next_seq=next_seq, suspended=suspended
        )
        self.cells[HEADER].value = header.SerializeToString()

    def end_run(self, next_seq: int) -> None:
        """Forget the suspended run (its continuation); the next run takes ``next_seq``."""
        self.cells[CONTINUATION].value = None
        self.buffer.items = []
        self.set_header(next_seq, suspended=False)


def memory_blob(recorded: RecordedMemory, seq: int) -> bytes | None:
    """The ``MemoryState`` a recorded memory (of run ``seq``) rebuilds.

    A slot recorded by digest only (over ``max_value_bytes``) cannot be rebuilt: :class:`BadInput`.
    """
    lost = [entry.key for entry in recorded.slots if not entry.HasField("slot")]
    if lost:
        raise BadInput(
            f"cannot rebuild memory for seq {seq}: slot {lost[0]!r} was recorded by digest only "
            "(raise RecordOptions.max_value_bytes when recording)"
        )
    slots = [entry.slot for entry in recorded.slots]
    if not slots:
        return None
    state = MemoryState(schema_version=WHOLE_VERSION, slots=slots)
    return state.SerializeToString(deterministic=True)


def cache_blob(earlier: Sequence[ActivationRecord]) -> bytes | None:
    """The replay cache a run's earlier activations (``earlier``) left: their fresh calls."""
    entries = [
        ModelCacheEntry(
            cache_key=cache_key_for_digest(
                call.request_digest, record.entity_key, record.seq, call.step_index
            ),
            seq=record.seq,
            step_index=call.step_index,
            response=call.response,
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            stored_at_ms=record.envelope.event_time_ms,
        )
        for record in earlier
        for call in record.model_calls
    ]
    if not entries:
        return None
    return ModelCache(schema_version=CACHE_SCHEMA_VERSION, entries=entries).SerializeToString()


def cells_for(
    record: ActivationRecord, earlier: Sequence[ActivationRecord], memory: RecordedMemory | None
) -> KeyCells:
    """The key's state just before ``record``'s activation, rebuilt from the recording.

    ``earlier``: the run's activations before it (their calls fill the replay cache);
    ``memory``: the key's memory as last known, used when ``record`` did not record its own.
    """
    cells = KeyCells()
    resumed = record.trigger != TRIGGER_EVENT and record.HasField("continuation_before")
    cells.set_header(record.seq + 1 if resumed else record.seq, suspended=resumed)
    if resumed:
        continuation = Continuation()
        continuation.CopyFrom(record.continuation_before)
        continuation.replay_cache = cache_blob(earlier) or b""
        continuation.schema_version = continuation_version(continuation)
        cells.cells[CONTINUATION].value = continuation.SerializeToString(deterministic=True)
    known = record.memory_before if record.memory_before.known else memory
    blob = None if known is None else memory_blob(known, record.seq)
    cells.cells[MEMORY].value = None if blob is None else [blob]
    return cells


def last_memory(
    records: Sequence[ActivationRecord], memory: RecordedMemory | None = None
) -> RecordedMemory | None:
    """The key's memory as last known after ``records`` (``memory``: before them)."""
    for record in records:
        if record.memory_after.known:
            memory = record.memory_after
    return memory


class Harness:
    """An ``Activator`` for one agent and config over :class:`KeyCells`, recording everything.

    ``model`` and ``tools`` answer the agent's calls; ``retry`` keeps the config's model retry
    policy (for a real provider behind ``model``). :attr:`staged` is the last activation's
    staged record, kept even when it failed.
    """

    def __init__(
        self,
        agent: AgentFn,
        config: AgentConfig,
        model: ModelClient,
        tools: ToolRunner,
        progress: Progress,
        *,
        retry: bool = False,
    ) -> None:
        record = config.record if config.record is not False else True
        config = dataclasses.replace(
            config, processing_clock=epoch_clock, before_commit=None, record=record
        )
        self._driver = CoroutineDriver()
        gateway = self._gateway = ModelGateway(
            model, retry_policy=config.model_retry if retry else None
        )
        self._services = activation_services(config, gateway, tools, self._driver.time_left_s)
        self.staged: Staged | None = None

        @functools.wraps(agent)
        async def watched(ctx: ActivationContext) -> Any:
            self.staged = staged(ctx)
            return await agent(ctx)

        self._watched, self._config = watched, config
        self._activators = {config.namespace: self._activator_for(config.namespace)}
        progress.position = self.position
        progress.step = self.step

    @property
    def namespace(self) -> str | None:
        """The config's intent namespace."""
        return self._config.namespace

    def _activator_for(self, namespace: str | None) -> Activator:
        services = dataclasses.replace(self._services, intent_namespace=namespace)
        return Activator(self._watched, self._config, services, self._driver.run)

    def position(self) -> int:
        """The place the running activation's next call takes."""
        current = self.staged
        if current is None or current.recording is None:
            return 0
        return current.recording.position(len(current.intents))

    def step(self) -> int | None:
        """The step the running activation's last model call took (the cursor moved past it)."""
        current = self.staged
        return None if current is None else current.cursor.next_step - 1

    def element(
        self, cells: KeyCells, key: bytes, envelope: AgentEnvelope, namespace: str = ""
    ) -> Plan:
        """Run one envelope against ``cells`` and apply the state it commits.

        ``namespace``: the intent namespace a new run mints its ids in (a record's
        ``intent_namespace``); empty: the config's.
        """
        self.staged = None
        chosen = namespace or self._config.namespace
        activator = self._activators.get(chosen)
        if activator is None:
            activator = self._activators[chosen] = self._activator_for(chosen)
        state = cells.state()
        plan = activator.on_element(key, envelope, state)
        cells.apply(state)
        return plan

    def close(self) -> None:
        """Close the model client (a candidate's provider), then the event loop."""
        try:
            self._driver.run(self._gateway.aclose(), CLOSE_TIMEOUT_S)
        finally:
            self._driver.close()
