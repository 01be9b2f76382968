"""Approvals bound to their arguments: the stale-decision check and approve-with-edit.

A decision carries the digest of the arguments it was made on (``Approval.args_digest``,
:func:`~beam_agents._protos.approval_digest`). :func:`stale_approval` compares it with the
digest the run recorded for the approval's step, so an approval decided on other arguments
never resumes the run. :func:`approved_call` turns an approved decision into the arguments an
agent stages (the approver's edit applied) and, for an edit, its lineage (``ApprovalEdit``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from beam_agents._protos import (
    Approval,
    ApprovalEdit,
    Continuation,
    approval_digest,
    canonical_json,
)
from beam_agents.core.cursor import StepRecord
from beam_agents.core.ids import intent_id_for

__all__ = ["approved_call", "edit_diff", "stale_approval"]

_APPROVAL_STEPS = frozenset({StepRecord.APPROVAL, StepRecord.ESCALATION})


def edit_diff(original: Mapping[str, Any], edited: Mapping[str, Any]) -> str:
    """The canonical JSON of what an edit changed, argument by argument (top level).

    ``{"added": {name: value}, "changed": {name: {"from": old, "to": new}}, "removed":
    {name: old}}``, each part present only when not empty; ``"{}"`` when nothing changed.
    """
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
    """Why ``approval`` was decided on other arguments than its pending intent's, or ``None``.

    An approval without a digest (from an effector that predates it, or the deadline's) and
    one whose step the run did not record (a continuation from before steps were recorded)
    pass: there is nothing to compare.
    """
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

    ``args_json`` and ``arguments`` are the arguments the agent asked about (canonical JSON and
    parsed). Raises ``ValueError`` if the approval is not an approval of them: not approved, or
    its digest names other arguments. Without an edit they are staged as they are (no
    lineage); with one, the approver's arguments are, with an ``ApprovalEdit`` recording the
    approval intent, who edited and the diff.
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
