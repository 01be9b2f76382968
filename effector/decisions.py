"""Screening an approval decision before the store records it: identity, channel and edit.

What ``Decide``, the console and the MCP endpoint share beyond the store's own checks (digest
and quorum, ``store/_approvals.py``): the approver a named token records, the channels it may
decide, and approve-with-edit, whose arguments must be a JSON object the gated tool accepts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    ToolIntent,
    approval_digest,
    canonical_json,
)
from beam_agents.tools import ToolRegistry
from beam_agents.tools.errors import ToolArgumentError
from effector.identities import Approver, Tokens
from effector.store.base import Decision, EffectorStore, IntentRecord

MAX_TEXT_FIELD_CHARS = 4_096
"""The longest ``approver`` or ``reason`` a decision may carry."""
DIGEST_CHARS = 64
"""The length of an args digest (SHA-256, hex)."""


class InvalidDecisionError(ValueError):
    """A decision request that is malformed (not merely refused); its message is safe to show."""


@dataclass(frozen=True, slots=True)
class Ballot:
    """One decision as asked: approve or deny, by whom, why, on which arguments, edited how."""

    approved: bool
    approver: str
    reason: str
    args_digest: str = ""
    edited_args_json: str = ""


async def decide(
    store: EffectorStore,
    registry: ToolRegistry,
    intent_id: str,
    ballot: Ballot,
    identity: Approver | None,
    now_ms: int,
) -> Decision:
    """Screen ``ballot`` (see :func:`refusal`) and record it in ``store``.

    A named token's name is the approver recorded (:func:`recorded_approver`). Raises
    :class:`InvalidDecisionError` for text over the limit or a malformed digest.
    """
    approver = recorded_approver(identity, ballot.approver)
    for name, text in (("approver", approver), ("reason", ballot.reason)):
        if len(text) > MAX_TEXT_FIELD_CHARS:
            raise InvalidDecisionError(f"{name} is longer than {MAX_TEXT_FIELD_CHARS} characters")
    problem = digest_problem(ballot.args_digest)
    if problem is not None:
        raise InvalidDecisionError(problem)
    edited_args_json = ballot.edited_args_json
    if identity is not None or edited_args_json:
        record = await store.get_intent(intent_id)
        refused, edited_args_json = refusal(
            None if record is None else record.intent,
            IntentState.INTENT_STATE_UNSPECIFIED if record is None else record.state,
            identity,
            ballot.approved,
            edited_args_json,
            registry,
        )
        if refused is not None:
            return refused
    return await store.decide(
        intent_id,
        approved=ballot.approved,
        approver=approver,
        reason=ballot.reason,
        now_ms=now_ms,
        args_digest=ballot.args_digest,
        edited_args_json=edited_args_json,
    )


def caller(tokens: Tokens | None, metadata: Iterable[tuple[str, Any]] | None) -> Approver | None:
    """The holder of the bearer token in a call's ``metadata``; ``None`` without tokens."""
    if tokens is None:
        return None
    return tokens.identify_bearer(dict(metadata or ()).get("authorization"))


async def add_approval_details(
    store: EffectorStore, record: IntentRecord, response: GetIntentResponse
) -> None:
    """Fill an approval's ``args_digest`` and, while it awaits a quorum, its votes so far."""
    intent = record.intent
    if intent.kind != ToolIntent.APPROVAL:
        return
    response.args_digest = approval_digest(intent.args_json)
    if record.state == IntentState.AWAITING_DECISION and intent.required_approvals > 1:
        response.votes.extend(await store.approval_votes(intent.intent_id))


def recorded_approver(identity: Approver | None, claimed: str) -> str:
    """The approver a decision records: a named token's name, else what the client claimed."""
    if identity is not None and identity.name:
        return identity.name
    return claimed


def digest_problem(args_digest: str) -> str | None:
    """Why ``args_digest`` is not a digest (empty is accepted), or ``None``."""
    if args_digest and (
        len(args_digest) != DIGEST_CHARS
        or any(char not in "0123456789abcdef" for char in args_digest)
    ):
        return f"args_digest must be {DIGEST_CHARS} lowercase hex digits, got {args_digest!r}"
    return None


def refusal(
    intent: ToolIntent | None,
    state: IntentState,
    identity: Approver | None,
    approved: bool,
    edited_args_json: str,
    registry: ToolRegistry,
) -> tuple[Decision | None, str]:
    """A not-applied ``Decision`` refusing the decision, or ``None`` and the canonical edit.

    Refused: an approver whose token is limited to other channels; an edit on a denial, on an
    approval that gates no tool (``ToolIntent.gated_tool``) or one this effector lacks, or
    whose arguments the tool does not accept. Unknown and decided intents pass through, for
    the store to answer as it always has.
    """
    if intent is None and identity is not None and identity.channels is not None:
        # Not recorded yet: a channel-limited approver may not race its submission.
        return Decision(False, IntentState.INTENT_STATE_UNSPECIFIED, "unknown intent", None), ""
    if (
        intent is None
        or intent.kind != ToolIntent.APPROVAL
        or state != IntentState.AWAITING_DECISION
    ):
        return None, ""
    if identity is not None:
        limited = identity.refusal(intent.channel)
        if limited is not None:
            return Decision(False, state, limited, None), ""
    if not edited_args_json:
        return None, ""
    problem, canonical = _edit_problem(intent, approved, edited_args_json, registry)
    if problem is not None:
        return Decision(False, state, problem, None), ""
    return None, "" if canonical == intent.args_json else canonical


def _edit_problem(
    intent: ToolIntent, approved: bool, edited_args_json: str, registry: ToolRegistry
) -> tuple[str | None, str]:
    if not approved:
        return "edited arguments come with an approval, not a denial", ""
    tool_name = intent.gated_tool
    if not tool_name:
        return (
            "this approval gates no tool (it was requested without tool=...), so its "
            "arguments cannot be edited; approve or deny it as asked",
            "",
        )
    if tool_name not in registry:
        return f"this effector has no tool {tool_name!r} to check the edited arguments", ""
    try:
        edited = json.loads(edited_args_json)
    except json.JSONDecodeError as exc:
        return f"the edited arguments are not valid JSON: {exc}", ""
    if not isinstance(edited, dict):
        return f"the edited arguments must be a JSON object, got {type(edited).__name__}", ""
    try:
        registry.get(tool_name).validate_arguments(edited)
    except ToolArgumentError as exc:
        return f"the edited arguments are invalid: {exc}", ""
    return None, canonical_json(edited)
