"""Replay and backtest: recorded activations read back, re-run offline, and compared.

``main`` is the ``beam-agents`` command (``replay`` and ``backtest``); ``run_backtest`` runs a
backtest as a Beam batch pipeline, and ``render_markdown`` prints its report.
"""

from beam_agents.replay.backtest import Price, render_markdown, run_backtest
from beam_agents.replay.cli import main
from beam_agents.replay.inputs import (
    EnvelopeFileError,
    RecordFileError,
    WriteEnvelopes,
    by_key,
    read_records,
    write_envelopes,
)
from beam_agents.replay.replay import RunReport, exit_status, replay

__all__ = [
    "EnvelopeFileError",
    "Price",
    "RecordFileError",
    "RunReport",
    "WriteEnvelopes",
    "by_key",
    "exit_status",
    "main",
    "read_records",
    "render_markdown",
    "replay",
    "run_backtest",
    "write_envelopes",
]
