"""The runtime core runs as it was built: compiled by mypyc in ``make test``'s second run."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compiled_modules() -> list[str]:
    """The modules ``setup.py`` compiles when ``BEAM_AGENTS_COMPILE=1``."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "COMPILED_MODULES":
            paths: tuple[str, ...] = ast.literal_eval(node.value)  # type: ignore[union-attr]
            return [path.removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py names no COMPILED_MODULES")


@pytest.mark.parametrize("name", compiled_modules())
def test_each_core_module_is_compiled_exactly_when_this_run_expects_it(name: str) -> None:
    expected = os.environ.get("BEAM_AGENTS_COMPILED") == "1"
    module = importlib.import_module(name)
    compiled = isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)
    assert compiled == expected, f"{name} loaded from {module.__file__}"


@pytest.mark.parametrize("name", compiled_modules())
def test_no_core_module_raises_from_a_cause_which_mypyc_would_drop(name: str) -> None:
    path = ROOT / (name.replace(".", "/") + ".py")
    chained = [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Raise) and node.cause is not None
    ]
    assert chained == [], f"{path.name} lines {chained}: raise outside the handler instead"


def test_no_module_whose_classes_agents_call_is_compiled() -> None:
    agent_facing = {"beam_agents.core.agent", "beam_agents.core.config", "beam_agents.core.context"}
    assert not agent_facing & set(compiled_modules())
