"""The read-only-tools seed's tool half, imported from the seed itself, behaves as it promises."""

import pytest

from beam_agents.tools import ToolRunner
from tests.seed import make_registry, seed


def test_the_seeds_direct_call_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    seed.check_direct_call_is_refused()  # type: ignore[attr-defined]
    refusal = capsys.readouterr().out
    assert "'freeze_account'" in refusal
    assert "ctx.act(" in refusal


def test_the_seeds_registry_is_fresh_and_holds_only_the_read_only_tool() -> None:
    first, second = make_registry(), make_registry()
    assert first is not second
    assert first.names() == {"risk_band"}
    assert "freeze_account" not in first


@pytest.mark.asyncio
async def test_the_seeds_read_only_tool_runs_inline_through_the_registry() -> None:
    registry = make_registry()
    runner = ToolRunner()
    assert await runner.run(registry.get("risk_band"), {"customer_id": "cust-9"}) == "high"
    assert await runner.run(registry.get("risk_band"), {"customer_id": "cust-1"}) == "normal"
