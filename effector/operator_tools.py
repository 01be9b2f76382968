"""The operator tools behind the MCP endpoint: what each reads or decides, and its result.

:class:`OperatorTools` answers ``list_pending_approvals``, ``approve``, ``deny`` and
``intent_status`` over one effector's service: lists and reads go to the store (as the console
and ``show`` do), and a decision goes through :meth:`EffectorService.decide`, the code of the
``Decide`` RPC and of the console's inbox, with the identity configured for the token as the
approver. Arguments and results are pydantic models, whose JSON schemas the endpoint
publishes. A call it cannot carry out raises :class:`ToolRefusal` with a message for the
caller. :mod:`effector.operator_mcp` serves these over MCP; this module never imports ``mcp``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextvars import ContextVar
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import effector.decisions as decisions
from beam_agents._protos import IntentState, ToolIntent, ToolResult, approval_digest, canonical_json
from effector.commands import payload_text
from effector.identities import Approver
from effector.intents import display_key, expiry_deadline_ms, intent_id_problem
from effector.service import MAX_TEXT_FIELD_CHARS, EffectorService
from effector.store.base import Decision, IntentRecord

_log = logging.getLogger(__name__)

CALLER: ContextVar[Approver | None] = ContextVar("effector_mcp_caller", default=None)
"""Who holds the token of the MCP call being handled (set around each call): a named token
is the approver its decisions record, and may be limited to channels."""

DEFAULT_PENDING_LIMIT = 20
"""Approvals ``list_pending_approvals`` returns when no limit is given."""
MAX_PENDING_LIMIT = 100
"""The most approvals one ``list_pending_approvals`` returns."""


class ToolRefusal(Exception):
    """A tool call that cannot be carried out; its message is shown to the caller."""


# Arguments ------------------------------------------------------------------------------------


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListPendingArguments(_Arguments):
    """Arguments of ``list_pending_approvals``."""

    limit: int = Field(
        DEFAULT_PENDING_LIMIT,
        ge=1,
        le=MAX_PENDING_LIMIT,
        description="How many approvals to list at most (oldest first).",
    )


class IntentArguments(_Arguments):
    """Arguments naming one intent."""

    intent_id: str = Field(description="The intent's id (a canonical UUID).")


class DecideArguments(IntentArguments):
    """Arguments of ``approve`` and ``deny``."""

    reason: str = Field(
        min_length=1,
        max_length=MAX_TEXT_FIELD_CHARS,
        pattern=r"\S",
        description="Why: recorded with the decision and passed to the waiting agent.",
    )
    args_digest: str = Field(
        default="",
        description="The args_digest list_pending_approvals showed: the decision is refused "
        "if the approval's arguments are not those you saw. Default: their digest now.",
    )
    edited_args: dict[str, Any] | None = Field(
        default=None,
        description="approve only: approve these arguments instead (validated against the "
        "tool the approval gates).",
    )


# Results --------------------------------------------------------------------------------------


class PendingApproval(BaseModel):
    """One approval awaiting a decision."""

    intent_id: str
    entity_key: str = Field(description="The agent's key: text, or 0x and its hex.")
    tool: str = Field(description="The tool the approval is about; empty if none is named.")
    args: Any = Field(description="The arguments under approval (parsed JSON).")
    channel: str = Field(description="The channel the approval was asked on; may be empty.")
    created_at_ms: int
    deadline_ms: int = Field(description="When it expires undecided (epoch ms); 0 for never.")
    args_digest: str = Field(description="The digest of args: send it back with a decision.")
    gated_tool: str = Field(description="The tool whose call it gates (edits are checked).")
    required_approvals: int = Field(description="Distinct approvers needed (any deny denies).")


class PendingApprovals(BaseModel):
    """The answer of ``list_pending_approvals``."""

    approvals: list[PendingApproval]
    pending: int = Field(description="How many approvals await a decision in all.")


class DecisionInfo(BaseModel):
    """A recorded approval decision."""

    approved: bool
    approver: str
    reason: str
    decided_at_ms: int


class DecisionMade(DecisionInfo):
    """The answer of ``approve`` and ``deny``: the decision recorded."""

    intent_id: str
    decision: Literal["approved", "denied"]
    quorum: str | None = Field(
        default=None,
        description="Set while a quorum is gathered: the vote was recorded, not yet decided.",
    )


class ResultInfo(BaseModel):
    """An intent's terminal result."""

    status: str = Field(description="OK, ERROR, EXPIRED or REJECTED.")
    payload: Any = Field(description="The result: parsed JSON, else text or 0x hex; null if none.")
    error: str | None
    completed_at_ms: int


