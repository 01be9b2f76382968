"""Backing off from a failing store: growing waits between retries, one line when it recovers.

The worker retries every store operation that fails (claiming work, recording results, keeping
house), because nothing it holds may be dropped. :class:`StoreOutage` paces those retries: the
wait after an operation's ``n``-th failure in a row is ``INITIAL_RETRY_S * 2**(n-1)``, capped at
``MAX_RETRY_S`` (0.5, 1, 2, 4, 8, 10, 10, ... seconds), each retry logged at WARNING. An outage
starts at the first failure of any operation and ends once every operation that failed has
succeeded again; its end is logged once, at INFO, with how long it lasted and how many
attempts failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

_log = logging.getLogger(__name__)

INITIAL_RETRY_S = 0.5
"""The wait after an operation's first failure."""
MAX_RETRY_S = 10.0
"""The longest wait between two attempts of one operation."""


def retry_delay_s(
    failures: int, *, initial_s: float = INITIAL_RETRY_S, cap_s: float = MAX_RETRY_S
) -> float:
    """The wait after the ``failures``-th failure in a row (from 1): doubling, capped."""
    if failures < 1:
        raise ValueError(f"failures counts from 1, got {failures}")
    return min(cap_s, initial_s * 2.0 ** min(failures - 1, 64))


class StoreOutage:
    """Consecutive store failures per operation, their retry waits, and the recovery line."""

    def __init__(
        self,
        *,
        initial_s: float = INITIAL_RETRY_S,
        cap_s: float = MAX_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._initial_s = initial_s
        self._cap_s = cap_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        """Consecutive failures of each operation that is failing now."""
        self._started: float | None = None
        self._failed_attempts = 0

    @property
    def failing(self) -> bool:
        """Whether some operation failed and has not succeeded since."""
        return bool(self._failures)

    def failed(self, operation: str, error: BaseException) -> float:
        """Count a failure of ``operation`` and log it; returns the seconds to wait to retry."""
        failures = self._failures.get(operation, 0) + 1
        self._failures[operation] = failures
        self._failed_attempts += 1
        if self._started is None:
            self._started = self._clock()
        delay = retry_delay_s(failures, initial_s=self._initial_s, cap_s=self._cap_s)
        _log.warning(
            "%s failed (%d in a row), retrying in %.1f s: %s", operation, failures, delay, error
        )
        return delay

    def succeeded(self, operation: str) -> None:
        """Note that ``operation`` worked; once every failing one has, log the recovery."""
        if self._failures.pop(operation, None) is None or self._failures:
            return
        assert self._started is not None
        _log.info(
            "store recovered after %.1f s / %d failed attempts",
            self._clock() - self._started,
            self._failed_attempts,
        )
        self._started = None
        self._failed_attempts = 0
