"""Benchmark 6's "what is left" for PostgreSQL's sustained rate: CPU, and the statements.

The changes named for PostgreSQL are sized by the server's time by statement
(:mod:`benchmarks.pg_statements`), an upper bound whose waits this module sets apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks.effector_loop import PartShare, named_share

if TYPE_CHECKING:
    from benchmarks.effector_findings import IntentCost


def postgres_remaining(
    postgres: IntentCost | None, cores: int, target: int, loop: tuple[PartShare, ...] = ()
) -> str:
    """Where PostgreSQL's intents went in this run, and the changes aimed at its bound; ``loop``
    is the SQLite run's profile of its event loop, which sizes the loop changes here too."""
    if postgres is None or postgres.store_server is None or not postgres.effectors.cpu_s:
        return "PostgreSQL: this run did not measure its split by process, so it is not read here."
    effectors = postgres.effectors
    total, budget = sum(postgres.cpu_parts()), round(cores / target * 1e6)
    cores_busy = postgres.cpu_s / postgres.elapsed_s
    parts = postgres.cpu_parts()
    return (
        f"On PostgreSQL with two replicas the processes used {total} µs of CPU per intent "
        f"in this run, against the {budget} µs that {target:,}/s on {cores} cores "
        f"leaves for all of it, and kept {cores_busy:.2f} of {cores} cores busy over the runs "
        f"(at their {postgres.rate:,.0f} intents/s: their intents over their summed time, not "
        f"the median run's rate in the table): {cpu_verdict(total, budget)}. The PostgreSQL "
        f"server used {parts[0]} "
        f"µs of it, the two effectors {parts[1]} ({postgres.us(effectors.main_thread_s):.0f} on "
        f"their event loops) and the benchmark's client {parts[2]}. "
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
        + _postgres_next(postgres, total - budget, loop, target)
    )


def cpu_verdict(total: int, budget: int) -> str:
    """Whether CPU alone forbids the target: the necessary condition, not a sufficient one."""
    if total > budget:
        return (
            f"CPU alone forbids the target: it must drop by at least {total - budget} µs per "
            "intent (necessary, not sufficient)"
        )
    return "CPU alone does not forbid the target"


CLAIM_UPDATE = r"UPDATE effector_intents SET state = [?$], attempts = attempts \+"
"""The claim's UPDATE of the intent rows (either store's parameter marks)."""
RESULTS_UPDATE = r"WITH finished \(intent_id"
"""The UPDATE recording a group of results on the intent rows."""
ONE_ROW_FEWER = (
    "keep the running claim on the key row, so a claim writes no intent row (a store schema change)"
)
FEWER_ENTRIES = (
    "take the state out of the by-tool and by-state indexes, so recording a result moves "
    "fewer index entries"
)
POSTGRES_CHANGES = (
    (
        r"INSERT INTO effector_keys",
        "stop counting pending intents on the key row, which every Submit upserts and every "
        "result updates, so concurrent Submits and results of a key wait on one row",
    ),
    (CLAIM_UPDATE, ONE_ROW_FEWER),
    (RESULTS_UPDATE, FEWER_ENTRIES),
)
"""The statement each named change cuts (a pattern of its start) and the change."""


def _postgres_next(postgres: IntentCost, cut: int, loop: tuple[PartShare, ...], target: int) -> str:
    """The changes for PostgreSQL, ordered by the time of the statements they cut, and sized
    (with the loop changes, if ``loop`` sizes them) against the ``cut`` of CPU per intent (µs)
    the ``target`` needs, then the bottom line."""
    statements, intents = postgres.statement_times, postgres.intents
    if not statements:
        return (
            "Next for PostgreSQL (not ordered: the statements were not measured): "
            + "; ".join(change for _, change in POSTGRES_CHANGES)
            + ". "
            + bottom_line(cut, None, target)
        )
    read = {
        start: [s.exec_ms for s in statements if re.match(start, s.text)]
        for start, _ in POSTGRES_CHANGES
    }
    spent = {start: round(sum(times) * 1000 / intents) for start, times in read.items()}
    ordered = sorted(POSTGRES_CHANGES, key=lambda pair: -spent[pair[0]])
    together = sum(spent.values())
    text = (
        "Next for PostgreSQL, ordered by the time of the statement each cuts in this run (its "
        "whole time, waits included: an upper bound on what the change saves): "
        + "; ".join(
            f"{change} ({spent[start]} µs)"
            if read[start]
            else f"{change} (its statement is not among the longest read)"
            for start, change in ordered
        )
        + "."
    )
    if cut <= 0:
        return f"{text} {bottom_line(cut, None, target)}"
    text += (
        f" Together those statements took {together} µs per intent ({REMOVABLE}), against the "
        f"{cut} µs of CPU per intent the processes must lose to fit the budget above; a "
        "statement's time is "
        "wall time in the server, lock waits included, so the server's CPU a change saves is at "
        "most that time"
    )
    least = None
    waits = _server_waits(postgres)
    if waits is not None:
        statements_us, server_us = waits
        waited = statements_us - server_us
        least = max(together - waited, 0)
        text += (
            f". All statements together took {statements_us} µs of wall time per intent in the "
            f"server, more than its {server_us} µs of CPU, so at least {waited} µs of that was "
            "waiting (on locks, I/O or a core), in statements this run does not tell apart: "
            f"the named statements hold at most {together} µs of the server's CPU per intent and "
            "at least "
            + (
                f"{least} ({together} - {waited}: all of that waiting in them, if the server's "
                "CPU all went to its statements)"
                if least
                else "none (that waiting could be all of their time)"
            )
        )
    text += f"; removed entirely, against the {cut} µs: {_reach(least, together, cut)}. "
    sentence, loop_us = _loop_estimate(postgres, loop)
    if not loop_us:
        bounds = Bounds(_range(least, together, "{}"), together, sized=False)
        return f"{text}{sentence}. {bottom_line(cut, bounds, target)}"
    most = round(together + loop_us, 1)
    lowest = None if least is None else round(least + loop_us, 1)
    span = _range(lowest, most, "{:.1f}")
    return text + (
        f"{sentence}. With that estimate, the parts named here and for the loop could save "
        f"{span} µs of CPU per intent (upper bounds: removing each part entirely), against the "
        f"{cut} µs: {_reach(lowest, most, cut, ESTIMATED)}. "
        + bottom_line(cut, Bounds(span, most, sized=True), target)
    )


