"""The fleet budget ledger on both stores (SQLite and PostgreSQL): grants, releases, debits.

A window's grant is at most its cap less what was debited and what live leases still hold, for
every capped measure; a released lease keeps only its spent part held, a lapsed one nothing.
A ``BUDGET_DEBIT`` intent is recorded once by id and adds to its window and its lease; a
malformed one is recorded REJECTED at Submit and never applied. Concurrent ``LeaseBudget``
calls never grant more than the cap between them, and ``budgets`` prints one line per window.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest
from effector_harness import TOOLS, EffectorProcess, run_cli, running_effector

from beam_agents._protos import (
    BudgetWindow,
    IntentState,
    LeaseBudgetRequest,
    LeaseBudgetResponse,
    SubmitAck,
    ToolIntent,
    ToolResult,
    canonical_json,
    debit_id_for,
)
from effector.client import EffectorClient
from effector.readable import iso_time
from effector.store.budgets import MAX_AMOUNT, MAX_TOTAL
from effector.store.intents import NewIntent, SubmitOutcome
from effector.store.sql import SqlStore

DAY_MS = 86_400_000
YEAR_MS = 366 * DAY_MS
"""The longest window: leases made on the wall clock stay in one window for the test."""
T0 = 20_000 * DAY_MS + 5 * 3_600_000
START = T0 - T0 % DAY_MS
LEASE_MS = 60_000
KEY = b"acme/k1"


def _ask(
    ledger: str = "fleet",
    *,
    tokens: int = 0,
    cost: int = 0,
    want_tokens: int = 0,
    want_cost: int = 0,
    window_ms: int = DAY_MS,
    release: str = "",
    spent_tokens: int = 0,
    spent_cost: int = 0,
    owner: str = "worker-1",
) -> LeaseBudgetRequest:
    """A ``LeaseBudget`` request: caps, wants, and a lease to release with what it spent."""
    return LeaseBudgetRequest(
        ledger=ledger,
        window_ms=window_ms,
        cap_tokens=tokens,
        cap_cost_micros=cost,
        want_tokens=want_tokens,
        want_cost_micros=want_cost,
        owner=owner,
        release_lease_id=release,
        released_spent_tokens=spent_tokens,
        released_spent_cost_micros=spent_cost,
    )


async def _lease(
    store: SqlStore, request: LeaseBudgetRequest, now_ms: int = T0
) -> LeaseBudgetResponse:
    return await store.lease_budget(request, now_ms, LEASE_MS)


async def _window(store: SqlStore, ledger: str = "fleet", now_ms: int = T0) -> BudgetWindow:
    [window] = [w for w in await store.budget_windows(100, now_ms) if w.ledger == ledger]
    return window


def _debit(
    seq: int,
    *,
    lease_id: str = "",
    tokens: int = 0,
    cost: int = 0,
    ledger: str = "fleet",
    start: int = START,
    args_json: str | None = None,
) -> ToolIntent:
    """The ``BUDGET_DEBIT`` of the model call at run ``seq``, step 1, as a worker stages it."""
    args = {
        "cost_micros": cost,
        "lease_id": lease_id,
        "ledger": ledger,
        "requests": 1,
        "tokens": tokens,
        "window_start_ms": start,
    }
    return ToolIntent(
        intent_id=debit_id_for(KEY, seq, 1, ledger),
        entity_key=KEY,
        seq=seq,
        step_index=1,
        args_json=canonical_json(args) if args_json is None else args_json,
        created_at_ms=T0,
        kind=ToolIntent.BUDGET_DEBIT,
    )


async def _submit(store: SqlStore, *intents: ToolIntent, now_ms: int = T0) -> list[SubmitOutcome]:
    answers = await store.submit([NewIntent(intent) for intent in intents], now_ms)
    return [answer.outcome for answer in answers]


def _held(window: BudgetWindow) -> tuple[int, int, int, int, int]:
    """``(debited tokens, leased tokens, debited cost, leased cost, live leases)``."""
    return (
        window.debited_tokens,
        window.leased_tokens,
        window.debited_cost_micros,
        window.leased_cost_micros,
        window.live_leases,
    )


@pytest.mark.asyncio
async def test_a_grant_never_exceeds_the_cap_less_debited_and_live_leases(
    store: SqlStore,
) -> None:
    first = await _lease(store, _ask(tokens=100, want_tokens=40))
    second = await _lease(store, _ask(tokens=100, want_tokens=40, owner="worker-2"))
    third = await _lease(store, _ask(tokens=100, want_tokens=40, owner="worker-3"))
    assert [g.granted_tokens for g in (first, second, third)] == [40, 40, 20]  # what was left
    assert (third.window_start_ms, third.leased_tokens, third.expires_at_ms) == (
        START,
        100,
        T0 + LEASE_MS,
    )
    refused = await _lease(store, _ask(tokens=100, want_tokens=1))
    assert (refused.lease_id, refused.granted_tokens, refused.leased_tokens) == ("", 0, 100)
    assert await _submit(store, _debit(0, lease_id=first.lease_id, tokens=30)) == [
        SubmitOutcome.ACCEPTED
    ]
    assert _held(await _window(store)) == (30, 70, 0, 0, 3)  # 30 of 100 debited, 70 held
    assert not (await _lease(store, _ask(tokens=100, want_tokens=1))).lease_id
    lowered = await _lease(store, _ask(tokens=50, want_tokens=10))  # the cap is now under use
    assert (lowered.lease_id, lowered.granted_tokens) == ("", 0)
    assert (await _window(store)).cap_tokens == 50

    # Random wants, debits and releases: every grant within what the cap left just before it.
    rng = random.Random(7)
    cap, live = 10_000, []
    for step in range(60):
        now = T0 + step
        answer = await _lease(
            store, _ask("swept", tokens=cap, want_tokens=rng.randint(1, 900)), now
        )
        before = cap - answer.debited_tokens - (answer.leased_tokens - answer.granted_tokens)
        assert 0 <= answer.granted_tokens <= max(before, 0), (step, answer)
        assert answer.debited_tokens + answer.leased_tokens <= cap, (step, answer)
        if answer.lease_id:
            live.append(answer)
        if live and rng.random() < 0.5:
            spent = live.pop(rng.randrange(len(live)))
            used = rng.randint(0, spent.granted_tokens)
            debit = _debit(1_000 + step, lease_id=spent.lease_id, tokens=used, ledger="swept")
            await _submit(store, debit, now_ms=now)
    window = await _window(store, "swept", T0 + 60)
    assert window.debited_tokens + window.leased_tokens <= cap


@pytest.mark.asyncio
async def test_every_capped_measure_needs_room_for_a_grant(store: SqlStore) -> None:
    first = await _lease(
        store, _ask(tokens=1_000, cost=1_000_000, want_tokens=100, want_cost=900_000)
    )
    assert (first.granted_tokens, first.granted_cost_micros) == (100, 900_000)
    second = await _lease(
        store, _ask(tokens=1_000, cost=1_000_000, want_tokens=100, want_cost=200_000)
    )
    assert (second.granted_tokens, second.granted_cost_micros) == (100, 100_000)
    # Tokens have room; cost has none: nothing is granted.
    refused = await _lease(store, _ask(tokens=1_000, cost=1_000_000, want_tokens=100, want_cost=1))
    assert (refused.lease_id, refused.granted_tokens, refused.granted_cost_micros) == ("", 0, 0)
    assert _held(await _window(store)) == (0, 200, 0, 1_000_000, 2)

    tokens_only = await _lease(store, _ask("tokens-only", tokens=50, want_tokens=80, want_cost=5))
    assert (tokens_only.granted_tokens, tokens_only.granted_cost_micros) == (50, 0)  # no cap
    debited = _debit(0, tokens=1, cost=7_000_000, ledger="tokens-only")
    assert await _submit(store, debited) == [SubmitOutcome.ACCEPTED]
    window = await _window(store, "tokens-only")
    assert (window.cap_cost_micros, window.debited_cost_micros) == (0, 7_000_000)  # no cap
    spent = await _submit(store, _debit(1, tokens=1_000, ledger="fleet"))
    assert spent == [SubmitOutcome.ACCEPTED]  # tokens are spent now, and cost too
    assert not (
        await _lease(store, _ask(tokens=1_000, cost=1_000_000, want_tokens=1, want_cost=1))
    ).lease_id


@pytest.mark.asyncio
async def test_a_release_keeps_only_the_spent_part_held_until_its_debits_arrive(
    store: SqlStore,
) -> None:
    first = await _lease(store, _ask(tokens=100, cost=1_000, want_tokens=60, want_cost=600))
    # Its worker spent 10 tokens and 150 of cost of it: the rest returns, and is leased again.
    renewal = _ask(tokens=100, cost=1_000, want_tokens=100, want_cost=1_000)
    renewal.release_lease_id = first.lease_id
    renewal.released_spent_tokens, renewal.released_spent_cost_micros = 10, 150
    again = await _lease(store, renewal)
    assert (again.granted_tokens, again.granted_cost_micros) == (90, 850)
    assert (again.leased_tokens, again.leased_cost_micros) == (100, 1_000)
    await _submit(store, _debit(0, lease_id=first.lease_id, tokens=10, cost=150))
    assert _held(await _window(store)) == (10, 90, 150, 850, 2)  # the spent part is debited

    # A release asking for nothing: 5 of the second lease stay held, the rest returns.
    answer = await _lease(
        store, _ask(tokens=100, cost=1_000, release=again.lease_id, spent_tokens=5)
    )
    assert (answer.lease_id, answer.leased_tokens, answer.leased_cost_micros) == ("", 5, 0)
    # The first released again, saying less than its debits: it keeps the debited 10.
    await _lease(store, _ask(tokens=100, cost=1_000, release=first.lease_id, spent_tokens=3))
    assert _held(await _window(store)) == (10, 5, 150, 0, 2)
    rest = await _lease(store, _ask(tokens=100, cost=1_000, want_tokens=100, want_cost=1_000))
    assert (rest.granted_tokens, rest.granted_cost_micros) == (85, 850)


@pytest.mark.asyncio
async def test_lapsed_leases_return_their_allowance(store: SqlStore) -> None:
    first = await _lease(store, _ask(tokens=100, want_tokens=70))
    await _submit(store, _debit(0, lease_id=first.lease_id, tokens=20))
    assert _held(await _window(store, now_ms=T0 + LEASE_MS - 1)) == (20, 50, 0, 0, 1)
    lapsed = T0 + LEASE_MS  # the lease lapses: its unspent 50 return, the debited 20 do not
    assert _held(await _window(store, now_ms=lapsed)) == (20, 0, 0, 0, 0)
    later = await _lease(store, _ask(tokens=100, want_tokens=100), lapsed)
    assert (later.granted_tokens, later.expires_at_ms) == (80, lapsed + LEASE_MS)
    next_day = await _lease(store, _ask(tokens=100, want_tokens=100), START + DAY_MS)
    assert (next_day.window_start_ms, next_day.granted_tokens) == (START + DAY_MS, 100)


@pytest.mark.asyncio
async def test_a_debit_submitted_twice_or_twice_in_one_batch_debits_once(store: SqlStore) -> None:
    held = await _lease(store, _ask(tokens=1_000, want_tokens=500))
    debit = _debit(0, lease_id=held.lease_id, tokens=40, cost=9)
    assert await _submit(store, debit) == [SubmitOutcome.ACCEPTED]
    assert await _submit(store, debit, now_ms=T0 + 5) == [SubmitOutcome.DUPLICATE]
    twice = _debit(1, lease_id=held.lease_id, tokens=60)
    assert await _submit(store, twice, twice) == [SubmitOutcome.ACCEPTED, SubmitOutcome.DUPLICATE]
    window = await _window(store)
    assert (window.debited_tokens, window.debited_cost_micros, window.debits) == (100, 9, 2)
    assert window.leased_tokens == 400  # the lease's debits counted once too
    record = await store.get_intent(debit.intent_id)
    assert record is not None and record.state == IntentState.DONE
    assert record.result is not None and record.result.status == ToolResult.OK
    assert [r.envelope for r in await store.read(1, 100)] == []  # never published


@pytest.mark.asyncio
async def test_debits_add_to_their_lease_and_their_window(store: SqlStore) -> None:
    mine = await _lease(store, _ask(tokens=1_000, cost=10_000, want_tokens=300, want_cost=3_000))
    other = await _lease(store, _ask(tokens=1_000, cost=10_000, want_tokens=200, want_cost=2_000))
    batch = [
        _debit(0, lease_id=mine.lease_id, tokens=100, cost=1_000),
        _debit(1, lease_id=mine.lease_id, tokens=50, cost=500),
        _debit(2, lease_id=other.lease_id, tokens=20, cost=100),
        _debit(3, tokens=5, cost=5),  # no lease: the window alone
        _debit(4, lease_id="no-such-lease", tokens=1, cost=1),
    ]
    assert await _submit(store, *batch) == [SubmitOutcome.ACCEPTED] * 5
    window = await _window(store)
    assert (window.debited_tokens, window.debited_cost_micros, window.debits) == (176, 1_606, 5)
    assert (window.leased_tokens, window.leased_cost_micros) == (150 + 180, 1_500 + 1_900)
    over = _debit(5, lease_id=other.lease_id, tokens=500, cost=5_000)  # past its lease
    await _submit(store, over)
    assert _held(await _window(store)) == (676, 150, 6_606, 1_500, 2)
    # A release saying less than its debits keeps what they took: nothing more returns.
    release = await _lease(store, _ask(tokens=1_000, cost=10_000, release=other.lease_id))
    assert (release.leased_tokens, release.leased_cost_micros) == (150, 1_500)
    rest = await _lease(store, _ask(tokens=1_000, cost=10_000, want_tokens=999, want_cost=99_999))
    assert (rest.granted_tokens, rest.granted_cost_micros) == (174, 1_894)
    elsewhere = _debit(6, tokens=7, ledger="fleet", start=START - DAY_MS)  # yesterday's window
    await _submit(store, elsewhere)
    yesterday = [w for w in await store.budget_windows(10, T0) if w.window_start_ms < START]
    assert [(w.ledger, w.debited_tokens, w.window_ms, w.cap_tokens) for w in yesterday] == [
        ("fleet", 7, 0, 0)  # a window only debits made: no length, no cap known
    ]


MALFORMED = {
    "not JSON": ("{", "args_json of a budget debit is not JSON"),
    "a list": ("[]", "has exactly the fields"),
    "a field missing": ('{"ledger":"fleet","tokens":1}', "has exactly the fields"),
    "an extra field": (
        canonical_json(
            {
                "cost_micros": 0,
                "lease_id": "",
                "ledger": "fleet",
                "tokens": 1,
                "window_start_ms": 0,
                "user": "x",
            }
        ),
        "has exactly the fields",
    ),
    "no ledger": ("", "ledger is text of 1 to 512 chars"),
    "a long ledger": ("x" * 513, "ledger is text of 1 to 512 chars"),
    "negative tokens": (-1, "are ints from 0 to"),
    "too many tokens": (MAX_AMOUNT + 1, "are ints from 0 to"),
    "fractional tokens": (1.5, "are ints from 0 to"),
    "tokens as true": (True, "are ints from 0 to"),
    "tokens as text": ("1", "are ints from 0 to"),
    "a long lease id": ("l" * 65, "lease_id is text of at most 64 chars"),
}


def _malformed_args(name: str, value: object) -> str:
    """The args_json of the malformed debit ``name`` (its value put where it belongs)."""
    args: dict[str, object] = {
        "cost_micros": 0,
        "lease_id": "",
        "ledger": "fleet",
        "requests": 1,
        "tokens": 1,
        "window_start_ms": 0,
    }
    if "ledger" in name:
        args["ledger"] = value
    elif "lease id" in name:
        args["lease_id"] = value
    elif "tokens" in name:
        args["tokens"] = value
    else:
        assert isinstance(value, str)
        return value
    return canonical_json(args)


@pytest.mark.asyncio
async def test_a_malformed_debit_is_rejected_at_submit_recorded_and_never_applied(
    store_url: str,
) -> None:
    debits = [
        _debit(seq, args_json=_malformed_args(name, value))
        for seq, (name, (value, _)) in enumerate(MALFORMED.items())
    ]
    good = _debit(99, tokens=3, start=0)
    async with running_effector(store_url) as running:
        acks = await running.client.submit([*debits, good])
        again = await running.client.submit(debits[:1])
        records = [await running.client.get_intent(debit.intent_id) for debit in debits]
        windows = await running.client.budgets()
    for (name, (_, why)), ack, record in zip(MALFORMED.items(), acks[:-1], records, strict=True):
        assert ack.outcome == SubmitAck.REJECTED, name
        assert why in ack.reason, (name, ack.reason)
        assert ack.result.status == ToolResult.REJECTED and why in ack.result.error_message
        assert record.state == IntentState.DONE, name  # recorded, so a retry is a duplicate
        assert record.result.status == ToolResult.REJECTED and why in record.result.error_message
    assert acks[-1].outcome == SubmitAck.ACCEPTED
    assert again[0].outcome == SubmitAck.DUPLICATE
    assert [(w.ledger, w.debited_tokens, w.debits) for w in windows] == [("fleet", 3, 1)]


@pytest.mark.asyncio
async def test_concurrent_leases_never_grant_more_than_the_cap_between_them(
    store_url: str,
) -> None:
    async with running_effector(store_url) as running:
        for cap, wants in ((100, [30] * 8), (1_000, [90, 400, 10, 250, 300, 75, 500, 1])):

            async def lease(want: int, owner: str, cap: int = cap) -> LeaseBudgetResponse:
                request = _ask(f"race-{cap}", tokens=cap, want_tokens=want, window_ms=YEAR_MS)
                request.owner = owner
                return await running.client.lease_budget(request)

            answers = await asyncio.gather(
                *(lease(want, f"worker-{n}") for n, want in enumerate(wants))
            )
            granted = [answer.granted_tokens for answer in answers]
            assert all(0 <= g <= want for g, want in zip(granted, wants, strict=True)), granted
            assert sum(granted) <= cap, granted
            assert sum(granted) == min(cap, sum(wants)), granted  # and nothing is lost
            assert len({a.lease_id for a in answers if a.lease_id}) == sum(g > 0 for g in granted)
            [window] = [w for w in await running.client.budgets() if w.ledger == f"race-{cap}"]
            assert (window.leased_tokens, window.live_leases) == (
                sum(granted),
                sum(g > 0 for g in granted),
            )


_LINE = re.compile(
    r"(?P<ledger>\S+) (?P<start>\S+) (?P<window>\d+) ms "
    r"tokens (?P<tokens>\S+(?: \(no cap\)|/\S+ \(\S+ left\))) "
    r"cost (?P<cost>\S+(?: \(no cap\)|/\S+ USD \(\S+ left\))) "
    r"requests (?P<requests>\S+(?: \(no cap\)|/\S+ \(\S+ left\))), "
    r"(?P<leases>\d+) leases, (?P<debits>\d+) debits"
)
"""``budgets --help``: LEDGER WINDOW_START WINDOW_MS ms tokens T cost C USD requests R,
LIVE_LEASES leases, DEBITS debits; each capped measure DEBITED+LEASED/CAP (LEFT left), an
uncapped one DEBITED (no cap)."""


def test_the_budgets_command_prints_one_line_per_window(tmp_path: Path) -> None:
    args = ["--tools", TOOLS, "--store", f"sqlite:///{tmp_path / 's.db'}"]
    with EffectorProcess(*args, "--listen", "127.0.0.1:0") as effector:
        target = ["--target", effector.address]
        none = run_cli("budgets", *target)
        assert (none.returncode, none.stdout) == (0, "")
        assert none.stderr.strip() == "no budget windows: no worker has leased from a fleet budget"
        with EffectorClient(effector.address) as client:
            both = _ask("fleet-a", tokens=1_000, cost=5_000_000, want_tokens=300, want_cost=10)
            both.window_ms = YEAR_MS
            held = client.lease_budget(both)
            client.lease_budget(_ask("fleet-b", tokens=50, want_tokens=20, window_ms=YEAR_MS))
            evil = "evil\nnext\x1b[2J\u202e"  # not printable: no lease and no debit may name it
            debits = [
                _debit(
                    0,
                    ledger="fleet-a",
                    start=held.window_start_ms,
                    lease_id=held.lease_id,
                    tokens=100,
                    cost=2_500_000,
                ),
                _debit(1, ledger=evil, start=held.window_start_ms, tokens=7),
            ]
            acks = client.submit(debits)
            assert [ack.outcome for ack in acks] == [SubmitAck.ACCEPTED, SubmitAck.REJECTED]
            assert "ledger must be printable" in acks[1].reason
        listed = run_cli("budgets", *target)
        limited = run_cli("budgets", *target, "--limit", "1")
        helped = run_cli("budgets", "--help")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""
    lines = listed.stdout.splitlines()
    assert len(lines) == 2, lines
    assert all(_LINE.fullmatch(line) for line in lines), lines
    start = iso_time(held.window_start_ms)
    assert sorted(lines) == [
        f"fleet-a {start} {YEAR_MS} ms tokens 100+200/1000 (700 left) "
        "cost 2.500000+0.000000/5.000000 USD (2.500000 left) requests 1 (no cap), "
        "1 leases, 1 debits",
        f"fleet-b {start} {YEAR_MS} ms tokens 0+20/50 (30 left) cost 0.000000 (no cap) "
        "requests 0 (no cap), 1 leases, 0 debits",
    ]
    assert len(limited.stdout.splitlines()) == 1
    assert "LEDGER WINDOW_START WINDOW_MS ms tokens T cost C USD requests R" in " ".join(
        helped.stdout.split()
    )


@pytest.mark.asyncio
async def test_pruning_keeps_a_window_that_has_not_ended(store: SqlStore) -> None:
    month = 30 * DAY_MS
    first = await _lease(store, _ask(tokens=100, want_tokens=60, window_ms=month))
    await _submit(store, _debit(0, lease_id=first.lease_id, tokens=60, start=first.window_start_ms))
    quiet = T0 + 8 * DAY_MS  # past the default result retention (7 days), in the same window
    assert quiet < first.window_start_ms + month
    await store.prune(quiet, 7 * DAY_MS)
    later = await _lease(store, _ask(tokens=100, want_tokens=100, window_ms=month), quiet)
    assert later.window_start_ms == first.window_start_ms
    assert (later.debited_tokens, later.granted_tokens) == (60, 40)


@pytest.mark.asyncio
async def test_debits_past_int64_leave_the_ledger_answering(store: SqlStore) -> None:
    huge = [_debit(n, tokens=MAX_AMOUNT) for n in range(1_025)]  # 1,025 * 2**53 > 2**63
    await _submit(store, *huge[:1_000])
    await _submit(store, *huge[1_000:])
    window = await _window(store)
    assert window.debited_tokens == MAX_TOTAL  # the total stops growing; it never overflows


@pytest.mark.asyncio
async def test_a_refused_lease_of_any_measure_is_counted(tmp_path: Path) -> None:
    async with running_effector(f"sqlite:///{tmp_path / 's.db'}") as running:
        ask = LeaseBudgetRequest(
            ledger="rpm", window_ms=DAY_MS, cap_requests=1, want_requests=1, owner="w"
        )
        assert (await running.client.lease_budget(ask)).granted_requests == 1
        assert not (await running.client.lease_budget(ask)).lease_id
        metrics = running.server.metrics.registry
        assert metrics.get_sample_value("effector_budget_refusals_total") == 1
