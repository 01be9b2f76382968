# mypy: disallow-untyped-calls=False
"""One conformance suite for the three framework adapters and the plain ``ctx`` agent.

Each case plays ``tests/adapters/scenario.py`` in a real pipeline on Beam's local runner with a
real effector subprocess (``conformance.py``): five events on five keys, two plain effects, one
approved, one denied and one nobody answers. The same events then run again from fresh state
against the same effector, with every commit failed once on the bundle-based runner, and on a
fresh effector that is SIGKILLed and restarted mid-run. Every case must end every run alike.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from beam_agents._protos import ToolIntent, TraceEvent
from effector.launch import free_port
from tests.adapters.conformance import (
    CASES,
    TIMED_OUT,
    CaseRun,
    logged_envelopes,
    run_case_loop,
    run_case_with_retries,
)
from tests.adapters.scenario import APPLIED, NOT_APPLIED, triage_model
from tests.core.harness import SharedProvider
from tests.semantics.gate_tools import Ledger, create_ledger
from tests.semantics.loop import Sidecar, check_effects, sidecar

EFFECT_KEYS = {"plain-1", "plain-2", "approve-1"}
ALL_KEYS = EFFECT_KEYS | {"deny-1", "timeout-1"}


@dataclass
class CaseRuns:
    """Everything one case did: the first run, its replay, the retried and the chaos runs."""

    first: CaseRun
    ledger: Path
    invocations_after_first: int
    replay: CaseRun
    invocations_after_replay: int
    retried: CaseRun
    forced_commits: list[str]
    invocations_after_retries: int
    chaos: CaseRun
    chaos_ledger: Path
    killed: list[int]


def _kill_once_after_first_invocation(effector: Sidecar, ledger: Path) -> None:
    deadline = time.monotonic() + 60
    while not Ledger.read(ledger).invocations:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    effector.kill()
    time.sleep(0.3)
    effector.start()


def _invocations(ledger: Path) -> int:
    return len(Ledger.read(ledger).invocations)


@pytest.fixture(scope="module", params=list(CASES))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CaseRuns:
    case = str(request.param)
    workdir = tmp_path_factory.mktemp(f"conformance-{case}")
    ledger = create_ledger(workdir / "ledger.db")
    with sidecar(f"sqlite:///{workdir / 'effector.db'}", free_port(), ledger) as effector:
        first = run_case_loop(case, effector.address, SharedProvider(triage_model()))
        after_first = _invocations(ledger)
        first_log = logged_envelopes(effector.address)
        replay = run_case_loop(case, effector.address, SharedProvider(triage_model()))
        after_replay = _invocations(ledger)
        retried, forced = run_case_with_retries(
            case,
            effector.address,
            SharedProvider(triage_model()),
            first_log,
            workdir / "markers",
        )
        after_retries = _invocations(ledger)
    chaos_ledger = create_ledger(workdir / "chaos-ledger.db")
    with sidecar(f"sqlite:///{workdir / 'chaos.db'}", free_port(), chaos_ledger) as effector:
        chaos = run_case_loop(
            case,
            effector.address,
            SharedProvider(triage_model()),
            during=lambda: _kill_once_after_first_invocation(effector, chaos_ledger),
        )
        killed = list(effector.killed)
    return CaseRuns(
        first=first,
        ledger=ledger,
        invocations_after_first=after_first,
        replay=replay,
        invocations_after_replay=after_replay,
        retried=retried,
        forced_commits=forced,
        invocations_after_retries=after_retries,
        chaos=chaos,
        chaos_ledger=chaos_ledger,
        killed=killed,
    )


def _output_of(run: CaseRun, key: str) -> str:
    """The output naming event ``key`` (the applied ones quote the tool's result)."""
    [output] = [o for o in run.outputs if f'"event_id":"{key}"' in o]
    assert output.startswith(APPLIED), output
    return output


def _intents_for(run: CaseRun, key: str, kind: int) -> list[ToolIntent]:
    return [i for i in run.intents if i.entity_key == key.encode() and i.kind == kind]


def test_every_run_ends_without_errors(runs: CaseRuns) -> None:
    for run in (runs.first, runs.replay, runs.retried, runs.chaos):
        assert [(e.reason, e.detail) for e in run.errors if e.reason != "orphaned_result"] == []
        assert run.dead_letters == []
        assert len(run.outputs) == len(ALL_KEYS), run.outputs


def test_read_only_tool_runs_inline(runs: CaseRuns) -> None:
    first = runs.first
    assert first.tool_intents("lookup_account") == []
    lookups = {
        event.entity_key.decode()
        for event in first.traces
        if event.event_type == TraceEvent.TOOL_CALL
        and event.attributes.get("gen_ai.tool.name") == "lookup_account"
    }
    assert lookups == ALL_KEYS
    for key in ("plain-1", "plain-2"):
        assert _output_of(first, key).startswith(APPLIED)


def test_side_effect_is_executed_once_by_the_effector_and_its_result_seen(
    runs: CaseRuns,
) -> None:
    first = runs.first
    effects = first.tool_intents("apply_effect")
    assert sorted(i.entity_key.decode() for i in effects) == sorted(EFFECT_KEYS)
    figures = check_effects(runs.ledger, {i.intent_id for i in effects}, killed=[])
    assert figures.invocations == len(EFFECT_KEYS) and figures.duplicate_effects == 0
    assert '"applied":11' in _output_of(first, "plain-1")
    assert '"applied":22' in _output_of(first, "plain-2")


def test_approval_approved_applies_and_denied_does_not(runs: CaseRuns) -> None:
    first = runs.first
    for key in ("approve-1", "deny-1", "timeout-1"):
        assert len(_intents_for(first, key, ToolIntent.APPROVAL)) == 1, key
    assert '"applied":33' in _output_of(first, "approve-1")
    denied = [output for output in first.outputs if output.startswith(NOT_APPLIED)]
    assert len(denied) == 1 and "denied" in denied[0].lower(), first.outputs
    assert _intents_for(first, "deny-1", ToolIntent.TOOL) == []


def test_an_approval_nobody_answers_takes_the_hitl_route(runs: CaseRuns) -> None:
    assert runs.first.outputs.count(TIMED_OUT.decode()) == 1, runs.first.outputs
    assert _intents_for(runs.first, "timeout-1", ToolIntent.TOOL) == []


def test_a_full_replay_from_fresh_state_executes_nothing_new(runs: CaseRuns) -> None:
    assert runs.invocations_after_replay == runs.invocations_after_first
    # The first run's deadline route, taken in the pipeline, is recorded nowhere: the replay
    # finds the effector's later EXPIRED answer to that approval instead, and falls back.
    only_first = Counter(runs.first.outputs) - Counter(runs.replay.outputs)
    only_replay = Counter(runs.replay.outputs) - Counter(runs.first.outputs)
    assert set(only_first) <= {TIMED_OUT.decode()}, runs.replay.outputs
    assert all(output.startswith(NOT_APPLIED) for output in only_replay), runs.replay.outputs
    assert sorted(i.intent_id for i in runs.replay.intents) == sorted(
        i.intent_id for i in runs.first.intents
    )
    assert set(runs.replay.acks) == {"DUPLICATE"}


def test_forced_bundle_retries_change_nothing_and_call_the_provider_no_more(
    runs: CaseRuns,
) -> None:
    retried = runs.retried
    assert len(runs.forced_commits) >= len(ALL_KEYS) * 2
    assert retried.outputs == runs.first.outputs
    assert sorted(i.SerializeToString(deterministic=True) for i in retried.intents) == sorted(
        i.SerializeToString(deterministic=True) for i in runs.first.intents
    )
    assert retried.provider_calls == runs.first.provider_calls
    assert runs.invocations_after_retries == runs.invocations_after_first


def test_an_effector_killed_and_restarted_mid_run_loses_nothing(runs: CaseRuns) -> None:
    chaos = runs.chaos
    assert runs.killed, "the effector was never killed"
    assert chaos.outputs == runs.first.outputs
    effects = chaos.tool_intents("apply_effect")
    figures = check_effects(runs.chaos_ledger, {i.intent_id for i in effects}, runs.killed)
    assert figures.duplicate_effects == 0
