"""Benchmark 6's findings: where an intent's cost went in the run, and how it got there.

:class:`IntentCost` turns what the processes used over the sustained runs (``/proc``, see
:mod:`benchmarks.usage`) into a line per store and the "what is left" text; the two texts at
the end tell what earlier changes did, from the profiles that led to them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks.pg_statements import StatementTime
from benchmarks.usage import Usage, kernel_known, resolution

TARGET_PER_S = 9_000
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class IntentCost:
    """What one store's sustained runs used (summed over the runs), and their intents."""

    label: str
    intents: int
    elapsed_s: float
    """The runs' wall time, summed."""
    effectors: Usage
    client_cpu_s: float
    """The benchmark process: the submitters and the reader."""
    store_server: Usage | None
    """The PostgreSQL server's processes; ``None`` for SQLite (it runs in the effector)."""
    floor_written: float | None
    """Bytes per intent the bare insert-and-commit floor passed to write calls, where measured
    (not on PostgreSQL: the floor's server process ends before it can be sampled)."""
    statements: str = ""
    """The store server's time by statement over the runs, as a clause (PostgreSQL only)."""
    statement_times: tuple[StatementTime, ...] = ()
    """The same, as figures: the statements that took longest."""
    both_running: float | None = None
    """How often the event loop and the store's writer ran at once (SQLite), where sampled."""

    def us(self, seconds: float) -> float:
        """``seconds`` per intent, in microseconds."""
        return seconds / self.intents * 1e6

    def kib(self, count: float) -> float:
        """``count`` bytes per intent, in KiB."""
        return count / self.intents / 1024

    @property
    def written(self) -> int:
        """Bytes passed to write calls by the effectors and the store's server."""
        server = self.store_server
        return self.effectors.written + (server.written if server else 0)

    @property
    def cpu_s(self) -> float:
        """Every measured process's CPU: the effectors, the store's server, the client."""
        server = self.store_server
        return self.effectors.cpu_s + (server.cpu_s if server else 0.0) + self.client_cpu_s

    def line(self) -> str:
        """Where an intent's CPU and bytes went, per intent."""
        used, server = self.effectors, self.store_server
        disk = used.disk_written + (server.disk_written if server else 0)
        calls = used.write_calls + (server.write_calls if server else 0)
        text = (
            f"{self.label}: where an intent's cost went over the sustained runs (per intent, "
            f"{self.intents:,} intents; {resolution()}): the effector processes used "
            f"{self.us(used.cpu_s):.0f} µs of CPU, {self.us(used.main_thread_s):.0f} on their "
            f"main threads (the event loop: gRPC, Submit, the worker), "
            f"{self.us(used.busiest_thread_s):.0f} on the busiest other thread of each"
            + top_name(used)
            + f" and {self.us(used.other_threads_s):.0f} on the rest"
            + (
                f", {self.us(used.system_s):.0f} of it in the kernel"
                if kernel_known(used.system_s)
                else ""
            )
        )
        if server is not None:
            text += f"; the PostgreSQL server used {self.us(server.cpu_s):.0f} µs"
        floor = (
            "not measured for the floor"
            if self.floor_written is None
            else f"the bare insert-and-commit floor {self.floor_written / 1024:.1f} KiB"
        )
        return text + (
            f"; the benchmark's client {self.us(self.client_cpu_s):.0f} µs. At "
            f"{TARGET_PER_S:,} intents/s the machine's {CORES} cores leave "
            f"{CORES / TARGET_PER_S * 1e6:.0f} µs of CPU per intent for all of it; these "
            f"processes used {self.us(self.cpu_s):.0f}, {self.cpu_s / self.elapsed_s:.2f} cores "
            f"on average over the runs. The effectors{' and the server' if server else ''} "
            f"passed {self.kib(self.written):.1f} KiB per intent to write calls "
            f"({self.kib(disk):.1f} KiB reached the disk, in {calls / self.intents:.1f} calls); "
            f"{floor}."
        )


def top_name(used: Usage) -> str:
    """The thread name with the most CPU besides the main threads', as a clause, if named."""
    if not used.by_name or used.by_name[0][0] == "python":
        return ""
    return f" (the most CPU by thread name: `{used.by_name[0][0]}`)"


