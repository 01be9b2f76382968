"""Fleet budgets in the console: the budgets page, from the ledger the effector keeps.

Windows are made through the effector's real ``LeaseBudget`` RPC and debited by real
``BUDGET_DEBIT`` intents through Submit, so the page shows what the ledger holds: per window
and measure the cap, debited, leased (live leases' unspent part) and remaining, with a bar.
Hostile rows written straight into the store's tables (bidi, ANSI and NUL ledgers, 2**53 and
INT64 amounts, windows at the epoch and past year 9999, caps of 0) never break the page.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from beam_agents._protos import SubmitAck
from effector.console import views
from effector.launch import EffectorThread
from tests.console.budget_data import (
    DAY_MS,
    HOUR_MS,
    debit_intent,
    lease,
    submit_debits,
)
from tests.console.harness import between, client_for, page_text
from tests.console.runs_data import now_ms

KEY = b"acme/k1"
INT64_MAX = 2**63 - 1


def _windows(page: str) -> list[str]:
    """The HTML of each window's rows (one ``<tbody>`` each), in the page's order."""
    return re.findall(r'<tbody class="window" id="window-\d+">(.*?)</tbody>', page, re.S)


def _window(page: str, ledger: str) -> str:
    """The HTML of the one window whose ledger cell shows ``ledger`` (escaped as the page is)."""
    cell = f'<td rowspan="3" class="ledger">{ledger}'
    [found] = [window for window in _windows(page) if cell in window]
    return found


def _measure(window: str, name: str) -> str:
    """The text of one measure's row of a window (its window's cells and its bar aside)."""
    row = between(window, f'<tr class="measure {name}">', "</tr>")
    return page_text(re.sub(r"<svg.*?</svg>", "", row[row.index('<th scope="row">') :], flags=re.S))


def _bar(window: str, name: str) -> list[tuple[str, str, str]]:
    """``(class, x, width)`` of each part of one measure's bar."""
    row = between(window, f'<tr class="measure {name}">', "</tr>")
    return re.findall(r'<rect class="(\w+)"(?: x="([\d.]+)")? width="([\d.]+)"', row)


def test_amounts_lengths_and_window_times_read_exactly() -> None:
    shown = [views.dollars(m) for m in (0, 9, 125, 1_500_000, 2**53, -2_500_000)]
    assert shown == ["$0.00", "$0.000009", "$0.000125", "$1.50", "$9,007,199,254.740992", "-$2.50"]
    lengths = [views.span(ms) for ms in (DAY_MS, 90 * 60_000, 1_500, 7, 0, -1, 2**62)]
    assert lengths == ["1 d", "90 min", "1,500 ms", "7 ms", "-", "-", f"{2**62:,} ms"]
    assert [views.share(*pair) for pair in ((1, 3), (5, 0), (-1, 5), (9, 4))] == [
        33.33,
        0.0,
        0.0,
        100.0,
    ]
    now = 10 * DAY_MS
    assert views.window_state(now + HOUR_MS, DAY_MS, now) == "not begun, begins in 60 min"
    assert views.window_state(2**62, DAY_MS, now) == "not begun"
    assert views.window_state(now - HOUR_MS, DAY_MS, now) == "current, ends in 23.0 h"
    assert views.window_state(now - HOUR_MS, INT64_MAX, now) == "current"
    assert views.window_state(0, DAY_MS, now) == "ended 9 d ago"
    assert views.window_state(0, 0, now) == "length unknown: only debits recorded, no lease"
    assert views.instant(0) == "1970-01-01 00:00:00.000 UTC" and views.when(0) == "-"


def test_without_windows_the_page_says_no_worker_has_leased(effector: EffectorThread) -> None:
    with client_for(effector) as client:
        answer = client.get("/budgets")
        overview = client.get("/").text
    assert answer.status_code == 200
    assert '<a href="/budgets" aria-current="page">Budgets</a>' in answer.text
    assert '<a href="/policies">Policies</a>\n<a href="/budgets">Budgets</a>' in overview
    assert "<title>Budgets · effector console</title>" in answer.text
    shown = page_text(between(answer.text, '<p class="empty" id="no-budgets">', "</p>"))
    assert shown == (
        "No budget windows: no worker has leased from a fleet budget. An agent gets one with "
        "AgentConfig(budget=Budget(...))."
    )
    assert 'id="budgets"' not in answer.text


