"""Crash gate: the full loop survives three SIGKILLs of its effector and loses nothing.

5,000 events on 500 keys run through ``ReadEnvelopes → RunAgent → SubmitIntents`` on the
FnApiRunner, against an effector subprocess on SQLite. The effector is SIGKILLed at three
moments drawn from a seeded RNG (placed by progress, see :class:`~tests.semantics.loop.Chaos`)
and restarted each time on the same store and the same port; the pipeline rides through on
its retries. Then the whole pipeline runs again over the same events from fresh state.

Every side-effecting gate tool has a reconciler here (``make_reconciling_registry``), so an
intent whose execution a kill cut off is reconciled before it could run again. Asserted: every
event gets exactly one output and every intent exactly one terminal result (nothing lost); no
tool is invoked twice for one intent (zero duplicate invocations, not only zero duplicate
effects: a found effect is recorded, not re-run); the second run executes nothing and
reproduces the first run's outputs. The summary counts the intents reconciled. Without
reconcilers the same kills re-execute inside the duplicate window; the replica gate covers that
path (and ``check_effects`` explains each re-execution by a kill). A second, small gate kills
the effector under tools whose reconciler raises: the intents cut off are left IN_DOUBT, none
executed again, until a restart with a working reconciler settles them, each executed once.
Set ``GATE_SEED`` to replay another schedule.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolResult
from beam_agents.io import EffectorConnection
from effector.client import EffectorClient
from effector.launch import free_port
from tests.semantics.gate_tools import (
    LATENCY_ENV,
    LEDGER_ENV,
    RECONCILER_ENV,
    RECONCILING_REGISTRY_SPEC,
    Ledger,
)
from tests.semantics.loop import (
    BASE_EVENT_TIME_MS,
    GATE_EVENTS,
    GATE_KEYS,
    Sidecar,
    check_effects,
    check_nothing_lost,
    check_replay,
    check_terminal_results,
    effect_intent_id,
    gate_seed,
    kill_thresholds,
    make_events,
    run_loop,
    run_with_chaos,
    started,
)

N_KILLS = 3


def test_sigkilled_three_times_the_loop_loses_nothing_and_duplicates_no_effect(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    seed = gate_seed()
    rng = random.Random(seed)
    thresholds = kill_thresholds(rng, N_KILLS, GATE_EVENTS)
    events = make_events(GATE_EVENTS, GATE_KEYS, base_ms=BASE_EVENT_TIME_MS)
    intent_ids = {effect_intent_id(i, GATE_KEYS) for i in range(GATE_EVENTS)}
    store = f"sqlite:///{tmp_path / 'effector.db'}"

    reconciling = Sidecar(store, free_port(), ledger, tools_spec=RECONCILING_REGISTRY_SPEC)
    with started(reconciling) as effector:
        connection = EffectorConnection(effector.address)
        plan = [(threshold, 0) for threshold in thresholds]
        first = run_with_chaos([effector], plan, rng, connection, events)
        refused = check_nothing_lost(first, intent_ids)
        with EffectorClient(effector.address) as client:
            published = check_terminal_results(client, intent_ids, ToolResult.OK)
        figures = check_effects(ledger, intent_ids, effector.killed)
        assert figures.duplicate_effects == 0
        assert (figures.reexecuted, figures.extra_invocations) == (0, 0)
        reconciled = Ledger.read(ledger).reconciliations
        assert set(reconciled) <= {"found", "not_found"}, reconciled
        # Three kills with tools in flight: some intent was claimed again and its reconciler
        # asked (or the gate would pass without exercising reconciliation at all).
        assert reconciled.get("found", 0) + reconciled.get("not_found", 0) >= 1, reconciled

        invocations_before = len(Ledger.read(ledger).invocations)
        second = run_loop(connection, events)
        added = check_replay(first, second, ledger, invocations_before)

    gate_report(
        "crash",
        f"seed={seed} events={GATE_EVENTS} keys={GATE_KEYS} store=sqlite "
        f"kills={len(effector.killed)} at_invocations={thresholds} "
        f"outputs={len(first.outputs)} lost=0 intents={figures.intents} "
        f"invocations={figures.invocations} reexecuted_intents={figures.reexecuted} "
        f"extra_invocations={figures.extra_invocations} reconciled_found={reconciled['found']} "
        f"reconciled_not_found_executed={reconciled['not_found']} "
        f"duplicate_effects={figures.duplicate_effects} result_envelopes={published} "
        f"duplicate_deliveries_refused={refused} second_run_new_executions={added} "
        f"run1={first.seconds:.1f}s run2={second.seconds:.1f}s",
    )


IN_DOUBT_INTENTS = 20
SLOW_EFFECT_S = "0.6"
"""The raising gate's tool latency: the kill surely lands while every tool is in flight."""


