"""``beam-agents replay``: re-run recorded runs against the current agent code, offline.

A run is ``same``, or stops at its first difference; :func:`fork` lets a candidate continue.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from beam_agents._protos import ActivationRecord, AgentError, RecordedMemory, ToolIntent
from beam_agents.core.config import AgentConfig
from beam_agents.core.context import AgentFn
from beam_agents.core.observability import memory_record
from beam_agents.core.staging import Staged
from beam_agents.replay.backtest import KeyBacktest, RunPair, changes, key_text
from beam_agents.replay.inputs import BadInput, RecordFileError, make_provider
from beam_agents.replay.offline import (
    Miss,
    OfflineActivator,
    Progress,
    RecordedModel,
    RecordedTools,
    Usage,
    cells_for,
    check_records,
    last_memory,
)

DIVERGENT = "divergent"
DRIFT = "drift"


@dataclass(frozen=True)
class Op:
    """One step of an activation: ``kind`` is ``model``, ``tool``, ``intent`` or ``approval``."""

    kind: str
    step: int | None
    name: str
    content: str

    def describe(self) -> str:
        """One line: what the step is."""
        where = "" if self.step is None else f" at step {self.step}"
        label = {"model": "model call to", "tool": "tool call"}.get(self.kind, self.kind)
        return f"{label} {self.name!r}{where}: {self.content}"


def ops_of(record: ActivationRecord, limit: int | None = None) -> list[Op]:
    """``record``'s steps in the order they were made (the first ``limit`` of them)."""
    placed: dict[int, Op] = {}
    calls = [
        *(
            (call.position, Op("model", call.step_index, call.model, call.request_json))
            for call in record.model_calls
        ),
        *(
            (call.position, Op("tool", None, call.tool_name, call.args_json))
            for call in record.tool_calls
        ),
    ]
    total = len(calls) + len(record.intents)
    for position, op in calls:
        if position in placed or not 0 <= position < total:
            raise RecordFileError(
                f"record of seq {record.seq}: call position {position} is repeated or out of range"
            )
        placed[position] = op
    intents = iter(record.intents)
    ops = [placed[at] if at in placed else _intent_op(next(intents)) for at in range(total)]
    return ops if limit is None else ops[:limit]


def _intent_op(intent: ToolIntent) -> Op:
    kind = "approval" if intent.kind == ToolIntent.APPROVAL else "intent"
    return Op(kind, intent.step_index, intent.tool_name, intent.args_json)


@dataclass(frozen=True)
class Divergence:
    """The first difference between a recorded activation and its replay."""

    status: str
    """:data:`DIVERGENT` or :data:`DRIFT`."""
    kind: str
    step: int | None
    recorded: str
    replayed: str
    diff: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        """The divergence as a JSON object."""
        return {
            "status": self.status,
            "kind": self.kind,
            "step": self.step,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "diff": list(self.diff),
        }


def _pretty(text: str) -> list[str]:
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True).splitlines()
    except ValueError:
        return text.splitlines()


def diff_lines(recorded: str, replayed: str) -> tuple[str, ...]:
    """A unified diff of two JSON (or plain) texts, recorded first."""
    lines = difflib.unified_diff(
        _pretty(recorded), _pretty(replayed), "recorded", "replayed", lineterm="", n=2
    )
    return tuple(lines)


def _step_divergence(recorded: Op | None, replayed: Op | None, miss: Miss | None) -> Divergence:
    shown = replayed if replayed is not None else recorded
    assert shown is not None
    status = DRIFT if miss is not None and replayed is not None and miss.drift else DIVERGENT
    step = (recorded or replayed or shown).step
    return Divergence(
        status,
        shown.kind,
        step,
        "(nothing)" if recorded is None else recorded.describe(),
        "(nothing)" if replayed is None else replayed.describe(),
        diff_lines(
            "" if recorded is None else recorded.content,
            "" if replayed is None else replayed.content,
        ),
    )


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace")


def _slots(memory: RecordedMemory) -> dict[str, str]:
    return {slot.key: slot.digest.hex() for slot in memory.slots}


def _memory_after(side: ActivationRecord, given: RecordedMemory) -> dict[str, str]:
    return _slots(side.memory_after if side.memory_after.known else given)


def first_divergence(
    recorded: ActivationRecord,
    replayed: ActivationRecord | None,
    partial: Sequence[Op],
    miss: Miss | None,
    error: AgentError | None,
    given: bytes | None = None,
) -> Divergence | None:
    """The first difference, or ``None`` when the replay did exactly what was recorded.

    ``replayed`` is ``None`` when the activation failed, after the steps in ``partial``.
    The replay is compared up to ``miss``, the call the record could not answer.
    """
    ours = ops_of(recorded)
    made = list(partial) if replayed is None else ops_of(replayed)
    theirs = (
        [*made[: miss.position], Op(miss.kind, miss.step, miss.name, miss.content)]
        if miss
        else made
    )
    for at in range(max(len(ours), len(theirs))):
        mine = ours[at] if at < len(ours) else None
        other = theirs[at] if at < len(theirs) else None
        if mine != other:
            return _step_divergence(mine, other, miss if at == len(theirs) - 1 else None)
    if miss is not None:  # the unanswered call looks like the recorded one: still unanswered
        return _step_divergence(ours[miss.position], theirs[miss.position], None)
    if replayed is None:
        detail = "failed" if error is None else f"failed ({error.reason}): {error.detail}"
        return Divergence(DIVERGENT, "error", None, "committed", f"the activation {detail}")
    outcome = ActivationRecord.Outcome.Name
    if recorded.outcome != replayed.outcome:
        return Divergence(
            DIVERGENT, "outcome", None, outcome(recorded.outcome), outcome(replayed.outcome)
        )
    if (recorded.output, recorded.snapshot) != (replayed.output, replayed.snapshot):
        field = "output" if recorded.outcome == ActivationRecord.COMPLETE else "snapshot"
        mine_text = _text(getattr(recorded, field))
        their_text = _text(getattr(replayed, field))
        return Divergence(
            DIVERGENT, "output", None, mine_text, their_text, diff_lines(mine_text, their_text)
        )
    start = memory_record(given or b"", 0)
    mine_slots, their_slots = _memory_after(recorded, start), _memory_after(replayed, start)
    if mine_slots != their_slots:
        mine_text = json.dumps(mine_slots, sort_keys=True)
        their_text = json.dumps(their_slots, sort_keys=True)
        return Divergence(
            DIVERGENT, "memory", None, mine_text, their_text, diff_lines(mine_text, their_text)
        )
    return None


