"""The shape of the code: imports flow one way and the Beam glue stays thin.

Every ``import`` statement of every module in ``beam_agents/`` and ``effector/`` is read from
its source (``TYPE_CHECKING`` blocks and function bodies included), so an import that only a
type checker or a rarely taken branch would run still counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("beam_agents", "effector")
GENERATED = "beam_agents/_protos/"

# Lower layers never import higher ones. A module's layer is that of its longest listed prefix.
LAYERS: dict[str, int] = {
    "beam_agents._protos": 0,
    "beam_agents.tools": 1,
    "beam_agents.model": 1,
    "beam_agents.hitl": 3,
    "beam_agents.core": 3,
    "beam_agents.testing": 4,
    "beam_agents.io": 4,
    "beam_agents.loop": 4,
    "beam_agents": 5,
    "effector": 5,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not str(path.relative_to(ROOT)).startswith(GENERATED) or path.name == "__init__.py":
                modules[module_name(path)] = path
    return modules


MODULES = source_modules()


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every module ``path`` imports, absolute, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # ``from package import module`` imports that module too.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def internal_imports(name: str) -> set[str]:
    return {
        imported
        for imported in imported_names(MODULES[name], name)
        if imported in MODULES and imported != name
    }


GRAPH = {name: internal_imports(name) for name in MODULES}


def layer(name: str) -> int:
    prefixes = [prefix for prefix in LAYERS if name == prefix or name.startswith(prefix + ".")]
    return LAYERS[max(prefixes, key=len)]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (the import circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_import_reader_sees_type_checking_and_relative_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from beam_agents.core.context import ActivationContext\n"
        "def later():\n"
        "    import beam_agents.io.effector_link\n"
    )
    names = set(imported_names(sample, "beam_agents.core.sample"))
    assert {"beam_agents.core.context", "beam_agents.io.effector_link"} <= names


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_there_is_no_import_circle() -> None:
    assert strongly_connected(GRAPH) == []


def test_imports_never_run_from_a_lower_layer_to_a_higher_one() -> None:
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if layer(target) > layer(name)
    )
    assert upward == []


@pytest.mark.parametrize("package", ["beam_agents.tools", "beam_agents.model", "effector"])
def test_beam_free_packages_never_import_apache_beam(package: str) -> None:
    offenders = sorted(
        name
        for name, path in MODULES.items()
        if (name == package or name.startswith(package + "."))
        and any(imported.split(".")[0] == "apache_beam" for imported in imported_names(path, name))
    )
    assert offenders == []


def test_the_runtime_core_never_imports_apache_beam() -> None:
    offenders = sorted(
        name
        for name, path in MODULES.items()
        if name.startswith("beam_agents.core.")
        and any(imported.split(".")[0] == "apache_beam" for imported in imported_names(path, name))
    )
    assert offenders == []


def test_the_dofn_stays_thin() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert lengths["beam_agents.io.run_agent"] < 600


def unit_of(name: str) -> str:
    """A module's unit for the circle check between sub-packages: its sub-package, or itself."""
    return ".".join(name.split(".")[:2])


def test_there_is_no_import_circle_between_subpackages() -> None:
    units: dict[str, set[str]] = {unit_of(name): set() for name in GRAPH}
    for name, targets in GRAPH.items():
        units[unit_of(name)].update(unit_of(target) for target in targets)
        units[unit_of(name)].discard(unit_of(name))
    assert strongly_connected(units) == []


CONSOLE_WIRING = {"effector.launch"}
"""The one effector module outside the console that imports it (the ``[console]`` extra)."""


def test_only_the_launcher_wires_the_console() -> None:
    offenders = sorted(
        name
        for name, path in MODULES.items()
        if name.startswith("effector")
        and name not in CONSOLE_WIRING
        and unit_of(name) != "effector.console"
        and any(
            imported == "effector.console" or imported.startswith("effector.console.")
            for imported in imported_names(path, name)
        )
    )
    assert offenders == []


def test_the_effector_takes_only_the_wire_contract_and_the_tools_from_beam_agents() -> None:
    allowed = {"beam_agents._protos", "beam_agents.tools", "beam_agents.tools.errors"}
    taken = set()
    for name, path in MODULES.items():
        if name.split(".")[0] != "effector":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                taken.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                taken.add(node.module)
    from_beam_agents = {module for module in taken if module.split(".")[0] == "beam_agents"}
    outside = {
        module
        for module in from_beam_agents
        if module not in allowed and not module.startswith("beam_agents._protos.")
    }
    assert from_beam_agents and outside == set()
