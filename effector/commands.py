"""The client commands of the command line: what each asks a running effector, what it prints.

``status``, ``pending``, ``failed``, ``show``, ``approve`` and ``deny`` each take a connected
:class:`~effector.client.EffectorClient` and the parsed arguments and return the exit status:
0 when the call did what was asked, 1 when it did not (an unknown intent, a decision not
applied). Lists print one entry per line on stdout and, when there is nothing to list, say so on
stderr, so that stdout stays one entry per line for scripts. ``effector.cli`` builds the parser
and connects the client.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable

from beam_agents._protos import GetIntentResponse, IntentState, ToolIntent, ToolResult
from effector.client import EffectorClient
from effector.intents import display_key


def status(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the counts of intents in each state and the log head, as one JSON object."""
    counts = client.status()
    names = (
        "pending",
        "running",
        "in_doubt",
        "awaiting_decision",
        "done",
        "in_flight",
        "head_offset",
    )
    print(json.dumps({name: getattr(counts, name) for name in names}, sort_keys=True))
    return 0


def pending(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the approvals awaiting a decision, oldest first, one per line."""
    intents = client.list_intents(IntentState.AWAITING_DECISION, limit=args.limit)
    for intent in intents:
        print(inbox_line(intent))
    if not intents:
        print("nothing pending: no approval awaits a decision", file=sys.stderr)
    return 0


def failed(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the DONE intents whose result is not OK, oldest first, one per line."""
    entries = client.list_failed(limit=args.limit)
    for intent, result in entries:
        print(failed_line(intent, result))
    if not entries:
        print("nothing failed: every DONE intent has an OK result", file=sys.stderr)
    return 0


def show(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print everything the effector recorded about one intent, one field per line."""
    response = client.get_intent(args.intent_id)
    if not response.found:
        print(f"no intent {args.intent_id}", file=sys.stderr)
        return 1
    for name, value in intent_report(response):
        print(f"{name + ':':<14}{value}")
    return 0


def add_decision_options(parser: argparse.ArgumentParser, option: Callable[..., None]) -> None:
    """The options of ``approve`` and ``deny`` (``option`` adds one with its variable)."""
    option(parser, "--approver", "who decides (recorded; a named token's name wins)", default="")
    option(parser, "--reason", "free text recorded with the decision", default="")
    option(
        parser,
        "--digest",
        "the args digest 'show' printed: the decision is refused if the approval's arguments "
        "are not those (default: the digest of its arguments now)",
        default="",
        metavar="HEX",
    )
    if parser.prog.endswith("approve"):
        option(
            parser,
            "--edit",
            "approve these arguments instead (a JSON object the gated tool accepts)",
            default="",
            metavar="JSON",
        )


def decide(client: EffectorClient, args: argparse.Namespace, *, approved: bool) -> int:
    """Approve or deny an approval intent; exit 1 if the decision was not applied.

    The decision always carries an args digest: ``--digest`` if given, else the one the
    effector shows for the approval now (``show`` prints it).
    """
    digest = args.digest
    if not digest:
        shown = client.get_intent(args.intent_id)
        if not shown.found:
            print(f"no intent {args.intent_id}", file=sys.stderr)
            return 1
        digest = shown.args_digest
    decision = client.decide(
        args.intent_id,
        approved=approved,
        approver=args.approver,
        reason=args.reason,
        args_digest=digest,
        edited_args_json=getattr(args, "edit", ""),
    )
    if decision.applied and decision.state == IntentState.AWAITING_DECISION:
        print(f"voted on {args.intent_id}: {decision.reason}")
        return 0
    if decision.applied:
        print(f"{'approved' if approved else 'denied'} {args.intent_id}")
        return 0
    if decision.state == IntentState.INTENT_STATE_UNSPECIFIED:
        print(f"no intent {args.intent_id}", file=sys.stderr)
    else:
        state = IntentState.Name(decision.state)
        print(f"not applied: {decision.reason} (state {state})", file=sys.stderr)
    return 1


def inbox_line(intent: ToolIntent) -> str:
    """``<intent_id> <entity_key> <args_json>``: one approval awaiting a decision, on one line."""
    # Recorded approvals hold valid JSON, where a raw line break can only be insignificant
    # whitespace, so replacing it keeps the arguments intact and the entry on one line.
    args_json = (intent.args_json or "{}").replace("\r", " ").replace("\n", " ")
    return f"{intent.intent_id} {display_key(intent.entity_key)} {args_json}"


def failed_line(intent: ToolIntent, result: ToolResult) -> str:
    """``<intent_id> <entity_key> <tool> <STATUS> <error>``: one failed intent, on one line."""
    status_name = ToolResult.Status.Name(result.status)
    error = " ".join(result.error_message.split())
    line = f"{intent.intent_id} {display_key(intent.entity_key)} {intent.tool_name} {status_name}"
    return f"{line} {error}" if error else line


def intent_report(response: GetIntentResponse) -> list[tuple[str, str]]:
    """The ``(field, value)`` lines ``show`` prints for one recorded intent."""
    intent = response.intent
    lines = [
        ("intent_id", intent.intent_id),
        ("kind", ToolIntent.Kind.Name(intent.kind)),
        ("state", IntentState.Name(response.state)),
        ("entity_key", display_key(intent.entity_key)),
        ("seq", str(intent.seq)),
        ("step_index", str(intent.step_index)),
        ("tool", intent.tool_name or "-"),
        ("args", intent.args_json or "{}"),
    ]
    if intent.kind == ToolIntent.APPROVAL:
        lines.append(("channel", intent.channel or "-"))
    lines += approval_lines(response)
    lines += [
        ("attempts", str(response.attempts)),
        *_in_doubt_lines(response),
        ("created_at", timestamp(intent.created_at_ms)),
        ("expires_at", timestamp(intent.expires_at_ms) if intent.expires_at_ms else "never"),
    ]
    if response.HasField("result"):
        result = response.result
        lines += [
            ("result", ToolResult.Status.Name(result.status)),
            ("completed_at", timestamp(result.completed_at_ms)),
            ("payload", payload_text(result.payload)),
            ("error", " ".join(result.error_message.split()) or "-"),
        ]
    else:
        lines.append(("result", "- (not DONE yet)"))
    return lines


def approval_lines(response: GetIntentResponse) -> list[tuple[str, str]]:
    """An approval's digest, gated tool, quorum and votes; a tool intent's edit lineage."""
    intent = response.intent
    if intent.HasField("edited_from"):
        edit = intent.edited_from
        return [
            ("edited_from", edit.approval_intent_id),
            ("edited_by", edit.edited_by),
            ("edit_diff", edit.diff_json),
        ]
    if intent.kind != ToolIntent.APPROVAL:
        return []
    lines = [("args_digest", response.args_digest or "-"), ("gates_tool", intent.gated_tool or "-")]
    if intent.required_approvals > 1:
        lines.append(("quorum", f"{len(response.votes)} of {intent.required_approvals} approvals"))
        lines += [("vote", f"{vote.approver}: {vote.reason or '-'}") for vote in response.votes]
    return lines


def _in_doubt_lines(response: GetIntentResponse) -> list[tuple[str, str]]:
    """Why an IN_DOUBT intent's reconciler failed, and when it is asked again."""
    if response.state != IntentState.IN_DOUBT:
        return []
    reason = " ".join(response.in_doubt_reason.split()) or "-"
    return [("in_doubt", reason), ("retry_at", timestamp(response.retry_at_ms))]


def timestamp(ms: int) -> str:
    """Epoch milliseconds as UTC ISO 8601 with the number itself: ``...T12:00:00.000Z (ms)``."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return f"{when.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} ({ms})"


def payload_text(payload: bytes) -> str:
    """A payload as text if it is printable UTF-8, else ``0x`` and its hex; ``-`` if empty."""
    if not payload:
        return "-"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + payload.hex()
    return text if text.isprintable() else "0x" + payload.hex()
