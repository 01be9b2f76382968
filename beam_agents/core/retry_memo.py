"""``AnswerMemo``: provider answers kept in the worker process, so a retried bundle repeats none.

An activation whose commit fails (its bundle is retried) committed nothing, its replay-cache
entries included. The memo keeps each fresh answer by its replay-cache key (request digest,
key, run and step) in a bounded, process-wide store scoped to one ``RunAgent``, so the retried
activation, asking the same thing at the same position, gets the same answer without calling
the provider again (and records the same trace). A retry on another worker calls the provider.
A memo answer skips the gateway's retries, circuit breaker and call counters: nothing is sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Generic, Protocol, TypeVar

from beam_agents.model.client import LlmResponse


class _Answer(Protocol):
    @property
    def response(self) -> LlmResponse: ...


_A = TypeVar("_A", bound=_Answer)

MEMO_MAX_ENTRIES = 1_024
"""Answers one ``RunAgent`` keeps per process, oldest dropped first."""
MEMO_MAX_BYTES = 16 << 20
"""Raw response bytes one ``RunAgent`` keeps per process, oldest dropped first."""


class AnswerMemo(Generic[_A]):
    """A bounded, thread-safe map from replay-cache key to the provider's answer."""

    def __init__(self, max_entries: int = MEMO_MAX_ENTRIES, max_bytes: int = MEMO_MAX_BYTES):
        self._answers: OrderedDict[str, _A] = OrderedDict()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, cache_key: str) -> _A | None:
        """The answer kept for ``cache_key``, if any."""
        with self._lock:
            return self._answers.get(cache_key)

    def put(self, cache_key: str, answer: _A) -> None:
        """Keep ``answer``; drop the oldest answers past the bounds."""
        size = len(answer.response.response)
        if size > self._max_bytes:
            return
        with self._lock:
            previous = self._answers.pop(cache_key, None)
            if previous is not None:
                self._bytes -= len(previous.response.response)
            self._answers[cache_key] = answer
            self._bytes += size
            while len(self._answers) > self._max_entries or self._bytes > self._max_bytes:
                _, dropped = self._answers.popitem(last=False)
                self._bytes -= len(dropped.response.response)

    def __len__(self) -> int:
        return len(self._answers)


MEMO_MAX_SCOPES = 8
"""``RunAgent``s a process keeps memos for, the least recently set up dropped first (a test
suite or a notebook builds many pipelines in one process)."""

_MEMOS: OrderedDict[str, AnswerMemo[Any]] = OrderedDict()
_MEMOS_LOCK = threading.Lock()


def answer_memo(scope: str) -> AnswerMemo[Any]:
    """The process's memo for ``scope`` (one per ``RunAgent``), created on first use."""
    with _MEMOS_LOCK:
        memo = _MEMOS.pop(scope, None)
        if memo is None:
            memo = AnswerMemo()
        _MEMOS[scope] = memo
        while len(_MEMOS) > MEMO_MAX_SCOPES:
            _MEMOS.popitem(last=False)
        return memo
