"""``ActivationContext``: everything an agent can see and do during one activation.

Everything the agent does goes to the activation's :class:`Staged` record, committed only if
the activation succeeds. The step cursor gives each model call and intent its position.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from beam_agents._protos import (
    Approval,
    ApprovalEdit,
    CompensationLink,
    Continuation,
    ModelCacheEntry,
    ToolIntent,
    ToolResult,
    TraceEvent,
    approval_digest,
    canonical_json,
    recordable_problem,
)
from beam_agents.core.agent import (
    BudgetExceededError,
    CompensationError,
    ModelNotConfiguredError,
    Outcome,
    ReadOnlyIntentError,
    intent_id_for,
    positive_ms,
)
from beam_agents.core.config import AgentConfig, check_required_approvals
from beam_agents.core.model_calls import ModelGateway, ReplayCache, cache_key_for_digest
from beam_agents.core.observability import MEMORY_SLOTS_ATTRIBUTE, ActivationRecorder, TraceRecorder
from beam_agents.core.state import WorkingMemory, decode_cache
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.tools import ToolRegistry, ToolRunner
from beam_agents.tools.errors import SideEffectToolError, ToolArgumentError, ToolNotFoundError

__all__ = ["ActivationContext", "ActivationServices", "Resumption", "StepRecord", "staged"]


_REFUSED_UNRUN = (ToolNotFoundError, SideEffectToolError, ToolArgumentError)
"""What ``run_tool`` raises before a tool runs: nothing happened, so nothing is traced."""


def _no_time_limit() -> float | None:
    return None


@dataclass(frozen=True, slots=True)
class ActivationServices:
    """What all activations of one runtime instance share: model, tools and defaults."""

    model: ModelGateway | None
    tool_registry: ToolRegistry
    tool_runner: ToolRunner
    intent_ttl_ms: int
    approval_channel: str
    approval_ttl_ms: int
    cache_max_entries: int
    cache_max_bytes: int
    max_tokens_per_run: int | None = None
    time_left_s: Callable[[], float | None] = _no_time_limit
    """Seconds left in the running activation's time budget (``None``: unbounded)."""
    intent_namespace: str | None = None
    """``AgentConfig.namespace``: the intent namespace new runs mint their ids in."""
    unvalidated_tools: set[str] = field(default_factory=set, compare=False)
    """Tools ``act`` staged without a registry entry to validate them, warned about once each."""
    required_approvals: int = 1
    """``HitlPolicy.required_approvals``: the quorum of ``request_approval`` unless it says."""


