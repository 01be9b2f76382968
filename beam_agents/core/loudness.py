"""Every ``.errors`` record is logged, so that a failure is seen even if nobody reads ``.errors``.

``AgentDoFn`` owns one :class:`ErrorLog` and hands it each record it emits. A record becomes one
line on the logger ``beam_agents.core.loudness`` (WARNING; INFO for a routine
``orphaned_result``): the entity key, the reason, the detail and, for an exception, the last
frames of its traceback. At most ``limit`` lines are logged per
``interval_s`` seconds; the records past that are counted and reported in one summary line once
the interval is over (checked at the next record, at the end of a bundle and at teardown).
Records still all reach ``.errors``; only the log is limited. Nothing here runs without errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from beam_agents._protos import AgentError

logger = logging.getLogger(__name__)

LOG_LIMIT = 10
"""Records logged per interval by one ``DoFn`` instance (then summarized)."""
LOG_INTERVAL_S = 60.0
"""The rate limit's interval, in seconds."""
TRACEBACK_FRAMES = 3
"""Frames of a record's traceback shown in its log line (the innermost ones)."""
_EXPECTED_REASONS = frozenset({"orphaned_result"})
"""Logged at INFO: a late or duplicate answer is routine (e.g. an approval the effector refused
after the timeout route had already decided), and changes nothing."""
_MAX_KEY_CHARS = 80
_MAX_DETAIL_CHARS = 1024


class ErrorLog:
    """Logs ``.errors`` records at WARNING, at most ``limit`` per ``interval_s`` seconds."""

    __slots__ = ("_clock", "_interval_s", "_limit", "_logged", "_started", "suppressed")

    def __init__(
        self,
        limit: int = LOG_LIMIT,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._interval_s = interval_s
        self._clock = clock
        self._started = 0.0
        self._logged = 0
        self.suppressed = 0
        """Records not logged in the current interval (reported when it is over)."""

    def report(self, errors: Iterable[AgentError]) -> None:
        """Log each record, or count it once this interval's lines are used up."""
        for error in errors:
            now = self._clock()
            if self._logged and now - self._started >= self._interval_s:
                self._summarize()
            if not self._logged:
                self._started = now
            if self._logged < self._limit:
                self._logged += 1
                level = logging.INFO if error.reason in _EXPECTED_REASONS else logging.WARNING
                logger.log(level, "%s", log_line(error))
            else:
                self.suppressed += 1

    def flush(self, *, final: bool = False) -> None:
        """Report the records left unlogged if the interval is over (or, ``final``, at once)."""
        if self._logged and (final or self._clock() - self._started >= self._interval_s):
            self._summarize()

    def _summarize(self) -> None:
        if self.suppressed:
            logger.warning(
                "%d more .errors records were not logged (at most %d are logged per %gs; "
                "every record is still emitted on .errors)",
                self.suppressed,
                self._limit,
                self._interval_s,
            )
        self._logged = self.suppressed = 0


def log_line(error: AgentError) -> str:
    """One record as a log message: key, reason, seq, detail, the end of its traceback."""
    key = repr(error.entity_key)
    if len(key) > _MAX_KEY_CHARS:
        key = key[:_MAX_KEY_CHARS] + "..."
    detail = error.detail
    if len(detail) > _MAX_DETAIL_CHARS:
        detail = detail[:_MAX_DETAIL_CHARS] + "..."
    line = f".errors record {error.reason} for key {key} (seq {error.seq}): {detail}"
    if error.traceback:
        line += "\n" + traceback_tail(error.traceback, TRACEBACK_FRAMES)
    return line


def traceback_tail(text: str, frames: int) -> str:
    """The end of a formatted traceback, from its ``frames``-th last frame on."""
    lines = text.rstrip("\n").split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    first = starts[-frames] if len(starts) >= frames else (starts[0] if starts else 0)
    return "\n".join(lines[first:])
