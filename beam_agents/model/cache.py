"""The replay cache: committed model calls, kept in a key's state and replayed by position.

Each entry is keyed by the request's content digest together with ``(key, seq, step_index)``,
so a call is replayed only by the same run at the same step with the same request; two
identical requests in one activation sit at different steps and are two provider calls. The
stored value is the provider's raw body, rebuilt with ``decode_with(client, raw)``.

The cache is a ``ModelCache`` proto, oldest entry first, bounded both in entries and in
serialized bytes, evicting the oldest entries first. An entry bigger than the byte bound on its
own is not kept: the cache is an optimisation, and a miss only costs a provider call.
Nothing here imports Apache Beam.
"""

from __future__ import annotations

import dataclasses
import hashlib

from beam_agents._protos import ModelCache, ModelCacheEntry
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, decode_with

CACHE_SCHEMA_VERSION = 1
"""The ``ModelCache.schema_version`` this code writes and the newest it reads."""

DEFAULT_MAX_ENTRIES = 64
"""Default bound on the number of cached calls per key."""

DEFAULT_MAX_BYTES = 512 * 1024
"""Default bound on a key's serialized replay cache, in bytes."""


def replay_cache_key(request: LlmRequest, entity_key: bytes, seq: int, step_index: int) -> str:
    """The cache key of ``request`` made by run ``seq`` of ``entity_key`` at ``step_index``."""
    return cache_key_for_digest(request.content_digest(), entity_key, seq, step_index)


def cache_key_for_digest(request_digest: str, entity_key: bytes, seq: int, step_index: int) -> str:
    """:func:`replay_cache_key` for a request whose ``content_digest()`` is already known."""
    position = f"{request_digest}|{entity_key.hex()}|{seq}|{step_index}"
    return hashlib.sha256(position.encode("ascii")).hexdigest()


def replayed_response(client: object, entry: ModelCacheEntry) -> LlmResponse:
    """Rebuild the response stored in ``entry``, with the token usage recorded at the call."""
    response = decode_with(client, entry.response)
    usage = TokenUsage(input_tokens=entry.input_tokens, output_tokens=entry.output_tokens)
    return dataclasses.replace(response, usage=usage)


class ReplayCache:
    """A key's replay cache as one activation sees it: committed entries plus staged ones.

    Built from the decoded committed ``ModelCache`` (or ``None`` for an empty one);
    :meth:`encode` applies the bounds.
    """

    __slots__ = ("_by_key", "_changed", "_max_bytes", "_max_entries")

    def __init__(self, committed: ModelCache | None, *, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._by_key: dict[str, ModelCacheEntry] = (
            {} if committed is None else {entry.cache_key: entry for entry in committed.entries}
        )
        self._changed = False

    def lookup(self, cache_key: str) -> ModelCacheEntry | None:
        """The entry stored under ``cache_key``, or ``None``."""
        return self._by_key.get(cache_key)

    def record(self, entry: ModelCacheEntry) -> None:
        """Stage ``entry`` as the newest one."""
        self._by_key.pop(entry.cache_key, None)
        self._by_key[entry.cache_key] = entry
        self._changed = True

    @property
    def changed(self) -> bool:
        """Whether this activation recorded anything."""
        return self._changed

    def __len__(self) -> int:
        return len(self._by_key)

    def encode(self) -> bytes:
        """The serialized, bounded ``ModelCache``; ``b""`` when nothing is kept."""
        entries = list(self._by_key.values())[-self._max_entries :]
        cache = ModelCache(schema_version=CACHE_SCHEMA_VERSION, entries=entries)
        while cache.entries and cache.ByteSize() > self._max_bytes:
            del cache.entries[0]
        if not cache.entries:
            return b""
        return cache.SerializeToString(deterministic=True)
