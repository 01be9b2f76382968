"""Whether the machine's CPU alone forbids a one-intent Submit row's target, and what could.

A necessary condition, measured: at the rate the target needs in the worst paired round, the CPU
per call of everything on the machine in the split round (:mod:`benchmarks.submit_split`: the
effectors, the store's server, the benchmark's client) needs ``total / budget`` cores. Past the
machine's cores, CPU alone forbids the target, and the CPU per call must drop by at least the
excess (necessary, not sufficient). Either way the changes this run names are each bounded by
the part of the CPU beyond the no-op's they cut, and set against what a call must lose.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.effector_findings import CORES
from benchmarks.group_commits import GroupCommits
from benchmarks.submit_split import SubmitSplit, deltas, name_deltas, other_parts


@dataclass(frozen=True)
class Need:
    """Everything's CPU per call in the split round (µs, as printed) against the target's rate."""

    effectors: int
    server: int
    client: int
    rate: float
    """Calls/s the target needs in the worst round."""
    budget: float
    """µs a call may take at that rate (to 0.1 µs, as printed)."""

    @property
    def total(self) -> int:
        return self.effectors + self.server + self.client

    @property
    def needed(self) -> float:
        """Cores the machine would need at ``rate``."""
        return self.total / self.budget

    @property
    def cut(self) -> float:
        """µs of CPU per call beyond what the cores give a call at ``rate`` (<= 0: none)."""
        return round(self.total - CORES * self.budget, 1)

    @property
    def margin(self) -> float:
        """The share of the cores left over at ``rate``, from ``needed`` as printed."""
        return (CORES - round(self.needed, 2)) / CORES


@dataclass(frozen=True)
class Change:
    """A change this run names, and the most it can remove: the part of the CPU it cuts."""

    part: str
    bound: int
    what: str
    short: str
    """The change in a few words, once ``what`` has been said."""


def need(split: SubmitSplit, rate: float, budget: float) -> Need:
    """The split round's CPU per call, rounded as :func:`benchmarks.submit_split.split_text`
    prints it, at the worst round's target ``rate``."""
    ours = split.ours
    used = ours.servers
    effectors = sum(
        round(ours.us(s)) for s in (used.main_thread_s, used.busiest_thread_s, used.other_threads_s)
    )
    return Need(
        effectors, round(ours.us(ours.store_server_s)), round(ours.us(ours.client_s)), rate, budget
    )


def extra_parts(split: SubmitSplit) -> list[tuple[str, int]]:
    """The CPU per call beyond the no-op's, like with like, as printed: the event loops, the
    other threads by name and their rest, the store's server, the client."""
    loop, top, rest, _ = deltas(split)
    ours, noop = split.ours, split.noop
    loops = "event loop" if split.replicas == 1 else "event loops"
    parts = [(f"on the {loops}", loop)]
    named = other_parts(split, top + rest)
    parts += [
        ("on the rest of the threads" if label == "the rest" else f"on {label}", us)
        for label, us in named
    ]
    if not named and top + rest:
        parts.append(("on the other threads", top + rest))
    if ours.store_server_s:
        parts.append(("in the PostgreSQL server", round(ours.us(ours.store_server_s))))
    parts.append(("in the client", round(ours.us(ours.client_s)) - round(noop.us(noop.client_s))))
    return parts


def changes(split: SubmitSplit, commits: GroupCommits | None) -> list[Change]:
    """The changes this run names, the largest bound first."""
    loop = deltas(split)[0]
    loops = "event loop" if split.replicas == 1 else "event loops"
    found = [Change(f"the {loops}", loop, LOOP_WORK, LOOP_SHORT)]
    grown = dict(name_deltas(split))
    found += [
        Change(f"`{name}`", grown[name], what, STORE_SHORT[name])
        for name, what in STORE_WORK.items()
        if name in grown
    ]
    if commits is not None and commits.statements:
        upsert = commits.statement_us(KEY_UPSERT)
        part = (
            f"the key rows' upsert, of the {commits.own_us} µs per call of Submit's own statements "
            "in the server"
        )
        found.append(Change(part, upsert, KEY_ROW, "the key-row count"))
    return sorted(found, key=lambda change: -change.bound)


