"""Defining tools: schema derivation for every parameter type, docstrings, definition errors.

Annotations here are evaluated eagerly (no postponed annotations), so tools defined inside a
test can refer to classes local to it; toolbox covers the postponed form.
"""

import dataclasses
import enum
import functools
import inspect
import subprocess
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from beam_agents.tools import IntentInfo, Tool, tool
from beam_agents.tools.errors import ToolDefinitionError

from . import toolbox


def _definition_error(function: Callable[..., Any], **options: Any) -> ToolDefinitionError:
    with pytest.raises(ToolDefinitionError) as raised:
        tool(**options)(function)
    return raised.value


def _keys_anywhere(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node).union(*(_keys_anywhere(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_keys_anywhere(item) for item in node))
    return set()


# Every parameter type


def test_every_supported_parameter_type_maps_to_json_schema() -> None:
    parameters = toolbox.plan_shipment.schema["parameters"]
    properties = parameters["properties"]

    assert properties["express"]["type"] == "boolean"
    assert properties["weight_kg"]["type"] == "number"
    assert properties["note"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert properties["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert properties["quantities"]["anyOf"][0] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
    }
    assert properties["priority"]["enum"] == ["low", "high"]
    assert properties["priority"]["default"] == "low"
    assert properties["color"]["$ref"] == "#/$defs/Color"
    assert properties["shipment"]["$ref"] == "#/$defs/Shipment"
    assert parameters["required"] == ["shipment", "color", "express", "weight_kg"]


def test_nested_definitions_are_hoisted_to_one_root_defs() -> None:
    parameters = toolbox.plan_shipment.schema["parameters"]
    definitions = parameters["$defs"]

    assert set(definitions) == {"Shipment", "Address", "Color"}
    assert definitions["Color"]["enum"] == ["red", "green"]
    shipment = definitions["Shipment"]
    assert shipment["properties"]["destination"] == {"$ref": "#/$defs/Address"}
    assert definitions["Address"]["required"] == ["street", "city"]
    # Nothing below the root carries its own $defs.
    below_root = [value for key, value in parameters.items() if key != "$defs"]
    assert "$defs" not in _keys_anywhere([*below_root, *definitions.values()])


def test_properties_follow_signature_order_and_carry_no_titles() -> None:
    properties = toolbox.plan_shipment.schema["parameters"]["properties"]
    assert list(properties) == [
        "shipment",
        "color",
        "express",
        "weight_kg",
        "note",
        "tags",
        "quantities",
        "priority",
    ]
    assert all("title" not in schema for schema in properties.values())
    assert "title" not in toolbox.plan_shipment.schema["parameters"]


def test_typing_optional_and_pipe_none_are_the_same_nullable_parameter() -> None:
    @tool
    def pipe(limit: int | None = None) -> None:
        """Pipe form."""

    @tool
    def optional(limit: Optional[int] = None) -> None:  # noqa: UP045 - the form under test
        """Optional form."""

    assert pipe.schema["parameters"] == optional.schema["parameters"]
    assert pipe.schema["parameters"]["properties"]["limit"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}],
        "default": None,
    }


def test_annotated_field_constraints_and_description_reach_the_schema() -> None:
    properties = toolbox.charge_card.schema["parameters"]["properties"]
    assert properties["amount_cents"] == {
        "type": "integer",
        "exclusiveMinimum": 0,
        # Field(description=...) wins over the docstring's "Overridden by..." line.
        "description": "Amount to charge, in cents.",
    }


def test_non_json_defaults_are_recorded_in_json_form() -> None:
    class Size(enum.Enum):
        SMALL = "s"
        LARGE = "l"

    @tool
    def order(size: Size = Size.LARGE, ids: tuple[int, ...] = (1, 2)) -> None:
        """Order something."""

    properties = order.schema["parameters"]["properties"]
    assert properties["size"]["default"] == "l"
    assert properties["ids"]["default"] == [1, 2]


def test_postponed_annotations_are_resolved() -> None:
    # toolbox uses `from __future__ import annotations`: every annotation there is a string.
    function = toolbox.lookup_customer.unwrap()
    assert isinstance(inspect.signature(function).parameters["limit"].annotation, str)
    assert toolbox.lookup_customer.schema["parameters"]["properties"]["limit"]["type"] == "integer"


def test_parameters_named_like_model_attributes_keep_their_names() -> None:
    @tool
    def configure(schema: str, json: int = 1, _private: bool = False) -> str:
        """Configure with awkward parameter names."""
        return f"{schema}:{json}:{_private}"

    assert list(configure.schema["parameters"]["properties"]) == ["schema", "json", "_private"]
    assert configure.validate_arguments({"schema": "s", "json": "2", "_private": True}) == {
        "schema": "s",
        "json": 2,
        "_private": True,
    }


# Descriptions from docstrings


