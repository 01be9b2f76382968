"""The console over HTTP: every page, every action, and what the guard refuses.

Each test runs an effector in this process with its console on a free 127.0.0.1 port and
talks to it with httpx, as a browser would (cookies kept, redirects looked at). What a page
shows is checked against what the store holds; what an action does is checked in the store
and on the envelope log.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from beam_agents._protos import AgentEnvelope, AgentError, IntentState, ToolResult
from effector.console import actions, create_app
from effector.console.security import SESSION_LIFETIME_S
from effector.launch import EffectorThread
from effector.store.errors import StoreError
from effector.store.intents import NewIntent
from tests.console.harness import (
    KEY,
    TOKEN,
    client_for,
    console_url,
    csrf_of,
    intent,
    log_envelopes,
    seed,
    start_effector,
)
from tests.console.runs_data import agent_run, approval_intent, now_ms


def test_every_page_shows_what_the_store_holds(effector: EffectorThread) -> None:
    ids = seed(effector)
    with client_for(effector) as client:
        overview = client.get("/")
        assert overview.status_code == 200
        assert 'http-equiv="refresh"' in overview.text
        assert "AWAITING_DECISION" in overview.text and ids["approval"] in overview.text
        assert "Model tokens per minute" in overview.text

        keys = client.get("/keys", params={"q": "customer"})
        assert f'href="/keys/{KEY.hex()}"' in keys.text and "customer-7" in keys.text
        assert "customer-7" not in client.get("/keys", params={"q": "nobody"}).text

        key = client.get(f"/keys/{KEY.hex()}")
        assert key.status_code == 200
        for shown in ("Run 2", "Run 1", "Run 0", "model claude-sonnet-4", "tool lookup_order"):
            assert shown in key.text, shown
        assert "812 in / 96 out tokens" in key.text  # run 0's model call
        assert "activation (approval)" in key.text and "until resumed by approval" in key.text
        assert key.text.count('class="status completed"') == 2
        assert key.text.count('class="status suspended"') == 1
        assert ids["approval"] in key.text  # the current suspension
        assert "customer_profile" in key.text and "311 B" in key.text  # memory slots

        listed = client.get("/intents", params={"state": "AWAITING_DECISION", "key": "customer-7"})
        assert ids["approval"] in listed.text
        assert ids["approval"] not in client.get("/intents", params={"state": "DONE"}).text
        one = client.get(f"/intents/{ids['approval']}")
        assert (
            '"cents": 75000' in html.unescape(one.text) and "Received by the effector" in one.text
        )

        inbox = client.get("/approvals")
        assert ids["approval"] in inbox.text and "refund-reviewers" in inbox.text
        assert '"refund": "r-7"' in html.unescape(inbox.text)

        errors = client.get("/errors")
        assert ids["error"] in errors.text and "activation_error" in errors.text
        error = client.get(f"/errors/{ids['error']}")
        assert "KeyError: 'order_id'" in html.unescape(error.text) and "Traceback" in error.text
        assert f'href="/errors/{ids["error"]}/redrive"' in error.text
        confirm = client.get(f"/errors/{ids['error']}/redrive")
        assert confirm.status_code == 200 and "Yes, publish it again" in confirm.text

        for odd in ({"window": "²"}, {"window": "-5"}, {"runs": "1e9"}, {"runs": "0"}):
            assert client.get(f"/keys/{KEY.hex()}", params=odd).status_code == 200, odd
            assert client.get("/", params=odd).status_code == 200, odd
        for missing in ("/keys/zz", "/intents/not-an-id", "/errors/0000", "/no-such-page"):
            assert client.get(missing).status_code == 404, missing
        assert client.get("/static/console.css").status_code == 200


def test_keys_that_are_not_text_are_shown_and_found_as_hex(effector: EffectorThread) -> None:
    binary = b"\x00\xffk"
    effector.run(
        effector.server.store.record_traces(agent_run(binary, 0, time.time_ns()), now_ms())
    )
    with client_for(effector) as client:
        found = client.get("/keys", params={"q": "0x00ff"})
        assert f'href="/keys/{binary.hex()}"' in found.text and "0x00ff6b" in found.text
        assert "Run 0" in client.get(f"/keys/{binary.hex()}").text


def test_a_run_without_wall_clock_times_is_drawn_by_event_time(effector: EffectorThread) -> None:
    events = agent_run(KEY, 0, time.time_ns(), timed=False)
    effector.run(effector.server.store.record_traces(events, now_ms()))
    with client_for(effector) as client:
        page = client.get(f"/keys/{KEY.hex()}").text
    assert "bars by order" in page and "model claude-sonnet-4" in page


def test_approving_goes_through_decide_and_records_the_approver(effector: EffectorThread) -> None:
    ids = seed(effector)
    with client_for(effector) as client:
        form = {"csrf_token": csrf_of(client.get("/approvals").text), "decision": "approve"}
        answer = client.post(f"/approvals/{ids['approval']}", data={**form, "approver": "dana"})
        assert answer.status_code == 303
        assert answer.headers["location"] == f"/approvals?decided={ids['approval']}"
        shown = client.get(answer.headers["location"]).text
        assert "approved by dana" in shown
    record = intent(effector, ids["approval"])
    assert record.state == IntentState.DONE and record.result is not None
    assert record.result.status == ToolResult.OK
    [published] = [e for e in log_envelopes(effector) if e.HasField("approval")]
    assert published.approval.intent_id == ids["approval"]
    assert published.approval.approved and published.approval.approver == "dana"


def test_the_inbox_shows_the_oldest_approvals_and_says_more_wait(
    effector: EffectorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "INBOX_LIMIT", 3)
    store, first = effector.server.store, now_ms() - 60_000
    approvals = [approval_intent(KEY, seq, {"refund": f"r-{seq}"}, first) for seq in range(5)]
    for seq, approval in enumerate(approvals):  # received a second apart, oldest first
        effector.run(store.submit([NewIntent(approval)], first + seq * 1_000))
    with client_for(effector) as client:
        inbox = client.get("/approvals").text
    shown = re.findall(r'id="approval-([0-9a-f-]+)"', inbox)
    assert shown == [approval.intent_id for approval in approvals[:3]]
    assert "5 approvals await a decision; these are the oldest 3" in inbox


def test_a_store_failure_answers_503_and_is_logged(
    effector: EffectorThread, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def fail(*args: object) -> None:
        raise StoreError("the database is locked")

    monkeypatch.setattr(effector.server.store, "list_errors", fail)
    with client_for(effector) as client:
        answer = client.get("/errors")
    assert answer.status_code == 503 and "store is unavailable" in answer.text
    [record] = [r for r in caplog.records if r.name == "effector.console.app"]
    assert record.levelno == logging.WARNING
    assert "GET /errors" in record.getMessage() and "the database is locked" in record.getMessage()


def test_denying_records_the_reason_and_a_second_decision_is_refused(
    effector: EffectorThread,
) -> None:
    ids = seed(effector)
    with client_for(effector) as client:
        csrf = csrf_of(client.get("/approvals").text)
        deny = {"csrf_token": csrf, "decision": "deny", "approver": "lee", "reason": "too large"}
        assert client.post(f"/approvals/{ids['approval']}", data=deny).status_code == 303
        again = client.post(f"/approvals/{ids['approval']}", data={**deny, "decision": "approve"})
        assert again.status_code == 409 and "already decided" in again.text
        assert (
            "denied by lee: too large" in client.get(f"/approvals?decided={ids['approval']}").text
        )
        unnamed = client.post(f"/approvals/{ids['approval']}", data={**deny, "approver": " "})
        assert unnamed.status_code == 400
        long = client.post(f"/approvals/{ids['approval']}", data={**deny, "reason": "x" * 5000})
        assert long.status_code == 400 and "longer than 4096" in long.text
    [published] = [e for e in log_envelopes(effector) if e.HasField("approval")]
    assert not published.approval.approved and published.approval.reason == "too large"


def test_redriving_publishes_the_envelope_again_and_notes_it(effector: EffectorThread) -> None:
    ids = seed(effector)
    stored = effector.run(effector.server.store.get_error(ids["error"]))
    assert stored is not None and stored.redriven_at_ms is None
    path = f"/errors/{ids['error']}/redrive"
    with client_for(effector) as client:
        form = {"csrf_token": csrf_of(client.get(path).text), "requester": "dana"}
        assert client.post(path, data={**form, "requester": " "}).status_code == 400
        answer = client.post(path, data=form)
        assert answer.status_code == 303
        shown = client.get(answer.headers["location"]).text
        assert "published again at offset" in shown
    [published] = log_envelopes(effector)
    assert published == AgentEnvelope.FromString(stored.error.envelope)
    after = effector.run(effector.server.store.get_error(ids["error"]))
    assert after is not None and after.redriven_at_ms is not None


def test_a_redrive_publishes_once_however_often_it_is_sent(effector: EffectorThread) -> None:
    ids = seed(effector)
    path = f"/errors/{ids['error']}/redrive"
    with client_for(effector) as client:
        form = {"csrf_token": csrf_of(client.get(path).text), "requester": "dana"}
        cookies = dict(client.cookies)

    def send(_: int) -> httpx.Response:  # another tab, or another click, of the same session
        with client_for(effector, cookies=cookies) as tab:
            return tab.post(path, data=form)

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(send, range(6)))
    assert sorted(answer.status_code for answer in answers) == [303] + [409] * 5
    assert all("already re-driven" in a.text for a in answers if a.status_code == 409)
    assert len(log_envelopes(effector)) == 1
    with client_for(effector, cookies=cookies) as client:
        assert 'href="' + path + '">Re-drive again' in client.get(f"/errors/{ids['error']}").text
        confirm = client.get(path).text
        assert "already re-driven" in confirm and "Yes, re-drive it again" in confirm
        assert 'name="again" value="yes"' in confirm
        again = client.post(path, data={**form, "again": "yes"})
        assert again.status_code == 303 and again.headers["location"].endswith("?offset=2")
    assert len(log_envelopes(effector)) == 2


def test_an_error_without_an_envelope_cannot_be_redriven(effector: EffectorThread) -> None:
    ids = seed(effector)
    path = f"/errors/{ids['timer_error']}"
    with client_for(effector) as client:
        page = client.get(path).text
        assert "cannot be re-driven" in page and "a timer" in page
        assert f'href="{path}/redrive"' not in page
        assert client.get(f"{path}/redrive").status_code == 409
        csrf = csrf_of(client.get("/approvals").text)
        assert client.post(f"{path}/redrive", data={"csrf_token": csrf}).status_code == 409
    assert log_envelopes(effector) == []


def test_an_error_whose_envelope_names_another_key_is_not_redriven(
    effector: EffectorThread,
) -> None:
    """A key_mismatch error (or a forged one) must not publish to a key its page never named."""
    seed(effector)
    elsewhere = AgentEnvelope(entity_key=b"other-key", event_time_ms=1, external_event=b"x")
    error = AgentError(
        entity_key=b"h-err3", reason="key_mismatch", envelope=elsewhere.SerializeToString()
    )
    effector.run(effector.server.store.record_errors([error], now_ms()))
    [stored] = effector.run(effector.server.store.list_errors(b"h-err3", 10))
    path = f"/errors/{stored.error_id}"
    with client_for(effector) as client:
        page = client.get(path).text
        assert "cannot be re-driven" in page and "not this error&#39;s key" in page
        assert f'href="{path}/redrive"' not in page
        csrf = csrf_of(client.get("/approvals").text)
        refused = client.post(f"{path}/redrive", data={"csrf_token": csrf, "requester": "dana"})
        assert refused.status_code == 409
    assert log_envelopes(effector) == []


def test_every_post_needs_the_sessions_csrf_token_and_the_same_origin(
    effector: EffectorThread,
) -> None:
    ids = seed(effector)
    target = f"/approvals/{ids['approval']}"
    decision = {"decision": "approve", "approver": "mallory"}
    with client_for(effector) as client:
        csrf = csrf_of(client.get("/approvals").text)
        refused = [
            client.post(target, data=decision),
            client.post(target, data={**decision, "csrf_token": "0" * 64}),
            client.post(
                target,
                data={**decision, "csrf_token": csrf},
                headers={"Origin": "http://evil.example"},
            ),
            client.post(
                target,
                data={**decision, "csrf_token": csrf},
                headers={"Sec-Fetch-Site": "cross-site"},
            ),
            client.post(f"/errors/{ids['error']}/redrive", data={}),
            client.post("/logout", data={}),
        ]
        assert [answer.status_code for answer in refused] == [403] * 6
    with client_for(effector) as stranger:  # another session: the token is bound to the first
        assert stranger.post(target, data={**decision, "csrf_token": csrf}).status_code == 403
    assert intent(effector, ids["approval"]).state == IntentState.AWAITING_DECISION
    assert log_envelopes(effector) == []
    with client_for(effector) as client:
        csrf = csrf_of(client.get("/approvals").text)
        same_origin = {"Origin": console_url(effector), "Sec-Fetch-Site": "same-origin"}
        allowed = client.post(target, data={**decision, "csrf_token": csrf}, headers=same_origin)
        assert allowed.status_code == 303


def test_pages_carry_the_security_headers_and_a_strict_session_cookie(
    effector: EffectorThread,
) -> None:
    with client_for(effector) as client:
        for path in ("/", "/keys", "/static/console.css", "/no-such-page"):
            headers = client.get(path).headers
            assert headers["x-frame-options"] == "DENY", path
            assert "frame-ancestors 'none'" in headers["content-security-policy"], path
            assert headers["content-security-policy"].startswith("default-src 'self'"), path
            assert headers["x-content-type-options"] == "nosniff", path
            assert headers["referrer-policy"] == "no-referrer", path
    with client_for(effector) as fresh:
        cookie = fresh.get("/").headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie


def test_a_loopback_console_without_a_token_answers_only_loopback_names(tmp_path: Path) -> None:
    with start_effector(tmp_path, host="127.0.0.2") as effector:
        port = effector.server.console_port
        assert effector.console_url == f"http://127.0.0.2:{port}/"
        with client_for(effector) as client:
            for host in (f"127.0.0.2:{port}", "127.0.0.3", f"localhost:{port}", f"[::1]:{port}"):
                assert client.get("/", headers={"Host": host}).status_code == 200, host
            for host in ("attacker.example", "127.0.0.2.attacker.example", "0.0.0.0", "[::]"):
                assert client.get("/", headers={"Host": host}).status_code == 421, host


def test_with_a_token_every_page_and_post_needs_a_login(guarded: EffectorThread) -> None:
    ids = seed(guarded)
    with client_for(guarded) as client:
        for path in ("/", "/keys", f"/keys/{KEY.hex()}", "/intents", "/approvals", "/errors"):
            answer = client.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/login?next="), path
        decision = {"decision": "approve", "approver": "mallory", "csrf_token": "x"}
        assert client.post(f"/approvals/{ids['approval']}", data=decision).status_code == 403
        assert client.post(f"/errors/{ids['error']}/redrive", data={}).status_code == 403
        assert client.get("/static/console.css").status_code == 200  # the login page's style

        login_page = client.get("/login", params={"next": "/approvals"})
        assert login_page.status_code == 200 and 'type="password"' in login_page.text
        wrong = client.post("/login", data={"token": "not-" + TOKEN, "next": "/approvals"})
        assert wrong.status_code == 403 and "set-cookie" not in wrong.headers
        cross = client.post(
            "/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"}
        )
        assert cross.status_code == 403 and "set-cookie" not in cross.headers

        right = client.post("/login", data={"token": TOKEN, "next": "/approvals"})
        assert right.status_code == 303 and right.headers["location"] == "/approvals"
        cookie = right.headers["set-cookie"]
        assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie

        pages = [client.get(path) for path in ("/", f"/keys/{KEY.hex()}", "/approvals", "/errors")]
        assert [page.status_code for page in pages] == [200] * 4
        assert not any(TOKEN in page.text for page in pages)
        csrf = csrf_of(pages[2].text)
        decided = client.post(
            f"/approvals/{ids['approval']}", data={**decision, "csrf_token": csrf}
        )
        assert decided.status_code == 303

        assert client.post("/logout", data={"csrf_token": csrf}).status_code == 303
        assert client.get("/").status_code == 303
    assert intent(guarded, ids["approval"]).state == IntentState.DONE


def test_login_redirects_only_within_the_console(guarded: EffectorThread) -> None:
    with client_for(guarded) as client:
        for target in ("//evil.example/", "https://evil.example/", "\\\\evil"):
            answer = client.post("/login", data={"token": TOKEN, "next": target})
            assert answer.headers["location"] == "/", target


def test_a_forged_or_expired_session_is_refused(guarded: EffectorThread) -> None:
    with client_for(guarded) as client:
        client.post("/login", data={"token": TOKEN})
        issued, nonce, holder, mac = client.cookies["beam_agents_console"].split(".")
        for forged in (
            f"{int(issued) + 1}.{nonce}.{holder}.{mac}",
            f"{issued}.{nonce}.{holder}.{'0' * 64}",
            f"{issued}.{nonce}.{b'ann'.hex()}.{mac}",  # someone else's name
            TOKEN,
        ):
            client.cookies.clear()
            client.cookies.set("beam_agents_console", forged)
            assert client.get("/").status_code == 303, forged
        client.cookies.clear()
        client.cookies.set("beam_agents_console", f"{issued}.{nonce}.{holder}.{mac}")
        assert client.get("/").status_code == 200
    with httpx.Client(base_url=console_url(guarded)) as other:
        other.cookies.set("beam_agents_console", f"{issued}.{nonce}.{holder}.{mac}")
        assert other.get("/", follow_redirects=False).status_code == 200  # the cookie is it

    # Expiry, on a console whose clock the test moves (a page that reads no store: a 404).
    now = [time.time()]
    app = create_app(guarded.server.service, token=TOKEN, clock=lambda: now[0])

    async def pages_over_a_session() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            assert (await client.post("/login", data={"token": TOKEN})).status_code == 303
            answers = []
            for step_s in (0, SESSION_LIFETIME_S - 1, 1):
                now[0] += step_s
                answers.append((await client.get("/no-such-page")).status_code)
            return answers

    assert asyncio.run(pages_over_a_session()) == [404, 404, 303]  # 303: to the login
