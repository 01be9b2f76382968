"""Where claims live: which intent each key's execution slot holds, by which token, until when.

An intent's row is written when it is submitted and when its result (or doubt) is recorded;
claiming, renewing and releasing it touch only its key's :class:`Hold`, which a
:class:`ClaimLedger` keeps: :class:`KeyRowClaims` in key rows (PostgreSQL, shared by replicas,
leases run out when a replica dies), :class:`MemoryClaims` in the process (SQLite, which one
process holds: a claim outlives no process, and after a crash each key's head counts as
possibly started). An intent is RUNNING while its key's hold has a token and it is not waiting
out a doubt.
"""

from __future__ import annotations

import abc
import enum
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import effector.store.schema as sql


@dataclass(frozen=True, slots=True)
class Hold:
    """A key's claim on its head intent, and the attempts that intent has had so far."""

    entity_key: bytes
    intent_id: str
    token: str | None
    """``None``: released unfinished; the attempts still count for the intent's next claim."""
    attempts: int
    started_at_ms: int
    lease_until_ms: int = 0
    owner: str = ""


class Release(enum.Enum):
    """How a hold is given back."""

    FINISHED = "finished"
    """The intent has its result: the key is free and forgets it."""
    STARTED = "started"
    """Unfinished after it may have started: its attempt counts at the next claim."""
    UNSTARTED = "unstarted"
    """Unfinished and never started: its attempt is not counted."""


_WORK = f"""EXISTS (SELECT 1 FROM effector_intents AS queued
    WHERE queued.entity_key = effector_keys.entity_key AND {sql.queued("queued")})"""
"""A key row's key has queued work (a probe of the open index)."""
_IDLE_KEY = f"claim_token IS NULL AND NOT {_WORK}"
"""A key row without a claim whose queue is empty."""


