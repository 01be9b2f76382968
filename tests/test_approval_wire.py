"""Golden bytes of the approval and lifecycle fields: additive tags, fixed forever."""

from __future__ import annotations

from beam_agents._protos import (
    AgentError,
    Approval,
    ApprovalEdit,
    DecideRequest,
    GetIntentResponse,
    IntentState,
    ReadRequest,
    ToolIntent,
    ToolResult,
)


def test_approval_digest_edit_and_approvers_are_tags_7_8_9() -> None:
    approval = Approval(args_digest="d", edited_args_json="{}", approvers=["a", "b"])
    assert approval.SerializeToString() == b":\x01dB\x02{}J\x01aJ\x01b"


def test_intent_lineage_quorum_and_gated_tool_are_tags_12_13_14() -> None:
    intent = ToolIntent(
        edited_from=ApprovalEdit(approval_intent_id="i", edited_by="e", diff_json="{}"),
        required_approvals=2,
        gated_tool="t",
    )
    assert intent.SerializeToString() == b"b\n\n\x01i\x12\x01e\x1a\x02{}h\x02r\x01t"


def test_decide_request_digest_and_edit_are_tags_5_6() -> None:
    request = DecideRequest(args_digest="d", edited_args_json="{}")
    assert request.SerializeToString() == b"*\x01d2\x02{}"


def test_get_intent_votes_and_digest_are_tags_8_9() -> None:
    response = GetIntentResponse(votes=[Approval(approver="a")], args_digest="d")
    assert response.SerializeToString() == b"B\x03\x1a\x01aJ\x01d"


def test_records_written_before_the_fields_read_with_their_defaults() -> None:
    old_intent = ToolIntent(intent_id="i", kind=ToolIntent.APPROVAL, args_json="{}", channel="c")
    reread = ToolIntent.FromString(old_intent.SerializeToString())
    assert not reread.HasField("edited_from")
    assert (reread.required_approvals, reread.gated_tool) == (0, "")
    # A plain single-approver intent staged today has the bytes it had before quorums.
    assert reread.SerializeToString() == old_intent.SerializeToString()


def test_withdrawal_is_kind_3_naming_its_target_in_tag_15() -> None:
    intent = ToolIntent(kind=ToolIntent.WITHDRAWAL, withdraws_intent_id="t")
    assert intent.SerializeToString() == b"H\x03z\x01t"


def test_withdrawn_is_state_6_and_result_status_6() -> None:
    assert (IntentState.WITHDRAWN, ToolResult.WITHDRAWN) == (6, 6)
    assert ToolResult(status=ToolResult.WITHDRAWN).SerializeToString() == b" \x06"


def test_an_errors_trace_id_is_tag_8_and_a_reads_byte_bound_tag_4() -> None:
    assert AgentError(trace_id="t").SerializeToString() == b"B\x01t"
    assert ReadRequest(max_bytes=5).SerializeToString() == b" \x05"
