"""Effect policies at the effector: CEL rules decide every TOOL intent before anything runs."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import (
    FAST_WORKER,
    TOOLS,
    EffectorProcess,
    make_intent,
    make_withdrawal,
    run_cli,
    running_effector,
    wait_done,
)
from effector_test_tools import read_ledger

from beam_agents._protos import (
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
    canonical_json,
)
from effector.client import AsyncEffectorClient, EffectorClient
from effector.policy import PolicyError, load_policy, parse_policy
from effector.server import EffectorServer, ServerSettings
from effector.store.errors import ConfigurationError
from effector.store.intents import gate_id_for

POLICY = """\
default = "allow"
tenant_separator = "/"

[counters.records_per_tenant]
tool = "record"
per = "tenant"
window = "1h"

[[rules]]
name = "no-shouting"
when = 'tool == "record" && args.note.startsWith("SHOUT")'
outcome = "deny"
reason = "notes are written calmly"

[[rules]]
name = "two-eyes"
when = 'tool == "record" && args.note.startsWith("big")'
outcome = "require_approval"
channel = "finance"
approvals = 2

[[rules]]
name = "tenant-quota"
when = 'tool == "record" && counters.records_per_tenant >= 3'
outcome = "deny"
reason = "three records per tenant an hour"

[[rules]]
name = "small-sums"
when = 'tool == "add" && args.b > 100'
outcome = "deny"
reason = "sums stay small"

