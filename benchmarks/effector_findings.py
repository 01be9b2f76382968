"""Benchmark 6's findings: where an intent's cost went in the run, and how it got there.

:class:`IntentCost` turns what the processes used over the sustained runs (``/proc``, see
:mod:`benchmarks.usage`) into a line per store and the "what is left" text; the two texts at
the end tell what earlier changes did, from the profiles that led to them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks.effector_history import SQLITE_SCHEMA, VALIDATION_TIMED
from benchmarks.effector_loop import PartShare, loop_next
from benchmarks.effector_postgres import (
    CLAIM_UPDATE,
    RESULTS_UPDATE,
    cpu_verdict,
    postgres_remaining,
)
from benchmarks.pg_statements import StatementTime
from benchmarks.sqlite_statements import WriterSplit
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
    writer: WriterSplit | None = None
    """The SQLite writer's timed statements and its overlap with the event loop, if measured."""
    statements_total_ms: float = 0.0
    """Every statement's execution time in the store's server, summed (PostgreSQL only)."""
    loop: tuple[PartShare, ...] = ()
    """The event loop's parts as shares of its busy time, from the profile, if it ran."""

    @property
    def rate(self) -> float:
        """The runs' intents over their summed time (not the median run's rate)."""
        return self.intents / self.elapsed_s

    @property
    def wall_us(self) -> float:
        """Wall time per intent over the runs together, in µs."""
        return 1e6 / self.rate

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

    def thread_parts(self) -> tuple[int, int, int]:
        """The effectors' µs of CPU per intent, rounded: main threads, busiest others, rest."""
        used = self.effectors
        return (
            round(self.us(used.main_thread_s)),
            round(self.us(used.busiest_thread_s)),
            round(self.us(used.other_threads_s)),
        )

    def cpu_parts(self) -> tuple[int, int, int]:
        """µs of CPU per intent as printed: the store's server (0 if none), the effectors (the
        sum of :meth:`thread_parts`), the client; their sum is the printed total."""
        server = self.store_server
        return (
            round(self.us(server.cpu_s)) if server else 0,
            sum(self.thread_parts()),
            round(self.us(self.client_cpu_s)),
        )

    def line(self) -> str:
        """Where an intent's CPU and bytes went, per intent."""
        used, server = self.effectors, self.store_server
        disk = used.disk_written + (server.disk_written if server else 0)
        calls = used.write_calls + (server.write_calls if server else 0)
        main, busiest, rest = self.thread_parts()
        server_us, effectors_us, client_us = self.cpu_parts()
        text = (
            f"{self.label}: where an intent's cost went over the sustained runs (per intent, "
            f"{self.intents:,} intents; {resolution()}): the effector processes used "
            f"{effectors_us} µs of CPU, {main} on their main threads (the event loop: gRPC, "
            f"Submit, the worker), {busiest} on the busiest other thread of each"
            + top_name(used)
            + f" and {rest} on the rest"
            + (
                f"; of the effectors' {effectors_us} µs, {self.us(used.system_s):.0f} were in "
                "the kernel (every thread's)"
                if kernel_known(used.system_s)
                else ""
            )
        )
        if server is not None:
            text += f"; the PostgreSQL server used {server_us} µs"
        floor = (
            "not measured for the floor"
            if self.floor_written is None
            else f"the bare insert-and-commit floor {self.floor_written / 1024:.1f} KiB"
        )
        return text + (
            f"; the benchmark's client {client_us} µs. At "
            f"{TARGET_PER_S:,} intents/s the machine's {CORES} cores leave "
            f"{CORES / TARGET_PER_S * 1e6:.0f} µs of CPU per intent for all of it; these "
            f"processes used {sum(self.cpu_parts())}, {self.cpu_s / self.elapsed_s:.2f} cores "
            f"on average over the runs ({self.rate:,.0f} intents/s, their intents over their "
            "summed time, where the table shows the median run). The effectors"
            f"{' and the server' if server else ''} "
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
    shares = sqlite.loop if sqlite is not None else ()
    return (
        f"{_sqlite_remaining(sqlite)}\n\n"
        f"{postgres_remaining(postgres, CORES, TARGET_PER_S, shares)}"
    )


def _sqlite_remaining(sqlite: IntentCost | None) -> str:
    """The SQLite part of the "what is left" text, with this run's split."""
    measured = sqlite is not None and bool(sqlite.effectors.cpu_s)
    main_us = sqlite.thread_parts()[0] if sqlite and measured else 0
    loop, loop_bound = loop_next(sqlite.loop if sqlite and measured else (), main_us)
    return (
        f"{_split(sqlite)}{_writer_split(sqlite)} {SQLITE_SCHEMA} {loop}{VALIDATION_TIMED} "
        f"{_writer_next(sqlite)} {_outlook(sqlite, loop_bound)}"
    )


def _writer_split(sqlite: IntentCost | None) -> str:
    """Where the SQLite writer's time went, statement by statement, if this run timed it."""
    if sqlite is None or not sqlite.statements:
        return ""
    return f" Where the writer's time went, {sqlite.statements}."


SQLITE_CHANGES = (
    (
        CLAIM_UPDATE,
        "write each intent row twice instead of three times (keep the running claim and its "
        "attempt on the key row, which already holds the claim's token and intent id: a store "
        "schema change, which removes the claim's UPDATE of the intent rows)",
        "the claim's UPDATE of the intent rows",
    ),
    (
        RESULTS_UPDATE,
        "take the state out of the by-tool and by-state indexes (which cuts the index entries "
        "the UPDATE recording the results moves)",
        "the UPDATE recording the results",
    ),
)
"""Each named change for the SQLite writer: the statement it cuts, the change, that statement."""


def _writer_sizes(writer: WriterSplit) -> list[tuple[float, ...]]:
    """CPU and wall µs per intent, rounded as printed, of each statement a change cuts."""
    return [
        tuple(round(us, 1) for us in writer.per_intent(pattern)) for pattern, _, _ in SQLITE_CHANGES
    ]


def _writer_next(sqlite: IntentCost | None) -> str:
    """The writer's named changes, each sized by its statement's time in the timed run."""
    text = "Next, for the writer (none measured yet): " + "; ".join(
        change for _, change, _ in SQLITE_CHANGES
    )
    writer = None if sqlite is None else sqlite.writer
    if sqlite is None or writer is None or not writer.costs:
        return text + ". This run did not time the statements they cut."
    sizes = _writer_sizes(writer)
    cpu, wall = (round(sum(size[index] for size in sizes), 1) for index in (0, 1))
    text += (
        ". Sized by the timed statements above (a statement's whole time bounds what a change "
        "to it can save): "
        + "; ".join(
            f"{name}, {size[0]:.1f} µs of CPU ({size[1]:.1f} wall) per intent"
            for (_, _, name), size in zip(SQLITE_CHANGES, sizes, strict=True)
        )
        + f"; together at most {cpu:.1f} µs of the writer's CPU and {wall:.1f} of its wall "
        "time per intent"
    )
    took, allowed = round(sqlite.wall_us), round(1e6 / TARGET_PER_S)
    if took <= allowed:
        return text + f", while the sustained runs took {took} µs of wall time per intent."
    cut = took - allowed
    verdict = (
        "even removed entirely those statements would not cover it"
        if wall < cut
        else "only their whole wall time, waits included, would cover it, not their CPU"
        if cpu < cut
        else "their upper bounds cover it; how much of each statement its change removes is "
        "not measured"
    )
    return text + (
        f", against the {cut} µs of wall time per intent the table's sustained runs must lose "
        f"({took} at their {sqlite.rate:,.0f} intents/s, {allowed} at {TARGET_PER_S:,}/s): "
        f"{verdict}; "
        "and the writer's time comes off the wall time only where the event loop is not running "
        "meanwhile (below)."
    )


IN_FLIGHT = ((6_361, 6_928), (5_872, 6_335))
"""Sustained intents/s (lowest, highest) with 1,024 and with 256 intents in flight, recorded at
6fe19ef."""


def _side_measurements(sqlite: IntentCost) -> str:
    """What the account measured besides the run (GIL interval, work in flight, checkpoints)."""
    (more_low, more_high), (low, high) = IN_FLIGHT
    needed = TARGET_PER_S / round(sqlite.rate) - 1
    gain = f"{more_low / low - 1:.0%}-{more_high / high - 1:.0%}"
    return (
        "Side measurements recorded at 6fe19ef (one SQLite effector, sustained runs of 20,000 "
        "intents, alternating): a GIL switch interval of 0.5 ms instead of 5 did not move the "
        "rate (5,524-6,054 against 5,543-6,131 intents/s), so handing the GIL over sooner does "
        f"not help, and 1,024 intents in flight instead of 256 gained {gain} ({more_low:,}-"
        f"{more_high:,} against {low:,}-{high:,})"
        + (
            f", short of the {needed:.0%} more that {TARGET_PER_S:,}/s needs over this run's "
            f"{round(sqlite.rate):,} intents/s, so more work in flight does not reach it either"
            if needed > 0
            else ""
        )
        + ". What the writer's statements wait on beyond their CPU (above) is not attributed by "
        "this run, so a writer in a process of its own (its Python under a GIL of its own) is "
        "a candidate, not a measured fix. The store changes above cut the writer's own work, "
        "but a cut in the store's transactions alone need not move the rate: moving the "
        "checkpoints onto a thread of their own cut them by about a tenth and did not (recorded "
        "at 9774df3, above)."
    )


def _outlook(sqlite: IntentCost | None, loop_bound: float) -> str:
    """How the two busy threads' running time adds up, by this run's samples of them, and
    whether the named changes' upper bounds reach the cut that 9,000/s needs."""
    if sqlite is None or not sqlite.effectors.cpu_s:
        return ""
    main, writer, _ = sqlite.thread_parts()
    took, allowed = round(sqlite.wall_us), round(1e6 / TARGET_PER_S)
    text = (
        f"The main thread and the writer used {main + writer} µs of CPU per intent together "
        f"in the table's sustained runs, against {took} µs of wall time per intent; as they can "
        "run at "
        "once, that sum does not bound the wall time from below: the time at least one of them "
        "runs does. "
    )
    timed = sqlite.writer
    overlap = None if timed is None else timed.overlap
    if timed is None or overlap is None or timed.sampled_wall_us is None:
        return (
            text
            + "This run did not sample how often they ran at once. "
            + (_side_measurements(sqlite))
        )
    first, second, both, either = overlap.shares()
    sampled = round(timed.sampled_wall_us)
    running = round(either / 100 * sampled)
    neither = sampled - running
    text += (
        f"In the sampled run above (the run that timed the statements, not one of the table's), "
        "at least one of them was running (or ready to run) in "
        f"{either}% of the samples ({first}% and {second}%, less the {both}% both at once): "
        f"about {running} µs of that run's {sampled} µs of wall time per intent, neither in the "
        f"other {neither}. "
    )
    if sampled <= allowed:
        return text + _side_measurements(sqlite)
    text += _neither(timed, neither)
    if running <= allowed:
        return text + (
            f"That is within the {allowed} µs an intent has at {TARGET_PER_S:,}/s: the {neither} "
            "µs per intent when neither ran keeps the wall time above it. "
            + _side_measurements(sqlite)
        )
    text += (
        f"At {TARGET_PER_S:,}/s an intent has {allowed} µs, so in the sampled run the time at "
        f"least one of them runs must shrink by at least {running - allowed} µs per intent, and by "
        f"{sampled - allowed} if the {neither} µs when neither ran stays. "
    )
    return (
        text
        + _side_measurements(sqlite)
        + " "
        + _bottom_line(_writer_bound(timed), loop_bound, (running, sampled, allowed))
    )


def _writer_bound(writer: WriterSplit) -> float:
    """The writer's named changes' upper bound: their statements' wall µs per intent."""
    return round(sum(size[1] for size in _writer_sizes(writer)), 1) if writer.costs else 0.0


def _neither(writer: WriterSplit, neither: int) -> str:
    """What the time when neither thread ran may be: COMMIT's wait beyond its CPU (the fsync)."""
    if neither <= 0 or not writer.costs:
        return ""
    cpu, wall = (round(us, 1) for us in writer.per_intent(r"COMMIT$"))
    wait = round(wall - cpu, 1)
    if wait <= 0:
        return f"What happened in the {neither} µs when neither ran is not attributed by this run. "
    rest = (
        "it could cover all of it"
        if wait >= neither
        else f"the other {neither - wait:.1f} µs are not attributed by this run"
    )
    return (
        f"Of the {neither} µs when neither ran, COMMIT's wall time beyond its CPU in the timed "
        f"run, {wall:.1f} - {cpu:.1f} = {wait:.1f} µs per intent (the fsync, while the writer "
        f"sleeps), is a measured candidate, if the loop idled meanwhile; {rest}. "
    )


def _bottom_line(writer: float, loop: float, sampled: tuple[int, int, int]) -> str:
    """Whether the named changes' upper bounds together reach the cut of the running time;
    ``sampled`` is the sampled run's µs per intent with a thread running, in all, and allowed."""
    running, wall, allowed = sampled
    cut, cut_all = running - allowed, wall - allowed
    together = round(writer + loop, 1)
    text = (
        f"Bottom line for SQLite: the named changes' upper bounds, the writer's {writer:.1f} µs "
        f"of wall time per intent and the loop's ~{loop:.1f} µs of CPU, add up to {together:.1f} "
        f"µs, against the {cut} µs the sampled run's running time must lose ({running} - "
        f"{allowed}; {cut_all} if the time when neither ran stays: {wall} - {allowed}, its wall "
        "time per intent): "
    )
    if together < cut:
        return text + f"no change this run identifies reaches {TARGET_PER_S:,}/s."
    first = f"they reach the first only if the changes remove {cut / together:.0%} of their parts"
    if together < cut_all:
        return text + (
            f"{first} (that share of each, were all cut alike), and not the second: unless the "
            "time when neither ran shrinks too, no change this run identifies is shown to reach "
            f"{TARGET_PER_S:,}/s."
        )
    return text + (
        f"{first} and the second only if they remove {cut_all / together:.0%} (that share of "
        "each, were all cut alike); what each saves is not measured, so no change this run "
        f"identifies is shown to reach {TARGET_PER_S:,}/s."
    )


def _split(sqlite: IntentCost | None) -> str:
    """What this run's SQLite split says about the bound, in its own numbers."""
    if sqlite is None or not sqlite.effectors.cpu_s:
        return "This run could not read `/proc`, so the split by thread is not measured here."
    used = sqlite.effectors
    budget = round(CORES / TARGET_PER_S * 1e6)
    allowed = 1e6 / TARGET_PER_S  # one thread's CPU per intent at the target rate
    main, writer, _ = sqlite.thread_parts()
    total = sum(sqlite.cpu_parts())
    cores_busy = sqlite.cpu_s / sqlite.elapsed_s
    side = "more than" if total > budget else "within"
    verdict = (
        f"{side} the {budget} µs that {TARGET_PER_S:,}/s on {CORES} cores leaves for all of it: "
        f"{cpu_verdict(total, budget)} (they kept {cores_busy:.2f} of {CORES} cores busy on "
        f"average, at the runs' {sqlite.rate:,.0f} intents/s: their intents over their summed "
        "time)"
    )
    floor = (
        ""
        if sqlite.floor_written is None
        else f" (the bare floor: {sqlite.floor_written / 1024:.1f} KiB)"
    )
    return (
        f"On SQLite the effector and its client used {total} µs of CPU per intent in this "
        f"run (the details split it by thread, from `/proc`), {verdict}. One thread can give an "
        f"intent at most {allowed:.0f} µs at {TARGET_PER_S:,}/s: the effector's main thread used "
        f"{main} ({main / allowed:.1f}x that) and its busiest other thread{top_name(used)}, "
        f"{writer} ({writer / allowed:.1f}x)"
        + (
            ": neither alone uses it up (how their running time adds up is below)"
            if max(main, writer) < allowed
            else ""
        )
        + f". The effector passed {sqlite.kib(sqlite.written):.1f} KiB per intent to write "
        f"calls, WAL frames and checkpoints{floor}."
    )
