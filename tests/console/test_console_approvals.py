"""The console's inbox binds a decision to the arguments shown, takes edits and counts votes."""

from __future__ import annotations

import html
import re
from pathlib import Path

from beam_agents._protos import IntentState, approval_digest
from beam_agents.tools import ToolRegistry, tool
from effector.service import parse_tokens
from tests.console.harness import KEY, client_for, csrf_of, intent, log_envelopes, start_effector
from tests.console.runs_data import approval_intent, now_ms, submit

_DIGEST = re.compile(r'name="args_digest" value="([0-9a-f]{64})"')


@tool(side_effect=True)
def refund(refund: str, cents: int) -> str:
    """Refund an order.

    :param refund: The refund's id.
    :param cents: How much.
    """
    return refund


def test_the_inbox_sends_the_digest_shown_refuses_a_stale_one_and_takes_an_edit(
    tmp_path: Path,
) -> None:
    asked = approval_intent(KEY, 2, {"refund": "r-7", "cents": 75_000}, now_ms())
    asked.gated_tool = "refund"
    voted = approval_intent(b"other", 0, {"refund": "r-8", "cents": 5}, now_ms())
    voted.required_approvals = 2
    with start_effector(tmp_path, registry=ToolRegistry([refund])) as effector:
        effector.run(submit(effector.server.store, asked))
        effector.run(submit(effector.server.store, voted))
        with client_for(effector) as client:
            page = client.get("/approvals").text
            assert approval_digest(asked.args_json) in _DIGEST.findall(page)
            assert "gates tool refund" in page and "needs 2 approvers, 0 so far" in page
            form = {"csrf_token": csrf_of(page), "decision": "approve", "approver": "dana"}
            stale = client.post(
                f"/approvals/{asked.intent_id}", data={**form, "args_digest": "0" * 64}
            )
            assert stale.status_code == 409 and "stale decision" in html.unescape(stale.text)
            vote = client.post(f"/approvals/{voted.intent_id}", data=form)
            assert vote.status_code == 303
            assert "needs 2 approvers, 1 so far: dana" in client.get("/approvals").text
            edited = client.post(
                f"/approvals/{asked.intent_id}",
                data={
                    **form,
                    "args_digest": approval_digest(asked.args_json),
                    "edited_args": '{"refund": "r-7", "cents": 500}',
                },
            )
            assert edited.status_code == 303
        assert intent(effector, voted.intent_id).state == IntentState.AWAITING_DECISION
        [published] = [e.approval for e in log_envelopes(effector) if e.HasField("approval")]
        assert published.edited_args_json == '{"cents":500,"refund":"r-7"}'
        assert published.approver == "dana"


def test_named_tokens_log_in_and_their_names_decide_within_their_channels(
    tmp_path: Path,
) -> None:
    tokens = parse_tokens("ann:ann-secret\nbob:bob-secret:payments\n", "tokens")
    on_ops = approval_intent(KEY, 4, {"refund": "r-9", "cents": 10}, now_ms())
    on_ops.channel = "ops"
    other = approval_intent(b"k2", 0, {"refund": "r-10", "cents": 20}, now_ms())
    other.channel = "ops"
    with start_effector(tmp_path, tokens=tokens) as effector:
        effector.run(submit(effector.server.store, on_ops))
        effector.run(submit(effector.server.store, other))
        with client_for(effector) as bob:
            assert bob.post("/login", data={"token": "bob-secret"}).status_code == 303
            page = bob.get("/approvals").text
            form = {"csrf_token": csrf_of(page), "decision": "approve", "approver": "mallory"}
            form["args_digest"] = approval_digest(on_ops.args_json)
            refused = bob.post(f"/approvals/{on_ops.intent_id}", data=form)
            assert refused.status_code == 409
            assert "may not decide approvals on channel 'ops'" in html.unescape(refused.text)
        with client_for(effector) as ann:
            assert ann.post("/login", data={"token": "ann-secret"}).status_code == 303
            page = ann.get("/approvals").text
            form = {"csrf_token": csrf_of(page), "decision": "approve", "approver": "mallory"}
            form["args_digest"] = approval_digest(on_ops.args_json)
            assert ann.post(f"/approvals/{on_ops.intent_id}", data=form).status_code == 303
        with client_for(effector) as stranger:
            assert stranger.post("/login", data={"token": "nobody"}).status_code == 403
        decided = intent(effector, on_ops.intent_id)
        assert decided.state == IntentState.DONE
        [published] = [e.approval for e in log_envelopes(effector) if e.HasField("approval")]
        assert (
            published.approved and published.approver == "ann"
        )  # the token's name, not the form's
