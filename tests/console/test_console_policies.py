"""Effect policies in the console: the policies page, and what a policy decided on intent pages.

Each effector enforces a real policy file and gets its intents through gRPC Submit, so the
policy decides them at intake: a deny, a hold for approval (and the approval it opens), an
allow by a rule, and the file's default. A refused reload is shown and the last good policy
stays. Hostile keys, rule names, reasons and conditions never break a page and show escaped.
"""

from __future__ import annotations

import hashlib
import html
import re
import time
from pathlib import Path

from beam_agents._protos import IntentState, SubmitAck, ToolResult, approval_digest
from effector.console import views
from effector.launch import EffectorThread
from effector.store.intents import NewIntent, gate_id_for
from tests.console.harness import between, client_for, csrf_of, intent, page_text, start_effector
from tests.console.policy_data import (
    POLICY,
    RULE_LINES,
    registry,
    submit_intents,
    tool_intent,
    write_policy,
)
from tests.console.runs_data import now_ms

KEY = b"acme-7"


def _rows(table: str) -> list[str]:
    """The text of each body row of an HTML table."""
    body = table[table.index("<tbody>") :]
    return [page_text(row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def _wait_state(effector: EffectorThread, intent_id: str, state: IntentState) -> None:
    deadline = time.monotonic() + 30
    while intent(effector, intent_id).state != state:
        assert time.monotonic() < deadline, f"{intent_id} never reached {IntentState.Name(state)}"
        time.sleep(0.05)


def _decided(effector: EffectorThread) -> dict[str, str]:
    """Four pays and a note for :data:`KEY`, decided by the policy; their ids by what it did."""
    allowed = tool_intent(KEY, 0, "pay", {"account": "a-1", "cents": 500})
    held = tool_intent(KEY, 1, "pay", {"account": "a-2", "cents": 5_000})
    denied = tool_intent(KEY, 2, "pay", {"account": "a-3", "cents": 500_000})
    defaulted = tool_intent(KEY, 3, "note", {"text": "hello"})
    acks = submit_intents(effector, allowed, held, denied, defaulted)
    assert [ack.outcome for ack in acks] == [
        SubmitAck.ACCEPTED,
        SubmitAck.ACCEPTED,
        SubmitAck.REJECTED,
        SubmitAck.REJECTED,
    ], acks
    assert acks[1].state == IntentState.AWAITING_DECISION
    return {
        "allowed": allowed.intent_id,
        "held": held.intent_id,
        "gate": gate_id_for(held.intent_id),
        "denied": denied.intent_id,
        "defaulted": defaulted.intent_id,
    }


def test_without_a_policy_the_page_says_every_effect_is_allowed(
    effector: EffectorThread,
) -> None:
    with client_for(effector) as client:
        answer = client.get("/policies")
        overview = client.get("/").text
    assert answer.status_code == 200
    assert '<a href="/policies" aria-current="page">Policies</a>' in answer.text
    assert '<a href="/policies">Policies</a>' in overview
    shown = page_text(between(answer.text, '<p class="empty" id="no-policy">', "</p>"))
    assert shown == (
        "No effect policy is enforced: every effect is allowed. serve --policy FILE sets one."
    )
    assert 'id="rules"' not in answer.text and 'id="reload-error"' not in answer.text


def test_the_policies_page_shows_the_file_its_rules_counters_and_decisions(
    tmp_path: Path,
) -> None:
    policy = write_policy(tmp_path)
    with start_effector(tmp_path / "e", registry=registry(), policy_file=policy) as effector:
        ids = _decided(effector)
        gate = effector.server.policy
        assert gate is not None
        with client_for(effector) as client:
            answer = client.get("/policies")
            fewer = client.get("/policies", params={"recent": "2"}).text
    assert answer.status_code == 200
    page = answer.text
    assert 'id="reload-error"' not in page
    fields = page_text(between(page, '<dl class="fields" id="policy-file">', "</dl>"))
    digest = hashlib.sha256(POLICY.encode()).hexdigest()
    assert f"File {policy} SHA-256 {digest} Loaded {views.when(gate.loaded_at_ms)}" in fields
    assert fields.endswith("Default deny what an intent no rule matches gets")
    assert _rows(between(page, '<table id="counters">', "</table>")) == [
        "pays_per_key pay key 60 min"
    ]
    rules = _rows(between(page, '<table class="rules" id="rules">', "</table>"))
    assert rules == [
        f"1 no-big-sums deny sums over 1,000.00 are never paid {RULE_LINES['no-big-sums']} 1 "
        'tool == "pay" && args.cents > 100000',
        f"2 two-eyes require_approval channel finance, 1 approval {RULE_LINES['two-eyes']} 1 "
        'tool == "pay" && (args.cents > 1000 || counters.pays_per_key >= 10)',
        f'3 small-pays allow {RULE_LINES["small-pays"]} 1 tool == "pay"',
    ]
    assert '<pre class="cel">tool == &#34;pay&#34; &amp;&amp; args.cents &gt; 100000</pre>' in page
    assert '<span class="outcome require-approval">require_approval</span>' in page
    decisions = _rows(between(page, '<h2 id="decisions">', "</table>"))
    by_id = {row.split()[0]: row for row in decisions}
    assert len(decisions) == 4
    assert set(by_id) == {ids["allowed"], ids["held"], ids["denied"], ids["defaulted"]}
    assert by_id[ids["denied"]].startswith(f"{ids['denied']} acme-7 pay no-big-sums deny DONE ")
    assert "two-eyes require_approval AWAITING_DECISION held for approval" in by_id[ids["held"]]
    assert "small-pays allow" in by_id[ids["allowed"]]
    assert f"{ids['defaulted']} acme-7 note (default) deny DONE" in by_id[ids["defaulted"]]
    for intent_id in by_id:
        assert f'<a class="id" href="/intents/{intent_id}">{intent_id}</a>' in page
    assert 'href="/keys/' + KEY.hex() + '"' in page
    assert len(_rows(between(fewer, '<h2 id="decisions">', "</table>"))) == 2
    assert 'href="/policies?recent=8#decisions"' in fewer


def test_a_refused_reload_is_shown_and_the_last_good_policy_stays_enforced(
    tmp_path: Path,
) -> None:
    policy = write_policy(tmp_path)
    good = hashlib.sha256(POLICY.encode()).hexdigest()

    async def reload() -> bool:
        return effector.server.reload_policy()

    with start_effector(tmp_path / "e", registry=registry(), policy_file=policy) as effector:
        gate = effector.server.policy
        assert gate is not None
        policy.write_text('[[rules]]\nname = "x"\nwhen = "tool ="\noutcome = "deny"\n')
        effector.run(reload())  # (or the file watcher did already)
        assert gate.reload_error and gate.policy.digest == good
        with client_for(effector) as client:
            page = client.get("/policies").text
            refused = page_text(
                between(page, '<div class="notice bad" id="reload-error"', "</div>")
            )
            assert refused.startswith("The policy file was changed, and the change is refused")
            assert f"{policy}:1: rule 'x': when is not CEL" in refused
            assert good in page and "no-big-sums" in page and "two-eyes" in page
            big = tool_intent(KEY, 9, "pay", {"account": "b", "cents": 9**9})
            [still] = submit_intents(effector, big)
            assert still.outcome == SubmitAck.REJECTED and "no-big-sums" in still.reason
            policy.write_text(POLICY.replace("100000", "200000"))
            effector.run(reload())
            assert not gate.reload_error and gate.policy.digest != good
            page = client.get("/policies").text
    assert 'id="reload-error"' not in page and good not in page
    assert "args.cents &gt; 200000" in page


def test_intent_pages_show_the_rule_that_decided_and_the_gate_that_holds(
    tmp_path: Path,
) -> None:
    policy = write_policy(tmp_path)
    with start_effector(tmp_path / "e", registry=registry(), policy_file=policy) as effector:
        ids = _decided(effector)
        with client_for(effector) as client:

            def page(name: str) -> str:
                answer = client.get(f"/intents/{ids[name]}")
                assert answer.status_code == 200, name
                return answer.text

            denied = page("denied")
            assert page_text(between(denied, '<dd id="policy">', "</dd>")) == (
                "policy rule no-big-sums decided deny · the policy"
            )
            assert "denied by effect policy: rule &#39;no-big-sums&#39;: sums over" in denied
            assert 'id="held"' not in denied
            assert page_text(between(page("defaulted"), '<dd id="policy">', "</dd>")) == (
                "the policy's default decided deny · the policy"
            )
            assert page_text(between(page("allowed"), '<dd id="policy">', "</dd>")) == (
                "policy rule small-pays decided allow · the policy"
            )

            held = page("held")
            gate_link = f'<a class="id" href="/intents/{ids["gate"]}">{ids["gate"]}</a>'
            notice = between(held, '<p class="notice bad held" id="held"', "</p>")
            assert page_text(notice).startswith(
                "Held for approval: policy rule two-eyes requires a decision before this tool runs"
            )
            assert gate_link in notice and 'href="/approvals"' in notice
            assert f"AWAITING_DECISION · held for approval by {gate_link}</dd>" in held
            policy_row = between(held, '<dd id="policy">', "</dd>")
            assert page_text(policy_row) == (
                f"policy rule two-eyes decided require_approval · gate approval {ids['gate']}"
                " · the policy"
            )
            assert gate_link in policy_row

            gate = page("gate")
            opened = between(gate, '<p class="notice policy-gate" id="opened-by-policy"', "</p>")
            assert page_text(opened).startswith(
                f"Opened by policy rule two-eyes for intent {ids['held']}, which is held"
            )
            assert f'<a class="id" href="/intents/{ids["held"]}">' in opened
            assert "gates tool pay" in gate and "(channel finance)" in gate

            inbox = client.get("/approvals").text
            card = between(inbox, f'id="approval-{ids["gate"]}"', "</article>")
            assert (
                "Asked by the effect policy: policy rule two-eyes holds tool intent"
                in page_text(card)
            )
            assert f'href="/intents/{ids["held"]}"' in card
            assert 'id="more-pending"' not in inbox  # the held intent is no approval
            listed = page_text(client.get("/intents", params={"state": "AWAITING_DECISION"}).text)
            assert "pay AWAITING_DECISION held for approval" in listed

            form = {
                "csrf_token": csrf_of(inbox),
                "decision": "approve",
                "approver": "dana",
                "reason": "checked the invoice",
                "args_digest": approval_digest(intent(effector, ids["gate"]).intent.args_json),
            }
            decided = client.post(f"/approvals/{ids['gate']}", data=form)
            assert decided.status_code == 303
            after = page_text(client.get(decided.headers["location"]).text)
            assert "approved by dana: checked the invoice · the effect policy held tool intent" in (
                after
            )
            _wait_state(effector, ids["held"], IntentState.DONE)
            released = page("held")
            assert 'id="held"' not in released
            assert f'<dd id="approved-by">approval {gate_link}' in released
            assert "policy rule two-eyes decided require_approval" in page_text(released)
            assert "which it held until it was decided" in page_text(page("gate"))
        record = intent(effector, ids["held"])
        assert record.result is not None and record.result.status == ToolResult.OK


HOSTILE_KEY = b"acct\x00\x1b[31m" + "\u202e".encode() + b"-evil"
LONG_RULE = "long-rule-" + "x" * 118
_REASON_HEAD = "\u202e\x1b[2J\x00<script>alert(1)</script>"
LONG_REASON = _REASON_HEAD + "r" * (2_000 - len(_REASON_HEAD))
HUGE_WHEN = f'tool == "pay" && args.account == "{"y" * 10_000}"'
HOSTILE_POLICY = (
    "[[rules]]\n"
    'name = "evil-literal"\n'
    'when = "tool == \\"pay\\" && args.account == \\"acct\\u202E\\u001B[31m\\u0000x\\""\n'
    'outcome = "deny"\n'
    'reason = "nul \\u0000 esc \\u001B[2J rlo \\u202E <script>alert(1)</script>"\n'
    "\n"
    "[[rules]]\n"
    f'name = "{LONG_RULE}"\n'
    "when = 'tool == \"pay\" && args.cents > 1000'\n"
    'outcome = "require_approval"\n'
    'channel = "ops\\u202E"\n'
    "\n"
    "[[rules]]\n"
    'name = "huge-when"\n'
    f"when = '{HUGE_WHEN}'\n"
    'outcome = "deny"\n'
)


def test_hostile_keys_rules_and_reasons_never_break_a_page_and_show_escaped(
    tmp_path: Path,
) -> None:
    assert len(LONG_RULE) == 128 and len(LONG_REASON) == 2_000
    policy = write_policy(tmp_path, HOSTILE_POLICY, name="pol\u202eicy.toml")
    other_key = HOSTILE_KEY + b"-2"
    evil = tool_intent(HOSTILE_KEY, 0, "pay", {"account": "acct\u202e\x1b[31m\x00x", "cents": 5})
    held = tool_intent(HOSTILE_KEY, 1, "pay", {"account": "\u202eplain", "cents": 5_000})
    refused = tool_intent(other_key, 0, "pay", {"account": "z", "cents": 7_000})
    odd = tool_intent(other_key, 1, "pay", {"account": "z", "cents": 1})
    with start_effector(tmp_path / "e", registry=registry(), policy_file=policy) as effector:
        acks = submit_intents(effector, evil, held, refused)
        assert [ack.outcome for ack in acks] == [
            SubmitAck.REJECTED,
            SubmitAck.ACCEPTED,
            SubmitAck.ACCEPTED,
        ], acks
        store = effector.server.store
        stored = NewIntent(
            odd,
            rejection="odd\u202e\x1b[0m" + "q" * 5_000,
            policy_rule="z" * 5_000 + "\u202e\x1b\x00",
            policy_outcome="maybe\x00\u202e",
        )
        effector.run(store.submit([stored], now_ms()))  # past the API: whatever a store holds
        with client_for(effector, timeout=60) as client:
            inbox = client.get("/approvals").text
            form = {
                "csrf_token": csrf_of(inbox),
                "decision": "deny",
                "approver": "dana",
                "reason": LONG_REASON,
                "args_digest": approval_digest(refused.args_json),
            }
            denied = client.post(f"/approvals/{gate_id_for(refused.intent_id)}", data=form)
            assert denied.status_code == 303, denied.text
            decided_inbox = client.get(denied.headers["location"])
            pages = {
                "/policies": client.get("/policies"),
                "/approvals": client.get("/approvals"),
                "decided": decided_inbox,
                "/intents": client.get("/intents"),
                "key": client.get(f"/keys/{HOSTILE_KEY.hex()}"),
                **{
                    name: client.get(f"/intents/{intent_id}")
                    for name, intent_id in {
                        "evil": evil.intent_id,
                        "held": held.intent_id,
                        "held-gate": gate_id_for(held.intent_id),
                        "refused": refused.intent_id,
                        "refused-gate": gate_id_for(refused.intent_id),
                        "odd": odd.intent_id,
                    }.items()
                },
            }
    for name, answer in pages.items():
        assert answer.status_code == 200, (name, answer.status_code)
        assert len(answer.content) < 2_000_000, (name, len(answer.content))
        for hiding in ("\u202e", "\x1b", "\x00"):
            assert hiding not in answer.text, (name, hiding)
        assert "<script>" not in answer.text, name
    shown = {name: html.unescape(answer.text) for name, answer in pages.items()}
    policies = shown["/policies"]
    assert "pol⟨U+202E⟩icy.toml" in policies
    assert "nul ⟨U+0000⟩ esc ⟨U+001B⟩[2J rlo ⟨U+202E⟩ <script>alert(1)</script>" in policies
    assert 'args.account == "acct⟨U+202E⟩⟨U+001B⟩[31m⟨U+0000⟩x"' in policies
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in policies and "Look closely" in policies
    assert f'<td class="rule">{LONG_RULE}</td>' in policies
    assert "channel ops⟨U+202E⟩, 1 approval" in policies
    assert f"Cut: {len(HUGE_WHEN) - 4_000} more characters are not shown." in policies
    assert "z" * 999 + "… (4003 more characters)" in policies  # the stored rule, cut
    assert '<span class="outcome">maybe⟨U+0000⟩⟨U+202E⟩</span>' in policies
    assert f'href="/keys/{HOSTILE_KEY.hex()}"' in policies
    assert f"0x{HOSTILE_KEY.hex()}" in policies
    inbox = page_text(pages["/approvals"].text)
    assert f"policy rule {LONG_RULE} holds tool intent {held.intent_id}" in inbox
    decided = page_text(pages["decided"].text)
    assert "denied by dana: ⟨U+202E⟩⟨U+001B⟩[2J⟨U+0000⟩<script>alert(1)</script>rrr" in decided
    assert f"… ({len('denied by dana: ') + 2_000 - 1_000} more characters)" in decided
    refused_page = shown["refused"]
    assert f"rule '{LONG_RULE}' required approval on channel 'ops\\u202e'" in refused_page
    assert "and 'dana' denied it: ⟨U+202E⟩⟨U+001B⟩[2J⟨U+0000⟩<script>" in refused_page
    assert LONG_REASON[-1_900:] in refused_page  # within the page's bound: all of it
    assert "Look closely" in refused_page
    assert f"Opened by policy rule {LONG_RULE} for intent {refused.intent_id}" in page_text(
        pages["refused-gate"].text
    )
    assert "Held for approval: policy rule " + LONG_RULE in page_text(pages["held"].text)
    evil_page = page_text(pages["evil"].text)
    assert "policy rule evil-literal decided deny" in evil_page
    odd_page = page_text(pages["odd"].text)
    assert "policy rule " + "z" * 1_000 + "… (4003 more characters) decided maybe⟨U+0000⟩" in (
        odd_page
    )
    assert "(held for approval)" in shown["key"]
