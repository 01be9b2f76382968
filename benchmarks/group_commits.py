"""Where a one-intent Submit call waits: in the store's group commits, or outside them.

No hook in the effector times a Submit's steps, so this measures from outside: one round of
calls at effectors whose store's statements are timed (SQLite: a copy of the effector run by
:mod:`benchmarks.sqlite_statements`; PostgreSQL: the same effectors, the server's statements
counted by :mod:`benchmarks.pg_statements`), and the calls' latencies at the client. How many
calls shared each commit, how long a commit took, and how much of the round the store was
inside one, set beside a call's latency, say whether the store's commits are the calls' critical
path. :func:`where` classifies; :func:`wait_text` says it for benchmark 6's "what is left".
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import grpc

from benchmarks import sql_shapes, sqlite_statements
from benchmarks.effector_load import calls_round, server_processes
from benchmarks.harness import EFFECTOR_READY, effector_command, percentile
from benchmarks.paired_rounds import Batch
from benchmarks.pg_statements import StatementTime, StatementTimes
from effector.client import AsyncEffectorClient

BACK_TO_BACK = 0.8
"""A store inside its commits at least this share of the round has them back to back."""
MOSTLY_OUTSIDE = 0.5
"""A call whose two commits' time is at most this share of its p50 waits mostly outside them."""


class Wait(Enum):
    """Where the round puts a call's wait."""

    STORE = "store"
    """The commits ran back to back: the store is on every call's critical path."""
    OUTSIDE = "outside"
    """The store idled with calls outstanding, and a call's wait is mostly outside its commits."""
    BOTH = "both"
    UNRESOLVED = "unresolved"
    """The store's side of a commit was only partly timed (PostgreSQL: the server's)."""


@dataclass(frozen=True)
class GroupCommits:
    """One round of calls and the store's commits in it."""

    batch: Batch
    commits: int
    statements_s: float
    """Wall time inside the commits' statements (SQLite: the writer's, BEGIN and COMMIT included,
    waits for the GIL too; PostgreSQL: the server's execution, summed over its connections)."""
    commit_s: float
    """Of it, the COMMITs' (on SQLite with ``synchronous=FULL``, each an fsync)."""
    whole: bool
    """Whether ``statements_s`` is the whole commit (SQLite), not the server's part only."""
    statements: tuple[StatementTime, ...] = ()
    """The server's statements over the round, longest first (PostgreSQL)."""
    in_flight: int | None = None
    """Intents in flight in the effectors' database at the round's end (PostgreSQL: what the
    worker's housekeeping count walks; the ingest-only effectors leave every intent PENDING)."""

    @property
    def calls_per_commit(self) -> float:
        return self.batch.calls / self.commits

    @property
    def apart(self) -> list[StatementTime]:
        """The statements no Submit runs (:data:`benchmarks.sql_shapes.NOT_SUBMIT`)."""
        return [s for s in self.statements if sql_shapes.not_submit(s.text) is not None]

    @property
    def own_s(self) -> float:
        """The commits' statements: all of them but those no Submit runs."""
        return self.statements_s - sum(s.exec_ms for s in self.apart) / 1000

    @property
    def commit_ms(self) -> float:
        """A commit's statements, on average, in ms."""
        return self.own_s / self.commits * 1000

    @property
    def per_call_us(self) -> int:
        """The statements' time per call, in whole µs (as printed)."""
        return round(self.statements_s / self.batch.calls * 1e6)

    @property
    def apart_us(self) -> int:
        """The time per call of the statements no Submit runs, in whole µs (as printed)."""
        return sum(self._us(s.exec_ms) for s in self.apart)

    @property
    def own_us(self) -> int:
        """Submit's own statements' time per call, in whole µs: the printed difference."""
        return self.per_call_us - self.apart_us

    def _us(self, ms: float) -> int:
        return round(ms / self.batch.calls * 1000)

    def statement_us(self, prefix: str) -> int:
        """The time per call, in whole µs, of the statements whose shape starts ``prefix``."""
        return self._us(sum(s.exec_ms for s in self.statements if s.text.startswith(prefix)))

    @property
    def busy(self) -> float:
        """The share of the round the store spent inside the commits' statements."""
        return self.own_s / self.batch.elapsed_s

    @property
    def p50_ms(self) -> float:
        return percentile(self.batch.latencies_s, 0.5) * 1000


