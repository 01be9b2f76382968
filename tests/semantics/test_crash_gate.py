"""Crash gate: the full loop survives three SIGKILLs of its effector and loses nothing.

5,000 events on 500 keys run through ``ReadEnvelopes → RunAgent → SubmitIntents`` on the
FnApiRunner, against an effector subprocess on SQLite. The effector is SIGKILLed at three
moments drawn from a seeded RNG (placed by progress, see :class:`~tests.semantics.loop.Chaos`)
and restarted each time on the same store and the same port; the pipeline rides through on
its retries. Then the whole pipeline runs again over the same events from fresh state.

Asserted: every event gets exactly one output and every intent exactly one terminal result
(nothing lost); a tool runs more than once only for an intent whose earlier invocation ran in
an incarnation that was then killed, at most once per kill; the idempotent ledger (intent id
as the key) shows no duplicate effect; the second run executes nothing and reproduces the
first run's outputs. Set ``GATE_SEED`` to replay another schedule.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from beam_agents._protos import ToolResult
from beam_agents.io import EffectorConnection
from effector.client import EffectorClient
from effector.launch import free_port
from tests.semantics.gate_tools import Ledger
from tests.semantics.loop import (
    BASE_EVENT_TIME_MS,
    GATE_EVENTS,
    GATE_KEYS,
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
    sidecar,
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

    with sidecar(store, free_port(), ledger) as effector:
        connection = EffectorConnection(effector.address)
        plan = [(threshold, 0) for threshold in thresholds]
        first = run_with_chaos([effector], plan, rng, connection, events)
        refused = check_nothing_lost(first, intent_ids)
        with EffectorClient(effector.address) as client:
            published = check_terminal_results(client, intent_ids, ToolResult.OK)
        figures = check_effects(ledger, intent_ids, effector.killed)
        assert figures.duplicate_effects == 0

        invocations_before = len(Ledger.read(ledger).invocations)
        second = run_loop(connection, events)
        added = check_replay(first, second, ledger, invocations_before)

    gate_report(
        "crash",
        f"seed={seed} events={GATE_EVENTS} keys={GATE_KEYS} store=sqlite "
        f"kills={len(effector.killed)} at_invocations={thresholds} "
        f"outputs={len(first.outputs)} lost=0 intents={figures.intents} "
        f"invocations={figures.invocations} reexecuted_intents={figures.reexecuted} "
        f"extra_invocations={figures.extra_invocations} "
        f"duplicate_effects={figures.duplicate_effects} result_envelopes={published} "
        f"duplicate_deliveries_refused={refused} second_run_new_executions={added} "
        f"run1={first.seconds:.1f}s run2={second.seconds:.1f}s",
    )
