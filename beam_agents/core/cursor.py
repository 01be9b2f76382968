"""``ReplayCursor``: the step cursor of one activation and the replay prefix it walks.

Each model call and each staged intent takes the next step. Below the run's high-water mark a
step that repeats the recorded one is a replay; the first that differs ends replay and takes a
fresh position from the high-water mark on (``core/README.md``, "The replay prefix").
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import Continuation

StepRecord = Continuation.StepRecord
"""One recorded step of a run (kind and content digest), as the continuation stores it."""


class ReplayCursor:
    """Hands out step positions, replaying the run's recorded steps while they match."""

    __slots__ = ("_high_water", "_recorded", "_replay_end", "_step", "new_steps")

    def __init__(self, first_step: int, recorded: Sequence[StepRecord] = ()) -> None:
        self._recorded = recorded
        self._high_water = first_step
        # A run's steps are recorded from its first one, so the replay prefix is all of them;
        # a continuation written before steps were recorded has fewer records than steps, and
        # its unrecorded positions can only be skipped.
        self._replay_end = min(len(recorded), first_step)
        self._step = 0 if self._replay_end else first_step
        self.new_steps: list[tuple[int, bytes]] = []
        """``(StepRecord kind, digest)`` of every fresh step taken, in order."""

    @property
    def next_step(self) -> int:
        """The position the next step takes if it repeats the record (or is fresh)."""
        return self._step

    @property
    def high_water_step(self) -> int:
        """The first position no activation of this run has taken yet."""
        return max(self._step, self._high_water)

    def would_replay(self, kind: int, digest: bytes) -> bool:
        """Whether taking a step of ``kind`` and ``digest`` now would replay the run's record."""
        step = self._prefix_step()
        if step >= self._replay_end:
            return False
        record = self._recorded[step]
        return record.kind == kind and record.digest == digest

    def take(self, kind: int, digest: bytes) -> tuple[int, bool]:
        """Take the next step for an operation of ``kind`` with content ``digest``.

        Returns the step's position and whether it repeats the run's record there (a replay).
        """
        step = self._prefix_step()
        replay_end = self._replay_end
        if step < replay_end:
            record = self._recorded[step]
            if record.kind == kind and record.digest == digest:
                following = step + 1
                self._step = following if following < replay_end else self._high_water
                return step, True
            self._replay_end = 0
            step = self._high_water
        elif step != self._step:  # stepped over the prefix's last records
            step = self._high_water
        self._step = step + 1
        self.new_steps.append((kind, digest))
        return step, False

    def _prefix_step(self) -> int:
        """The position of the record the next step is compared with (or past the prefix)."""
        step = self._step
        # An escalation's approval is the runtime's step, never the agent's: step over it.
        while step < self._replay_end and self._recorded[step].kind == StepRecord.ESCALATION:
            step += 1
        return step
