"""Benchmark 6's profile findings and history: figures at their precision, no stale claims."""

from __future__ import annotations

import cProfile
import pstats

from benchmarks import effector_history, effector_profile


def test_the_writers_statement_count_keeps_its_precision_and_claims_no_gil_handover() -> None:
    stats = pstats.Stats(cProfile.Profile().runctx("pass", {}, {}))
    execute = "<method 'execute' of 'sqlite3.Connection' objects>"
    stats.stats = {("~", 0, execute): (2_998, 2_998, 0.5, 0.5, {})}  # type: ignore[attr-defined]
    lines = effector_profile._store_findings(stats, 1.0, 20_000)
    assert lines[0] == "`sqlite3.Connection.execute` was called 2,998 times, 0.15 per intent."
    assert not any("GIL" in line for line in lines)


def test_the_details_carry_no_unmeasured_claims_as_this_runs() -> None:
    texts = [spot.what for spot in effector_profile.LOOP_HOTSPOTS]
    texts.append(effector_history.WHAT_REMAINS)
    for stale in (
        "every caller waits for the fsync",
        "holds the GIL the gRPC handlers need",
        "waiting for the store thread",
        "win it back",
    ):
        assert not any(stale in " ".join(text.split()) for text in texts), stale
    history = " ".join(effector_history.WHAT_REMAINS.split())
    assert history.startswith("History (recorded at ca7b2eb and c6ad08d, not of this run)")
    assert "idled; superseded: this run's figures of both threads" in history
