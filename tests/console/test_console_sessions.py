"""Console sessions and the audit log: logout, per-process keys, failed logins, who did what.

A session ends on the server when its owner logs out, and with the process; failed logins are
logged with the client's address and back off per client; every decision and re-drive is
logged with the address and the name given. No log line holds the token.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from effector.console.security import FREE_FAILURES, MAX_WAIT_S, LoginThrottle
from effector.launch import EffectorThread
from tests.console.harness import TOKEN, client_for, csrf_of, seed, start_effector

COOKIE = "beam_agents_console"


def test_logging_out_ends_the_session_on_the_server(guarded: EffectorThread) -> None:
    with client_for(guarded) as client, client_for(guarded) as other_tab:
        assert client.post("/login", data={"token": TOKEN}).status_code == 303
        assert other_tab.post("/login", data={"token": TOKEN}).status_code == 303
        stolen = client.cookies[COOKIE]
        csrf = csrf_of(client.get("/approvals").text)
        assert client.post("/logout", data={"csrf_token": csrf}).status_code == 303
        assert other_tab.get("/approvals").status_code == 200  # another session lives on
    with client_for(guarded, cookies={COOKIE: stolen}) as replay:
        answer = replay.get("/approvals")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        assert replay.post("/logout", data={"csrf_token": csrf}).status_code == 403


def test_a_session_is_good_only_in_the_process_that_made_it(
    guarded: EffectorThread, tmp_path: Path
) -> None:
    with client_for(guarded) as client:
        client.post("/login", data={"token": TOKEN})
        cookie = client.cookies[COOKIE]
    with (
        start_effector(tmp_path / "restarted", token=TOKEN) as restarted,
        client_for(restarted, cookies={COOKIE: cookie}) as client,
    ):
        assert client.get("/").status_code == 303  # the same token, a new salt: log in again


def test_failed_logins_are_logged_and_back_off(
    guarded: EffectorThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    wrong = "not-" + TOKEN
    with client_for(guarded) as client:
        for _ in range(FREE_FAILURES):
            assert client.post("/login", data={"token": wrong}).status_code == 403
        held_off = client.post("/login", data={"token": TOKEN})  # even the right one waits
        assert held_off.status_code == 429 and int(held_off.headers["retry-after"]) >= 1
        assert "Too many failed logins" in held_off.text and COOKIE not in held_off.cookies
    failed = [r for r in caplog.records if "failed login" in r.getMessage()]
    assert len(failed) == FREE_FAILURES
    assert all(r.levelno == logging.WARNING and "127.0.0.1" in r.getMessage() for r in failed)
    assert "(3 in a row)" in failed[-1].getMessage()
    assert any("refused unchecked" in r.getMessage() for r in caplog.records)
    assert TOKEN not in caplog.text


def test_the_login_throttle_doubles_the_wait_up_to_a_minute_and_forgets() -> None:
    now = [1_000.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    for _ in range(FREE_FAILURES - 1):
        throttle.failed("10.0.0.1")
        assert throttle.wait_s("10.0.0.1") == 0
    waits = []
    for _ in range(10):
        throttle.failed("10.0.0.1")
        waits.append(throttle.wait_s("10.0.0.1"))
    assert waits == [1, 2, 4, 8, 16, 32, MAX_WAIT_S, MAX_WAIT_S, MAX_WAIT_S, MAX_WAIT_S]
    assert throttle.wait_s("10.0.0.2") == 0  # per client
    now[0] += MAX_WAIT_S
    assert throttle.wait_s("10.0.0.1") == 0
    throttle.succeeded("10.0.0.1")
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0  # the right token cleared the count


def test_decisions_log_once_and_redrives_with_address_and_name(
    guarded: EffectorThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ids = seed(guarded)
    with client_for(guarded) as client:
        client.post("/login", data={"token": TOKEN})
        csrf = csrf_of(client.get("/approvals").text)
        decision = {"csrf_token": csrf, "decision": "deny", "approver": "lee", "reason": "no"}
        assert client.post(f"/approvals/{ids['approval']}", data=decision).status_code == 303
        redrive = {"csrf_token": csrf, "requester": "dana"}
        path = f"/errors/{ids['error']}/redrive"
        assert client.post(path, data=redrive).status_code == 303
        assert client.post(path, data=redrive).status_code == 409
    lines = [r.getMessage() for r in caplog.records if r.name == "effector.console.actions"]
    decided = [line for line in caplog.messages if ids["approval"] in line and "lee" in line]
    assert decided == [
        f"DECISION deny intent {ids['approval']} by 'lee' via console from 127.0.0.1: applied"
    ]
    assert any(
        line.startswith(f"console: error {ids['error']} re-driven by 'dana' from 127.0.0.1")
        for line in lines
    )
    assert "console: login from 127.0.0.1" in lines
    assert TOKEN not in caplog.text
