"""``@tool.reconciler``: registering how the effector asks whether a tool's effect happened."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import dill
import pytest

import beam_agents
from beam_agents.tools import IntentInfo, Reconciled, Tool, tool
from beam_agents.tools._tool import _restore_tool
from beam_agents.tools.errors import ToolDefinitionError


@tool(side_effect=True)
def refund(order: str, amount: int) -> dict[str, object]:
    """Refund part of an order.

    Args:
        order: The order id.
        amount: Cents to refund.
    """
    return {"order": order, "refunded": amount}


@refund.reconciler
def find_refund(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """The refund already made for this intent, if any (none in these tests)."""
    return None


def test_the_decorator_registers_the_function_and_returns_it_unchanged() -> None:
    assert refund.reconcile_with is find_refund
    assert callable(find_refund) and not isinstance(find_refund, Tool)
    assert beam_agents.Reconciled is Reconciled
    assert Reconciled({"a": 1}).value == {"a": 1} and Reconciled().value is None


def test_an_async_reconciler_is_accepted() -> None:
    @tool(side_effect=True)
    def send(to: str) -> None:
        """Send.

        Args:
            to: Whom.
        """

    @send.reconciler
    async def sent(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
        return None

    assert send.reconcile_with is sent


def test_only_a_side_effecting_tool_has_one_and_only_one() -> None:
    @tool
    def read(name: str) -> str:
        """Read.

        Args:
            name: What.
        """
        return name

    with pytest.raises(ToolDefinitionError, match="read-only"):
        read.reconciler(find_refund)
    assert read.reconcile_with is None
    with pytest.raises(ToolDefinitionError, match="already has a reconciler"):
        refund.reconciler(lambda intent, args: None)
    refund.reconciler(find_refund)  # the same one again is harmless
    assert refund.reconcile_with is find_refund


@pytest.mark.parametrize(
    "bad", [lambda: None, lambda intent: None, lambda a, b, c: None, "find_refund"]
)
def test_a_reconciler_must_take_intent_and_args(bad: Any) -> None:
    @tool(side_effect=True)
    def act(x: int) -> int:
        """Act.

        Args:
            x: A number.
        """
        return x

    with pytest.raises(ToolDefinitionError, match="act"):
        act.reconciler(bad)
    assert act.reconcile_with is None


@pytest.mark.parametrize("pickler", [pickle, cloudpickle, dill], ids=lambda p: p.__name__)
def test_a_module_level_tool_pickles_with_its_reconciler(pickler: Any) -> None:
    restored = pickler.loads(pickler.dumps(refund))
    assert restored is refund
    assert restored.reconcile_with is find_refund


def test_a_tool_rebuilt_from_its_function_gets_its_reconciler_back() -> None:
    def local(x: int) -> int:
        """Local.

        Args:
            x: A number.
        """
        return x

    made = Tool(local, side_effect=True)

    def check(intent: IntentInfo, args: dict[str, Any]) -> None:
        return None

    made.reconciler(check)
    restored = cloudpickle.loads(cloudpickle.dumps(made))
    assert restored.schema == made.schema and restored is not made
    assert restored.reconcile_with is not None
    assert restored.reconcile_with(None, {}) is None  # type: ignore[arg-type]


def test_a_pickle_from_before_reconcilers_still_loads() -> None:
    _, arguments = refund.__reduce__()
    assert len(arguments) == 5
    assert _restore_tool(*arguments[:4]) is refund