REMOVABLE = (
    "of them only the claim's UPDATE can go outright: recording a result still needs an UPDATE "
    "and a new key its row inserted, so those two can only shrink"
)
"""Which of the named statements a change can remove entirely."""


@dataclass(frozen=True)
class Bounds:
    """What the named changes could save at most, µs of CPU per intent, as printed."""

    span: str
    """As printed: at most M, or at most between L and M."""
    most: float
    sized: bool
    """Whether every named change is sized (the loop's by its estimate)."""


def _range(least: float | None, most: float, form: str) -> str:
    """At most between ``least`` and ``most``, or at most ``most`` if ``least`` is None."""
    if least is None:
        return f"at most {form.format(most)}"
    return f"at most between {form.format(least)} and {form.format(most)}"


def bottom_line(cut: int, bounds: Bounds | None, target: int) -> str:
    """The verdict for PostgreSQL: whether a named change is shown to reach ``target``/s, with
    ``cut`` the CPU per intent (µs) the budget needs and ``bounds`` the changes' sizing."""
    head = "Bottom line for PostgreSQL: "
    shown = f"no change this run identifies is shown to reach {target:,}/s."
    if cut <= 0:
        return (
            f"{head}CPU alone does not forbid the target, and this run sizes no change against "
            f"what else holds the rate: {shown}"
        )
    if bounds is None:
        return f"{head}the changes are not sized in this run: {shown}"
    if bounds.most < cut and bounds.sized:
        return (
            f"{head}even removed entirely, the named changes would save {bounds.span} µs of "
            f"CPU per intent, short of the {cut} µs the target needs: no change this run "
            f"identifies reaches {target:,}/s."
        )
    if bounds.most < cut:
        return (
            f"{head}the named statements would save {bounds.span} µs of CPU per intent even "
            f"removed entirely, short of the {cut} µs the target needs, and the loop changes "
            f"are not sized here: {shown}"
        )
    return (
        f"{head}what the named changes could save above are upper bounds (each part removed "
        f"entirely; what each saves is not measured), and the {cut} µs is necessary for the "
        f"target, not sufficient: {shown}"
    )


ESTIMATED = ", the loop's share by its estimate"
"""The caveat of a sizing that includes the loop's estimate."""


def _reach(least: float | None, most: float, cut: int, caveat: str = "") -> str:
    """Whether changes that would save between ``least`` (None: unknown) and ``most`` µs per
    intent, removed entirely, reach the ``cut`` (a necessary cut, not a sufficient one)."""
    if most < cut:
        return "even the most does not reach it"
    if least is None:
        return "the most reaches it, but how much of that time is CPU is not measured"
    if least >= cut:
        return (
            "even the lower reaches it, but only were each part removed entirely (which of the "
            f"statements only the claim's UPDATE can be){caveat}, and what each saves is not "
            "measured; reaching it is necessary for the target, not sufficient"
        )
    return "the cut lies inside that range, so this run cannot decide whether they reach it"


def _loop_estimate(postgres: IntentCost, shares: tuple[PartShare, ...]) -> tuple[str, float]:
    """The loop changes named for SQLite, sized for PostgreSQL's effectors by the SQLite run's
    profile shares (an estimate), as a sentence and µs per intent (0 if not sized)."""
    if not shares:
        return (
            "The event-loop changes named for SQLite (above) run in the same code here but are "
            "not sized for PostgreSQL: this run did not profile the loop",
            0.0,
        )
    loop_us = round(postgres.us(postgres.effectors.main_thread_s))
    share = named_share(shares)
    estimate = round(share * loop_us, 1)
    return (
        "The event-loop changes named for SQLite (above) run in the same code here: their parts' "
        f"share of the SQLite run's loop time in its profile, {share:.1%}, applied to the "
        f"PostgreSQL effectors' {loop_us} µs of event-loop CPU per intent measured here, sizes "
        f"them at ~{estimate:.1f} µs (an estimate: this run did not profile PostgreSQL's loop, "
        "whose work around the store differs)",
        estimate,
    )


def _server_waits(postgres: IntentCost) -> tuple[int, int] | None:
    """The statements' wall µs and the server's CPU µs per intent, if the first is larger."""
    server = postgres.store_server
    if server is None or not postgres.statements_total_ms:
        return None
    statements_us = round(postgres.us(postgres.statements_total_ms / 1000))
    server_us = round(postgres.us(server.cpu_s))
    return (statements_us, server_us) if statements_us > server_us else None