def remaining(sqlite: IntentCost | None, postgres: IntentCost | None) -> str:
    """The "what is left" text, with this run's split for SQLite, then for PostgreSQL."""
    return f"{_sqlite_remaining(sqlite)}\n\n{_postgres_remaining(postgres)}"


def _postgres_remaining(postgres: IntentCost | None) -> str:
    """Where PostgreSQL's intents went in this run, and the change aimed at its bound."""
    if postgres is None or postgres.store_server is None or not postgres.effectors.cpu_s:
        return "PostgreSQL: this run did not measure its split by process, so it is not read here."
    server, effectors = postgres.store_server, postgres.effectors
    total, budget = postgres.us(postgres.cpu_s), CORES / TARGET_PER_S * 1e6
    cores_busy = postgres.cpu_s / postgres.elapsed_s
    bound = (
        "CPU is the bound, and cutting it is the way to the target"
        if cores_busy >= 0.8 * CORES
        else "the processes also wait on each other, so cutting CPU alone may not be enough"
    )
    return (
        f"On PostgreSQL with two replicas the processes used {total:.0f} µs of CPU per intent "
        f"in this run, against the {budget:.0f} µs that {TARGET_PER_S:,}/s on {CORES} cores "
        f"leaves for all of it, and kept {cores_busy:.2f} of {CORES} cores busy: {bound}. The "
        f"PostgreSQL server used {postgres.us(server.cpu_s):.0f} µs of it, the two effectors "
        f"{postgres.us(effectors.cpu_s):.0f} ({postgres.us(effectors.main_thread_s):.0f} on "
        f"their event loops) and the benchmark's client {postgres.us(postgres.client_cpu_s):.0f}. "
        "(The throwaway cluster runs with fsync off: these are CPU figures, not the disk's.) "
        + (
            f"Where the server's time went, {postgres.statements}. "
            if postgres.statements
            else "The server's time was not split by statement in this run. "
        )
        + "An intent row is inserted, then updated at its claim and at its result, and "
        "neither update can be heap-only, because the state it changes is in the keys or the "
        "conditions of the intents' indexes (the schema), so each makes a new row version "
        "with new entries in every index whose condition the row meets. "
        + _postgres_next(postgres.statement_times, postgres.intents)
    )


POSTGRES_CHANGES = (
    (
        "INSERT INTO effector_keys",
        "stop counting pending intents on the key row, which every Submit upserts and every "
        "result updates, so concurrent Submits and results of a key wait on one row",
    ),
    (
        "UPDATE effector_intents SET state",
        "keep the running claim on the key row, so a claim writes no intent row (a store "
        "schema change)",
    ),
    (
        "WITH finished (intent_id",
        "take the state out of the by-tool and by-state indexes, so recording a result moves "
        "fewer index entries",
    ),
)
"""The statement each named change cuts (by its start) and the change."""


def _postgres_next(statements: tuple[StatementTime, ...], intents: int) -> str:
    """The changes for PostgreSQL, ordered by the time of the statements they cut."""
    if not statements:
        return (
            "Next for PostgreSQL (not ordered: the statements were not measured): "
            + "; ".join(change for _, change in POSTGRES_CHANGES)
            + "."
        )
    spent = {
        start: sum(s.exec_ms for s in statements if s.text.startswith(start)) * 1000 / intents
        for start, _ in POSTGRES_CHANGES
    }
    ordered = sorted(POSTGRES_CHANGES, key=lambda pair: -spent[pair[0]])
    return (
        "Next for PostgreSQL, ordered by the time of the statement each cuts in this run (its "
        "whole time, waits included: an upper bound on what the change saves): "
        + "; ".join(f"{change} ({spent[start]:.0f} µs)" for start, change in ordered)
        + "."
    )