class ClaimLedger(abc.ABC):
    """The holds of keys; every method runs inside the caller's transaction ``tx``."""

    @abc.abstractmethod
    def queued(self, tx: sql.Tx, keys: Sequence[bytes], now_ms: int) -> None:
        """``keys`` (in arrival order) have new queued work."""

    @abc.abstractmethod
    def lock(self, tx: sql.Tx, keys: Iterable[bytes], now_ms: int) -> None:
        """Serialize this transaction with others touching ``keys`` (a submit's withdrawals)."""

    @abc.abstractmethod
    def claimable(self, tx: sql.Tx, limit: int, now_ms: int) -> list[tuple[bytes, Hold | None]]:
        """Up to ``limit`` keys with queued work and no live hold, in readiness order.

        Each comes with the hold it has (a lease that ran out, or one released unfinished).
        The caller takes them (:meth:`take`) or gives them back (:meth:`queued`).
        """

    @abc.abstractmethod
    def park(self, tx: sql.Tx, keys: Sequence[bytes]) -> None:
        """``keys`` (just offered) wait on a decision: not offered again until :meth:`queued`."""

    @abc.abstractmethod
    def take(self, tx: sql.Tx, holds: Sequence[Hold]) -> None:
        """Record new holds (each key was just offered by :meth:`claimable`)."""

    @abc.abstractmethod
    def holds(self, tx: sql.Tx, keys: Sequence[bytes], *, lock: bool = False) -> dict[bytes, Hold]:
        """The holds of ``keys`` (sorted; ``lock``: locked until the transaction ends)."""

    @abc.abstractmethod
    def release(self, tx: sql.Tx, holds: Sequence[Hold], now_ms: int, how: Release) -> None:
        """Give back ``holds`` (each as :meth:`holds` read it, its token current)."""

    @abc.abstractmethod
    def extend(self, tx: sql.Tx, holds: Sequence[Hold], until_ms: int) -> None:
        """Extend the leases of ``holds`` (each as :meth:`holds` read it) to ``until_ms``."""

    @abc.abstractmethod
    def settled(self, tx: sql.Tx, keys: Iterable[bytes]) -> None:
        """Intents of ``keys`` left their queues (a result, a withdrawal)."""

    @abc.abstractmethod
    def held(self, tx: sql.Tx) -> list[Hold]:
        """Every hold with a token."""

    @abc.abstractmethod
    def savepoint(self) -> int:
        """A point :meth:`rollback` returns the ledger to (the transaction's savepoint)."""

    @abc.abstractmethod
    def rollback(self, point: int = 0) -> None:
        """Undo what the transaction did to the ledger since ``point`` (0: all of it)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """The transaction committed: what it did to the ledger stands."""


def _hold(row: Sequence[Any]) -> Hold:
    key, intent_id, token, attempts, started_at_ms, lease_until_ms, owner = row
    return Hold(
        bytes(key),
        intent_id,
        token,
        int(attempts),
        int(started_at_ms or 0),
        int(lease_until_ms or 0),
        owner or "",
    )


_HOLD_COLUMNS = (
    "entity_key, claimed_intent_id, claim_token, attempts, started_at_ms, lease_expires_at_ms, "
    "lease_owner"
)


class KeyRowClaims(ClaimLedger):
    """Holds in ``effector_keys`` rows, locked ``FOR UPDATE`` (``SKIP LOCKED`` to claim).

    A key row says since when its key is ready (``NULL``: it has no queued work); rows are
    created by submits and kept (pruned once idle), so a submit to a known key writes nothing
    unless the key was idle. No index holds a claim's columns: a claim, renewal or unfinished
    release is a HOT update.
    """

    def __init__(self, dialect: sql.Dialect) -> None:
        self._dialect = dialect

    def queued(self, tx: sql.Tx, keys: Sequence[bytes], now_ms: int) -> None:
        """Create or lock the keys' rows (in key order), ready since ``now_ms`` if idle."""
        self._upsert(
            tx,
            keys,
            now_ms,
            "SET ready_at_ms = excluded.ready_at_ms WHERE effector_keys.ready_at_ms IS NULL",
        )

    def lock(self, tx: sql.Tx, keys: Iterable[bytes], now_ms: int) -> None:
        """Create or lock the keys' rows (in key order), their readiness unchanged."""
        # An upsert locks the row it finds even where its condition leaves it unchanged.
        self._upsert(tx, keys, None, "SET ready_at_ms = NULL WHERE FALSE")

    @staticmethod
    def _upsert(tx: sql.Tx, keys: Iterable[bytes], ready_at_ms: int | None, update: str) -> None:
        for chunk in sql.chunks(sorted(set(keys))):
            tx.execute(
                f"""INSERT INTO effector_keys (entity_key, ready_at_ms, attempts)
                    VALUES {sql.row_marks(len(chunk), 3)}
                    ON CONFLICT (entity_key) DO UPDATE {update}""",
                sql.flatten([(key, ready_at_ms, 0) for key in chunk]),
            )

    def claimable(self, tx: sql.Tx, limit: int, now_ms: int) -> list[tuple[bytes, Hold | None]]:
        """Ready key rows in readiness order, locked, skipping rows other claims have locked.

        A key is ready while it has queued work (a key left without work is offered at most
        once more: finding no head, the claim marks it idle).
        """
        rows = tx.execute(
            f"""SELECT {_HOLD_COLUMNS} FROM effector_keys
                WHERE ready_at_ms IS NOT NULL AND (claim_token IS NULL OR lease_expires_at_ms < ?)
                ORDER BY ready_at_ms, entity_key LIMIT ?"""
            + self._dialect.skip_locked,
            (now_ms, limit),
        ).fetchall()
        return [(bytes(row[0]), None if row[1] is None else _hold(row)) for row in rows]

    def park(self, tx: sql.Tx, keys: Sequence[bytes]) -> None:
        """Mark the key rows (locked by :meth:`claimable`) not ready."""
        for chunk in sql.chunks(sorted(set(keys))):
            tx.execute(
                f"""UPDATE effector_keys SET ready_at_ms = NULL
                    WHERE entity_key IN ({sql.marks(len(chunk))})""",
                chunk,
            )

    def take(self, tx: sql.Tx, holds: Sequence[Hold]) -> None:
        """Write the holds on their key rows (locked by :meth:`claimable`)."""
        for chunk in sql.chunks(holds):
            tx.execute(
                f"""WITH taken (entity_key, token, intent_id, attempts, started_at_ms, owner,
                      lease_until_ms) AS (VALUES {sql.row_marks(len(chunk), 7)})
                    UPDATE effector_keys SET claim_token = taken.token,
                      claimed_intent_id = taken.intent_id, attempts = taken.attempts,
                      started_at_ms = taken.started_at_ms, lease_owner = taken.owner,
                      lease_expires_at_ms = taken.lease_until_ms
                    FROM taken WHERE effector_keys.entity_key = taken.entity_key""",
                sql.flatten(
                    [
                        (
                            hold.entity_key,
                            hold.token,
                            hold.intent_id,
                            hold.attempts,
                            hold.started_at_ms,
                            hold.owner,
                            hold.lease_until_ms,
                        )
                        for hold in chunk
                    ]
                ),
            )

    def holds(self, tx: sql.Tx, keys: Sequence[bytes], *, lock: bool = False) -> dict[bytes, Hold]:
        """The holds on the keys' rows (``lock``: ``FOR UPDATE``, in key order)."""
        suffix = self._dialect.for_update if lock else ""
        found: dict[bytes, Hold] = {}
        for chunk in sql.chunks(sorted(keys)):
            for row in tx.execute(
                f"""SELECT {_HOLD_COLUMNS} FROM effector_keys
                    WHERE entity_key IN ({sql.marks(len(chunk))}) ORDER BY entity_key{suffix}""",
                chunk,
            ).fetchall():
                if row[1] is not None:
                    found[bytes(row[0])] = _hold(row)
        return found

    def release(self, tx: sql.Tx, holds: Sequence[Hold], now_ms: int, how: Release) -> None:
        """Clear the claims on the key rows (a finished key is ready again at ``now_ms``)."""
        changes, params = {
            Release.FINISHED: (
                f"claimed_intent_id = NULL, attempts = 0, ready_at_ms = CASE WHEN {_WORK} THEN ?"
                " END",
                [now_ms],
            ),
            Release.STARTED: ("attempts = attempts", []),
            Release.UNSTARTED: ("attempts = attempts - 1", []),
        }[how]
        for chunk in sql.chunks(sorted(holds, key=lambda hold: hold.entity_key)):
            tx.execute(
                f"""WITH released (entity_key, token) AS (VALUES {sql.row_marks(len(chunk), 2)})
                    UPDATE effector_keys SET {changes}, claim_token = NULL, lease_owner = NULL,
                      lease_expires_at_ms = NULL
                    FROM released
                    WHERE effector_keys.entity_key = released.entity_key
                      AND effector_keys.claim_token = released.token""",
                [*sql.flatten([(hold.entity_key, hold.token) for hold in chunk]), *params],
            )

    def extend(self, tx: sql.Tx, holds: Sequence[Hold], until_ms: int) -> None:
        """Move the leases on the key rows."""
        for hold in sorted(holds, key=lambda hold: hold.entity_key):
            tx.execute(
                """UPDATE effector_keys SET lease_expires_at_ms = ?
                   WHERE entity_key = ? AND claim_token = ?""",
                (until_ms, hold.entity_key, hold.token),
            )

    def settled(self, tx: sql.Tx, keys: Iterable[bytes]) -> None:
        """Mark the keys left without queued work or a claim idle."""
        for chunk in sql.chunks(sorted(set(keys))):
            tx.execute(
                f"""UPDATE effector_keys SET ready_at_ms = NULL
                    WHERE entity_key IN ({sql.marks(len(chunk))}) AND ready_at_ms IS NOT NULL
                      AND {_IDLE_KEY}""",
                chunk,
            )

    def held(self, tx: sql.Tx) -> list[Hold]:
        """Every key row with a claim."""
        rows = tx.execute(
            f"SELECT {_HOLD_COLUMNS} FROM effector_keys WHERE claim_token IS NOT NULL"
        ).fetchall()
        return [_hold(row) for row in rows]

    def savepoint(self) -> int:
        """Nothing to mark: the database undoes the key rows itself."""
        return 0

    def rollback(self, point: int = 0) -> None:
        """Nothing to undo: the database undoes the key rows itself."""

    def commit(self) -> None:
        """Nothing to keep: the key rows are committed with the transaction."""


