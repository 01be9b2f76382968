"""Benchmark 6's "what is left" for the sustained rows: every figure from the run's numbers."""

from __future__ import annotations

import cProfile
import dataclasses
import pstats

import pytest

from benchmarks import effector_findings, effector_loop, effector_throughput
from benchmarks.effector_findings import IntentCost, remaining
from benchmarks.effector_loop import PartShare
from benchmarks.paired_rounds import Pairs, paired_figure
from benchmarks.pg_statements import StatementTime
from benchmarks.sqlite_statements import StatementCost, WriterSplit
from benchmarks.thread_overlap import Overlap
from benchmarks.usage import Usage

INTENTS = 60_000
CLAIM = "UPDATE effector_intents SET state = ?, attempts = attempts + 1, started_at_ms = ? WHERE x"
RESULTS = "WITH finished (intent_id, result, envelope) AS (VALUES (...)) UPDATE effector_intents"
FINISH = "UPDATE effector_intents SET state = ?, result = ?, completed_at_ms = ? WHERE y"


def _seconds(us: float, intents: int = INTENTS) -> float:
    return us * intents / 1e6


def _usage(main: float, busiest: float, other: float, name: str) -> Usage:
    """Per-intent µs by thread, as seconds over the runs' intents."""
    return Usage(
        _seconds(main),
        _seconds(busiest),
        _seconds(other),
        _seconds(30),
        2**30,
        2**29,
        INTENTS,
        ((name, _seconds(busiest)),),
    )


# 10,000 timed intents: the claim's UPDATE 5.7 µs of CPU (6.4 wall), the results' 13.1 (16.6).
WRITER = WriterSplit(
    "the writer's statements (timed)",
    Overlap(0.50, 0.56, 0.16, samples=2_275, interval_s=0.0012),
    (
        StatementCost(RESULTS, 80, _seconds(13.1, 10_000), _seconds(16.6, 10_000)),
        StatementCost(CLAIM, 80, _seconds(5.7, 10_000), _seconds(6.4, 10_000)),
        StatementCost(FINISH, 5, _seconds(3.0, 10_000), _seconds(3.5, 10_000)),
    ),
    10_000,
    132.0,
)
# 132 µs of wall time per intent; 56 + 65 + 18 in the effector, 11 in the client: 150.
SQLITE = IntentCost(
    "SQLite",
    INTENTS,
    _seconds(132),
    _usage(56, 65, 18, "sqlite"),
    _seconds(11),
    None,
    3_500,
    WRITER.text,
    writer=WRITER,
)
# 275 µs of CPU per intent (160 + 56 + 12 + 29 + 18) at 6,573 intents/s.
POSTGRES = IntentCost(
    "PostgreSQL, 2 replicas",
    INTENTS,
    INTENTS / 6_573,
    _usage(55.6, 12.4, 29.4, "pg"),
    _seconds(18),
    _usage(160, 0, 0, "postgres"),
    None,
    "the server's execution time by statement",
    (
        StatementTime("INSERT INTO effector_keys (entity_key) VALUES (...)", 40, 3_378.0, 1),
        StatementTime(RESULTS.replace("?", "$"), 40, 2_226.0, 1),
        StatementTime(CLAIM.replace("?", "$").replace("+ 1", "+ $"), 40, 2_034.0, 1),
        StatementTime(FINISH.replace("?", "$"), 40, 300.0, 1),
    ),
)


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(effector_findings, "CORES", 2)


