"""Rule family: deadline routes, the policy. ``HitlPolicy`` validation and its escalation limit.

What each route does when a deadline fires is in test_deadline_routes.py.
"""

from __future__ import annotations

import pytest

from beam_agents import Deny, Drop, Escalate, FallbackContext, HitlPolicy


def escalate(fallback: FallbackContext) -> Escalate:
    return Escalate()


def deny_with_seq(fallback: FallbackContext) -> Deny:
    return Deny(f"denied:{fallback.seq}".encode())


def not_a_route(fallback: FallbackContext) -> str:
    return "deny"


async def asynchronous(fallback: FallbackContext) -> Drop:
    return Drop()


FALLBACK = FallbackContext(b"k", 2, b"", 10, 10, frozenset())


def policy(on_timeout: object, **overrides: object) -> HitlPolicy:
    settings: dict[str, object] = {
        "timeout_ms": 1_000,
        "intent_ttl_ms": 5_000,
        "approval_channel": "ops",
        "on_timeout": on_timeout,
    }
    settings.update(overrides)
    return HitlPolicy(**settings)  # type: ignore[arg-type]


def test_the_route_is_what_on_timeout_returns() -> None:
    assert policy(deny_with_seq).decide(FALLBACK, 0) == Deny(b"denied:2")


def test_escalate_past_the_limit_denies_with_the_exhausted_output() -> None:
    limited = policy(escalate, max_escalations=2, exhausted_output=b"gave up")
    assert limited.decide(FALLBACK, 0) == Escalate()
    assert limited.decide(FALLBACK, 1) == Escalate()
    assert limited.decide(FALLBACK, 2) == Deny(b"gave up")
    assert policy(escalate).decide(FALLBACK, 0) == Deny(b"")


def test_a_route_function_returning_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must return Deny, Drop or Escalate, got str"):
        policy(not_a_route).decide(FALLBACK, 0)


@pytest.mark.parametrize(
    ("on_timeout", "message"),
    [
        (lambda fallback: Drop(), "module-level function"),
        (asynchronous, "synchronous"),
        ("deny", "must be a function"),
    ],
)
def test_on_timeout_must_be_a_synchronous_module_level_function(
    on_timeout: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        policy(on_timeout)


def test_a_nested_function_is_refused() -> None:
    def nested(fallback: FallbackContext) -> Drop:
        return Drop()

    with pytest.raises(ValueError, match="module-level"):
        policy(nested)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_ms", 0),
        ("intent_ttl_ms", -1),
        ("approval_channel", None),
        ("max_escalations", -1),
        ("exhausted_output", "text"),
    ],
)
def test_bad_settings_are_value_errors_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"HitlPolicy.{field}"):
        policy(deny_with_seq, **{field: value})


def test_deny_output_must_be_bytes() -> None:
    with pytest.raises(TypeError, match=r"Deny\.output"):
        Deny("no")  # type: ignore[arg-type]