def _sqlite_remaining(sqlite: IntentCost | None) -> str:
    """The SQLite part of the "what is left" text, with this run's split."""
    return f"""\
{_split(sqlite)}{_writer_split(sqlite)} The writer's share is split by transaction in the profile
below (this run's code, under the profiler); what it does per intent follows from the schema: each
intent row is written three times (at Submit, at its claim, at its result), each state change moves
its entries in the by-state and by-tool indexes, and the key-ordered indexes (the primary key, the
by-key and the queue index) take a leaf page per intent because a batch's keys are spread over them.
Earlier side measurements, not of this run, sized those parts: recorded at cdcec1b (schema 6; the
store's transactions alone, 3 x 20,000 intents in batches of 500, results in groups of 128) the
fsynced COMMITs wrote 2.7 WAL pages per intent (one at Submit, 1.7 at its result and the claim after
it); when the sustained rate was about 3,300/s (recorded at 2caff7c), dropping the by-key, by-state,
by-tool and completed indexes (which the console's queries need) reached 3,600-4,100 intents/s,
10-25% of the rate, each of the first three costing 4-6 KiB written and 15-35 µs of the writer's CPU
per intent; recorded at 9774df3, moving SQLite's checkpoints onto a thread of their own cut the
store's transactions alone by about a tenth but did not move the sustained rate measurably, and a
GIL switch interval of 0.2 ms instead of 5 did not shorten the writer's waits inside its
transactions. The event loop's share is spread over gRPC, Submit's validation and digest, and the
worker's path per intent (a task, the timeout, the pooled-thread hop of the sync `noop` tool,
validating the arguments again to build the call). Next, for the writer (none measured yet): write
each intent row twice instead of three times (keep the running claim and its attempt on the key row,
which already holds the claim's token and intent id: a store schema change, which cuts the claim's
UPDATE of the intent rows), take the state out of the by-tool and by-state indexes (which cuts what
the UPDATE recording each result moves), and on PostgreSQL stop counting pending intents on the key
row that Submits and results both lock. Validating the arguments again before execution is not worth
a cache: outside the profiler, `prepare_call` for the `noop` tool (the tool's lookup, the JSON parse
and `validate_arguments`, which alone took 2.2 µs) took 3.7 µs (a side measurement recorded at
6fe19ef, timeit). {_outlook(sqlite)}"""


def _writer_split(sqlite: IntentCost | None) -> str:
    """Where the SQLite writer's time went, statement by statement, if this run timed it."""
    if sqlite is None or not sqlite.statements:
        return ""
    return f" Where the writer's time went, {sqlite.statements}."


TAKING_TURNS = (
    "Side measurements recorded at 6fe19ef (one SQLite effector, sustained runs of 20,000 "
    "intents, alternating): a GIL switch interval of 0.5 ms instead of 5 did not move the rate "
    "(5,524-6,054 against 5,543-6,131 intents/s), so handing the GIL over sooner does not help, "
    "and 1,024 intents in flight instead of 256 gained about 8% (6,361-6,928 against "
    "5,872-6,335), so more work in flight does not either. What the writer's statements wait "
    "on beyond their CPU (above) is not attributed by this run, so a writer in a process of its "
    "own (its Python under a GIL of its own) is a candidate, not a measured fix; the store "
    "changes above cut the writer's share whatever the wait is."
)
"""What the taking-turns account measured besides the run (GIL interval, work in flight)."""


TURNS_BELOW = 0.3
"""Below this share of samples with both threads running, they are said to take turns."""


def _outlook(sqlite: IntentCost | None) -> str:
    """Whether the two busy threads overlap or take turns, by this run's per-thread figures."""
    if sqlite is None or not sqlite.effectors.cpu_s:
        return ""
    used = sqlite.effectors
    main, writer = sqlite.us(used.main_thread_s), sqlite.us(used.busiest_thread_s)
    wall = sqlite.elapsed_s / sqlite.intents * 1e6
    allowed = 1e6 / TARGET_PER_S
    sampled = sqlite.both_running
    if (main + writer >= 0.8 * wall) if sampled is None else sampled < TURNS_BELOW:
        seen = (
            ""
            if sampled is None
            else f", and the samples above found both running at once only {sampled:.0%} of "
            "the time"
        )
        return (
            f"The main thread and the writer used {main + writer:.0f} µs of CPU per intent "
            f"together, against {wall:.0f} µs of wall time per intent{seen}: they take turns "
            "more than they overlap (their Python holds one GIL, and the event loop waits on "
            "the writer's commits), so their sum bounds the rate, and "
            f"{TARGET_PER_S:,}/s needs it near {allowed:.0f} µs. " + TAKING_TURNS
        )
    return (
        f"The main thread and the writer used {main + writer:.0f} µs of CPU per intent together, "
        f"against {wall:.0f} µs of wall time per intent: they overlap, so the busier of them "
        f"({max(main, writer):.0f} µs, against {allowed:.0f} at {TARGET_PER_S:,}/s) and the "
        "writer's waits on its fsyncs bound the rate: the changes above cut the writer's share."
    )


