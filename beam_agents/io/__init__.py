"""Beam transforms that connect a pipeline to the effector sidecar.

:class:`SubmitIntents` sends ``RunAgent(...).intents`` to an effector, :class:`ReadEnvelopes`
reads its envelope stream back for ``RunAgent``, and :class:`EffectorConnection` holds the
target, bearer token and TLS settings they share. :class:`WriteTraces` and
:class:`WriteErrors` store ``.traces`` and ``.errors`` in the effector, for its console. How to
close the loop on streaming and local runners is in ``beam_agents/io/README.md``.
:class:`ExportTraces` sends ``.traces`` to an OpenTelemetry collector over OTLP/HTTP.
:class:`WriteRecords` stores ``.records`` as files, for ``beam-agents replay`` and ``backtest``;
:class:`WriteRecordsToEffector` stores them in the effector, for ``beam-agents replay --effector``.
"""

from beam_agents.io.connection import EffectorConnection
from beam_agents.io.otlp import ExportTraces
from beam_agents.io.read import ReadEnvelopes
from beam_agents.io.records import WriteRecords, WriteRecordsToEffector
from beam_agents.io.submit import SubmitIntents, SubmitIntentsOutputs
from beam_agents.io.telemetry import WriteErrors, WriteTraces

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
