"""What an activation stages, and the one function that stages an intent.

:class:`Staged` is the record the runtime reads back after the agent returns: intents, trace
events, fresh steps, tokens, and the memory and replay cache if they were touched. It is
committed whole or discarded whole (invariant 1). :meth:`Staged.stage_intent` builds every
``ToolIntent`` the runtime emits: ``act``, ``request_approval`` and HITL escalation.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence

from beam_agents._protos import (
    ApprovalEdit,
    CompensationLink,
    ToolIntent,
    TraceEvent,
    canonical_json,
)
from beam_agents.core.cursor import ReplayCursor, StepRecord
from beam_agents.core.errors import BudgetExceededError
from beam_agents.core.ids import intent_id_for
from beam_agents.core.memory import WorkingMemory
from beam_agents.core.recording import ActivationRecorder
from beam_agents.core.tracing import MEMORY_SLOTS_ATTRIBUTE, TraceRecorder
from beam_agents.model.cache import ReplayCache

APPROVAL_TOOL_NAME = "approval"
"""The ``tool_name`` of every ``APPROVAL`` intent."""

STEP_KIND_OF_INTENT: dict[int, int] = {
    ToolIntent.TOOL: StepRecord.INTENT,
    ToolIntent.APPROVAL: StepRecord.APPROVAL,
}
"""The ``StepRecord`` kind a staged intent of each ``ToolIntent.Kind`` records."""

_log = logging.getLogger(__name__)


def intent_step_digest(kind: int, tool_name: str, args_json: str, link: str = "") -> bytes:
    """The content digest recorded for an intent step: its kind, tool name and arguments.

    ``link`` (compensation only, ``core/compensation.py``) is appended when not empty, so an
    intent without one keeps the digest it always had.
    """
    content = f"{kind}|{tool_name}|{args_json}" + (f"|{link}" if link else "")
    return hashlib.sha256(content.encode()).digest()


class Staged:
    """Everything one activation staged; the runtime commits it only if the agent succeeds."""

    __slots__ = (
        "budget_error",
        "cache",
        "carried",
        "cursor",
        "intents",
        "links",
        "memory",
        "namespace",
        "recording",
        "tokens_before",
        "tokens_used",
        "trace",
    )

    def __init__(
        self,
        trace: TraceRecorder,
        cursor: ReplayCursor,
        carried: tuple[tuple[str, int], ...] = (),
        tokens_before: int = 0,
        *,
        namespace: str | None = None,
        links: Sequence[CompensationLink] = (),
    ) -> None:
        self.trace = trace
        """The activation's trace events; it also names the activation (key, seq, event time)."""
        self.cursor = cursor
        self.carried = carried
        """``(intent_id, kind)`` of the run's earlier intents still unanswered."""
        self.tokens_before = tokens_before
        """Tokens the run's earlier activations spent."""
        self.namespace = namespace
        """The run's intent namespace (``AgentConfig.namespace`` when it started): its ids'."""
        self.intents: list[ToolIntent] = []
        self.links = [_copied(link) for link in links]
        """The run's compensation links (``Continuation.compensations``), this activation's too."""
        self.tokens_used = 0
        """Tokens the provider reported for this activation's calls (replays spend none)."""
        self.budget_error: BudgetExceededError | None = None
        """Set once a call went past the run's token budget: the activation must fail."""
        self.memory: WorkingMemory | None = None
        """The working memory, if the agent used it."""
        self.cache: ReplayCache | None = None
        """The replay cache, if the agent called the model."""
        self.recording: ActivationRecorder | None = None
        """What the activation's record needs beyond this, if ``AgentConfig.record`` is on."""

    @property
    def new_steps(self) -> list[tuple[int, bytes]]:
        """``(StepRecord kind, digest)`` of every fresh step this activation took, in order."""
        return self.cursor.new_steps

    @property
    def run_tokens_used(self) -> int:
        """Tokens spent by the whole run so far: earlier activations plus this one."""
        return self.tokens_before + self.tokens_used

    def closing_attributes(self, attributes: dict[str, str]) -> dict[str, str]:
        """``attributes`` plus the key's memory slot sizes, if this activation used memory.

        Memory the agent never touched is left out: reading the cell only to measure it would
        cost more than the rest of a no-op activation (``core/README.md``, "State layout").
        Memory it changed is always given, ``{}`` once emptied, so no stale sizes linger.
        """
        memory = self.memory
        if memory is not None:
            sizes = memory.slot_sizes
            if sizes or memory.changed:
                attributes[MEMORY_SLOTS_ATTRIBUTE] = (
                    _sizes_json(tuple(sizes.items()))
                    if len(sizes) <= _MEMOISED_SLOTS
                    else canonical_json(sizes)
                )
        return attributes

    def pending_after(self) -> list[tuple[str, int]]:
        """``(intent_id, kind)`` of every unanswered intent, carried ones first, for a Suspend."""
        return [*self.carried, *((intent.intent_id, intent.kind) for intent in self.intents)]

    def stage_intent(
        self,
        kind: int,
        tool_name: str,
        args_json: str,
        ttl_ms: int,
        channel: str,
        *,
        required_approvals: int = 0,
        gated_tool: str = "",
        edited_from: ApprovalEdit | None = None,
        compensate_with: tuple[str, str] | None = None,
        compensates: str = "",
    ) -> str:
        """Take the next step for an intent and stage it; return its id.

        A step that replays the run's record (same kind and content at the same position)
        stages nothing: that intent was emitted when its activation committed. The keyword
        fields go into the intent as they are (``ToolIntent`` documents them); a quorum of 1
        is left at 0, so the intent's bytes are those of an intent staged before quorums.
        ``compensate_with`` (tool, canonical arguments) links a compensation to the intent; it
        is not part of the effect's identity (the step's digest), so adding or changing an undo
        in the code never re-runs an effect a run already staged: a replayed step keeps the link
        it was staged with (none, if it had none). ``compensates`` makes it a compensating
        intent, which never expires (``expires_at_ms`` 0: an undo of an effect that ran must
        not lapse); that is part of its digest.
        """
        link = compensation_link_text(compensates)
        step, replayed = self.cursor.take(
            STEP_KIND_OF_INTENT[kind], intent_step_digest(kind, tool_name, args_json, link)
        )
        trace = self.trace
        intent_id = intent_id_for(trace.entity_key, trace.seq, step, self.namespace)
        if replayed:
            recorded = next((k for k in self.links if k.intent_id == intent_id), None)
            if compensate_with is not None and (
                recorded is None or (recorded.tool_name, recorded.args_json) != compensate_with
            ):
                _log.warning(
                    "intent %s was staged with %s; a replay keeps it as staged (ctx.compensate "
                    "uses the recorded link)",
                    intent_id,
                    "no compensate_with" if recorded is None else "another compensate_with",
                )
            return intent_id
        created_at_ms = trace.now_ms
        intent = ToolIntent(
            intent_id=intent_id,
            entity_key=trace.entity_key,
            seq=trace.seq,
            step_index=step,
            tool_name=tool_name,
            args_json=args_json,
            created_at_ms=created_at_ms,
            expires_at_ms=0 if compensates else created_at_ms + ttl_ms,
            kind=kind,  # type: ignore[arg-type]
            trace_id=trace.trace_id,
            channel=channel,
            required_approvals=required_approvals if required_approvals > 1 else 0,
            gated_tool=gated_tool,
            edited_from=edited_from,
            compensates_intent_id=compensates,
            compensate_tool=compensate_with[0] if compensate_with else "",
            compensate_args_json=compensate_with[1] if compensate_with else "",
        )
        # Built before it is traced: an intent that cannot be built (an expiry past int64)
        # raises here and leaves no trace of an intent that was never staged.
        trace.record(
            TraceEvent.INTENT_EMITTED,
            step,
            {"intent_id": intent_id, "tool_name": tool_name, "kind": ToolIntent.Kind.Name(kind)},
        )
        self.intents.append(intent)
        self._link(intent_id, step, compensate_with)
        return intent_id

    def _link(self, intent_id: str, step: int, compensate_with: tuple[str, str] | None) -> None:
        """Record the run's link from ``intent_id`` to its compensation, once."""
        if compensate_with is None or any(link.intent_id == intent_id for link in self.links):
            return
        tool_name, args_json = compensate_with
        self.links.append(
            CompensationLink(
                intent_id=intent_id, step_index=step, tool_name=tool_name, args_json=args_json
            )
        )


def compensation_link_text(compensates: str) -> str:
    """What a compensating intent adds to its step digest ("" for any other intent)."""
    return f"compensates:{compensates}" if compensates else ""


def _copied(link: CompensationLink) -> CompensationLink:
    copy = CompensationLink()
    copy.CopyFrom(link)
    return copy


_MEMOISED_SLOTS = 4
"""Slot sizes of memories up to this many slots are memoised (small entries; they recur)."""


@functools.lru_cache(maxsize=1024)
def _sizes_json(sizes: tuple[tuple[str, int], ...]) -> str:
    """The memory slot sizes as canonical JSON (a key's sizes recur from one activation on)."""
    return canonical_json(dict(sizes))
