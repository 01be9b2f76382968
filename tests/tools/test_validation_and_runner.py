"""Argument validation (Pydantic lax mode) and the inline ToolRunner."""

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest
from pydantic import BaseModel

from beam_agents.tools import IntentInfo, ToolRunner, tool
from beam_agents.tools.errors import SideEffectToolError, ToolArgumentError

from . import toolbox

SHIPMENT = {"destination": {"street": "1 Quay", "city": "Oslo"}, "items": ["box"]}
DEFAULT_TAGS = ["unchanged"]


def test_lax_mode_coerces_unambiguous_values() -> None:
    arguments = toolbox.plan_shipment.validate_arguments(
        {
            "shipment": SHIPMENT,
            "color": "red",
            "express": "true",
            "weight_kg": "2.5",
            "quantities": {"box": "3"},
        }
    )
    assert arguments["color"] is toolbox.Color.RED
    assert arguments["express"] is True
    assert arguments["weight_kg"] == 2.5
    assert arguments["quantities"] == {"box": 3}
    assert isinstance(arguments["shipment"], toolbox.Shipment)
    assert isinstance(arguments["shipment"].destination, toolbox.Address)
    assert toolbox.lookup_customer.validate_arguments({"customer_id": "c", "limit": "5"}) == {
        "customer_id": "c",
        "limit": 5,
    }


def test_lax_mode_is_documented_where_the_runner_is() -> None:
    assert ToolRunner.__doc__ is not None and "lax mode" in ToolRunner.__doc__
    assert '"5"' in ToolRunner.__doc__


def test_ambiguous_values_are_still_rejected() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.lookup_customer.validate_arguments({"customer_id": 7, "limit": 2.5})
    assert [location for location, _ in raised.value.problems] == ["customer_id", "limit"]


def test_a_validation_error_lists_every_failing_field() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.plan_shipment.validate_arguments(
            {
                "shipment": {"destination": {"street": "1 Quay"}, "items": "box"},
                "color": "purple",
                "weight_kg": "heavy",
                "surprise": 1,
            }
        )
    error = raised.value
    locations = [location for location, _ in error.problems]
    assert sorted(locations) == sorted(
        [
            "shipment.destination.city",
            "shipment.items",
            "color",
            "express",
            "weight_kg",
            "surprise",
        ]
    )
    message = str(error)
    assert message.startswith("invalid arguments for tool 'plan_shipment': ")
    for location in locations:
        assert f"{location}: " in message
    assert "(got 'heavy')" in message
    assert "unknown argument" in dict(error.problems)["surprise"]
    assert error.tool_name == "plan_shipment"


def test_long_inputs_are_shortened_in_messages() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.lookup_customer.validate_arguments({"customer_id": "c", "limit": "x" * 500})
    assert "x" * 100 not in str(raised.value)
    assert "..." in str(raised.value)


@pytest.mark.parametrize("arguments", [["customer_id"], "customer_id=c", None])
def test_arguments_must_be_a_mapping(arguments: Any) -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.lookup_customer.validate_arguments(arguments)
    assert "'lookup_customer'" in str(raised.value)


def test_argument_names_must_be_strings() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.lookup_customer.validate_arguments({"customer_id": "c", 1: "x"})
    assert raised.value.problems == (("1", "argument name is not a string"),)


def test_validation_does_not_change_the_callers_mapping() -> None:
    arguments = {"customer_id": "c", "limit": "5"}
    toolbox.lookup_customer.validate_arguments(arguments)
    assert arguments == {"customer_id": "c", "limit": "5"}


def test_left_out_parameters_keep_the_functions_own_defaults() -> None:
    @tool
    def label(text: str, tags: list[str] = DEFAULT_TAGS) -> list[str]:
        """Label something."""
        return tags

    assert label.validate_arguments({"text": "t"}) == {"text": "t"}
    # Pydantic would copy a list default; leaving it to Python keeps the very object.
    assert label(**label.validate_arguments({"text": "t"})) is DEFAULT_TAGS


