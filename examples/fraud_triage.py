"""Fraud triage: screen transfers per account, freeze risky accounts, ask a human on large ones.

For each transfer event, keyed by account, the agent
1. looks up the account's risk band inline (a read-only tool),
2. for a large transfer, asks a human to approve it and suspends until the decision (or the
   approval's expiry) comes back through the effector,
3. otherwise asks the model for a verdict and, on "freeze", stages ``freeze_account`` as an
   intent and suspends until the effector has executed it,
4. emits one JSON decision per transfer on ``.output``.

Run it against a running effector that serves ``fraud_tools:make_effector_registry``::

    python examples/fraud_triage.py --target 127.0.0.1:50051 --out /tmp/decisions

``make demo`` (``examples/demo.py``) starts that effector for you and runs this pipeline twice.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolResult,
    WriteErrors,
    WriteRecords,
    WriteTraces,
    canonical_json,
    canonical_json_bytes,
)
from beam_agents.model import match_any, match_contains, respond_with

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from fraud_tools import make_pipeline_registry

LARGE_TRANSFER = 10_000
APPROVAL_TTL_MS = 4_000
FREEZE_TTL_MS = 60 * 60 * 1000
MODEL_ID = "fraud-analyst-1"
BASE_EVENT_TIME_MS = 1_767_225_600_000


def make_provider() -> FakeLLM:
    """The demo's stand-in model: freezes high-risk accounts with several recent transfers."""
    return FakeLLM(
        [
            (match_contains("risk=high recent=3"), respond_with(b'{"verdict": "freeze"}')),
            (match_any(), respond_with(b'{"verdict": "allow"}')),
        ]
    )


async def triage(ctx: ActivationContext) -> Complete | Suspend:
    """Screen one transfer; see the module docstring for the steps."""
    return await screen(ctx, LARGE_TRANSFER)


async def screen(ctx: ActivationContext, large_transfer: int) -> Complete | Suspend:
    """``triage`` with the amount from which a human must approve as a parameter."""
    if ctx.is_resume:
        return _resume(ctx)
    transfer = json.loads(ctx.event)
    account = transfer["account"]
    ctx.memory.append("recent", str(transfer["amount"]).encode(), max_items=3)
    band = await ctx.run_tool("risk_lookup", {"account": account})

    if transfer["amount"] >= large_transfer:
        ctx.request_approval(
            {"transfer_id": transfer["id"], "account": account, "amount": transfer["amount"]},
            ttl_ms=APPROVAL_TTL_MS,
        )
        return Suspend(snapshot=canonical_json_bytes({**transfer, "waiting_for": "approval"}))

    recent = len(ctx.memory.ring("recent"))
    prompt = f"transfer {transfer['id']} amount={transfer['amount']} risk={band} recent={recent}"
    reply = await ctx.call_model(
        LlmRequest(model_id=MODEL_ID, messages=[{"role": "user", "content": prompt}])
    )
    if json.loads(reply.text)["verdict"] == "freeze":
        ctx.act(
            "freeze_account",
            {"account": account, "reason": f"transfer {transfer['id']} flagged"},
            ttl_ms=FREEZE_TTL_MS,
        )
        return Suspend(snapshot=canonical_json_bytes({**transfer, "waiting_for": "freeze"}))
    return Complete(output=_decision(transfer, "allowed"))


def _resume(ctx: ActivationContext) -> Complete:
    transfer = json.loads(ctx.snapshot)
    if ctx.resume_approval is not None:
        return Complete(
            output=_decision(transfer, "approved" if ctx.resume_approval.approved else "declined")
        )
    result = ctx.resume_result
    assert result is not None
    if transfer["waiting_for"] == "approval":
        # Nobody decided before the approval expired: fail closed, hold the transfer.
        return Complete(output=_decision(transfer, "held"))
    outcome = "frozen" if result.status == ToolResult.OK else "freeze-failed"
    return Complete(output=_decision(transfer, outcome))


def _decision(transfer: dict[str, object], decision: str) -> bytes:
    return canonical_json_bytes(
        {"transfer_id": transfer["id"], "account": transfer["account"], "decision": decision}
    )


