"""Helpers for testing pipelines that use ``RunAgent``.

- :class:`FailFirstCommit`: an ``AgentConfig.before_commit`` hook that fails the first commit
  of each matching activation (or timer firing), so that the runner retries the bundle; it
  records what it already failed in a directory it owns, so it works across retries even when
  the runner deserializes a fresh ``DoFn``. Use it with Beam's ``BundleBasedDirectRunner``,
  which retries failed bundles (the batch ``FnApiRunner`` does not).
- :func:`epoch_clock`: the processing-time clock of a ``TestStream`` pipeline on the
  DirectRunner, for ``AgentConfig.processing_clock``.
- :class:`EnvelopeStream`: builds a ``TestStream`` of ``(key, AgentEnvelope)`` elements
  (external events, tool results, approvals) interleaved with watermark and processing-time
  advances, standing in for an event source plus the effector.
"""

from beam_agents.testing.retry import FailFirstCommit, ForcedRetryError
from beam_agents.testing.stream import EnvelopeStream, epoch_clock

__all__ = ["EnvelopeStream", "FailFirstCommit", "ForcedRetryError", "epoch_clock"]