def test_leased_and_debited_windows_show_cap_debited_leased_and_remaining(
    effector: EffectorThread,
) -> None:
    first = lease(
        effector,
        "fleet-a",
        cap_tokens=1_000,
        cap_cost_micros=5_000_000,
        want_tokens=300,
        want_cost_micros=1_000_000,
    )
    second = lease(
        effector,
        "fleet-a",
        cap_tokens=1_000,
        cap_cost_micros=5_000_000,
        want_tokens=200,
        want_cost_micros=500_000,
        owner="worker-2",
    )
    assert (first.granted_tokens, second.granted_tokens) == (300, 200)
    start_a = first.window_start_ms
    calls = [
        debit_intent(
            KEY,
            0,
            ledger="fleet-a",
            window_start_ms=start_a,
            lease_id=first.lease_id,
            tokens=120,
            cost_micros=250_000,
        ),
        debit_intent(
            KEY,
            1,
            ledger="fleet-a",
            window_start_ms=start_a,
            lease_id=first.lease_id,
            tokens=30,
            cost_micros=50_000,
        ),
    ]
    assert [ack.outcome for ack in submit_debits(effector, *calls)] == [SubmitAck.ACCEPTED] * 2
    [again] = submit_debits(effector, calls[0])  # a retried bundle: recorded once, by id
    assert again.outcome == SubmitAck.DUPLICATE
    hourly = lease(effector, "fleet-b", window_ms=HOUR_MS, cap_tokens=1_000, want_tokens=1_000)
    assert hourly.granted_tokens == 1_000
    overshoot = debit_intent(  # one call's overshoot: more than the lease held
        KEY,
        2,
        ledger="fleet-b",
        window_start_ms=hourly.window_start_ms,
        lease_id=hourly.lease_id,
        tokens=1_100,
        cost_micros=9_000,
    )
    assert [ack.outcome for ack in submit_debits(effector, overshoot)] == [SubmitAck.ACCEPTED]
    with client_for(effector) as client:
        answer = client.get("/budgets")
        debit_page = client.get(f"/intents/{calls[0].intent_id}").text
        listed = page_text(client.get("/intents").text)
    assert answer.status_code == 200
    page = answer.text
    assert len(_windows(page)) == 2
    daily = _window(page, "fleet-a")
    start = views.instant(start_a)
    assert f'<time title="{start_a}">{start}</time>' in daily
    window_cells = page_text(between(daily, '<td rowspan="3">', '<th scope="row">'))
    assert window_cells.startswith(f"{start} 1 d · current, ends in ")
    assert start_a % DAY_MS == 0
    assert _measure(daily, "tokens") == "tokens 1,000 150 350 500"  # 150+150 held, 200 held
    assert _measure(daily, "cost") == "cost $5.00 $0.30 $1.20 $3.50"
    assert _bar(daily, "tokens") == [
        ("debited", "", "15.0"),
        ("leased", "15.0", "35.0"),
        ("remaining", "50.0", "50.0"),
    ]
    assert _bar(daily, "cost") == [
        ("debited", "", "6.0"),
        ("leased", "6.0", "24.0"),
        ("remaining", "30.0", "70.0"),
    ]
    assert 'aria-label="debited 15%, leased 35%, remaining 50% of the cap"' in daily
    counts = re.findall(r'<td rowspan="3" class="num">(\d+)</td>', daily)
    assert counts == ["2", "2"]  # live leases, debits (the duplicate debited nothing)

    hour = _window(page, "fleet-b")
    assert f"{views.instant(hourly.window_start_ms)} 1 h · current, ends in " in page_text(hour)
    assert _measure(hour, "tokens") == "tokens 1,000 1,100 0 0 over the cap by 100"
    assert _measure(hour, "cost") == "cost no cap $0.009 $0.00 no cap"
    assert _bar(hour, "tokens") == [
        ("debited", "", "100.0"),
        ("leased", "100.0", "0.0"),
        ("remaining", "100.0", "0.0"),
    ]
    assert page.count("<svg") == 3  # no bar for a measure without a cap
    assert re.findall(r'<td rowspan="3" class="num">(\d+)</td>', hour) == ["1", "1"]
    if hourly.window_start_ms != start_a:  # newest first (the same start: by ledger)
        assert page.index("fleet-b") < page.index("fleet-a")
    assert 'BUDGET_DEBIT · <a href="/budgets">fleet budgets</a>' in debit_page
    assert f"{calls[0].intent_id} {KEY.decode()} budget debit DONE" in listed


def test_the_page_lists_the_newest_windows_and_offers_more(effector: EffectorThread) -> None:
    for name in ("b-1", "b-2", "b-3"):
        lease(effector, name, cap_tokens=10, want_tokens=1)
    with client_for(effector) as client:
        one = client.get("/budgets", params={"windows": "1"}).text
        odd = client.get("/budgets", params={"windows": "x1"}).text
        all_of_them = client.get("/budgets", params={"windows": "1000"}).text
    assert len(_windows(one)) == 1 and "b-1" in one  # the same start: by ledger
    assert 'the newest 1: <a href="/budgets?windows=4">show 4</a>' in one
    assert len(_windows(odd)) == 3 and "show " not in odd  # not a number: the default
    assert len(_windows(all_of_them)) == 3


EVIL = "acct\x00\x1b[31m\u202e-evil"
LONG = "<script>alert(1)</script>" + "x" * 5_000