def activation_services(
    config: AgentConfig,
    model: ModelGateway | None,
    tool_runner: ToolRunner,
    time_left_s: Callable[[], float | None],
) -> ActivationServices:
    """The services for ``config``'s activations; the DoFn and ``replay`` both build them."""
    policy = config.hitl_policy
    return ActivationServices(
        model=model,
        tool_registry=config.tool_registry,
        tool_runner=tool_runner,
        intent_ttl_ms=config.intent_ttl_ms,
        approval_channel="" if policy is None else policy.approval_channel,
        approval_ttl_ms=config.intent_ttl_ms if policy is None else policy.intent_ttl_ms,
        cache_max_entries=config.model_cache_max_entries,
        cache_max_bytes=config.model_cache_max_bytes,
        max_tokens_per_run=config.max_tokens_per_run,
        time_left_s=time_left_s,
        intent_namespace=config.namespace,
        required_approvals=1 if policy is None else policy.required_approvals,
    )


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
        staged = self._staged
        if staged.memory is None:
            staged.memory = WorkingMemory(self._load_memory())
        return staged.memory

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

    def _replay_cache(self) -> ReplayCache:
        staged = self._staged
        if staged.cache is None:
            blob = self._load_cache()
            staged.cache = ReplayCache(
                None if blob is None else decode_cache(blob),
                max_entries=self._services.cache_max_entries,
                max_bytes=self._services.cache_max_bytes,
                serialized=blob,
            )
        return staged.cache

    def _refuse_over_budget(self, limit: int, detail: str) -> BudgetExceededError:
        error = BudgetExceededError(
            f"run seq {self.seq} {detail}: {self.run_tokens_used} tokens used of its "
            f"max_tokens_per_run budget of {limit}"
        )
        self._staged.budget_error = error
        return error

    async def call_model(self, request: LlmRequest) -> LlmResponse:
        """Call the model through the replay cache; takes a step; traced as ``LLM_CALL``.

        A request at the position of a committed call is replayed without reaching the
        provider. A ``ProviderError`` that survives ``AgentConfig.model_retry`` propagates.
        Past the run's token budget it raises ``BudgetExceededError``.
        """
        if not isinstance(request, LlmRequest):
            raise TypeError(f"call_model takes an LlmRequest, got {type(request).__name__}")
        model = self._services.model
        if model is None:
            raise ModelNotConfiguredError(
                "the agent called the model, but AgentConfig.provider_factory is not set; "
                "pass provider_factory=<a zero-argument function returning the model client>"
            )
        staged = self._staged
        if staged.budget_error is not None:
            raise staged.budget_error
        started_ns = staged.trace.wall_ns()
        request_json, request_digest = request.canonical_json_and_digest()
        step, _ = staged.cursor.take(StepRecord.MODEL, bytes.fromhex(request_digest))
        cache_key = cache_key_for_digest(request_digest, self.entity_key, self.seq, step)
        cache = self._replay_cache()
        entry = cache.lookup(cache_key)
        if entry is not None:
            response = model.replay(entry)
            attempts = 0
        else:
            limit = self._services.max_tokens_per_run
            if limit is not None and self.run_tokens_used >= limit:
                raise self._refuse_over_budget(limit, "was refused a model call")
            answer = await model.complete(
                request, budget_s=self._services.time_left_s(), memo_key=cache_key
            )
            response, attempts = answer.response, answer.attempts
            cache.record(
                ModelCacheEntry(
                    cache_key=cache_key,
                    seq=self.seq,
                    step_index=step,
                    response=response.response,
                    input_tokens=response.usage.input_tokens,
                    output_tokens=response.usage.output_tokens,
                    stored_at_ms=self.now_ms,
                )
            )
            staged.tokens_used += response.usage.total_tokens
            if staged.recording is not None:
                staged.recording.model_call(
                    step,
                    request,
                    response,
                    model,
                    len(staged.intents),
                    request_json=request_json,
                    request_digest=request_digest,
                )
            if limit is not None and self.run_tokens_used > limit:
                raise self._refuse_over_budget(limit, "went over its token budget")
        trace = staged.trace
        attributes = (
            model.trace_attributes(
                request, response, attempts=attempts, cache_hit=entry is not None
            )
            if trace.enabled
            else None
        )
        trace.record(TraceEvent.LLM_CALL, step, attributes, started_ns)
        return response

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


# -- the step cursor: each model call and intent takes the next step --------------------------
# Below the run's high-water mark a step that repeats the recorded one is a replay; the first
# that differs ends replay and takes a fresh position from the high-water mark on.
StepRecord = Continuation.StepRecord
"""One recorded step of a run (kind and content digest), as the continuation stores it."""


class StepCursor:
    """Hands out step positions, replaying the run's recorded steps while they match."""

    __slots__ = ("_high_water", "_recorded", "_replay_end", "_step", "new_steps")

    def __init__(self, first_step: int, recorded: Sequence[StepRecord] = ()) -> None:
        self._recorded = recorded
        self._high_water = first_step
        # A run records every step it takes, so the replay prefix is all of them.
        self._replay_end = min(len(recorded), first_step)
        self._step = 0 if self._replay_end else first_step
        self.new_steps: list[tuple[int, bytes]] = []
        """``(StepRecord kind, digest)`` of every fresh step taken, in order."""

    @property
    def next_step(self) -> int:
        """The position the next step takes if it repeats the record (or is fresh)."""
        return self._step

    @property
    def high_water_step(self) -> int:
        """The first position no activation of this run has taken yet."""
        return max(self._step, self._high_water)

    def would_replay(self, kind: int, digest: bytes) -> bool:
        """Whether taking a step of ``kind`` and ``digest`` now would replay the run's record."""
        step = self._prefix_step()
        if step >= self._replay_end:
            return False
        record = self._recorded[step]
        return record.kind == kind and record.digest == digest

    def take(self, kind: int, digest: bytes) -> tuple[int, bool]:
        """Take the next step for ``kind`` and ``digest``: ``(position, replayed)``."""
        step = self._prefix_step()
        replay_end = self._replay_end
        if step < replay_end:
            record = self._recorded[step]
            if record.kind == kind and record.digest == digest:
                following = step + 1
                self._step = following if following < replay_end else self._high_water
                return step, True
            self._replay_end = 0
            step = self._high_water
        elif step != self._step:  # stepped over the prefix's last records
            step = self._high_water
        self._step = step + 1
        self.new_steps.append((kind, digest))
        return step, False

    def _prefix_step(self) -> int:
        """The position of the record the next step is compared with (or past the prefix)."""
        step = self._step
        # An escalation's approval is the runtime's step, never the agent's: step over it.
        while step < self._replay_end and self._recorded[step].kind == StepRecord.ESCALATION:
            step += 1
        return step


