"""``beam-agents replay``: re-run recorded runs against the current agent code, offline.

Each recorded activation is replayed on the state its record rebuilds (``harness.cells_for``),
its model calls answered only from the record and its read-only tools likewise; nothing else
is reached. A run is ``same`` when every activation did exactly what was recorded, else it
stops at its first divergent step (``compare.first_divergence``). :func:`replay` returns one
:class:`RunReport` per run; the exit status follows from them (:func:`exit_status`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from beam_agents._protos import ActivationRecord, RecordedMemory
from beam_agents.core.agent import AgentFn
from beam_agents.core.config import AgentConfig
from beam_agents.core.staging import Staged
from beam_agents.core.state import MEMORY
from beam_agents.replay.answers import (
    Miss,
    Progress,
    RecordedModel,
    RecordedTools,
    check_records,
)
from beam_agents.replay.compare import DRIFT, Divergence, Op, first_divergence, ops_of
from beam_agents.replay.harness import Harness, cells_for, last_memory
from beam_agents.replay.loading import BadInput, make_provider

SAME = "same"

EXIT_SAME, EXIT_DIVERGENT, EXIT_BAD_INPUT, EXIT_DRIFT = 0, 1, 2, 3
"""The command's exit statuses (``beam_agents/replay/README.md``)."""


@dataclass(frozen=True)
class RunReport:
    """How one recorded run replayed: ``same``, or where it first diverged."""

    key: bytes
    seq: int
    activations: int
    """How many of the run's recorded activations were replayed."""
    divergence: Divergence | None = None
    activation: int = 0
    """The activation (0 = the run's first) the divergence is in."""
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
        self._harness = Harness(agent, config, self._model, self._tools, progress)
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
        given = b"".join(cells.cells[MEMORY].read())
        plan = self._harness.element(
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
            staged_ops(self._harness.staged) if replayed is None else [],
            first_miss(self._model.miss, self._tools.miss),
            plan.errors[0] if plan.errors else None,
            given,
        )

    def replay_key(self, records: Sequence[ActivationRecord]) -> list[RunReport]:
        """Replay one key's records (in commit order), run by run."""
        check_records(records, self._model.decoder_name, self._namespace)
        reports = []
        memory: RecordedMemory | None = None
        for seq, grouped in groupby(records, key=lambda record: record.seq):
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
        self._harness.close()


def replay(
    recording: Mapping[bytes, Sequence[ActivationRecord]], agent: AgentFn, config: AgentConfig
) -> list[RunReport]:
    """Replay every run of ``recording`` (records by key, as ``recordfile.by_key`` gives)."""
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