def _split(sqlite: IntentCost | None) -> str:
    """What this run's SQLite split says about the bound, in its own numbers."""
    if sqlite is None or not sqlite.effectors.cpu_s:
        return "This run could not read `/proc`, so the split by thread is not measured here."
    used = sqlite.effectors
    budget = CORES / TARGET_PER_S * 1e6
    allowed = 1e6 / TARGET_PER_S  # one thread's CPU per intent at the target rate
    main, writer = sqlite.us(used.main_thread_s), sqlite.us(used.busiest_thread_s)
    total = sqlite.us(sqlite.cpu_s)
    cores_busy = sqlite.cpu_s / sqlite.elapsed_s
    budget_said = (
        f"more than the {budget:.0f} µs that {TARGET_PER_S:,}/s on {CORES} cores leaves for "
        f"all of it (CPU alone caps the rate at {CORES / total * 1e6:,.0f}/s)"
        if total > budget
        else f"within the {budget:.0f} µs that {TARGET_PER_S:,}/s on {CORES} cores leaves for "
        "all of it"
    )
    verdict = (
        f"{budget_said}, and they kept {cores_busy:.2f} of {CORES} cores busy: CPU is the bound"
        if cores_busy >= 0.8 * CORES
        else f"{budget_said}; yet they kept only {cores_busy:.2f} of {CORES} cores busy on "
        "average, so the effector's busy threads wait on each other (one GIL, the writer's "
        "fsynced commits) and its serial path, not the machine's CPU, sets the rate"
    )
    floor = (
        ""
        if sqlite.floor_written is None
        else f" (the bare floor: {sqlite.floor_written / 1024:.1f} KiB)"
    )
    return (
        f"On SQLite the effector and its client used {total:.0f} µs of CPU per intent in this "
        f"run (the details split it by thread, from `/proc`), {verdict}. One thread can give an "
        f"intent at most {allowed:.0f} µs at {TARGET_PER_S:,}/s: the effector's main thread used "
        f"{main:.0f} ({main / allowed:.1f}x that) and its busiest other thread{top_name(used)}, "
        f"{writer:.0f} ({writer / allowed:.1f}x), and their Python shares one "
        f"GIL. The effector passed {sqlite.kib(sqlite.written):.1f} KiB per intent to write "
        f"calls, WAL frames and checkpoints{floor}."
    )


PLANS_AND_QUEUE = """\
Two changes from measuring the store's statements one by one (issue 23, second pass; side
measurements recorded at cdcec1b, not of this run). (1) A claim marks the intents it takes
RUNNING with one UPDATE over their ids; with 128 ids or more
SQLite's planner preferred walking the by-state index through every queued intent (`EXPLAIN
QUERY PLAN`: a search of `effector_intents_by_state`), so a claim's cost grew with the backlog:
105 µs a row with 60,000 intents queued, against 10 µs once the state is checked on the row the
id finds (`+state`); a plan test now holds every UPDATE of the worker's path to the primary key.
(2) Schema 6 keys each key's queue index on TOOL intents without a result instead of on their
state (the same rows): SQLite rewrites a partial index's entry whenever a column its condition
reads changes, so every claim rewrote it; the claim's UPDATE went from 16.0 to 7.6 µs a row (7.5
with the index dropped altogether). Together, in the store's transactions alone (thread CPU,
three runs alternating with the revision before), an intent's store work went from 156-168 to
113-125 µs, record-and-claim's share from 106-116 to 73-83 µs."""


