"""The runtime's Beam glue: the ``RunAgent`` transform and its DoFn, effector I/O and the sinks.

``run_agent`` holds ``RunAgent``, ``effector_link`` the transforms that talk to the effector,
``budget_leases`` a worker's leases on fleet budgets, and ``sinks`` the outputs' writers.
Closing the loop on each runner: ``docs/loop.md``.
``core``, ``model`` and ``tools`` import no Beam; ``replay`` and ``testing`` build pipelines of
their own, and the Pydantic AI adapter uses Beam's pickler.
"""

from beam_agents.io.budget_leases import BudgetUnavailableError
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
    "BudgetUnavailableError",
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