@dataclass(frozen=True, slots=True)
class Resumption:
    """What resumes a suspended run: the admitted result or approval and the run so far."""

    result: ToolResult | None
    approval: Approval | None
    snapshot: bytes
    results: Mapping[str, ToolResult]
    pending: tuple[tuple[str, int], ...]
    """Still-unanswered ``(intent_id, kind)`` pairs, in staging order."""
    tokens_used: int = 0
    """Tokens the run's earlier activations spent."""
    steps: Sequence[StepRecord] = ()
    """The run's recorded steps (``steps[i]`` is step ``i``): the replay prefix."""
    namespace: str | None = None
    """The intent namespace the run started in; all its intent ids are minted in it."""
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    """Every approval decision the run received so far, by intent id."""
    compensations: Sequence[CompensationLink] = ()
    """The run's compensation links (``ctx.compensate`` looks them up)."""


def run_namespace(continuation: Continuation) -> str | None:
    """The intent namespace of a suspended run (``None``: the default ids)."""
    return continuation.intent_namespace or None


# -- checking what act and request_approval are given -----------------------------------------
_log = logging.getLogger("beam_agents.core.context")


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
        return parsed, canonical_json(parsed)
    except (TypeError, ValueError) as exc:
        raise ToolArgumentError(
            f"arguments for {tool_name!r} are not JSON-encodable: {exc}", tool_name=tool_name
        ) from None


# -- staging: what an activation stages, committed whole or discarded whole -------------------
APPROVAL_TOOL_NAME = "approval"
"""The ``tool_name`` of every ``APPROVAL`` intent."""

STEP_KIND_OF_INTENT: dict[int, int] = {
    ToolIntent.TOOL: StepRecord.INTENT,
    ToolIntent.APPROVAL: StepRecord.APPROVAL,
}
"""The ``StepRecord`` kind a staged intent of each ``ToolIntent.Kind`` records."""


def intent_step_digest(kind: int, tool_name: str, args_json: str, link: str = "") -> bytes:
    """The digest recorded for an intent step: kind, tool, arguments and ``link`` if any."""
    content = f"{kind}|{tool_name}|{args_json}" + (f"|{link}" if link else "")
    return hashlib.sha256(content.encode()).digest()


