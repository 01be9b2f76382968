# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Helpers for testing pipelines that use ``RunAgent`` (``docs/loop.md``, "Testing")."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, ProtoCoder, TupleCoder
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from beam_agents._protos import AgentEnvelope, Approval, ToolResult
from beam_agents.core.agent import epoch_clock
from beam_agents.core.config import CommitInfo

__all__ = [
    "EnvelopeStream",
    "FailFirstCommit",
    "ForcedRetryError",
    "epoch_clock",
    "streaming_pipeline",
]


class ForcedRetryError(RuntimeError):
    """Raised by :class:`FailFirstCommit` to fail a bundle on purpose."""


class FailFirstCommit:
    """Fails the first commit of every matching activation, once; later attempts pass.

    Pass it as ``AgentConfig(before_commit=FailFirstCommit(directory, ...))``. A commit matches
    the given ``trigger`` and ``entity_key``, each when given. A marker file in ``directory``
    remembers each failed commit, since a runner may retry with a fresh ``DoFn``.
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


def streaming_pipeline() -> beam.Pipeline:
    """A streaming pipeline on the DirectRunner's bundle-based runner, for an ``EnvelopeStream``."""
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return beam.Pipeline(runner=BundleBasedDirectRunner(), options=options)


class EnvelopeStream:
    """Builds a ``TestStream`` of ``(key, AgentEnvelope)`` pairs for ``RunAgent``.

    Each envelope is its own step (and bundle), timestamped with its event time.
    """

    def __init__(self) -> None:
        # (what, value) steps, replayed onto a fresh TestStream by build().
        self._steps: list[tuple[str, object]] = []

    def envelope(self, envelope: AgentEnvelope) -> EnvelopeStream:
        """Add ``envelope`` as the element ``(envelope.entity_key, envelope)``."""
        element = (envelope.entity_key, envelope)
        self._steps.append(("elements", [TimestampedValue(element, envelope.event_time_ms / 1000)]))
        return self

    def envelopes(self, envelopes: Iterable[AgentEnvelope]) -> EnvelopeStream:
        """Add several envelopes, in order."""
        for envelope in envelopes:
            self.envelope(envelope)
        return self

    def event(self, key: bytes, payload: bytes, *, at_ms: int) -> EnvelopeStream:
        """Add an external event."""
        return self.envelope(
            AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=payload)
        )

    def result(
        self,
        key: bytes,
        intent_id: str,
        *,
        at_ms: int,
        payload: bytes = b"",
        status: ToolResult.Status = ToolResult.OK,
        error_message: str = "",
    ) -> EnvelopeStream:
        """Add a tool result for ``intent_id``, as the effector would publish it."""
        result = ToolResult(
            intent_id=intent_id,
            entity_key=key,
            status=status,
            payload=payload,
            error_message=error_message,
            completed_at_ms=at_ms,
            attempt=1,
        )
        return self.envelope(AgentEnvelope(entity_key=key, event_time_ms=at_ms, tool_result=result))

    def approval(
        self, key: bytes, intent_id: str, *, approved: bool, at_ms: int, approver: str = "tester"
    ) -> EnvelopeStream:
        """Add an approval decision for ``intent_id``."""
        decision = Approval(
            intent_id=intent_id, approved=approved, approver=approver, decided_at_ms=at_ms
        )
        return self.envelope(AgentEnvelope(entity_key=key, event_time_ms=at_ms, approval=decision))

    def advance_watermark_to(self, at_ms: int) -> EnvelopeStream:
        """Advance the event-time watermark to ``at_ms``."""
        self._steps.append(("watermark", at_ms / 1000))
        return self

    def advance_processing_time(self, by_ms: int) -> EnvelopeStream:
        """Advance the processing-time clock by ``by_ms`` (fires due deadline timers)."""
        self._steps.append(("processing_time", by_ms / 1000))
        return self

    def build(self) -> beam.PTransform[Any, Any]:
        """The finished ``TestStream``, typed ``tuple[bytes, AgentEnvelope]``."""
        stream = TestStream(coder=TupleCoder([BytesCoder(), ProtoCoder(AgentEnvelope)]))
        for what, value in self._steps:
            if what == "elements":
                stream.add_elements(value)
            elif what == "watermark":
                stream.advance_watermark_to(value)
            else:
                stream.advance_processing_time(value)
        stream.advance_watermark_to_infinity()
        typed: beam.PTransform[Any, Any] = stream.with_output_types(tuple[bytes, AgentEnvelope])
        return typed
