"""An intent's page links the intents it relates to: what it undoes, and what allowed it.

A compensation links to the intent it undoes and back; a tool intent links to the approval
that allowed it (by the edit's lineage, or as the approved approval gating the same tool with
the same arguments in the same run) and the approval links to it.
"""

from __future__ import annotations

import json

from beam_agents._protos import ApprovalEdit, ToolIntent
from beam_agents.core.agent import intent_id_for
from effector.launch import EffectorThread
from tests.console.harness import client_for
from tests.console.runs_data import approval_intent, now_ms, submit

KEY = b"links-1"


def _tool(seq: int, step: int, tool_name: str, args: dict[str, object]) -> ToolIntent:
    return ToolIntent(
        intent_id=intent_id_for(KEY, seq, step),
        entity_key=KEY,
        seq=seq,
        step_index=step,
        tool_name=tool_name,
        args_json=json.dumps(args, sort_keys=True, separators=(",", ":")),
        created_at_ms=now_ms(),
        kind=ToolIntent.TOOL,
    )


def _links(html: str, section: str) -> list[str]:
    """The intent ids linked in the ``<dd id=section>`` of an intent page."""
    start = html.index(f'<dd id="{section}">')
    field = html[start : html.index("</dd>", start)]
    return [part.split('"', 1)[0] for part in field.split('href="/intents/')[1:]]


def test_compensations_and_approvals_link_both_ways(effector: EffectorThread) -> None:
    store = effector.server.store
    original = _tool(1, 0, "charge", {"cents": 500})
    undo = _tool(1, 3, "refund", {"cents": 500})
    undo.compensates_intent_id = original.intent_id
    asked = approval_intent(KEY, 2, {"cents": 900}, now_ms())
    asked.gated_tool = "pay"
    allowed = _tool(2, 3, "pay", {"cents": 900})
    other = _tool(2, 4, "pay", {"cents": 901})  # other arguments: not what was approved
    edited_asked = approval_intent(KEY, 4, {"cents": 50}, now_ms())
    edited_asked.gated_tool = "pay"
    edited = _tool(4, 3, "pay", {"cents": 40})
    edited.edited_from.CopyFrom(
        ApprovalEdit(approval_intent_id=edited_asked.intent_id, edited_by="dana")
    )
    effector.run(submit(store, original, undo, asked, allowed, other, edited_asked, edited))
    decided = effector.run(
        store.record_vote(
            asked.intent_id, approved=True, approver="dana", reason="", now_ms=now_ms()
        )
    )
    assert decided.applied
    with client_for(effector) as client:

        def page(intent: ToolIntent) -> str:
            answer = client.get(f"/intents/{intent.intent_id}")
            assert answer.status_code == 200
            return answer.text

        assert _links(page(undo), "compensates") == [original.intent_id]
        assert _links(page(original), "compensated-by") == [undo.intent_id]
        assert _links(page(allowed), "approved-by") == [asked.intent_id]
        assert _links(page(asked), "allowed") == [allowed.intent_id]
        assert 'id="approved-by"' not in page(other)
        edited_page = page(edited)
        assert _links(edited_page, "approved-by") == [edited_asked.intent_id]
        assert "edited by dana" in edited_page