def test_sqlite_sizes_the_named_changes_against_the_cut_the_target_needs() -> None:
    text = remaining(SQLITE, None)
    assert "used 150 µs of CPU per intent in this run" in text
    assert "within the 222 µs that 9,000/s on 2 cores leaves" in text
    # 9.0 s of CPU over 7.92 s: 1.14 cores, at 7,576 intents/s.
    assert "CPU alone does not forbid the target (they kept 1.14 of 2 cores busy on " in text
    assert "average, at the runs' 7,576 intents/s" in text
    assert "CPU is the bound" not in text
    assert "one GIL, the writer's fsynced commits" not in text
    assert "main thread used 56 (0.5x that) and its busiest other thread (the most CPU by " in text
    assert "`sqlite`), 65 (0.6x): neither alone uses it up" in text
    # The two statements the changes cut, and their sum against 132 - 111 = 21 µs.
    assert "the claim's UPDATE of the intent rows, 5.7 µs of CPU (6.4 wall) per intent" in text
    assert "the UPDATE recording the results, 13.1 µs of CPU (16.6 wall) per intent" in text
    assert "together at most 18.8 µs of the writer's CPU and 23.0 of its wall time" in text
    assert (
        "against the 21 µs of wall time per intent the table's sustained runs must lose (132 at"
        in text
    )
    assert "only their whole wall time, waits included, would cover it, not their CPU" in text
    assert "on PostgreSQL stop counting" not in text


def test_sqlite_bounds_the_wall_time_by_the_union_of_the_two_threads() -> None:
    text = remaining(SQLITE, None)
    assert (
        "used 121 µs of CPU per intent together in the table's sustained runs, against 132" in text
    )
    assert "that sum does not bound the wall time from below" in text
    assert "so their sum bounds the rate" not in text and "their Python holds one GIL" not in text
    # 50 + 56 - 16 = 90% of 132 µs: 119 running, 13 neither; 119 - 111 = 8, 132 - 111 = 21.
    assert "in 90% of the samples (50% and 56%, less the 16% both at once): about 119 µs" in text
    assert "of that run's 132 µs of wall time per intent, neither in the other 13." in text
    assert "In the sampled run above (the run that timed the statements, not one of the" in text
    assert (
        "so in the sampled run the time at least one of them runs must shrink by at least 8 µs"
        in text
    )
    assert "per intent, and by 21 if the 13 µs" in text
    # 8-9% more in flight, against the 19% that 9,000 needs over 7,576.
    assert "1,024 intents in flight instead of 256 gained 8%-9% (6,361-6,928 against" in text
    assert "short of the 19% more that 9,000/s needs over this run's 7,576 intents/s" in text
    assert "whatever the wait is" not in text
    assert "cut them by about a tenth and did not (recorded at 9774df3, above)" in text


def test_sqlite_branches_on_what_was_measured() -> None:
    unmeasured = dataclasses.replace(SQLITE, writer=None, statements="")
    text = remaining(unmeasured, None)
    assert "This run did not time the statements they cut." in text
    assert "This run did not sample how often they ran at once." in text
    # A union already within 111 µs: the time neither ran keeps the wall time above it.
    idle = dataclasses.replace(WRITER, overlap=Overlap(0.40, 0.45, 0.10, 1_000, 0.0012))
    text = remaining(dataclasses.replace(SQLITE, writer=idle), None)
    assert "in 75% of the samples" in text and "about 99 µs of that run's 132" in text
    assert "That is within the 111 µs an intent has at 9,000/s: the 33 µs per intent" in text
    # Statements far smaller than the cut: even removed they would not cover it.
    small = dataclasses.replace(WRITER, intents=100_000)
    text = remaining(dataclasses.replace(SQLITE, writer=small), None)
    assert "even removed entirely those statements would not cover it" in text


