"""Helpers for testing pipelines that use ``RunAgent``.

:class:`FailFirstCommit` forces a bundle retry at an activation's commit, :func:`epoch_clock`
is the processing clock of a ``TestStream`` pipeline on the DirectRunner, and
:class:`EnvelopeStream` builds such a ``TestStream`` of envelopes, which
:func:`streaming_pipeline` runs. See "Testing helpers" in
``beam_agents/README.md``.
"""

from beam_agents.testing.retry import FailFirstCommit, ForcedRetryError
from beam_agents.testing.stream import EnvelopeStream, epoch_clock, streaming_pipeline

__all__ = [
    "EnvelopeStream",
    "FailFirstCommit",
    "ForcedRetryError",
    "epoch_clock",
    "streaming_pipeline",
]
