"""``ActivationContext``: everything an agent can see and do during one activation.

It checks what the agent passes, then stages it in the activation's ``Staged`` record
(``core.staging``), which is committed only if the activation succeeds.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NoReturn, TypeAlias

from beam_agents._protos import (
    Approval,
    ApprovalEdit,
    ToolIntent,
    ToolResult,
    approval_digest,
    canonical_json,
    edit_diff,
)
from beam_agents.core.agent import (
    MemorySlotError,
    ModelNotConfiguredError,
    Outcome,
    ReadOnlyIntentError,
    positive_ms,
)
from beam_agents.core.config import check_required_approvals
from beam_agents.core.observability import TraceRecorder
from beam_agents.core.staging import (
    APPROVAL_TOOL_NAME,
    ActivationServices,
    Resumption,
    Staged,
    StepCursor,
    stage_compensation,
)
from beam_agents.core.state import DEFAULT_RING_ITEMS, MemorySlots
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.tools import ToolRegistry
from beam_agents.tools.errors import SideEffectToolError, ToolArgumentError, ToolNotFoundError

__all__ = ["ActivationContext", "AgentFn", "WorkingMemory", "staged", "staged_anything"]


_REFUSED_UNRUN = (ToolNotFoundError, SideEffectToolError, ToolArgumentError)
"""What ``run_tool`` raises before a tool runs: nothing happened, so nothing is traced."""


# Shared by every new run, which has neither results nor pending intents (both read-only).
_NO_RESULTS: Mapping[str, ToolResult] = MappingProxyType({})
_NO_APPROVALS: Mapping[str, Approval] = MappingProxyType({})
_NONE_PENDING: frozenset[str] = frozenset()


class ActivationContext:
    """The agent's view of one activation.

    Attributes:
        entity_key: The key this activation runs for.
        seq: The run's sequence number on this key (0 for the key's first run); a resumed
            activation has the seq of the run it continues.
        now_ms: The event time of the envelope being processed (epoch milliseconds).
        event: The external event's payload; ``b""`` on a resume.
    """

    __slots__ = (
        "_approval",
        "_approvals",
        "_first_step",
        "_lazy_staged",
        "_load_cache",
        "_load_memory",
        "_memory",
        "_pending_ids",
        "_result",
        "_results",
        "_services",
        "_snapshot",
        "_trace",
        "entity_key",
        "event",
        "now_ms",
        "seq",
    )

    def __init__(
        self,
        *,
        entity_key: bytes,
        seq: int,
        now_ms: int,
        event: bytes,
        first_step: int,
        trace: TraceRecorder,
        services: ActivationServices,
        load_memory: Callable[[], list[bytes]],
        load_cache: Callable[[], bytes | None],
        resumption: Resumption | None = None,
    ) -> None:
        self.entity_key = entity_key
        self.seq = seq
        self.now_ms = now_ms
        self.event = event
        self._services = services
        self._load_memory = load_memory
        self._memory: WorkingMemory | None = None
        self._load_cache = load_cache
        self._trace = trace
        self._first_step = first_step
        if resumption is None:
            self._result: ToolResult | None = None
            self._approval: Approval | None = None
            self._snapshot = b""
            self._results: Mapping[str, ToolResult] = _NO_RESULTS
            self._approvals: Mapping[str, Approval] = _NO_APPROVALS
            self._pending_ids = _NONE_PENDING
            self._lazy_staged: Staged | None = None  # staged on first use
        else:
            self._result = resumption.result
            self._approval = resumption.approval
            self._snapshot = resumption.snapshot
            self._results = MappingProxyType(dict(resumption.results))
            self._approvals = (
                MappingProxyType(dict(resumption.approvals))
                if resumption.approvals
                else _NO_APPROVALS
            )
            pending = resumption.pending
            self._pending_ids = (
                frozenset(intent_id for intent_id, _ in pending) if pending else _NONE_PENDING
            )
            self._lazy_staged = Staged(
                trace,
                StepCursor(first_step, resumption.steps),
                pending,
                resumption.tokens_used,
                namespace=resumption.namespace,
                links=resumption.compensations,
            )

    @property
    def _staged(self) -> Staged:
        staged = self._lazy_staged
        if staged is None:
            staged = self._lazy_staged = Staged(
                self._trace,
                StepCursor(self._first_step),
                namespace=self._services.intent_namespace,
            )
        return staged

    # -- memory --------------------------------------------------------------------------

    @property
    def memory(self) -> WorkingMemory:
        """The key's working memory (committed state plus this activation's staged writes)."""
        memory = self._memory
        if memory is None:
            memory = self._memory = WorkingMemory(self._load_memory())
            self._staged.memory = memory._slots
        return memory

    # -- resume inputs -------------------------------------------------------------------

    @property
    def is_resume(self) -> bool:
        """Whether this activation resumes a suspended run (with a result or an approval)."""
        return self._result is not None or self._approval is not None

    @property
    def resume_result(self) -> ToolResult | None:
        """The tool result that resumed the run, if a tool result did."""
        return self._result

    @property
    def resume_approval(self) -> Approval | None:
        """The approval decision that resumed the run, if an approval did."""
        return self._approval

    @property
    def snapshot(self) -> bytes:
        """What the run's last ``Suspend`` stored (``b""`` on a new run)."""
        return self._snapshot

    @property
    def results(self) -> Mapping[str, ToolResult]:
        """Every tool result received by this run so far, by intent id."""
        return self._results

    @property
    def approvals(self) -> Mapping[str, Approval]:
        """Every approval decision received by this run so far, by intent id (deadline ones too)."""
        return self._approvals

    @property
    def pending_intent_ids(self) -> frozenset[str]:
        """Intents of this run still unanswered, including those staged in this activation."""
        staged = self._lazy_staged
        intents = None if staged is None else staged.intents
        if not intents:
            return self._pending_ids
        return self._pending_ids | {intent.intent_id for intent in intents}

    @property
    def next_step(self) -> int:
        """The ``step_index`` the next model call or intent takes if it repeats the record.

        A step that differs from the run's record takes :attr:`high_water_step` instead.
        """
        staged = self._lazy_staged
        return self._first_step if staged is None else staged.cursor.next_step

    @property
    def high_water_step(self) -> int:
        """The first step position no activation of this run has taken yet."""
        staged = self._lazy_staged
        return self._first_step if staged is None else staged.cursor.high_water_step

    @property
    def run_tokens_used(self) -> int:
        """Tokens spent by the whole run so far: earlier activations plus this one."""
        staged = self._lazy_staged
        return 0 if staged is None else staged.run_tokens_used

    @property
    def intent_ttl_ms(self) -> int:
        """``AgentConfig.intent_ttl_ms``: the TTL ``act`` gives an intent unless told otherwise."""
        return self._services.intent_ttl_ms

    @property
    def tool_registry(self) -> ToolRegistry:
        """``AgentConfig.tool_registry``: the tools ``run_tool`` runs and ``act`` validates."""
        return self._services.tool_registry

    # -- model ---------------------------------------------------------------------------

    async def call_model(self, request: LlmRequest) -> LlmResponse:
        """Call the model through the replay cache; takes a step; traced as ``LLM_CALL``.

        A request at the position of a committed call is replayed without reaching the
        provider. A ``ProviderError`` that survives ``AgentConfig.model_retry`` propagates.
        Past the run's token budget it raises ``BudgetExceededError``.
        """
        if not isinstance(request, LlmRequest):
            raise TypeError(f"call_model takes an LlmRequest, got {type(request).__name__}")
        if self._services.model is None:
            raise ModelNotConfiguredError(
                "the agent called the model, but AgentConfig.provider_factory is not set; "
                "pass provider_factory=<a zero-argument function returning the model client>"
            )
        return await self._staged.call_model(request, self._services, self._load_cache)

    # -- tools ---------------------------------------------------------------------------

    async def run_tool(self, name: str, args: Mapping[str, Any]) -> Any:
        """Run the read-only tool ``name`` inline and return its result; traced as ``TOOL_CALL``.

        Raises ``ToolNotFoundError``, ``SideEffectToolError`` or ``ToolArgumentError`` untraced,
        since nothing ran. Does not take a step.
        """
        tool = self._services.tool_registry.get(name)
        staged = self._staged
        trace = staged.trace
        started_ns = trace.wall_ns()
        try:
            result = await self._services.tool_runner.run(tool, args)
        except _REFUSED_UNRUN:
            raise
        except Exception as exc:  # it ran (an MCP tool's server answered an error, too)
            trace.record_tool_call(name, staged.cursor.next_step, started_ns, type(exc).__name__)
            if staged.recording is not None:
                staged.recording.tool_call(name, args, None, exc, len(staged.intents))
            raise
        trace.record_tool_call(name, staged.cursor.next_step, started_ns, "")
        if staged.recording is not None:
            staged.recording.tool_call(name, args, result, None, len(staged.intents))
        return result

    def act(
        self,
        tool_name: str,
        args: str | Mapping[str, Any],
        *,
        ttl_ms: int | None = None,
        approval: Approval | None = None,
        compensate_with: tuple[str, str | Mapping[str, Any]] | None = None,
    ) -> str:
        """Stage an intent for the effector to run ``tool_name``; return its id.

        ``args`` is a JSON object (text) or a mapping, stored as canonical JSON. A tool the
        registry knows is validated now (``ToolArgumentError``); a read-only one is refused
        (``ReadOnlyIntentError``). A name the registry lacks raises ``ToolNotFoundError`` if it
        holds side-effecting tools; else the intent is staged unvalidated, with one WARNING.
        ``ttl_ms`` defaults to ``AgentConfig.intent_ttl_ms``. Takes a step; traced as
        ``INTENT_EMITTED``. Replaying a step of the run returns the id it returned before.

        ``approval``: the approved decision this call carries out; ``args`` are then those
        given to ``request_approval`` (``ValueError`` otherwise, or if it was denied). Edited
        arguments are staged instead, with their lineage in ``ToolIntent.edited_from``.

        ``compensate_with=(tool_name, args)``: the side-effecting call that undoes this one,
        checked now like ``act``'s own; ``ctx.compensate(id)`` stages it.
        """
        if not isinstance(tool_name, str) or not tool_name:
            raise ValueError(f"act needs a tool name, got {tool_name!r}")
        arguments, args_json = arguments_json(tool_name, args)
        edited_from = None
        if approval is not None:
            args_json, edited_from = approved_call(approval, args_json, arguments)
            if edited_from is not None:
                arguments = json.loads(args_json)
        registry, warned = self._services.tool_registry, self._services.unvalidated_tools
        check_side_effect_call(tool_name, arguments, registry, warned)
        undo = None
        if compensate_with is not None:
            undo = check_compensate_with(compensate_with, registry, warned)
        ttl = self._services.intent_ttl_ms if ttl_ms is None else positive_ms("ttl_ms", ttl_ms)
        return self._staged.stage_intent(
            ToolIntent.TOOL,
            tool_name,
            args_json,
            ttl,
            "",
            edited_from=edited_from,
            compensate_with=undo,
        )

    def compensate(self, intent_id: str) -> str:
        """Stage the compensation linked to this run's intent ``intent_id``; return its id.

        The intent must have been staged by this run with ``act(..., compensate_with=...)``;
        otherwise, or if it is already compensated, it raises ``CompensationError``. The
        compensation never expires; the effector runs it only if the original ran. Takes a
        step; a re-walk returns the same id (``docs/concepts/runtime.md``).
        """
        if not isinstance(intent_id, str):
            raise TypeError(f"compensate takes an intent id (str), got {type(intent_id).__name__}")
        return stage_compensation(self._staged, intent_id, self.high_water_step)

    def request_approval(
        self,
        args: str | Mapping[str, Any],
        *,
        channel: str | None = None,
        ttl_ms: int | None = None,
        tool: str | None = None,
        required_approvals: int | None = None,
    ) -> str:
        """Stage an ``APPROVAL`` intent asking for a decision about ``args``; return its id.

        ``channel``, ``ttl_ms`` and ``required_approvals`` (distinct approvers; any deny
        denies) default to the ``HitlPolicy``'s. ``tool``: the side-effecting tool whose call
        ``args`` are; approvers may then edit them, and
        ``ctx.act(tool, args, approval=ctx.resume_approval)`` stages the approved call. The
        decision comes back as ``ctx.resume_approval``. Takes a step.
        """
        if channel is not None and not isinstance(channel, str):
            raise TypeError(f"channel must be a str, got {type(channel).__name__}")
        if tool is not None and (not isinstance(tool, str) or not tool):
            raise ValueError(f"tool must be a non-empty tool name, got {tool!r}")
        quorum = self._services.required_approvals
        if required_approvals is not None:
            quorum = check_required_approvals(required_approvals, "required_approvals")
        arguments, args_json = arguments_json(APPROVAL_TOOL_NAME, args)
        registry = self._services.tool_registry
        if tool is not None and tool in registry:
            gated = registry.get(tool)
            if not gated.side_effect:
                raise ReadOnlyIntentError(
                    f"tool {tool!r} is read-only: it needs no approval (run it with "
                    f"ctx.run_tool({tool!r}, arguments))",
                    tool_name=tool,
                )
            gated.validate_arguments(arguments)
        ttl = self._services.approval_ttl_ms if ttl_ms is None else positive_ms("ttl_ms", ttl_ms)
        route = self._services.approval_channel if channel is None else channel
        return self._staged.stage_intent(
            ToolIntent.APPROVAL,
            APPROVAL_TOOL_NAME,
            args_json,
            ttl,
            route,
            required_approvals=quorum,
            gated_tool=tool or "",
        )


