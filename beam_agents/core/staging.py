"""What an activation stages, committed whole or discarded whole, and the services it uses.

The step cursor gives each model call and intent its position; :class:`Staged` holds the
intents, memory, replay cache, tokens and record of one activation. ``ActivationContext`` in
``core.context`` checks what the agent passes and stages it here.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from beam_agents._protos import (
    Approval,
    ApprovalEdit,
    CompensationLink,
    Continuation,
    ModelCacheEntry,
    ToolIntent,
    ToolResult,
    TraceEvent,
    canonical_json,
    debit_id_for,
    recordable_problem,
)
from beam_agents.core.agent import (
    BudgetExceededError,
    CompensationError,
    intent_id_for,
)
from beam_agents.core.config import AgentConfig
from beam_agents.core.model_calls import ModelGateway, ReplayCache, cache_key_for_digest
from beam_agents.core.observability import MEMORY_SLOTS_ATTRIBUTE, ActivationRecorder, TraceRecorder
from beam_agents.core.state import MemorySlots, decode_cache
from beam_agents.model.client import LlmRequest, LlmResponse
from beam_agents.tools import ToolRegistry, ToolRunner
from beam_agents.tools.errors import ToolArgumentError

_log = logging.getLogger(__name__)


def _no_time_limit() -> float | None:
    return None


@dataclass(frozen=True, slots=True)
class Allowance:
    """What admitted a model call under a fleet budget: the ledger, its window and the lease."""

    ledger: str
    window_start_ms: int
    lease_id: str
    encoded: str
    """``"lease_id":...,"ledger":...`` as canonical JSON, built once per lease for the debits."""


def allowance_for(ledger: str, window_start_ms: int, lease_id: str) -> Allowance:
    """The :class:`Allowance` of a lease, with its part of every debit's JSON encoded once."""
    encoded = canonical_json({"lease_id": lease_id, "ledger": ledger})[1:-1]
    return Allowance(ledger, window_start_ms, lease_id, encoded)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call spent of one fleet budget: debited when its activation commits."""

    allowance: Allowance
    tokens: int
    cost_micros: int
    requests: int = 1


class FleetBudget(Protocol):
    """The worker's side of the fleet budgets (``AgentConfig.budget``): leases, admits, spends."""

    def admit(self, entity_key: bytes, call_id: str, model: str) -> tuple[Allowance, ...]:
        """The allowances call ``call_id`` of ``entity_key`` to ``model`` spends, one per budget.

        Raises ``BudgetExceeded`` when a budget has nothing left. A call admitted before (a
        retried activation) gets its first allowances again, unchecked.
        """

    def spend(
        self, allowances: tuple[Allowance, ...], model: str, response: LlmResponse, call_id: str
    ) -> tuple[Charge, ...]:
        """Take the call's usage off its allowances (once per call); what to debit from each."""


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
    budget: FleetBudget | None = None
    """The fleet budget every provider call is admitted by and debited from, if any."""


