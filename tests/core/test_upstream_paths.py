"""The import paths the upstream project's documentation uses keep working (issue 41)."""

from __future__ import annotations

import importlib

import pytest

import beam_agents

UPSTREAM = {
    "beam_agents.core.agent": ["Complete", "Suspend", "intent_id_for", "FallbackContext"],
    "beam_agents.core.context": ["ActivationContext"],
    "beam_agents.hitl": ["Route", "HitlPolicy", "Deny", "Drop", "Escalate", "FallbackContext"],
    "beam_agents.tools": ["tool", "Tool", "ToolRegistry", "ToolRunner", "IntentInfo"],
    "beam_agents.tools.errors": [
        "ToolError",
        "ToolDefinitionError",
        "ToolNotFoundError",
        "ToolArgumentError",
        "SideEffectToolError",
    ],
}


@pytest.mark.parametrize("module", sorted(UPSTREAM))
def test_an_upstream_path_imports_and_names_the_root_s_objects(module: str) -> None:
    imported = importlib.import_module(module)
    for name in UPSTREAM[module]:
        found = getattr(imported, name)
        if name in beam_agents.__all__:
            assert found is getattr(beam_agents, name), f"{module}.{name}"


def test_the_hitl_module_re_exports_the_policy_that_lives_with_the_config() -> None:
    from beam_agents.core.config import HitlPolicy
    from beam_agents.hitl import HitlPolicy as Documented

    assert Documented is HitlPolicy
