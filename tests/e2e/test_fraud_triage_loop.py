"""The whole system end to end: effector subprocess + fraud-triage pipeline on the DirectRunner.

Events go in, the agents' freeze intents are executed once by the effector, results and
approvals are re-injected, the agents resume and decide. A second run over the same events
executes nothing new and decides the same.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def demo_module() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import demo

        yield demo
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def report(demo_module: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("fraud-loop")
    return demo_module.run_demo(workdir, n_events=120, n_accounts=20)


def test_every_event_gets_exactly_one_decision(report: Any) -> None:
    decided = [d["transfer_id"] for d in report.first]
    assert len(decided) == 120
    assert len(set(decided)) == 120


def test_each_freeze_intent_is_executed_once_into_the_ledger(report: Any) -> None:
    ledger_ids = report.ledger_intent_ids
    assert ledger_ids, "the scenario must freeze at least one account"
    assert len(ledger_ids) == len(set(ledger_ids))
    assert set(ledger_ids) == report.executed_freeze_intent_ids
    invocations, _ = report.invocations
    assert invocations == len(ledger_ids)


def test_results_are_reinjected_and_agents_resume_to_a_decision(report: Any) -> None:
    by_decision = Counter(d["decision"] for d in report.first)
    freezes, _ = report.freezes
    assert by_decision["frozen"] == freezes
    assert by_decision["freeze-failed"] == 0
    assert set(by_decision) <= {"allowed", "frozen", "approved", "declined", "held"}


def test_approval_granted_denied_and_timed_out(report: Any) -> None:
    decisions = {d["transfer_id"]: d["decision"] for d in report.first}
    actions = dict(reversed(entry.split()) for entry in report.decided.values())
    assert sorted(actions.values()) == ["approve", "deny"]
    for transfer, action in actions.items():
        assert decisions[transfer] == ("approved" if action == "approve" else "declined")
    held = [transfer for transfer, decision in decisions.items() if decision == "held"]
    assert len(held) == 1 and held[0] not in actions


def test_replaying_the_same_events_executes_nothing_new_and_decides_the_same(
    report: Any,
) -> None:
    first_invocations, second_invocations = report.invocations
    assert second_invocations == first_invocations
    first = sorted(json.dumps(d, sort_keys=True) for d in report.first)
    second = sorted(json.dumps(d, sort_keys=True) for d in report.second)
    assert second == first
    assert report.problems() == []