[[rules]]
name = "adds-are-fine"
when = 'tool == "add"'
outcome = "allow"
"""


def _settings(policy: Path, **more: object) -> ServerSettings:
    return ServerSettings(worker=FAST_WORKER, policy_file=str(policy), **more)  # type: ignore[arg-type]


def _policy_file(tmp_path: Path, text: str = POLICY) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def _record(note: str, *, key: bytes = b"acme/c1", seq: int = 0, ttl_ms: int = 0) -> ToolIntent:
    return make_intent("record", {"note": note}, key=key, seq=seq, ttl_ms=ttl_ms)


async def _published(client: AsyncEffectorClient) -> list[ToolResult]:
    records = (await client.read(1, wait_ms=0)).records
    return [r.envelope.tool_result for r in records if r.envelope.HasField("tool_result")]


async def _approvals_published(client: AsyncEffectorClient) -> list[str]:
    records = (await client.read(1, wait_ms=0)).records
    return [r.envelope.approval.intent_id for r in records if r.envelope.HasField("approval")]


async def _wait_state(
    client: AsyncEffectorClient, intent_id: str, state: IntentState, timeout_s: float = 20
) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if (await client.get_intent(intent_id)).state == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{intent_id} never reached {IntentState.Name(state)}")


# -- the file --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('default = "allow"\n[[rules]\n', ":2"),
        ('[[rules]]\nname = "x"\nwhen = "tool =="\noutcome = "deny"\n', ":1: rule 'x': when"),
        (
            '\n\n[[rules]]\nname = "x"\nwhen = "tool == 1"\noutcome = "deny"\n'
            '[[rules]]\nname = "y"\nwhen = "secret > 1"\noutcome = "deny"\n',
            ":7: rule 'y': when uses 'secret'",
        ),
        (
            '[[rules]]\nname = "x"\nwhen = "counters.nope > 1"\noutcome = "deny"\n',
            "counter 'nope', which is not declared",
        ),
        (
            '[[rules]]\nname = "x"\nwhen = "true"\noutcome = "require_approval"\n',
            "require_approval needs a channel",
        ),
        (
            '[[rules]]\nname = "x"\nwhen = "true"\noutcome = "require_approval"\n'
            'channel = "c"\napprovals = 0\n',
            "approvals must be an integer from 1 to 100",
        ),
        ('[[rules]]\nname = "x"\nwhen = "true"\noutcome = "maybe"\n', "outcome must be allow"),
        (
            '[[rules]]\nname = "x"\nwhen = "true"\noutcome = "deny"\n'
            '[[rules]]\nname = "x"\nwhen = "true"\noutcome = "deny"\n',
            ":5: rule name 'x' is used twice",
        ),
        ('[[rules]]\nname = "bad\\u0000name"\nwhen = "true"\noutcome = "deny"\n', "needs a name"),
        ('[counters.c]\ntool = "t"\nwindow = "0s"\n', ":1: counter 'c': window"),
        ('[counters.c]\ntool = "t"\nwindow = "1h"\nper = "planet"\n', "per must be key"),
        ('mode = "strict"\n', "unknown field 'mode'"),
        ('default = "require_approval"\n', "default must be allow or deny"),
        ("", ":1: the policy file is empty: it would allow every effect"),
        ("# only a comment\n\n", ":1: the policy file is empty"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_line(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(text.encode(), "p.toml")
    assert str(refused.value).startswith("p.toml:")
    assert expected in str(refused.value)


def test_a_policy_file_that_is_not_text_or_too_large_is_refused(tmp_path: Path) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00rules")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(binary)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(PolicyError, match="larger than"):
        load_policy(huge)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.toml")


def test_a_bad_policy_at_start_refuses_to_serve(tmp_path: Path) -> None:
    policy = _policy_file(tmp_path, '[[rules]]\nname = "x"\nwhen = "tool ="\noutcome = "deny"\n')
    done = run_cli(
        "serve", "--tools", TOOLS, "--store", str(tmp_path / "s.db"), "--policy", str(policy)
    )
    assert done.returncode == 2
    assert f"--policy: {policy}:1: rule 'x': when is not CEL" in done.stderr
    checked = run_cli("policies", "--check", str(policy))
    assert checked.returncode == 2 and f"{policy}:1" in checked.stderr
    assert run_cli("policies", "--check", str(_policy_file(tmp_path))).returncode == 0


# -- decisions -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_allow_deny_and_a_rule_that_fails_closed(
    store_url: str, tmp_path: Path, ledger: Path
) -> None:
    calm, shout, added = _record("calm", seq=0), _record("SHOUT!", seq=1), None
    added = make_intent("add", {"a": 1, "b": 2}, key=b"other", seq=0)
    broken = make_intent("add", {"a": 1}, key=b"acme/c2")  # no `b`: small-sums cannot tell
    async with running_effector(store_url, settings=_settings(_policy_file(tmp_path))) as running:
        client = running.client
        acks = await client.submit([calm, shout, added, broken])
        assert [ack.outcome for ack in acks] == [
            SubmitAck.ACCEPTED,
            SubmitAck.REJECTED,
            SubmitAck.ACCEPTED,
            SubmitAck.REJECTED,
        ]
        assert "rule 'no-shouting': notes are written calmly" in acks[1].reason
        done = await wait_done(client, [calm.intent_id, shout.intent_id, added.intent_id])
        assert done[calm.intent_id].result.status == ToolResult.OK
        assert done[added.intent_id].policy_rule == "adds-are-fine"
        assert done[added.intent_id].policy_outcome == "allow"
        refused = done[shout.intent_id]
        assert (refused.policy_rule, refused.policy_outcome) == ("no-shouting", "deny")
        assert refused.result.status == ToolResult.REJECTED
        # A rule that cannot be evaluated (no `b`) denies: fail closed, saying why.
        assert "rule 'small-sums'" in acks[3].reason and "KeyError" in acks[3].reason
        published = {result.intent_id: result for result in await _published(client)}
        assert published[shout.intent_id].status == ToolResult.REJECTED
        assert "denied by effect policy" in published[shout.intent_id].error_message
        assert published[broken.intent_id].status == ToolResult.REJECTED
        # Resubmitting a denied intent is a duplicate: it stays denied and never runs.
        again = await client.submit([shout])
        assert again[0].outcome == SubmitAck.DUPLICATE
        answer = await client.policies()
        assert answer.enforced and [rule.name for rule in answer.rules] == [
            "no-shouting",
            "two-eyes",
            "tenant-quota",
            "small-sums",
            "adds-are-fine",
        ]
        decisions = {rule.name: rule.decisions for rule in answer.rules}
        assert (decisions["no-shouting"], decisions["small-sums"]) == (1, 1)
        assert {decision.intent_id for decision in answer.recent} == {
            shout.intent_id,
            added.intent_id,
            broken.intent_id,
        }
        metrics = running.server.metrics.registry
        assert (
            metrics.get_sample_value(
                "effector_policy_decisions_total", {"rule": "no-shouting", "outcome": "deny"}
            )
            == 1
        )
        assert (
            metrics.get_sample_value(
                "effector_policy_decisions_total", {"rule": "", "outcome": "allow"}
            )
            == 1
        )
    ran = {row.intent_id for row in read_ledger(ledger)}
    assert ran == {calm.intent_id}


@pytest.mark.asyncio
async def test_require_approval_holds_the_key_until_a_quorum_approves(
    store_url: str, tmp_path: Path, ledger: Path
) -> None:
    big, after = _record("big refund", seq=0), _record("calm", seq=1)
    gate_id = gate_id_for(big.intent_id)
    async with running_effector(store_url, settings=_settings(_policy_file(tmp_path))) as running:
        client = running.client
        acks = await client.submit([big, after])
        assert acks[0].outcome == SubmitAck.ACCEPTED
        assert acks[0].state == IntentState.AWAITING_DECISION
        held = await client.get_intent(big.intent_id)
        assert held.state == IntentState.AWAITING_DECISION
        assert (held.policy_rule, held.policy_gate_id) == ("two-eyes", gate_id)
        inbox = await client.list_intents(IntentState.AWAITING_DECISION)
        assert [intent.intent_id for intent in inbox] == [gate_id]
        gate = inbox[0]
        assert (gate.channel, gate.required_approvals, gate.gated_tool) == ("finance", 2, "record")
        assert (gate.policy_gate_for, gate.policy_rule) == (big.intent_id, "two-eyes")
        await asyncio.sleep(0.5)  # several claim passes: the key waits behind its held head
        assert (await client.get_intent(after.intent_id)).state == IntentState.PENDING
        assert read_ledger(ledger) == []
        first = await client.decide(gate_id, approved=True, approver="alice")
        assert first.applied and first.state == IntentState.AWAITING_DECISION
        again = await client.decide(gate_id, approved=True, approver="alice")
        assert not again.applied and "distinct approvers" in again.reason
        second = await client.decide(gate_id, approved=True, approver="bob")
        assert second.applied and second.state == IntentState.DONE
        done = await wait_done(client, [big.intent_id, after.intent_id])
        assert done[big.intent_id].result.status == ToolResult.OK
        order = [row.intent_id for row in read_ledger(ledger) if row.event == "started"]
        assert order == [big.intent_id, after.intent_id]
        # The run waits for its TOOL intent's result, never for the policy's approval.
        assert gate_id not in await _approvals_published(client)
        assert gate_id not in {result.intent_id for result in await _published(client)}


@pytest.mark.asyncio
async def test_a_denied_or_edited_approval_settles_the_held_intent(
    store_url: str, tmp_path: Path, ledger: Path
) -> None:
    denied, edited = _record("big one", key=b"k1"), _record("big two", key=b"k2")
    later = _record("calm", key=b"k1", seq=1)
    async with running_effector(store_url, settings=_settings(_policy_file(tmp_path))) as running:
        client = running.client
        await client.submit([denied, edited, later])
        refused = await client.decide(
            gate_id_for(denied.intent_id), approved=False, approver="carol", reason="too much"
        )
        assert refused.applied
        change = canonical_json({"note": "big but smaller"})
        for approver in ("alice", "bob"):
            await client.decide(
                gate_id_for(edited.intent_id),
                approved=True,
                approver=approver,
                edited_args_json=change,
            )
        done = await wait_done(client, [denied.intent_id, edited.intent_id, later.intent_id])
        result = done[denied.intent_id].result
        assert result.status == ToolResult.REJECTED
        assert "rule 'two-eyes'" in result.error_message
        assert "'carol' denied it: too much" in result.error_message
        ran = done[edited.intent_id]
        assert json.loads(ran.result.payload)["note"] == "big but smaller"
        assert ran.intent.args_json == change
        assert ran.intent.edited_from.approval_intent_id == gate_id_for(edited.intent_id)
        assert ran.intent.edited_from.edited_by == "bob"
        assert json.loads(ran.intent.edited_from.diff_json) == {
            "changed": {"note": {"from": "big two", "to": "big but smaller"}}
        }
        assert done[later.intent_id].result.status == ToolResult.OK
        published = {r.intent_id: r.status for r in await _published(client)}
        assert published[denied.intent_id] == ToolResult.REJECTED
        # A duplicate submit of the edited intent is still a duplicate of what was submitted.
        assert (await client.submit([edited]))[0].outcome == SubmitAck.DUPLICATE
    assert {row.intent_id for row in read_ledger(ledger)} == {edited.intent_id, later.intent_id}


@pytest.mark.asyncio
async def test_a_held_intent_withdrawn_or_expired_frees_its_key(
    store_url: str, tmp_path: Path, ledger: Path
) -> None:
    withdrawn, behind = _record("big a", key=b"w"), _record("calm", key=b"w", seq=1)
    expiring = _record("big b", key=b"e", ttl_ms=300)
    async with running_effector(store_url, settings=_settings(_policy_file(tmp_path))) as running:
        client = running.client
        await client.submit([withdrawn, behind, expiring])
        await client.submit([make_withdrawal(withdrawn)])
        await _wait_state(client, withdrawn.intent_id, IntentState.WITHDRAWN)
        gate = await client.get_intent(gate_id_for(withdrawn.intent_id))
        assert gate.state == IntentState.WITHDRAWN
        decided = await client.decide(gate_id_for(withdrawn.intent_id), approved=True)
        assert not decided.applied and decided.reason.startswith("withdrawn")
        done = await wait_done(client, [behind.intent_id, expiring.intent_id])
        assert done[behind.intent_id].result.status == ToolResult.OK
        assert done[expiring.intent_id].result.status == ToolResult.EXPIRED
        published = {r.intent_id: r.status for r in await _published(client)}
        assert published[expiring.intent_id] == ToolResult.EXPIRED
        assert withdrawn.intent_id not in published
    assert {row.intent_id for row in read_ledger(ledger)} == {behind.intent_id}


@pytest.mark.asyncio
async def test_sliding_window_counters_span_keys_of_a_tenant(
    store_url: str, tmp_path: Path, ledger: Path
) -> None:
    text = POLICY.replace('window = "1h"', 'window = "2s"')
    acme = [_record(f"r{n}", key=f"acme/c{n}".encode()) for n in range(4)]
    other = _record("r0", key=b"globex/c0")
    async with running_effector(
        store_url, settings=_settings(_policy_file(tmp_path, text))
    ) as running:
        client = running.client
        first = await client.submit(acme[:2])
        second = await client.submit([acme[2], acme[3], other])
        outcomes = [ack.outcome for ack in first + second]
        assert outcomes == [SubmitAck.ACCEPTED] * 3 + [SubmitAck.REJECTED, SubmitAck.ACCEPTED]
        assert "rule 'tenant-quota'" in second[1].reason
        await asyncio.sleep(2.2)  # the window slides past the first three
        late = _record("r9", key=b"acme/c9")
        assert (await client.submit([late]))[0].outcome == SubmitAck.ACCEPTED
        await wait_done(client, [late.intent_id])


@pytest.mark.asyncio
async def test_a_bad_reload_keeps_the_last_good_policy_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = _policy_file(tmp_path)
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=_settings(policy)) as run:
        client, server = run.client, run.server
        policy.write_text(POLICY + '\n[[rules]]\nname = "late"\nwhen = "tool ="\n')
        with caplog.at_level(logging.ERROR, logger="effector.policy"):
            assert server.reload_policy() is False
        assert "the last good policy stays in force" in caplog.text
        line = len(POLICY.splitlines()) + 2
        assert f"{policy}:{line}: rule 'late'" in caplog.text
        answer = await client.policies()
        assert answer.reload_error.startswith(f"{policy}:{line}")
        assert len(answer.rules) == 5
        failures = server.metrics.registry.get_sample_value("effector_policy_reload_failures_total")
        assert failures == 1
        acks = await client.submit([_record("SHOUT", key=b"z")])
        assert acks[0].outcome == SubmitAck.REJECTED  # the last good policy still decides
        policy.write_text('[[rules]]\nname = "all-out"\nwhen = "true"\noutcome = "deny"\n')
        assert server.reload_policy() is True
        answer = await client.policies()
        assert answer.reload_error == "" and [r.name for r in answer.rules] == ["all-out"]
        denied = await client.submit([make_intent("add", {"a": 1}, key=b"z2")])
        assert "rule 'all-out'" in denied[0].reason


def test_sighup_reloads_and_the_cli_shows_the_policy(tmp_path: Path) -> None:
    policy = _policy_file(tmp_path)
    with EffectorProcess(
        "--tools",
        TOOLS,
        "--store",
        sqlite_url(tmp_path / "s.db"),
        "--listen",
        "127.0.0.1:0",
        "--policy",
        str(policy),
    ) as effector:
        with EffectorClient(effector.address) as client:
            shout, big = _record("SHOUT", key=b"s"), _record("big", key=b"b")
            client.submit([shout, big])
        denied = run_cli("show", shout.intent_id, "--target", effector.address)
        assert re.search(r"^policy:\s+rule no-shouting: deny$", denied.stdout, re.M), denied.stdout
        held = run_cli("show", big.intent_id, "--target", effector.address).stdout
        assert re.search(rf"^held_for:\s+approval {gate_id_for(big.intent_id)}$", held, re.M)
        gate = run_cli("show", gate_id_for(big.intent_id), "--target", effector.address).stdout
        assert re.search(rf"^opened_by:\s+policy rule two-eyes for {big.intent_id}$", gate, re.M)
        shown = run_cli("policies", "--target", effector.address)
        assert shown.returncode == 0, shown.stderr
        assert 'rule no-shouting deny 1 line 9: tool == "record"' in shown.stdout
        assert f"{shout.intent_id} s record no-shouting deny DONE" in shown.stdout
        policy.write_text('[[rules]]\nname = "only"\nwhen = "false"\noutcome = "deny"\n')
        effector.signal(signal.SIGHUP)
        for _ in range(100):
            shown = run_cli("policies", "--target", effector.address)
            if "rule only deny" in shown.stdout:
                break
        assert "rule only deny 0 line 1: false" in shown.stdout
        assert "rule no-shouting" not in shown.stdout  # its decisions stay recorded


def test_a_policy_path_is_a_configuration_error_in_process(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"--policy: .*cannot read"):
        EffectorServer(None, None, _settings(tmp_path / "absent.toml"))  # type: ignore[arg-type]


def test_a_held_intent_survives_a_sigkill_unstarted(tmp_path: Path, ledger: Path) -> None:
    policy, store = _policy_file(tmp_path), sqlite_url(tmp_path / "s.db")
    big, after = _record("big refund"), _record("calm", seq=1)
    serve = ("--tools", TOOLS, "--store", store, "--listen", "127.0.0.1:0", "--policy", str(policy))
    with EffectorProcess(*serve) as effector, EffectorClient(effector.address) as client:
        assert client.submit([big, after])[0].state == IntentState.AWAITING_DECISION
    # SIGKILLed holding the key: after a crash every key's head counts as possibly started,
    # but a held head never started, so it must not be counted (nor its reconciler asked).
    with EffectorProcess(*serve) as effector, EffectorClient(effector.address) as client:
        assert client.get_intent(big.intent_id).state == IntentState.AWAITING_DECISION
        for approver in ("alice", "bob"):
            assert client.decide(
                gate_id_for(big.intent_id), approved=True, approver=approver
            ).applied
        for _ in range(400):
            states = [client.get_intent(i).state for i in (big.intent_id, after.intent_id)]
            if states == [IntentState.DONE, IntentState.DONE]:
                break
            time.sleep(0.05)
        ran = client.get_intent(big.intent_id)
        assert ran.result.status == ToolResult.OK and ran.attempts == 1
        assert json.loads(ran.result.payload)["attempt"] == 1
    started = [row.intent_id for row in read_ledger(ledger) if row.event == "started"]
    assert started == [big.intent_id, after.intent_id]


@pytest.mark.asyncio
async def test_variables_cel_cannot_hold_deny_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import effector.policy as policy_module

    gate = policy_module.LivePolicy.open(_policy_file(tmp_path), 0)

    def refuse(*_: object) -> object:
        raise OverflowError("out of range for CEL")

    monkeypatch.setattr(policy_module.cel, "Context", refuse)

    async def no_counts(*_: object) -> dict[bytes, int]:
        return {}

    [verdict] = await gate.screen([(_record("calm"), None)], 1_000, no_counts)
    assert verdict.outcome is policy_module.Outcome.DENY
    assert "OverflowError: out of range for CEL" in verdict.reason


@pytest.mark.asyncio
async def test_rules_on_tools_the_registry_lacks_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = POLICY.replace('tool == "record" && args.note.startsWith("SHOUT")', 'tool == "recrod"')
    with caplog.at_level(logging.WARNING, logger="effector.server"):
        async with running_effector(
            sqlite_url(tmp_path / "s.db"), settings=_settings(_policy_file(tmp_path, text))
        ):
            pass
    assert "names tools the registry has no side-effecting tool for" in caplog.text
    assert ": recrod" in caplog.text
