"""Run a Pydantic AI agent as a ``RunAgent`` agent: ``RunAgent(PydanticAIAgent(build, ...))``.

The key's message history is one ``ctx.memory`` slot, written when a run completes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic_ai import Agent, ModelMessagesTypeAdapter, RunContext
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability, CombinedCapability, ToolSearch
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from beam_agents.adapters.base import (
    AdapterActivation,
    AdapterUsageError,
    Decision,
    FrameworkAgent,
    Pending,
    current_activation,
    utf8_prompt,
    warn_outside_registry,
)
from beam_agents.adapters.pydantic_ai._calls import (
    INTENT_METADATA_KEY,
    ApprovalRule,
    BeamModel,
    BeamToolset,
    UnsupportedContentError,
    beam_toolset,
    call_key,
)
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import WorkingMemory
from beam_agents.core.state import MEMORY_CAP_BYTES

__all__ = [
    "ADAPTER",
    "HISTORY_SLOT",
    "AdapterUsageError",
    "ApprovalRule",
    "BeamModel",
    "BeamToolset",
    "HistoryTooLargeError",
    "PydanticAIAdapterError",
    "PydanticAIAgent",
    "UnsupportedContentError",
    "beam_toolset",
    "denial_message",
    "utf8_prompt",
]

ADAPTER = "beam_agents.adapters.pydantic_ai"
"""The ``Suspend.adapter`` of this adapter's suspensions."""

_log = logging.getLogger(__name__)

AgentBuilder = Callable[[], AbstractAgent[Any, Any]]


class PydanticAIAdapterError(RuntimeError):
    """The agent ended in a way the adapter cannot continue (e.g. a foreign deferred call)."""


