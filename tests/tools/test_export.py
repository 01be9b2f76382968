"""Provider and MCP exports, checked against golden files and for the strict dialect's rules.

The golden files in tests/tools/golden/ hold every export of a handful of representative tools.
After an intended change to the schemas, regenerate them and review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/tools/test_export.py
"""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from beam_agents.tools import Tool, ToolRegistry, tool
from beam_agents.tools.errors import ToolDefinitionError
from beam_agents.tools.export import anthropic_tool, mcp_tool, openai_tool

from . import toolbox

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN_TOOLS = [
    toolbox.lookup_customer,
    toolbox.charge_card,
    toolbox.plan_shipment,
    toolbox.book_delivery,
    toolbox.freeze_account,
    toolbox.report,
]


def _all_exports(exported: Tool) -> dict[str, Any]:
    try:
        strict: Any = openai_tool(exported, strict=True)
    except ToolDefinitionError as error:
        strict = {"error": str(error)}
    return {
        "schema": exported.schema,
        "anthropic": anthropic_tool(exported),
        "openai": openai_tool(exported),
        "openai_strict": strict,
        "mcp": mcp_tool(exported),
    }


def assert_matches_golden(name: str, actual: Any, golden_dir: Path = GOLDEN_DIR) -> None:
    """Compare ``actual`` with golden_dir/name.json, or rewrite that file under UPDATE_GOLDEN=1."""
    path = golden_dir / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(actual, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return
    assert path.exists(), f"no golden file {path.name}; create it with UPDATE_GOLDEN=1"
    expected = json.loads(path.read_text())
    assert actual == expected, f"{name} differs from {path.name} (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("exported", GOLDEN_TOOLS, ids=lambda each: each.name)
def test_exports_match_the_golden_files(exported: Tool) -> None:
    assert_matches_golden(exported.name, _all_exports(exported))


def test_a_golden_mismatch_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)
    (tmp_path / "sample.json").write_text(json.dumps({"a": 1}))
    assert_matches_golden("sample", {"a": 1}, tmp_path)
    with pytest.raises(AssertionError, match="differs"):
        assert_matches_golden("sample", {"a": 2}, tmp_path)
    with pytest.raises(AssertionError, match="no golden file"):
        assert_matches_golden("missing", {"a": 1}, tmp_path)


def test_anthropic_and_openai_shapes() -> None:
    schema = toolbox.lookup_customer.schema
    assert anthropic_tool(toolbox.lookup_customer) == {
        "name": "lookup_customer",
        "description": "Look up a customer by id.",
        "input_schema": schema["parameters"],
    }
    assert openai_tool(toolbox.lookup_customer) == {
        "type": "function",
        "function": {
            "name": "lookup_customer",
            "description": "Look up a customer by id.",
            "parameters": schema["parameters"],
            "strict": False,
        },
    }


def test_exporters_take_entries_of_tools_schema() -> None:
    registry = ToolRegistry([toolbox.lookup_customer, toolbox.book_delivery])
    for entry, source in zip(registry.tools_schema, registry, strict=True):
        assert anthropic_tool(entry) == anthropic_tool(source)
        assert openai_tool(entry, strict=True) == openai_tool(source, strict=True)


@pytest.mark.parametrize(
    "entry",
    [
        {"description": "", "parameters": {"type": "object"}},
        {"name": "x", "parameters": {"type": "object"}},
        {"name": "x", "description": "", "parameters": {"type": "array"}},
        {"name": "x", "description": ""},
    ],
)
def test_malformed_schema_entries_are_rejected(entry: dict[str, Any]) -> None:
    with pytest.raises(ToolDefinitionError):
        anthropic_tool(entry)
    with pytest.raises(TypeError):
        openai_tool(["not", "a", "tool"])  # type: ignore[arg-type]


