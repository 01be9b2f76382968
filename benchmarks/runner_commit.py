# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Beam's commit of each key's state at a bundle's end, timed inside a real pipeline.

On ``FnApiRunner`` a stateful DoFn's state lives in the SDK harness's state objects during a
bundle; at the bundle's end Beam's user-state context commits every key's cells to the runner
(encoding the values, sending them, and putting them in its state cache, which weighs each one).
:func:`timing_commits` wraps that commit and the cache's weighing within it (thread CPU), so a
benchmark reads what a commit costs per key, in the same runs it times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from apache_beam.runners.worker import bundle_processor, statecache


@dataclass
class CommitClock:
    """Thread CPU ns of Beam's user-state commits, and of the cache weighing within them."""

    commit_ns: int = 0
    weigh_ns: int = 0
    commits: int = 0
    _committing: bool = False

    def reset(self) -> None:
        """Forget what was timed so far."""
        self.commit_ns = self.weigh_ns = self.commits = 0


@dataclass(frozen=True)
class KeyCommit:
    """Microseconds of thread CPU per key committed: all of it, and the cache weighing within."""

    commit_us: float
    weigh_us: float


@contextmanager
def timing_commits() -> Iterator[CommitClock]:
    """Time every user-state commit (and the state cache's weighing inside one) while open."""
    clock = CommitClock()
    commit = bundle_processor.FnApiUserStateContext.commit
    weigh = statecache.get_deep_size

    def timed_commit(self: Any) -> None:
        started = time.thread_time_ns()
        clock._committing = True
        try:
            commit(self)
        finally:
            clock._committing = False
            clock.commit_ns += time.thread_time_ns() - started
            clock.commits += 1

    def timed_weigh(*objs: Any) -> int:
        if not clock._committing:
            return weigh(*objs)
        started = time.thread_time_ns()
        try:
            return weigh(*objs)
        finally:
            clock.weigh_ns += time.thread_time_ns() - started

    bundle_processor.FnApiUserStateContext.commit = timed_commit  # type: ignore[method-assign]
    statecache.get_deep_size = timed_weigh
    try:
        yield clock
    finally:
        bundle_processor.FnApiUserStateContext.commit = commit  # type: ignore[method-assign]
        statecache.get_deep_size = weigh


def per_key(clock: CommitClock, keys: int) -> KeyCommit:
    """What the clock timed, per key (every key of the run committed once per bundle)."""
    if not clock.commits:
        raise RuntimeError("no user-state commit was timed: is the stage stateful?")
    return KeyCommit(clock.commit_ns / keys / 1000, clock.weigh_ns / keys / 1000)


def commit_of(run: Callable[[], object], clock: CommitClock, keys: int) -> KeyCommit:
    """Run ``run`` (one pipeline over ``keys`` keys) and return its commit per key."""
    clock.reset()
    run()
    return per_key(clock, keys)
