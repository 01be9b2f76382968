"""``beam-agents replay --fork-at SEQ --candidate M:F``: one key's history, then a candidate.

The key's runs before ``SEQ`` are replayed against ``--agent`` (each must be ``same``); from
run ``SEQ`` on, the candidate continues on the state the history left, over the recorded
envelopes, exactly as a backtest does for one key (``keyrun``): recorded model calls answer
unchanged requests, new ones go to the config's provider (with ``--strict``: drift), and no
intent is executed. It reports what the candidate would have done next, run by run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from beam_agents._protos import ActivationRecord, RecordedMemory
from beam_agents.core.agent import AgentFn
from beam_agents.core.config import AgentConfig
from beam_agents.replay.answers import PooledModel, PooledTools, Progress, Usage
from beam_agents.replay.harness import Harness, last_memory
from beam_agents.replay.keyrun import KeyBacktest, RunPair, changes, key_text
from beam_agents.replay.loading import BadInput, make_provider
from beam_agents.replay.replay import (
    EXIT_DIVERGENT,
    EXIT_DRIFT,
    EXIT_SAME,
    Replayer,
    RunReport,
    exit_status,
)


def _history(
    records: Sequence[ActivationRecord], agent: AgentFn, config: AgentConfig
) -> tuple[list[RunReport], RecordedMemory | None]:
    """Replay the history; return its reports and the key's last known memory."""
    replayer = Replayer(agent, config)
    try:
        reports = replayer.replay_key(records)
    finally:
        replayer.close()
    return reports, last_memory(records)


def continue_with(
    records: Sequence[ActivationRecord],
    candidate: AgentFn,
    config: AgentConfig,
    memory: RecordedMemory | None,
    *,
    strict: bool,
) -> tuple[list[RunPair], Usage, bool]:
    """The candidate over ``records`` from the state ``memory`` describes."""
    provider = make_provider(config)
    progress = Progress()
    model = PooledModel(provider, progress, strict=strict)
    tools = PooledTools(Usage(), progress, strict=strict)
    harness = Harness(candidate, config, model, tools, progress, retry=True)
    try:
        return KeyBacktest(harness, model, tools).walk(records, memory)
    finally:
        harness.close()


def fork(
    records: Sequence[ActivationRecord],
    agent: AgentFn,
    candidate: AgentFn,
    config: AgentConfig,
    fork_at: int,
    strict: bool,
    as_json: bool,
) -> int:
    """Replay ``records`` before ``fork_at``, continue with ``candidate``; print; exit status."""
    earlier = [record for record in records if record.seq < fork_at]
    later = [record for record in records if record.seq >= fork_at]
    if not later:
        raise BadInput(f"the key has no recorded run at or after seq {fork_at}")
    history, memory = _history(earlier, agent, config)
    runs, usage, drift = continue_with(later, candidate, config, memory, strict=strict)
    found = {run.seq: changes(run.recorded, run.candidate) for run in runs}
    status = exit_status(history)
    if drift:
        status = EXIT_DRIFT
    elif status == EXIT_SAME and any(found.values()):
        status = EXIT_DIVERGENT
    key = key_text(records[0].entity_key)
    if as_json:
        print(
            json.dumps(
                {
                    "key": key,
                    "fork_at": fork_at,
                    "history": [{"seq": r.seq, "status": r.status} for r in history],
                    "runs": [
                        {
                            "seq": run.seq,
                            "changes": found[run.seq],
                            "recorded": run.recorded.as_json(),
                            "candidate": run.candidate.as_json(),
                        }
                        for run in runs
                    ],
                    "model_calls": {"reused": usage.reused, "new": usage.new},
                    "exit_status": status,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return status
    same = sum(report.status == "same" for report in history)
    print(f"{key}: history before seq {fork_at}: {len(history)} runs, {same} same")
    for report in history:
        if report.divergence is not None:
            print(f"  seq {report.seq}: {report.status}: {report.divergence.kind}")
    for run in runs:
        what = "; ".join(found[run.seq]) or "same as recorded"
        print(f"{key} seq {run.seq} (candidate): {what}")
        print(f"  recorded: {json.dumps(run.recorded.as_json(), sort_keys=True)}")
        print(f"  candidate: {json.dumps(run.candidate.as_json(), sort_keys=True)}")
    print(
        f"fork: {len(runs)} runs from seq {fork_at}, {sum(map(bool, found.values()))} changed; "
        f"model calls: {usage.reused} from the record, {usage.new} new"
    )
    return status
