"""Re-running an agent offline: a key's state in memory, its calls answered from records.

Replay answers only with the record's own calls (``Recorded*``); backtest answers from the
key's records and sends the rest to the candidate's provider (``Pooled*``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    RecordedModelCall,
    RecordedToolCall,
)
from beam_agents.core.activation import Activator, Plan
from beam_agents.core.agent import CoroutineDriver, epoch_clock
from beam_agents.core.config import AgentConfig
from beam_agents.core.context import ActivationContext, AgentFn, staged
from beam_agents.core.model_calls import CACHE_SCHEMA_VERSION, ModelGateway, cache_key_for_digest
from beam_agents.core.observability import PLAIN_DECODER, decoder_name, jsonable
from beam_agents.core.staging import Staged, activation_services
from beam_agents.core.state import (
    CONTINUATION_SCHEMA_VERSION,
    HEADER_SCHEMA_VERSION,
    MEMORY_SCHEMA_VERSION,
    KeyState,
)
from beam_agents.model.client import (
    LlmRequest,
    LlmResponse,
    ModelClient,
    ProviderRequestError,
    TokenUsage,
    as_model_client,
    decode_plain,
)
from beam_agents.replay.inputs import BadInput
from beam_agents.tools import Tool, ToolRunner
from beam_agents.tools.errors import SideEffectToolError, ToolError


class Unanswerable(ProviderRequestError):
    """Raised into the agent for a model or tool call its record cannot answer."""


class UnanswerableTool(ToolError):
    """Raised into the agent for a tool call its record cannot answer."""


class RecordedToolFailure(Exception):
    """A tool call that raised when it was recorded, raised again (its type and message)."""


@dataclass(frozen=True)
class Miss:
    """A call the record could not answer; ``recorded``: its call there (``None``: drift)."""

    kind: str
    name: str
    content: str
    recorded: RecordedModelCall | RecordedToolCall | None
    position: int
    step: int | None = None

    @property
    def drift(self) -> bool:
        """Whether the record simply has nothing more to answer with."""
        return self.recorded is None


class Progress:
    """Where the running activation is: its next call's place, its last model call's step."""

    def __init__(self) -> None:
        self.position: Callable[[], int] = lambda: 0
        self.step: Callable[[], int | None] = lambda: None

    def model_miss(self, name: str, content: str, recorded: RecordedModelCall | None) -> Miss:
        """A model call nobody answers, where the activation is now."""
        return Miss("model", name, content, recorded, self.position(), self.step())


def check_records(records: Iterable[ActivationRecord], decoder: str, namespace: str | None) -> None:
    """Refuse (:class:`BadInput`) records the config's decoder and namespace cannot replay."""
    for record in records:
        if namespace is not None and record.intent_namespace != namespace:
            raise BadInput(
                f"the records mint intent ids in namespace {record.intent_namespace!r}, the "
                f"config in {namespace!r}: use the recording's config (or one without a namespace)"
            )
        for call in record.model_calls:
            if call.decoder and call.decoder != decoder:
                have = "no provider" if decoder == PLAIN_DECODER else f"a {decoder!r} provider"
                raise BadInput(
                    f"the recorded model responses are {call.decoder!r} bodies and the config has "
                    f"{have}: pass --config MODULE:FACTORY whose provider_factory decodes them "
                    "(the recording's)"
                )


class _Decoding(ModelClient):
    """Decodes raw bodies as the production client would (``decoder``), never calling it."""

    needs_asyncio_task = False

    def __init__(self, decoder: object | None) -> None:
        self._decoder = None if decoder is None else as_model_client(decoder)
        self.model = "" if self._decoder is None else self._decoder.model
        self.decoder_name = PLAIN_DECODER if decoder is None else decoder_name(decoder)

    @property
    def gen_ai_provider_name(self) -> str:
        decoder = self._decoder
        return "replay" if decoder is None else decoder.gen_ai_provider_name

    def decode(self, raw: bytes) -> LlmResponse:
        return decode_plain(raw) if self._decoder is None else self._decoder.decode(raw)

    def answer(self, call: RecordedModelCall) -> LlmResponse:
        response = self.decode(call.response)
        usage = TokenUsage(input_tokens=call.input_tokens, output_tokens=call.output_tokens)
        return dataclasses.replace(response, usage=usage)


class RecordedModel(_Decoding):
    """Replay: the activation's k-th fresh call is answered by the record's k-th, if equal."""

    def __init__(self, decoder: object | None, progress: Progress) -> None:
        super().__init__(decoder)
        self._progress = progress
        self._calls: Sequence[RecordedModelCall] = ()
        self._next = 0
        self.miss: Miss | None = None

    def start(self, record: ActivationRecord) -> None:
        """Answer the activation of ``record`` next."""
        self._calls = record.model_calls
        self._next = 0
        self.miss = None

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """The recorded response, or :class:`Unanswerable`."""
        at = self._next
        recorded = self._calls[at] if at < len(self._calls) else None
        if recorded is None or recorded.request_digest != request.content_digest():
            content = request.canonical_json()
            self.miss = self._progress.model_miss(request.model_id, content, recorded)
            raise Unanswerable(f"the record has no answer for model call {at + 1}")
        self._next = at + 1
        return self.answer(recorded)


