"""Forcing bundle retries at an activation's commit, to test retry determinism.

:class:`FailFirstCommit` is an ``AgentConfig.before_commit`` hook that fails the first commit
of each matching activation once; its markers live on disk, so a fresh ``DoFn`` still sees them.
"""

from __future__ import annotations

import os
from pathlib import Path

from beam_agents.core.config import CommitInfo


class ForcedRetryError(RuntimeError):
    """Raised by :class:`FailFirstCommit` to fail a bundle on purpose."""


class FailFirstCommit:
    """Fails the first commit of every matching activation, once; later attempts pass.

    Pass it as ``AgentConfig(before_commit=FailFirstCommit(directory, ...))``. A commit matches
    when it has the given ``trigger`` (``"event"``, ``"tool_result"``, ``"approval"``,
    ``"deadline"``, ``"idle"``) and ``entity_key``, each when given. The first time a matching
    activation reaches its commit, a marker file named after it is created in ``directory`` and
    :class:`ForcedRetryError` fails the bundle; the retried bundle walks the same activation,
    finds the marker and commits. Markers live on disk because a runner may retry with a
    freshly deserialized ``DoFn``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        trigger: str | None = None,
        entity_key: bytes | None = None,
    ) -> None:
        self._directory = os.fspath(directory)
        self._trigger = trigger
        self._entity_key = entity_key

    def __call__(self, info: CommitInfo) -> None:
        """Fail ``info``'s commit if it matches and has not been failed before."""
        if self._trigger is not None and info.trigger != self._trigger:
            return
        if self._entity_key is not None and info.entity_key != self._entity_key:
            return
        directory = Path(self._directory)
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / f"{info.entity_key.hex()}-{info.seq}-{info.trigger}-{info.first_step}"
        try:
            marker.open("x").close()
        except FileExistsError:
            return
        raise ForcedRetryError(
            f"forced failure of the first commit of {info.trigger} activation seq {info.seq} "
            f"(step {info.first_step}) on key {info.entity_key!r}; the runner retries the bundle"
        )

    def forced(self) -> list[str]:
        """The names of the commits failed so far (one marker per failed activation)."""
        directory = Path(self._directory)
        return sorted(path.name for path in directory.iterdir()) if directory.exists() else []