def test_null_for_a_defaulted_non_nullable_parameter_means_the_default() -> None:
    arguments = toolbox.plan_shipment.validate_arguments(
        {
            "shipment": {
                "destination": {"street": "1 Quay", "city": "Oslo", "floor": None},
                "items": [],
            },
            "color": "green",
            "express": False,
            "weight_kg": 1,
            "priority": None,
            "note": None,
        }
    )
    assert "priority" not in arguments  # the function's default "low" applies
    assert arguments["shipment"].destination.floor == 0  # the nested model's default applies
    assert arguments["note"] is None  # str | None: here null is a value, not "default"


def test_null_for_a_required_parameter_is_rejected() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.lookup_customer.validate_arguments({"customer_id": None})
    assert [location for location, _ in raised.value.problems] == ["customer_id"]


def test_a_spoofed_intent_argument_is_rejected() -> None:
    spoof = {"intent_id": "forged", "entity_key": "k", "seq": 0, "step_index": 0, "attempt": 1}
    with pytest.raises(ToolArgumentError) as raised:
        toolbox.charge_card.validate_arguments(
            {"customer_id": "c", "amount_cents": 100, "intent": spoof}
        )
    assert raised.value.problems == (
        ("intent", "intent is injected by the effector and cannot be an argument"),
    )
    # On a tool without an intent parameter it is simply an unknown argument.
    with pytest.raises(ToolArgumentError) as unknown:
        toolbox.freeze_account.validate_arguments({"customer_id": "c", "intent": spoof})
    assert [location for location, _ in unknown.value.problems] == ["intent"]


def test_validated_arguments_never_include_intent() -> None:
    arguments = toolbox.charge_card.validate_arguments({"customer_id": "c", "amount_cents": "7"})
    assert arguments == {"customer_id": "c", "amount_cents": 7}
    # What the effector does with them: call the function with the intent added.
    intent = IntentInfo(intent_id="i-1", entity_key=b"k", seq=0, step_index=0, attempt=1)
    assert toolbox.charge_card.unwrap()(**arguments, intent=intent) == "charged:c:7:EUR:i-1"


@pytest.mark.asyncio
async def test_runner_awaits_an_async_tool_that_suspends() -> None:
    assert await ToolRunner().run(toolbox.fetch_rate, {"currency": "USD"}) == 1.25