def test_postgres_sets_the_changes_upper_bounds_against_the_cpu_to_cut() -> None:
    text = remaining(None, POSTGRES)
    # The parts add up to the printed total: 160 + (56 + 12 + 29) + 18 = 275.
    assert "the processes used 275 µs of CPU per intent in this run" in text
    assert "The PostgreSQL server used 160 µs of it, the two effectors 97 (56 on" in text
    assert "and the benchmark's client 18." in text
    assert "kept 1.81 of 2 cores busy over the runs (at their 6,573 intents/s" in text
    # 275 - 222: the necessary cut, with no cores-busy threshold.
    assert "CPU alone forbids the target: it must drop by at least 53 µs per intent" in text
    assert "CPU is the bound" not in text
    assert "(56 µs); take the state out" in text and "(37 µs); keep the running claim" in text
    assert "schema change) (34 µs)." in text
    assert "Together those statements took 127 µs per intent (of them only the claim's " in text
    assert "recording a result still needs an UPDATE and a new key its row inserted, so " in text
    assert "those two can only shrink), against the 53 µs of CPU" in text
    # No wait measured: only the most is known; no profile: the loop is not sized here.
    assert "removed entirely, against the 53 µs: the most reaches it, but how much of" in text
    assert "run in the same code here but are not sized for PostgreSQL" in text
    assert "With that estimate" not in text
    assert text.endswith(
        "Bottom line for PostgreSQL: what the named changes could save above are upper bounds "
        "(each part removed entirely; what each saves is not measured), and the 53 µs is "
        "necessary for the target, not sufficient: no change this run identifies is shown to "
        "reach 9,000/s."
    )
    line = POSTGRES.line()
    assert "the effector processes used 97 µs of CPU, 56 on their main threads" in line
    assert "these processes used 275, 1.81 cores on average over the runs (6,573 intents/s" in line
    few = dataclasses.replace(
        POSTGRES, statement_times=tuple(s for s in POSTGRES.statement_times[1:])
    )
    text = remaining(None, few)
    assert "(its statement is not among the longest read)" in text
    assert "took 71 µs per intent" in text
    assert "even the most does not reach it" not in text
    fewer = dataclasses.replace(POSTGRES, statement_times=POSTGRES.statement_times[3:])
    assert "took 0 µs per intent" in (text := remaining(None, fewer))
    assert "removed entirely, against the 53 µs: even the most does not reach it." in text
    # The loop unsized: short by the statements alone, yet not shown out of reach.
    assert (
        "Bottom line for PostgreSQL: the named statements would save at most 0 µs of CPU " in text
    )
    assert "the loop changes are not sized here: no change this run identifies is shown" in text


def test_a_missed_sustained_ratio_row_gets_its_own_paragraph() -> None:
    name = f"{effector_throughput.RATIO_ROW}, PostgreSQL, 2 replicas"
    # Three runs at 0.598x, 0.76x and 0.87x the no-op rounds beside them.
    pairs = Pairs((6_000.0, 6_000.0, 6_000.0), (3_588.0, 4_560.0, 5_220.0))
    target = effector_throughput.REQUEST_RATE_TARGET
    straddling = paired_figure(name, "/s", pairs, 20_000, "no-op", target)
    text = effector_throughput.ratio_account([straddling])
    assert text.startswith(f"\n\n{name}: the sustained runs' intents/s were 0.598-0.87x the")
    assert "(median 0.76x: 4,560 against 6,000), which straddles the 0.6x target" in text
    below = paired_figure(name, "/s", Pairs((6_000.0,), (3_000.0,)), 20_000, "no-op", target)
    assert "below the 0.6x target in every run" in effector_throughput.ratio_account([below])
    met = paired_figure(name, "/s", Pairs((6_000.0,), (4_000.0,)), 20_000, "no-op", target)
    assert effector_throughput.ratio_account([met]) == ""


def _with_loop(writer: WriterSplit = WRITER) -> IntentCost:
    """SQLITE with the profile's loop shares and a timed COMMIT (9.2 µs of CPU, 19.0 wall)."""
    commit = StatementCost("COMMIT", 80, _seconds(9.2, 10_000), _seconds(19.0, 10_000))
    timed = dataclasses.replace(writer, costs=(*writer.costs, commit))
    shares = tuple(
        PartShare(part, share)
        for part, share in zip(
            (effector_loop.SUBMIT, effector_loop.WORKER, *effector_loop.PARTS),
            (0.20, 0.50, 0.10, 0.05, 0.05, 0.05),
            strict=True,
        )
    )
    return dataclasses.replace(SQLITE, writer=timed, loop=shares)