def where(commits: GroupCommits) -> Wait:
    """Whether a call's wait is in the store's commits, outside them, or both (module doc)."""
    if commits.busy >= BACK_TO_BACK:
        return Wait.STORE
    if not commits.whole:
        return Wait.UNRESOLVED
    if 2 * commits.commit_ms <= MOSTLY_OUTSIDE * commits.p50_ms:
        return Wait.OUTSIDE
    return Wait.BOTH


def sqlite_round(database: str, shape: tuple[int, int, int], scratch: Path) -> GroupCommits | None:
    """One round at a fresh ingest-only effector with its write statements timed."""
    timings = scratch / "group-commits.json"
    command = effector_command(database, concurrency=0, statements_file=timings)
    with server_processes([command], EFFECTOR_READY, scratch) as processes:
        batch = asyncio.run(calls_round([p.address for p in processes], shape, warm=False))
    if not timings.exists():
        return None
    costs = sqlite_statements.read(timings)
    commit = [cost for cost in costs if cost.text == "COMMIT"]
    count = sum(cost.calls for cost in commit)
    if not count:
        return None
    wall = sum(cost.wall_s for cost in costs)
    return GroupCommits(batch, count, wall, sum(cost.wall_s for cost in commit), whole=True)


def postgres_round(
    targets: Sequence[str], shape: tuple[int, int, int], statements: StatementTimes
) -> GroupCommits | None:
    """One round at the running effectors, the server's statements counted around it."""
    statements.reset()
    batch = asyncio.run(calls_round(targets, shape, warm=False))
    ranked, total_ms = statements.read(limit=1_000)
    commit = [statement for statement in ranked if statement.text == "COMMIT"]
    count = sum(statement.calls for statement in commit)
    if not count:
        return None
    commit_ms = sum(statement.exec_ms for statement in commit)
    in_flight = asyncio.run(_in_flight(targets[0])) if targets else None
    return GroupCommits(
        batch, count, total_ms / 1000, commit_ms / 1000, False, tuple(ranked), in_flight
    )


async def _in_flight(target: str) -> int | None:
    """The intents in flight in an effector's database (its Status call), after the count."""
    client = AsyncEffectorClient(target)
    try:
        return int((await client.status()).in_flight)
    except grpc.RpcError:
        return None
    finally:
        await client.close()


def statements_text(commits: GroupCommits) -> str:
    """The server's statements per call: Submit's own, largest first, adding up to their
    printed total, then those no Submit runs, set apart with where they come from."""
    calls, total = commits.batch.calls, commits.per_call_us
    merged: dict[str, float] = {}
    for statement in commits.statements:
        if sql_shapes.not_submit(statement.text) is None:
            text = sql_shapes.shortened(statement.text)
            merged[text] = merged.get(text, 0.0) + statement.exec_ms
    ranked = sorted(merged.items(), key=lambda pair: -pair[1])[:STATEMENTS_SHOWN]
    shown = [(text, round(ms / calls * 1000)) for text, ms in ranked]
    if not shown:
        return ""
    apart = commits.apart
    own = commits.own_us
    rest = own - sum(us for _, us in shown)
    parts = "; ".join(f"`{text}` {us}" for text, us in shown)
    head = (
        f" By statement, the server's execution took {total} µs of wall time per call (lock "
        "waits included)"
    )
    if not apart:
        return f"{head}: {parts}; every other statement {rest}."
    return (
        f"{head}, Submit's own statements {own} of it: {parts}; every other statement {rest}. "
        + _apart_text(commits, apart)
    )


