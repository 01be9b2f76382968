"""Deterministic identifiers: intent ids and the name-based UUIDs behind them.

:func:`intent_id_for` is a pure function of key, seq and step, so a retried bundle that walks
the same path mints byte-identical intents. :func:`uuid5_hex` returns exactly
``uuid.uuid5(namespace, name).hex`` without building ``uuid.UUID`` objects (it is on the hot
path of every activation).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from typing import Any


@functools.cache
def _namespace_hash(namespace: uuid.UUID) -> Any:
    # The SHA-1 state after the namespace bytes: copying it skips rehashing them on every call.
    return hashlib.sha1(namespace.bytes)


def uuid5_hex(namespace: uuid.UUID, name: str) -> str:
    """``uuid.uuid5(namespace, name).hex``: 32 lowercase hex digits."""
    hasher = _namespace_hash(namespace).copy()
    hasher.update(name.encode("utf-8"))
    digest = bytearray(hasher.digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return digest.hex()


def hyphenated(hex32: str) -> str:
    """The canonical 8-4-4-4-12 string form of a 32-digit UUID hex."""
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


INTENT_NAMESPACE = uuid.UUID("396f639f-0714-5193-8a2d-3dad80bac0d8")
"""The uuid5 namespace of intent ids: ``uuid5(NAMESPACE_URL, "urn:beam-agents:intent")``.

Fixed forever. Changing it would change every intent id, and the effector deduplicates on them.
"""


def intent_id_for(entity_key: bytes, seq: int, step_index: int) -> str:
    """The id of the intent staged by run ``seq`` of ``entity_key`` at step ``step_index``.

    ``str(uuid5(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))``. A key's first
    run has ``seq == 0`` and its first step has ``step_index == 0``.
    """
    return hyphenated(uuid5_hex(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))