WHAT_REMAINS = """\
What was changed, from profiles of the effector's threads (cProfile, every thread; the store
thread was busy all the time while the event loop idled): each Submit used to be its own fsynced
transaction, so concurrent one-intent Submits queued for the disk. Submits now group-commit:
those that arrive while a transaction runs share the next one, answering as if recorded one
after another. The effector's RPCs no longer pass through a server interceptor on every call
(the tolerant request parsers are installed once, at registration). A sampling profile (py-spy)
of a sustained run then showed the store thread spending most of its time in claims, in the
query that finds each claimed key's next intent: it numbered every queued intent of those keys
with a window function, reading each row and its blob, to keep the first per key. It now probes
the queue index once per key (a correlated subquery on SQLite, a LATERAL join on PostgreSQL),
over an order of magnitude faster with many intents queued per key, which lifted the sustained
rate on both stores. The same profile showed `Read` long-polls queued behind the writes on that
thread; SQLite reads now run on a read-only connection on a thread of their own (in WAL mode
they see the last commit without waiting for the writer), which keeps reads answering while a
write is in progress but did not move the sustained rate measurably in alternating runs
(recorded at 637ae6c). What
remains: per intent, a Submit checks the id, validates the arguments against the tool's Pydantic
model, digests and stores the intent and upserts its key's row, which the no-op floor does not;
so with 500 intents per call the store's own insert rate bounds the call rate (even the bare
insert-and-commit floor reaches only the fraction of the no-op rate shown above). With one
intent per call on SQLite, every caller waits for the fsync of the group commit its intent
joined, and the 64 callers wait rather than send more: the `synchronous=NORMAL` row is the same
effector without that wait (what it changes in this run is in "what is left"). On PostgreSQL
with one intent per call, two replicas, the PostgreSQL server and the client share the machine's
cores, and each group commit is four round trips through psycopg (BEGIN, the intents' INSERT ...
RETURNING, the key rows' upsert, COMMIT) whose Python work holds the GIL the gRPC handlers need."""

EXECUTION_PATH = """\
The execution path (issue 23; side measurements recorded at 58e1e8d, not of this run), from
cProfile of every thread of one SQLite effector through a sustained run of 20,000 intents, the
effector's CPU time (rusage), and runs alternating the
previous revision with this one on the same machine. Before, the store's one writer thread was
busy nearly all the run, in 519 write transactions per 20,000 intents: for every step of every
key a claim transaction and a result transaction (245 and 242, of ~82 intents each), besides 20
Submit groups; their BEGIN and COMMIT alone took 4.4 s of its 11.1 s. Each sync tool call woke
the event loop on its own (20,474 self-pipe writes from the tool threads), and each claim drew a
`uuid4` (a system call per intent). Changed: (1) the commit that records a group of results also
claims work for the slots they free (`record_and_claim`), so the claim loop no longer runs after
every result, only when Submits or a key given back wake it; a key's next intent still starts
only after the commit that made the result before it durable and published, and the released
keys queue behind keys that waited longer. On SQLite it is the same transaction; on PostgreSQL a
second one right after, because in one the key rows stayed locked through the claim while
Submits to the same keys waited for them (alternating runs: 2,300-2,800 intents/s in one
transaction, 3,000-4,800 in two). (2) Results and claims are written with set-based statements
(`UPDATE ... FROM` a `VALUES` list) after locking the key rows in key order, not one statement
step per row. (3) Sync tools' results reach the loop through one inbox per loop, one wake-up per
batch (663 self-pipe writes in all instead of 20,474). (4) Claim tokens are a random per-process
prefix and a counter. After: 196 write transactions per 20,000 intents on SQLite (157
record-and-claim transactions of ~128 intents, 22 Submit groups); in alternating runs the
effector's CPU per two runs of 20,000 fell from 13.2-13.4 s to 10.8-11.7 s and the sustained
rate rose from 2,400-2,650 to 2,800-3,400 intents/s on SQLite, and from 1,850-2,770 to
3,000-4,800 on PostgreSQL, with the machine shared with other runs (load average 4 to 10). Where
the rest went then, short of 9,000/s (measured at the time, not in this run): the effector spent
~270 µs of CPU per intent (both threads, kernel included), 2.4x the 111 µs that 9,000/s leaves
on one core, and its Python ran under one GIL. Under the profiler the event loop spent 185 µs
per intent in the worker's path (validating the arguments again, the pooled-thread hop of the
sync `noop` tool, its timeout, a task per intent) and 79 µs in Submit; the writer, per
record-and-claim transaction of ~128 intents, 9.4 ms in the UPDATE recording the results and 9.5
ms in the one marking the next intents RUNNING (an intent row is rewritten, blobs and all, at
its claim and at its result, and each state change moves its entries in the indexes that carry
the state), and 27 ms in BEGIN and COMMIT on the shared disk. On PostgreSQL the two replicas,
the server and the client shared the machine's cores, and Submits and results lock the same key
rows (their pending counts). The next change named then: write each intent row twice instead of
three times (keep the running claim and its attempt on the key row, which already holds the
claim's token and intent id), take the state out of the by-tool and by-state indexes' leading
columns, validate arguments once at Submit and keep the validated form, and on PostgreSQL stop
counting pending intents on the key row that Submits and results both lock."""
