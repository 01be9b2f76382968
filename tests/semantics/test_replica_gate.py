"""Replica gate: the loop over two effector replicas on one PostgreSQL, one killed twice.

The crash gate's loop (5,000 events on 500 keys, FnApiRunner) runs against two effector
subprocesses, each on its own port, sharing one PostgreSQL store. The pipeline reaches both
through one ``EffectorConnection`` whose target lists both addresses: gRPC spreads its calls
round-robin and routes around a replica that is down (any replica can answer any call, since
they share the store). Replica 0 is SIGKILLed twice at seeded-random moments and restarted on
its port each time; intents it had claimed are claimed again, by either replica, once their
lease runs out. Then the pipeline runs again over the same events.

Asserted as in the crash gate: nothing lost, re-execution only inside a killed incarnation's
duplicate window, no duplicate effect, a second run that executes nothing; and both replicas
did work.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from beam_agents._protos import ToolResult
from beam_agents.io import EffectorConnection
from effector.client import EffectorClient
from effector.launch import free_port
from tests.pg import PostgresServer
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

N_KILLS = 2
LEASE_MS = 3_000
"""Short leases, so a killed replica's claims are taken over within seconds."""


def test_two_replicas_one_killed_twice_lose_nothing_and_duplicate_no_effect(
    postgres: PostgresServer, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    seed = gate_seed()
    rng = random.Random(seed)
    thresholds = kill_thresholds(rng, N_KILLS, GATE_EVENTS)
    events = make_events(GATE_EVENTS, GATE_KEYS, base_ms=BASE_EVENT_TIME_MS)
    intent_ids = {effect_intent_id(i, GATE_KEYS) for i in range(GATE_EVENTS)}
    store = postgres.create_database("replicas")

    with ExitStack() as stack:
        replicas = [
            stack.enter_context(sidecar(store, free_port(), ledger, "--lease-ms", str(LEASE_MS)))
            for _ in range(2)
        ]
        connection = EffectorConnection(",".join(replica.address for replica in replicas))
        plan = [(threshold, 0) for threshold in thresholds]
        first = run_with_chaos(replicas, plan, rng, connection, events)
        refused = check_nothing_lost(first, intent_ids)
        for replica in replicas:  # one log, the same through either replica
            with EffectorClient(replica.address) as client:
                published = check_terminal_results(client, intent_ids, ToolResult.OK)
        killed = replicas[0].killed
        figures = check_effects(ledger, intent_ids, killed)
        assert figures.duplicate_effects == 0
        invocations = Ledger.read(ledger).invocations
        by_replica = [sum(row.pid in replica.pids for row in invocations) for replica in replicas]
        assert min(by_replica) > 0, f"a replica executed nothing: {by_replica}"

        second = run_loop(connection, events)
        added = check_replay(first, second, ledger, len(invocations))

    gate_report(
        "replica",
        f"seed={seed} replicas=2 store=postgresql events={GATE_EVENTS} keys={GATE_KEYS} "
        f"kills={len(killed)} (replica 0) at_invocations={thresholds} "
        f"outputs={len(first.outputs)} lost=0 intents={figures.intents} "
        f"invocations={figures.invocations} by_replica={by_replica} "
        f"reexecuted_intents={figures.reexecuted} extra_invocations={figures.extra_invocations} "
        f"duplicate_effects={figures.duplicate_effects} result_envelopes={published} "
        f"duplicate_deliveries_refused={refused} second_run_new_executions={added} "
        f"run1={first.seconds:.1f}s run2={second.seconds:.1f}s",
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("effector-a:1,effector-b:2", "must give IP:PORT addresses"),
        ("127.0.0.1:1,[::1]:2", "mix IPv4 and IPv6"),
        ("::1:1,::1:2", r"is not IP:PORT \(\[IPv6\]:PORT\)"),
        ("127.0.0.1:1,127.0.0.1:port", "is not IP:PORT"),
    ],
)
def test_a_replica_list_that_grpc_cannot_reach_is_refused_when_the_connection_is_made(
    target: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EffectorConnection(target)
