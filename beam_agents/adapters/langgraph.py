"""Run a LangGraph graph as a ``RunAgent`` agent: ``RunAgent(LangGraphAgent(build))``.

Every activation runs the graph from the run's starting checkpoint (the re-walk of
``beam_agents/adapters/README.md``): :class:`BeamChatModel` calls are ``ctx.call_model`` and
come back from the replay cache, :func:`beam_tools` run read-only registry tools inline and
stage side-effecting ones as intents, and an ``interrupt()`` of the graph becomes an approval
request whose decision resumes the graph with ``Command(resume=...)``. The thread's latest
checkpoint is kept in ``ctx.memory`` (one key, one thread) and written when a run completes.

The re-walk must take the same steps in the same order every time, so the adapter runs the
graph with ``max_concurrency=1``: the tasks of a superstep (parallel branches, ``Send``
fan-outs) run one after another, in LangGraph's own task order, never interleaved. Functional
API ``@task`` calls made from a task that shares its superstep with others are not supported
(with one task at a time the call would wait for its caller). Async and sync nodes both work:
LangGraph runs a sync node in a worker thread, where ``model.invoke`` and ``tool.invoke`` run
on the activation's event loop.

Only :class:`BeamChatModel` goes through ``ctx.call_model``. The adapter cannot see any other
chat model inside the graph: such a model calls its provider directly on every activation,
uncached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt

from beam_agents.adapters._bridge import (
    ActivationBridge,
    AdapterUsageError,
    Decision,
    FrameworkAgent,
    IntentFailedError,
    Pending,
)
from beam_agents.adapters._langgraph_checkpoint import (
    DEFAULT_CHECKPOINT_MAX_BYTES,
    MEMORY_SLOT,
    BeamCheckpointSaver,
    CheckpointTooLargeError,
)
from beam_agents.adapters._langgraph_model import BeamChatModel
from beam_agents.adapters._langgraph_tools import (
    PENDING_MARKER,
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
    """A LangGraph graph as a ``RunAgent`` agent (an ``async (ctx) -> Complete | Suspend``).

    The graph runs with ``max_concurrency=1``: parallel branches run one after another, in
    LangGraph's task order, so every re-walk takes its steps in the same order. Only
    :class:`BeamChatModel` is cached: any other chat model in the graph calls its provider
    directly on every activation, uncached.

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

    async def activate(self, bridge: ActivationBridge) -> Complete | Suspend:
        """One activation: re-walk the graph, answer its interrupts, finish or suspend."""
        ctx = bridge.ctx
        saver = BeamCheckpointSaver(thread_id_for(ctx.entity_key))
        saver.load(ctx.memory.get(MEMORY_SLOT))
        graph = self.built()
        if graph.checkpointer is not None:  # its own (or False, True): the adapter's instead
            graph = graph.copy(update={"checkpointer": None})
        # The saver goes in through the config, as LangGraph lends a parent's saver to a
        # subgraph: no copy of the graph per activation.
        configurable = {
            **(self._config.get("configurable") or {}),
            "thread_id": saver.thread_id,
            CONFIG_KEY_CHECKPOINTER: saver,
        }
        config: RunnableConfig = {**self._config, "configurable": configurable}  # type: ignore[typeddict-item]
        run = GraphRun(bridge, asyncio.get_running_loop())
        with bound_run(run):
            state = await self._drive(graph, config, run, self._input(bridge.event))
        if state is None:
            return bridge.suspend(timeout_ms=self._timeout_ms)
        outcome = bridge.finish(self._output(state), timeout_ms=self._timeout_ms)
        if isinstance(outcome, Complete):
            blob = saver.export(self._max_bytes)
            if blob is not None:
                ctx.memory.set(MEMORY_SLOT, blob)
        return outcome

    async def _drive(
        self, graph: AnyGraph, config: RunnableConfig, run: GraphRun, payload: Any
    ) -> Any:
        """Invoke the graph, resuming it while its interrupts have decisions.

        Returns the final state, or ``None`` when an intent or approval is still pending.
        """
        answered: set[str] = set()
        while True:
            run.restart()
            stopped, values, interrupts = await _run_graph(graph, payload, config)
            if len(interrupts) > 1:
                # Several questions at once: ask them in the order the saved state lists its
                # tasks (the graph's node order), not the order the tasks ran in.
                interrupts = list((await graph.aget_state(config)).interrupts)
            answers: dict[str, Any] = {}
            waiting = False
            for item in interrupts:
                if is_pending_marker(item.value):
                    waiting = True
                    continue
                if item.id in answered:
                    raise RuntimeError(f"interrupt {item.id} came back after it was answered")
                decision = run.bridge.request_approval(
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


_INTERRUPT = "__interrupt__"
"""The update key of a run's interrupts (LangGraph's private ``INTERRUPT`` constant)."""

_NOTHING: Any = object()
"""No ``values`` came out of the run (the adapter then reads the state back)."""


async def _run_graph(
    graph: AnyGraph, payload: Any, config: RunnableConfig
) -> tuple[bool, Any, list[Interrupt]]:
    """Run the graph once: whether it stopped early, its last values, its open interrupts.

    The run's own stream says all of it (as ``ainvoke`` reads it), so the state is not read
    back from the checkpoint: the ``values`` are the graph's state channels after the last
    step, and the interrupts the questions its last step raised, in the order its tasks ran
    (one at a time; :meth:`LangGraphAgent._drive` puts several in the state's order). An
    ``__interrupt__`` update, even an empty one (a static breakpoint), means the run stopped
    before the graph's end. Checkpoints are written when the run exits
    (``durability="exit"``), not after every step: only the last one is kept.
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