class IntentStatus(BaseModel):
    """The answer of ``intent_status``."""

    intent_id: str
    kind: str = Field(description="TOOL or APPROVAL.")
    state: str = Field(description="PENDING, RUNNING, AWAITING_DECISION or DONE.")
    entity_key: str
    tool: str
    args: Any
    attempts: int
    created_at_ms: int
    deadline_ms: int = Field(description="When it expires at the effector (epoch ms); 0: never.")
    result: ResultInfo | None = Field(description="Once DONE: its result.")
    decision: DecisionInfo | None = Field(description="For a decided approval: the decision.")


# The tools ------------------------------------------------------------------------------------


def _json_value(text: str) -> Any:
    """``text`` parsed as JSON, or ``text`` itself if it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _payload(payload: bytes) -> Any:
    """A result's payload: parsed JSON, else printable text or ``0x`` hex; ``None`` if empty."""
    if not payload:
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return payload_text(payload)


def _decision_of(record: IntentRecord) -> DecisionInfo | None:
    """The decision stored as a decided approval's OK result, if there is one."""
    result = record.result
    if (
        record.intent.kind != ToolIntent.APPROVAL
        or result is None
        or result.status != ToolResult.OK
    ):
        return None
    try:
        return DecisionInfo.model_validate_json(result.payload)
    except ValidationError:
        return None


def _checked_id(intent_id: str) -> str:
    problem = intent_id_problem(intent_id)
    if problem is not None:
        raise ToolRefusal(f"bad intent_id: {problem}")
    return intent_id