# -- replay -------------------------------------------------------------------------------
SAME = "same"

EXIT_SAME, EXIT_DIVERGENT, EXIT_BAD_INPUT, EXIT_DRIFT = 0, 1, 2, 3
"""The command's exit statuses (``docs/replay.md``)."""


@dataclass(frozen=True)
class RunReport:
    """How one recorded run replayed: ``same``, or where it first diverged."""

    key: bytes
    seq: int
    activations: int
    divergence: Divergence | None = None
    activation: int = 0  # the activation (0: the run's first) the divergence is in
    trigger: str = ""

    @property
    def status(self) -> str:
        """``same``, ``divergent`` or ``drift``."""
        return SAME if self.divergence is None else self.divergence.status


def staged_ops(current: Staged | None) -> list[Op]:
    """The steps a failed activation made before it failed, as a record would list them."""
    if current is None or current.recording is None:
        return []
    partial = ActivationRecord(
        model_calls=current.recording.model_calls,
        tool_calls=current.recording.tool_calls,
        intents=current.intents,
    )
    return ops_of(partial)


def first_miss(*misses: Miss | None) -> Miss | None:
    """The earliest of the calls that could not be answered."""
    found = [miss for miss in misses if miss is not None]
    return min(found, key=lambda miss: miss.position) if found else None


class Replayer:
    """Replays records against one agent and config; :meth:`close` when done."""

    def __init__(self, agent: AgentFn, config: AgentConfig) -> None:
        decoder = make_provider(config)  # only decodes recorded bodies here, never called
        progress = Progress()
        self._model = RecordedModel(decoder, progress)
        self._tools = RecordedTools(progress)
        self._activator = OfflineActivator(agent, config, self._model, self._tools, progress)
        self._namespace = config.namespace

    def replay_one(
        self,
        record: ActivationRecord,
        earlier: Sequence[ActivationRecord],
        memory: RecordedMemory | None,
    ) -> Divergence | None:
        """Replay ``record`` on the state it rebuilds; its first divergence, if any."""
        self._model.start(record)
        self._tools.start(record)
        cells = cells_for(record, earlier, memory)
        given = b"".join(cells.memory.read())
        plan = self._activator.element(
            cells, record.entity_key, record.envelope, record.intent_namespace
        )
        unrecorded = self._tools.unrecorded
        if unrecorded is not None:
            raise BadInput(
                f"cannot replay this tool result: {unrecorded.tool_name!r} returned a "
                f"{unrecorded.unrecorded_result_type} (no JSON form), so it was not recorded"
            )
        replayed = plan.records[0] if plan.records else None
        return first_divergence(
            record,
            replayed,
            staged_ops(self._activator.staged) if replayed is None else [],
            first_miss(self._model.miss, self._tools.miss),
            plan.errors[0] if plan.errors else None,
            given,
        )

    def replay_key(self, records: Sequence[ActivationRecord]) -> list[RunReport]:
        """Replay one key's records (in commit order), run by run."""
        check_records(records, self._model.decoder_name, self._namespace)
        reports = []
        memory: RecordedMemory | None = None
        # A run is its seq in its namespace: two namespaces' runs may share a seq.
        for (seq, _), grouped in groupby(records, key=lambda r: (r.seq, r.intent_namespace)):
            run = list(grouped)
            report = RunReport(run[0].entity_key, seq, len(run))
            for index, record in enumerate(run):
                divergence = self.replay_one(record, run[:index], memory)
                memory = last_memory([record], memory)
                if divergence is not None:
                    report = RunReport(
                        record.entity_key, seq, index + 1, divergence, index, record.trigger
                    )
                    break
            reports.append(report)
        return reports

    def close(self) -> None:
        """Release the event loop."""
        self._activator.close()


def replay(
    recording: Mapping[bytes, Sequence[ActivationRecord]], agent: AgentFn, config: AgentConfig
) -> list[RunReport]:
    """Replay every run of ``recording`` (records by key, as ``inputs.by_key`` gives)."""
    replayer = Replayer(agent, config)
    try:
        return [report for records in recording.values() for report in replayer.replay_key(records)]
    finally:
        replayer.close()


def exit_status(reports: Sequence[RunReport]) -> int:
    """3 if any run drifted, else 1 if any diverged, else 0."""
    statuses = {report.status for report in reports}
    if DRIFT in statuses:
        return EXIT_DRIFT
    return EXIT_SAME if statuses <= {SAME} else EXIT_DIVERGENT


# -- fork ---------------------------------------------------------------------------------
def _history(
    records: Sequence[ActivationRecord], agent: AgentFn, config: AgentConfig
) -> tuple[list[RunReport], RecordedMemory | None]:
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
    backtest = KeyBacktest(candidate, config, strict=strict)
    try:
        return backtest.walk(records, memory)
    finally:
        backtest.close()


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
                    "runs": [run.as_json(found[run.seq]) for run in runs],
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
