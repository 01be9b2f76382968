"""Processing-time clocks: where suspension deadlines are placed, and whether they can be read.

Deadlines live on the runner's processing-time clock. Production runners and Beam's local
``FnApiRunner`` keep wall-clock time, which the runtime reads to refuse a timer that fires early.
The DirectRunner plays a ``TestStream`` on a test clock that starts at the epoch and moves only
on ``advance_processing_time``; a ``DoFn`` cannot read it, so there the runner's timer decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable

ProcessingClock = Callable[[], float]
"""Seconds since the epoch on the runner's processing-time clock."""


def epoch_clock() -> float:
    """The DirectRunner's ``TestStream`` clock as a ``DoFn`` sees it: always the epoch.

    A deadline is then ``timeout_ms`` after 0, and advancing processing time past it fires the
    timeout route (a suspension made after the stream advanced past ``timeout_ms`` is due at
    once). ``RunAgent`` picks it by itself for input fed by a ``TestStream``.
    """
    return 0.0


def wall_clock() -> float:
    """Wall-clock seconds since the epoch: every runner's processing time outside tests."""
    return time.time()


def resolved(clock: ProcessingClock | None) -> ProcessingClock:
    """``clock``, or the wall clock when none was chosen."""
    return wall_clock if clock is None else clock


def is_readable(clock: ProcessingClock | None) -> bool:
    """Whether ``clock`` tells the runner's current time (every clock but the test clock's)."""
    return clock is not epoch_clock