class PydanticAIAgent(FrameworkAgent[AbstractAgent[Any, Any]]):
    """A Pydantic AI agent as a ``RunAgent`` agent.

    Args:
        agent: A zero-argument function returning the ``pydantic_ai.Agent`` (built once per
            process; preferred, as ``RunAgent`` pickles this object), or an ``Agent`` that
            pickles.
        model_id: The ``LlmRequest.model_id`` of the run's model calls; the agent's own model
            is replaced by :class:`BeamModel` for every run, unless it is Pydantic AI's
            ``TestModel`` or ``FunctionModel``, which answer locally, uncached.
        prompt: The user prompt for an event (default: the event as UTF-8).
        deps: The run's ``deps`` from the event (default: none).
        toolsets: Toolsets added to every run (default: one :class:`BeamToolset` over
            ``AgentConfig.tool_registry``; pass ``()`` when the agent carries its own).
        sampling_params: Provider-native sampling fields sent with every model call.
        history_max_messages: Messages of the key's history kept across runs (0: none).
        history_max_bytes: Hard limit on the stored history (:class:`HistoryTooLargeError`).
        suspend_timeout_ms: ``Suspend.timeout_ms`` of the run's suspensions.
        max_approval_rounds: Most approval resumes within one activation.
    """

    adapter: ClassVar[str] = ADAPTER
    _not_pickled: ClassVar[dict[str, Any]] = {"_options": None}

    def __init__(
        self,
        agent: AbstractAgent[Any, Any] | AgentBuilder,
        *,
        model_id: str,
        prompt: Callable[[bytes], str] = utf8_prompt,
        deps: Callable[[bytes], Any] | None = None,
        toolsets: Sequence[AbstractToolset[Any]] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        history_max_messages: int = 40,
        history_max_bytes: int = 256 * 1024,
        suspend_timeout_ms: int | None = None,
        max_approval_rounds: int = 16,
    ) -> None:
        if isinstance(agent, AbstractAgent):
            _check_pickles(agent)
        elif not callable(agent):
            raise TypeError(
                f"PydanticAIAgent takes a pydantic_ai Agent or a zero-argument function "
                f"returning one, got {type(agent).__name__}"
            )
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"PydanticAIAgent needs a model_id, got {model_id!r}")
        super().__init__(agent)
        self._model_id = model_id
        self._prompt = prompt
        self._deps = deps
        self._toolsets: tuple[AbstractToolset[Any], ...] = (
            (BeamToolset(),) if toolsets is None else tuple(toolsets)
        )
        self._sampling_params = dict(sampling_params or {})
        self._history = HistoryLimits(history_max_messages, history_max_bytes)
        self._suspend_timeout_ms = suspend_timeout_ms
        self._max_approval_rounds = max_approval_rounds
        # What every run of the built agent is given, made once (see _run_options).
        self._options: tuple[AbstractAgent[Any, Any], object, dict[str, Any]] | None = None

    def agent(self) -> AbstractAgent[Any, Any]:
        """The Pydantic AI agent (a builder is called once per process)."""
        return self.built()

    def build(
        self, source: AbstractAgent[Any, Any] | Callable[[], AbstractAgent[Any, Any]]
    ) -> AbstractAgent[Any, Any]:
        """The agent given, or the one the builder returns."""
        if isinstance(source, AbstractAgent):
            return source
        built = source()
        if not isinstance(built, AbstractAgent):
            raise TypeError(
                f"the agent builder must return a pydantic_ai Agent, got {type(built).__name__}"
            )
        return built

    async def activate(self, activation: AdapterActivation) -> Complete | Suspend:
        """One activation: re-walk the run, answer approvals, suspend or complete."""
        agent = self.built()
        event = activation.event
        only_registry = self._registry_tools_only(agent)
        run = self._run_options(agent, only_registry)
        run["deps"] = None if self._deps is None else self._deps(event)
        history = self._history.load(activation.ctx.memory)
        tools = self._agent_tools(agent) if only_registry else None
        if tools is None:
            return await self._walk(agent, activation, history, run)
        # The registry tools stand in for the agent's own (empty) function tools: one toolset.
        run["toolsets"] = []
        with agent.override(tools=tools):
            return await self._walk(agent, activation, history, run)

    async def _walk(
        self,
        agent: AbstractAgent[Any, Any],
        activation: AdapterActivation,
        history: list[ModelMessage],
        run: dict[str, Any],
    ) -> Complete | Suspend:
        """Run the agent from the event and ``history``, resuming it past every approval."""
        result = await agent.run(self._prompt(activation.event), message_history=history, **run)
        rounds = 0
        while isinstance(result.output, DeferredToolRequests):
            messages: list[ModelMessage] = result.all_messages()
            approvals = self._decide(activation, result.output, messages)
            if approvals is None:
                return activation.suspend(timeout_ms=self._suspend_timeout_ms)
            rounds += 1
            if rounds > self._max_approval_rounds:
                raise PydanticAIAdapterError(
                    f"the agent asked for approvals {rounds} times in one activation; raise "
                    "max_approval_rounds if that is intended"
                )
            results = DeferredToolResults(approvals=approvals)
            result = await agent.run(message_history=messages, deferred_tool_results=results, **run)
        outcome = activation.finish(result.output, timeout_ms=self._suspend_timeout_ms)
        if isinstance(outcome, Complete):  # a run still waiting re-walks from the same history
            self._history.save(activation.ctx.memory, result.all_messages())
        return outcome

    def _agent_tools(self, agent: AbstractAgent[Any, Any]) -> tuple[Any, ...] | None:
        """The one ``BeamToolset``'s tools as the agent's function tools, if they may stand in.

        Only with no agent tool timeout and no ``override(toolsets=...)``: private attributes.
        """
        if len(self._toolsets) != 1 or getattr(agent, "_tool_timeout", _UNKNOWN) is not None:
            return None
        override = getattr(agent, "_override_toolsets", None)
        if not isinstance(override, ContextVar) or override.get(None) is not None:
            return None
        toolset = self._toolsets[0]
        assert isinstance(toolset, BeamToolset)  # checked by _registry_tools_only
        return toolset.agent_tools()

    def _run_options(self, agent: AbstractAgent[Any, Any], only_registry: bool) -> dict[str, Any]:
        """The keyword arguments of a run of ``agent`` but ``deps``, made once per built agent."""
        spec = agent.output_type
        options = self._options
        if options is None or options[0] is not agent or options[1] is not spec:
            run: dict[str, Any] = {
                "model": _test_double(agent)
                or BeamModel(self._model_id, sampling_params=self._sampling_params),
                "toolsets": self._toolsets,
                "capabilities": (_LocalToolWarning(),),
            }
            output_type = _with_deferred(agent)
            if output_type is not None:
                run["output_type"] = output_type
            options = (agent, spec, run)
            self._options = options
        elif "output_type" in options[2] and _has_output_validators(agent):
            _with_deferred(agent)  # raises, as it would have for a new agent
        run = dict(options[2])
        run["toolsets"] = list(run["toolsets"])
        # The warning capability costs every hook a layer: left out when it cannot fire.
        run["capabilities"] = [] if only_registry else list(run["capabilities"])
        if "output_type" in run:
            run["output_type"] = list(run["output_type"])
        return run

    def _registry_tools_only(self, agent: AbstractAgent[Any, Any]) -> bool:
        """Whether every tool a run of ``agent`` can call is surely a registry tool."""
        if not isinstance(agent, Agent) or not all(
            type(toolset) is BeamToolset and toolset.offers_activation_registry
            for toolset in self._toolsets
        ):
            return False
        override = getattr(agent, "_override_root_capability", None)
        if not isinstance(override, ContextVar) or override.get(None) is not None:
            return False
        if not all(
            type(toolset) in _EMPTY_TOOLSET_TYPES and not toolset.tools  # type: ignore[attr-defined]
            for toolset in agent.toolsets
        ):
            return False
        root = agent.root_capability
        return type(root) is CombinedCapability and all(
            type(capability) in _DEFAULT_CAPABILITY_TYPES for capability in root.capabilities
        )

    def _decide(
        self,
        activation: AdapterActivation,
        requests: DeferredToolRequests,
        messages: Sequence[ModelMessage],
    ) -> dict[str, bool | ToolApproved | ToolDenied] | None:
        """Ask for every approval of the batch; the decisions, or ``None`` while any waits."""
        foreign = [
            call.tool_name
            for call in requests.calls
            if INTENT_METADATA_KEY not in requests.metadata.get(call.tool_call_id, {})
        ]
        if foreign:
            raise PydanticAIAdapterError(
                f"tools {sorted(set(foreign))} deferred their calls (CallDeferred or external "
                "tools), which only BeamToolset's side-effecting tools may do here"
            )
        decisions: dict[str, bool | ToolApproved | ToolDenied] = {}
        waiting = bool(requests.calls)
        for call in requests.approvals:
            payload = {"tool": call.tool_name, "arguments": call.args_as_dict()}
            answer = activation.request_approval(
                payload, call_key=call_key("pydantic_ai.approval", messages, call.tool_call_id)
            )
            if isinstance(answer, Pending):
                waiting = True
            elif answer.approved:
                decisions[call.tool_call_id] = True
            else:
                decisions[call.tool_call_id] = ToolDenied(denial_message(answer))
        return None if waiting else decisions


