"""Whether the machine's CPU alone forbids a one-intent Submit row's target, and what could.

All in the split round (:mod:`benchmarks.submit_split`), the only round whose CPU is split: at
the row's ratio of the no-op's rate there, the CPU per call of everything on the machine (the
effectors, the store's server, the benchmark's client) needs ``total / budget`` cores. It is
judged against the cores the machine actually kept busy in that round (the higher of the two
sides'), not against all of its cores. Past that level, CPU alone forbids the target, and the
CPU per call must drop by at least ``total - reached x budget``. When the effectors' side kept
the machine at that level, the round was CPU-bound: a call waited for a core, and the parts this
run names are sized in CPU per call against that cut. Otherwise they are set against the wall
time a call must lose, which falls with a part's CPU only as far as a call waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.effector_findings import CORES
from benchmarks.group_commits import GroupCommits
from benchmarks.submit_split import SubmitSplit, deltas, name_deltas, other_parts


@dataclass(frozen=True)
class Need:
    """Everything's CPU per call in the split round (µs, as printed) against the target's rate
    there, and the cores each side kept busy (the client included, as printed)."""

    effectors: int
    server: int
    client: int
    rate: float
    """Calls/s the target needs in the split round (the ratio of the no-op's rate there)."""
    budget: float
    """µs a call may take at that rate (to 0.1 µs, as printed)."""
    busy: float
    """Cores the effectors' side kept busy in the split round (to 0.01, as printed)."""
    noop_busy: float
    """Cores the no-op side kept busy in its split round (to 0.01, as printed)."""
    wall: float = 0.0
    """µs a call took at the effectors in the split round (to 0.1 µs)."""

    @property
    def total(self) -> int:
        return self.effectors + self.server + self.client

    @property
    def reached(self) -> float:
        """The busy level the machine reached in the split round: the higher side's."""
        return max(self.busy, self.noop_busy)

    @property
    def needed(self) -> float:
        """Cores the machine would need at ``rate`` (to 0.01, as printed)."""
        return round(self.total / self.budget, 2)

    @property
    def forbids(self) -> bool:
        """Whether ``rate`` needs more cores than the machine kept busy."""
        return self.needed > self.reached

    @property
    def cut(self) -> float:
        """µs of CPU per call beyond what the reached cores give a call at ``rate``."""
        return round(self.total - self.reached * self.budget, 1)

    @property
    def wall_cut(self) -> float:
        """µs a call must lose in the split round (<= 0: none)."""
        return round(self.wall - self.budget, 1)

    @property
    def cpu_bound(self) -> bool:
        """Whether the effectors' side was at the reached level (within :data:`NEAR`)."""
        return self.busy >= self.reached * (1 - NEAR)

    @property
    def margin(self) -> float:
        """The share of the reached cores left over at ``rate``."""
        return (self.reached - self.needed) / self.reached


NEAR = 0.03
"""A side within this share of the reached cores busy is at that level: CPU-bound."""


@dataclass(frozen=True)
class Change:
    """A change this run names, and the most it can remove: the part of the CPU it cuts."""

    part: str
    bound: int
    what: str
    short: str
    """The change in a few words, once ``what`` has been said."""
    next: str = ""
    """The change to make to the part, or why none (``named`` says which)."""
    named: bool = True
    """Whether ``next`` names a change."""


def need(split: SubmitSplit, bound: float) -> Need:
    """The split round's CPU per call, rounded as :func:`benchmarks.submit_split.split_text`
    prints it, at ``bound`` times the no-op's rate in that round."""
    ours, noop = split.ours, split.noop
    used = ours.servers
    effectors = sum(
        round(ours.us(s)) for s in (used.main_thread_s, used.busiest_thread_s, used.other_threads_s)
    )
    rate = bound * 1e6 / noop.wall_us
    return Need(
        effectors,
        round(ours.us(ours.store_server_s)),
        round(ours.us(ours.client_s)),
        rate,
        round(1e6 / rate, 1),
        round(ours.cores_with_client, 2),
        round(noop.cores_with_client, 2),
        round(ours.wall_us, 1),
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
    found = [Change(f"the {loops}", loop, LOOP_WORK, LOOP_SHORT, LOOP_NEXT)]
    grown = dict(name_deltas(split))
    found += [
        Change(f"`{name}`", grown[name], what, STORE_SHORT[name], STORE_NEXT, named=False)
        for name, what in STORE_WORK.items()
        if name in grown
    ]
    if commits is not None and commits.statements:
        upsert = commits.statement_us(KEY_UPSERT)
        part = (
            f"the key rows' upsert, of the {commits.own_us} µs per call of Submit's own statements "
            "in the server"
        )
        found.append(Change(part, upsert, KEY_ROW, "the key-row count", KEY_ROW_NEXT))
    return sorted(found, key=lambda change: -change.bound)


def need_text(
    cpu: Need,
    bound: float,
    single: bool,
    parts: list[tuple[str, int]],
    apart: int = 0,
    *,
    queued: bool = False,
) -> str:
    """The necessary condition in the split round, judged against the cores reached there, and
    the CPU beyond the no-op's by part; ``apart``: the µs per call of the server's statements
    no Submit runs, which its CPU includes; ``queued``: whether the loop's run-queue wait was
    read (it is printed with the split)."""
    effectors = "the effector" if single else "the effectors"
    server = f", {cpu.server} in the PostgreSQL server" if cpu.server else ""
    extra = sum(us for _, us in parts)
    took = f": {cpu.wall_cut:.1f} µs too many" if cpu.wall_cut > 0 else ": within it"
    return (
        f"In the split round, the only one whose CPU is split, {bound:g}x the no-op "
        f"{NOOP_OWNERS[single]} rate is {cpu.rate:,.0f} calls/s ({cpu.budget:.1f} µs a "
        f"call), where a call took {cpu.wall:.1f}{took}. Judged against the {cpu.reached:.2f} "
        f"cores the machine kept busy in that round (the higher of the two sides', the client "
        f"included), not its {CORES}, CPU alone {'forbids' if cpu.forbids else 'does not forbid'}"
        f" the target there: the CPU per call of everything on the machine, {cpu.total} µs "
        f"({cpu.effectors} in {effectors}{server} and {cpu.client} in the client), needs "
        f"{cpu.needed:.2f} cores at that rate"
        + (
            f", so it must drop by at least {cpu.cut:.1f} µs per call ({cpu.total} less "
            f"{cpu.reached:.2f} x {cpu.budget:.1f}){_past(cpu)}"
            if cpu.forbids
            else _margin(cpu)
        )
        + ". "
        + bound_text(cpu, effectors, queued=queued)
        + _apart(cpu, apart)
        + f" Against the no-op {NOOP_OWNERS[single]} and the client's in their "
        + "round, it was "
        + f"{extra} µs per call more: "
        + ", ".join(f"{us:+d} {label}" for label, us in parts)
        + ". "
    )


def bound_text(cpu: Need, effectors: str, *, queued: bool = False) -> str:
    """Whether the effectors' side kept the machine at the reached level: CPU-bound or not.

    Judged on the cores busy alone: a call's time is always its CPU over the cores kept busy,
    so that identity is no evidence; the run-queue wait is, where it was read (``queued``)."""
    side = effectors.capitalize() + ("' side" if effectors.endswith("s") else "'s side")
    if not cpu.cpu_bound:
        return (
            f"{side} kept {cpu.busy:.2f} cores busy, below that level ({_short_of(cpu)}): the "
            "round was not CPU-bound"
            + (" as a whole (its event loop's wait for a core is given above)" if queued else "")
            + ", so a call's time falls with a part's CPU only as far as a "
            "call waits on that part."
        )
    return (
        f"{side} kept {cpu.busy:.2f} cores busy, at that level ({_short_of(cpu)}): CPU-bound "
        "by that measure alone ("
        + (
            "its event loop's wait for a core is given with the split above"
            if queued
            else "how long a call waited for a core was not read"
            + ("" if effectors == "the effector" else ": that is read with one effector only")
        )
        + "). A call's time is the CPU per call over the cores kept busy, so while they stay "
        f"that busy, cutting c µs of CPU per call shortens a call by about c / {cpu.busy:.2f}, "
        "not one for one."
    )


def _short_of(cpu: Need) -> str:
    """How far the effectors' side was from the no-op side's cores busy, against :data:`NEAR`."""
    if cpu.busy >= cpu.noop_busy:
        return (
            f"the higher side, so at it by definition: {cpu.busy / CORES:.0%} of the machine's "
            f"{CORES} cores; the no-op side {cpu.noop_busy:.2f}"
        )
    short = (cpu.noop_busy - cpu.busy) / cpu.noop_busy
    said = (
        f"{short:.1%} under the no-op side's {cpu.noop_busy:.2f}; within {NEAR:.0%} counts as at it"
    )
    if abs(short - NEAR) < NEAR / 3:
        said += ", so this is close to the line and the next round may fall on its other side"
    return said


def _past(cpu: Need) -> str:
    """How far past the reached level the need is, when under :data:`CLOSE` of it."""
    past = -cpu.margin
    return f", {past:.1%} past that level" if past < CLOSE else ""


def _margin(cpu: Need) -> str:
    """The cores left over, when they are under :data:`CLOSE` of the reached level."""
    if cpu.margin >= CLOSE:
        return ""
    return f", a {cpu.margin:.0%} margin" if cpu.margin >= 0.005 else ", a margin under 1%"


CLOSE = 0.1
"""A margin of cores under this share of the reached level is stated."""
NOOP_OWNERS = {True: "server's", False: "servers'"}
"""The no-op's side, possessive: one server, or several."""


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
    """Each named part's bound against ``cut``, the largest first."""
    listed = "; ".join(
        f"{change.what}, at most {change.bound} µs ({change.part})" for change in found
    )
    return (
        f"The parts of the work this run names, each an upper bound on what a change to it can "
        f"cut, against the {cut:.1f} µs {unit}: {listed}. "
    )


def next_text(found: list[Change], *, undecided: bool = False) -> str:
    """The change to each part, and the next one: the largest part with a change named, or,
    while where a call waits is ``undecided``, the one on the side the measurement finds."""
    if not any(change.named for change in found):
        return ""
    each = "; ".join(f"{change.short}, {change.next}" for change in found)
    text = f" By part, what to change: {each}. "
    if undecided:
        loop = [change.short for change in found if change.named and change.short == LOOP_SHORT]
        store = [change.short for change in found if change.named and change.short != LOOP_SHORT]
        return text + (
            "Which comes next follows from that measurement: if a call waits before the "
            f"hand-off or after the commit, {_to(loop)}; if it waits in the commit, "
            f"{_to(store)}."
        )
    first = next(change for change in found if change.named)
    return text + (
        f"The next change is to {first.short}, whose part's bound above is {first.bound} µs "
        "per call (the part's, not the change's)."
    )


def _to(shorts: list[str]) -> str:
    """The next change on one side of the hand-off, or that none is named there."""
    return f"the change to {shorts[0]}" if shorts else "no change this run names on that side"


def cpu_verdict(found: list[Change], cut: float) -> str:
    """Whether the parts' upper bounds reach the CPU cut: none is shown to, as no change's
    saving is measured in this run."""
    reach = [change for change in found if change.bound >= cut]
    if reach:
        each = "; ".join(
            f"{change.short}, at least {cut:.1f} of its {change.bound} µs per call "
            f"({cut / change.bound:.0%})"
            for change in reach
        )
        return (
            f"Upper bounds that reach the {cut:.1f} µs, and what a change must remove of each: "
            f"{each}. What a change saves is not measured in this run: no change this run "
            "identifies is shown to reach it."
        )
    together = sum(max(change.bound, 0) for change in found)
    return f"No part's upper bound reaches the {cut:.1f} µs alone (together at most {together}" + (
        "): no change this run identifies is shown to reach it."
        if together >= cut
        else "): no change this run identifies reaches the target."
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
LOOP_NEXT = (
    "validate at intake for the verdict only (without the null-pruning walk when `args_json` "
    "holds no `null`, and without building the keyword arguments) and await the commit's "
    "answer without `asyncio.shield`, the changes the profiled round on SQLite's row names for "
    "this code"
)
STORE_NEXT = (
    "none named by this run: a Submit commit runs two statements (one multi-row INSERT of the "
    "intents, one upsert of their key rows) between BEGIN and COMMIT, and the thread's Python "
    "is not profiled on this row"
)
KEY_ROW_NEXT = "stop counting pending intents on the key row (a store schema change)"
KEY_UPSERT = "INSERT INTO effector_keys"
KEY_ROW = (
    "not counting pending intents on the key row, which every Submit upserts (its statement's "
    "time, lock waits included)"
)