def test_sqlite_sizes_the_loop_by_the_profile_and_says_whether_the_bounds_reach_the_cut() -> None:
    text = remaining(_with_loop(), None)
    # Shares of the main thread's 56 µs: 20% is 11.2, 10% is 5.6; the four parts 25%, 14.0.
    assert "Where the event loop's 56 µs of CPU per intent went, by this run's profile" in text
    assert "a profile share, an estimate" in text
    assert "Submit (the handler, its validation included) 20% (~11.2 µs)" in text
    assert "(`prepare_call` from `execute`) 10% (~5.6 µs): keep the arguments" in text
    assert "together at most ~14.0 µs of the loop's CPU per intent" in text
    # Of the 13 µs when neither ran, 19.0 - 9.2 = 9.8 is the COMMIT's wait; 3.2 are left.
    assert "19.0 - 9.2 = 9.8 µs per intent (the fsync, while the writer sleeps)" in text
    assert "the other 3.2 µs are not attributed by this run" in text
    # Writer 23.0 + loop 14.0 = 37.0 against 8 (21 with the neither time): both reached.
    assert "add up to 37.0 µs, against the 8 µs the sampled run's running time must lose " in text
    assert "(119 - 111; 21 if the time when neither ran stays: 132 - 111, its wall time" in text
    # 8 of 37.0 is 22%, 21 of it 57%: the share the changes must remove, were all cut alike.
    assert (
        "they reach the first only if the changes remove 22% of their parts and the second" in text
    )
    assert "only if they remove 57% (that share of each, were all cut alike)" in text
    assert text.count("no change this run identifies is shown to reach 9,000/s") >= 1


def test_sqlite_bottom_line_branches() -> None:
    # The writer's statements over 100,000 intents: 2.3 µs of wall, + 14.0 = 16.3 < 21.
    small = dataclasses.replace(WRITER, intents=100_000)
    text = remaining(_with_loop(small), None)
    assert "add up to 16.3 µs, against the 8 µs" in text
    assert "not the second: unless the time when neither ran shrinks too, no change" in text
    # No loop split (no profile), and always one running: 0 + 2.3 < 132 - 111 = 21 µs.
    busy = dataclasses.replace(small, overlap=Overlap(0.60, 0.50, 0.10, 2_000, 0.0012))
    text = remaining(dataclasses.replace(_with_loop(busy), loop=()), None)
    assert "was not split by the profile in this run" in text
    assert "the loop's ~0.0 µs of CPU, add up to 2.3 µs, against the 21 µs" in text
    assert text.count("no change this run identifies reaches 9,000/s.") == 1
    assert "when neither ran, COMMIT" not in text
    # 95% running: 125 µs, neither 7, within the COMMIT's 9.8 µs wait.
    seven = dataclasses.replace(WRITER, overlap=Overlap(0.55, 0.50, 0.10, 2_000, 0.0012))
    assert (
        "9.8 µs per intent (the fsync, while the writer sleeps), is a measured candidate, if "
        in (text := remaining(_with_loop(seven), None))
    )
    assert "could cover all of it" in text


