"""The replay cache: committed model calls, kept in a key's state and replayed by position.

An entry is keyed by the request's content digest with ``(key, seq, step_index)`` and stores
the provider's raw body, rebuilt with ``decode_with(client, raw)``. The cache is a bounded
``ModelCache`` proto (entries and bytes, oldest evicted first). Details in
``beam_agents/model/README.md``.
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

    Built from the decoded committed ``ModelCache`` (or ``None`` for an empty one), which it
    never modifies, and, if at hand, the bytes it was decoded from (``serialized``), which
    spares serializing it again; :meth:`encode` applies the bounds.

    Committed entries are not indexed up front: wrapping each of them in a Python object would
    cost more than the rest of a model call's bookkeeping at a full cache. An entry stores its
    key verbatim, so a key whose bytes occur nowhere in the serialized committed cache is in no
    entry; only a key that passes that test (a replay) makes the entries indexed.
    """

    __slots__ = (
        "_absent",
        "_committed",
        "_committed_blob",
        "_index",
        "_max_bytes",
        "_max_entries",
        "_staged",
        "_superseded",
    )

    def __init__(
        self,
        committed: ModelCache | None,
        *,
        max_entries: int,
        max_bytes: int,
        serialized: bytes | None = None,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._committed = committed if committed is not None and committed.entries else None
        self._committed_blob = serialized
        self._index: dict[str, int] | None = None
        self._absent: set[str] = set()
        """Keys the byte test ruled out (a miss is looked up, then recorded)."""
        self._superseded: set[int] = set()
        """Positions of committed entries replaced by a staged one with the same key."""
        self._staged: dict[str, ModelCacheEntry] = {}

    def _committed_position(self, cache_key: str) -> int | None:
        committed = self._committed
        if committed is None:
            return None
        if self._index is None:
            if cache_key in self._absent:
                return None
            if self._committed_blob is None:
                self._committed_blob = committed.SerializeToString()
            if cache_key.encode() not in self._committed_blob:
                self._absent.add(cache_key)
                return None
            self._index = {entry.cache_key: at for at, entry in enumerate(committed.entries)}
        return self._index.get(cache_key)

    def lookup(self, cache_key: str) -> ModelCacheEntry | None:
        """The entry stored under ``cache_key``, or ``None``."""
        staged = self._staged.get(cache_key)
        if staged is not None:
            return staged
        position = self._committed_position(cache_key)
        if position is None or self._committed is None:
            return None
        return self._committed.entries[position]

    def record(self, entry: ModelCacheEntry) -> None:
        """Stage ``entry`` as the newest one."""
        cache_key = entry.cache_key
        self._staged.pop(cache_key, None)
        self._staged[cache_key] = entry
        position = self._committed_position(cache_key)
        if position is not None:
            self._superseded.add(position)

    @property
    def changed(self) -> bool:
        """Whether this activation recorded anything."""
        return bool(self._staged)

    def __len__(self) -> int:
        committed = self._committed
        kept = 0 if committed is None else len(committed.entries) - len(self._superseded)
        return kept + len(self._staged)

    def encode(self) -> bytes:
        """The serialized, bounded ``ModelCache``; ``b""`` when nothing is kept."""
        cache = ModelCache()
        if self._committed is not None:
            # One copy in C, then trimmed in place: far cheaper than rebuilding the message
            # from Python objects for every committed entry.
            cache.CopyFrom(self._committed)
            for position in sorted(self._superseded, reverse=True):
                del cache.entries[position]
        cache.schema_version = CACHE_SCHEMA_VERSION
        entries = cache.entries
        staged = list(self._staged.values())
        excess = len(entries) + len(staged) - self._max_entries
        if excess > 0:
            dropped = min(excess, len(entries))
            del entries[:dropped]
            staged = staged[excess - dropped :]
        entries.extend(staged)
        if not entries:
            return b""
        blob = cache.SerializeToString(deterministic=True)
        if len(blob) <= self._max_bytes:
            return blob
        while entries and cache.ByteSize() > self._max_bytes:
            del entries[0]
        if not entries:
            return b""
        return cache.SerializeToString(deterministic=True)
