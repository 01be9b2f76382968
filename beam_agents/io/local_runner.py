# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""The DirectRunner's choice for a pipeline that reads the effector: its ``FnApiRunner``.

Beam's default ``DirectRunner`` hands a pipeline with processing-time timers (``RunAgent``'s
deadlines) to its bundle-based runner, which cannot run ``ReadEnvelopes``' unbounded read.
``ReadEnvelopes`` therefore asks the default runner to run such a pipeline on the
``FnApiRunner`` instead, the runner the DirectRunner itself uses for every other local pipeline.
"""

from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.direct.direct_runner import (
    BundleBasedDirectRunner,
    SwitchingDirectRunner,
)
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream

_log = logging.getLogger(__name__)


class LoopRunner(FnApiRunner):
    """The ``FnApiRunner``, refusing a ``TestStream`` (which it cannot play) before it starts."""

    def run_pipeline(self, pipeline: beam.Pipeline, options: Any) -> Any:
        """Run on the ``FnApiRunner`` unless a ``TestStream`` needs the bundle-based runner."""
        if _has_test_stream(pipeline):
            raise ValueError(
                "ReadEnvelopes and TestStream cannot share a pipeline on the DirectRunner: "
                "feed RunAgent from one of them (beam_agents.testing.EnvelopeStream replays "
                "results without an effector)"
            )
        return super().run_pipeline(pipeline, options)


def prefer_fn_api_runner(pipeline: beam.Pipeline) -> None:
    """Run ``pipeline`` on :class:`LoopRunner` if it is on the default ``DirectRunner``.

    Raises ``ValueError`` on the bundle-based runner, which cannot run the read.
    """
    if isinstance(pipeline.runner, BundleBasedDirectRunner):
        raise ValueError(
            "ReadEnvelopes cannot run on BundleBasedDirectRunner (it cannot run an unbounded "
            "read): use beam.Pipeline() or beam.Pipeline(runner=FnApiRunner())"
        )
    if type(pipeline.runner) is SwitchingDirectRunner:
        _log.info("ReadEnvelopes: the DirectRunner runs this pipeline on its FnApiRunner")
        pipeline.runner = LoopRunner()


def _has_test_stream(pipeline: beam.Pipeline) -> bool:
    class _Finder(PipelineVisitor):
        found = False

        def visit_transform(self, applied: Any) -> None:
            self.found = self.found or isinstance(applied.transform, TestStream)

    finder = _Finder()
    pipeline.visit(finder)
    return finder.found
