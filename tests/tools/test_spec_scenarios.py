"""One test per scenario of the tool-registry spec, named after the scenario."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from beam_agents.tools import IntentInfo, Tool, ToolRegistry, ToolRunner, tool
from beam_agents.tools.errors import (
    SideEffectToolError,
    ToolArgumentError,
    ToolDefinitionError,
    ToolNotFoundError,
)

INTENT = IntentInfo(
    intent_id="3f1c2b7e-0000-5000-8000-000000000001",
    entity_key=b"cust-9",
    seq=4,
    step_index=1,
    attempt=1,
)


# Requirement: the @tool decorator registers a callable as a Tool


def test_bare_decorator_derives_name_and_description_from_the_function() -> None:
    @tool
    def lookup_customer(customer_id: str) -> str:
        """Look up a customer by their id."""
        return customer_id

    assert isinstance(lookup_customer, Tool)
    assert lookup_customer.name == "lookup_customer"
    assert lookup_customer.description == "Look up a customer by their id."
    assert lookup_customer.description == lookup_customer.__doc__
    assert lookup_customer.side_effect is False
    # Still callable with the function's own semantics.
    assert lookup_customer("cust-1") == "cust-1"


def test_parameterized_decorator_overrides_name_and_declares_a_side_effect() -> None:
    @tool(name="charge", side_effect=True)
    def charge_card(customer_id: str, amount_cents: int) -> str:
        """Charge a card."""
        return "charged"

    assert charge_card.name == "charge"
    assert charge_card.side_effect is True
    assert charge_card.schema["name"] == "charge"
    assert charge_card.__name__ == "charge_card"  # functools metadata stays the function's


# Requirement: Tool schema is generated from the function signature via Pydantic v2


def test_schema_reflects_parameter_types_and_required_ness() -> None:
    @tool
    def f(customer_id: str, limit: int = 10) -> list[str]:
        """Find orders."""
        return []

    parameters = f.schema["parameters"]
    assert parameters["type"] == "object"
    assert parameters["properties"]["customer_id"]["type"] == "string"
    assert parameters["properties"]["limit"]["type"] == "integer"
    assert parameters["required"] == ["customer_id"]
    assert parameters["properties"]["limit"]["default"] == 10
    assert "default" not in parameters["properties"]["customer_id"]
    # The schema comes from the generated Pydantic model, so the two agree.
    assert f.argument_model.model_fields["limit"].default == 10
    assert f.argument_model.model_fields["customer_id"].is_required()


def test_missing_type_annotations_are_rejected_at_decoration_time() -> None:
    def lookup(customer_id: str, region) -> str:  # type: ignore[no-untyped-def]
        """Look up."""
        return customer_id

    with pytest.raises(ToolDefinitionError) as raised:
        tool(lookup)
    assert "'region'" in str(raised.value)
    assert "'lookup'" in str(raised.value)
    assert raised.value.parameter == "region"


# Requirement: the ToolRegistry collects and resolves tools


def test_a_registered_tool_is_resolvable_and_appears_in_tools_schema() -> None:
    @tool
    def lookup_customer(customer_id: str) -> str:
        """Look up a customer."""
        return customer_id

    registry = ToolRegistry()
    registry.register(lookup_customer)

    assert registry.get("lookup_customer") is lookup_customer
    assert lookup_customer.schema in registry.tools_schema
    assert registry.tools_schema == [lookup_customer.schema]


def test_duplicate_registration_is_rejected() -> None:
    @tool
    def lookup_customer(customer_id: str) -> str:
        """First definition."""
        return customer_id

    @tool(name="lookup_customer")
    def another_lookup(customer_id: str) -> str:
        """Second definition, same tool name."""
        return customer_id

    registry = ToolRegistry()
    registry.register(lookup_customer)
    with pytest.raises(ToolDefinitionError) as raised:
        registry.register(another_lookup)
    assert "'lookup_customer'" in str(raised.value)
    assert raised.value.tool_name == "lookup_customer"
    # The first registration is untouched.
    assert registry.get("lookup_customer") is lookup_customer
    assert len(registry) == 1


def test_resolving_an_unknown_tool_raises() -> None:
    registry = ToolRegistry()
    with pytest.raises(ToolNotFoundError) as raised:
        registry.get("does_not_exist")
    assert "'does_not_exist'" in str(raised.value)
    assert raised.value.tool_name == "does_not_exist"


# Requirement: the ToolRunner executes read-only tools inline with argument validation


@pytest.mark.asyncio
async def test_valid_arguments_are_validated_and_a_sync_tool_runs() -> None:
    calls: list[tuple[Any, ...]] = []

    @tool
    def find_orders(customer_id: str, limit: int = 10) -> str:
        """Find a customer's orders."""
        calls.append((customer_id, limit))
        return f"{customer_id}:{limit}"

    result = await ToolRunner().run(find_orders, {"customer_id": "cust-1", "limit": "3"})

    # The callable received the values the model coerced ("3" became 3) ...
    assert calls == [("cust-1", 3)]
    assert type(calls[0][1]) is int
    # ... and its return value came back directly.
    assert result == "cust-1:3"


