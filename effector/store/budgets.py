"""``BudgetLedger``: fleet budgets' windows, the leases workers hold on them, and their debits.

A window's allowance is its cap less what was debited and what live leases still hold. A
lease transaction locks the window's row, so grants never exceed the cap; a debit (a
``BUDGET_DEBIT`` intent, recorded once by id) adds to the window and to its lease in the
transaction that records it. :class:`~effector.store.sql.SqlStore` mixes these verbs in.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import effector.store.schema as sql
from beam_agents._protos import BudgetWindow, LeaseBudgetRequest, LeaseBudgetResponse, ToolIntent

_T = TypeVar("_T")

MAX_LEDGER_CHARS = 512
MAX_AMOUNT = 2**53
"""The largest token or micro-dollar amount one request or debit may carry."""
_DEBIT_FIELDS = {"cost_micros", "lease_id", "ledger", "tokens", "window_start_ms"}


@dataclass(frozen=True, slots=True)
class Debit:
    """One committed model call's usage, as its ``BUDGET_DEBIT`` intent states it."""

    ledger: str
    window_start_ms: int
    lease_id: str
    tokens: int
    cost_micros: int


def parse_debit(intent: ToolIntent) -> Debit:
    """The debit a ``BUDGET_DEBIT`` intent states; ``ValueError`` saying why it is malformed."""
    try:
        fields = json.loads(intent.args_json)
    except ValueError as exc:
        raise ValueError(f"args_json of a budget debit is not JSON: {exc}") from None
    if not isinstance(fields, dict) or set(fields) != _DEBIT_FIELDS:
        raise ValueError(
            f"a budget debit's args_json has exactly the fields {sorted(_DEBIT_FIELDS)}"
        )
    ledger, lease_id = fields["ledger"], fields["lease_id"]
    if not isinstance(ledger, str) or not 0 < len(ledger) <= MAX_LEDGER_CHARS:
        raise ValueError(f"a budget debit's ledger is text of 1 to {MAX_LEDGER_CHARS} chars")
    if not isinstance(lease_id, str) or len(lease_id) > 64:
        raise ValueError("a budget debit's lease_id is text of at most 64 chars")
    amounts = [fields[name] for name in ("window_start_ms", "tokens", "cost_micros")]
    if any(type(value) is not int or not 0 <= value <= MAX_AMOUNT for value in amounts):
        raise ValueError(
            "a budget debit's window_start_ms, tokens and cost_micros are ints from 0 to "
            f"{MAX_AMOUNT}"
        )
    window_start_ms, tokens, cost_micros = amounts
    return Debit(ledger, window_start_ms, lease_id, tokens, cost_micros)


def lease_problem(request: LeaseBudgetRequest) -> str | None:
    """Why a ``LeaseBudget`` request is refused, or ``None``."""
    if not 0 < len(request.ledger) <= MAX_LEDGER_CHARS or not request.ledger.isprintable():
        return f"ledger must be printable text of 1 to {MAX_LEDGER_CHARS} chars"
    if not 0 < request.window_ms <= 366 * 86_400_000:
        return "window_ms must be from 1 ms to 366 days"
    amounts = (
        request.cap_tokens,
        request.cap_cost_micros,
        request.want_tokens,
        request.want_cost_micros,
        request.released_spent_tokens,
        request.released_spent_cost_micros,
    )
    if any(not 0 <= amount <= MAX_AMOUNT for amount in amounts):
        return f"caps, wants and spent amounts must be from 0 to {MAX_AMOUNT}"
    if not request.cap_tokens and not request.cap_cost_micros:
        return "a budget needs a cap: cap_tokens, cap_cost_micros or both"
    if len(request.owner) > 200 or len(request.release_lease_id) > 64:
        return "owner is at most 200 chars and release_lease_id at most 64"
    return None


