# mypy: disallow-untyped-calls=False
"""The console in real headless Chromium: every page, approving, re-driving, and the login.

Pages must load with their style sheet under the Content-Security-Policy and leave no error in
the browser's log (the ``page`` fixture checks). The docs' picture of the keys page
(``docs/operations.md``) comes from a real pipeline's run instead (``test_console_loop.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By

from beam_agents._protos import IntentState
from effector.launch import EffectorThread
from effector.store.intents import gate_id_for
from tests.console.budget_data import debit_intent, lease, submit_debits
from tests.console.harness import (
    KEY,
    TOKEN,
    body_text,
    console_url,
    follow,
    intent,
    log_envelopes,
    seed,
    start_effector,
)
from tests.console.policy_data import registry, submit_intents, tool_intent, write_policy
from tests.console.runs_data import MS, agent_run, approval_intent, key_runs, now_ms, submit


def test_every_page_loads_with_its_style_and_no_browser_error(
    page: webdriver.Chrome, effector: EffectorThread
) -> None:
    ids = seed(effector)
    base = console_url(effector)
    pages = {
        "/": "Overview",
        "/keys": "Keys",
        f"/keys/{KEY.hex()}": "Key customer-7",
        "/intents": "Intents",
        f"/intents/{ids['approval']}": f"Intent {ids['approval']}",
        "/approvals": "Approvals inbox",
        "/errors": "Errors",
        f"/errors/{ids['error']}": "Error activation_error",
        f"/errors/{ids['error']}/redrive": "Re-drive this envelope?",
    }
    for path, heading in pages.items():
        page.get(base + path)
        assert page.find_element(By.TAG_NAME, "h1").text == heading, path
        header = page.find_element(By.TAG_NAME, "header")
        assert header.value_of_css_property("background-color") == "rgba(29, 35, 43, 1)", path
    page.get(f"{base}/keys/{KEY.hex()}")
    bars = page.find_elements(By.CSS_SELECTOR, "table.waterfall rect")
    assert len(bars) == 2 * 10 + 5 and all(bar.size["width"] > 0 for bar in bars)


def test_approve_in_the_inbox(page: webdriver.Chrome, effector: EffectorThread) -> None:
    ids = seed(effector)
    page.get(console_url(effector) + "/approvals")
    card = page.find_element(By.ID, f"approval-{ids['approval']}")
    card.find_element(By.NAME, "approver").send_keys("dana")
    card.find_element(By.NAME, "reason").send_keys("customer of ten years")
    follow(page, card.find_element(By.CSS_SELECTOR, "button.approve"))
    notice = page.find_element(By.CSS_SELECTOR, "p.notice").text
    assert "approved by dana: customer of ten years" in notice
    assert "Nothing awaits a decision." in body_text(page)
    assert intent(effector, ids["approval"]).state == IntentState.DONE
    [approval] = [e.approval for e in log_envelopes(effector) if e.HasField("approval")]
    assert (approval.approved, approval.approver) == (True, "dana")


def test_redrive_an_error_after_confirming(
    page: webdriver.Chrome, effector: EffectorThread
) -> None:
    ids = seed(effector)
    page.get(f"{console_url(effector)}/errors")
    follow(page, page.find_element(By.CSS_SELECTOR, f'a[href="/errors/{ids["error"]}"]'))
    follow(page, page.find_element(By.LINK_TEXT, "Re-drive…"))
    assert page.find_element(By.TAG_NAME, "h1").text == "Re-drive this envelope?"
    assert log_envelopes(effector) == [], "nothing is published before the confirmation"
    page.find_element(By.NAME, "requester").send_keys("dana")
    follow(page, page.find_element(By.XPATH, "//button[text()='Yes, publish it again']"))
    assert "published again at offset 1" in page.find_element(By.CSS_SELECTOR, "p.notice").text
    [published] = log_envelopes(effector)
    assert published.external_event == b'{"refund": "r-9"}'
    page.get(f"{console_url(effector)}/errors/{ids['timer_error']}")
    assert "cannot be re-driven" in body_text(page)
    assert page.find_elements(By.LINK_TEXT, "Re-drive…") == []


def test_with_a_token_a_post_without_login_is_refused(
    page: webdriver.Chrome, guarded: EffectorThread
) -> None:
    ids = seed(guarded)
    base = console_url(guarded)
    page.get(f"{base}/approvals")
    assert page.current_url.startswith(f"{base}/login?next=")
    status = page.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "POST", body: new URLSearchParams(
            {decision: "approve", approver: "mallory", csrf_token: "x"})})
          .then(answer => done(answer.status));""",
        f"{base}/approvals/{ids['approval']}",
    )
    assert status == 403
    page.get_log("browser")  # the refused fetch is logged as an error; that one is expected
    assert intent(guarded, ids["approval"]).state == IntentState.AWAITING_DECISION

    page.find_element(By.NAME, "token").send_keys("wrong-token")
    follow(page, page.find_element(By.XPATH, "//button[text()='Log in']"))
    assert "not the effector's token" in body_text(page)
    page.get_log("browser")  # the refused login answered 403
    page.find_element(By.NAME, "token").send_keys(TOKEN)
    follow(page, page.find_element(By.XPATH, "//button[text()='Log in']"))
    assert page.current_url == f"{base}/approvals"
    assert page.execute_script("return document.cookie") == ""  # HttpOnly
    assert TOKEN not in page.page_source
    card = page.find_element(By.ID, f"approval-{ids['approval']}")
    card.find_element(By.NAME, "approver").send_keys("dana")
    follow(page, card.find_element(By.CSS_SELECTOR, "button.deny"))
    assert "denied by dana" in page.find_element(By.CSS_SELECTOR, "p.notice").text
    assert intent(guarded, ids["approval"]).state == IntentState.DONE