def prune_idle_keys(tx: sql.Tx) -> int:
    """Delete every key row without queued work or a claim; returns how many."""
    return tx.execute(
        f"DELETE FROM effector_keys WHERE claim_token IS NULL AND ready_at_ms IS NULL"
        f" AND NOT {_WORK}"
    ).rowcount


_MISSING = object()


class MemoryClaims(ClaimLedger):
    """Holds in this process, for a store only one process opens (SQLite).

    Keys that may have queued work wait in arrival order (a dict keeps insertion order); a
    claim probes each for work as it offers it. Changes are undone if their transaction rolls
    back. Reads from other threads (the console's) see the holds under a lock.
    """

    def __init__(self) -> None:
        self._waiting: dict[bytes, None] = {}
        self._holds: dict[bytes, Hold] = {}
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def load(self, tx: sql.Tx, *, crashed: bool) -> None:
        """Queue every key with work, oldest head first; after a crash count each head started.

        A crashed process may have started each key's head (its claims were in memory): the
        head's attempt is counted, so its next claim asks its reconciler first.
        """
        keys = [
            bytes(row[0])
            for row in tx.execute(
                f"""SELECT entity_key FROM effector_intents
                    WHERE {sql.OPEN} AND kind = 1 GROUP BY entity_key ORDER BY MIN(rowid)"""
            ).fetchall()
        ]
        self._waiting = dict.fromkeys(keys)
        if crashed:
            for key in keys:
                tx.execute(
                    f"""UPDATE effector_intents SET attempts = attempts + 1
                        WHERE intent_id = (SELECT queued.intent_id FROM effector_intents AS queued
                          WHERE queued.entity_key = ? AND {sql.queued("queued")}
                          ORDER BY queued.seq, queued.step_index LIMIT 1)
                          AND state != {int(sql.AWAITING)}""",
                    (key,),
                )

    def unsaved(self) -> list[Hold]:
        """The holds whose attempts only this process knows (to record at a clean close)."""
        return list(self._holds.values())

    def _set(self, mapping: dict[bytes, Any], key: bytes, value: Any) -> None:
        old = mapping.get(key, _MISSING)
        self._undo.append(lambda: self._restore(mapping, key, old))
        with self._lock:
            mapping[key] = value

    def _drop(self, mapping: dict[bytes, Any], key: bytes) -> None:
        if key in mapping:
            old = mapping[key]
            self._undo.append(lambda: self._restore(mapping, key, old))
            with self._lock:
                del mapping[key]

    def _restore(self, mapping: dict[bytes, Any], key: bytes, old: Any) -> None:
        with self._lock:
            if old is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = old

    def _wait(self, key: bytes) -> None:
        """Put ``key`` at the end of the waiting line."""
        self._drop(self._waiting, key)
        self._set(self._waiting, key, None)

    def queued(self, tx: sql.Tx, keys: Sequence[bytes], now_ms: int) -> None:
        """Put the keys not yet waiting at the end of the line."""
        for key in keys:
            if key not in self._waiting:
                self._set(self._waiting, key, None)

    def lock(self, tx: sql.Tx, keys: Iterable[bytes], now_ms: int) -> None:
        """Nothing to lock: the one writer serializes every transaction."""

    def claimable(self, tx: sql.Tx, limit: int, now_ms: int) -> list[tuple[bytes, Hold | None]]:
        """Keys whose lease ran out, then the line's keys, oldest first (each leaves the line).

        A key without work is dropped; a held key is skipped (its release puts it back).
        """
        lapsed = [
            key
            for key, held in self._holds.items()
            if held.token is not None and held.lease_until_ms < now_ms
        ]
        working = _with_work(tx, lapsed[:limit]) if lapsed else set()
        offered = [(key, self._holds.get(key)) for key in lapsed[:limit] if key in working]
        while len(offered) < limit and self._waiting:
            line = list(itertools.islice(self._waiting, limit - len(offered)))
            for key in line:
                self._drop(self._waiting, key)
            free = [key for key in line if key not in self._holds or not self._holds[key].token]
            working = _with_work(tx, free)
            offered += [(key, self._holds.get(key)) for key in free if key in working]
        return offered

    def park(self, tx: sql.Tx, keys: Sequence[bytes]) -> None:
        """Nothing to do: :meth:`claimable` took the keys out of the line."""

    def take(self, tx: sql.Tx, holds: Sequence[Hold]) -> None:
        """Keep the holds."""
        for hold in holds:
            self._set(self._holds, hold.entity_key, hold)

    def holds(self, tx: sql.Tx, keys: Sequence[bytes], *, lock: bool = False) -> dict[bytes, Hold]:
        """The keys' holds (the one writer needs no lock)."""
        with self._lock:
            return {key: self._holds[key] for key in keys if key in self._holds}

    def release(self, tx: sql.Tx, holds: Sequence[Hold], now_ms: int, how: Release) -> None:
        """Forget finished holds, keep unfinished ones' attempts; the keys wait in line again."""
        for hold in holds:
            current = self._holds.get(hold.entity_key)
            if current is None or current.token != hold.token:
                continue
            if how is Release.FINISHED:
                self._drop(self._holds, hold.entity_key)
                self._wait(hold.entity_key)
                continue
            attempts = current.attempts - (how is Release.UNSTARTED)
            self._set(self._holds, hold.entity_key, replace(current, token=None, attempts=attempts))
            if hold.entity_key not in self._waiting:
                self._set(self._waiting, hold.entity_key, None)

    def extend(self, tx: sql.Tx, holds: Sequence[Hold], until_ms: int) -> None:
        """Move the holds' leases."""
        for hold in holds:
            current = self._holds.get(hold.entity_key)
            if current is not None and current.token == hold.token:
                self._set(self._holds, hold.entity_key, replace(current, lease_until_ms=until_ms))

    def settled(self, tx: sql.Tx, keys: Iterable[bytes]) -> None:
        """Nothing to do: a key without work leaves the line when it is next offered."""

    def held(self, tx: sql.Tx) -> list[Hold]:
        """Every hold with a token."""
        with self._lock:
            return [hold for hold in self._holds.values() if hold.token is not None]

    def savepoint(self) -> int:
        """The length of the undo log."""
        return len(self._undo)

    def rollback(self, point: int = 0) -> None:
        """Undo the changes logged after ``point``, newest first."""
        while len(self._undo) > point:
            self._undo.pop()()

    def commit(self) -> None:
        """Forget the undo log."""
        self._undo.clear()


def _with_work(tx: sql.Tx, keys: Sequence[bytes]) -> set[bytes]:
    """Those of ``keys`` with queued work (one statement probing the open index per key)."""
    return {
        bytes(row[0])
        for chunk in sql.chunks(keys)
        for row in tx.execute(
            f"""SELECT DISTINCT queued.entity_key FROM effector_intents AS queued
                WHERE queued.entity_key IN ({sql.marks(len(chunk))}) AND {sql.queued("queued")}""",
            chunk,
        ).fetchall()
    }