def _object_nodes(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            found.append(node)
        for value in node.values():
            found.extend(_object_nodes(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_object_nodes(item))
    return found


def _admits_null(schema: dict[str, Any]) -> bool:
    return {"type": "null"} in schema.get("anyOf", [])


def test_strict_closes_every_object_and_requires_every_property() -> None:
    exported = openai_tool(toolbox.book_delivery, strict=True)
    assert exported["function"]["strict"] is True
    parameters = exported["function"]["parameters"]
    objects = _object_nodes(parameters)
    # The root, the inlined shipment parameter, and both models in $defs.
    assert len(objects) == 4
    for node in objects:
        assert node["additionalProperties"] is False
        assert node["required"] == list(node["properties"])


def test_strict_makes_optional_properties_nullable() -> None:
    parameters = openai_tool(toolbox.book_delivery, strict=True)["function"]["parameters"]
    properties = parameters["properties"]
    assert properties["window"]["anyOf"] == [
        {"type": "string", "enum": ["morning", "evening"]},
        {"type": "null"},
    ]
    assert properties["window"]["description"] == "Preferred delivery window."
    # Already nullable: left as it was, minus the default of None strict mode cannot use.
    assert properties["instructions"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert "default" not in properties["instructions"]
    address = parameters["$defs"]["Address"]["properties"]
    assert _admits_null(address["floor"]) and _admits_null(address["postcode"])
    assert not _admits_null(address["street"])
    # A $ref with a sibling description is inlined, as strict mode takes bare references only.
    assert "$ref" not in properties["shipment"]
    assert properties["shipment"]["description"] == "What to deliver, and where."


def test_strict_nulls_read_back_as_defaults() -> None:
    # What a strict-mode model sends: every property, nulls where it means "default".
    arguments = {
        "shipment": {
            "destination": {"street": "1 Quay", "city": "Oslo", "postcode": None, "floor": None},
            "items": ["box"],
        },
        "window": None,
        "instructions": None,
    }
    validated = toolbox.book_delivery.validate_arguments(arguments)
    assert "window" not in validated
    assert validated["instructions"] is None
    assert validated["shipment"].destination.floor == 0
    assert validated["shipment"].destination.postcode is None


def test_the_plain_schema_is_not_changed_by_a_strict_export() -> None:
    before = toolbox.book_delivery.schema
    openai_tool(toolbox.book_delivery, strict=True)
    assert toolbox.book_delivery.schema == before
    assert "additionalProperties" not in before["parameters"]["$defs"]["Address"]


def test_a_free_form_map_cannot_be_made_strict() -> None:
    @tool
    def count_words(counts: dict[str, int], label: str = "") -> None:
        """Store word counts."""

    with pytest.raises(ToolDefinitionError) as raised:
        openai_tool(count_words, strict=True)
    assert raised.value.tool_name == "count_words"
    assert raised.value.parameter == "counts"
    assert "'count_words'" in str(raised.value) and "'counts'" in str(raised.value)
    assert "dict[str, T]" in str(raised.value)
    # Not strict, it exports fine.
    assert openai_tool(count_words)["function"]["strict"] is False


def test_a_nested_free_form_map_is_reported_with_its_path() -> None:
    with pytest.raises(ToolDefinitionError) as raised:
        openai_tool(toolbox.plan_shipment, strict=True)
    assert raised.value.parameter == "quantities"


def test_mcp_annotations_follow_the_side_effect_flag() -> None:
    read_only = mcp_tool(toolbox.lookup_customer)
    assert read_only["inputSchema"] == toolbox.lookup_customer.schema["parameters"]
    assert read_only["annotations"] == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": True,
    }
    effectful = mcp_tool(toolbox.freeze_account)
    assert effectful["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    assert set(effectful) == {"name", "description", "inputSchema", "annotations"}
    with pytest.raises(TypeError, match="side_effect"):
        mcp_tool(toolbox.freeze_account.schema)  # type: ignore[arg-type]


def test_exports_are_fresh_values() -> None:
    exported = anthropic_tool(toolbox.lookup_customer)
    exported["input_schema"]["properties"].clear()
    assert anthropic_tool(toolbox.lookup_customer)["input_schema"]["properties"]


def test_a_reference_outside_the_root_defs_cannot_be_made_strict() -> None:
    entry = {
        "name": "legacy",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"item": {"$ref": "#/definitions/Item", "description": "An item."}},
        },
    }
    with pytest.raises(ToolDefinitionError) as raised:
        openai_tool(entry, strict=True)
    assert raised.value.tool_name == "legacy"
    assert "#/definitions/Item" in str(raised.value)