def apply_debits(tx: sql.Tx, debits: Sequence[Debit], now_ms: int) -> None:
    """Add newly recorded debits to their windows and leases (windows first, in key order)."""
    windows: dict[tuple[str, int], list[int]] = {}
    leases: dict[str, list[int]] = {}
    for debit in debits:
        totals = windows.setdefault((debit.ledger, debit.window_start_ms), [0, 0, 0])
        totals[0] += debit.tokens
        totals[1] += debit.cost_micros
        totals[2] += 1
        if debit.lease_id:
            spent = leases.setdefault(debit.lease_id, [0, 0])
            spent[0] += debit.tokens
            spent[1] += debit.cost_micros
    for (ledger, start), (tokens, cost, count) in sorted(windows.items()):
        tx.execute(
            """INSERT INTO effector_budget_windows (ledger, window_start_ms, window_ms,
                 cap_tokens, cap_cost_micros, debited_tokens, debited_cost_micros, debits,
                 updated_at_ms) VALUES (?, ?, 0, 0, 0, ?, ?, ?, ?)
               ON CONFLICT (ledger, window_start_ms) DO UPDATE SET
                 debited_tokens = effector_budget_windows.debited_tokens + excluded.debited_tokens,
                 debited_cost_micros = effector_budget_windows.debited_cost_micros
                   + excluded.debited_cost_micros,
                 debits = effector_budget_windows.debits + excluded.debits,
                 updated_at_ms = excluded.updated_at_ms""",
            (sql.text(ledger), start, tokens, cost, count, now_ms),
        )
    for lease_id, (tokens, cost) in sorted(leases.items()):
        tx.execute(
            """UPDATE effector_budget_leases SET debited_tokens = debited_tokens + ?,
                 debited_cost_micros = debited_cost_micros + ? WHERE lease_id = ?""",
            (tokens, cost, lease_id),
        )


_LIVE_HOLDINGS = """SELECT
      COALESCE(SUM(CASE WHEN granted_tokens > debited_tokens
                        THEN granted_tokens - debited_tokens ELSE 0 END), 0),
      COALESCE(SUM(CASE WHEN granted_cost_micros > debited_cost_micros
                        THEN granted_cost_micros - debited_cost_micros ELSE 0 END), 0),
      COUNT(*)
    FROM effector_budget_leases
    WHERE ledger = ? AND window_start_ms = ? AND expires_at_ms > ?"""
"""What a window's live leases hold and have not debited yet, and how many there are."""


def _holdings(tx: sql.Tx, ledger: str, start: int, now_ms: int) -> tuple[int, int, int]:
    """What a window's live leases hold and have not debited (tokens, cost), and their count."""
    tokens, cost, count = tx.execute(_LIVE_HOLDINGS, (ledger, start, now_ms)).fetchone()
    return int(tokens), int(cost), int(count)  # PostgreSQL sums as NUMERIC


def _grant(cap: int, want: int, debited: int, leased: int) -> int:
    """What a lease may take of one measure (``cap`` 0: that measure has no cap)."""
    if not cap:
        return 0
    return max(0, min(want, cap - debited - leased))


