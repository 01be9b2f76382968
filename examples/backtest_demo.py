"""Backtest demo (``make backtest-demo``): record the fraud triage, then backtest a change.

1. Starts an effector (as ``make demo`` does) and runs the fraud-triage pipeline
   (``examples/fraud_triage.py``) with ``AgentConfig(record=True)``, its ``.records`` written by
   ``WriteRecords``.
2. Replays the recording against the same agent, offline: every run is "same".
3. Backtests a candidate that asks a human from 4,000 instead of 10,000 as a Beam batch pipeline
   over the recording, with the effector still running, and prints the report. Nothing is
   executed: the effector's counts are the same before and after.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

from beam_agents import ActivationContext, AgentConfig, Complete, Suspend
from beam_agents.replay import Price, render_markdown, run_backtest
from beam_agents.replay import main as beam_agents_command
from effector import EffectorClient, EffectorProcess, child_environment

from fraud_tools import LEDGER_ENV, make_pipeline_registry
from fraud_triage import make_events, make_provider, run, screen

EXAMPLES = Path(__file__).resolve().parent
CANDIDATE_THRESHOLD = 4_000
PRICES = {"fraud-analyst-1": Price(input_per_mtok=3.0, output_per_mtok=15.0)}


def make_config() -> AgentConfig:
    """The fraud triage's config (what the backtest's candidate runs with)."""
    return AgentConfig(provider_factory=make_provider, tool_registry=make_pipeline_registry())


async def triage_candidate(ctx: ActivationContext) -> Complete | Suspend:
    """The candidate: a human approves every transfer from 4,000 up."""
    return await screen(ctx, CANDIDATE_THRESHOLD)


def replay_and_backtest(workdir: Path, records: str) -> None:
    """Replay the recording (every run "same"), then backtest the candidate; print the report."""
    replayed = io.StringIO()
    with contextlib.redirect_stdout(replayed):
        status = beam_agents_command(
            ["replay", records, "--agent", "fraud_triage:triage", "--config",
             "backtest_demo:make_config"]
        )  # fmt: skip
    summary = replayed.getvalue().splitlines()[-1]
    print(f"backtest_demo: {summary} (exit {status})")
    if status != 0:
        sys.exit(f"backtest_demo: the unchanged agent did not replay as recorded:\n{replayed}")
    report = run_backtest(
        [records], "backtest_demo:triage_candidate", "backtest_demo:make_config",
        out=str(workdir / "report"), prices=PRICES,
    )  # fmt: skip
    print(render_markdown(report))
    if not report["runs_changed"] or report["model_calls"]["new"]:
        sys.exit("backtest_demo: the candidate should change decisions with no new model call")


def main() -> None:
    """Record, then replay and backtest with the effector still running; nothing new executes."""
    with tempfile.TemporaryDirectory(prefix="backtest-demo-") as scratch:
        workdir = Path(scratch)
        records = str(workdir / "records")
        tools = child_environment(EXAMPLES, **{LEDGER_ENV: str(workdir / "bank.db")})
        store = f"sqlite:///{workdir / 'effector.db'}"
        with EffectorProcess(
            "--tools", "fraud_tools:make_effector_registry", "--store", store,
            "--listen", "127.0.0.1:0", env=tools, log=workdir / "effector.log",
        ) as effector:  # fmt: skip
            run(effector.address, make_events(120, 20), str(workdir / "out"), record_dir=records)
            with EffectorClient(effector.address) as client:
                before = str(client.status())
                replay_and_backtest(workdir, records)
                if str(client.status()) != before:
                    sys.exit("backtest_demo: the effector executed something in the backtest")
    print("backtest_demo: ok")


if __name__ == "__main__":
    main()
