"""Comparing a recorded activation with its replay: the first divergent step, with both sides.

An activation is a list of :class:`Op` (model calls, tool calls and intents, in the order the
agent made them), then its outcome (complete or suspend, with output or snapshot), then its
memory afterwards. :func:`first_divergence` walks both lists and reports the first difference:
what kind of step, where, both sides and a unified diff. A call the record cannot answer at
all is drift; any other difference is a divergence (``beam_agents/replay/README.md``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from beam_agents._protos import ActivationRecord, AgentError, RecordedMemory, ToolIntent
from beam_agents.core.recording import memory_record
from beam_agents.replay.answers import Miss
from beam_agents.replay.recordfile import RecordFileError

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


def miss_op(miss: Miss) -> Op:
    """The step a call the record could not answer would have been."""
    return Op(miss.kind, miss.step, miss.name, miss.content)


@dataclass(frozen=True)
class Divergence:
    """The first difference between a recorded activation and its replay."""

    status: str
    """:data:`DIVERGENT` or :data:`DRIFT`."""
    kind: str
    """``model``, ``tool``, ``intent``, ``approval``, ``outcome``, ``output``, ``memory`` or
    ``error``."""
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
    """JSON text indented (so a diff shows the changed field), other text as is."""
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
    """A side's memory afterwards: its own, or (it never touched memory) the one it was given."""
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

    ``replayed`` is the replay's record, ``None`` when the activation failed; then ``partial``
    holds the steps it made before failing and ``error`` the failure. ``miss`` is the call the
    record could not answer, if any (even when the agent caught the error and committed): the
    replay is compared up to it. ``given``: the memory the replay started from.
    """
    ours = ops_of(recorded)
    made = list(partial) if replayed is None else ops_of(replayed)
    theirs = [*made[: miss.position], miss_op(miss)] if miss else made
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
