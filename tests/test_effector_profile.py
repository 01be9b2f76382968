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


def test_the_rest_of_the_transactions_is_the_printed_total_less_the_printed_parts() -> None:
    stats = pstats.Stats(cProfile.Profile().runctx("pass", {}, {}))
    store, execution = "/x/effector/store/sqlite.py", "/x/effector/store/_execution.py"
    # 99.4% in all; 40.4%, 12.4% and 28.4% named: printed 99, 40, 12, 28; the rest 19 (not 18).
    stats.stats = {  # type: ignore[attr-defined]
        (store, 1, "_in_transaction"): (1, 1, 0.0, 0.994, {}),
        (execution, 2, "record_completions"): (1, 1, 0.0, 0.404, {}),
        (execution, 3, "claim_work"): (1, 1, 0.0, 0.124, {}),
        ("/x/effector/store/_intake.py", 4, "submit"): (1, 1, 0.0, 0.284, {}),
    }
    lines = effector_profile._store_findings(stats, 1.0, 20_000)
    assert "`_in_transaction`: 99%" in lines[1] and "`submit`: 28%" in lines[4]
    assert lines[-1].startswith("The rest of `_in_transaction`, 19%: BEGIN and COMMIT")
