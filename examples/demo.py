"""The end-to-end demo behind ``make demo``: pipeline plus effector sidecar, on one machine.

1. Starts an effector (``python -m effector serve``) with the fraud tools on an embedded SQLite
   store in a temporary directory, on a random free loopback port.
2. Runs the fraud-triage pipeline (``examples/fraud_triage.py``) on the DirectRunner over a few
   hundred transfers across dozens of accounts: risk lookups inline, a model call, freezes
   staged as intents and executed by the effector, agents suspended and resumed.
3. Meanwhile plays the human: approves one large transfer and denies another through the
   effector's command line, and leaves the third to time out. The pipeline sends its traces and
   errors to the effector, whose web console (URL printed) shows every key's runs.
4. Runs the same pipeline again over the same events and shows the effector executed nothing
   new and the decisions are the same.
5. Prints a summary table and stops every process it started; with ``KEEP=1`` it first leaves
   the effector and its console up until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from beam_agents import AgentEnvelope, IntentState
from effector import EffectorClient, EffectorProcess, child_environment

from fraud_tools import LEDGER_ENV, connect_ledger
from fraud_triage import make_events, read_lines, run

EXAMPLES = Path(__file__).resolve().parent
N_EVENTS = 300
N_ACCOUNTS = 40


@contextlib.contextmanager
def effector_sidecar(workdir: Path) -> Iterator[EffectorProcess]:
    """Start the effector, with its web console, as a subprocess; stop it on exit."""
    with EffectorProcess(
        "--tools", "fraud_tools:make_effector_registry",
        "--store", f"sqlite:///{workdir / 'effector.db'}",
        "--listen", "127.0.0.1:0",
        "--console-listen", "127.0.0.1:0",
        env=child_environment(EXAMPLES, **{LEDGER_ENV: str(workdir / "bank.db")}),
        log=workdir / "effector.log",
        stop_timeout_s=15,
    ) as effector:  # fmt: skip
        yield effector


def effector_cli(target: str, *args: str) -> str:
    """Run one ``python -m effector`` subcommand against ``target``; return its output."""
    completed = subprocess.run(
        [sys.executable, "-m", "effector", *args, "--target", target],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return completed.stdout.strip()


class Human(threading.Thread):
    """Decides approvals as they appear: approve the first, deny the second, ignore the third."""

    def __init__(self, target: str, plan: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self._target = target
        self._plan = plan
        self.decided: dict[str, str] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Poll the effector's approval inbox and act on the planned transfers."""
        with EffectorClient(self._target) as client:
            while not self._stop_event.wait(0.2):
                for intent in client.list_intents(IntentState.AWAITING_DECISION):
                    transfer = json.loads(intent.args_json)["transfer_id"]
                    action = self._plan.get(transfer)
                    if action and intent.intent_id not in self.decided:
                        effector_cli(self._target, action, intent.intent_id, "--approver", "demo")
                        self.decided[intent.intent_id] = f"{action} {transfer}"
                        print(f"  human: {action} transfer {transfer}", flush=True)

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop_event.set()
        self.join(timeout=5)


PROGRESS_LEGEND = (
    "progress, once a second: the effector's intents by state and head_offset, the offset of "
    "the newest envelope on its result log (the names its `status` command prints)"
)


class Progress(threading.Thread):
    """Prints the effector's counters once a second while a run is going (see PROGRESS_LEGEND)."""

    def __init__(self, target: str, started: float) -> None:
        super().__init__(daemon=True)
        self._target = target
        self._t0 = started
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Print the effector's counters until stopped."""
        with EffectorClient(self._target) as client:
            while not self._stop_event.wait(1.0):
                s = client.status()
                print(
                    f"  [{time.monotonic() - self._t0:5.1f}s] effector: pending={s.pending} "
                    f"running={s.running} awaiting_decision={s.awaiting_decision} "
                    f"done={s.done} head_offset={s.head_offset}",
                    flush=True,
                )

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop_event.set()
        self.join(timeout=5)


