# mypy: disallow-untyped-calls=False
"""In headless Chromium: operators see who they are, and what they may not decide.

A console of named tokens shows the name signed in and asks no name (the token's is recorded);
a token limited to channels sees the approvals of other channels greyed out, with the reason
and no live button. Arguments holding a right-to-left override are flagged and shown marked.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from beam_agents._protos import IntentState
from effector.service import parse_tokens
from tests.console.harness import (
    KEY,
    body_text,
    client_for,
    console_url,
    csrf_of,
    follow,
    intent,
    seed,
    start_effector,
)
from tests.console.runs_data import approval_intent, now_ms, submit

TOKENS = "dana:dana-secret-1\nsam:sam-secret-2:payments\n"


def _log_in(page: webdriver.Chrome, base: str, token: str) -> None:
    page.get(f"{base}/login?next=/approvals")
    page.find_element(By.NAME, "token").send_keys(token)
    follow(page, page.find_element(By.CSS_SELECTOR, "form.stack button"))


def test_a_named_token_sees_its_name_and_only_decides_its_channels(
    page: webdriver.Chrome, tmp_path: Path
) -> None:
    refunds = approval_intent(KEY, 1, {"refund": "r-1", "cents": 900}, now_ms())
    payments = approval_intent(b"payer-2", 0, {"to": "acct-\u202e4321-evil"}, now_ms())
    payments.channel = "payments"
    with start_effector(tmp_path, tokens=parse_tokens(TOKENS, "tokens")) as effector:
        effector.run(submit(effector.server.store, refunds, payments))
        base = console_url(effector)
        _log_in(page, base, "sam-secret-2")
        assert "signed in as sam" in page.find_element(By.ID, "signed-in-as").text
        assert page.find_elements(By.NAME, "approver") == []
        mine = page.find_element(By.ID, f"approval-{payments.intent_id}")
        flagged = mine.find_element(By.CSS_SELECTOR, ".hidden-characters").text
        assert "U+202E RIGHT-TO-LEFT OVERRIDE" in flagged
        assert '"to": "acct-⟨U+202E⟩4321-evil"' in mine.find_element(By.TAG_NAME, "pre").text
        theirs = page.find_element(By.ID, f"approval-{refunds.intent_id}")
        assert "not-yours" in (theirs.get_attribute("class") or "")
        assert "may not decide approvals on channel 'refund-reviewers'" in theirs.text
        assert theirs.find_elements(By.TAG_NAME, "form") == []
        assert all(not b.is_enabled() for b in theirs.find_elements(By.TAG_NAME, "button"))
        assert float(theirs.value_of_css_property("opacity")) < 1
        follow(page, mine.find_element(By.CSS_SELECTOR, "button.approve"))
        assert "approved by sam" in body_text(page)
        assert intent(effector, payments.intent_id).state == IntentState.DONE
        assert intent(effector, refunds.intent_id).state == IntentState.AWAITING_DECISION


def test_an_unnamed_token_and_no_token_say_so(page: webdriver.Chrome, tmp_path: Path) -> None:
    with start_effector(tmp_path / "open") as effector:
        page.get(console_url(effector) + "/approvals")
        assert "no login" in page.find_element(By.ID, "signed-in-as").text
    page.execute_cdp_cmd("Network.clearBrowserCookies", {})
    with start_effector(tmp_path / "shared", token="shared-secret-3") as effector:
        _log_in(page, console_url(effector), "shared-secret-3")
        shown = page.find_element(By.ID, "signed-in-as").text
        assert "signed in with the effector's token" in shown


def test_a_named_token_redrives_under_its_name_without_asking_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with start_effector(tmp_path, tokens=parse_tokens(TOKENS, "tokens")) as effector:
        ids = seed(effector)
        with client_for(effector) as client:
            assert client.post("/login", data={"token": "dana-secret-1"}).status_code == 303
            confirm = client.get(f"/errors/{ids['error']}/redrive").text
            assert 'name="requester"' not in confirm
            path = f"/errors/{ids['error']}/redrive"
            assert client.post(path, data={"csrf_token": csrf_of(confirm)}).status_code == 303
    assert any(f"error {ids['error']} re-driven by 'dana'" in line for line in caplog.messages)
