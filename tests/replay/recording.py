# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""Recording test agents with real pipelines on the default runner, and running the command.

``record`` runs ``beam.Create`` → ``RunAgent`` → ``WriteRecords``; ``record_loop`` closes the loop
through an effector; ``command`` runs ``beam-agents`` in this process and captures its output,
``run_console`` runs the installed command in a new process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam

from beam_agents import AgentConfig, RunAgent, WriteRecords, WriteRecordsToEffector
from beam_agents._protos import ActivationRecord, AgentEnvelope
from beam_agents.core.context import AgentFn
from beam_agents.io import ReadEnvelopes, SubmitIntents
from beam_agents.model.client import as_model_client
from beam_agents.replay.backtest import run_backtest
from beam_agents.replay.cli import main
from beam_agents.replay.inputs import by_key, encode_records, read_records
from beam_agents.replay.offline import KeyCells, OfflineActivator, Progress
from beam_agents.tools import ToolRunner
from tests.replay import agents

PAIR = tuple[bytes, AgentEnvelope]
REPO = Path(__file__).resolve().parents[2]


def record(
    directory: Path,
    events: Sequence[AgentEnvelope],
    agent: AgentFn = agents.screen,
    config: Callable[[], AgentConfig] = agents.make_config,
) -> dict[bytes, list[ActivationRecord]]:
    """Run ``agent`` over ``events`` (``beam.Create``), write its records; read them back."""
    with beam.Pipeline() as pipeline:
        keyed = pipeline | beam.Create([(e.entity_key, e) for e in events]).with_output_types(PAIR)
        outputs = keyed | RunAgent(agent, config=config())
        outputs.records | WriteRecords(str(directory))
    return by_key(read_records([str(directory)]))


def record_loop(
    directory: Path,
    target: str,
    events: Sequence[AgentEnvelope],
    *,
    to_effector: bool = False,
    config: Callable[[], AgentConfig] = agents.make_config,
) -> dict[bytes, list[ActivationRecord]]:
    """Run ``screen`` against an effector (results come back and resume runs); read records.

    ``to_effector``: the records are also stored in the effector (``WriteRecordsToEffector``).
    """
    with beam.Pipeline() as pipeline:
        keyed = pipeline | ReadEnvelopes(
            target, events=list(events), stop_when_idle_s=1.0, poll_wait_ms=50
        )
        outputs = keyed | RunAgent(agents.screen, config=config())
        outputs.intents | SubmitIntents(target)
        outputs.records | WriteRecords(str(directory))
        if to_effector:
            outputs.records | WriteRecordsToEffector(target, batch_size=7)
    return by_key(read_records([str(directory)]))


def record_direct(
    path: Path,
    events: Sequence[AgentEnvelope],
    agent: AgentFn = agents.screen,
    config: Callable[[], AgentConfig] = agents.make_config,
) -> list[ActivationRecord]:
    """Run ``agent`` over ``events`` through the core alone (no pipeline), key by key in order;
    write its records to the records file ``path`` and return them."""
    chosen = config()
    provider = agents.PROVIDER if chosen.provider_factory is None else chosen.provider_factory()
    activator = OfflineActivator(agent, chosen, as_model_client(provider), ToolRunner(), Progress())
    cells: dict[bytes, KeyCells] = {}
    records: list[ActivationRecord] = []
    try:
        for event in events:
            key = event.entity_key
            plan = activator.element(cells.setdefault(key, KeyCells()), key, event)
            assert not plan.errors, plan.errors
            records += plan.records
    finally:
        activator.close()
    path.write_bytes(encode_records(records))
    return records


def command(*argv: str) -> tuple[int, str, str]:
    """Run ``beam-agents ARGV`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def run_console(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``beam-agents ARGV`` in a new process (from the repository's root)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    script = Path(sys.executable).parent / "beam-agents"
    return subprocess.run(
        [str(script), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def backtest_twice(
    out: Path, paths: Sequence[str], agent: str, config: str, **options: Any
) -> list[bytes]:
    """Run the same backtest twice, into ``out/first`` and ``out/second``; both JSON reports."""
    reports = []
    for run in ("first", "second"):
        run_backtest(paths, agent, config, out=str(out / run), **options)
        reports.append((out / run / "report.json").read_bytes())
    return reports


def command_json(*argv: str) -> tuple[int, Any]:
    """Run the command with ``--json``; its exit status and parsed output."""
    status, out, err = command(*argv, "--json")
    assert err == "" or "report.json" in err, err
    return status, json.loads(out)