class Staged:
    """Everything one activation staged; the runtime commits it only if the agent succeeds."""

    __slots__ = (
        "budget_error",
        "cache",
        "carried",
        "cursor",
        "intents",
        "links",
        "memory",
        "namespace",
        "recording",
        "tokens_before",
        "tokens_used",
        "trace",
    )

    def __init__(
        self,
        trace: TraceRecorder,
        cursor: StepCursor,
        carried: tuple[tuple[str, int], ...] = (),
        tokens_before: int = 0,
        *,
        namespace: str | None = None,
        links: Sequence[CompensationLink] = (),
    ) -> None:
        self.trace = trace
        self.cursor = cursor
        self.carried = carried
        """``(intent_id, kind)`` of the run's earlier intents still unanswered."""
        self.tokens_before = tokens_before
        self.namespace = namespace
        self.intents: list[ToolIntent] = []
        self.links = [_copied(link) for link in links]
        """The run's compensation links, this activation's too."""
        self.tokens_used = 0
        """Tokens the provider reported for this activation's calls (replays spend none)."""
        self.budget_error: BudgetExceededError | None = None
        """Set once a call went past the run's token budget: the activation must fail."""
        self.memory: WorkingMemory | None = None
        self.cache: ReplayCache | None = None
        self.recording: ActivationRecorder | None = None
        """What the activation's record needs beyond this, if ``AgentConfig.record`` is on."""

    @property
    def run_tokens_used(self) -> int:
        """Tokens spent by the whole run so far: earlier activations plus this one."""
        return self.tokens_before + self.tokens_used

    def closing_attributes(self, attributes: dict[str, str]) -> dict[str, str]:
        """``attributes`` plus the key's memory slot sizes, if this activation used memory.

        Memory it changed is always given, ``{}`` once emptied, so no stale sizes linger.
        """
        memory = self.memory
        if memory is not None and self.trace.enabled:
            sizes = memory.slot_sizes
            if sizes or memory.changed:
                attributes[MEMORY_SLOTS_ATTRIBUTE] = (
                    _sizes_json(tuple(sizes.items()))
                    if len(sizes) <= _MEMOISED_SLOTS
                    else canonical_json(sizes)
                )
        return attributes

    def pending_after(self) -> list[tuple[str, int]]:
        """``(intent_id, kind)`` of every unanswered intent, carried ones first, for a Suspend."""
        return [*self.carried, *((intent.intent_id, intent.kind) for intent in self.intents)]

    def stage_intent(
        self,
        kind: int,
        tool_name: str,
        args_json: str,
        ttl_ms: int,
        channel: str,
        *,
        required_approvals: int = 0,
        gated_tool: str = "",
        edited_from: ApprovalEdit | None = None,
        compensate_with: tuple[str, str] | None = None,
        compensates: str = "",
    ) -> str:
        """Take the next step for an intent and stage it; return its id.

        A step that replays the run's record stages nothing. ``compensate_with`` is not part of
        the step's digest, so changing an undo never re-runs an effect: a replayed step keeps
        the link it was staged with. ``compensates`` makes a compensating intent, which never
        expires; it is part of the digest.
        """
        link = compensation_link_text(compensates)
        step, replayed = self.cursor.take(
            STEP_KIND_OF_INTENT[kind], intent_step_digest(kind, tool_name, args_json, link)
        )
        trace = self.trace
        intent_id = intent_id_for(trace.entity_key, trace.seq, step, self.namespace)
        if replayed:
            recorded = next((k for k in self.links if k.intent_id == intent_id), None)
            if compensate_with is not None and (
                recorded is None or (recorded.tool_name, recorded.args_json) != compensate_with
            ):
                _log.warning(
                    "intent %s was staged with %s; a replay keeps it as staged (ctx.compensate "
                    "uses the recorded link)",
                    intent_id,
                    "no compensate_with" if recorded is None else "another compensate_with",
                )
            return intent_id
        created_at_ms = trace.now_ms
        intent = ToolIntent(
            intent_id=intent_id,
            entity_key=trace.entity_key,
            seq=trace.seq,
            step_index=step,
            tool_name=tool_name,
            args_json=args_json,
            created_at_ms=created_at_ms,
            expires_at_ms=0 if compensates else created_at_ms + ttl_ms,
            kind=kind,  # type: ignore[arg-type]
            trace_id=trace.trace_id,
            channel=channel,
            required_approvals=required_approvals if required_approvals > 1 else 0,
            gated_tool=gated_tool,
            edited_from=edited_from,
            compensates_intent_id=compensates,
            compensate_tool=compensate_with[0] if compensate_with else "",
            compensate_args_json=compensate_with[1] if compensate_with else "",
        )
        # Built and checked before it is traced: an intent that cannot be built (an expiry
        # past int64), or that the effector could not record, leaves no trace.
        problem = recordable_problem(intent)
        if problem is not None:
            raise ToolArgumentError(
                f"intent for {tool_name!r} {problem}: the effector would refuse it unrecorded",
                tool_name=tool_name,
            )
        trace.record(
            TraceEvent.INTENT_EMITTED,
            step,
            {"intent_id": intent_id, "tool_name": tool_name, "kind": ToolIntent.Kind.Name(kind)},
        )
        self.intents.append(intent)
        self._link(intent_id, step, compensate_with)
        return intent_id

    def _link(self, intent_id: str, step: int, compensate_with: tuple[str, str] | None) -> None:
        """Record the run's link from ``intent_id`` to its compensation, once."""
        if compensate_with is None or any(link.intent_id == intent_id for link in self.links):
            return
        tool_name, args_json = compensate_with
        self.links.append(
            CompensationLink(
                intent_id=intent_id, step_index=step, tool_name=tool_name, args_json=args_json
            )
        )


def compensation_link_text(compensates: str) -> str:
    """What a compensating intent adds to its step digest ("" for any other intent)."""
    return f"compensates:{compensates}" if compensates else ""


def _copied(link: CompensationLink) -> CompensationLink:
    copy = CompensationLink()
    copy.CopyFrom(link)
    return copy


_MEMOISED_SLOTS = 4
"""Slot sizes of memories up to this many slots are memoised (small entries; they recur)."""


@functools.lru_cache(maxsize=1024)
def _sizes_json(sizes: tuple[tuple[str, int], ...]) -> str:
    """The memory slot sizes as canonical JSON (a key's sizes recur from one activation on)."""
    return canonical_json(dict(sizes))


# -- approvals bound to their arguments -------------------------------------------------------
_APPROVAL_STEPS = frozenset({StepRecord.APPROVAL, StepRecord.ESCALATION})