def test_a_raising_reconciler_leaves_intents_in_doubt_and_none_executed_again(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    intents = [
        make_intent("apply_effect", {"event_id": f"e{i}", "amount": i}, key=b"k%d" % i)
        for i in range(IN_DOUBT_INTENTS)
    ]
    ids = {intent.intent_id for intent in intents}
    environment = {LEDGER_ENV: str(ledger), LATENCY_ENV: SLOW_EFFECT_S}
    raising = Sidecar(
        store,
        free_port(),
        ledger,
        tools_spec=RECONCILING_REGISTRY_SPEC,
        environment={**environment, RECONCILER_ENV: "raise"},
    )
    with started(raising) as effector, EffectorClient(effector.address) as client:
        client.submit(intents)
        _wait(lambda: client.status().running == IN_DOUBT_INTENTS, "every intent claimed")
        time.sleep(0.2)  # every tool is now inside its latency
        effector.kill()  # every tool is inside its latency: started, nothing recorded
        effector.start()
        _wait(lambda: len(client.list_intents(IntentState.IN_DOUBT)) == IN_DOUBT_INTENTS, "doubt")
        shown = client.get_intent(intents[0].intent_id)
        assert "GATE_RECONCILER=raise" in shown.in_doubt_reason and shown.retry_at_ms > 0
        time.sleep(1.5)  # past the first backoff: asked again, failing again, never executed
        states = {client.get_intent(intent_id).state for intent_id in ids}
        assert states <= {IntentState.IN_DOUBT, IntentState.RUNNING}  # RUNNING: asked right now
        in_doubt_ledger = Ledger.read(ledger)
        assert in_doubt_ledger.invocations == [], "a tool ran although its reconciler raised"
        asked = in_doubt_ledger.reconciliations["raised"]
        assert asked > IN_DOUBT_INTENTS  # each asked at least once, some again after a backoff
        assert client.status().done == 0

    # A restart with a working reconciler settles them: nothing was done, so each runs once.
    working = Sidecar(
        store, raising.port, ledger, tools_spec=RECONCILING_REGISTRY_SPEC, environment=environment
    )
    with started(working) as effector, EffectorClient(effector.address) as client:
        _wait(lambda: client.status().done == IN_DOUBT_INTENTS, "settled")
        assert client.list_intents(IntentState.IN_DOUBT) == []
        settled = Ledger.read(ledger)
        assert settled.invocation_counts() == {intent_id: 1 for intent_id in ids}
        assert settled.reconciliations["not_found"] == IN_DOUBT_INTENTS
        for intent in intents:
            result = client.get_intent(intent.intent_id).result
            assert result.status == ToolResult.OK and result.attempt >= 3

    gate_report(
        "crash",
        f"raising_reconciler: intents={IN_DOUBT_INTENTS} killed_in_flight={IN_DOUBT_INTENTS} "
        f"in_doubt={IN_DOUBT_INTENTS} reexecuted_while_in_doubt=0 reconciler_calls_raised={asked} "
        f"after_fix: executed_once={IN_DOUBT_INTENTS} duplicate_invocations=0",
    )


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