class RecordedTools(ToolRunner):
    """Replay: a tool call is answered by the activation's recorded call with the same arguments."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._calls: list[RecordedToolCall] = []
        self._used: set[int] = set()
        self.miss: Miss | None = None
        self.unrecorded: RecordedToolCall | None = None  # a match whose result had no JSON form

    def start(self, record: ActivationRecord) -> None:
        """Answer the activation of ``record`` next."""
        self._calls = list(record.tool_calls)
        self._used = set()
        self.miss = None
        self.unrecorded = None

    async def run(self, tool: Tool[..., Any], arguments: Mapping[str, Any]) -> Any:
        """The recorded result (or failure) of ``tool`` on ``arguments``."""
        checked_arguments(tool, arguments)
        args_json = jsonable(dict(arguments))
        for at, call in enumerate(self._calls):
            if at not in self._used and call.tool_name == tool.name and call.args_json == args_json:
                self._used.add(at)
                if call.unrecorded_result_type:
                    self.unrecorded = call
                    raise UnanswerableTool(f"tool call {tool.name!r}: its result was not recorded")
                return recorded_result(call, tool)
        position = len(self._used)
        recorded = self._calls[position] if position < len(self._calls) else None
        self.miss = Miss("tool", tool.name, args_json, recorded, self._progress.position())
        raise UnanswerableTool(f"the record has no answer for tool call {tool.name!r}")


def checked_arguments(tool: Tool[..., Any], arguments: Mapping[str, Any]) -> None:
    """Refuse what ``ToolRunner.run`` refuses: side-effecting tools and invalid arguments."""
    if tool.side_effect:
        raise SideEffectToolError.for_tool(tool.name)
    tool.validate_arguments(arguments)


def recorded_result(call: RecordedToolCall, tool: Tool[..., Any]) -> Any:
    """The value a recorded tool call returned (``tool.decode_result``), or its failure raised."""
    if call.error_type:
        raise RecordedToolFailure(f"{call.error_type}: {call.error_message}")
    return tool.decode_result(call.result_json)


@dataclass
class Usage:
    """Backtest model calls answered from the record and sent to the provider, with tokens."""

    reused: int = 0
    new: int = 0
    new_tool_calls: int = 0
    tokens: dict[str, list[int]] | None = None  # model name to [input, output] tokens

    def spend(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """Count one call's tokens under ``model``."""
        if self.tokens is None:
            self.tokens = {}
        spent = self.tokens.setdefault(model, [0, 0])
        spent[0] += input_tokens
        spent[1] += output_tokens


class PooledModel(_Decoding):
    """Backtest: a request the key's records made is answered from them; others go on."""

    def __init__(self, provider: object | None, progress: Progress, *, strict: bool) -> None:
        super().__init__(provider)
        self._provider = None if provider is None else as_model_client(provider)
        self.needs_asyncio_task = self._provider is not None and self._provider.needs_asyncio_task
        self._progress = progress
        self._strict = strict
        self._pool: dict[str, deque[RecordedModelCall]] = {}
        self.usage = Usage()
        self.miss: Miss | None = None

    def start_key(self, records: Iterable[ActivationRecord]) -> None:
        """Answer from the calls of ``records`` (one key's) from now on."""
        self._pool = {}
        for record in records:
            for call in record.model_calls:
                self._pool.setdefault(call.request_digest, deque()).append(call)

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """The recorded response, else the provider's (:class:`Unanswerable` when strict)."""
        queue = self._pool.get(request.content_digest())
        model = request.model_id or self.model
        if queue:
            call = queue.popleft()
            self.usage.reused += 1
            self.usage.spend(call.model or model, call.input_tokens, call.output_tokens)
            return self.answer(call)
        if self._strict or self._provider is None:
            self.miss = self._progress.model_miss(model, request.canonical_json(), None)
            why = "--strict" if self._strict else "the candidate's config has no provider_factory"
            raise Unanswerable(f"a new model request, and {why}")
        response = await self._provider.complete(request)
        self.usage.new += 1
        self.usage.spend(model, response.usage.input_tokens, response.usage.output_tokens)
        return response

    async def aclose(self) -> None:
        """Close the candidate's provider."""
        if self._provider is not None:
            await self._provider.aclose()