@pytest.mark.asyncio
async def test_invalid_arguments_are_rejected_before_the_callable_runs() -> None:
    calls: list[str] = []

    @tool
    def find_orders(customer_id: str, limit: int = 10) -> str:
        """Find a customer's orders."""
        calls.append(customer_id)
        return customer_id

    missing_required_field: dict[str, Any] = {}
    wrong_type = {"customer_id": "c", "limit": "many"}
    for arguments, failing_field in (
        (missing_required_field, "customer_id"),
        (wrong_type, "limit"),
    ):
        with pytest.raises(ToolArgumentError) as raised:
            await ToolRunner().run(find_orders, arguments)
        assert "'find_orders'" in str(raised.value)
        assert [location for location, _ in raised.value.problems] == [failing_field]
    assert calls == []


@pytest.mark.asyncio
async def test_an_async_tool_is_awaited_and_its_result_returned() -> None:
    @tool
    async def fetch_profile(customer_id: str) -> dict[str, str]:
        """Fetch a profile."""
        return {"id": customer_id}

    result = await ToolRunner().run(fetch_profile, {"customer_id": "cust-2"})

    assert not inspect.isawaitable(result)
    assert result == {"id": "cust-2"}


# Requirement: direct invocation of a side-effecting tool raises


@pytest.mark.asyncio
async def test_toolrunner_refuses_a_side_effecting_tool() -> None:
    calls: list[str] = []

    @tool(side_effect=True)
    def refund(order_id: str) -> str:
        """Refund an order."""
        calls.append(order_id)
        return order_id

    with pytest.raises(SideEffectToolError) as raised:
        await ToolRunner().run(refund, {"order_id": "o-1"})
    assert "'refund'" in str(raised.value)
    assert raised.value.tool_name == "refund"
    assert calls == []
    # Refused before validation: even arguments that would fail validation get the refusal.
    with pytest.raises(SideEffectToolError):
        await ToolRunner().run(refund, {"no_such_argument": 1})


def test_calling_a_side_effecting_tool_directly_raises() -> None:
    external_writes: list[str] = []

    @tool(side_effect=True)
    def send_email(to: str, body: str) -> None:
        """Send an email."""
        external_writes.append(to)

    with pytest.raises(SideEffectToolError) as raised:
        send_email(to="a@example.com", body="hi")
    with pytest.raises(SideEffectToolError):
        send_email("a@example.com", "hi")
    assert external_writes == []
    assert "'send_email'" in str(raised.value)
    assert "ctx.act(" in str(raised.value)


@pytest.mark.asyncio
async def test_the_effectors_runner_is_the_one_sanctioned_executor() -> None:
    from effector import EffectorToolRunner

    calls: list[tuple[str, int, IntentInfo]] = []

    @tool(side_effect=True)
    def refund(order_id: str, amount_cents: int, *, intent: IntentInfo) -> str:
        """Refund an order."""
        calls.append((order_id, amount_cents, intent))
        return f"refunded:{order_id}"

    # Every in-pipeline path refuses ...
    with pytest.raises(SideEffectToolError):
        refund(order_id="o-1", amount_cents=5, intent=INTENT)
    with pytest.raises(SideEffectToolError):
        await ToolRunner().run(refund, {"order_id": "o-1", "amount_cents": 5})
    assert calls == []

    # ... and the effector's runner executes, with validated arguments and the injected intent.
    result = await EffectorToolRunner(tool_timeout_ms=5_000).run(
        refund, {"order_id": "o-1", "amount_cents": "5"}, intent_info=INTENT
    )
    assert result == "refunded:o-1"
    assert calls == [("o-1", 5, INTENT)]


@pytest.mark.asyncio
async def test_the_sanctioned_executor_refuses_read_only_tools() -> None:
    from effector import EffectorToolRunner

    calls: list[str] = []

    @tool
    def lookup_customer(customer_id: str) -> str:
        """Look up a customer."""
        calls.append(customer_id)
        return customer_id

    # The effector owns the error type; what matters is that it refuses, names the tool, and
    # never runs it.
    try:
        await EffectorToolRunner(tool_timeout_ms=5_000).run(
            lookup_customer, {"customer_id": "cust-1"}
        )
    except Exception as refusal:
        assert "lookup_customer" in str(refusal)
    else:
        pytest.fail("EffectorToolRunner ran a read-only tool")
    assert calls == []


# Requirement: Tool exposes a named accessor for its wrapped callable


def test_unwrap_returns_the_original_callable() -> None:
    calls: list[str] = []

    def delete_order(order_id: str) -> str:
        """Delete an order."""
        calls.append(order_id)
        return f"deleted:{order_id}"

    wrapped = tool(side_effect=True)(delete_order)

    assert wrapped.unwrap() is delete_order
    # The returned function is the plain function: no side_effect check on this path.
    assert wrapped.unwrap()("o-7") == "deleted:o-7"
    assert calls == ["o-7"]
    assert "effector" in (Tool.unwrap.__doc__ or "")


def test_unwrap_is_available_for_side_effecting_and_read_only_tools_alike() -> None:
    def read(key: str) -> str:
        """Read a key."""
        return f"read:{key}"

    def write(key: str) -> str:
        """Write a key."""
        return f"wrote:{key}"

    read_only = tool(read)
    effectful = tool(side_effect=True)(write)

    assert read_only.unwrap() is read
    assert effectful.unwrap() is write
    assert read_only.unwrap()("k") == "read:k"
    assert effectful.unwrap()("k") == "wrote:k"
