"""``BudgetLedger``: fleet budgets' windows, the leases workers hold on them, and their debits.

A window's allowance of each measure (tokens, cost in micro-dollars, requests) is its cap less
what was debited and what live leases still hold. A lease transaction locks the window's row,
so grants never exceed a cap; a debit (a ``BUDGET_DEBIT`` intent, recorded once by id) adds to
the window and to its lease in the transaction that records it.
:class:`~effector.store.sql.SqlStore` mixes these verbs in.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import effector.store.schema as sql
from beam_agents._protos import BudgetWindow, LeaseBudgetRequest, LeaseBudgetResponse, ToolIntent
from beam_agents._protos.bounds import MAX_BUDGET_AMOUNT, MAX_LEDGER_CHARS

_T = TypeVar("_T")

MAX_AMOUNT = MAX_BUDGET_AMOUNT
MAX_TOTAL = 2**62
"""Where a window's or a lease's debited total stops growing (a BIGINT must never overflow)."""
MEASURES = ("tokens", "cost_micros", "requests")
"""What a budget counts; each has ``cap_``, ``debited_`` (and on leases ``granted_``) columns."""
_DEBIT_FIELDS = {"ledger", "lease_id", "window_start_ms", *MEASURES}
_Amounts = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Debit:
    """One committed model call's usage of one budget, as its ``BUDGET_DEBIT`` intent states."""

    ledger: str
    window_start_ms: int
    lease_id: str
    amounts: _Amounts
    """Tokens, cost (micro-dollars) and requests, in :data:`MEASURES` order."""


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
    if not ledger.isprintable():
        raise ValueError("a budget debit's ledger must be printable text, as a lease's is")
    if not isinstance(lease_id, str) or len(lease_id) > 64:
        raise ValueError("a budget debit's lease_id is text of at most 64 chars")
    numbers = [fields[name] for name in ("window_start_ms", *MEASURES)]
    if any(type(value) is not int or not 0 <= value <= MAX_AMOUNT for value in numbers):
        raise ValueError(
            f"a budget debit's window_start_ms, {', '.join(MEASURES)} are ints from 0 to "
            f"{MAX_AMOUNT}"
        )
    start, tokens, cost, requests = numbers
    return Debit(ledger, start, lease_id, (tokens, cost, requests))


def _caps(request: LeaseBudgetRequest) -> _Amounts:
    return request.cap_tokens, request.cap_cost_micros, request.cap_requests


def _wants(request: LeaseBudgetRequest) -> _Amounts:
    return request.want_tokens, request.want_cost_micros, request.want_requests


def _released(request: LeaseBudgetRequest) -> _Amounts:
    return (
        request.released_spent_tokens,
        request.released_spent_cost_micros,
        request.released_spent_requests,
    )


def lease_problem(request: LeaseBudgetRequest) -> str | None:
    """Why a ``LeaseBudget`` request is refused, or ``None``."""
    if not 0 < len(request.ledger) <= MAX_LEDGER_CHARS or not request.ledger.isprintable():
        return f"ledger must be printable text of 1 to {MAX_LEDGER_CHARS} chars"
    if not 0 < request.window_ms <= 366 * 86_400_000:
        return "window_ms must be from 1 ms to 366 days"
    amounts = (*_caps(request), *_wants(request), *_released(request))
    if any(not 0 <= amount <= MAX_AMOUNT for amount in amounts):
        return f"caps, wants and spent amounts must be from 0 to {MAX_AMOUNT}"
    if not any(_caps(request)):
        return "a budget needs a cap: cap_tokens, cap_cost_micros, cap_requests or several"
    if len(request.owner) > 200 or len(request.release_lease_id) > 64:
        return "owner is at most 200 chars and release_lease_id at most 64"
    return None


def _columns(prefix: str) -> str:
    return ", ".join(f"{prefix}_{measure}" for measure in MEASURES)


def _added(table: str) -> str:
    return ", ".join(
        f"debited_{m} = CASE WHEN {table}.debited_{m} + excluded.debited_{m} > {MAX_TOTAL}"
        f" THEN {MAX_TOTAL} ELSE {table}.debited_{m} + excluded.debited_{m} END"
        for m in MEASURES
    )


