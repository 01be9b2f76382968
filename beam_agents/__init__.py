"""beam-agents: LLM agents as keyed, stateful, fault-tolerant Apache Beam transforms.

The ``TYPE_CHECKING`` imports below are the one list of public names: type checkers read them,
and at runtime the same statements are read as a table, each name imported on first use. So
``import beam_agents`` never pulls in Apache Beam.
"""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

_APITOOLS_NOTICE = "apitools not found"  # logged by ``import apache_beam`` without apitools


def _drop_apitools_notice(record: logging.LogRecord) -> bool:
    """Drop only Beam's "apitools not found" root-logger record; pass every other record."""
    return not (record.name == "root" and record.getMessage().startswith(_APITOOLS_NOTICE))


def _quiet_apitools_notice() -> None:
    """Install :func:`_drop_apitools_notice` on the root logger, once."""
    root = logging.getLogger()
    named = (getattr(existing, "__qualname__", None) for existing in root.filters)
    if _drop_apitools_notice.__qualname__ not in named:
        root.addFilter(_drop_apitools_notice)


_quiet_apitools_notice()

if TYPE_CHECKING:
    from beam_agents._protos import AgentEnvelope as AgentEnvelope
    from beam_agents._protos import AgentError as AgentError
    from beam_agents._protos import Approval as Approval
    from beam_agents._protos import IntentState as IntentState
    from beam_agents._protos import ToolIntent as ToolIntent
    from beam_agents._protos import ToolResult as ToolResult
    from beam_agents._protos import TraceEvent as TraceEvent
    from beam_agents._protos import canonical_json as canonical_json
    from beam_agents._protos import canonical_json_bytes as canonical_json_bytes
    from beam_agents.core.agent import BudgetExceeded as BudgetExceeded
    from beam_agents.core.agent import Complete as Complete
    from beam_agents.core.agent import Suspend as Suspend
    from beam_agents.core.agent import intent_id_for as intent_id_for
    from beam_agents.core.config import AgentConfig as AgentConfig
    from beam_agents.core.config import Budget as Budget
    from beam_agents.core.context import ActivationContext as ActivationContext
    from beam_agents.hitl import Deny as Deny
    from beam_agents.hitl import Drop as Drop
    from beam_agents.hitl import Escalate as Escalate
    from beam_agents.hitl import FallbackContext as FallbackContext
    from beam_agents.hitl import HitlPolicy as HitlPolicy
    from beam_agents.hitl import Route as Route
    from beam_agents.io import EffectorConnection as EffectorConnection
    from beam_agents.io import ExportTraces as ExportTraces
    from beam_agents.io import ReadEnvelopes as ReadEnvelopes
    from beam_agents.io import SubmitIntents as SubmitIntents
    from beam_agents.io import WriteErrors as WriteErrors
    from beam_agents.io import WriteRecords as WriteRecords
    from beam_agents.io import WriteRecordsToEffector as WriteRecordsToEffector
    from beam_agents.io import WriteTraces as WriteTraces
    from beam_agents.io.run_agent import RunAgent as RunAgent
    from beam_agents.io.run_agent import RunAgentOutputs as RunAgentOutputs
    from beam_agents.model import FakeLLM as FakeLLM
    from beam_agents.model import LlmRequest as LlmRequest
    from beam_agents.model import LlmResponse as LlmResponse
    from beam_agents.tools import IntentInfo as IntentInfo
    from beam_agents.tools import Reconciled as Reconciled
    from beam_agents.tools import ToolRegistry as ToolRegistry
    from beam_agents.tools import tool as tool


def _exports() -> dict[str, str]:
    """Each public name and its module, read from the ``TYPE_CHECKING`` imports above."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: str(node.module)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_EXPORTS = _exports()
__all__ = [*_EXPORTS, "__version__"]

__version__: str
"""The installed distribution's version (``0+unknown`` in a source tree never installed)."""


def _first_use(name: str) -> Any:
    """Import a public name on first use and keep it in the module's namespace."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value: Any = version("beam-agents")
        except PackageNotFoundError:
            value = "0+unknown"
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'beam_agents' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is an error, not Any
    __getattr__ = _first_use
