"""One key's backtest: the candidate runs the key's recorded envelopes, in commit order.

The candidate keeps its own state from one envelope to the next, as in production, and each
external event starts its run at the recorded seq (so intent ids line up with the record's).
A recorded result or approval is fed only if the candidate waits for the same intent (same id,
tool and arguments); a run still waiting on an intent the record never had, when the next
event comes, "waits on a new effect" and is ended. Nothing is executed.
:meth:`KeyBacktest.run` returns the key's result as plain JSON data, and
:meth:`KeyBacktest.run_envelopes` the same for envelopes with no record behind them, every run
the candidate's alone (``beam_agents/replay/README.md``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from beam_agents._protos import ActivationRecord, AgentEnvelope, RecordedMemory
from beam_agents.replay.answers import PooledModel, PooledTools, Usage, check_records
from beam_agents.replay.harness import TRIGGER_EVENT, Harness, KeyCells, cells_for

WAITS = "waits on a new effect"


@dataclass
class RunSide:
    """What one side (recorded or candidate) did in one run: outputs, intents, failures."""

    outputs: list[str] = field(default_factory=list)
    intents: list[tuple[str, str]] = field(default_factory=list)
    ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    activations: int = 0
    error: str = ""
    waits: bool = False

    def add(self, record: ActivationRecord) -> None:
        """Count one committed activation of the run."""
        self.activations += 1
        if record.outcome == ActivationRecord.COMPLETE and record.output:
            self.outputs.append(record.output.decode("utf-8", errors="backslashreplace"))
        for intent in record.intents:
            self.intents.append((intent.tool_name, intent.args_json))
            self.ids[intent.intent_id] = (intent.tool_name, intent.args_json)

    def as_json(self) -> dict[str, Any]:
        """The side as JSON data."""
        data: dict[str, Any] = {
            "outputs": self.outputs,
            "intents": [{"tool": tool, "args": args} for tool, args in sorted(self.intents)],
        }
        if self.error:
            data["error"] = self.error
        if self.waits:
            data["waits"] = True
        return data


def key_text(key: bytes) -> str:
    """A key as the report shows it: its text when printable, else ``hex:...``."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + key.hex()
    return text if text.isprintable() and not text.startswith("hex:") else "hex:" + key.hex()


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _output_changes(recorded: list[str], candidate: list[str]) -> list[str]:
    """``output.FIELD: old -> new`` for JSON objects (one output each side), else one line."""
    if recorded == candidate:
        return []
    if not candidate or not recorded:
        return ["output removed" if recorded else "output added"]
    try:
        [mine] = recorded
        [theirs] = candidate
        old, new = json.loads(mine), json.loads(theirs)
    except ValueError:
        return ["output changed"]
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return ["output changed"]
    return [
        f"output.{name}: {_short(old.get(name))} -> {_short(new.get(name))}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def changes(recorded: RunSide, candidate: RunSide) -> list[str]:
    """What changed in a run's decision, each as a short, groupable line."""
    found = _output_changes(recorded.outputs, candidate.outputs)
    mine, theirs = Counter(recorded.intents), Counter(candidate.intents)
    found += [f"intent added: {tool}" for tool, _ in sorted((theirs - mine).elements())]
    found += [f"intent removed: {tool}" for tool, _ in sorted((mine - theirs).elements())]
    if candidate.error:
        found.append(f"activation failed: {candidate.error}")
    if candidate.waits:
        found.append(WAITS)
    return found


def decisions(side: RunSide) -> list[str]:
    """What a run decided, as groupable lines: for a backtest with no recorded side."""
    found = []
    for output in side.outputs:
        try:
            value = json.loads(output)
        except ValueError:
            value = output
        if isinstance(value, dict):
            found += [f"output.{name}: {_short(value[name])}" for name in sorted(value)]
        else:
            found.append(f"output: {_short(value)}")
    found += [f"intent: {tool}" for tool, _ in sorted(side.intents)]
    if side.error:
        found.append(f"activation failed: {side.error}")
    if side.waits:
        found.append(WAITS)
    return found or ["no output"]


@dataclass
class RunPair:
    """One run as recorded and as the candidate did it."""

    seq: int
    recorded: RunSide = field(default_factory=RunSide)
    candidate: RunSide = field(default_factory=RunSide)


class KeyBacktest:
    """Backtests keys one at a time with a harness whose calls the pools answer."""

    def __init__(self, harness: Harness, model: PooledModel, tools: PooledTools) -> None:
        self._harness = harness
        self._model = model
        self._tools = tools

    def run(self, records: Sequence[ActivationRecord]) -> dict[str, Any]:
        """Backtest one key's records (in commit order); the key's result."""
        runs, usage, drift = self.walk(records)
        return _key_result(records[0].entity_key, runs, usage, records, drift)

    def walk(
        self, records: Sequence[ActivationRecord], memory: RecordedMemory | None = None
    ) -> tuple[list[RunPair], Usage, bool]:
        """Run the candidate over one key's records: its runs, calls and whether it drifted.

        ``memory``: the key's memory before the first record, when it did not record its own.
        """
        check_records(records, self._model.decoder_name, self._harness.namespace)
        usage = self._model.usage = self._tools.usage = Usage()
        self._model.start_key(records)
        self._tools.start_key(records)
        key = records[0].entity_key
        cells = cells_for(records[0], [], memory)
        runs: list[RunPair] = []
        drift = False
        for record in records:
            if not runs or (record.trigger == TRIGGER_EVENT and record.seq != runs[-1].seq):
                new_run = record.trigger == TRIGGER_EVENT
                self._close(runs, cells, record.seq if new_run else None)
                runs.append(RunPair(record.seq))
            run = runs[-1]
            run.recorded.add(record)
            if self._fed(record, run, cells):
                fed = self._feed(run, cells, key, record.envelope, record.intent_namespace)
                drift = fed or drift
        self._close(runs, cells, None)
        return runs, usage, drift

    def run_envelopes(self, key: bytes, envelopes: Sequence[AgentEnvelope]) -> dict[str, Any]:
        """Run the candidate over one key's envelopes (in order) from a new key; its result.

        Each external event starts a run at the key's next seq, as in production (a run still
        suspended then waits on a new effect and is ended); results and approvals are skipped:
        with no record, no intent of the candidate's is known to be the one they answer.
        """
        usage = self._model.usage = self._tools.usage = Usage()
        self._model.start_key(())
        self._tools.start_key(())
        cells = KeyCells()
        runs: list[RunPair] = []
        drift, skipped = False, 0
        for envelope in envelopes:
            if envelope.WhichOneof("payload") != "external_event":
                skipped += 1
                continue
            self._close(runs, cells, cells.state().header.next_seq)
            runs.append(RunPair(cells.state().header.next_seq))
            drift = self._feed(runs[-1], cells, key, envelope) or drift
        self._close(runs, cells, None)
        return _envelope_result(key, runs, usage, drift, skipped)

    def _feed(
        self,
        run: RunPair,
        cells: KeyCells,
        key: bytes,
        envelope: AgentEnvelope,
        namespace: str = "",
    ) -> bool:
        """Run ``envelope`` as part of ``run``; whether it drifted.

        Drift: a call nothing answers, even one the agent caught. ``namespace``: the record's
        intent namespace (empty: the config's).
        """
        self._model.miss = self._tools.miss = None
        plan = self._harness.element(cells, key, envelope, namespace)
        for committed in plan.records:
            run.candidate.add(committed)
        if plan.errors and not plan.records:
            run.candidate.error = plan.errors[0].reason
        return self._model.miss is not None or self._tools.miss is not None

    def _fed(self, record: ActivationRecord, run: RunPair, cells: KeyCells) -> bool:
        """Whether ``record``'s envelope goes to the candidate (results: only if it waits)."""
        if record.trigger == TRIGGER_EVENT:
            return True
        answer = _answered_intent(record.envelope)
        suspended = cells.continuation
        if suspended is None or answer not in suspended.pending_intent_ids:
            return False
        # The same intent on both sides (or, for a run older than the recording, on neither).
        return run.candidate.ids.get(answer) == run.recorded.ids.get(answer)

    def _close(self, runs: list[RunPair], cells: KeyCells, next_seq: int | None) -> None:
        """End the candidate's open run: one still waiting on an unrecorded intent waits."""
        suspended = cells.continuation
        if runs and suspended is not None:
            run = runs[-1]
            pending = set(suspended.pending_intent_ids)
            unrecorded = {
                intent_id
                for intent_id in pending
                if run.candidate.ids.get(intent_id) != run.recorded.ids.get(intent_id)
            }
            run.candidate.waits = bool(unrecorded)
        if next_seq is not None:
            cells.end_run(next_seq)


def _answered_intent(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


def _tokens(records: Sequence[ActivationRecord]) -> dict[str, list[int]]:
    spent: dict[str, list[int]] = {}
    for record in records:
        for call in record.model_calls:
            total = spent.setdefault(call.model, [0, 0])
            total[0] += call.input_tokens
            total[1] += call.output_tokens
    return spent


def _key_result(
    key: bytes, runs: list[RunPair], usage: Usage, records: Sequence[ActivationRecord], drift: bool
) -> dict[str, Any]:
    changed = []
    for run in runs:
        found = changes(run.recorded, run.candidate)
        if found:
            changed.append(
                {
                    "seq": run.seq,
                    "changes": found,
                    "recorded": run.recorded.as_json(),
                    "candidate": run.candidate.as_json(),
                }
            )
    return {
        "key": key_text(key),
        "runs": len(runs),
        "activations": {
            "recorded": len(records),
            "candidate": sum(run.candidate.activations for run in runs),
        },
        "changed": changed,
        "model_calls": {"reused": usage.reused, "new": usage.new},
        "new_tool_calls": usage.new_tool_calls,
        "tokens": {"recorded": _tokens(records), "candidate": usage.tokens or {}},
        "drift": drift,
    }


def _envelope_result(
    key: bytes, runs: list[RunPair], usage: Usage, drift: bool, skipped: int
) -> dict[str, Any]:
    """One key's result over envelopes: every run as the candidate did it (no baseline)."""
    return {
        "key": key_text(key),
        "runs": len(runs),
        "activations": {"candidate": sum(run.candidate.activations for run in runs)},
        "decided": [
            {
                "seq": run.seq,
                "decisions": decisions(run.candidate),
                "candidate": run.candidate.as_json(),
            }
            for run in runs
        ],
        "model_calls": {"reused": usage.reused, "new": usage.new},
        "new_tool_calls": usage.new_tool_calls,
        "tokens": {"candidate": usage.tokens or {}},
        "drift": drift,
        "envelopes_skipped": skipped,
    }