def ledger_counts(path: Path) -> tuple[int, int]:
    """(raw tool invocations, distinct freezes) recorded by the example bank."""
    with contextlib.closing(connect_ledger(str(path))) as ledger:
        invocations = ledger.execute("SELECT COUNT(*) FROM invocations").fetchone()[0]
        freezes = ledger.execute("SELECT COUNT(*) FROM freezes").fetchone()[0]
    return int(invocations), int(freezes)


def one_run(
    label: str, target: str, out_dir: Path, events: list[AgentEnvelope]
) -> tuple[list[dict[str, object]], float]:
    """Run the pipeline once with progress output; return its decisions and wall time."""
    print(f"{label}: running the pipeline ...", flush=True)
    started = time.monotonic()
    progress = Progress(target, started)
    progress.start()
    try:
        run(target, events, str(out_dir))
    finally:
        progress.stop()
    elapsed = time.monotonic() - started
    decisions = read_lines(str(out_dir), "decisions")
    print(f"{label}: {len(decisions)} decisions in {elapsed:.1f}s", flush=True)
    return decisions, elapsed


@dataclass
class DemoReport:
    """What one demo run observed: both runs' decisions, the bank's ledger and the effector."""

    n_events: int
    n_accounts: int
    first: list[dict[str, object]]
    second: list[dict[str, object]]
    first_s: float
    second_s: float
    invocations: tuple[int, int]
    freezes: tuple[int, int]
    ledger_intent_ids: list[str]
    executed_freeze_intent_ids: set[str]
    decided: dict[str, str]
    effector_status: str
    console_url: str
    console_keys_page: str
    """The console's page of the first account, as served after both runs."""

    def problems(self) -> list[str]:
        """Every way this run fell short of what the system promises (empty when it held)."""
        by_decision = Counter(str(d["decision"]) for d in self.first)
        checks = {
            "a decision for every event": len(self.first) == self.n_events,
            "each transfer decided once": len({d["transfer_id"] for d in self.first})
            == self.n_events,
            "one approved, one declined, one held": by_decision["approved"]
            == by_decision["declined"]
            == by_decision["held"]
            == 1,
            "one ledger entry per freeze intent": sorted(self.ledger_intent_ids)
            == sorted(self.executed_freeze_intent_ids),
            "every freeze succeeded": by_decision["freeze-failed"] == 0,
            "one freeze per frozen decision": self.freezes[0] == by_decision["frozen"],
            "every freeze invoked once": self.invocations[0] == self.freezes[0],
            "replay executes nothing": self.invocations[1] == self.invocations[0]
            and self.freezes[1] == self.freezes[0],
            "replay decides the same": sorted(map(json.dumps, self.first))
            == sorted(map(json.dumps, self.second)),
            "the console shows the account's runs": 'class="status completed"'
            in self.console_keys_page,
        }
        return [name for name, held in checks.items() if not held]