def make_events(n_events: int = 300, n_accounts: int = 40, seed: int = 7) -> list[AgentEnvelope]:
    """Deterministic transfers; exactly three of them are large enough to need approval."""
    rng = random.Random(seed)
    large = {n_events // 4, n_events // 2, (3 * n_events) // 4}
    events = []
    for index in range(n_events):
        account = f"acct-{rng.randrange(n_accounts):02d}"
        amount = 12_500 + 1_000 * index if index in large else rng.randrange(10, 5_000)
        payload = {"id": f"t-{index:04d}", "account": account, "amount": amount}
        events.append(
            AgentEnvelope(
                entity_key=account.encode(),
                event_time_ms=BASE_EVENT_TIME_MS + 1_000 * index,
                external_event=canonical_json(payload).encode(),
            )
        )
    return events


class _WriteJsonLines(beam.DoFn):
    """Appends each element as one line to a file per worker; the demo reads them back."""

    def __init__(self, directory: str, name: str) -> None:
        self._directory = directory
        self._name = name

    def setup(self) -> None:
        Path(self._directory).mkdir(parents=True, exist_ok=True)
        path = Path(self._directory) / f"{self._name}-{id(self)}.jsonl"
        self._file = path.open("a", encoding="utf-8")

    def process(self, line: str) -> Iterator[None]:
        self._file.write(line + "\n")
        self._file.flush()
        return iter(())

    def teardown(self) -> None:
        self._file.close()


def run(
    target: str,
    events: list[AgentEnvelope],
    out_dir: str,
    idle_s: float = 1.5,
    record_dir: str | None = None,
) -> None:
    """Run the triage pipeline on the DirectRunner until the effector has been idle ``idle_s``.

    With ``record_dir``, every activation is recorded there (``WriteRecords``).
    """
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        keyed = pipeline | "Envelopes" >> ReadEnvelopes(
            target, events=events, stop_when_idle_s=idle_s, poll_wait_ms=50
        )
        outputs = keyed | "Triage" >> RunAgent(
            triage,
            config=AgentConfig(
                provider_factory=make_provider,
                tool_registry=make_pipeline_registry(),
                record=record_dir is not None,
            ),
        )
        if record_dir is not None:
            _ = outputs.records | "Records" >> WriteRecords(record_dir)
        submitted = outputs.intents | "ToEffector" >> SubmitIntents(target)
        # What each run did, and every dead letter, stored by the effector for its console.
        _ = outputs.traces | "TracesToEffector" >> WriteTraces(target)
        _ = outputs.errors | "ErrorsToEffector" >> WriteErrors(target)
        (
            outputs.output
            | "Decode" >> beam.Map(lambda raw: raw.decode())
            | "Decisions" >> beam.ParDo(_WriteJsonLines(out_dir, "decisions"))
        )
        (
            outputs.errors
            | "ErrorText"
            >> beam.Map(lambda e: canonical_json({"reason": e.reason, "detail": e.detail}))
            | "Errors" >> beam.ParDo(_WriteJsonLines(out_dir, "errors"))
        )
        (
            submitted.dead_letter
            | "DeadText"
            >> beam.Map(
                lambda d: canonical_json({"intent": d.intent.intent_id, "reason": d.reason})
            )
            | "DeadLetters" >> beam.ParDo(_WriteJsonLines(out_dir, "dead_letters"))
        )


def read_lines(out_dir: str, name: str) -> list[dict[str, object]]:
    """Every JSON line the pipeline wrote under ``name`` in ``out_dir``."""
    lines: list[dict[str, object]] = []
    for path in sorted(Path(out_dir).glob(f"{name}-*.jsonl")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return lines


def main() -> None:
    """Run the pipeline once against ``--target`` and print the decisions by kind."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="effector HOST:PORT")
    parser.add_argument("--out", required=True, help="directory for decisions and errors")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--accounts", type=int, default=40)
    args = parser.parse_args()
    run(args.target, make_events(args.events, args.accounts), args.out)
    decisions = read_lines(args.out, "decisions")
    counts: dict[str, int] = {}
    for decision in decisions:
        counts[str(decision["decision"])] = counts.get(str(decision["decision"]), 0) + 1
    print(f"fraud_triage: {len(decisions)} decisions {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
