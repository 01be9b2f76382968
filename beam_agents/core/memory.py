"""Per-key working memory: small named byte slots and bounded rings, persisted as a proto.

An activation sees the memory its key committed last and its own writes; the writes are staged
and reach state only if the activation commits (invariant 1). The persisted form is a
``MemoryState`` proto with slots sorted by key, so equal memories encode to equal bytes, kept as
the elements of a Beam bag whose concatenation is that blob (``_memory_wire``). The whole
serialized blob is capped at :data:`MEMORY_CAP_BYTES`: a write that would pass the cap
raises :class:`~beam_agents.core.errors.MemoryLimitError` at the call and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import MemoryState
from beam_agents.core._memory_wire import MEMORY_SCHEMA_VERSION as MEMORY_SCHEMA_VERSION
from beam_agents.core._memory_wire import (
    VERSION_FIELD,
    RawSlot,
    Slot,
    encode_memory,
    scan,
    slot_size,
)
from beam_agents.core.errors import MemoryLimitError, MemorySlotError
from beam_agents.core.state import decode_versioned

MEMORY_CAP_BYTES = 1 << 20
"""The hard cap on a key's serialized working memory: 1 MiB."""

DEFAULT_RING_ITEMS = 64
"""How many items ``append`` keeps in a ring unless told otherwise."""

_VERSION_FIELD_SIZE = len(VERSION_FIELD)


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise MemorySlotError(f"memory keys are non-empty str, got {key!r}")
    return key


def _check_bytes(what: str, value: object) -> bytes:
    if not isinstance(value, bytes):
        raise MemorySlotError(f"memory {what} must be bytes, got {type(value).__name__}")
    return value


class WorkingMemory:
    """The key's memory as one activation sees it: committed slots plus staged writes.

    A slot holds either one value (``set``/``get``) or a ring of items (``append``/``ring``);
    using a slot as the other kind raises :class:`MemorySlotError`. The committed blob is
    scanned on first use, so an activation that never touches memory pays nothing, and a slot
    is decoded only when read: a commit re-uses the committed bytes of every slot it did not
    change (``_memory_wire``), so its cost follows what changed, not the whole memory.
    ``elements``: the committed memory's bag elements (or ``None``).
    """

    __slots__ = ("_changed", "_elements", "_encoded", "_size", "_sizes", "_slots")

    def __init__(self, elements: Sequence[bytes] | None) -> None:
        self._elements = elements
        self._slots: dict[str, Slot | RawSlot] | None = None
        self._sizes: dict[str, int] = {}
        self._size = 0
        self._changed = False
        self._encoded: list[bytes] | None = None

    def _loaded(self) -> dict[str, Slot | RawSlot]:
        if self._slots is None:
            self._slots = self._decode(self._elements) if self._elements else {}
            self._size = _VERSION_FIELD_SIZE
            for key, content in self._slots.items():
                size = self._sizes[key] = (
                    content.size if isinstance(content, RawSlot) else slot_size(key, content)
                )
                self._size += size
        return self._slots

    @staticmethod
    def _decode(elements: Sequence[bytes]) -> dict[str, Slot | RawSlot]:
        """The committed slots: views into ``elements`` or, if not canonical, parsed ones."""
        raw = scan(elements)
        if raw is not None:
            return dict(raw)
        blob = b"".join(elements)
        state = decode_versioned(MemoryState, blob, MEMORY_SCHEMA_VERSION)
        return {
            slot.key: list(slot.ring.items) if slot.WhichOneof("content") == "ring" else slot.value
            for slot in state.slots
        }

    def _slot(self, key: str) -> Slot | None:
        """Slot ``key`` decoded (once: the decoded content replaces the committed view)."""
        slots = self._loaded()
        slot = slots.get(key)
        if isinstance(slot, RawSlot):
            slot = slots[key] = slot.decode()
        return slot

    def _replace(self, key: str, new: Slot | None) -> None:
        """Swap slot ``key`` for ``new`` (``None`` deletes), enforcing the cap first."""
        slots = self._loaded()
        sizes = self._sizes
        new_size = 0 if new is None else slot_size(key, new)
        size = self._size - sizes.get(key, 0) + new_size
        if size > MEMORY_CAP_BYTES:
            raise MemoryLimitError(
                f"writing memory slot {key!r} would make this key's memory {size} bytes, over "
                f"the {MEMORY_CAP_BYTES}-byte cap; store large data elsewhere and keep a "
                "reference in memory"
            )
        if new is None:
            del slots[key]
            del sizes[key]
        else:
            slots[key] = new
            sizes[key] = new_size
        self._size = size
        self._changed = True
        self._encoded = None

    def get(self, key: str) -> bytes | None:
        """The value in slot ``key``, or ``None`` if there is none."""
        slot = self._slot(_check_key(key))
        if isinstance(slot, list):
            raise MemorySlotError(f"memory slot {key!r} is a ring; read it with ring({key!r})")
        return slot

    def set(self, key: str, value: bytes) -> None:
        """Put ``value`` in slot ``key`` (replacing a value or a ring)."""
        self._replace(_check_key(key), _check_bytes("values", value))

    def delete(self, key: str) -> None:
        """Remove slot ``key``; deleting a missing slot is a no-op."""
        if _check_key(key) in self._loaded():
            self._replace(key, None)

    def keys(self) -> list[str]:
        """The names of all slots, sorted."""
        return sorted(self._loaded())

    def append(self, key: str, item: bytes, max_items: int = DEFAULT_RING_ITEMS) -> None:
        """Append ``item`` to the ring in slot ``key``, keeping only the newest ``max_items``."""
        _check_key(key)
        _check_bytes("ring items", item)
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise MemorySlotError(f"max_items must be an int >= 1, got {max_items!r}")
        current = self._slot(key)
        if isinstance(current, bytes):
            raise MemorySlotError(
                f"memory slot {key!r} holds a single value; delete it before using it as a ring"
            )
        self._replace(key, [*(current or ()), item][-max_items:])

    def ring(self, key: str) -> list[bytes]:
        """The items of the ring in slot ``key``, oldest first (empty if there is none)."""
        slot = self._slot(_check_key(key))
        if isinstance(slot, bytes):
            raise MemorySlotError(f"memory slot {key!r} holds a single value; read it with get()")
        return list(slot or ())

    @property
    def size(self) -> int:
        """The size of this memory's serialized form in bytes: what the cap limits."""
        return self._size if self._loaded() else 0

    @property
    def slot_sizes(self) -> dict[str, int]:
        """Each slot's share of :attr:`size`, by name (its encoded bytes, tag included)."""
        self._loaded()
        return dict(self._sizes)

    @property
    def changed(self) -> bool:
        """Whether this activation wrote anything."""
        return self._changed

    def encode(self) -> list[bytes]:
        """The memory's bag elements (none when memory is empty); see ``_memory_wire``.

        Joined, they equal ``MemoryState(...).SerializeToString(deterministic=True)`` byte for
        byte; the committed bytes of unchanged slots and large new values are not copied.
        """
        if self._encoded is None:
            self._encoded = encode_memory(self._loaded())
        return self._encoded
