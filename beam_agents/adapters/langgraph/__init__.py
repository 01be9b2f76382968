"""Run a LangGraph graph as a ``RunAgent`` agent: ``RunAgent(LangGraphAgent(build))``.

The thread's latest checkpoint is one ``ctx.memory`` slot, written when a run completes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import ormsgpack
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt

from beam_agents.adapters.base import (
    AdapterActivation,
    AdapterUsageError,
    Decision,
    FrameworkAgent,
    IntentFailedError,
    Pending,
)
from beam_agents.adapters.langgraph._calls import (
    PENDING_MARKER,
    BeamChatModel,
    BeamTool,
    GraphRun,
    beam_tools,
    bound_run,
    is_pending_marker,
    stage,
)
from beam_agents.core.agent import Complete, Suspend

__all__ = [
    "ADAPTER",
    "DEFAULT_CHECKPOINT_MAX_BYTES",
    "MEMORY_SLOT",
    "PENDING_MARKER",
    "AdapterUsageError",
    "BeamChatModel",
    "BeamCheckpointSaver",
    "BeamTool",
    "CheckpointTooLargeError",
    "Decision",
    "IntentFailedError",
    "LangGraphAgent",
    "Pending",
    "beam_tools",
    "default_input",
    "default_output",
    "stage",
    "thread_id_for",
]

ADAPTER = "beam_agents.adapters.langgraph"
"""The ``Suspend.adapter`` of this adapter's suspensions."""

MEMORY_SLOT = "beam_agents.langgraph.checkpoint"
"""The ``ctx.memory`` slot holding the key's latest LangGraph checkpoint."""

DEFAULT_CHECKPOINT_MAX_BYTES = 256 * 1024
"""How large the stored checkpoint may be unless ``checkpoint_max_bytes`` says otherwise."""

_FORMAT = b"beam-agents/langgraph-checkpoint/1"

_ROOT_NS = ""

_SERDE = JsonPlusSerializer()


AnyGraph = Pregel[Any, Any, Any, Any]
GraphSource = AnyGraph | StateGraph[Any, Any, Any, Any] | Callable[[], Any]


def thread_id_for(entity_key: bytes) -> str:
    """The LangGraph ``thread_id`` of a key: one key, one thread."""
    return "beam-agents:" + entity_key.hex()


def default_input(event: bytes) -> dict[str, Any]:
    """``{"messages": [HumanMessage(<the event as text>)]}``."""
    return {"messages": [HumanMessage(content=event.decode("utf-8"))]}


def default_output(state: Any) -> object:
    """The text of the last AI message in ``state["messages"]``."""
    messages = state.get("messages", ()) if isinstance(state, Mapping) else ()
    for message in reversed(list(messages)):
        if isinstance(message, AIMessage):
            return message.text
    raise ValueError("the graph's final state has no AI message; pass output= to LangGraphAgent")


