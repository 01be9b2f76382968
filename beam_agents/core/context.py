"""``ActivationContext``: everything an agent can see and do during one activation.

Nothing the agent does takes effect at once: memory writes, replay-cache inserts, intents and
trace events go to the activation's :class:`~beam_agents.core.staging.Staged` record, which the
runtime commits only if the activation succeeds (invariant 1). The step cursor, the replay
prefix, the token budget and intent times are explained in ``core/README.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from beam_agents._protos import Approval, ModelCacheEntry, ToolIntent, ToolResult, TraceEvent
from beam_agents.core.approvals import approved_call
from beam_agents.core.arguments import arguments_json, check_side_effect_call, check_ttl
from beam_agents.core.compensation import check_compensate_with, stage_compensation
from beam_agents.core.continuation import Resumption
from beam_agents.core.cursor import ReplayCursor, StepRecord
from beam_agents.core.errors import (
    BudgetExceededError,
    ModelNotConfiguredError,
    ReadOnlyIntentError,
)
from beam_agents.core.memory import WorkingMemory
from beam_agents.core.model_gateway import ModelGateway
from beam_agents.core.staging import (
    APPROVAL_TOOL_NAME,
    Staged,
)
from beam_agents.core.state import decode_cache
from beam_agents.core.tracing import TraceRecorder
from beam_agents.hitl import check_required_approvals
from beam_agents.model.cache import ReplayCache, cache_key_for_digest
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.tools import ToolRegistry, ToolRunner
from beam_agents.tools.errors import (
    SideEffectToolError,
    ToolArgumentError,
    ToolNotFoundError,
)

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
        "_load_cache",
        "_load_memory",
        "_pending_ids",
        "_result",
        "_results",
        "_services",
        "_snapshot",
        "_staged",
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
        if resumption is None:
            self._result: ToolResult | None = None
            self._approval: Approval | None = None
            self._snapshot = b""
            self._results: Mapping[str, ToolResult] = _NO_RESULTS
            self._approvals: Mapping[str, Approval] = _NO_APPROVALS
            self._pending_ids = _NONE_PENDING
            self._staged = Staged(
                trace, ReplayCursor(first_step), namespace=services.intent_namespace
            )
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
            self._staged = Staged(
                trace,
                ReplayCursor(first_step, resumption.steps),
                pending,
                resumption.tokens_used,
                namespace=resumption.namespace,
                links=resumption.compensations,
            )

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
        """Every approval decision received by this run so far, by intent id.

        Includes the "not approved" a deadline records for approvals it escalated
        (``approver == "beam-agents/deadline"``).
        """
        return self._approvals

    @property
    def pending_intent_ids(self) -> frozenset[str]:
        """Intents of this run still unanswered, including those staged in this activation."""
        intents = self._staged.intents
        if not intents:
            return self._pending_ids
        return self._pending_ids | {intent.intent_id for intent in intents}

    @property
    def next_step(self) -> int:
        """The step cursor: the ``step_index`` the next model call or intent will take.

        While a resumed activation replays the run's recorded steps, this is the position of
        the next record; a step that differs from it takes :attr:`high_water_step` instead.
        """
        return self._staged.cursor.next_step

    @property
    def high_water_step(self) -> int:
        """The first step position no activation of this run has taken yet."""
        return self._staged.cursor.high_water_step

    @property
    def run_tokens_used(self) -> int:
        """Tokens spent by the whole run so far: earlier activations plus this one."""
        return self._staged.run_tokens_used

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

        A call with the same request at the same run position as a committed one is replayed
        from the cache without reaching the provider. Otherwise the provider is called with
        ``AgentConfig.model_retry`` retries; a ``ProviderError`` that survives them propagates
        (and, unless the agent handles it, fails the activation as ``model_error``). Past the
        run's token budget it raises ``BudgetExceededError`` (``core/README.md``, "Model calls").
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
        staged.trace.record(
            TraceEvent.LLM_CALL,
            step,
            model.trace_attributes(
                request, response, attempts=attempts, cache_hit=entry is not None
            ),
            started_ns,
        )
        return response

    # -- tools ---------------------------------------------------------------------------

    async def run_tool(self, name: str, args: Mapping[str, Any]) -> Any:
        """Run the read-only tool ``name`` inline and return its result; traced as ``TOOL_CALL``.

        The tool comes from ``AgentConfig.tool_registry``; an unknown name raises
        ``ToolNotFoundError``, a side-effecting tool ``SideEffectToolError`` and invalid
        arguments ``ToolArgumentError`` (none of these is traced: nothing ran). Does not take
        a step.
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

        ``args`` is a JSON object (text) or a mapping, stored as canonical JSON. If the tool
        registry knows ``tool_name`` the arguments are validated now (``ToolArgumentError``),
        and a read-only tool is refused (``ReadOnlyIntentError``: run it with ``run_tool``).
        A name the registry lacks raises ``ToolNotFoundError`` if it holds side-effecting
        tools; without any, the intent is staged unvalidated (logged once per tool name).
        ``ttl_ms`` defaults to ``AgentConfig.intent_ttl_ms``. Takes a step; traced as
        ``INTENT_EMITTED``. Nothing executes here. Replaying a step of the run (the same tool
        and arguments at the same position; ``core/README.md``, "The replay prefix") returns
        the id it returned before and stages nothing.

        ``approval``: the approved decision (``ctx.resume_approval``) this call carries out;
        ``args`` are then the arguments given to ``request_approval``, which the decision's
        digest must name (``ValueError`` otherwise, or if it was denied). If the approver
        edited them, the edited arguments are staged instead, and the intent records its
        lineage (``ToolIntent.edited_from``: the approval's id, the approver, the diff).

        ``compensate_with=(tool_name, args)``: the side-effecting call that undoes this one,
        checked now like ``act``'s own; ``ctx.compensate(id)`` stages it (``core/README.md``).
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
        ttl = self._services.intent_ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
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

        The intent must have been staged by this run with ``act(..., compensate_with=...)``
        (in any activation of it); otherwise, or if it is already compensated, it raises
        ``CompensationError`` and takes no step. Stages a TOOL intent of the linked tool and
        arguments with ``compensates_intent_id`` set, which never expires; the effector runs
        it after the original, only if that ran (else its result is NOT_NEEDED). Takes a
        step; a re-walk returns the same id and stages nothing (``core/README.md``).
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

        ``channel`` defaults to ``HitlPolicy.approval_channel``, ``ttl_ms`` to
        ``HitlPolicy.intent_ttl_ms`` (``AgentConfig.intent_ttl_ms`` without a policy) and
        ``required_approvals`` (distinct approvers; any deny denies) to
        ``HitlPolicy.required_approvals`` (1). ``tool``: the side-effecting tool whose call
        ``args`` are (validated now if the registry knows it); approvers may then approve with
        edited arguments, which the effector validates against it, and
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
        ttl = self._services.approval_ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
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