class PooledTools(ToolRunner):
    """Backtest: a tool call the key's records made is answered from them; others run."""

    def __init__(self, usage: Usage, progress: Progress, *, strict: bool) -> None:
        self.usage = usage
        self._progress = progress
        self._strict = strict
        self._pool: dict[tuple[str, str], deque[RecordedToolCall]] = {}
        self.miss: Miss | None = None

    def start_key(self, records: Iterable[ActivationRecord]) -> None:
        """Answer from the tool calls of ``records`` (one key's) from now on."""
        self._pool = {}
        for record in records:
            for call in record.tool_calls:
                if not call.unrecorded_result_type:  # no result to answer with: the tool runs
                    self._pool.setdefault((call.tool_name, call.args_json), deque()).append(call)

    async def run(self, tool: Tool[..., Any], arguments: Mapping[str, Any]) -> Any:
        """The recorded result, else the read-only tool run now (refused when strict)."""
        checked_arguments(tool, arguments)
        args_json = jsonable(dict(arguments))
        queue = self._pool.get((tool.name, args_json))
        if queue:
            return recorded_result(queue.popleft(), tool)
        if self._strict:
            self.miss = Miss("tool", tool.name, args_json, None, self._progress.position())
            raise UnanswerableTool(f"a new call of tool {tool.name!r}, and --strict")
        self.usage.new_tool_calls += 1
        return await super().run(tool, arguments)


# -- a key's state in memory, and the offline activator -----------------------------------
TRIGGER_EVENT = "event"
CLOSE_TIMEOUT_S = 30.0


class _Bag:
    """A bag cell, readable and writable as Beam's bag state is."""

    __slots__ = ("elements",)

    def __init__(self) -> None:
        self.elements: list[bytes] = []

    def read(self) -> list[bytes]:
        return list(self.elements)

    def add(self, value: bytes) -> None:
        self.elements.append(value)

    def clear(self) -> None:
        self.elements = []


class KeyCells:
    """One key's state cells, in memory: the header bag and the memory bag."""

    def __init__(self) -> None:
        self.header = _Bag()
        self.memory = _Bag()

    def state(self) -> KeyState:
        """A fresh ``KeyState`` over the cells, for one element (as ``process`` binds them)."""
        return KeyState(self.header, self.memory)

    @property
    def continuation(self) -> Continuation | None:
        """The suspended run's continuation, if any."""
        return self.state().continuation

    def set_header(self, next_seq: int, continuation: bytes = b"") -> None:
        """Store a header saying the key's next seq and its suspended run, if any."""
        header = KeyHeader(
            schema_version=HEADER_SCHEMA_VERSION, next_seq=next_seq, continuation=continuation
        )
        self.header.elements = [header.SerializeToString()]

    def end_run(self, next_seq: int) -> None:
        """Forget the suspended run and its buffered events; the next run takes ``next_seq``."""
        self.set_header(next_seq)


def memory_blob(recorded: RecordedMemory, seq: int) -> bytes | None:
    """The ``MemoryState`` a recorded memory (of run ``seq``) rebuilds, if every slot was kept."""
    lost = [entry.key for entry in recorded.slots if not entry.HasField("slot")]
    if lost:
        raise BadInput(
            f"cannot rebuild memory for seq {seq}: slot {lost[0]!r} was recorded by digest only "
            "(raise RecordOptions.max_value_bytes when recording)"
        )
    slots = [entry.slot for entry in recorded.slots]
    if not slots:
        return None
    state = MemoryState(schema_version=MEMORY_SCHEMA_VERSION, slots=slots)
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

    ``earlier`` fill the replay cache; ``memory`` serves when ``record`` recorded none.
    """
    cells = KeyCells()
    resumed = record.trigger != TRIGGER_EVENT and record.HasField("continuation_before")
    if resumed:
        continuation = Continuation()
        continuation.CopyFrom(record.continuation_before)
        continuation.replay_cache = cache_blob(earlier) or b""
        continuation.schema_version = CONTINUATION_SCHEMA_VERSION
        cells.set_header(record.seq + 1, continuation.SerializeToString(deterministic=True))
    else:
        cells.set_header(record.seq)
    known = record.memory_before if record.memory_before.known else memory
    blob = None if known is None else memory_blob(known, record.seq)
    cells.memory.elements = [] if blob is None else [blob]
    return cells


def last_memory(
    records: Sequence[ActivationRecord], memory: RecordedMemory | None = None
) -> RecordedMemory | None:
    """The key's memory as last known after ``records`` (``memory``: before them)."""
    for record in records:
        if record.memory_after.known:
            memory = record.memory_after
    return memory


class OfflineActivator:
    """An ``Activator`` for one agent and config over :class:`KeyCells`, recording everything."""

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
        """Run one envelope against ``cells`` and apply its state (``namespace``: the record's)."""
        self.staged = None
        chosen = namespace or self._config.namespace
        activator = self._activators.get(chosen)
        if activator is None:
            activator = self._activators[chosen] = self._activator_for(chosen)
        state = cells.state()
        plan = activator.activate(key, envelope, state)
        state.commit()
        return plan

    def close(self) -> None:
        """Close the model client (a candidate's provider), then the event loop."""
        try:
            self._driver.run(self._gateway.aclose(), CLOSE_TIMEOUT_S)
        finally:
            self._driver.close()