class OperatorTools:
    """The endpoint's tools over one effector's service, deciding as ``identity``."""

    def __init__(self, service: EffectorService, identity: str) -> None:
        self._service = service
        self._identity = identity

    async def list_pending_approvals(self, arguments: ListPendingArguments) -> PendingApprovals:
        """The approvals awaiting a decision, oldest first, with their deadlines."""
        store = self._service.store
        oldest = await store.list_intents(IntentState.AWAITING_DECISION, arguments.limit)
        records = await asyncio.gather(*(store.get_intent(i.intent_id) for i in oldest))
        waiting = [r for r in records if r is not None and r.state == IntentState.AWAITING_DECISION]
        pending = (await store.counts(done=False)).awaiting_decision
        approvals = [
            PendingApproval(
                intent_id=r.intent.intent_id,
                entity_key=display_key(r.intent.entity_key),
                tool=r.intent.tool_name,
                args=_json_value(r.intent.args_json or "{}"),
                channel=r.intent.channel,
                created_at_ms=r.intent.created_at_ms,
                deadline_ms=expiry_deadline_ms(r.intent, r.received_at_ms),
                args_digest=approval_digest(r.intent.args_json),
                gated_tool=r.intent.gated_tool,
                required_approvals=max(r.intent.required_approvals, 1),
            )
            for r in waiting
        ]
        return PendingApprovals(approvals=approvals, pending=max(pending, len(approvals)))

    async def intent_status(self, arguments: IntentArguments) -> IntentStatus:
        """Everything recorded about one intent, as ``show`` prints it."""
        record = await self._service.store.get_intent(_checked_id(arguments.intent_id))
        if record is None:
            raise ToolRefusal(f"no intent {arguments.intent_id} (unknown, or pruned)")
        intent, result = record.intent, record.result
        return IntentStatus(
            intent_id=intent.intent_id,
            kind=ToolIntent.Kind.Name(intent.kind),
            state=IntentState.Name(record.state),
            entity_key=display_key(intent.entity_key),
            tool=intent.tool_name,
            args=_json_value(intent.args_json or "{}"),
            attempts=record.attempts,
            created_at_ms=intent.created_at_ms,
            deadline_ms=expiry_deadline_ms(intent, record.received_at_ms),
            result=None
            if result is None
            else ResultInfo(
                status=ToolResult.Status.Name(result.status),
                payload=_payload(result.payload),
                error=result.error_message or None,
                completed_at_ms=result.completed_at_ms,
            ),
            decision=_decision_of(record),
        )

    async def approve(self, arguments: DecideArguments, client: str) -> DecisionMade:
        """Approve one approval intent, recording the configured identity and the reason."""
        return await self._decide(arguments, approved=True, client=client)

    async def deny(self, arguments: DecideArguments, client: str) -> DecisionMade:
        """Deny one approval intent, recording the configured identity and the reason."""
        return await self._decide(arguments, approved=False, client=client)

    async def _decide(
        self, arguments: DecideArguments, *, approved: bool, client: str
    ) -> DecisionMade:
        intent_id = _checked_id(arguments.intent_id)
        digest = arguments.args_digest
        if not digest:
            record = await self._service.store.get_intent(intent_id)
            digest = "" if record is None else approval_digest(record.intent.args_json)
        edited = arguments.edited_args
        try:
            outcome = await self._service.decide(
                intent_id,
                approved=approved,
                approver=self._identity,
                reason=arguments.reason,
                args_digest=digest,
                edited_args_json="" if edited is None else canonical_json(edited),
                identity=CALLER.get(),
            )
        except ValueError as refused:
            raise ToolRefusal(str(refused)) from None
        _log.info(
            "mcp: %s of intent %s by %r from %s %s",
            "approval" if approved else "denial",
            intent_id,
            self._identity,
            client,
            "applied" if outcome.applied else f"not applied ({outcome.reason})",
        )
        if not outcome.applied:
            raise ToolRefusal(await self._not_applied(intent_id, outcome))
        verdict: Literal["approved", "denied"] = "approved" if approved else "denied"
        if outcome.result is None:  # a vote towards a quorum
            approver = decisions.recorded_approver(CALLER.get(), self._identity)
            return DecisionMade(
                intent_id=intent_id,
                decision=verdict,
                approved=approved,
                approver=approver,
                reason=arguments.reason,
                decided_at_ms=0,
                quorum=outcome.reason,
            )
        decided = DecisionInfo.model_validate_json(outcome.result.payload)
        return DecisionMade(intent_id=intent_id, decision=verdict, **decided.model_dump())

    async def _not_applied(self, intent_id: str, outcome: Decision) -> str:
        """Why a decision was not applied, in words an operator can act on."""
        if outcome.state == IntentState.INTENT_STATE_UNSPECIFIED:
            return f"no intent {intent_id} (unknown, or pruned): nothing was decided"
        record = await self._service.store.get_intent(intent_id)
        if record is not None and record.intent.kind != ToolIntent.APPROVAL:
            return f"intent {intent_id} is a tool call, not an approval: only approvals are decided"
        earlier = None if record is None else _decision_of(record)
        if outcome.reason == "already decided" and earlier is not None:
            verdict = "approved" if earlier.approved else "denied"
            return (
                f"approval {intent_id} was already {verdict} by {earlier.approver!r}"
                f" ({earlier.reason or 'no reason given'}): a decision cannot be changed"
            )
        return f"the decision on approval {intent_id} was not applied: {outcome.reason}"
