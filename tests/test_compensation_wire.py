"""Golden bytes of the compensation fields: additive tags, fixed forever; old records read."""

from __future__ import annotations

from beam_agents._protos import CompensationLink, Continuation, ToolIntent, ToolResult


def test_intent_compensation_fields_are_tags_16_17_18() -> None:
    intent = ToolIntent(compensates_intent_id="i", compensate_tool="t", compensate_args_json="{}")
    assert intent.SerializeToString() == b"\x82\x01\x01i\x8a\x01\x01t\x92\x01\x02{}"


def test_not_needed_is_status_5() -> None:
    assert ToolResult.NOT_NEEDED == 5
    assert ToolResult(status=ToolResult.NOT_NEEDED).SerializeToString() == b" \x05"


def test_the_runs_compensation_links_are_continuation_tag_19() -> None:
    link = CompensationLink(
        intent_id="i", step_index=1, tool_name="t", args_json="{}", compensation_intent_id="c"
    )
    assert link.SerializeToString() == b'\n\x01i\x10\x01\x1a\x01t"\x02{}*\x01c'
    assert Continuation(compensations=[link]).SerializeToString() == (
        b'\x9a\x01\x0f\n\x01i\x10\x01\x1a\x01t"\x02{}*\x01c'
    )


def test_records_written_before_the_fields_read_with_their_defaults() -> None:
    # Bytes as a release without compensation wrote them (literal, not built by today's code).
    old_intent = bytes.fromhex("0a01692a017432027b7d4801")  # id i, tool t, args {}, TOOL
    reread = ToolIntent.FromString(old_intent)
    assert (reread.intent_id, reread.tool_name, reread.kind) == ("i", "t", ToolIntent.TOOL)
    assert (reread.compensates_intent_id, reread.compensate_tool, reread.compensate_args_json) == (
        "",
        "",
        "",
    )
    # An intent without compensation staged today has the bytes it had before.
    assert reread.SerializeToString() == old_intent
    old_run = bytes.fromhex("10031802320169")  # seq 3, next_step 2, pending ["i"]
    run = Continuation.FromString(old_run)
    assert (run.seq, run.next_step, list(run.pending_intent_ids)) == (3, 2, ["i"])
    assert list(run.compensations) == []