# The toolsets of an agent with no tools of its own, and every agent's capabilities.
_EMPTY_TOOLSET_TYPES: frozenset[type] = frozenset(
    {FunctionToolset, *(type(toolset) for toolset in Agent(output_type=str).toolsets)}
)


def _default_capability_types() -> frozenset[type]:
    """The capabilities a plain ``Agent`` has (one is private: if it moves, none known)."""
    try:
        from pydantic_ai.capabilities._pending_messages import PendingMessageDrainCapability
    except ImportError:
        return frozenset()
    return frozenset({ToolSearch, PendingMessageDrainCapability})


_DEFAULT_CAPABILITY_TYPES = _default_capability_types()

_UNKNOWN = object()


class _LocalToolWarning(AbstractCapability[Any]):
    """Warns, once per tool name and process, when a tool outside the registry runs."""

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
    ) -> dict[str, Any]:
        if tool_def.name not in current_activation().ctx.tool_registry:
            warn_outside_registry(_log, repr(tool_def.name))
        return args


def denial_message(decision: Decision) -> str:
    """What the model is told of a denial: ``"denied by <approver>: <reason>"``."""
    if decision.timed_out:
        text = "denied: nobody approved in time"
    else:
        text = f"denied by {decision.approver}" if decision.approver else "denied"
    return f"{text}: {decision.reason}" if decision.reason else text


def _test_double(agent: AbstractAgent[Any, Any]) -> Model | None:
    """The agent's own ``TestModel`` or ``FunctionModel``, kept: it answers locally, uncached."""
    model = agent.model
    return model if isinstance(model, TestModel | FunctionModel) else None


def _mentions_deferred(spec: object) -> bool:
    if spec is DeferredToolRequests:
        return True
    if isinstance(spec, Sequence) and not isinstance(spec, str | bytes):
        return any(_mentions_deferred(item) for item in spec)
    return False


def _with_deferred(agent: AbstractAgent[Any, Any]) -> object | None:
    """The run's ``output_type`` accepting ``DeferredToolRequests``; ``None``: the agent's does."""
    spec = agent.output_type
    if _mentions_deferred(spec):
        return None
    if _has_output_validators(agent):
        raise PydanticAIAdapterError(
            "the agent has output validators, so the adapter cannot add DeferredToolRequests "
            "to its output_type per run; declare output_type=[..., DeferredToolRequests]"
        )
    if isinstance(spec, Sequence) and not isinstance(spec, str | bytes):
        return [*spec, DeferredToolRequests]
    return [spec, DeferredToolRequests]


def _has_output_validators(agent: AbstractAgent[Any, Any]) -> bool:
    """Whether ``agent`` has ``@agent.output_validator`` functions (a private attribute)."""
    return isinstance(agent, Agent) and bool(getattr(agent, "_output_validators", None))


