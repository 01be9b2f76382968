"""The command line: help, misconfiguration, client subcommands, graceful drain, Beam-free."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import (
    TOOLS,
    EffectorProcess,
    cli_environment,
    intent_id,
    make_intent,
    make_withdrawal,
    run_cli,
)
from effector_test_tools import read_ledger

from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
    approval_digest,
    withdrawal_id_for,
)
from effector.cli import inbox_line, intent_report
from effector.client import EffectorClient
from effector.observability import display_key
from effector.store import open_store
from effector.store.intents import NewIntent

SERVE_FLAGS = [
    "--tools",
    "--store",
    "--listen",
    "--lease-ms",
    "--tool-timeout-ms",
    "--result-retention-s",
    "--telemetry-retention-s",
    "--concurrency",
    "--token",
    "--token-file",
    "--tls-cert",
    "--tls-key",
    "--metrics-listen",
    "--allow-insecure-bind",
]


def test_help_explains_every_flag_and_its_environment_variable() -> None:
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for flag in SERVE_FLAGS:
        assert flag in text
        assert "BEAM_AGENTS_EFFECTOR_" + flag[2:].replace("-", "_").upper() in text
    for command in ("status", "pending", "failed", "show", "approve", "deny"):
        sub = run_cli(command, "--help")
        assert sub.returncode == 0
        assert "--target" in sub.stdout and "BEAM_AGENTS_EFFECTOR_TARGET" in sub.stdout
        # An empty default is not shown ("[env ...; default ]").
        assert "default ]" not in " ".join(sub.stdout.split())
    approve = " ".join(run_cli("approve", "--help").stdout.split())
    assert "[env BEAM_AGENTS_EFFECTOR_APPROVER]" in approve


def test_importing_the_effector_never_imports_beam() -> None:
    probe = (
        "import sys, effector, effector.cli, effector.server, effector.worker, effector.client, "
        "effector.store.sqlite, effector.store.postgres; "
        "from effector import EffectorToolRunner; "
        "assert 'apache_beam' not in sys.modules, 'apache_beam was imported'; print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=cli_environment()
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


def _misconfigurations(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    store = sqlite_url(tmp_path / "s.db")
    base = ["serve", "--tools", TOOLS, "--store", store, "--listen", "127.0.0.1:0"]
    return {
        "no command": ([], {}, "required"),
        "no tools": (["serve", "--store", store], {}, "--tools is required"),
        "no store": (["serve", "--tools", TOOLS], {}, "--store is required"),
        "missing module": ([*base, "--tools", "no_such_module:tools"], {}, "cannot import"),
        "not a registry": (
            [*base, "--tools", "effector_test_tools:LEDGER_ENV"],
            {},
            "not a ToolRegistry",
        ),
        "factory fails": ([*base, "--tools", "effector_test_tools:read_ledger"], {}, "failed"),
        "a tool, not a registry": (
            [*base, "--tools", "effector_test_tools:add"],
            {},
            "effector_test_tools:add is a tool ('add'), not a ToolRegistry",
        ),
        "bad spec": ([*base, "--tools", "effector_test_tools"], {}, "MODULE:ATTRIBUTE"),
        "bad store": (
            [*base, "--store", "mysql://db"],
            {},
            "unsupported store URL scheme 'mysql' (supported: postgres, postgresql, sqlite)",
        ),
        "memory store": ([*base, "--store", "sqlite:///:memory:"], {}, "in-memory"),
        "public bind": ([*base, "--listen", "0.0.0.0:0"], {}, "non-loopback"),
        "bad listen": ([*base, "--listen", "nowhere"], {}, "HOST:PORT"),
        "zero lease": ([*base, "--lease-ms", "0"], {}, "positive"),
        "bad env": (base, {"BEAM_AGENTS_EFFECTOR_CONCURRENCY": "lots"}, "integer >= 0"),
        "negative concurrency": ([*base, "--concurrency", "-1"], {}, "integer >= 0"),
        "bad env switch": (
            base,
            {"BEAM_AGENTS_EFFECTOR_ALLOW_INSECURE_BIND": "maybe"},
            "true or false",
        ),
        "no token file": (
            [*base, "--token-file", str(tmp_path / "absent")],
            {},
            "cannot read token file",
        ),
        "two tokens": (
            [*base, "--token", "a", "--token-file", str(tmp_path / "t")],
            {},
            "not both",
        ),
        "half TLS": ([*base, "--tls-cert", str(tmp_path / "c.pem")], {}, "go together"),
        "unreachable postgres": (
            [*base, "--store", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"],
            {},
            "PostgreSQL store",
        ),
    }


@pytest.mark.parametrize("case", sorted(_misconfigurations(Path("/unused"))))
def test_misconfiguration_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    args, env, expected = _misconfigurations(tmp_path)[case]
    result = run_cli(*args, env=cli_environment(**env))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert result.stdout == ""


@pytest.mark.asyncio
async def test_a_sqlite_store_in_use_is_refused(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    holder = await open_store(url)
    try:
        result = await asyncio.to_thread(
            run_cli, "serve", "--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0"
        )
    finally:
        await holder.close()
    assert result.returncode == 2
    assert "in use by another effector process" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_status_approve_deny_and_sigterm_against_a_running_server(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    env = cli_environment(
        BEAM_AGENTS_EFFECTOR_TOOLS=TOOLS,
        BEAM_AGENTS_EFFECTOR_STORE=url,
        BEAM_AGENTS_EFFECTOR_LISTEN="127.0.0.1:0",
        BEAM_AGENTS_EFFECTOR_TOKEN_FILE=str(token_file),
    )
    first = make_intent("", {"amount": 10}, key=b"a", kind=ToolIntent.APPROVAL)
    second = make_intent(
        "", {"amount": 20, "note": "big one"}, key=b"\xffb", kind=ToolIntent.APPROVAL
    )
    with EffectorProcess(env=env) as effector:
        with EffectorClient(effector.address, token="cli-token") as client:
            acks = client.submit([first, second])
            assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
        target = ["--target", effector.address, "--token-file", str(token_file)]
        inbox = run_cli("pending", *target)
        assert inbox.returncode == 0, inbox.stderr
        assert inbox.stdout.splitlines() == [
            f'{first.intent_id} a {{"amount":10}}',
            f'{second.intent_id} 0xff62 {{"amount":20,"note":"big one"}}',
        ]
        assert run_cli("pending", *target, "--limit", "1").stdout.splitlines() == [
            inbox.stdout.splitlines()[0]
        ]
        approved = run_cli("approve", first.intent_id, *target, "--approver", "ann")
        assert (approved.returncode, approved.stdout.strip()) == (0, f"approved {first.intent_id}")
        denied = run_cli("deny", second.intent_id, *target, "--reason", "too much")
        assert (denied.returncode, denied.stdout.strip()) == (0, f"denied {second.intent_id}")
        assert run_cli("pending", *target).stdout == ""
        again = run_cli("approve", first.intent_id, *target)
        assert again.returncode == 1
        assert "not applied: already decided" in again.stderr
        status = run_cli("status", *target)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout) == {
            "awaiting_decision": 0,
            "done": 2,
            "head_offset": 2,
            "in_doubt": 0,
            "withdrawn": 0,
            "held": 0,
            "in_flight": 0,
            "pending": 0,
            "running": 0,
        }
        unauthenticated = run_cli("status", "--target", effector.address)
        assert unauthenticated.returncode == 1
        assert "UNAUTHENTICATED" in unauthenticated.stderr
        effector.signal(signal.SIGTERM)
        assert effector.wait() == 0
        assert "cli-token" not in effector.stderr()
    unreachable = run_cli("status", "--target", effector.address, "--timeout-s", "2")
    assert unreachable.returncode == 1
    assert len(unreachable.stderr.strip().splitlines()) == 1


@pytest.mark.asyncio
async def test_sigterm_lets_a_running_tool_finish_and_keeps_queued_work(
    tmp_path: Path, ledger: Path
) -> None:
    url = sqlite_url(tmp_path / "s.db")
    running = make_intent("slow", {"seconds": 1.0}, key=b"k", seq=0)
    queued = make_intent("add", {"a": 1}, key=b"k", seq=1)
    args = ["--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0"]
    with EffectorProcess(*args) as effector:
        with EffectorClient(effector.address) as client:
            client.submit([running, queued])
        deadline = time.monotonic() + 20
        while not any(row.event == "started" for row in read_ledger(ledger)):
            assert time.monotonic() < deadline, "the slow tool never started"
            await asyncio.sleep(0.02)
        effector.signal(signal.SIGTERM)
        assert await asyncio.to_thread(effector.wait) == 0
    assert [row.event for row in read_ledger(ledger)] == ["started", "finished"]
    store = await open_store(url)  # the lock was released on exit
    try:
        finished = await store.get_intent(running.intent_id)
        assert finished is not None and finished.result is not None
        assert (finished.state, finished.result.status, finished.attempts) == (
            IntentState.DONE,
            ToolResult.OK,
            1,
        )
        waiting = await store.get_intent(queued.intent_id)
        assert waiting is not None and waiting.state == IntentState.PENDING
    finally:
        await store.close()
    with EffectorProcess(*args) as restarted:
        with EffectorClient(restarted.address) as client:
            deadline = time.monotonic() + 20
            while client.get_intent(queued.intent_id).state != IntentState.DONE:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert client.get_intent(queued.intent_id).result.payload == b"2"
        restarted.signal(signal.SIGINT)
        assert await asyncio.to_thread(restarted.wait) == 0


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        (b"order-17", "order-17"),
        ("caf\u00e9".encode(), "caf\u00e9"),
        (b"two words", "0x74776f20776f726473"),
        (b"\x00\x01", "0x0001"),
        (b"\xff", "0xff"),
        (b"0x41", "0x30783431"),
        (b"tab\there", "0x7461620968657265"),
    ],
)
def test_inbox_keys_are_text_when_readable_and_hex_otherwise(key: bytes, shown: str) -> None:
    assert display_key(key) == shown


def test_an_inbox_line_stays_on_one_line() -> None:
    intent = make_intent("", '{\n  "a": "x\\ny"\n}', kind=ToolIntent.APPROVAL)
    line = inbox_line(intent)
    assert "\n" not in line
    assert json.loads(line.split(" ", 2)[2]) == {"a": "x\ny"}
    assert inbox_line(make_intent("", "", kind=ToolIntent.APPROVAL)).endswith(" key {}")


def test_show_failed_and_unknown_ids_against_a_server_on_a_plain_store_path(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plain.db"  # a file path, not a sqlite:/// URL
    args = ["--tools", TOOLS, "--store", str(path), "--listen", "127.0.0.1:0"]
    added = make_intent("add", {"a": 1}, key=b"k-1", ttl_ms=60_000)
    failing = make_intent("fail", {"message": "boom\nagain"}, key=b"k-2")
    unknown_tool = make_intent("no_such_tool", {}, key=b"k-3")
    nobody = "00000000-0000-4000-8000-000000000000"
    with EffectorProcess(*args) as effector:
        target = ["--target", effector.address]
        nothing = run_cli("failed", *target)
        assert (nothing.returncode, nothing.stdout) == (0, "")
        assert nothing.stderr.strip() == "nothing failed: every DONE intent has an OK result"
        empty = run_cli("pending", *target)
        assert (empty.returncode, empty.stdout) == (0, "")
        assert empty.stderr.strip() == "nothing pending: no approval awaits a decision"
        with EffectorClient(effector.address) as client:
            client.submit([added, failing, unknown_tool])
            deadline = time.monotonic() + 20
            for intent in (added, failing, unknown_tool):
                while client.get_intent(intent.intent_id).state != IntentState.DONE:
                    assert time.monotonic() < deadline, intent.tool_name
                    time.sleep(0.05)
            client.submit([make_withdrawal(added, "the run completed without it")])
        late = run_cli("show", withdrawal_id_for(added.intent_id), *target).stdout.splitlines()
        assert "kind:         WITHDRAWAL" in late
        assert (
            "outcome:      too late: its target had started or finished (DONE), so it was not "
            "withdrawn" in late
        )
        failed = run_cli("failed", *target)
        assert failed.returncode == 0, failed.stderr
        lines = failed.stdout.splitlines()
        assert lines[0] == f"{failing.intent_id} k-2 fail ERROR RuntimeError: boom again"
        assert lines[1].startswith(f"{unknown_tool.intent_id} k-3 no_such_tool REJECTED ")
        assert "no_such_tool" in lines[1].split(" REJECTED ", 1)[1]
        assert len(lines) == 2
        assert run_cli("failed", *target, "--limit", "1").stdout.splitlines() == lines[:1]
        shown = run_cli("show", added.intent_id, *target)
        assert shown.returncode == 0, shown.stderr
        fields = dict(line.split(":", 1) for line in shown.stdout.splitlines())
        fields = {name: value.strip() for name, value in fields.items()}
        assert fields["intent_id"] == added.intent_id
        assert (fields["kind"], fields["state"], fields["tool"]) == ("TOOL", "DONE", "add")
        assert (fields["entity_key"], fields["args"], fields["attempts"]) == ("k-1", '{"a":1}', "1")
        assert (fields["result"], fields["payload"], fields["error"]) == ("OK", "2", "-")
        assert fields["staged_at"].endswith(f"Z ({added.created_at_ms}) [pipeline event time]")
        received_ms = int(fields["received_at"].rsplit("(", 1)[1].split(")")[0])
        assert fields["received_at"].endswith(f"Z ({received_ms}) [effector wall clock]")
        window_ms = added.expires_at_ms - added.created_at_ms
        deadline_ms = max(added.created_at_ms, received_ms) + window_ms
        assert fields["deadline"].endswith(f"Z ({deadline_ms}) [effector wall clock]")
        assert fields["completed_at"].endswith(") [effector wall clock]")
        errored = run_cli("show", failing.intent_id, *target).stdout
        assert "error:        RuntimeError: boom again" in errored.splitlines()
        errored_fields = dict(line.split(":", 1) for line in errored.splitlines())
        assert errored_fields["deadline"].strip() == "never"
        for command in ("show", "approve", "deny"):
            missing = run_cli(command, nobody, *target)
            assert missing.returncode == 1, command
            assert (missing.stdout, missing.stderr.strip()) == ("", f"no intent {nobody}")
    assert path.exists()


EVIL = "acct-\u202e4321-evil\x1b[2J\x1b]0;owned\x07"


async def _seed_hostile(url: str) -> tuple[ToolIntent, ToolIntent, ToolIntent]:
    """A bidi and escape-laden approval with impossible times, a refused tool, a withdrawn one."""
    hostile = make_intent("", {"to": EVIL}, key=b"k\x1b", kind=ToolIntent.APPROVAL)
    hostile.expires_at_ms = 2**62
    hostile.created_at_ms = -(2**63)
    refused = make_intent("pay\u202e", {"a": 1}, key=b"k-2", seq=1)
    gone = make_intent("", {"refund": "r-1"}, key=b"k-3", seq=2, kind=ToolIntent.APPROVAL)
    withdrawal = make_withdrawal(gone, "the run completed without it")
    odd = make_intent("t", key=b"k-4", seq=3)
    odd.kind = ToolIntent.Kind.ValueType(99)
    store = await open_store(url)
    try:
        now = int(time.time() * 1000)
        await store.submit([NewIntent(odd, rejection="unknown kind 99")], now)
        await store.submit([NewIntent(hostile), NewIntent(gone)], now)
        await store.submit([NewIntent(refused, rejection="bad\x1b[31m\nred\u202e")], now)
        await store.submit([NewIntent(withdrawal)], now)
    finally:
        await store.close()
    return hostile, refused, gone


def test_show_pending_and_failed_print_hostile_rows_on_one_line_without_escapes(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "s.db")
    hostile, refused, gone = asyncio.run(_seed_hostile(url))
    with EffectorProcess("--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0") as effector:
        target = ["--target", effector.address]
        outputs = {
            "pending": run_cli("pending", *target),
            "failed": run_cli("failed", *target),
            "show": run_cli("show", hostile.intent_id, *target),
            "show refused": run_cli("show", refused.intent_id, *target),
            "show unknown kind": run_cli("show", intent_id(b"k-4", 3, 0), *target),
        }
    for name, result in outputs.items():
        assert result.returncode == 0, (name, result.stderr)
        for bad in ("\x1b", "\u202e", "\x07", "\r"):
            assert bad not in result.stdout, (name, bad)
    [pending] = outputs["pending"].stdout.splitlines()
    assert pending.startswith(f"{hostile.intent_id} 0x6b1b ")
    assert '{"to":"acct-⟨U+202E⟩4321-evil\\u001b[2J\\u001b]0;owned\\u0007"}' in pending
    failed = outputs["failed"].stdout.splitlines()
    assert len(failed) == 2
    assert failed[0].startswith(f"{refused.intent_id} k-2 pay⟨U+202E⟩ REJECTED bad⟨U+001B⟩[31m red")
    shown = dict(line.split(":", 1) for line in outputs["show"].stdout.splitlines())
    assert shown["staged_at"].strip() == f"out of range ({-(2**63)} ms) [pipeline event time]"
    assert shown["deadline"].strip() == f"out of range ({2**63 - 1} ms) [effector wall clock]"
    assert "⟨U+202E⟩" in shown["args"]
    assert gone.intent_id not in outputs["pending"].stdout
    assert "kind:         UNKNOWN (99)" in outputs["show unknown kind"].stdout.splitlines()


def test_deciding_a_withdrawn_approval_prints_why_and_exits_1(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _, _, gone = asyncio.run(_seed_hostile(url))
    with EffectorProcess("--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0") as effector:
        target = ["--target", effector.address]
        shown = run_cli("show", gone.intent_id, *target)
        notice = run_cli("show", withdrawal_id_for(gone.intent_id), *target)
        digest = approval_digest(gone.args_json)
        decisions = {
            "approve": run_cli("approve", gone.intent_id, *target),
            "deny": run_cli("deny", gone.intent_id, *target),
            "approve --digest": run_cli("approve", gone.intent_id, *target, "--digest", digest),
            "deny --digest": run_cli("deny", gone.intent_id, *target, "--digest", digest),
        }
        with EffectorClient(effector.address) as client:
            after = client.get_intent(gone.intent_id)
    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in shown.stdout.splitlines())}
    assert (fields["state"], fields["result"]) == ("WITHDRAWN", "WITHDRAWN")
    assert "the run completed without it" in fields["withdrawn"]
    for name, result in decisions.items():
        assert result.returncode == 1, (name, result.stdout)
        assert result.stdout == "", name
        assert "withdrawn" in result.stderr and "not applied" in result.stderr, name
    assert "the run completed without it" in decisions["approve"].stderr
    assert after.state == IntentState.WITHDRAWN
    assert "outcome:      withdrew its target before it started" in notice.stdout.splitlines()


def test_serve_prints_the_metrics_port_it_picked(tmp_path: Path) -> None:
    args = ["--tools", TOOLS, "--store", sqlite_url(tmp_path / "s.db"), "--listen", "127.0.0.1:0"]
    with EffectorProcess(*args, "--metrics-listen", "127.0.0.1:0") as effector:
        assert effector.process.stdout is not None
        line = effector.process.stdout.readline().strip()
        assert line.startswith("effector metrics on http://127.0.0.1:"), line
        url = line.removeprefix("effector metrics on ")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert port > 0
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert b"effector_intents_in_doubt" in answer.read()


def test_show_prints_a_text_payload_as_text_with_hiding_characters_marked() -> None:
    """Found by a trial: a payload holding U+202E was printed as hex, unreadable to a person."""
    intent = make_intent("pay", {"to": "acct-1"}, key=b"k")
    shown = {}
    for payload in ('"acct-\u202e4321-evil"'.encode(), b"\xff\x00", b""):
        result = ToolResult(intent_id=intent.intent_id, status=ToolResult.OK, payload=payload)
        response = GetIntentResponse(found=True, intent=intent, result=result)
        shown[payload] = dict(intent_report(response))["payload"]
    assert shown['"acct-\u202e4321-evil"'.encode()] == '"acct-⟨U+202E⟩4321-evil"'
    assert (shown[b"\xff\x00"], shown[b""]) == ("0xff00", "-")