def activation_services(
    config: AgentConfig,
    model: ModelGateway | None,
    tool_runner: ToolRunner,
    time_left_s: Callable[[], float | None],
    budget: FleetBudget | None = None,
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
        budget=budget,
    )


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
        "debits",
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
        self.debits: list[ToolIntent] = []
        """BUDGET_DEBIT intents of this activation's provider calls, emitted when it commits."""
        self.links = [_copied(link) for link in links]
        """The run's compensation links, this activation's too."""
        self.tokens_used = 0
        """Tokens the provider reported for this activation's calls (replays spend none)."""
        self.budget_error: BudgetExceededError | None = None
        """Set once a call went past the run's token budget: the activation must fail."""
        self.memory: MemorySlots | None = None
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

    def replay_cache(
        self, services: ActivationServices, load_cache: Callable[[], bytes | None]
    ) -> ReplayCache:
        """The run's replay cache, read from the key's cell on first use."""
        cache = self.cache
        if cache is None:
            blob = load_cache()
            cache = self.cache = ReplayCache(
                None if blob is None else decode_cache(blob),
                max_entries=services.cache_max_entries,
                max_bytes=services.cache_max_bytes,
                serialized=blob,
            )
        return cache

    def _refuse_over_budget(self, limit: int, detail: str) -> BudgetExceededError:
        error = BudgetExceededError(
            f"run seq {self.trace.seq} {detail}: {self.run_tokens_used} tokens used of its "
            f"max_tokens_per_run budget of {limit}"
        )
        self.budget_error = error
        return error

    async def call_model(
        self,
        request: LlmRequest,
        services: ActivationServices,
        load_cache: Callable[[], bytes | None],
    ) -> LlmResponse:
        """``ActivationContext.call_model`` once its request is checked: replayed or called."""
        model = services.model
        assert model is not None  # the context refuses a call without a model
        if self.budget_error is not None:
            raise self.budget_error
        trace = self.trace
        started_ns = trace.wall_ns()
        request_json, request_digest = request.canonical_json_and_digest()
        step, _ = self.cursor.take(StepRecord.MODEL, bytes.fromhex(request_digest))
        cache_key = cache_key_for_digest(request_digest, trace.entity_key, trace.seq, step)
        cache = self.replay_cache(services, load_cache)
        entry = cache.lookup(cache_key)
        if entry is not None:
            response = model.replay(entry)
            attempts = 0
        else:
            limit = services.max_tokens_per_run
            if limit is not None and self.run_tokens_used >= limit:
                raise self._refuse_over_budget(limit, "was refused a model call")
            fleet = services.budget
            allowances = (
                () if fleet is None else fleet.admit(trace.entity_key, cache_key, request.model_id)
            )
            answer = await model.complete(
                request, budget_s=services.time_left_s(), memo_key=cache_key
            )
            response, attempts = answer.response, answer.attempts
            if fleet is not None and allowances:
                for charge in fleet.spend(allowances, request.model_id, response, cache_key):
                    self._stage_debit(step, charge)
            cache.record(
                ModelCacheEntry(
                    cache_key=cache_key,
                    seq=trace.seq,
                    step_index=step,
                    response=response.response,
                    input_tokens=response.usage.input_tokens,
                    output_tokens=response.usage.output_tokens,
                    stored_at_ms=trace.now_ms,
                )
            )
            self.tokens_used += response.usage.total_tokens
            if self.recording is not None:
                self.recording.model_call(
                    step,
                    request,
                    response,
                    model,
                    len(self.intents),
                    request_json=request_json,
                    request_digest=request_digest,
                )
            if limit is not None and self.run_tokens_used > limit:
                raise self._refuse_over_budget(limit, "went over its token budget")
        attributes = (
            model.trace_attributes(
                request, response, attempts=attempts, cache_hit=entry is not None
            )
            if trace.enabled
            else None
        )
        trace.record(TraceEvent.LLM_CALL, step, attributes, started_ns)
        return response

    def _stage_debit(self, step: int, charge: Charge) -> None:
        """Stage the BUDGET_DEBIT of the provider call at ``step`` (emitted if it commits).

        Its arguments are the canonical JSON of cost_micros, lease_id, ledger, requests, tokens
        and window_start_ms, written from the lease's encoded part.
        """
        trace = self.trace
        allowance = charge.allowance
        args_json = (
            f'{{"cost_micros":{charge.cost_micros},{allowance.encoded},'
            f'"requests":{charge.requests},"tokens":{charge.tokens},'
            f'"window_start_ms":{allowance.window_start_ms}}}'
        )
        key, seq, namespace = trace.entity_key, trace.seq, self.namespace
        self.debits.append(
            ToolIntent(
                intent_id=debit_id_for(key, seq, step, allowance.ledger, namespace),
                entity_key=key,
                seq=seq,
                step_index=step,
                args_json=args_json,
                created_at_ms=trace.now_ms,
                kind=ToolIntent.BUDGET_DEBIT,
                intent_namespace=namespace or "",
            )
        )

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
            intent_namespace=self.namespace or "",
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


# -- compensation: linking an effect to its undo, and staging the undo ------------------------
# A compensation takes a step like any intent, so its id is a pure function of its position
# and a re-walk returns it again. The effector runs it only if its original ran.
NEVER_RAN = frozenset({ToolResult.EXPIRED, ToolResult.REJECTED, ToolResult.NOT_NEEDED})
"""Results of an effect that never ran: a route has nothing to undo for it."""


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