def apply_debits(tx: sql.Tx, debits: Sequence[Debit], now_ms: int) -> None:
    """Add newly recorded debits to their windows and leases (windows first, in key order)."""
    windows: dict[tuple[str, int], list[int]] = {}
    leases: dict[str, list[int]] = {}
    for debit in debits:
        totals = windows.setdefault((debit.ledger, debit.window_start_ms), [0, 0, 0, 0])
        spent = leases.setdefault(debit.lease_id, [0, 0, 0]) if debit.lease_id else None
        for index, amount in enumerate(debit.amounts):
            totals[index] += amount
            if spent is not None:
                spent[index] += amount
        totals[3] += 1
    for (ledger, start), (*totals, count) in sorted(windows.items()):
        amounts = [min(total, MAX_TOTAL) for total in totals]
        tx.execute(
            f"""INSERT INTO effector_budget_windows (ledger, window_start_ms, window_ms,
                 {_columns("cap")}, {_columns("debited")}, debits, updated_at_ms)
               VALUES (?, ?, 0, 0, 0, 0, ?, ?, ?, ?, ?)
               ON CONFLICT (ledger, window_start_ms) DO UPDATE SET
                 {_added("effector_budget_windows")},
                 debits = effector_budget_windows.debits + excluded.debits,
                 updated_at_ms = excluded.updated_at_ms""",
            (sql.text(ledger), start, *amounts, count, now_ms),
        )
    for lease_id, totals in sorted(leases.items()):
        changes = ", ".join(
            f"debited_{m} = CASE WHEN debited_{m} + ? > {MAX_TOTAL} THEN {MAX_TOTAL}"
            f" ELSE debited_{m} + ? END"
            for m in MEASURES
        )
        amounts = [min(total, MAX_TOTAL) for total in totals]
        tx.execute(
            f"UPDATE effector_budget_leases SET {changes} WHERE lease_id = ?",
            (*(amount for amount in amounts for _ in range(2)), lease_id),
        )


_LIVE_HOLDINGS = (
    "SELECT "
    + ", ".join(
        f"COALESCE(SUM(CASE WHEN granted_{m} > debited_{m} THEN granted_{m} - debited_{m}"
        " ELSE 0 END), 0)"
        for m in MEASURES
    )
    + """, COUNT(*) FROM effector_budget_leases
    WHERE ledger = ? AND window_start_ms = ? AND expires_at_ms > ?"""
)
"""What a window's live leases hold and have not debited yet, and how many there are."""


