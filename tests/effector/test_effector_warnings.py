"""What the effector tells its operator: read-only tools at startup, store outages and recovery."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import make_intent, running_effector, wait_done
from effector_test_tools import make_registry

from beam_agents._protos import SubmitAck, ToolResult
from beam_agents.tools import ToolRegistry, tool
from effector.worker import MAX_RETRY_S, StoreOutage, retry_delay_s
from tests.pg import PostgresServer, postgres_server

CLAIM_RETRY = re.compile(r"claiming work failed .* retrying in ([\d.]+) s")
RECOVERED = re.compile(r"store recovered after ([\d.]+) s / (\d+) failed attempts")


@tool
def peek(name: str) -> str:
    """A second read-only tool."""
    return name


@pytest.mark.asyncio
async def test_read_only_tools_in_the_registry_are_named_at_startup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="effector")
    registry = make_registry().merge(ToolRegistry([peek]))
    async with running_effector(sqlite_url(tmp_path / "s.db"), registry):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    [warning] = [w for w in warnings if "read-only" in w]
    assert warning.endswith(": lookup, peek")
    assert "never executes" in warning


@pytest.mark.asyncio
async def test_a_registry_of_side_effecting_tools_starts_without_that_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="effector")
    side_effecting = ToolRegistry([t for t in make_registry() if t.side_effect])
    async with running_effector(sqlite_url(tmp_path / "s.db"), side_effecting):
        pass
    assert not [r for r in caplog.records if "read-only" in r.getMessage()]


def test_retry_delays_double_from_half_a_second_up_to_ten() -> None:
    delays = [retry_delay_s(n) for n in range(1, 9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert retry_delay_s(10_000) == MAX_RETRY_S
    with pytest.raises(ValueError, match="from 1"):
        retry_delay_s(0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_backs_off_per_operation_and_logs_one_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="effector.worker")
    clock = FakeClock()
    outage = StoreOutage(clock=clock)
    error = ConnectionError("down")
    assert [outage.failed("claiming work", error) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert outage.failed("housekeeping", error) == 0.5  # each operation backs off on its own
    clock.now += 12.5
    outage.succeeded("claiming work")
    assert outage.failing  # housekeeping has not succeeded yet
    outage.succeeded("housekeeping")
    outage.succeeded("housekeeping")  # nothing more to report
    assert not outage.failing
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "claiming work failed (1 in a row), retrying in 0.5 s: down"
    assert [m for m in messages if "recovered" in m] == [
        "store recovered after 12.5 s / 4 failed attempts"
    ]
    assert outage.failed("claiming work", error) == 0.5  # a new outage starts afresh


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, since the test stops and restarts it."""
    with postgres_server() as server:
        yield server


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_postgres_down_is_retried_with_backoff_and_its_recovery_logged(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="effector.worker")
    url = own_postgres.create_database("outage")
    async with running_effector(url) as effector:
        await asyncio.to_thread(own_postgres.stop)
        claims: list[float] = []
        deadline = time.monotonic() + 60
        while len(claims) < 4:  # waits of 0.5, 1, 2 and 4 s: about 3.5 s of outage
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.1)
            claims = [
                float(match.group(1))
                for r in caplog.records
                if (match := CLAIM_RETRY.match(r.getMessage()))
            ]
        assert claims[:4] == [0.5, 1.0, 2.0, 4.0]
        await asyncio.to_thread(own_postgres.start)
        deadline = time.monotonic() + 60
        while not (recovered := [r for r in caplog.records if "recovered" in r.getMessage()]):
            assert time.monotonic() < deadline, "no recovery line"
            await asyncio.sleep(0.1)
        [line] = recovered
        assert line.levelno == logging.INFO
        match = RECOVERED.fullmatch(line.getMessage())
        assert match is not None and float(match.group(1)) >= 3.5 and int(match.group(2)) >= 4
        intent = make_intent("add", {"a": 1})
        [ack] = await effector.client.submit([intent])
        assert ack.outcome == SubmitAck.ACCEPTED
        done = await wait_done(effector.client, [intent.intent_id])
        assert done[intent.intent_id].result.status == ToolResult.OK
