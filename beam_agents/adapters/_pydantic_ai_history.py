"""The key's Pydantic AI session: its message history in one working-memory slot, bounded.

The history is read when a run starts and written only when it completes, so every activation
of a run re-walks from the same committed start. It is cut to the latest messages and bytes at
a turn boundary (a request holding the user's prompt), so tool calls stay with their returns;
the system prompt of the first request is carried to the new first one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    SystemPromptPart,
    ToolReturnPart,
    UserPromptPart,
)

from beam_agents.adapters._bridge import MEMORY_CAP_BYTES

__all__ = ["HISTORY_SLOT", "HistoryLimits", "HistoryTooLargeError"]

HISTORY_SLOT = "beam_agents.pydantic_ai.history"
"""The working-memory slot holding the key's message history (Pydantic AI's JSON)."""


class WorkingMemory(Protocol):
    """What the history needs of the key's working memory (``ctx.memory``)."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class HistoryTooLargeError(ValueError):
    """The latest turn alone is over ``history_max_bytes``: no turn boundary can cut it."""


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """How much history a key keeps: at most ``max_messages`` messages and ``max_bytes`` bytes.

    ``max_messages`` is a target: a turn longer than it is kept whole. ``max_bytes`` is a hard
    limit (:class:`HistoryTooLargeError`). ``max_messages=0`` keeps no history at all.
    """

    max_messages: int = 40
    max_bytes: int = 256 * 1024
    slot: str = HISTORY_SLOT

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"history_{name} must be an int >= 0, got {value!r}")
        if not 0 < self.max_bytes < MEMORY_CAP_BYTES:
            raise ValueError(
                f"history_max_bytes must be between 1 and the {MEMORY_CAP_BYTES}-byte memory "
                f"cap, got {self.max_bytes}"
            )

    def load(self, memory: WorkingMemory) -> list[ModelMessage]:
        """The committed history of the key (empty for a new session)."""
        if self.max_messages == 0:
            return []
        blob = memory.get(self.slot)
        return [] if not blob else list(ModelMessagesTypeAdapter.validate_json(blob))

    def save(self, memory: WorkingMemory, messages: Sequence[ModelMessage]) -> None:
        """Stage the completed run's history, cut to the limits."""
        if self.max_messages == 0:
            memory.delete(self.slot)
            return
        memory.set(self.slot, self.encode(messages))

    def encode(self, messages: Sequence[ModelMessage]) -> bytes:
        """``messages`` cut to the limits, as Pydantic AI's message JSON.

        Every message is serialized once: the list whole when it has few enough messages and
        fits (nothing to cut), else each message alone, the kept ones joined as the list's JSON
        holds them (only a first message given the system prompt is serialized again).
        """
        count = len(messages)
        if count <= self.max_messages:
            whole = _dump(messages)
            if len(whole) <= self.max_bytes:
                return whole  # the first cut (none) keeps everything
        cuts = [0, *(i for i in range(1, count) if _starts_turn(messages[i]))]
        # Cuts keeping too many messages are skipped (but the last is taken if none fits), so
        # only the messages from the first candidate on are serialized, each without its "[]".
        candidates = [cut for cut in cuts if count - cut <= self.max_messages] or cuts[-1:]
        low = candidates[0]
        encoded = [_dump([message])[1:-1] for message in messages[low:]]
        # after[i]: the bytes of messages[low + i :], each with its "," (or the closing "]").
        after = [0] * (count - low + 1)
        for index in range(count - low - 1, -1, -1):
            after[index] = after[index + 1] + len(encoded[index]) + 1
        kept: list[ModelMessage] = []
        first = b""
        for cut in candidates:
            kept = _carry_system_prompt(messages, cut)
            if not kept:
                break
            at = cut - low
            first = encoded[at] if kept[0] is messages[cut] else _dump(kept[:1])[1:-1]
            if len(kept) <= self.max_messages and 2 + len(first) + after[at + 1] <= self.max_bytes:
                break
        rest = encoded[len(encoded) - len(kept) + 1 :] if kept else []
        blob = b"[" + b",".join([first, *rest]) + b"]" if kept else b"[]"
        if len(blob) > self.max_bytes:
            raise HistoryTooLargeError(
                f"the latest turn of the Pydantic AI history is {len(blob)} bytes, over "
                f"history_max_bytes={self.max_bytes}; raise it (below the {MEMORY_CAP_BYTES}-"
                "byte memory cap) or return less from the tools"
            )
        return blob


def _dump(messages: Sequence[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(list(messages))


def _starts_turn(message: ModelMessage) -> bool:
    """Whether a cut may keep ``message`` first: a user prompt answering no tool call."""
    if not isinstance(message, ModelRequest):
        return False
    parts = message.parts
    return any(isinstance(part, UserPromptPart) for part in parts) and not any(
        isinstance(part, ToolReturnPart) for part in parts
    )


def _carry_system_prompt(messages: Sequence[ModelMessage], cut: int) -> list[ModelMessage]:
    """``messages[cut:]`` with the first request's system prompt put back in front."""
    kept = list(messages[cut:])
    if cut == 0 or not messages or not isinstance(messages[0], ModelRequest):
        return kept
    system = [part for part in messages[0].parts if isinstance(part, SystemPromptPart)]
    first = kept[0]
    if system and isinstance(first, ModelRequest):
        kept[0] = dataclasses.replace(first, parts=[*system, *first.parts])
    return kept
