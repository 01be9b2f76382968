"""ToolRegistry: registration, resolution, names, merge, len, membership and iteration."""

import importlib
import pkgutil

import pytest

import beam_agents.tools
from beam_agents.tools import Tool, ToolRegistry, tool
from beam_agents.tools.errors import ToolDefinitionError, ToolNotFoundError

from . import toolbox


def _registry(*tools: Tool) -> ToolRegistry:
    registry = ToolRegistry()
    for each in tools:
        registry.register(each)
    return registry


def test_register_returns_the_tool_and_the_constructor_registers_in_order() -> None:
    registry = ToolRegistry()
    assert registry.register(toolbox.lookup_customer) is toolbox.lookup_customer
    built = ToolRegistry([toolbox.report, toolbox.lookup_customer])
    assert [each.name for each in built] == ["render_report", "lookup_customer"]


def test_only_tools_can_be_registered() -> None:
    with pytest.raises(TypeError, match="takes a Tool"):
        ToolRegistry().register(toolbox.lookup_customer.unwrap())  # type: ignore[arg-type]


def test_registering_the_same_tool_twice_is_a_duplicate_too() -> None:
    registry = _registry(toolbox.lookup_customer)
    with pytest.raises(ToolDefinitionError, match="'lookup_customer'"):
        registry.register(toolbox.lookup_customer)


def test_unknown_names_raise_a_lookup_error_listing_what_is_registered() -> None:
    registry = _registry(toolbox.lookup_customer, toolbox.report)
    with pytest.raises(LookupError) as raised:
        registry.get("lookup")
    assert isinstance(raised.value, ToolNotFoundError)
    assert "'lookup'" in str(raised.value)
    assert "lookup_customer, render_report" in str(raised.value)
    with pytest.raises(ToolNotFoundError):
        registry.get(None)  # type: ignore[arg-type]


def test_tools_schema_is_in_registration_order_and_safe_to_change() -> None:
    registry = _registry(toolbox.report, toolbox.lookup_customer, toolbox.fetch_rate)
    schemas = registry.tools_schema
    assert [schema["name"] for schema in schemas] == [
        "render_report",
        "lookup_customer",
        "fetch_rate",
    ]
    schemas[0]["name"] = "changed"
    schemas.clear()
    assert registry.tools_schema[0] == toolbox.report.schema


def test_names_is_a_set_of_the_registered_names() -> None:
    registry = _registry(toolbox.lookup_customer, toolbox.report)
    assert registry.names() == {"lookup_customer", "render_report"}
    assert isinstance(registry.names(), frozenset)
    assert ToolRegistry().names() == frozenset()


def test_len_membership_and_iteration() -> None:
    registry = _registry(toolbox.lookup_customer, toolbox.report)
    assert len(registry) == 2
    assert "lookup_customer" in registry
    assert "render_report" in registry
    assert "_render_report" not in registry
    assert toolbox.lookup_customer in registry
    assert toolbox.fetch_rate not in registry
    assert 3 not in registry
    assert list(registry) == [toolbox.lookup_customer, toolbox.report]

    @tool(name="lookup_customer")
    def impostor(customer_id: str) -> str:
        """Same name, different tool."""
        return customer_id

    assert impostor not in registry


def test_iteration_sees_a_snapshot() -> None:
    registry = _registry(toolbox.lookup_customer)
    for _ in registry:
        registry.register(toolbox.report)  # no "dictionary changed size" error
    assert len(registry) == 2


def test_merge_builds_a_new_registry_and_leaves_both_alone() -> None:
    first = _registry(toolbox.lookup_customer)
    second = _registry(toolbox.report, toolbox.fetch_rate)
    merged = first.merge(second)
    assert [each.name for each in merged] == ["lookup_customer", "render_report", "fetch_rate"]
    assert merged is not first and merged is not second
    assert first.names() == {"lookup_customer"}
    assert second.names() == {"render_report", "fetch_rate"}


def test_merge_rejects_a_name_clash_naming_the_tool() -> None:
    first = _registry(toolbox.lookup_customer, toolbox.report)
    second = _registry(toolbox.report)
    with pytest.raises(ToolDefinitionError) as raised:
        first.merge(second)
    assert raised.value.tool_name == "render_report"
    assert "'render_report'" in str(raised.value)
    with pytest.raises(TypeError):
        first.merge([toolbox.fetch_rate])  # type: ignore[arg-type]


def test_the_package_keeps_no_module_level_registry() -> None:
    modules = [beam_agents.tools] + [
        importlib.import_module(f"beam_agents.tools.{info.name}")
        for info in pkgutil.iter_modules(beam_agents.tools.__path__)
    ]
    for module in modules:
        registries = [
            name for name, value in vars(module).items() if isinstance(value, ToolRegistry)
        ]
        assert registries == [], f"{module.__name__} holds a registry: {registries}"


def test_repr_lists_the_names() -> None:
    assert repr(_registry(toolbox.lookup_customer)) == "ToolRegistry(['lookup_customer'])"