def test_the_keys_page_draws_each_run_as_a_waterfall(
    page: webdriver.Chrome, effector: EffectorThread
) -> None:
    key = b"customer-1042"
    store = effector.server.store
    latest = time.time_ns() - 20_000 * MS
    events = key_runs(key, 3, start_ns=latest) + agent_run(key, 3, latest, completed=False)
    effector.run(store.record_traces(events, now_ms()))
    pending = approval_intent(key, 3, {"refund": "r-1042", "cents": 84_900}, latest // MS)
    effector.run(submit(store, pending))
    page.set_window_size(1400, 1250)
    page.get(f"{console_url(effector)}/keys/{key.hex()}")
    runs = page.find_elements(By.CSS_SELECTOR, "section.run")
    assert [run.get_attribute("id") for run in runs] == ["run-3", "run-2", "run-1", "run-0"]
    statuses = [run.find_element(By.CSS_SELECTOR, ".status").text for run in runs]
    assert statuses == ["SUSPENDED", "COMPLETED", "COMPLETED", "COMPLETED"]
    suspension = page.find_element(By.ID, "suspension").text
    assert pending.intent_id in suspension and "AWAITING_DECISION" in suspension
    assert "customer_profile" in page.find_element(By.ID, "memory").text
    wait = runs[1].find_element(By.CSS_SELECTOR, "tr.wait rect")
    model = runs[1].find_element(By.CSS_SELECTOR, "tr.llm rect")
    assert wait.size["width"] > model.size["width"] > 0  # bars are to scale


def test_the_policies_page_leads_to_a_held_intent_and_its_gate(
    page: webdriver.Chrome, tmp_path: Path
) -> None:
    held = tool_intent(KEY, 1, "pay", {"account": "a-2", "cents": 5_000})
    denied = tool_intent(KEY, 2, "pay", {"account": "a-3", "cents": 500_000})
    gate = gate_id_for(held.intent_id)
    policy = write_policy(tmp_path)
    with start_effector(tmp_path / "e", registry=registry(), policy_file=policy) as effector:
        submit_intents(effector, held, denied)
        page.get(f"{console_url(effector)}/policies")
        assert page.find_element(By.TAG_NAME, "h1").text == "Effect policy"
        current = page.find_element(By.CSS_SELECTOR, 'nav a[aria-current="page"]')
        assert current.text == "Policies"
        rules = page.find_elements(By.CSS_SELECTOR, "#rules tbody tr")
        assert [row.find_element(By.CSS_SELECTOR, "td.rule").text for row in rules] == [
            "no-big-sums",
            "two-eyes",
            "small-pays",
        ]
        follow(page, page.find_element(By.CSS_SELECTOR, f'a[href="/intents/{held.intent_id}"]'))
        assert page.find_element(By.ID, "held").text.startswith(
            "Held for approval: policy rule two-eyes requires a decision"
        )
        follow(page, page.find_element(By.CSS_SELECTOR, f'#held a[href="/intents/{gate}"]'))
        assert page.find_element(By.ID, "opened-by-policy").text.startswith(
            f"Opened by policy rule two-eyes for intent {held.intent_id}"
        )


def test_the_budgets_page_draws_what_a_window_debited_leased_and_has_left(
    page: webdriver.Chrome, effector: EffectorThread
) -> None:
    leased = lease(effector, "fleet-a", cap_tokens=1_000, want_tokens=300)
    spent = debit_intent(
        KEY,
        0,
        ledger="fleet-a",
        window_start_ms=leased.window_start_ms,
        lease_id=leased.lease_id,
        tokens=100,
    )
    submit_debits(effector, spent)
    page.get(f"{console_url(effector)}/budgets")
    assert page.find_element(By.TAG_NAME, "h1").text == "Fleet budgets"
    current = page.find_element(By.CSS_SELECTOR, 'nav a[aria-current="page"]')
    assert current.text == "Budgets"
    tokens = page.find_element(By.CSS_SELECTOR, "#window-1 tr.tokens")
    assert "1,000 100 200 700" in tokens.text
    parts = tokens.find_elements(By.CSS_SELECTOR, "svg.budget rect")
    widths = [part.size["width"] for part in parts]
    assert [part.get_attribute("class") for part in parts] == ["debited", "leased", "remaining"]
    assert 0 < widths[0] < widths[1] < widths[2]  # 10%, 20% and 70% of the cap, to scale
    assert abs(widths[2] / widths[0] - 7) < 0.2
    fills = {part.value_of_css_property("fill") for part in parts}
    assert len(fills) == 3
    cost = page.find_element(By.CSS_SELECTOR, "#window-1 tr.cost")
    assert cost.text.count("no cap") == 2 and cost.find_elements(By.TAG_NAME, "svg") == []