def _check_pickles(agent: AbstractAgent[Any, Any]) -> None:
    from apache_beam.internal import pickler  # the pickler RunAgent's DoFn goes through

    try:
        pickler.loads(pickler.dumps(agent))
    except Exception as exc:
        raise TypeError(
            f"this pydantic_ai Agent does not pickle ({type(exc).__name__}: {exc}), and "
            "RunAgent pickles its agent; pass a zero-argument function that builds the Agent "
            "instead: PydanticAIAgent(build_agent, ...)"
        ) from None


# -- the message history in ctx.memory ----------------------------------------------------
HISTORY_SLOT = "beam_agents.pydantic_ai.history"
"""The working-memory slot holding the key's message history (Pydantic AI's JSON)."""


class HistoryTooLargeError(ValueError):
    """The latest turn alone is over ``history_max_bytes``: no turn boundary can cut it."""


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How much history a key keeps: whole turns within ``max_messages`` and ``max_bytes``."""

    max_messages: int = 40
    max_bytes: int = 256 * 1024
    slot: str = HISTORY_SLOT

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"history_{name} must be an int >= 0, got {value!r}")
        if not 0 < self.max_bytes < MEMORY_CAP_BYTES:
            raise ValueError(
                f"history_max_bytes must be between 1 and the {MEMORY_CAP_BYTES}-byte memory "
                f"cap, got {self.max_bytes}"
            )

    def load(self, memory: WorkingMemory) -> list[ModelMessage]:
        """The committed history of the key (empty for a new session)."""
        if self.max_messages == 0:
            return []
        blob = memory.get(self.slot)
        return [] if not blob else list(ModelMessagesTypeAdapter.validate_json(blob))

    def save(self, memory: WorkingMemory, messages: Sequence[ModelMessage]) -> None:
        """Stage the completed run's history, cut to the limits."""
        if self.max_messages == 0:
            memory.delete(self.slot)
            return
        memory.set(self.slot, self.encode(messages))

    def encode(self, messages: Sequence[ModelMessage]) -> bytes:
        """``messages`` cut to the limits, as Pydantic AI's message JSON (each serialized once)."""
        count = len(messages)
        if count <= self.max_messages:
            whole = _dump(messages)
            if len(whole) <= self.max_bytes:
                return whole  # the first cut (none) keeps everything
        cuts = [0, *(i for i in range(1, count) if _starts_turn(messages[i]))]
        # Only messages from the first cut within max_messages on are serialized.
        candidates = [cut for cut in cuts if count - cut <= self.max_messages] or cuts[-1:]
        low = candidates[0]
        encoded = [_dump([message])[1:-1] for message in messages[low:]]
        # after[i]: the bytes of messages[low + i :], each with its "," (or the closing "]").
        after = [0] * (count - low + 1)
        for index in range(count - low - 1, -1, -1):
            after[index] = after[index + 1] + len(encoded[index]) + 1
        kept: list[ModelMessage] = []
        first = b""
        for cut in candidates:
            kept = _carry_system_prompt(messages, cut)
            if not kept:
                break
            at = cut - low
            first = encoded[at] if kept[0] is messages[cut] else _dump(kept[:1])[1:-1]
            if len(kept) <= self.max_messages and 2 + len(first) + after[at + 1] <= self.max_bytes:
                break
        rest = encoded[len(encoded) - len(kept) + 1 :] if kept else []
        blob = b"[" + b",".join([first, *rest]) + b"]" if kept else b"[]"
        if len(blob) > self.max_bytes:
            raise HistoryTooLargeError(
                f"the latest turn of the Pydantic AI history is {len(blob)} bytes, over "
                f"history_max_bytes={self.max_bytes}; raise it (below the {MEMORY_CAP_BYTES}-"
                "byte memory cap) or return less from the tools"
            )
        return blob


def _dump(messages: Sequence[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(list(messages))


def _starts_turn(message: ModelMessage) -> bool:
    """Whether a cut may keep ``message`` first: a user prompt answering no tool call."""
    if not isinstance(message, ModelRequest):
        return False
    parts = message.parts
    return any(isinstance(part, UserPromptPart) for part in parts) and not any(
        isinstance(part, ToolReturnPart) for part in parts
    )


def _carry_system_prompt(messages: Sequence[ModelMessage], cut: int) -> list[ModelMessage]:
    """``messages[cut:]`` with the first request's system prompt put back in front."""
    kept = list(messages[cut:])
    if cut == 0 or not messages or not isinstance(messages[0], ModelRequest):
        return kept
    system = [part for part in messages[0].parts if isinstance(part, SystemPromptPart)]
    first = kept[0]
    if system and isinstance(first, ModelRequest):
        kept[0] = dataclasses.replace(first, parts=[*system, *first.parts])
    return kept