def test_google_docstring_gives_parameter_descriptions_and_a_prose_only_description() -> None:
    schema = toolbox.charge_card.schema
    assert schema["description"] == (
        "Charge a customer's card on file.\n\n"
        "Charges exactly once per intent: the intent id is the payment provider's "
        "idempotency key."
    )
    properties = schema["parameters"]["properties"]
    assert properties["customer_id"]["description"] == "The customer to charge."
    assert properties["currency"]["description"] == "ISO 4217 currency code."


def test_numpy_docstring_gives_parameter_descriptions_and_a_prose_only_description() -> None:
    schema = toolbox.plan_shipment.schema
    assert schema["description"] == "Plan a shipment using every supported parameter type."
    properties = schema["parameters"]["properties"]
    assert properties["weight_kg"]["description"] == "Total weight in kilograms."
    assert properties["shipment"]["description"] == "Where it goes and what is in it."
    assert properties["priority"]["description"] == "Scheduling priority."


def test_sphinx_docstring_gives_parameter_descriptions_and_a_prose_only_description() -> None:
    schema = toolbox.freeze_account.schema
    assert schema["description"] == "Freeze an account."
    properties = schema["parameters"]["properties"]
    assert properties["customer_id"]["description"] == "The account holder."
    assert properties["reason"]["description"] == "Why the account is frozen."


def test_a_docstring_without_sections_is_the_description_verbatim() -> None:
    @tool
    def summarize(text: str) -> str:
        """Summarize a text.
        Keeps it under three sentences.

        Never invents facts.
        """
        return text

    assert summarize.description == inspect.cleandoc(summarize.unwrap().__doc__ or "")


def test_description_argument_overrides_the_docstring_but_not_parameter_docs() -> None:
    @tool(description="Short override.")
    def lookup(customer_id: str) -> str:
        """Long docstring.

        Args:
            customer_id: Who to look up.
        """
        return customer_id

    assert lookup.description == "Short override."
    assert lookup.schema["description"] == "Short override."
    assert lookup.schema["parameters"]["properties"]["customer_id"]["description"] == (
        "Who to look up."
    )


def test_a_function_without_docstring_has_an_empty_description() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == ""


# Definition errors name the tool and the parameter


def test_var_positional_and_var_keyword_parameters_are_rejected() -> None:
    def with_args(a: int, *rest: int) -> None:
        """Variadic."""

    def with_kwargs(a: int, **options: int) -> None:
        """Keyword variadic."""

    rest_error = _definition_error(with_args)
    assert "'*rest'" in str(rest_error) and "'with_args'" in str(rest_error)
    assert rest_error.parameter == "rest"
    options_error = _definition_error(with_kwargs)
    assert "'**options'" in str(options_error) and "'with_kwargs'" in str(options_error)
    assert options_error.parameter == "options"


def test_positional_only_parameters_are_rejected() -> None:
    def positional(a: int, /, b: int) -> None:
        """Positional-only a."""

    error = _definition_error(positional)
    assert error.parameter == "a"
    assert "positional-only" in str(error)


def test_unresolvable_annotations_are_rejected_naming_the_parameter() -> None:
    def broken(customer_id: str, region: "NoSuchType") -> None:  # type: ignore[name-defined]  # noqa: F821
        """Refers to a name that does not exist."""

    error = _definition_error(broken)
    assert error.parameter == "region"
    assert "'broken'" in str(error) and "'region'" in str(error) and "NoSuchType" in str(error)


def test_types_without_a_json_schema_are_rejected_naming_the_parameter() -> None:
    class Opaque:
        pass

    def opaque(name: str, handle: Opaque) -> None:
        """Takes something pydantic cannot validate."""

    def callback(name: str, then: Callable[[int], int]) -> None:
        """Takes something that has no JSON Schema."""

    opaque_error = _definition_error(opaque)
    assert opaque_error.parameter == "handle"
    assert "'opaque'" in str(opaque_error)
    callback_error = _definition_error(callback)
    assert callback_error.parameter == "then"


@pytest.mark.parametrize("bad_name", ["has space", "", "x" * 65, "dotted.name"])
def test_names_providers_would_reject_are_rejected(bad_name: str) -> None:
    def f(x: int) -> int:
        """Identity."""
        return x

    error = _definition_error(f, name=bad_name)
    assert repr(bad_name) in str(error)


def test_lambdas_need_an_explicit_valid_name() -> None:
    error = _definition_error(lambda x: x)
    assert "'<lambda>'" in str(error)


def test_only_functions_can_become_tools() -> None:
    with pytest.raises(ToolDefinitionError) as raised:
        tool("charge")  # type: ignore[call-overload]
    assert "@tool(name=...)" in str(raised.value)
    with pytest.raises(ToolDefinitionError):
        tool(functools.partial(toolbox._render_report, "title"))  # type: ignore[call-overload]
    with pytest.raises(ToolDefinitionError) as again:
        tool(toolbox.lookup_customer)  # type: ignore[call-overload]
    assert "already a tool" in str(again.value)