def _apart_text(commits: GroupCommits, apart: list[StatementTime]) -> str:
    """The statements no Submit runs: what each is, how often it ran, what it walked."""
    calls = commits.batch.calls
    each = "; ".join(
        f"`{sql_shapes.shortened(s.text)}` {round(s.exec_ms / calls * 1000)}, "
        f"{sql_shapes.not_submit(s.text)}: it ran {s.calls:,} "
        f"{'time' if s.calls == 1 else 'times'} in the round, {s.exec_ms / max(s.calls, 1):.1f} "
        "ms each on average"
        for s in apart
    )
    backlog = (
        ""
        if commits.in_flight is None
        else f", over the {commits.in_flight:,} intents in flight in the effectors' database at "
        "the round's end (every intent of the warm-up and of the rounds so far: the ingest-only "
        "effectors execute none, so none leaves PENDING)"
    )
    it, walks, them = ("it", "walks", "it") if len(apart) == 1 else ("they", "walk", "them")
    return (
        f"The other {commits.apart_us} µs per call were statements no Submit runs: {each}"
        f"{backlog}. What {it} {walks} is the benchmark's never-drained backlog, an artifact of "
        "the benchmark (in service the worker drains it): set apart from Submit's statements "
        f"here, while the PostgreSQL server's CPU figures include {them}."
    )


STATEMENTS_SHOWN = 4
"""The server's statements named per call, longest first."""


def wait_text(commits: GroupCommits, callers: int) -> str:
    """What the round says about where a call waits, as far as it was measured."""
    p50, commit_ms, twice = commits.p50_ms, commits.commit_ms, 2 * commits.commit_ms
    common = (
        f"{commits.calls_per_commit:.1f} calls shared each of its {commits.commits:,} group "
        f"commits on average"
    )
    if commits.whole:
        text = (
            f"In one more round of {commits.batch.calls:,} such calls at a copy of the effector "
            f"whose store times its write statements (`benchmarks/sqlite_statements.py`), "
            f"{common}; a commit's statements took {commit_ms:.2f} ms of wall time (the "
            f"writer's waits beyond its CPU included), "
            f"{commits.commit_s / commits.commits * 1000:.2f} of it the "
            f"COMMIT with its fsync, and the store's writer was inside them {commits.busy:.0%} "
            f"of the round. A call took p50 {p50:.1f} ms there; the commit in progress when it "
            f"arrived (part of it already run) and its own take at most about {twice:.1f} ms on "
            f"average, so at least about {max(round(p50, 1) - round(twice, 1), 0.0):.1f} ms of "
            "its p50 it waits outside the store's statements (gRPC, the handler on the event "
            "loop, the hand-offs to the writer and back: this round does not split it)."
        )
    else:
        text = (
            f"In one more round of {commits.batch.calls:,} such calls at the effectors, the "
            f"server's statements counted (`pg_stat_statements`), {common}; the server executed "
            f"a commit's statements in {commit_ms:.2f} ms on average and was executing "
            f"them {commits.busy:.0%} of the round (both replicas' connections summed"
            f"{'; the statements no Submit runs, below, left out' if commits.apart else ''}). A "
            f"call took p50 {p50:.1f} ms there, {twice / p50:.0%} of it the server's execution "
            "even counted twice (the commit in progress and its own); each commit's round "
            "trips and psycopg's work between them were not timed, so this round does not tell "
            "how much of the rest is the commit's client side and how much gRPC and the event "
            "loop."
        ) + statements_text(commits)
    return (
        text
        + " "
        + CONCLUSIONS[where(commits)].format(idle=f"{1 - commits.busy:.0%}", callers=callers)
    )


CONCLUSIONS = {
    Wait.STORE: "The commits ran nearly back to back: the store's group commit is on every "
    "call's critical path.",
    Wait.OUTSIDE: "The store had no commit running {idle} of the round although {callers} "
    "calls were outstanding, and a call's wait is mostly outside the commits.",
    Wait.BOTH: "Neither side dominates: both the store's commits and the path outside them "
    "take a large share of a call's wait.",
    Wait.UNRESOLVED: "The server was not executing the commits' statements {idle} of the round.",
}