def _hostile_rows(db: Path, clock: int) -> None:
    """Windows and leases no API would write, straight into the store's tables."""
    today = clock - clock % DAY_MS
    windows = [
        # (ledger, start, length, cap tokens, cap cost, debited tokens, debited cost, debits)
        (EVIL, today, DAY_MS, 2**53, 2**53, 2**53 - 1, 2**53, 2**53),
        ("future", 2**62, DAY_MS, 100, 0, 0, 0, 0),
        ("epoch", 0, 0, 0, 0, 7, 9, 1),
        ("zero-caps", today, HOUR_MS, 0, 0, 0, 0, 0),
        (LONG, today, DAY_MS, 10, 0, 0, 0, 0),
        ("int64", INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX),
        ("negative", -5_000, 5_000, -1, -1, -7, -7, -1),
    ]
    leases = [
        # (lease id, ledger, start, granted tokens, granted cost, expires)
        ("lease-evil", EVIL, today, 2**53, 2**53, clock + DAY_MS),
        ("lease-evil-2", EVIL, today, 2**53, 0, clock + DAY_MS),
        ("lease-future", "future", 2**62, 60, 0, INT64_MAX),
        ("lease-lapsed", "zero-caps", today, 5, 5, 1),
    ]
    connection = sqlite3.connect(db, timeout=30)
    try:
        with connection:
            connection.executemany(
                """INSERT INTO effector_budget_windows (ledger, window_start_ms, window_ms,
                     cap_tokens, cap_cost_micros, cap_requests, debited_tokens,
                     debited_cost_micros, debited_requests, debits, updated_at_ms)
                   VALUES (?, ?, ?, ?, ?, 0, ?, ?, 0, ?, ?)""",
                [(*window, clock) for window in windows],
            )
            connection.executemany(
                """INSERT INTO effector_budget_leases (lease_id, ledger, window_start_ms, owner,
                     granted_tokens, granted_cost_micros, granted_requests, debited_tokens,
                     debited_cost_micros, debited_requests, granted_at_ms, expires_at_ms)
                   VALUES (?, ?, ?, 'w\u202e', ?, ?, 0, 0, 0, 0, ?, ?)""",
                [(*row[:5], clock, row[5]) for row in leases],
            )
    finally:
        connection.close()


def test_hostile_windows_never_break_the_page_and_show_escaped(
    effector: EffectorThread, tmp_path: Path
) -> None:
    clock = now_ms()
    _hostile_rows(tmp_path / "effector.db", clock)
    # A debit for a ledger no lease may name (not printable) is refused, as LeaseBudget is.
    odd = debit_intent(KEY, 5, ledger="odd\u202e\x1b[2J", window_start_ms=0, tokens=3)
    assert [ack.outcome for ack in submit_debits(effector, odd)] == [SubmitAck.REJECTED]
    with client_for(effector, timeout=60) as client:
        answer = client.get("/budgets")
    assert answer.status_code == 200
    page = answer.text
    assert len(answer.content) < 2_000_000
    for hiding in ("\u202e", "\x1b", "\x00"):
        assert hiding not in page, hiding
    assert "<script>" not in page
    assert len(_windows(page)) == 7

    evil = _window(page, "acct⟨U+0000⟩⟨U+001B⟩[31m⟨U+202E⟩-evil")
    assert (
        "Look closely: U+0000 unnamed, U+001B unnamed, U+202E RIGHT-TO-LEFT OVERRIDE"
        in page_text(evil)
    )
    assert _measure(evil, "tokens") == (
        "tokens 9,007,199,254,740,992 9,007,199,254,740,991 18,014,398,509,481,984 0 "
        "over the cap by 18,014,398,509,481,983"
    )
    assert _measure(evil, "cost") == (
        "cost $9,007,199,254.740992 $9,007,199,254.740992 $9,007,199,254.740992 $0.00 "
        "over the cap by $9,007,199,254.740992"
    )
    assert _bar(evil, "tokens") == [
        ("debited", "", "100.0"),
        ("leased", "100.0", "0.0"),
        ("remaining", "100.0", "0.0"),
    ]
    assert re.findall(r'<td rowspan="3" class="num">(\d+)</td>', evil) == ["2", str(2**53)]

    future = _window(page, "future")
    assert f"out of range ({2**62} ms) 1 d · not begun" in page_text(future)
    assert _measure(future, "tokens") == "tokens 100 0 60 40"

    epoch = _window(page, "epoch")
    assert "1970-01-01 00:00:00.000 UTC - · length unknown: only debits recorded" in page_text(
        epoch
    )
    assert _measure(epoch, "tokens") == "tokens no cap 7 0 no cap"
    assert _measure(epoch, "cost") == "cost no cap $0.000009 $0.00 no cap"

    zero = _window(page, "zero-caps")
    assert _measure(zero, "tokens") == "tokens no cap 0 0 no cap"  # the lapsed lease holds none
    assert "<svg" not in zero

    long = _window(page, "&lt;script&gt;alert(1)&lt;/script&gt;" + "x" * 487)
    assert f"… ({len(LONG) - 512} more characters)" in page_text(long)

    biggest = _window(page, "int64")
    assert f"out of range ({INT64_MAX} ms)" in page_text(biggest)
    assert _measure(biggest, "tokens") == f"tokens {INT64_MAX:,} {INT64_MAX:,} 0 0"

    negative = _window(page, "negative")
    assert _measure(negative, "tokens") == "tokens -1 -7 0 6"  # what the ledger would grant
    assert "ended " in page_text(negative)

    assert "odd⟨U+202E⟩" not in page  # refused at Submit: never a window
