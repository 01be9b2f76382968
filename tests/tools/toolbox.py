"""Module-level tools the tool tests share: importable by name, as pickling by reference needs.

Postponed annotations on purpose: every annotation here is a string until the decorator
resolves it with typing.get_type_hints.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from beam_agents.tools import IntentInfo, tool

# A literal only the body of `lookup_customer` contains: pickled by value, the function's code
# (and so this text) would be in the payload; pickled by reference it is not.
LOOKUP_MARKER = "toolbox-lookup-body-7f3e9c"


class Color(enum.Enum):
    """A plain enum parameter type."""

    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    """A nested model parameter type, with an optional field."""

    street: str
    city: str
    postcode: str | None = None
    floor: int = 0


class Shipment(BaseModel):
    """A model nested two levels deep, referring to another model."""

    destination: Address
    items: list[str]


@tool
def lookup_customer(customer_id: str, limit: int = 10) -> dict[str, object]:
    """Look up a customer by id."""
    return {"customer_id": customer_id, "limit": limit, "source": LOOKUP_MARKER[:7]}


@tool(side_effect=True)
def charge_card(
    customer_id: str,
    amount_cents: Annotated[int, Field(description="Amount to charge, in cents.", gt=0)],
    currency: Literal["EUR", "USD"] = "EUR",
    *,
    intent: IntentInfo,
) -> str:
    """Charge a customer's card on file.

    Charges exactly once per intent: the intent id is the payment provider's idempotency key.

    Args:
        customer_id: The customer to charge.
        amount_cents: Overridden by the Field description.
        currency: ISO 4217 currency code.
    """
    return f"charged:{customer_id}:{amount_cents}:{currency}:{intent.intent_id}"


@tool
def plan_shipment(
    shipment: Shipment,
    color: Color,
    express: bool,
    weight_kg: float,
    note: str | None = None,
    tags: list[str] | None = None,
    quantities: dict[str, int] | None = None,
    priority: Literal["low", "high"] = "low",
) -> str:
    """Plan a shipment using every supported parameter type.

    Parameters
    ----------
    shipment : Shipment
        Where it goes and what is in it.
    color : Color
        Wrapping colour.
    express : bool
        Whether to ship express.
    weight_kg : float
        Total weight in kilograms.
    note : str, optional
        Free text for the courier.
    tags : list of str, optional
        Labels to print on the box.
    quantities : dict, optional
        Count per item name.
    priority : {"low", "high"}
        Scheduling priority.
    """
    return f"{shipment.destination.city}:{color.value}:{express}:{weight_kg}:{priority}"


@tool(side_effect=True)
def freeze_account(customer_id: str, reason: str = "risk") -> str:
    """Freeze an account.

    :param customer_id: The account holder.
    :param reason: Why the account is frozen.
    """
    return f"frozen:{customer_id}:{reason}"


@tool
async def fetch_rate(currency: str) -> float:
    """Fetch an exchange rate (suspends once, as real I/O would)."""
    await asyncio.sleep(0)
    return 1.25 if currency == "USD" else 1.0


def _render_report(title: str, pages: int = 1) -> str:
    """Render a report."""
    return f"{title}:{pages}"


# Bound under a different name than its function: pickling refers to `_render_report`.
report = tool(name="render_report", description="Render a titled report.")(_render_report)


@tool(side_effect=True)
def book_delivery(
    shipment: Shipment,
    window: Literal["morning", "evening"] = "morning",
    instructions: str | None = None,
) -> str:
    """Book a courier for a shipment.

    Args:
        shipment: What to deliver, and where.
        window: Preferred delivery window.
        instructions: Notes for the courier.
    """
    return f"booked:{shipment.destination.city}:{window}"