def need_text(cpu: Need, single: bool, parts: list[tuple[str, int]], apart: int = 0) -> str:
    """The necessary condition, and the CPU beyond the no-op's by part; ``apart``: the µs per
    call of the server's statements no Submit runs, which its CPU includes."""
    effectors = "the effector" if single else "the effectors"
    server = f", {cpu.server} in the PostgreSQL server" if cpu.server else ""
    forbids = cpu.cut > 0
    extra = sum(us for _, us in parts)
    return (
        f"CPU alone {'forbids' if forbids else 'does not forbid'} the target: at "
        f"{cpu.rate:,.0f} calls/s ({cpu.budget:.1f} µs a call), the CPU per call of everything "
        f"on the machine in the split round, {cpu.total} µs ({cpu.effectors} in {effectors}"
        f"{server} and {cpu.client} in the client), needs {cpu.needed:.2f} of {CORES} cores"
        + (
            f", so it must drop by at least {cpu.cut:.1f} µs per call ({cpu.total} less {CORES} x "
            f"{cpu.budget:.1f}; necessary, not sufficient, with a call's CPU as measured in the "
            "split round)"
            if forbids
            else _margin(cpu)
        )
        + "."
        + _apart(cpu, apart)
        + f" Against the no-op {NOOP_OWNERS[single]} and the client's in their "
        + "round, it was "
        + f"{extra} µs per call more: "
        + ", ".join(f"{us:+d} {label}" for label, us in parts)
        + ". "
    )


def _margin(cpu: Need) -> str:
    """The cores left over, when they are under :data:`CLOSE` of the machine's."""
    if cpu.margin >= CLOSE:
        return ""
    return f", a {cpu.margin:.0%} margin" if cpu.margin >= 0.005 else ", a margin under 1%"


CLOSE = 0.1
NOOP_OWNERS = {True: "server's", False: "servers'"}
"""The no-op's side, possessive: one server, or several."""
"""A margin of cores under this share of the machine's is stated."""


def _apart(cpu: Need, apart: int) -> str:
    """That the server's CPU includes statements no Submit runs, bounded by their time."""
    if not (apart and cpu.server):
        return ""
    said = (
        f" The PostgreSQL server's {cpu.server} µs include the statements no Submit runs "
        "(above), counted here as the benchmark ran them: "
    )
    if apart < cpu.server:
        return said + (
            f"at most {apart} of them, by their time in the statements round (wall time in the "
            "server, an upper bound on their CPU)."
        )
    return said + (
        f"their time in the statements round, {apart} µs per call (wall time in the server, in "
        "another round), is not below the server's CPU here, so this run does not bound their "
        "share of it."
    )


def bounds_text(found: list[Change], cut: float, unit: str) -> str:
    """Each named change's bound against ``cut``, the largest first."""
    listed = "; ".join(
        f"{change.what}, at most {change.bound} µs ({change.part})" for change in found
    )
    return (
        f"The changes this run names, each at most the part it cuts, against the {cut:.1f} µs "
        f"{unit}: {listed}. "
    )


LOOP_WORK = (
    "Submit's work on the event loop that the no-op's handler does not do (the checks: "
    "`identity_problem`, and `intake_rejection`, which looks the tool up, parses `args_json` and "
    "validates the arguments; the hand-off to the group commit: a future, the flusher task, "
    "`run_in_executor` to the store's thread and the answers split back; the acknowledgement: "
    "each ack filled from the store's answer, the metrics' counters, waking the worker)"
)
LOOP_SHORT = "Submit's work on the loop"
STORE_SHORT = {"pg": "the `pg` threads' work per commit", "sqlite": "the writer's work per commit"}
STORE_WORK = {
    "pg": "the `pg` threads' work per commit (the intents' serialization and digest and the rows' "
    "parameters in `store/_intake.py`, and psycopg's work per statement and commit)",
    "sqlite": "the writer's work per commit (the intents' serialization and digest and the rows' "
    "parameters in `store/_intake.py`, SQLite's statements and COMMIT)",
}
"""What the store's threads do per Submit, by thread name (the digest runs there, not on the
loop)."""
KEY_UPSERT = "INSERT INTO effector_keys"
KEY_ROW = (
    "not counting pending intents on the key row, which every Submit upserts (its statement's "
    "time, lock waits included)"
)
