"""Benchmark 6's profile: every thread of one SQLite effector through a sustained run.

:func:`profile` runs when benchmark 6 misses a target (:mod:`benchmarks.run_all`); the findings
name the store's transactions and the event loop's Submit and worker paths.
"""

from __future__ import annotations

import asyncio
import pstats
import tempfile
from pathlib import Path

from benchmarks.effector_load import CONCURRENCY, FULL, QUICK, servers, sustained
from benchmarks.effector_loop import PartShare, loop_shares, shares_line
from benchmarks.harness import (
    EFFECTOR_READY,
    Hotspot,
    cumulative,
    effector_command,
    findings,
    idle_seconds,
    summarize_profile,
    total_seconds,
)
from benchmarks.report import ProfileOutput

WRITER_THREAD = "effector-sqlite_"
"""The name of the SQLite store's writer thread, less its number."""
_SQLITE_EXECUTE = "<method 'execute' of 'sqlite3.Connection' objects>"
_TRANSACTION = ("effector/store/sqlite.py", "_in_transaction")
STORE_HOTSPOTS = (
    Hotspot(
        *_TRANSACTION,
        "Every write to the store; all run one at a time on this one thread (reads run on "
        "a read-only connection on a thread of their own).",
        "",
    ),
    Hotspot(
        "effector/store/_execution.py",
        "record_completions",
        "Recording results (a group commit of every result waiting): the key rows locked in key "
        "order, then set-based UPDATEs releasing them, recording the results (conditional, so "
        "the first result wins a race) and counting them down, then one log insert.",
        "",
    ),
    Hotspot(
        "effector/store/_execution.py",
        "claim_work",
        "Claiming, mostly in the transaction that recorded results (for the slots they "
        "freed): picking idle keys with work, then set-based UPDATEs marking their head "
        "intents RUNNING and the keys claimed.",
        "",
    ),
    Hotspot(
        "effector/store/_intake.py",
        "submit",
        "Recording Submits (a group commit of every Submit waiting): multi-row INSERTs of the "
        "intents, then one upsert of their key rows.",
        "",
    ),
)
LOOP_HOTSPOTS = (
    Hotspot(
        "effector/service.py",
        "Submit",
        "The Submit handler on the event loop, validation included.",
        "",
    ),
    Hotspot(
        "beam_agents/tools/_tool.py",
        "validate_arguments",
        "Validating an intent's arguments with its tool's Pydantic model: twice per intent, "
        "at Submit and again before execution (outside the profiler 2.2 µs a call for the "
        "`noop` tool, a side measurement recorded at 6fe19ef: the profiler inflates it).",
        "",
    ),
    Hotspot(
        "effector/worker.py",
        "_execute",
        "The worker's path per intent: run the tool (a sync one on a pooled thread), queue the "
        "result for the group commit, which claims the next work.",
        "",
    ),
)
PROFILE_MIN_BUSY_SHARE = 0.1
"""Threads busy for less than this share of the run are left out of the profile."""


def profile(quick: bool) -> ProfileOutput:
    """Profile every thread of one SQLite effector through a sustained run."""
    return profile_with_shares(quick)[0]


def profile_with_shares(quick: bool) -> tuple[ProfileOutput, tuple[PartShare, ...]]:
    """The profile, and the event loop's parts as shares of its busy time (none if idle)."""
    count, batch, _ = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        command = effector_command(
            f"sqlite:///{scratch / 'effector.db'}",
            concurrency=CONCURRENCY,
            profile_dir=scratch / "profiles",
        )
        with servers([command], EFFECTOR_READY, scratch) as targets:
            run = asyncio.run(sustained(targets, count, batch))
        threads = {
            path.stem: pstats.Stats(str(path)) for path in (scratch / "profiles").glob("*.prof")
        }
    output = ProfileOutput(
        findings=[
            f"Profiled: one SQLite effector through one sustained run of {count:,} intents "
            f"({run.elapsed_s:.2f} s), every thread; shares are of each thread's busy time (its "
            "profiled time less its waits for work)."
        ],
        raw=[],
    )
    quiet = 0
    shares: tuple[PartShare, ...] = ()
    for name, stats in sorted(threads.items()):
        busy_s = total_seconds(stats) - idle_seconds(stats)
        if busy_s < PROFILE_MIN_BUSY_SHARE * run.elapsed_s:
            quiet += 1
            continue
        heading = f"thread {name}: busy {busy_s:.2f} s, {busy_s / run.elapsed_s:.0%} of the run"
        output.findings.append(f"{heading}.")
        if name.startswith(WRITER_THREAD):
            output.findings.extend(_store_findings(stats, busy_s, count))
        elif name == "MainThread":
            output.findings.extend(
                findings(stats, LOOP_HOTSPOTS, busy_s=busy_s, unit="intent", units=count)
            )
            shares = loop_shares(stats, busy_s)
            output.findings.append(shares_line(shares))
        output.raw.extend(["", f"{heading}:", *summarize_profile(stats, top=8)])
    output.raw.append(
        f"({quiet} more threads were busy less than {PROFILE_MIN_BUSY_SHARE:.0%} of the run.)"
    )
    return output, shares


def _store_findings(stats: pstats.Stats, busy_s: float, intents: int) -> list[str]:
    _, statements = cumulative(stats, "~", _SQLITE_EXECUTE)
    transactions_s, _ = cumulative(stats, *_TRANSACTION)
    # In whole percent as printed, so that the rest is the printed total less the printed parts.
    named = sum(
        round(100 * cumulative(stats, spot.path, spot.function)[0] / busy_s)
        for spot in STORE_HOTSPOTS[1:]
    )
    return [
        f"`sqlite3.Connection.execute` was called {statements:,} times, "
        f"{statements / intents:.2f} per intent.",
        *findings(stats, STORE_HOTSPOTS, busy_s=busy_s, unit="intent", units=intents),
        f"The rest of `_in_transaction`, {round(100 * transactions_s / busy_s) - named}%: BEGIN "
        "and COMMIT (each COMMIT an fsync, with `synchronous=FULL`) and the housekeeping "
        "transactions.",
    ]
