"""Tools an agent can use: declared with ``@tool``, collected in a ``ToolRegistry``.

A tool's JSON schema is derived from its Python signature, so the callable and the schema the
model is shown cannot disagree. Read-only tools run inline (``ToolRunner``); side-effecting ones
are requested with ``ctx.act(...)`` and executed by the effector. This package never imports
Apache Beam: the effector sidecar imports it. See ``docs/tools.md``.
"""

from beam_agents.tools._schema import IntentInfo
from beam_agents.tools._tool import Reconciled, Tool, ToolConnection, ToolRegistry, ToolRunner, tool

__all__ = [
    "IntentInfo",
    "Reconciled",
    "Tool",
    "ToolConnection",
    "ToolRegistry",
    "ToolRunner",
    "tool",
]
