"""Per-key working memory: small named byte slots and bounded rings, persisted as a proto.

An activation sees the memory its key committed last and its own writes; the writes are staged
and reach state only if the activation commits (invariant 1). The persisted form is a
``MemoryState`` proto with slots sorted by key, so equal memories encode to equal bytes. The
whole serialized blob is capped at :data:`MEMORY_CAP_BYTES`: a write that would pass the cap
raises :class:`~beam_agents.core.errors.MemoryLimitError` at the call and changes nothing.
"""

from __future__ import annotations

from beam_agents._protos import MemorySlot, MemoryState, RingItems
from beam_agents.core.errors import MemoryLimitError, MemorySlotError
from beam_agents.core.state import decode_versioned

MEMORY_SCHEMA_VERSION = 1
"""The ``MemoryState.schema_version`` this code writes and the newest it reads."""

MEMORY_CAP_BYTES = 1 << 20
"""The hard cap on a key's serialized working memory: 1 MiB."""

DEFAULT_RING_ITEMS = 64
"""How many items ``append`` keeps in a ring unless told otherwise."""

_Slot = bytes | list[bytes]


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field_size(payload_size: int) -> int:
    """Encoded size of a length-delimited field with a one-byte tag (field numbers < 16)."""
    return 1 + _varint_size(payload_size) + payload_size


def _slot_size(key: str, slot: _Slot) -> int:
    """Encoded size of the slot as it appears inside ``MemoryState`` (tag and length included)."""
    if isinstance(slot, bytes):
        content = _field_size(len(slot))
    else:
        content = _field_size(sum(_field_size(len(item)) for item in slot))
    return _field_size(_field_size(len(key.encode("utf-8"))) + content)


_VERSION_FIELD_SIZE = 2  # tag byte plus the one-byte varint of MEMORY_SCHEMA_VERSION


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
    decoded on first use, so an activation that never touches memory pays nothing.
    """

    __slots__ = ("_blob", "_changed", "_size", "_sizes", "_slots")

    def __init__(self, blob: bytes | None) -> None:
        self._blob = blob
        self._slots: dict[str, _Slot] | None = None
        self._sizes: dict[str, int] = {}
        self._size = 0
        self._changed = False

    def _loaded(self) -> dict[str, _Slot]:
        if self._slots is None:
            self._slots = {}
            self._size = _VERSION_FIELD_SIZE
            if self._blob:
                state = decode_versioned(MemoryState, self._blob, MEMORY_SCHEMA_VERSION)
                for slot in state.slots:
                    content: _Slot = (
                        list(slot.ring.items)
                        if slot.WhichOneof("content") == "ring"
                        else slot.value
                    )
                    self._slots[slot.key] = content
                    size = self._sizes[slot.key] = _slot_size(slot.key, content)
                    self._size += size
        return self._slots

    def _replace(self, key: str, new: _Slot | None) -> None:
        """Swap slot ``key`` for ``new`` (``None`` deletes), enforcing the cap first."""
        slots = self._loaded()
        sizes = self._sizes
        new_size = 0 if new is None else _slot_size(key, new)
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

    def get(self, key: str) -> bytes | None:
        """The value in slot ``key``, or ``None`` if there is none."""
        slot = self._loaded().get(_check_key(key))
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
        current = self._loaded().get(key, [])
        if isinstance(current, bytes):
            raise MemorySlotError(
                f"memory slot {key!r} holds a single value; delete it before using it as a ring"
            )
        self._replace(key, [*current, item][-max_items:])

    def ring(self, key: str) -> list[bytes]:
        """The items of the ring in slot ``key``, oldest first (empty if there is none)."""
        slot = self._loaded().get(_check_key(key), [])
        if isinstance(slot, bytes):
            raise MemorySlotError(f"memory slot {key!r} holds a single value; read it with get()")
        return list(slot)

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

    def encode(self) -> bytes:
        """The serialized ``MemoryState`` (slots sorted by key); ``b""`` when memory is empty."""
        slots = self._loaded()
        if not slots:
            return b""
        state = MemoryState(schema_version=MEMORY_SCHEMA_VERSION)
        for key in sorted(slots):
            content = slots[key]
            if isinstance(content, bytes):
                state.slots.append(MemorySlot(key=key, value=content))
            else:
                state.slots.append(MemorySlot(key=key, ring=RingItems(items=content)))
        return state.SerializeToString(deterministic=True)
