"""A pipeline that stages a forbidden effect by ``ctx.act`` cannot make the effector run it.

The refund desk example's agent never asks for approval; the effector's policy decides every
refund at intake. The loop runs on the DirectRunner against an in-process effector.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from beam_agents import IntentState, ToolResult, intent_id_for
from effector import EffectorClient, EffectorThread, ServerSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def desk() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import refund_desk

        yield refund_desk
    finally:
        sys.path.remove(str(EXAMPLES))


def test_the_policy_holds_whatever_the_agent_stages(desk: ModuleType, tmp_path: Path) -> None:
    settings = ServerSettings(policy_file=str(desk.POLICY))
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, desk.make_registry(), settings) as effector:
        stop, decided = threading.Event(), []
        approver = threading.Thread(
            target=lambda: decided.extend(desk.approve_as_two(effector.address, stop))
        )
        approver.start()
        try:
            desk.run(effector.address, str(tmp_path))
        finally:
            stop.set()
            approver.join()
        with EffectorClient(effector.address) as client:
            found = {
                event.entity_key: client.get_intent(intent_id_for(event.entity_key, 0, 1))
                for event in desk.make_events()
            }
            answer = client.policies()
            [window] = client.budgets()
    small, large, huge = (found[f"acme/customer-{n}".encode()] for n in range(3))
    assert (small.result.status, small.attempts, small.policy_rule) == (ToolResult.OK, 1, "")
    assert (large.result.status, large.attempts) == (ToolResult.OK, 1)
    assert large.policy_rule == "large-refund-two-approvers"
    assert decided == ["large-refund-two-approvers: o-2"]
    assert huge.state == IntentState.DONE and huge.attempts == 0  # never claimed, never run
    assert huge.result.status == ToolResult.REJECTED
    assert "rule 'refund-ceiling'" in huge.result.error_message
    lines = sorted(
        line for path in tmp_path.glob("refunds-*") for line in path.read_text().splitlines()
    )
    assert lines == [
        "o-1: refunded o-1",
        "o-2: refunded o-2",
        "o-3: refused: denied by effect policy: rule 'refund-ceiling': refunds above "
        "5,000.00 go through finance, not the desk",
    ]
    # Step 0 of each run drafted the note (21 tokens), debited from the tenant's daily budget.
    assert (window.ledger, window.debited_tokens, window.debits) == ("refund-desk/acme", 63, 3)
    assert {rule.name: rule.decisions for rule in answer.rules} == {
        "refund-ceiling": 1,
        "refund-storm": 0,
        "large-refund-two-approvers": 1,
    }