def run_demo(
    workdir: Path,
    n_events: int = N_EVENTS,
    n_accounts: int = N_ACCOUNTS,
    *,
    before_stop: Callable[[DemoReport], None] | None = None,
) -> DemoReport:
    """Start the effector in ``workdir``, run the pipeline twice, and report what happened.

    ``before_stop`` is called with the report while the effector and its console still run.
    """
    events = make_events(n_events, n_accounts)
    large = sorted(
        json.loads(e.external_event)["id"]
        for e in events
        if json.loads(e.external_event)["amount"] >= 10_000
    )
    plan = {large[0]: "approve", large[1]: "deny"}
    ledger = workdir / "bank.db"
    os.environ[LEDGER_ENV] = str(ledger)
    with effector_sidecar(workdir) as effector:
        target, console = effector.address, str(effector.console_url)
        print(f"effector listening on {target} (store: SQLite in a temporary directory)")
        print(f"console: {console} (every account's runs, intents, approvals, errors)")
        print(PROGRESS_LEGEND, flush=True)
        human = Human(target, plan)
        human.start()
        try:
            first, first_s = one_run("run 1", target, workdir / "run1", events)
        finally:
            human.stop()
        invocations_1, freezes_1 = ledger_counts(ledger)
        second, second_s = one_run("run 2 (replay)", target, workdir / "run2", events)
        invocations_2, freezes_2 = ledger_counts(ledger)
        with EffectorClient(target) as client:
            done = client.list_intents(IntentState.DONE, limit=1000)
        executed = {i.intent_id for i in done if i.tool_name == "freeze_account"}
        status = effector_cli(target, "status")
        keys_page = httpx.get(f"{console}keys/{events[0].entity_key.hex()}", timeout=30).text
        report = DemoReport(
            n_events=n_events,
            n_accounts=n_accounts,
            first=first,
            second=second,
            first_s=first_s,
            second_s=second_s,
            invocations=(invocations_1, invocations_2),
            freezes=(freezes_1, freezes_2),
            ledger_intent_ids=ledger_ids(ledger),
            executed_freeze_intent_ids=executed,
            decided=dict(human.decided),
            effector_status=status,
            console_url=console,
            console_keys_page=keys_page,
        )
        if before_stop is not None:
            before_stop(report)
    return report


def ledger_ids(ledger: Path) -> list[str]:
    """The intent ids the example bank recorded a freeze for."""
    with contextlib.closing(connect_ledger(str(ledger))) as connection:
        return [row[0] for row in connection.execute("SELECT intent_id FROM freezes")]


def print_summary(report: DemoReport, total_s: float) -> None:
    """The short table the demo ends with."""
    by_decision = Counter(str(d["decision"]) for d in report.first)
    same = sorted(map(json.dumps, report.first)) == sorted(map(json.dumps, report.second))
    rows = [
        ("events", f"{report.n_events} across {report.n_accounts} accounts"),
        ("decisions (run 1)", ", ".join(f"{k}={v}" for k, v in sorted(by_decision.items()))),
        ("intents executed", f"{report.freezes[0]} freezes ({report.invocations[0]} tool calls)"),
        ("approvals", ", ".join(sorted(report.decided.values())) + ", 1 left to time out"),
        ("run 1 time", f"{report.first_s:.1f}s"),
        ("replay: new executions", f"{report.invocations[1] - report.invocations[0]}"),
        ("replay: same decisions", "yes" if same else "NO"),
        ("replay time", f"{report.second_s:.1f}s"),
        ("effector status", report.effector_status.replace("\n", "; ")),
        ("console", f"{report.console_url} (up while the demo runs; KEEP=1 keeps it)"),
        ("total time", f"{total_s:.1f}s"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\nsummary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def hold_open(report: DemoReport) -> None:
    """Keep the effector and its console up until Ctrl-C (``make demo KEEP=1``)."""
    print(f"\nKEEP=1: the effector and its console stay up at {report.console_url}")
    print("press Ctrl-C to stop them", flush=True)
    # Beam's or gRPC's libraries may have replaced Python's Ctrl-C handler: put it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(1)


def main() -> None:
    """Run the demo; exit non-zero if the system did not behave as promised."""
    started = time.monotonic()
    keep = os.environ.get("KEEP", "") not in ("", "0")

    def summarize(report: DemoReport) -> None:
        print_summary(report, time.monotonic() - started)
        if keep:
            hold_open(report)

    with tempfile.TemporaryDirectory(prefix="beam-agents-demo-") as tmp:
        report = run_demo(Path(tmp), before_stop=summarize)
    problems = report.problems()
    if problems:
        raise SystemExit(f"demo: not as promised: {'; '.join(problems)}")
    print("demo: ok")


if __name__ == "__main__":
    main()
