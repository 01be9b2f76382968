# mypy: disallow-untyped-calls=False
"""Budget gate: two pipelines and two effector replicas share one fleet budget exactly.

200 keys, split over two pipelines that run at once as two worker processes
(BundleBasedDirectRunner, streaming, each with 1% of its commits forced to fail once so the
runner retries their bundles), take five events each. Every event's agent asks the model once
(its usage depends on the key and the event) and completes with ``ok TOKENS``, or with
``over`` when ``BudgetExceeded`` refuses the call. Both pipelines lease from, and submit their
debits to, two effector replicas on one PostgreSQL store, reached through one replica list
(each pipeline in another order). Replica 0 is SIGKILLed once the ledger has debits, and
restarted.

Asserted: the ledger debited exactly the usage of the committed calls, each once; the provider
was asked only for committed calls (no call once a worker's allowance was refused, none
repeated by a retry); the cap was overshot by at most one call per worker; and calls were
refused only once the cap was reached.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from effector.client import EffectorClient
from effector.launch import child_environment, free_port
from tests.pg import PostgresServer
from tests.semantics.budget_pipeline import (
    BUDGET,
    CAP_TOKENS,
    CHUNK_TOKENS,
    EVENTS_PER_KEY,
    KEYS_PER_PIPELINE,
)
from tests.semantics.loop import Sidecar, gate_seed, sidecar

REPO = Path(__file__).resolve().parents[2]


def test_two_pipelines_two_replicas_share_one_budget_exactly(
    postgres: PostgresServer, ledger: Path, tmp_path: Path, gate_report: Callable[[str, str], None]
) -> None:
    seed = gate_seed()
    store = postgres.create_database("budgets")
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(sidecar(store, free_port(), ledger, "--budget-lease-ms", "5000"))
            for _ in range(2)
        ]
        addresses = [replica.address for replica in replicas]
        started = time.monotonic()
        workers = [
            stack.enter_context(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.semantics.budget_pipeline",
                        str(n),
                        ",".join(addresses if n == 0 else addresses[::-1]),
                        str(tmp_path / f"markers-{n}"),
                        str(seed),
                        str(tmp_path / f"pipeline-{n}.json"),
                    ],
                    env=child_environment(REPO, REPO / "tests" / "effector"),
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp_path / f"pipeline-{n}.log").open("w"),
                )
            )
            for n in range(2)
        ]
        killed_at = _kill_once_debited(replicas[0], addresses[1], workers)
        for n, worker in enumerate(workers):
            code = worker.wait(timeout=600)
            assert code == 0, (tmp_path / f"pipeline-{n}.log").read_text()[-3000:]
        seconds = time.monotonic() - started
        with EffectorClient(addresses[1]) as client:
            [window] = [w for w in client.budgets() if w.ledger == BUDGET]
    figures = [json.loads((tmp_path / f"pipeline-{n}.json").read_text()) for n in range(2)]

    committed = [o.encode() for figure in figures for o in figure["outputs"]]
    assert len(committed) == 2 * KEYS_PER_PIPELINE * EVENTS_PER_KEY
    spent = [int(o.split()[1]) for o in committed if o.startswith(b"ok ")]
    refused = committed.count(b"over")
    assert len(spent) + refused == len(committed)
    # The ledger debited exactly the committed calls' usage, each call once.
    assert (window.debited_tokens, window.debits) == (sum(spent), len(spent))
    # The provider was asked only for committed calls: none after a refusal, none repeated.
    calls = sum(figure["provider_calls"] for figure in figures)
    assert calls == len(spent)
    # The cap holds within one call per worker (2 workers; a call uses at most 11 tokens).
    overshoot = max(window.debited_tokens - CAP_TOKENS, 0)
    assert overshoot <= 2 * 11
    # Refusals came only once the cap was (nearly) reached: at most one chunk per worker short.
    assert refused > 0 and window.debited_tokens >= CAP_TOKENS - 2 * CHUNK_TOKENS
    retried = sum(figure["forced_retries"] for figure in figures)
    assert retried == 2 * EVENTS_PER_KEY  # 1% of each pipeline's 500 commits failed once
    gate_report(
        "budget",
        f"seed={seed} pipelines=2 replicas=2 store=postgresql keys={2 * KEYS_PER_PIPELINE} "
        f"events={len(committed)} cap={CAP_TOKENS} chunk={CHUNK_TOKENS} "
        f"committed_calls={len(spent)} refused={refused} debited={window.debited_tokens} "
        f"usage_of_committed={sum(spent)} debits={window.debits} provider_calls={calls} "
        f"overshoot={overshoot} forced_retries={retried} killed_at_debits={killed_at} "
        f"kills={len(replicas[0].killed)} run={seconds:.1f}s",
    )


def _kill_once_debited(
    victim: Sidecar, observer: str, workers: list[subprocess.Popen[bytes]]
) -> int:
    """SIGKILL ``victim`` once the ledger (seen through ``observer``) has debits; restart it."""
    with EffectorClient(observer) as client:
        while any(worker.poll() is None for worker in workers):
            windows = [w for w in client.budgets() if w.ledger == BUDGET]
            if windows and windows[0].debits:
                victim.kill()
                time.sleep(0.3)
                victim.start()
                return windows[0].debits
            time.sleep(0.05)
    return 0
