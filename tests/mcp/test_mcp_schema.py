"""The Pydantic model built from an MCP ``inputSchema`` accepts and refuses what the schema does."""

from __future__ import annotations

from typing import Any

import mcp.types as mcp_types
import pytest
from pydantic import ValidationError

from beam_agents.tools.errors import ToolArgumentError, ToolDefinitionError
from beam_agents.tools.mcp import McpServer, McpTool
from beam_agents.tools.mcp._tools import arguments_model

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3, "description": "What broke."},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5, "default": 3},
        "ratio": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "severity": {"enum": ["low", "high"]},
        "owner": {"type": ["string", "null"]},
        "where": {"$ref": "#/$defs/place"},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        "kind": {"const": "incident"},
        "odd-name": {"type": "boolean"},
    },
    "required": ["title", "where"],
    "additionalProperties": False,
    "$defs": {
        "place": {
            "type": "object",
            "properties": {"region": {"type": "string"}, "zone": {"type": "integer"}},
            "required": ["region"],
        }
    },
}


def _dump(arguments: dict[str, Any]) -> dict[str, Any]:
    model = arguments_model("file_ticket", SCHEMA)
    return model.model_validate(arguments).model_dump(
        mode="json", by_alias=True, exclude_unset=True
    )


def test_valid_arguments_come_back_as_the_json_the_server_expects() -> None:
    arguments = {
        "title": "db down",
        "priority": "2",
        "ratio": 1,
        "tags": ["a"],
        "severity": "high",
        "owner": None,
        "where": {"region": "eu", "zone": "4"},
        "labels": {"x": 1},
        "either": True,
        "kind": "incident",
        "odd-name": False,
    }
    assert _dump(arguments) == {**arguments, "priority": 2, "where": {"region": "eu", "zone": 4}}
    assert _dump({"title": "abc", "where": {"region": "us"}}) == {
        "title": "abc",
        "where": {"region": "us"},
    }


@pytest.mark.parametrize(
    ("arguments", "location"),
    [
        ({"where": {"region": "eu"}}, "title"),
        ({"title": "ab", "where": {"region": "eu"}}, "title"),
        ({"title": "abc", "where": {"zone": 1}}, "where.region"),
        ({"title": "abc", "where": {"region": "eu"}, "priority": 9}, "priority"),
        ({"title": "abc", "where": {"region": "eu"}, "tags": ["a", "b", "c"]}, "tags"),
        ({"title": "abc", "where": {"region": "eu"}, "severity": "medium"}, "severity"),
        ({"title": "abc", "where": {"region": "eu"}, "kind": "outage"}, "kind"),
        ({"title": "abc", "where": {"region": "eu"}, "labels": {"x": "many"}}, "labels.x"),
        ({"title": "abc", "where": {"region": "eu"}, "surprise": 1}, "surprise"),
        ({"title": "abc", "where": {"region": "eu"}, "odd-name": "perhaps"}, "odd-name"),
    ],
)
def test_invalid_arguments_are_refused_at_the_failing_field(
    arguments: dict[str, Any], location: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        _dump(arguments)
    locations = {".".join(str(part) for part in error["loc"]) for error in refused.value.errors()}
    assert any(found.startswith(location) for found in locations), locations


def test_what_the_model_cannot_express_is_left_to_the_server() -> None:
    loose = arguments_model(
        "loose",
        {
            "type": "object",
            "properties": {
                "node": {"$ref": "#/$defs/node"},
                "mixed": {"allOf": [{"type": "string"}]},
                "remote": {"$ref": "https://example.invalid/schema.json"},
            },
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
        },
    )
    value = {"node": {"next": {"next": 1}}, "mixed": 5, "remote": [1], "extra": True}
    assert loose.model_validate(value).model_dump(by_alias=True, exclude_unset=True) == value


# -- hostile schemas and arguments: deep nesting is a typed error, never a RecursionError ------


def _deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def _deep_array(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1_000, 200_000])
def test_an_input_schema_nested_too_deep_is_a_definition_error(depth: int) -> None:
    with pytest.raises(ToolDefinitionError, match="inputSchema nests deeper than 64 levels"):
        arguments_model("deep", _deep_schema(depth))
    listed = mcp_types.Tool(name="deep", input_schema=_deep_schema(depth))
    with pytest.raises(ToolDefinitionError, match="nests deeper than 64 levels"):
        McpTool(McpServer.http("http://127.0.0.1:9/mcp"), listed, side_effect=False)


@pytest.mark.parametrize("depth", [1_000, 200_000])
def test_arguments_nested_too_deep_are_refused_before_any_call(depth: int) -> None:
    listed = mcp_types.Tool(
        name="store", input_schema={"type": "object", "properties": {"data": {}, "note": {}}}
    )
    store = McpTool(McpServer.http("http://127.0.0.1:9/mcp"), listed, side_effect=True)
    with pytest.raises(ToolArgumentError) as raised:
        store.validate_arguments({"note": "fine", "data": _deep_array(depth)})
    assert raised.value.problems == (
        ("data", "nests deeper than 64 levels (counting the arguments object)"),
    )
    assert store.validate_arguments({"data": _deep_array(63)}) == {"data": _deep_array(63)}