def test_postgres_sets_the_statements_waits_apart_from_their_bound() -> None:
    # 175 µs of statements against 160 of server CPU: at least 15 waited; 127 - 15 = 112 > 53.
    text = remaining(None, dataclasses.replace(POSTGRES, statements_total_ms=175 * 60.0))
    assert "All statements together took 175 µs of wall time per intent in the server, " in text
    assert (
        "more than its 160 µs of CPU, so at least 15 µs of that was waiting (on locks, I/O " in text
    )
    assert "or a core)" in text and "(on locks and I/O)" not in text
    assert "hold at most 127 µs of the server's CPU per intent and at least 112 (127 - 15:" in text
    assert "against the 53 µs: even the lower reaches it, but only were each part removed " in text
    assert "entirely (which of the statements only the claim's UPDATE can be), and what" in text
    assert "the loop's share by its estimate" not in text
    assert text.endswith("no change this run identifies is shown to reach 9,000/s.")
    # 250 µs: 90 waited, 127 - 90 = 37 < 53 <= 127: the run cannot decide.
    text = remaining(None, dataclasses.replace(POSTGRES, statements_total_ms=250 * 60.0))
    assert "at most 127 µs of the server's CPU per intent and at least 37 (127 - 90: all" in text
    assert "against the 53 µs: the cut lies inside that range, so this run cannot decide" in text
    assert "bound is" not in text and "not shown to reach" not in text
    # Within the budget: no cut, no sizing against it.
    cheap = dataclasses.replace(POSTGRES, store_server=_usage(80, 0, 0, "postgres"))
    text = remaining(None, cheap)
    assert "CPU alone does not forbid the target" in text and "Together those" not in text
    assert text.endswith(
        "Bottom line for PostgreSQL: CPU alone does not forbid the target, and this run sizes no "
        "change against what else holds the rate: no change this run identifies is shown to "
        "reach 9,000/s."
    )
    # The statements not read: the changes are listed, not sized.
    text = remaining(None, dataclasses.replace(POSTGRES, statement_times=()))
    assert "Next for PostgreSQL (not ordered: the statements were not measured): " in text
    assert text.endswith(
        "Bottom line for PostgreSQL: the changes are not sized in this run: no change this run "
        "identifies is shown to reach 9,000/s."
    )


def test_postgres_sizes_the_loop_changes_by_the_sqlite_profile_as_an_estimate() -> None:
    # The named parts are 25.0% of SQLite's loop; PostgreSQL's loops used 56 µs: ~14.0.
    sqlite = _with_loop()
    text = remaining(sqlite, dataclasses.replace(POSTGRES, statements_total_ms=250 * 60.0))
    assert (
        "their parts' share of the SQLite run's loop time in its profile, 25.0%, applied to "
        in text
    )
    assert (
        "the PostgreSQL effectors' 56 µs of event-loop CPU per intent measured here, sizes " in text
    )
    assert "them at ~14.0 µs (an estimate: this run did not profile PostgreSQL's loop" in text
    # 37 + 14.0 = 51.0 < 53 <= 127 + 14.0 = 141.0.
    assert (
        "the parts named here and for the loop could save at most between 51.0 and 141.0 " in text
    )
    assert (
        "µs of CPU per intent (upper bounds: removing each part entirely), against the 53 " in text
    )
    assert "µs: the cut lies inside" in text
    assert "Bottom line for PostgreSQL: what the named changes could save above are upper" in text
    assert text.count("cut lies inside that range, so this run cannot decide") == 2
    # 240 µs: 80 waited, 47 alone short of 53, 47 + 14.0 = 61.0 reaches it.
    text = remaining(sqlite, dataclasses.replace(POSTGRES, statements_total_ms=240 * 60.0))
    assert "between 61.0 and 141.0 µs of CPU per intent (upper bounds: removing each part " in text
    assert "entirely), against the 53 µs: even the lower reaches it, but only were" in text
    assert "UPDATE can be), the loop's share by its estimate, and what each saves is not" in text
    assert text.endswith("no change this run identifies is shown to reach 9,000/s.")
    # No wait measured: at most 141.0; no statement named: at most 14.0, short of 53.
    assert "could save at most 141.0 µs of CPU per intent (upper bounds" in remaining(
        sqlite, POSTGRES
    )
    fewer = dataclasses.replace(POSTGRES, statement_times=POSTGRES.statement_times[3:])
    text = remaining(sqlite, fewer)
    assert "could save at most 14.0 µs of CPU per intent (upper bounds: removing each part " in text
    assert "entirely), against the 53 µs: even the most does not reach it." in text
    # Every change sized and all short of the CPU the target needs: out of reach.
    assert text.endswith(
        "Bottom line for PostgreSQL: even removed entirely, the named changes would save at most "
        "14.0 µs of CPU per intent, short of the 53 µs the target needs: no change this run "
        "identifies reaches 9,000/s."
    )


