"""Backing off failed logins, per client address.

A client's first few wrong tokens are answered at once (people mistype); from then on each
failure doubles how long that client must wait before its next login attempt is even checked,
up to a minute. A login with the right token clears the client's count. Clients are forgotten
a while after their last failure, and at most :data:`MAX_CLIENTS` are remembered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FREE_FAILURES = 3
"""Failed logins a client may make before it has to wait."""
MAX_WAIT_S = 60.0
"""The longest wait between two login attempts of one client."""
FORGET_AFTER_S = 15 * 60.0
"""A client's failures are forgotten this long after its last one."""
MAX_CLIENTS = 10_000
"""Clients remembered at most (the longest-quiet are forgotten first)."""


class LoginThrottle:
    """Counts failed logins per client and says how long each must wait before the next."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}
        """Client address: failures in a row and when the last was; oldest last failure first."""

    def wait_s(self, client: str) -> float:
        """How long ``client`` must wait before its next login is checked; 0 for now."""
        count, last = self._failures.get(client, (0, 0.0))
        if count < FREE_FAILURES:
            return 0.0
        delay = min(MAX_WAIT_S, 2.0 ** (count - FREE_FAILURES))
        return max(0.0, last + delay - self._clock())

    def failed(self, client: str) -> int:
        """Count a failed login of ``client``; returns its failures in a row."""
        now = self._clock()
        count = self._failures.pop(client, (0, 0.0))[0] + 1
        self._failures[client] = (count, now)
        for quiet, (_, last) in list(self._failures.items()):
            if last > now - FORGET_AFTER_S and len(self._failures) <= MAX_CLIENTS:
                break
            del self._failures[quiet]
        return count

    def succeeded(self, client: str) -> None:
        """``client`` gave the right token: forget its failures."""
        self._failures.pop(client, None)