def _holdings(tx: sql.Tx, ledger: str, start: int, now_ms: int) -> tuple[_Amounts, int]:
    """What a window's live leases hold and have not debited, per measure; and their count."""
    tokens, cost, requests, count = tx.execute(_LIVE_HOLDINGS, (ledger, start, now_ms)).fetchone()
    return (int(tokens), int(cost), int(requests)), int(count)  # PostgreSQL sums as NUMERIC


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
        """Release the request's old lease (its unspent part), then grant what the caps leave.

        Nothing is granted unless every capped measure has some left: the window is exhausted.
        """
        return await self._run(lambda tx: self._lease(tx, request, now_ms, lease_ms))

    def _lease(
        self, tx: sql.Tx, request: LeaseBudgetRequest, now_ms: int, lease_ms: int
    ) -> LeaseBudgetResponse:
        ledger = sql.text(request.ledger)
        start = now_ms - now_ms % request.window_ms
        caps = _caps(request)
        tx.execute(
            f"""INSERT INTO effector_budget_windows (ledger, window_start_ms, window_ms,
                 {_columns("cap")}, {_columns("debited")}, debits, updated_at_ms)
               VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, 0, ?)
               ON CONFLICT (ledger, window_start_ms) DO UPDATE SET
                 window_ms = excluded.window_ms,
                 {", ".join(f"cap_{m} = excluded.cap_{m}" for m in MEASURES)},
                 updated_at_ms = excluded.updated_at_ms""",
            (ledger, start, request.window_ms, *caps, now_ms),
        )
        row = tx.execute(
            f"""SELECT {_columns("debited")} FROM effector_budget_windows
                WHERE ledger = ? AND window_start_ms = ?"""
            + self._dialect.for_update,
            (ledger, start),
        ).fetchone()
        debited = (int(row[0]), int(row[1]), int(row[2]))
        if request.release_lease_id:
            # It keeps holding what was spent and not yet debited (debits in flight) for one
            # more lease time, so those debits can arrive before that part returns.
            kept = ", ".join(
                f"granted_{m} = CASE WHEN debited_{m} > ? THEN debited_{m} ELSE ? END"
                for m in MEASURES
            )
            spent = _released(request)
            tx.execute(
                f"""UPDATE effector_budget_leases SET {kept},
                      expires_at_ms = CASE WHEN expires_at_ms > ? THEN expires_at_ms ELSE ? END
                    WHERE lease_id = ?""",
                (
                    *(amount for amount in spent for _ in range(2)),
                    now_ms + lease_ms,
                    now_ms + lease_ms,
                    request.release_lease_id,
                ),
            )
        leased, _ = _holdings(tx, ledger, start, now_ms)
        wants = _wants(request)
        grants = tuple(
            _grant(cap, want, used, held)
            for cap, want, used, held in zip(caps, wants, debited, leased, strict=True)
        )
        exhausted = any(cap and not grant for cap, grant in zip(caps, grants, strict=True))
        answer = _answer(start, debited, leased)
        if exhausted or not any(wants):
            return answer
        lease_id = str(uuid.uuid4())
        tx.execute(
            f"""INSERT INTO effector_budget_leases (lease_id, ledger, window_start_ms, owner,
                 {_columns("granted")}, {_columns("debited")}, granted_at_ms, expires_at_ms)
               VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, 0, ?, ?)""",
            (lease_id, ledger, start, sql.text(request.owner), *grants, now_ms, now_ms + lease_ms),
        )
        answer = _answer(start, debited, tuple(h + g for h, g in zip(leased, grants, strict=True)))
        answer.lease_id = lease_id
        answer.granted_tokens, answer.granted_cost_micros, answer.granted_requests = grants
        answer.expires_at_ms = now_ms + lease_ms
        answer.lease_ms = lease_ms
        return answer

    async def budget_windows(self, limit: int, now_ms: int) -> list[BudgetWindow]:
        """The newest budget windows (at most ``limit``), each with its live leases' holdings."""

        def windows(tx: sql.Tx) -> list[BudgetWindow]:
            rows = tx.execute(
                f"""SELECT ledger, window_start_ms, window_ms, {_columns("cap")},
                     {_columns("debited")}, debits FROM effector_budget_windows
                   ORDER BY window_start_ms DESC, ledger LIMIT ?""",
                (limit,),
            ).fetchall()
            found: list[BudgetWindow] = []
            for row in rows:
                ledger, start, window_ms = row[0], int(row[1]), int(row[2])
                caps, debited = row[3:6], row[6:9]
                held, live = _holdings(tx, ledger, start, now_ms)
                found.append(
                    BudgetWindow(
                        ledger=ledger,
                        window_start_ms=start,
                        window_ms=window_ms,
                        cap_tokens=caps[0],
                        cap_cost_micros=caps[1],
                        cap_requests=caps[2],
                        debited_tokens=debited[0],
                        debited_cost_micros=debited[1],
                        debited_requests=debited[2],
                        leased_tokens=held[0],
                        leased_cost_micros=held[1],
                        leased_requests=held[2],
                        live_leases=live,
                        debits=row[9],
                    )
                )
            return found

        return await self._run(windows, write=False)


def _answer(start: int, debited: Sequence[int], leased: Sequence[int]) -> LeaseBudgetResponse:
    """A lease answer's window figures (no grant yet)."""
    return LeaseBudgetResponse(
        window_start_ms=start,
        debited_tokens=debited[0],
        debited_cost_micros=debited[1],
        debited_requests=debited[2],
        leased_tokens=leased[0],
        leased_cost_micros=leased[1],
        leased_requests=leased[2],
    )
