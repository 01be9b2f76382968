"""Tools an agent can use: declared with ``@tool``, collected in a ``ToolRegistry``.

Each tool's provider-facing JSON schema is derived from its Python signature through a generated
Pydantic v2 model, so the callable and the schema the model is shown cannot disagree. The
``side_effect`` flag splits tools in two: read-only tools run inline through ``ToolRunner``;
side-effecting ones refuse every in-pipeline call (``SideEffectToolError``) and are requested
with ``ctx.act(...)`` and executed by the effector. Errors live in ``beam_agents.tools.errors``;
provider and MCP shapes in ``beam_agents.tools.export``.

This package never imports Apache Beam: the effector sidecar imports it.
"""

from beam_agents.tools._intent import IntentInfo
from beam_agents.tools._tool import Tool, tool
from beam_agents.tools.registry import ToolRegistry
from beam_agents.tools.runner import ToolRunner

__all__ = ["IntentInfo", "Tool", "ToolRegistry", "ToolRunner", "tool"]