def edit_diff(original: Mapping[str, Any], edited: Mapping[str, Any]) -> str:
    """The canonical JSON of an edit's ``added``, ``changed`` and ``removed`` arguments."""
    added = {name: value for name, value in edited.items() if name not in original}
    removed = {name: value for name, value in original.items() if name not in edited}
    changed = {
        name: {"from": original[name], "to": value}
        for name, value in edited.items()
        if name in original and canonical_json(original[name]) != canonical_json(value)
    }
    parts = {"added": added, "changed": changed, "removed": removed}
    return canonical_json({part: names for part, names in parts.items() if names})


def stale_approval(key: bytes, suspended: Continuation, approval: Approval) -> str | None:
    """Why ``approval`` was decided on other arguments than its pending intent's, or ``None``."""
    if not approval.args_digest:
        return None
    namespace = suspended.intent_namespace or None
    for step_index, step in enumerate(suspended.steps):
        if step.kind not in _APPROVAL_STEPS:
            continue
        if intent_id_for(key, suspended.seq, step_index, namespace) != approval.intent_id:
            continue
        recorded = step.digest.hex()
        if recorded == approval.args_digest:
            return None
        return (
            f"stale approval: the decision on intent {approval.intent_id!r} by "
            f"{approval.approver!r} was made on arguments with digest {approval.args_digest}, "
            f"but the run asked about arguments with digest {recorded}; it is not applied and "
            "the run keeps waiting"
        )
    return None


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


# -- compensation: linking an effect to its undo, and staging the undo ------------------------
# A compensation takes a step like any intent, so its id is a pure function of its position
# and a re-walk returns it again. The effector runs it only if its original ran.
NEVER_RAN = frozenset({ToolResult.EXPIRED, ToolResult.REJECTED, ToolResult.NOT_NEEDED})
"""Results of an effect that never ran: a route has nothing to undo for it."""


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


def stage_compensation(staged: Staged, intent_id: str, high_water_step: int) -> str:
    """Stage the compensation linked to ``intent_id``, taking a step; return its id."""
    link = _link_of(staged, intent_id, high_water_step)
    tool_name, args_json = link.tool_name, link.args_json
    if link.compensation_intent_id:
        digest = intent_step_digest(
            ToolIntent.TOOL, tool_name, args_json, compensation_link_text(intent_id)
        )
        if not staged.cursor.would_replay(STEP_KIND_OF_INTENT[ToolIntent.TOOL], digest):
            raise CompensationError(
                f"intent {intent_id} is already compensated by intent "
                f"{link.compensation_intent_id}; a compensation is staged once per effect",
                intent_id=intent_id,
            )
    compensation_id = staged.stage_intent(
        ToolIntent.TOOL, tool_name, args_json, 0, "", compensates=intent_id
    )
    link.compensation_intent_id = compensation_id
    return compensation_id


def stage_route_compensations(suspended: Continuation, trace: TraceRecorder) -> list[ToolIntent]:
    """Stage, newest first, the compensations a ``Deny(compensate=True)`` route takes.

    One per linked effect not yet compensated unless its result says it never ran.
    """
    outcome = {result.intent_id: result.status for result in suspended.results}
    staged = Staged(trace, StepCursor(suspended.next_step), namespace=run_namespace(suspended))
    for link in sorted(suspended.compensations, key=lambda link: -link.step_index):
        if link.compensation_intent_id or outcome.get(link.intent_id) in NEVER_RAN:
            continue
        staged.stage_intent(
            ToolIntent.TOOL, link.tool_name, link.args_json, 0, "", compensates=link.intent_id
        )
    return staged.intents


def _link_of(staged: Staged, intent_id: str, high_water_step: int) -> CompensationLink:
    for link in staged.links:
        if link.intent_id == intent_id:
            return link
    if not isinstance(intent_id, str):
        raise TypeError(f"compensate takes an intent id (str), got {type(intent_id).__name__}")
    trace = staged.trace
    ours = {
        intent_id_for(trace.entity_key, trace.seq, step, staged.namespace)
        for step in range(high_water_step)
    }
    if intent_id in ours:
        raise CompensationError(
            f"intent {intent_id} was staged without compensate_with, so it has no compensation; "
            "stage it with ctx.act(..., compensate_with=(tool_name, args))",
            intent_id=intent_id,
        )
    raise CompensationError(
        f"intent {intent_id} was not staged by this run (key {trace.entity_key!r}, seq "
        f"{trace.seq}); only a run's own effects can be compensated",
        intent_id=intent_id,
    )


AgentFn: TypeAlias = Callable[[ActivationContext], Coroutine[Any, Any, Outcome]]
"""The shape of an agent: ``async def agent(ctx: ActivationContext) -> Complete | Suspend``."""