def test_side_effect_must_be_a_boolean() -> None:
    def f(x: int) -> int:
        """Identity."""
        return x

    error = _definition_error(f, side_effect="yes")
    assert "side_effect" in str(error) and "'f'" in str(error)


# The intent parameter


def test_a_side_effecting_tool_may_declare_a_keyword_only_intent() -> None:
    charge = toolbox.charge_card
    assert charge.accepts_intent is True
    assert "intent" not in charge.schema["parameters"]["properties"]
    assert "intent" not in charge.schema["parameters"]["required"]
    assert "intent" not in charge.argument_model.model_fields
    assert toolbox.lookup_customer.accepts_intent is False
    assert toolbox.freeze_account.accepts_intent is False


def test_intent_on_a_read_only_tool_is_rejected() -> None:
    def lookup(customer_id: str, *, intent: IntentInfo) -> None:
        """Read-only, yet asks for an intent."""

    error = _definition_error(lookup)
    assert error.parameter == "intent"
    assert "read-only" in str(error) and "'lookup'" in str(error)


def test_a_positional_intent_is_rejected() -> None:
    def charge(amount: int, intent: IntentInfo) -> None:
        """Intent not keyword-only."""

    error = _definition_error(charge, side_effect=True)
    assert error.parameter == "intent"
    assert "keyword-only" in str(error)


@pytest.mark.parametrize(
    "annotation", [str, IntentInfo | None, Annotated[str, Field(description="x")]]
)
def test_an_intent_parameter_of_another_type_is_rejected(annotation: Any) -> None:
    def charge(amount: int, *, intent: Any) -> None:
        """Intent of the wrong type."""

    charge.__annotations__["intent"] = annotation
    error = _definition_error(charge, side_effect=True)
    assert error.parameter == "intent"
    assert "IntentInfo" in str(error)


def test_intent_info_under_another_name_is_rejected() -> None:
    def charge(amount: int, *, info: IntentInfo) -> None:
        """IntentInfo under the wrong name."""

    error = _definition_error(charge, side_effect=True)
    assert error.parameter == "info"
    assert "'intent'" in str(error)


def test_intent_info_is_a_frozen_checked_record() -> None:
    info = IntentInfo(intent_id="i", entity_key=b"k", seq=1, step_index=2, attempt=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.seq = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="entity_key"):
        IntentInfo(intent_id="i", entity_key="k", seq=1, step_index=2, attempt=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attempt"):
        IntentInfo(intent_id="i", entity_key=b"k", seq=1, step_index=2, attempt=True)


# A Tool is a good citizen


def test_tools_keep_function_metadata() -> None:
    function = toolbox.lookup_customer.unwrap()
    wrapped = toolbox.lookup_customer
    assert wrapped.__name__ == "lookup_customer"
    assert wrapped.__qualname__ == function.__qualname__
    assert wrapped.__module__ == function.__module__
    assert wrapped.__doc__ == function.__doc__
    assert wrapped.__wrapped__ is function  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(function)
    assert repr(wrapped) == "Tool(name='lookup_customer', side_effect=False)"


def test_read_only_direct_calls_keep_the_function_semantics() -> None:
    # A direct call is the function: no validation or coercion in between.
    assert toolbox.lookup_customer("c", limit="5")["limit"] == "5"  # type: ignore[arg-type]


def test_tools_wrapping_the_same_function_alike_are_equal() -> None:
    function = toolbox.lookup_customer.unwrap()
    assert Tool(function) == toolbox.lookup_customer
    assert hash(Tool(function)) == hash(toolbox.lookup_customer)
    assert Tool(function, name="other") != toolbox.lookup_customer
    assert Tool(function, side_effect=True) != toolbox.lookup_customer


def test_schema_is_a_copy_the_caller_may_change() -> None:
    schema = toolbox.lookup_customer.schema
    schema["parameters"]["properties"].clear()
    assert toolbox.lookup_customer.schema["parameters"]["properties"]


def test_argument_model_is_a_pydantic_v2_model() -> None:
    model = toolbox.plan_shipment.argument_model
    assert issubclass(model, BaseModel)
    assert model.model_config.get("extra") == "forbid"


def test_importing_tools_does_not_import_apache_beam() -> None:
    probe = (
        "import sys, beam_agents.tools, beam_agents.tools.export, beam_agents.tools.errors; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert completed.stdout.strip() == "[]"


def test_literal_and_enum_parameters_accept_only_their_values() -> None:
    @tool
    def paint(mode: Literal["fast", "slow"], color: toolbox.Color) -> str:
        """Paint."""
        return f"{mode}:{color.value}"

    properties = paint.schema["parameters"]["properties"]
    assert properties["mode"]["enum"] == ["fast", "slow"]
    assert paint.schema["parameters"]["$defs"]["Color"]["enum"] == ["red", "green"]
