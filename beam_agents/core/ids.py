"""Deterministic identifiers: intent ids and the name-based UUIDs behind them.

:func:`intent_id_for` is a pure function of key, seq, step and the optional intent namespace
(``AgentConfig.namespace``), so a retried bundle that walks the same path mints byte-identical
intents. :func:`uuid5_hex` returns exactly ``uuid.uuid5(namespace, name).hex`` without building
``uuid.UUID`` objects (it is on the hot path of every activation).
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


@functools.lru_cache(maxsize=256)
def namespace_uuid(namespace: str) -> uuid.UUID:
    """The uuid5 namespace of the intent ids minted under ``AgentConfig.namespace``.

    ``uuid5(INTENT_NAMESPACE, "namespace:" + namespace)``: fixed for a given name, distinct for
    distinct names (and from ``INTENT_NAMESPACE`` itself).
    """
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"an intent namespace must be a non-empty str, got {namespace!r}")
    return uuid.uuid5(INTENT_NAMESPACE, f"namespace:{namespace}")


def intent_id_for(
    entity_key: bytes, seq: int, step_index: int, namespace: str | None = None
) -> str:
    """The id of the intent staged by run ``seq`` of ``entity_key`` at step ``step_index``.

    ``str(uuid5(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))`` without a
    namespace (the ids minted before namespaces existed, unchanged); with one, the same name
    under :func:`namespace_uuid` instead of ``INTENT_NAMESPACE``. A key's first run has
    ``seq == 0`` and its first step has ``step_index == 0``.
    """
    space = INTENT_NAMESPACE if namespace is None else namespace_uuid(namespace)
    return hyphenated(uuid5_hex(space, f"{entity_key.hex()}|{seq}|{step_index}"))