def _approval_payload(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {"interrupt": value}


class LangGraphAgent(FrameworkAgent[AnyGraph]):
    """A LangGraph graph as a ``RunAgent`` agent, run with ``max_concurrency=1``.

    Args:
        graph: A zero-argument function returning the graph (a ``StateGraph`` or a compiled
            graph), built once per process; or the graph itself (then it must pickle).
            The adapter supplies the checkpointer.
        input: The graph input for the run's event (default :func:`default_input`).
        output: The run's answer from the final state (default :func:`default_output`):
            text becomes UTF-8, other values JSON.
        resume_value: What an ``interrupt()`` returns for a decision (default
            ``Decision.as_dict()``).
        checkpoint_max_bytes: The largest checkpoint kept in ``ctx.memory``; over it the
            activation fails with :class:`CheckpointTooLargeError`.
        config: Extra ``RunnableConfig`` for every graph run (``recursion_limit``, ...); it may
            not set ``thread_id`` nor a ``max_concurrency`` other than 1.
        suspend_timeout_ms: ``Suspend.timeout_ms`` of the adapter's suspensions.
    """

    adapter = ADAPTER

    def __init__(
        self,
        graph: GraphSource,
        *,
        input: Callable[[bytes], Any] = default_input,
        output: Callable[[Any], object] = default_output,
        resume_value: Callable[[Decision], Any] = Decision.as_dict,
        checkpoint_max_bytes: int = DEFAULT_CHECKPOINT_MAX_BYTES,
        config: Mapping[str, Any] | None = None,
        suspend_timeout_ms: int | None = None,
    ) -> None:
        if isinstance(checkpoint_max_bytes, bool) or not isinstance(checkpoint_max_bytes, int):
            raise TypeError("checkpoint_max_bytes must be an int")
        if checkpoint_max_bytes <= 0:
            raise ValueError(f"checkpoint_max_bytes must be > 0, got {checkpoint_max_bytes}")
        if not isinstance(graph, Pregel | StateGraph) and not callable(graph):
            raise TypeError(f"graph must be a graph or a function building one, got {graph!r}")
        extra = dict(config or {})
        if "thread_id" in (extra.get("configurable") or {}):
            raise ValueError("config may not set thread_id: the adapter derives it from the key")
        if extra.get("max_concurrency", 1) != 1:
            raise ValueError(
                "config may not set max_concurrency: the adapter runs a superstep's tasks one "
                "at a time, so that every re-walk takes the same steps in the same order"
            )
        super().__init__(graph)  # type: ignore[arg-type]  # build() compiles a StateGraph
        self._input = input
        self._output = output
        self._resume_value = resume_value
        self._max_bytes = checkpoint_max_bytes
        self._config = {**extra, "max_concurrency": 1}
        self._timeout_ms = suspend_timeout_ms

    def graph(self) -> AnyGraph:
        """The compiled graph (built on first use, without a checkpointer of its own)."""
        return self.built()

    def build(self, source: Any) -> AnyGraph:
        """The compiled graph from ``source`` (a graph, or a function returning one)."""
        built = source if isinstance(source, Pregel | StateGraph) else source()
        if isinstance(built, StateGraph):
            built = built.compile()
        if not isinstance(built, Pregel):
            raise TypeError(
                f"the graph builder returned {type(built).__name__}, not a StateGraph "
                "or a compiled graph"
            )
        return built

    async def activate(self, activation: AdapterActivation) -> Complete | Suspend:
        """One activation: re-walk the graph, answer its interrupts, finish or suspend."""
        ctx = activation.ctx
        saver = BeamCheckpointSaver(thread_id_for(ctx.entity_key))
        saver.load(ctx.memory.get(MEMORY_SLOT))
        graph = self.built()
        if graph.checkpointer is not None:  # its own (or False, True): the adapter's instead
            graph = graph.copy(update={"checkpointer": None})
        # The saver goes in through the config, so the graph is not copied per activation.
        configurable = {
            **(self._config.get("configurable") or {}),
            "thread_id": saver.thread_id,
            CONFIG_KEY_CHECKPOINTER: saver,
        }
        config: RunnableConfig = {**self._config, "configurable": configurable}  # type: ignore[typeddict-item]
        run = GraphRun(activation, asyncio.get_running_loop())
        with bound_run(run):
            state = await self._drive(graph, config, run, self._input(activation.event))
        if state is None:
            return activation.suspend(timeout_ms=self._timeout_ms)
        outcome = activation.finish(self._output(state), timeout_ms=self._timeout_ms)
        if isinstance(outcome, Complete):
            blob = saver.export(self._max_bytes)
            if blob is not None:
                ctx.memory.set(MEMORY_SLOT, blob)
        return outcome

    async def _drive(
        self, graph: AnyGraph, config: RunnableConfig, run: GraphRun, payload: Any
    ) -> Any:
        """Invoke the graph, resuming it while its interrupts have decisions; ``None``: pending."""
        answered: set[str] = set()
        while True:
            run.restart()
            stopped, values, interrupts = await _run_graph(graph, payload, config)
            if len(interrupts) > 1:  # ask several in the graph's node order, not run order
                interrupts = list((await graph.aget_state(config)).interrupts)
            answers: dict[str, Any] = {}
            waiting = False
            for item in interrupts:
                if is_pending_marker(item.value):
                    waiting = True
                    continue
                if item.id in answered:
                    raise RuntimeError(f"interrupt {item.id} came back after it was answered")
                decision = run.activation.request_approval(
                    _approval_payload(item.value), call_key=("interrupt", item.id)
                )
                if isinstance(decision, Pending):
                    waiting = True
                else:
                    answers[item.id] = self._resume_value(decision)
            if answers:
                answered.update(answers)
                payload = Command(resume=answers)
                continue
            if waiting:
                return None
            if stopped or values is _NOTHING:
                snapshot = await graph.aget_state(config)
                if snapshot.next:
                    raise AdapterUsageError(
                        f"the graph stopped before {list(snapshot.next)} without an "
                        "interrupt(): static breakpoints (interrupt_before/after) are not "
                        "supported; call interrupt() in the node instead"
                    )
                return snapshot.values
            return values


_INTERRUPT = "__interrupt__"  # LangGraph's private ``INTERRUPT`` constant
_NOTHING: Any = object()


async def _run_graph(
    graph: AnyGraph, payload: Any, config: RunnableConfig
) -> tuple[bool, Any, list[Interrupt]]:
    """Run the graph once: whether it stopped early, its last values, its open interrupts.

    An ``__interrupt__`` update, even an empty one (a static breakpoint), means it stopped early.
    """
    stopped = False
    values: Any = _NOTHING
    interrupts: list[Interrupt] = []
    seen: set[str] = set()
    async for mode, chunk in graph.astream(
        payload, config, stream_mode=["updates", "values"], durability="exit"
    ):
        if mode == "values":
            values = chunk
        elif isinstance(chunk, dict) and (raised := chunk.get(_INTERRUPT)) is not None:
            stopped = True
            for item in raised:
                if item.id not in seen:
                    seen.add(item.id)
                    interrupts.append(item)
    return stopped, values, interrupts


# -- the checkpoint in ctx.memory ---------------------------------------------------------
class CheckpointTooLargeError(ValueError):
    """The thread's checkpoint is over ``checkpoint_max_bytes``: the activation fails."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the LangGraph checkpoint of this key is {size} bytes, over checkpoint_max_bytes="
            f"{limit}; trim the graph state (e.g. RemoveMessage) or raise the limit"
        )
        self.size = size
        self.limit = limit


class BeamCheckpointSaver(InMemorySaver):
    """An activation's checkpointer: LangGraph's in-memory saver; only :meth:`export` leaves it."""

    def __init__(self, thread_id: str) -> None:
        # ``InMemorySaver.__init__`` less its costly check that the serde has typed methods.
        self.serde = _SERDE
        self.storage = defaultdict(lambda: defaultdict(dict))
        self.writes = defaultdict(dict)
        self.blobs = defaultdict()
        self.stack = ExitStack()
        self.thread_id = thread_id

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The in-memory saver's ``put_writes`` (its signature is cached, see below)."""
        super().put_writes(config, writes, task_id, task_path)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The in-memory saver's ``aput_writes`` (its signature is cached, see below)."""
        InMemorySaver.put_writes(self, config, writes, task_id, task_path)

    def load(self, blob: bytes | None) -> None:
        """Put the checkpoint :meth:`export` wrote (``None``: a fresh thread) into the saver."""
        if not blob:
            return
        header, _, rest = blob.partition(b"\n")
        if header != _FORMAT:
            raise ValueError(f"memory slot {MEMORY_SLOT!r} does not hold a LangGraph checkpoint")
        self._load_pieces(rest)

    def export(self, max_bytes: int) -> bytes | None:
        """The thread's latest root checkpoint as bytes (``None`` if there is none)."""
        checkpoints = self.storage[self.thread_id][_ROOT_NS]
        if not checkpoints:
            return None
        checkpoint_id = max(checkpoints)
        checkpoint, metadata, _ = checkpoints[checkpoint_id]
        versions = self.serde.loads_typed(checkpoint)["channel_versions"]
        blobs = self.blobs
        values = [
            [channel, version, *stored]
            for channel, version in versions.items()
            if (stored := blobs.get((self.thread_id, _ROOT_NS, channel, version))) is not None
        ]
        writes = [
            [*inner_key, channel, *value, task_path]
            for inner_key, (_, channel, value, task_path) in self.writes.get(
                (self.thread_id, _ROOT_NS, checkpoint_id), {}
            ).items()
        ]
        packed = ormsgpack.packb([checkpoint_id, [*checkpoint], [*metadata], values, writes])
        blob = _FORMAT + b"\n" + packed
        if len(blob) > max_bytes:
            raise CheckpointTooLargeError(len(blob), max_bytes)
        return blob

    def _load_pieces(self, packed: bytes) -> None:
        """Load :meth:`export`'s pieces as they are: serialized, as the saver keeps them."""
        checkpoint_id, checkpoint, metadata, values, writes = ormsgpack.unpackb(packed)
        thread_id = self.thread_id
        self.storage[thread_id][_ROOT_NS][checkpoint_id] = (
            (checkpoint[0], checkpoint[1]),
            (metadata[0], metadata[1]),
            None,
        )
        for channel, version, type_name, data in values:
            self.blobs[(thread_id, _ROOT_NS, channel, version)] = (type_name, data)
        if writes:
            stored = self.writes[(thread_id, _ROOT_NS, checkpoint_id)]
            for task_id, index, channel, type_name, data, task_path in writes:
                stored[(task_id, index)] = (task_id, channel, (type_name, data), task_path)


# LangGraph inspects these signatures on every run; a cached ``__signature__`` answers at once.
_method: Any
for _method in (BeamCheckpointSaver.put_writes, BeamCheckpointSaver.aput_writes):
    _method.__signature__ = inspect.signature(_method)
