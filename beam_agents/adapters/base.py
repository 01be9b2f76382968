"""What the framework adapters share: ``FrameworkAgent`` and ``AdapterActivation``."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from beam_agents._protos import ToolResult, canonical_json_bytes
from beam_agents.core.activation import DEADLINE_APPROVER
from beam_agents.core.agent import Complete, Suspend, enter_task
from beam_agents.core.context import ActivationContext
from beam_agents.loop import result_reply
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.tools import Tool

EFFECT_WAIT_SLACK_MS = 60_000
"""How long past its intents' TTL a run waiting only for side effects waits for the effector."""

_CURRENT: ContextVar[AdapterActivation | None] = ContextVar("beam_agents_adapter", default=None)

_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_outside_registry(log: logging.Logger, tool: str) -> None:
    """Warn once per process that ``tool``, not a registry tool, re-runs on every activation."""
    with _WARNED_LOCK:
        if tool in _WARNED:
            return
        _WARNED.add(tool)
    log.warning(
        "tool %s is not in AgentConfig.tool_registry: it runs in the pipeline on every "
        "activation of the run; make it a registry tool (side_effect=True if it has effects)",
        tool,
    )


class AdapterUsageError(RuntimeError):
    """An adapter's model or tool was used outside the agent run the adapter drives."""


def current_activation() -> AdapterActivation:
    """The :class:`AdapterActivation` running now; framework models and tools look it up."""
    activation = _CURRENT.get()
    if activation is None:
        raise AdapterUsageError(
            "a beam_agents adapter model or tool was called outside an adapter run; wrap the "
            "framework agent with its beam_agents.adapters wrapper and run it with RunAgent"
        )
    return activation


@contextmanager
def bound(activation: AdapterActivation) -> Iterator[AdapterActivation]:
    """Make ``activation`` the :func:`current_activation` in the ``with`` block (and its tasks)."""
    token = _CURRENT.set(activation)
    try:
        yield activation
    finally:
        _CURRENT.reset(token)


@dataclass(frozen=True, slots=True)
class Pending:
    """An intent (tool or approval) of this run that has no answer yet."""

    intent_id: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to an approval request; ``timed_out`` when nobody decided in time."""

    approved: bool
    approver: str = ""
    reason: str = ""
    timed_out: bool = False

    def as_dict(self) -> dict[str, Any]:
        """``{"approved", "approver", "reason", "timed_out"}``, the default resume value."""
        return dataclasses.asdict(self)


class IntentFailedError(Exception):
    """A side-effecting tool's intent came back without a value; ``result`` is the effector's."""

    def __init__(self, tool_name: str, result: ToolResult) -> None:
        super().__init__(result_reply(tool_name, result)[0])
        self.tool_name = tool_name
        self.result = result


def utf8_prompt(event: bytes) -> str:
    """The default prompt: the event's bytes as UTF-8 text."""
    return event.decode("utf-8")