def staged(ctx: ActivationContext) -> Staged:
    """What ``ctx``'s activation staged, for the runtime to commit (agents never need it)."""
    return ctx._staged


def staged_anything(ctx: ActivationContext) -> bool:
    """Whether ``ctx``'s activation used anything it stages (memory, model, tools, intents)."""
    return ctx._lazy_staged is not None


# -- checking what act and request_approval are given -----------------------------------------
_log = logging.getLogger(__name__)


def check_unregistered(tool_name: str, registry: ToolRegistry, warned: set[str]) -> None:
    """Refuse ``act`` of an unknown tool if the registry has side-effecting ones; else warn once."""
    side_effecting = sorted(tool.name for tool in registry if tool.side_effect)
    if side_effecting:
        close = difflib.get_close_matches(tool_name, side_effecting, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ToolNotFoundError(
            f"ctx.act({tool_name!r}, ...): AgentConfig.tool_registry has no tool named "
            f"{tool_name!r} (its side-effecting tools: {', '.join(side_effecting)}){hint}",
            tool_name=tool_name,
        )
    if tool_name not in warned:
        warned.add(tool_name)
        _log.warning(
            "ctx.act(%r, ...) stages intents whose arguments are not validated: "
            "AgentConfig.tool_registry holds no side-effecting tools, so the effector is the "
            "first to check them; register the tool (side_effect=True) to check them here",
            tool_name,
        )


def check_side_effect_call(
    tool_name: str, arguments: dict[str, Any], registry: ToolRegistry, warned: set[str]
) -> None:
    """Check a call ``act`` stages: a registered tool is side-effecting, its arguments valid."""
    if tool_name not in registry:
        check_unregistered(tool_name, registry, warned)
        return
    tool = registry.get(tool_name)
    if not tool.side_effect:
        raise ReadOnlyIntentError(
            f"tool {tool_name!r} is read-only; run it inline with "
            f"await ctx.run_tool({tool_name!r}, arguments) instead of staging an intent",
            tool_name=tool_name,
        )
    tool.validate_arguments(arguments)


def arguments_json(tool_name: str, args: object) -> tuple[dict[str, Any], str]:
    """Parse and canonicalize intent arguments given as JSON text or a mapping."""
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(
                f"arguments for {tool_name!r} are not valid JSON: {exc}", tool_name=tool_name
            ) from None
    elif isinstance(args, Mapping):
        parsed = dict(args)
    else:
        raise ToolArgumentError(
            f"arguments for {tool_name!r} must be a JSON object string or a mapping, "
            f"got {type(args).__name__}",
            tool_name=tool_name,
        )
    if not isinstance(parsed, dict):
        raise ToolArgumentError(
            f"arguments for {tool_name!r} must be a JSON object, got {type(parsed).__name__}",
            tool_name=tool_name,
        )
    try:
        encoded = canonical_json(parsed)
        encoded.encode("utf-8")  # a lone surrogate is JSON text but no UTF-8 holds it
    except (TypeError, ValueError) as exc:
        raise ToolArgumentError(
            f"arguments for {tool_name!r} are not JSON-encodable: {exc}", tool_name=tool_name
        ) from None
    return parsed, encoded


def check_compensate_with(
    compensate_with: object, registry: ToolRegistry, warned: set[str]
) -> tuple[str, str]:
    """``(tool_name, canonical args_json)`` of a ``compensate_with``, validated like ``act``'s."""
    if not isinstance(compensate_with, tuple) or len(compensate_with) != 2:
        raise TypeError(
            f"compensate_with must be a (tool_name, args) tuple, got {compensate_with!r}"
        )
    tool_name, args = compensate_with
    if not isinstance(tool_name, str) or not tool_name:
        raise ValueError(f"compensate_with needs a tool name, got {tool_name!r}")
    arguments, args_json = arguments_json(tool_name, args)
    check_side_effect_call(tool_name, arguments, registry, warned)
    return tool_name, args_json


def approved_call(
    approval: Approval, args_json: str, arguments: Mapping[str, Any]
) -> tuple[str, ApprovalEdit | None]:
    """The arguments to stage for the call ``approval`` approved, and its edit lineage.

    Raises ``ValueError`` if ``approval`` denied them or names other arguments.
    """
    if not isinstance(approval, Approval):
        raise TypeError(f"approval must be an Approval, got {type(approval).__name__}")
    if not approval.approved:
        raise ValueError(
            f"approval {approval.intent_id!r} was denied by {approval.approver!r}; "
            "there is no approved call to stage"
        )
    if approval.args_digest and approval.args_digest != approval_digest(args_json):
        raise ValueError(
            f"approval {approval.intent_id!r} approved other arguments than these (digest "
            f"{approval.args_digest}, these are {approval_digest(args_json)}); pass the "
            "arguments given to ctx.request_approval"
        )
    if not approval.edited_args_json:
        return args_json, None
    edited = json.loads(approval.edited_args_json)
    edited_json = canonical_json(edited)
    if edited_json == args_json:
        return args_json, None
    lineage = ApprovalEdit(
        approval_intent_id=approval.intent_id,
        edited_by=approval.approver,
        diff_json=edit_diff(arguments, edited),
    )
    return edited_json, lineage


# -- working memory: what the agent reads and writes, checked here ---------------------------
def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise MemorySlotError(f"memory keys are non-empty str, got {key!r}")
    return key


def _check_bytes(what: str, value: object) -> bytes:
    if not isinstance(value, bytes):
        raise MemorySlotError(f"memory {what} must be bytes, got {type(value).__name__}")
    return value


class WorkingMemory:
    """The key's memory as one activation sees it: committed slots plus staged writes.

    A slot holds either one value (``set``/``get``) or a ring of items (``append``/``ring``);
    using a slot as the other kind raises :class:`MemorySlotError`. Slots are decoded only when
    read, and a commit re-uses the committed bytes of every slot it did not change.
    """

    __slots__ = ("_slots",)

    def __init__(self, elements: Sequence[bytes] | None) -> None:
        self._slots = MemorySlots(elements)

    def get(self, key: str) -> bytes | None:
        """The value in slot ``key``, or ``None`` if there is none."""
        return self._slots.get(_check_key(key))

    def set(self, key: str, value: bytes) -> None:
        """Put ``value`` in slot ``key`` (replacing a value or a ring)."""
        self._slots.set(_check_key(key), _check_bytes("values", value))

    def delete(self, key: str) -> None:
        """Remove slot ``key``; deleting a missing slot is a no-op."""
        self._slots.delete(_check_key(key))

    def keys(self) -> list[str]:
        """The names of all slots, sorted."""
        return self._slots.keys()

    def append(self, key: str, item: bytes, max_items: int = DEFAULT_RING_ITEMS) -> None:
        """Append ``item`` to the ring in slot ``key``, keeping only the newest ``max_items``."""
        _check_key(key)
        _check_bytes("ring items", item)
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise MemorySlotError(f"max_items must be an int >= 1, got {max_items!r}")
        self._slots.append(key, item, max_items)

    def ring(self, key: str) -> list[bytes]:
        """The items of the ring in slot ``key``, oldest first (empty if there is none)."""
        return self._slots.ring(_check_key(key))

    @property
    def size(self) -> int:
        """The size of this memory's serialized form in bytes: what the cap limits."""
        return self._slots.size

    @property
    def slot_sizes(self) -> dict[str, int]:
        """Each slot's share of :attr:`size`, by name (its encoded bytes, tag included)."""
        return self._slots.slot_sizes

    @property
    def changed(self) -> bool:
        """Whether this activation wrote anything."""
        return self._slots.changed

    def encode(self) -> list[bytes]:
        """The memory's bag elements (none when memory is empty); see ``encode_memory``."""
        return self._slots.encode()

    def __reduce__(self) -> NoReturn:
        raise TypeError("a WorkingMemory belongs to its activation: copy the values it holds")


AgentFn: TypeAlias = Callable[[ActivationContext], Coroutine[Any, Any, Outcome]]
"""The shape of an agent: ``async def agent(ctx: ActivationContext) -> Complete | Suspend``."""