class BudgetLedger:
    """The budget verbs of :class:`~effector.store.sql.SqlStore`, which mixes them in."""

    if TYPE_CHECKING:  # supplied by SqlStore
        _dialect: sql.Dialect

        async def _run(self, work: Callable[[sql.Tx], _T], *, write: bool = True) -> _T: ...

    async def lease_budget(
        self, request: LeaseBudgetRequest, now_ms: int, lease_ms: int
    ) -> LeaseBudgetResponse:
        """Release the request's old lease (its unspent part), then grant what the cap leaves.

        Nothing is granted unless every capped measure has some left: the window is exhausted.
        """
        return await self._run(lambda tx: self._lease(tx, request, now_ms, lease_ms))

    def _lease(
        self, tx: sql.Tx, request: LeaseBudgetRequest, now_ms: int, lease_ms: int
    ) -> LeaseBudgetResponse:
        ledger = sql.text(request.ledger)
        start = now_ms - now_ms % request.window_ms
        tx.execute(
            """INSERT INTO effector_budget_windows (ledger, window_start_ms, window_ms,
                 cap_tokens, cap_cost_micros, debited_tokens, debited_cost_micros, debits,
                 updated_at_ms) VALUES (?, ?, ?, ?, ?, 0, 0, 0, ?)
               ON CONFLICT (ledger, window_start_ms) DO UPDATE SET
                 window_ms = excluded.window_ms, cap_tokens = excluded.cap_tokens,
                 cap_cost_micros = excluded.cap_cost_micros,
                 updated_at_ms = excluded.updated_at_ms""",
            (ledger, start, request.window_ms, request.cap_tokens, request.cap_cost_micros, now_ms),
        )
        debited_tokens, debited_cost = (
            int(amount)
            for amount in tx.execute(
                """SELECT debited_tokens, debited_cost_micros FROM effector_budget_windows
                   WHERE ledger = ? AND window_start_ms = ?"""
                + self._dialect.for_update,
                (ledger, start),
            ).fetchone()
        )
        if request.release_lease_id:
            # It keeps holding what was spent and not yet debited (debits in flight) for one
            # more lease time, so those debits can arrive before that part returns.
            tx.execute(
                """UPDATE effector_budget_leases SET
                     granted_tokens = CASE WHEN debited_tokens > ? THEN debited_tokens ELSE ? END,
                     granted_cost_micros = CASE WHEN debited_cost_micros > ?
                       THEN debited_cost_micros ELSE ? END,
                     expires_at_ms = CASE WHEN expires_at_ms > ? THEN expires_at_ms ELSE ? END
                   WHERE lease_id = ?""",
                (
                    request.released_spent_tokens,
                    request.released_spent_tokens,
                    request.released_spent_cost_micros,
                    request.released_spent_cost_micros,
                    now_ms + lease_ms,
                    now_ms + lease_ms,
                    request.release_lease_id,
                ),
            )
        leased_tokens, leased_cost, _ = _holdings(tx, ledger, start, now_ms)
        tokens = _grant(request.cap_tokens, request.want_tokens, debited_tokens, leased_tokens)
        cost = _grant(request.cap_cost_micros, request.want_cost_micros, debited_cost, leased_cost)
        exhausted = (request.cap_tokens and not tokens) or (request.cap_cost_micros and not cost)
        answer = LeaseBudgetResponse(
            window_start_ms=start,
            debited_tokens=debited_tokens,
            debited_cost_micros=debited_cost,
            leased_tokens=leased_tokens,
            leased_cost_micros=leased_cost,
        )
        if exhausted or not (request.want_tokens or request.want_cost_micros):
            return answer
        lease_id = str(uuid.uuid4())
        tx.execute(
            """INSERT INTO effector_budget_leases (lease_id, ledger, window_start_ms, owner,
                 granted_tokens, granted_cost_micros, debited_tokens, debited_cost_micros,
                 granted_at_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?)""",
            (
                lease_id,
                ledger,
                start,
                sql.text(request.owner),
                tokens,
                cost,
                now_ms,
                now_ms + lease_ms,
            ),
        )
        answer.lease_id = lease_id
        answer.granted_tokens = tokens
        answer.granted_cost_micros = cost
        answer.expires_at_ms = now_ms + lease_ms
        answer.lease_ms = lease_ms
        answer.leased_tokens = leased_tokens + tokens
        answer.leased_cost_micros = leased_cost + cost
        return answer

    async def budget_windows(self, limit: int, now_ms: int) -> list[BudgetWindow]:
        """The newest budget windows (at most ``limit``), each with its live leases' holdings."""

        def windows(tx: sql.Tx) -> list[BudgetWindow]:
            rows = tx.execute(
                """SELECT ledger, window_start_ms, window_ms, cap_tokens, cap_cost_micros,
                     debited_tokens, debited_cost_micros, debits FROM effector_budget_windows
                   ORDER BY window_start_ms DESC, ledger LIMIT ?""",
                (limit,),
            ).fetchall()
            found: list[BudgetWindow] = []
            for row in rows:
                held = _holdings(tx, row[0], row[1], now_ms)
                found.append(
                    BudgetWindow(
                        ledger=row[0],
                        window_start_ms=row[1],
                        window_ms=row[2],
                        cap_tokens=row[3],
                        cap_cost_micros=row[4],
                        debited_tokens=row[5],
                        debited_cost_micros=row[6],
                        debits=row[7],
                        leased_tokens=held[0],
                        leased_cost_micros=held[1],
                        live_leases=held[2],
                    )
                )
            return found

        return await self._run(windows, write=False)