def output_bytes(value: object) -> bytes:
    """An agent's final answer as ``Complete.output``: text as UTF-8, a model or value as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode("utf-8")
    return canonical_json_bytes(value)


class AdapterActivation:
    """One activation's view of a framework run: model, tools, intents, approvals, state.

    A ``call_key`` names a call, so a call run again within the activation gets its intent back.
    """

    def __init__(self, ctx: ActivationContext, *, adapter: str) -> None:
        self.ctx = ctx
        self.adapter = adapter
        self._intents: dict[Hashable, str] = {}
        self._waiting: list[str] = []
        self._asks_a_person = False
        self._longest_ttl_ms = 0

    @property
    def event(self) -> bytes:
        """The external event that started the run (a resume reads it back from the snapshot)."""
        return self.ctx.snapshot if self.ctx.is_resume else self.ctx.event

    async def call_model(self, request: LlmRequest) -> LlmResponse:
        """``ctx.call_model``: cached, replayed on resume and retry, budgeted."""
        return await self.ctx.call_model(request)

    def side_effecting(self, tool_name: str) -> bool:
        """Whether ``tool_name`` is a side-effecting tool of ``AgentConfig.tool_registry``."""
        registry = self.ctx.tool_registry
        return tool_name in registry and registry.get(tool_name).side_effect

    async def run_tool(self, tool_name: str, arguments: Mapping[str, Any]) -> Any:
        """Run a read-only registry tool inline (``ctx.run_tool``)."""
        return await self.ctx.run_tool(tool_name, arguments)

    def act(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        call_key: Hashable | None = None,
        ttl_ms: int | None = None,
        tool: Tool[..., Any] | None = None,
    ) -> Any:
        """The side-effecting tool's value if the effector has answered, else :class:`Pending`.

        A failed result raises :class:`IntentFailedError`. ``tool`` stands in for a tool
        ``AgentConfig.tool_registry`` lacks.
        """
        registry = self.ctx.tool_registry
        own = tool if tool is not None and tool_name not in registry else None

        def stage() -> str:
            if own is not None:
                own.validate_arguments(arguments)
            return self.ctx.act(tool_name, arguments, ttl_ms=ttl_ms)

        intent_id = self._intent(call_key, stage)
        result = self.ctx.results.get(intent_id)
        if result is None:
            ttl = self.ctx.intent_ttl_ms if ttl_ms is None else ttl_ms
            self._longest_ttl_ms = max(self._longest_ttl_ms, ttl)
            return self._wait(intent_id)
        if result.status != ToolResult.OK:
            raise IntentFailedError(tool_name, result)
        if own is None and tool_name not in registry:  # nothing says what the value is
            return json.loads(result.payload) if result.payload else None
        return (own or registry.get(tool_name)).decode_result(result.payload)

    def request_approval(
        self,
        payload: Mapping[str, Any],
        *,
        call_key: Hashable | None = None,
        channel: str | None = None,
        ttl_ms: int | None = None,
    ) -> Decision | Pending:
        """The decision about ``payload`` if one was made, else :class:`Pending`."""
        intent_id = self._intent(
            call_key,
            lambda: self.ctx.request_approval(payload, channel=channel, ttl_ms=ttl_ms),
        )
        decision = self._decision(intent_id)
        if decision is not None:
            return decision
        self._asks_a_person = True
        return self._wait(intent_id)

    @property
    def waiting(self) -> tuple[str, ...]:
        """The intents this activation found unanswered, in the order it met them."""
        return tuple(self._waiting)

    def suspend(self, *, timeout_ms: int | None = None) -> Suspend:
        """The ``Suspend`` that waits for :attr:`waiting`; the snapshot keeps the run's event."""
        if timeout_ms is None and self._waiting and not self._asks_a_person:
            timeout_ms = self._longest_ttl_ms + EFFECT_WAIT_SLACK_MS
        return Suspend(snapshot=self.event, adapter=self.adapter, timeout_ms=timeout_ms)

    def finish(self, output: object, *, timeout_ms: int | None = None) -> Complete | Suspend:
        """``Suspend`` while anything is pending, else ``Complete`` with ``output``."""
        if self._waiting:
            return self.suspend(timeout_ms=timeout_ms)
        return Complete(output=output_bytes(output))

    def _intent(self, call_key: Hashable | None, stage: Any) -> str:
        if call_key is None:
            return str(stage())
        intent_id = self._intents.get(call_key)
        if intent_id is None:
            intent_id = self._intents[call_key] = str(stage())
        return intent_id

    def _wait(self, intent_id: str) -> Pending:
        if intent_id not in self._waiting:
            self._waiting.append(intent_id)
        return Pending(intent_id)

    def _decision(self, intent_id: str) -> Decision | None:
        ctx = self.ctx
        result = ctx.results.get(intent_id)
        if result is not None:  # the effector answered the approval: it expired or was refused
            return _refused(result)
        approval = ctx.approvals.get(intent_id)
        asked = {intent_id}
        # A deadline that escalated answered "no" and asked again: the later answer decides.
        while approval is not None and approval.superseded_by not in ("", *asked):
            later = approval.superseded_by
            asked.add(later)
            result = ctx.results.get(later)
            if result is not None:
                return _refused(result)
            approval = ctx.approvals.get(later)
        if approval is None:
            return None
        if approval.approver == DEADLINE_APPROVER:
            return Decision(False, approval.approver, approval.reason, timed_out=True)
        return Decision(approval.approved, approval.approver, approval.reason)


def _refused(result: ToolResult) -> Decision:
    """The effector's answer to an approval intent: it expired, or was refused unasked."""
    reason = result_reply("approval", result)[0]
    return Decision(False, reason=reason, timed_out=result.status == ToolResult.EXPIRED)


_Built = TypeVar("_Built")


class FrameworkAgent(ABC, Generic[_Built]):
    """A ``RunAgent`` agent around a framework agent (or its builder), built once per process."""

    adapter: ClassVar[str]
    """The ``Suspend.adapter`` name of this adapter's suspensions."""
    _not_pickled: ClassVar[dict[str, Any]] = {}

    def __init__(self, source: _Built | Callable[[], _Built]) -> None:
        self._source = source
        self._built: _Built | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_built=None, **self._not_pickled)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def built(self) -> _Built:
        """The framework agent, built from the source on first use."""
        with self._lock:
            if self._built is None:
                self._built = self.build(self._source)
            return self._built

    @abstractmethod
    def build(self, source: _Built | Callable[[], _Built]) -> _Built:
        """Turn the source (the agent or its builder) into the agent this adapter runs."""

    @abstractmethod
    async def activate(self, activation: AdapterActivation) -> Complete | Suspend:
        """One activation of the framework agent, through ``activation``."""

    async def __call__(self, ctx: ActivationContext) -> Complete | Suspend:
        """One activation: what ``RunAgent`` calls."""
        return await self.run(ctx)

    async def run(self, ctx: ActivationContext) -> Complete | Suspend:
        """One activation, in its asyncio task (context variables need one context)."""
        await enter_task()
        activation = AdapterActivation(ctx, adapter=self.adapter)
        with bound(activation):
            return await self.activate(activation)