def test_printed_sums_are_sums_of_printed_parts() -> None:
    shares = tuple(
        PartShare(part, share)
        for part, share in zip(effector_loop.PARTS, (0.0321, 0.0321, 0.0321, 0.0), strict=True)
    )
    text, bound = effector_loop.loop_next(shares, 70)
    # 0.0321 x 70 = 2.247 -> 2.2 each: 6.6 printed, where the unrounded 6.741 would print 6.7.
    assert text.count("(~2.2 µs)") == 3 and bound == 6.6
    assert "together at most ~6.6 µs of the loop's CPU per intent" in text


def test_the_kernel_time_is_the_effectors_whole_and_the_floor_says_it_ran_once() -> None:
    line = SQLITE.line()
    assert "and 18 on the rest; of the effectors' 139 µs, 30 were in the kernel" in line
    assert "18 on the rest, 30 of it in the kernel" not in line
    label = effector_throughput.once_label("bare SQLite insert+commit", 3)
    assert label == "bare SQLite insert+commit; measured once, against our 3 runs"
    assert effector_throughput.once_label("bare", 1) == "bare; measured once, against our 1 run"


def test_sqlite_over_the_cpu_budget_names_the_necessary_cut() -> None:
    # 56 + 65 + 118 + 11 = 250 µs of CPU per intent against 222.
    heavy = dataclasses.replace(SQLITE, effectors=_usage(56, 65, 118, "sqlite"))
    text = remaining(heavy, None)
    assert "more than the 222 µs that 9,000/s on 2 cores leaves for all of it: CPU alone " in text
    assert "forbids the target: it must drop by at least 28 µs per intent (necessary" in text


def test_loop_shares_read_parts_by_caller_from_a_profile() -> None:
    stats = pstats.Stats(cProfile.Profile().runctx("pass", {}, {}))
    runner, worker = "/x/effector/runner.py", "/x/effector/worker.py"
    # prepare_call: 0.3 s from execute, 0.5 s from rejection_reason (Submit's check).
    stats.stats = {  # type: ignore[attr-defined]
        (runner, 40, "prepare_call"): (
            2,
            2,
            0.1,
            0.8,
            {
                (runner, 130, "execute"): (1, 1, 0.0, 0.3),
                (runner, 71, "rejection_reason"): (1, 1, 0.0, 0.5),
            },
        ),
        (worker, 227, "_execute"): (3, 3, 0.1, 2.0, {}),
        (worker, 220, "_start"): (1, 1, 0.1, 0.4, {}),
    }
    shares = {share.part.name: share.share for share in effector_loop.loop_shares(stats, 4.0)}
    assert shares[effector_loop.PARTS[0].name] == pytest.approx(0.075)
    assert shares[effector_loop.WORKER.name] == pytest.approx(0.5)
    assert shares[effector_loop.PARTS[3].name] == pytest.approx(0.1)
    assert shares[effector_loop.SUBMIT.name] == 0.0
    line = effector_loop.shares_line(effector_loop.loop_shares(stats, 4.0))
    assert "the worker's path (`_execute`) 50%" in line


def test_postgres_waits_larger_than_the_named_statements_leave_no_bound() -> None:
    # 300 µs of statements against 160 of CPU: 140 waited, more than the named 127.
    text = remaining(None, dataclasses.replace(POSTGRES, statements_total_ms=300 * 60.0))
    assert "hold at most 127 µs of the server's CPU per intent and at least none (that" in text
    assert "the cut lies inside that range, so this run cannot decide" in text
    assert "-13" not in text
