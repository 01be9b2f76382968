"""The Beam glue: the only package that imports Apache Beam (``testing`` aside).

``run_agent`` holds ``RunAgent``, ``effector_link`` the transforms that talk to the effector and
``sinks`` the outputs' writers. Closing the loop on each runner: ``docs/loop.md``.
"""

from beam_agents.io.effector_link import (
    EffectorConnection,
    ReadEnvelopes,
    SubmitIntents,
    SubmitIntentsOutputs,
)
from beam_agents.io.sinks import (
    ExportTraces,
    WriteErrors,
    WriteRecords,
    WriteRecordsToEffector,
    WriteTraces,
)

__all__ = [
    "EffectorConnection",
    "ExportTraces",
    "ReadEnvelopes",
    "SubmitIntents",
    "SubmitIntentsOutputs",
    "WriteErrors",
    "WriteRecords",
    "WriteRecordsToEffector",
    "WriteTraces",
]