@pytest.mark.asyncio
async def test_runner_awaits_a_sync_tool_returning_a_coroutine() -> None:
    async def double(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    @tool
    def deferred(value: int) -> Awaitable[int]:
        """Return an awaitable rather than a value."""
        return double(value)

    assert await ToolRunner().run(deferred, {"value": "21"}) == 42


@pytest.mark.asyncio
async def test_runner_awaits_a_sync_tool_returning_a_future() -> None:
    @tool
    def scheduled(value: int) -> "asyncio.Future[int]":
        """Return a future the event loop resolves later."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, value + 1)
        return future

    assert await ToolRunner().run(scheduled, {"value": 1}) == 2


@pytest.mark.asyncio
async def test_runner_returns_plain_values_as_they_are() -> None:
    result = await ToolRunner().run(toolbox.lookup_customer, {"customer_id": "c"})
    assert result == {"customer_id": "c", "limit": 10, "source": "toolbox"}


@pytest.mark.asyncio
async def test_errors_raised_by_the_tool_propagate_unchanged() -> None:
    class LookupFailed(Exception):
        pass

    @tool
    def failing(key: str) -> str:
        """Always fails."""
        raise LookupFailed(key)

    with pytest.raises(LookupFailed, match="k-1"):
        await ToolRunner().run(failing, {"key": "k-1"})


@pytest.mark.asyncio
async def test_runner_refuses_side_effecting_tools_from_the_toolbox() -> None:
    for side_effecting in (toolbox.charge_card, toolbox.freeze_account):
        with pytest.raises(SideEffectToolError) as raised:
            await ToolRunner().run(side_effecting, {"customer_id": "c"})
        assert raised.value.tool_name == side_effecting.name


@pytest.mark.asyncio
async def test_runner_takes_tools_only() -> None:
    with pytest.raises(TypeError, match="takes a Tool"):
        await ToolRunner().run(toolbox.lookup_customer.unwrap(), {"customer_id": "c"})  # type: ignore[arg-type]


# -- hostile data: deep, cyclic, huge, control characters ------------------------------------


class Branch(BaseModel):
    """A recursive argument type: each branch may hold another."""

    child: "Branch | None" = None


@tool
def take_anything(
    anything: Any = None,
    mapping: dict[str, Any] | None = None,
    items: list[Any] | None = None,
    branch: Branch | None = None,
    text: str = "",
    count: int = 0,
) -> str:
    """Take arguments of many shapes.

    Args:
        anything: Any JSON.
        mapping: A JSON object.
        items: A JSON array.
        branch: A recursive model.
        text: A string.
        count: An integer.
    """
    return "taken"


def _nested(depth: int, field: str) -> Any:
    """``depth`` levels of arrays (``items``/``anything``/``text``/``count``) or objects."""
    value: Any = {} if field in ("mapping", "branch") else []
    for _ in range(depth - 1):
        value = (
            {"child" if field == "branch" else "a": value} if isinstance(value, dict) else [value]
        )
    return value


@pytest.mark.parametrize("depth", [1_000, 200_000])
@pytest.mark.parametrize("field", ["anything", "mapping", "items", "branch", "text", "count"])
def test_arguments_nested_too_deep_are_refused_with_a_typed_error(depth: int, field: str) -> None:
    with pytest.raises(ToolArgumentError) as raised:
        take_anything.validate_arguments({"text": "fine", field: _nested(depth, field)})
    assert raised.value.problems == (
        (field, "nests deeper than 64 levels (counting the arguments object)"),
    )
    assert raised.value.tool_name == "take_anything"


@pytest.mark.parametrize("field", ["anything", "mapping", "items", "branch"])
def test_arguments_as_deep_as_the_wire_allows_are_accepted(field: str) -> None:
    deepest = _nested(63, field)  # 64 levels with the arguments object, as Submit accepts
    assert field in take_anything.validate_arguments({field: deepest})
    with pytest.raises(ToolArgumentError, match="nests deeper than 64 levels"):
        take_anything.validate_arguments(
            {field: [deepest] if field != "branch" else {"child": deepest}}
        )


def test_a_cyclic_argument_is_refused_with_a_typed_error() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ToolArgumentError, match="items: nests deeper than 64 levels"):
        take_anything.validate_arguments({"items": looped})


def test_a_huge_string_is_validated_and_its_refusal_stays_short() -> None:
    huge = "9" * 20_000_000 + "x"
    assert take_anything.validate_arguments({"text": huge})["text"] is huge
    with pytest.raises(ToolArgumentError) as raised:
        take_anything.validate_arguments({"count": huge, "mapping": {"k": [huge] * 1_000}})
    assert [location for location, _ in raised.value.problems] == ["count"]
    assert len(str(raised.value)) < 400


HOSTILE_TEXT = "line 1\nline 2\r\n\x1b[31mred\x1b[0m \x00 \u202eevil\u202c \t end"


def test_hostile_argument_names_are_kept_as_data_in_the_problems() -> None:
    with pytest.raises(ToolArgumentError) as raised:
        take_anything.validate_arguments({HOSTILE_TEXT: 1})
    [(location, message)] = raised.value.problems
    assert location == HOSTILE_TEXT
    assert message.startswith("unknown argument")


@pytest.mark.asyncio
async def test_a_tools_error_message_with_control_characters_comes_back_unchanged() -> None:
    @tool
    def complain(reason: str) -> str:
        """Fail with the reason given.

        Args:
            reason: What to say.
        """
        raise RuntimeError(reason)

    with pytest.raises(RuntimeError) as raised:
        await ToolRunner().run(complain, {"reason": HOSTILE_TEXT})
    assert str(raised.value) == HOSTILE_TEXT
