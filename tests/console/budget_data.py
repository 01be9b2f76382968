"""Fleet budget windows for the console's tests, made as workers make them.

Allowances are leased through the effector's real ``LeaseBudget`` RPC and usage is debited by
``BUDGET_DEBIT`` intents through its real Submit, shaped as ``Staged._stage_debit`` stages them
(``beam_agents.core.staging``): the effector keeps the ledger as it does in production.
"""

from __future__ import annotations

from beam_agents._protos import (
    LeaseBudgetRequest,
    LeaseBudgetResponse,
    SubmitAck,
    ToolIntent,
    canonical_json,
    debit_id_for,
)
from effector.client import EffectorClient
from effector.launch import EffectorThread
from tests.console.runs_data import now_ms

DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def lease(
    effector: EffectorThread,
    ledger: str,
    *,
    window_ms: int = DAY_MS,
    cap_tokens: int = 0,
    cap_cost_micros: int = 0,
    want_tokens: int = 0,
    want_cost_micros: int = 0,
    owner: str = "worker-1",
) -> LeaseBudgetResponse:
    """Lease an allowance of ``ledger``'s current window through ``LeaseBudget``."""
    request = LeaseBudgetRequest(
        ledger=ledger,
        window_ms=window_ms,
        cap_tokens=cap_tokens,
        cap_cost_micros=cap_cost_micros,
        want_tokens=want_tokens,
        want_cost_micros=want_cost_micros,
        owner=owner,
    )
    with EffectorClient(effector.address) as client:
        return client.lease_budget(request)


def debit_intent(
    key: bytes,
    seq: int,
    *,
    ledger: str,
    window_start_ms: int,
    lease_id: str = "",
    tokens: int = 0,
    cost_micros: int = 0,
    step: int = 1,
) -> ToolIntent:
    """The ``BUDGET_DEBIT`` of the model call at (``key``, ``seq``, ``step``), as staged."""
    args = {
        "cost_micros": cost_micros,
        "lease_id": lease_id,
        "ledger": ledger,
        "requests": 1,
        "tokens": tokens,
        "window_start_ms": window_start_ms,
    }
    return ToolIntent(
        intent_id=debit_id_for(key, seq, step, ledger),
        entity_key=key,
        seq=seq,
        step_index=step,
        args_json=canonical_json(args),
        created_at_ms=now_ms(),
        kind=ToolIntent.BUDGET_DEBIT,
    )


def submit_debits(effector: EffectorThread, *intents: ToolIntent) -> list[SubmitAck]:
    """Submit ``intents`` through the effector's gRPC Submit."""
    with EffectorClient(effector.address) as client:
        return client.submit(intents)
